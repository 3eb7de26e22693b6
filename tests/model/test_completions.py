"""`Completions`: a reply frame as columns, a value that reads as the records it stands for;
the core judges it whole (naming the completion and field at fault), and stores each sample as
a row of its frame, whatever the grouping of completions into frames."""

from __future__ import annotations

import math
import pickle
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.core_driver import Driver, small_config
from invar.model import ProtocolError, Reason, outstanding_commands, step
from invar.model.messages import (
    Completion,
    Completions,
    LaunchRequest,
    RequestsCompleted,
    dumps,
    loads,
    one_per_request,
)
from invar.model.ragged import INT, Ragged
from invar.model.schedule import RequestId
from invar.model.state import Sample, completions_of
from invar.model.world import sample_reply

floats = st.floats(allow_nan=True, allow_infinity=True, width=64)
records = st.lists(st.builds(
    Completion, request=st.builds(RequestId, st.integers(-2, 9), st.integers(-2, 9),
                                  st.integers(-2, 9)),
    version=st.integers(-(1 << 63), (1 << 63) - 1),
    tokens=st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=4).map(tuple),
    behavior_logprobs=st.lists(floats, max_size=4).map(tuple), reward=floats), max_size=6)


def _bits(value: object) -> object:
    """Records with every float as its bits: -0.0 differs from 0.0, a NaN equals itself."""
    if isinstance(value, float):
        return np.float64(value).tobytes()
    if isinstance(value, tuple):
        return tuple(map(_bits, value))
    if isinstance(value, Completion):
        return tuple(map(_bits, (value.request, value.version, value.tokens,
                                 value.behavior_logprobs, value.reward)))
    return value


@given(records)
def test_reads_back_as_its_records_bit_for_bit(made: list[Completion]) -> None:
    frame = Completions.of(made)
    assert len(frame) == len(made)
    assert _bits(tuple(frame)) == _bits(tuple(made))
    assert _bits(tuple(frame[i] for i in range(len(made)))) == _bits(tuple(made))
    assert all(type(c.request) is RequestId for c in frame)
    assert frame.request_ids() == tuple(c.request for c in made)


@given(records, records)
def test_equal_exactly_when_the_bits_are_and_hash_agrees(a: list[Completion],
                                                         b: list[Completion]) -> None:
    x, y = Completions.of(a), Completions.of(b)
    assert (x == y) == (_bits(tuple(a)) == _bits(tuple(b)))
    if x == y:
        assert hash(x) == hash(y)
    assert x == Completions.of(a) and hash(x) == hash(Completions.of(a))


def test_equality_is_bitwise() -> None:
    one = Completion(RequestId(0, 0, 0), 0, (1,), (-0.0,), 0.5)
    assert Completions.of((one,)) != Completions.of((replace(one, behavior_logprobs=(0.0,)),))
    nan = replace(one, reward=math.nan)
    assert Completions.of((nan,)) == Completions.of((nan,))
    assert Completions.of((one,)) != (one,)


@given(records, st.data())
def test_slices_joins_and_gathers_are_those_of_the_records(made: list[Completion],
                                                            data: st.DataObject) -> None:
    frame = Completions.of(made)
    cut = data.draw(st.integers(0, len(made)))
    assert frame[:cut] == Completions.of(made[:cut])
    assert frame[cut:] == Completions.of(made[cut:])
    assert frame[:cut] + frame[cut:] == frame
    assert frame[::-1] == Completions.of(made[::-1])
    picked = data.draw(st.lists(st.integers(0, len(made) - 1), max_size=8)) if made else []
    assert frame.take(picked) == Completions.of([made[i] for i in picked])
    halves = (frame[:cut], frame[cut:])
    assert Completions.gathered([halves[i >= cut] for i in picked],
                                [i - cut if i >= cut else i for i in picked]) == frame.take(picked)
    assert Completions.gathered([frame] * len(picked), picked) == frame.take(picked)


def test_a_frame_in_order_gathers_to_itself() -> None:
    frame = Completions.of([Completion(RequestId(0, 0, g), 0, (g,), (-0.5,), 0.0)
                            for g in range(3)])
    assert Completions.gathered([frame] * 3, [0, 1, 2]) is frame
    assert Completions.gathered([frame] * 2, [1, 2]) == frame[1:]
    assert Completions.gathered([], []) == Completions.of(())


@given(records)
def test_pickles_prints_and_encodes_as_a_value(made: list[Completion]) -> None:
    frame = Completions.of(made)
    hash(frame)
    copy = pickle.loads(pickle.dumps(frame))
    assert copy == frame and hash(copy) == hash(frame)
    names = {"Completions": Completions, "Completion": Completion, "RequestId": RequestId,
             "nan": math.nan, "inf": math.inf}
    assert eval(repr(frame), names) == frame or any(  # a NaN prints as `nan`: its bits differ
        math.isnan(x) for c in made for x in (*c.behavior_logprobs, c.reward))
    event = RequestsCompleted("w", 0, frame)
    assert loads(dumps(event)) == event


