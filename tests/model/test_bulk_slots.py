"""The bulk slot paths against the per-slot ones: a large reply frame filled a batch at a time
(`fast.filled_in_bulk`) and `fast.with_column` give exactly the state (equality, digest,
slots, counters) and commands that filling slot by slot gives, on frames split, merged,
duplicated, reordered, over two batches, with divergent repeats and with replies of lost
incarnations whose slots are now held by others."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.bulk_frames import CONFIG, rows_of, settled, started
from invar.model import core, fast, initial_state, state_digest, step
from invar.model.errors import ProtocolError
from invar.model.fast import BULK_FROM
from invar.model.messages import (
    Completions,
    LearnerStarted,
    RequestsCompleted,
    WorkerConnected,
    WorkerLost,
)
from invar.model.state import Assigned, BatchState, Sample
from invar.testing import version_digest, worker_reply


@st.composite
def frames(draw, launches):
    """Reply frames of the launches' completions (of a lost incarnation's too): all of them or
    a run, maybe reordered, with a few repeated (some divergent), cut into frames, one maybe
    delivered twice; each frame from one worker (any connected one: the core reads
    completions by request)."""
    rows = rows_of(launches)
    order = list(range(len(rows)))
    if draw(st.booleans()):
        order = draw(st.permutations(order))
    start = draw(st.integers(0, len(order) - 1))
    order = order[start:draw(st.integers(start + 1, len(order)))]
    for index in draw(st.lists(st.integers(0, len(rows) - 1), max_size=4)):
        order.insert(draw(st.integers(0, len(order))), index)
    chosen = []
    for index in order:
        row = rows[index]
        if draw(st.integers(0, 19)) == 0:
            row = replace(row, reward=row.reward + 1.0)  # divergent if it repeats a sample
        chosen.append(row)
    cuts = sorted(set(draw(st.lists(st.integers(1, len(chosen)), max_size=3))))
    pieces = [chosen[a:b] for a, b in zip([0, *cuts], [*cuts, len(chosen)]) if a < b]
    if draw(st.booleans()):
        pieces.append(draw(st.sampled_from(pieces)))
    return [RequestsCompleted(draw(st.sampled_from(["a", "b"])), 0, Completions.of(piece))
            for piece in pieces]


def one_by_one(state, event, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(fast, "BULK_FROM", 10**9)
        return step(state, event)


@pytest.fixture(scope="module")
def scenarios():
    return {lose_b: started(lose_b) for lose_b in (False, True)}


@settings(max_examples=60, deadline=None)
@given(data=st.data(), lose_b=st.booleans())
def test_bulk_filling_is_filling_slot_by_slot(scenarios, data, lose_b):
    state, launches = scenarios[lose_b]
    assert len(launches) >= 2 and all(len(b.slots) >= BULK_FROM for b in state.batches)
    bulk_frames = 0
    with pytest.MonkeyPatch.context() as monkeypatch:
        for frame in data.draw(frames(launches)):
            bulk_frames += len(frame.completions) >= BULK_FROM
            expected = one_by_one(state, frame, monkeypatch)
            outcome = step(state, frame)
            assert not isinstance(expected, ProtocolError), expected
            new, commands = outcome
            assert new == expected[0] and state_digest(new) == state_digest(expected[0])
            assert commands == expected[1]
            for got, want in zip(new.batches, expected[0].batches, strict=True):
                assert got.slots == want.slots
                assert (got.pending, got.completed, got.slots_digest) == \
                    (want.pending, want.completed, want.slots_digest)
            assert new.noops == expected[0].noops and new.workers == expected[0].workers
            state = expected[0]


def test_a_launch_reply_is_filled_in_bulk_and_a_repeat_is_not(scenarios):
    """The bulk path is taken (a worker's reply to its launch), and left for a frame that
    repeats a sample: the test above compares the two paths, not one with itself."""
    state, (first, *_) = scenarios[False]
    frame = worker_reply(first)
    assert len(frame.completions) >= BULK_FROM
    for completions, bulk in ((frame.completions, True), (Completions.of(
            [*frame.completions, frame.completions[0]]), False)):  # repeats a sample
        raw = core._sample_digests(completions)
        digests = [d.hex() for d in raw]
        assert (fast.filled_in_bulk(state, completions, digests, raw) is not None) == bulk


def test_a_bulk_frame_with_one_completion_of_another_batch(scenarios, monkeypatch):
    """A large frame whose rows of one batch number exactly one (a launch's reply and one
    completion of the other batch): that batch's one slot is read and filled as slot by slot
    would."""
    state, (first, second, *_) = scenarios[False]
    rows = [*worker_reply(first).completions, worker_reply(second).completions[0]]
    assert {row.request.batch for row in rows[:-1]} != {rows[-1].request.batch}
    frame = RequestsCompleted("a", 0, Completions.of(rows))
    expected = one_by_one(state, frame, monkeypatch)
    new, commands = step(state, frame)
    assert new == expected[0] and state_digest(new) == state_digest(expected[0])
    assert commands == expected[1]
    assert [b.slots for b in new.batches] == [b.slots for b in expected[0].batches]


SIZE = 2 * BULK_FROM


def sample(digest: str, row: int = 0) -> Sample:
    return Sample(digest, 0, None, row)  # type: ignore[arg-type]


hex_digests = st.integers(0, 2**96 - 1).map(lambda k: f"{k:024x}")
slot_values = st.one_of(
    st.none(), st.builds(Assigned, st.sampled_from("ab"), st.integers(0, 1)),
    st.builds(sample, st.one_of(hex_digests, st.sampled_from(
        # Digests `int(_, 16)` reads that are not 24 plain hex digits (hashed one at a time).
        ["ab", "0x" + "1" * 22, " " + "f" * 23, "1_" * 11 + "11", "ABCDEF" * 4]))))
uniform_columns = st.one_of(
    st.tuples(st.none()), st.tuples(st.builds(Assigned, st.sampled_from("ab"), st.integers(0, 1))),
    st.lists(st.builds(sample, hex_digests), min_size=1, max_size=4).map(tuple))


@st.composite
def columns(draw):
    """Distinct positions (all of them in order, or a random subset in random order) and
    their new slots: of one kind (the bulk cases) or mixed."""
    if draw(st.booleans()):
        positions = list(range(SIZE))
    else:
        positions = draw(st.permutations(range(SIZE)))[:draw(st.integers(1, SIZE))]
    if draw(st.booleans()):
        kind = draw(uniform_columns)
        if isinstance(kind[0], Sample):
            return positions, [sample(draw(hex_digests)) for _ in positions]
        return positions, [kind[0]] * len(positions)
    return positions, [draw(slot_values) for _ in positions]


def digest_bytes(slots):
    """The samples' digests as `fast.with_column` takes them from a reply frame (None: not all are
    samples with a 24-digit hex digest)."""
    if not all(isinstance(s, Sample) and len(s.digest) == 24 for s in slots):
        return None
    try:
        return np.frombuffer(b"".join(bytes.fromhex(s.digest) for s in slots),
                             np.uint8).reshape(-1, 12)
    except ValueError:
        return None


@settings(max_examples=150, deadline=None)
@given(st.lists(columns(), min_size=1, max_size=4), st.booleans())
def test_with_column_is_with_slots(changes, with_digests):
    batch = reference = BatchState.admitted(0, SIZE)
    for positions, slots in changes:
        digests = digest_bytes(slots) if with_digests else None
        batch = (fast.with_column(batch, positions, slots, digests)
                 or batch.with_slots(dict(zip(positions, slots))))  # None: fewer than BULK_FROM
        reference = reference.with_slots(dict(zip(positions, slots)))
        assert batch == reference and batch.slots == reference.slots
        assert (batch.pending, batch.completed, batch.slots_digest) == \
            (reference.pending, reference.completed, reference.slots_digest)
        assert repr(batch) == repr(reference)


@pytest.mark.parametrize("answered", [40, 37])  # whole prompt groups; one group in part
def test_a_lost_worker_s_successor_is_sent_only_the_requests_without_a_sample(answered):
    """One worker, a batch partly answered, then the worker lost: its successor is sent
    exactly the requests of the batch that hold no sample, each once, and the samples stay
    (launching a whole batch to the one worker is only for a batch with every slot pending)."""
    state, launches = settled(initial_state(CONFIG), [
        LearnerStarted(0, 0, version_digest(0)), WorkerConnected("a", 0)])
    first = next(launch for launch in launches if launch.requests[0].batch == 0)
    answered = worker_reply(first).completions[:answered]
    state, _ = settled(state, [RequestsCompleted("a", 0, answered)])
    state, relaunched = settled(state, [WorkerLost("a", 0), WorkerConnected("a", 1)])
    batch = state.batch(0)
    assert batch is not None
    kept = {p for p, slot in enumerate(batch.slots) if type(slot) is Sample}
    assert kept == {r.prompt * CONFIG.group_size + r.sample for r in answered.request_ids()}
    sent = [r.prompt * CONFIG.group_size + r.sample
            for launch in relaunched for r in launch.requests if r.batch == 0]
    assert sorted(sent) == sorted(set(range(len(batch.slots))) - kept)
    assert {p for p, slot in enumerate(batch.slots) if type(slot) is Assigned} == set(sent)