def test_immutable_even_through_the_arrays_it_was_built_from() -> None:
    requests, versions = np.array([[0, 0, 0]]), np.array([3])
    tokens = Ragged(np.array([1, 2]), (2,))
    frame = Completions(requests, versions, tokens, Ragged.of(((-0.5, -0.25),)), np.array([1.0]))
    requests[0, 0], versions[0] = 5, 4
    assert frame[0] == Completion(RequestId(0, 0, 0), 3, (1, 2), (-0.5, -0.25), 1.0)
    for column in (frame.requests, frame.versions, frame.rewards):
        with pytest.raises(ValueError):
            column[0] = 0
    with pytest.raises(AttributeError):
        frame.rewards = np.array([2.0])  # type: ignore[misc]


@pytest.mark.parametrize(("change", "message"), [
    ({"tokens": (True,)}, r"completions\[1\]\.tokens: expected a flat sequence of integers"),
    ({"tokens": (1.0,)}, r"completions\[1\]\.tokens: expected a flat sequence of integers"),
    ({"tokens": (1 << 63,)}, r"completions\[1\]\.tokens: expected a flat sequence of integers"),
    ({"behavior_logprobs": ("a",)}, r"completions\[1\]\.behavior_logprobs: expected"),
    ({"request": (0, 0)}, r"completions\[1\]\.request: expected \(batch, prompt, sample\)"),
    ({"request": (0, 0, 0.5)}, r"completions\[1\]\.request: expected integers"),
    ({"version": True}, r"completions\[1\]\.version: expected integers"),
    ({"version": 1 << 63}, r"completions\[1\]\.version: an integer outside int64"),
    ({"reward": "1"}, r"completions\[1\]\.reward: expected numbers"),
])
def test_records_a_column_cannot_hold_are_refused_by_index(change: dict, message: str) -> None:
    good = Completion(RequestId(0, 0, 0), 0, (1,), (-0.5,), 0.0)
    with pytest.raises(ValueError, match=message):
        Completions.of((good, replace(good, **change)))


def test_columns_of_the_wrong_kind_are_refused() -> None:
    good = Completions.of((Completion(RequestId(0, 0, 0), 0, (1,), (-0.5,), 0.0),))
    columns = dict(requests=good.requests, versions=good.versions, tokens=good.tokens,
                   behavior_logprobs=good.behavior_logprobs, rewards=good.rewards)
    for name, wrong in (("requests", good.requests.reshape(3)),
                        ("versions", good.versions.astype(np.int32)),
                        ("rewards", good.rewards.astype(">f8")),
                        ("tokens", good.behavior_logprobs),
                        ("behavior_logprobs", Ragged.of(((-0.5,), (-0.5,))))):
        with pytest.raises(ValueError, match=name):
            Completions(**{**columns, name: wrong})


# ---------------------------------------------------------------------------------------------
# The core: a frame judged whole, samples stored as rows of their frame.


CONFIG = small_config()


def launched() -> tuple[Driver, list[LaunchRequest]]:
    """A run whose first two batches are launched, none answered; the launches."""
    d = Driver(CONFIG)
    d.pump(until=lambda d: sum(isinstance(c, LaunchRequest) for c in d.queue) == 8)
    return d, [c for c in one_per_request(outstanding_commands(d.state))
               if isinstance(c, LaunchRequest)]


def _logprobs(values: tuple[float, ...], n: int) -> tuple[float, ...]:
    """`values` then -0.5 up to n values (responses here have 1 or 2 tokens)."""
    return (values + (-0.5,) * n)[:max(n, len(values))]


FAULTS = {  # each a change of a completion of n tokens, the reason, the detail's start
    "request": (lambda n: {"request": RequestId(0, CONFIG.prompts_per_batch, 0)},
                Reason.UNKNOWN_REQUEST, lambda n: "]: request"),
    "version": (lambda n: {"version": 5}, Reason.WRONG_VERSION, lambda n: "]: request"),
    "token": (lambda n: {"tokens": (-1, 2)[:n]}, Reason.MALFORMED_PAYLOAD,
              lambda n: "].tokens: "),
    "empty": (lambda n: {"tokens": (), "behavior_logprobs": ()}, Reason.MALFORMED_PAYLOAD,
              lambda n: "].tokens: "),
    "lengths": (lambda n: {"behavior_logprobs": (-0.5,) * (n + 1)}, Reason.MALFORMED_PAYLOAD,
                lambda n: f"].behavior_logprobs: {n + 1} values for {n} tokens"),
    "positive": (lambda n: {"behavior_logprobs": _logprobs((0.25,), n)},
                 Reason.MALFORMED_PAYLOAD, lambda n: "].behavior_logprobs: every value"),
    "nan": (lambda n: {"behavior_logprobs": _logprobs((math.nan,), n)}, Reason.MALFORMED_PAYLOAD,
            lambda n: "].behavior_logprobs: every value"),
    "minus_infinity": (lambda n: {"behavior_logprobs": _logprobs((-math.inf,), n)},
                       Reason.MALFORMED_PAYLOAD, lambda n: "].behavior_logprobs: every value"),
    "reward": (lambda n: {"reward": math.inf}, Reason.MALFORMED_PAYLOAD,
               lambda n: "].reward: must be finite"),
}


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.data(), st.sampled_from(sorted(FAULTS)),
       st.sampled_from(sorted(FAULTS)))
def test_a_bad_frame_is_refused_naming_its_first_bad_completion_and_field(
        size: int, data: st.DataObject, fault: str, later_fault: str) -> None:
    """Small frames are judged a completion at a time, large ones (16 or more) by their
    columns: either way the first completion at fault is named, with the field."""
    d, launches = launched()
    good = [c for launch in launches for c in sample_reply(launch).completions]
    rows = [good[data.draw(st.integers(0, len(good) - 1))] for _ in range(size)]
    frame = RequestsCompleted("w0", 0, Completions.of(rows))
    assert not isinstance(step(d.state, frame), ProtocolError)  # repeats are fine
    index = data.draw(st.integers(0, size - 1))
    change, reason, field = FAULTS[fault]
    tokens = len(rows[index].tokens)
    rows[index] = replace(rows[index], **change(tokens))
    if index + 1 < size and data.draw(st.booleans()):
        rows[index + 1] = replace(rows[index + 1],
                                  **FAULTS[later_fault][0](len(rows[index + 1].tokens)))
    outcome = step(d.state, replace(frame, completions=Completions.of(rows)))
    assert isinstance(outcome, ProtocolError) and outcome.state is d.state
    assert outcome.reason is reason
    assert outcome.detail.startswith(f"completions[{index}{field(tokens)}"), outcome.detail


@settings(max_examples=60, deadline=None)
@given(st.permutations(range(8)), st.lists(st.integers(1, 7), max_size=4, unique=True),
       st.lists(st.integers(0, 7), max_size=3))
def test_a_frame_split_or_merged_fills_the_same_slots(order: list[int], cuts: list[int],
                                                      repeated: list[int]) -> None:
    """The completions of two batches delivered as one frame, or in any order as frames of
    any grouping (some repeated), leave the same state, each sample the row it was sent as."""
    d, launches = launched()
    whole = sample_reply(*launches).completions
    one = step(d.state, RequestsCompleted("w0", 0, whole))
    assert not isinstance(one, ProtocolError)
    shuffled = whole.take(order + repeated)
    bounds = [0, *sorted(cuts), len(order) + len(repeated)]
    state = d.state
    for start, stop in zip(bounds, bounds[1:]):
        outcome = step(state, RequestsCompleted("w0", 0, shuffled[start:stop]))
        assert not isinstance(outcome, ProtocolError), outcome
        state = outcome[0]
    assert state == one[0]
    assert state.noops.duplicates == len(repeated)
    for ours, theirs in zip(state.batches[:2], one[0].batches[:2]):
        assert completions_of(ours.slots) == completions_of(theirs.slots)
        for position, sample in enumerate(ours.slots):
            assert isinstance(sample, Sample)
            assert sample.frame[sample.row] == theirs.slots[position].frame[
                theirs.slots[position].row]


def test_a_sample_is_a_row_of_the_frame_it_came_in() -> None:
    d, launches = launched()
    frame = sample_reply(*launches).completions
    after, _ = step(d.state, RequestsCompleted("w0", 0, frame))
    samples = [s for b in after.batches[:2] for s in b.slots]
    assert all(isinstance(s, Sample) and s.frame is frame for s in samples)
    assert completions_of(after.batches[0].slots) is not frame  # batch 0: the first 4 rows
    assert completions_of(after.batches[0].slots) == frame[:4]
    first = samples[0]
    assert (first.tokens, first.behavior_logprobs, first.reward) == (
        frame[0].tokens, frame[0].behavior_logprobs, frame[0].reward)
    assert frame.tokens.values.dtype == INT


def test_a_frame_of_records_is_refused_not_crashed_on() -> None:
    d, launches = launched()
    records = tuple(sample_reply(launches[0]).completions)
    outcome = step(d.state, RequestsCompleted("w0", 0, records))  # type: ignore[arg-type]
    assert isinstance(outcome, ProtocolError)
    assert outcome.detail == "completions: expected Completions, got tuple"


def test_gathering_a_batch_that_is_not_complete_names_the_first_slot_at_fault() -> None:
    frame = Completions.of((Completion(RequestId(0, 0, 0), 0, (1,), (-0.5,), 0.0),))
    done = Sample("0" * 24, 0, frame, 0)
    with pytest.raises(ValueError, match=r"slots\[1\]: not a sample \(None\)"):
        completions_of((done, None, done))
