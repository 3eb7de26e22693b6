"""The core's fast paths against their definitions: each batched or packed computation gives
exactly what the one-at-a-time formula (the spec's) gives, and a frame-wide check accepts only
what every per-item check accepts."""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from invar.model import RunConfig, schedule
from invar.model.core import _matrix_problem, _sample_digests, _sample_problem
from invar.model.fast import frame_plausible, samples_of
from invar.model.messages import Completion, Completions, matrix_digest
from invar.model.ragged import Ragged
from invar.model.schedule import RequestId
from invar.model.state import (
    Assigned,
    BatchState,
    Sample,
    _sample_hash,
    _text_hash,
    sample_of,
)

REQUEST = RequestId(0, 0, 0)


def spec_sample_digest(c: Completion) -> str:
    """PROTOCOL.md §3: blake2b_96(tokens as int64 LE ‖ log-probs as float64 LE ‖ reward)."""
    body = struct.pack(f"<{len(c.tokens)}q", *c.tokens)
    body += struct.pack(f"<{len(c.behavior_logprobs)}d", *c.behavior_logprobs)
    body += struct.pack("<d", c.reward)
    return hashlib.blake2b(body, digest_size=12).hexdigest()


def spec_matrix_digest(*matrices) -> str:
    h = hashlib.blake2b(digest_size=12)
    for matrix in matrices:
        for row in matrix or ():
            h.update(struct.pack(f"<{len(row)}d", *row))
        h.update(b"|")
    return h.hexdigest()


logprob = st.floats(max_value=0.0, allow_nan=False, allow_infinity=False)
any_float = st.floats(allow_nan=True, allow_infinity=True)
token_ids = st.integers(0, 2**63 - 1)
moderate = st.floats(-1e6, 1e6)
only_request = st.just(REQUEST)
FRAMES = RunConfig(prompts_per_batch=2, group_size=2, max_staleness=1, total_updates=4)
"""Requests of the frames below: batches 0..3 (all admitted), of 2 prompts of 2 samples."""


@st.composite
def completions(draw, same_length=None, requests=only_request):
    n = draw(st.integers(1, 20))  # frames of 16 or more are judged by their columns
    fixed = draw(st.integers(1, 5)) if (same_length or (same_length is None and draw(
        st.booleans()))) else None
    out = []
    for _ in range(n):
        length = fixed or draw(st.integers(1, 5))
        out.append(Completion(draw(requests), 0,
                              tuple(draw(st.lists(token_ids, min_size=length, max_size=length))),
                              tuple(draw(st.lists(logprob, min_size=length, max_size=length))),
                              draw(moderate)))
    return tuple(out)


@settings(max_examples=200, deadline=None)
@given(completions())
def test_sample_digests_are_the_spec_formula(frame):
    assert [d.hex() for d in _sample_digests(Completions.of(frame))] == [
        spec_sample_digest(c) for c in frame]


def test_a_sample_digest_is_pinned():
    """The digest a run's ledger records for a sample: its bytes must never change."""
    completion = Completion(REQUEST, 0, (3, 1 << 40), (-0.5, -0.0), 0.25)
    assert spec_sample_digest(completion) == "23bdaf950200b6ce15d5c4fd"
    assert _sample_digests(Completions.of((completion,) * 16)) == [
        bytes.fromhex("23bdaf950200b6ce15d5c4fd")] * 16  # the table path too


def fine(config: RunConfig, admitted: int, c: Completion) -> bool:
    """The definition a frame-wide check must agree with: every completion on its own."""
    batch, prompt, sample = c.request
    return (0 <= batch < admitted and 0 <= prompt < config.prompts_per_batch
            and 0 <= sample < config.group_size
            and c.version == schedule.gen_version(config, batch)
            and not _sample_problem(c.tokens, c.behavior_logprobs, c.reward))


@st.composite
def nearly_fine_frames(draw):
    """Frames of fine completions (requests of FRAMES, their batches' versions), one of them
    perhaps changed in one field, to anything or to something odd: all fine, or nearly."""
    frame = list(draw(completions(requests=st.builds(RequestId, st.integers(0, 3),
                                                     st.integers(0, 1), st.integers(0, 1)))))
    frame = [replace(c, version=schedule.gen_version(FRAMES, c.request.batch)) for c in frame]
    index = draw(st.integers(0, len(frame) - 1))
    c = frame[index]
    length = len(c.tokens)
    odd = st.sampled_from((0.5, math.nan, math.inf, -math.inf))
    changes = {
        "none": lambda: {},
        "request": lambda: {"request": draw(st.builds(
            RequestId, st.integers(-1, 4), st.integers(-1, 2), st.integers(-1, 2)))},
        "version": lambda: {"version": draw(st.integers(0, 3))},
        "tokens": lambda: {"tokens": tuple(draw(st.lists(
            st.one_of(token_ids, st.integers(-3, -1)), min_size=length, max_size=length)))},
        "empty": lambda: {"tokens": (), "behavior_logprobs": ()},
        "logprobs": lambda: {"behavior_logprobs": tuple(draw(st.lists(
            st.one_of(logprob, any_float, odd), min_size=length, max_size=length)))},
        "lengths": lambda: {"behavior_logprobs": draw(st.sampled_from(
            (c.behavior_logprobs[:-1], c.behavior_logprobs + (-1.0,))))},
        "reward": lambda: {"reward": draw(st.one_of(odd, moderate))},
    }
    frame[index] = replace(c, **changes[draw(st.sampled_from(sorted(changes)))]())
    return frame


@settings(max_examples=400, deadline=None)
@given(nearly_fine_frames())
def test_a_plausible_frame_is_one_of_fine_completions(frame):
    assert frame_plausible(FRAMES, 4, Completions.of(frame)) == all(
        fine(FRAMES, 4, c) for c in frame)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.one_of(logprob, any_float), max_size=4), min_size=1, max_size=5),
       st.booleans())
def test_matrix_problem_fast_path_agrees_with_rows(rows, wrong_length):
    matrix = tuple(tuple(r) for r in rows)
    lengths = [len(r) + (1 if wrong_length and i == 0 else 0) for i, r in enumerate(rows)]
    problem = _matrix_problem("m", Ragged.of(matrix), lengths)
    # PROTOCOL.md §4.1: row i as long as sample i's tokens, every value finite and <= 0.
    bad_rows = [i for i, r in enumerate(matrix)
                if len(r) != lengths[i] or not all(math.isfinite(x) and x <= 0 for x in r)]
    if bad_rows:
        assert problem.startswith(f"m[{bad_rows[0]}]")
    else:
        assert problem == ""


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(logprob, max_size=4), max_size=4),
       st.one_of(st.none(), st.lists(st.lists(logprob, max_size=3), max_size=3)))
def test_matrix_digest_is_the_spec_formula(first, second):
    a = tuple(map(tuple, first))
    b = None if second is None else tuple(map(tuple, second))
    matrix_a, matrix_b = Ragged.of(a), None if b is None else Ragged.of(b)
    assert matrix_digest(matrix_a, matrix_b) == spec_matrix_digest(a, b)
    assert matrix_digest(matrix_a) == spec_matrix_digest(a)


def test_matrix_digests_are_those_of_encoding_3():
    """Pinned (computed from rows of Python floats before matrices were arrays): the digests
    journalled and bound into cotangents stay what they were."""
    third = -1.0 / 3.0
    proximal = Ragged.of(((-0.5, third), (), (-0.0, 5e-324)))
    reference = Ragged.of(((third,), (-2.0,), (-1e-300, -1e300)))
    assert matrix_digest(proximal, reference) == "420d04afeb855bb6277eb2b2"
    assert matrix_digest(proximal) == "835009ea874962f4eca7cd50"
    assert matrix_digest(proximal, None) == "8ac46dd9c7f6b0a9427c56e7"
    assert matrix_digest(Ragged.of(())) == "6010515d1c376128358ce26b"
    # A strided view of a read-only array (kept as is, not copied) digests its own values.
    table = np.array([-0.5, 9.0, third, 9.0])
    table.flags.writeable = False
    strided = Ragged(table[::2], (2,))
    assert not strided.values.flags.c_contiguous
    assert matrix_digest(strided) == spec_matrix_digest(((-0.5, third),))


def spec_seed(root, *path_and_index):
    """PROTOCOL §2.2's seed_stream(root, *path)[i], written out: word i of the SHAKE-128
    output of the path's text, big-endian, shifted right by one."""
    *path, i = path_and_index
    text = ":".join(str(part) for part in (root, *path)).encode()
    return int.from_bytes(hashlib.shake_128(text).digest(8 * (i + 1))[8 * i:], "big") >> 1


@given(st.integers(0, 2**40), st.lists(st.one_of(st.integers(-5, 10**6), st.text(max_size=3)),
                                     max_size=3), st.integers(0, 12))
def test_seed_streams_are_the_spec_words(root, path, count):
    stream = schedule.seed_stream(root, *path, count=count)
    assert stream == [spec_seed(root, *path, i) for i in range(count)]
    assert schedule.seed_stream(root, *path, count=count + 3)[:count] == stream


def test_group_seeds_and_plan_keys_are_the_spec_seeds():
    for config in (RunConfig(), RunConfig(seed=7, group_size=3, prompts_per_batch=2)):
        for batch in range(3):
            for prompt in range(config.prompts_per_batch):
                expected = [spec_seed(config.seed, "sample", batch, prompt, s)
                            for s in range(config.group_size)]
                assert list(schedule.group_seeds(config, batch, prompt)) == expected
                assert [schedule.sampling_seed(config, RequestId(batch, prompt, s))
                        for s in range(config.group_size)] == expected
                g = config.group_size
                assert schedule.batch_seeds(config, batch)[prompt * g:(prompt + 1) * g] == \
                    tuple(expected)
            assert schedule.batch_prompt_indices(config, batch) == tuple(
                schedule.prompt_index(config, r.batch, r.prompt)
                for r in schedule.request_ids(config, batch))
            keys = [spec_seed(config.seed, "plan", batch, i)
                    for i in range(config.samples_per_batch)]
            order = sorted(range(config.samples_per_batch), key=keys.__getitem__)
            plan = schedule.minibatch_plan(config, batch)
            assert sorted(p for step in plan for p in step) == list(range(len(order)))
            assert plan[0] == tuple(sorted(order[:len(plan[0])]))


@given(st.lists(st.integers(0, 5), max_size=6))
def test_samples_made_in_bulk_are_the_constructor_s(rows):
    """`samples_of` and `sample_of` make what `Sample(...)` makes, field for field."""
    digests = [f"{k:024x}" for k in range(6)]
    versions = [10 + k for k in range(6)]
    expected = [Sample(digests[r], versions[r], ONE, r) for r in rows]
    made = samples_of(ONE, rows, digests, versions)
    single = [sample_of(ONE, r, digests[r], versions[r]) for r in rows]
    fields = ("digest", "version", "frame", "row")
    for got in (made, single):
        assert [tuple(getattr(x, f) for f in fields) for x in got] == \
            [tuple(getattr(x, f) for f in fields) for x in expected]
    every = samples_of(ONE, range(6), digests, versions)
    assert [(x.digest, x.version, x.row) for x in every] == \
        [(digests[r], versions[r], r) for r in range(6)]


def slot_term(position, slot):
    if slot is None:
        return _text_hash(f"{position}:-")
    if isinstance(slot, Sample):
        return _sample_hash(position, slot.digest)
    return _text_hash(f"{position}:A:{slot.worker}#{slot.incarnation}")


ONE = Completions.of((Completion(REQUEST, 0, (1,), (-0.5,), 0.0),))


def sample(digest: str) -> Sample:
    return Sample(digest, 0, ONE, 0)


slot_values = st.one_of(st.none(), st.builds(Assigned, st.sampled_from("ab"), st.integers(0, 2)),
                        st.builds(sample, st.sampled_from([f"{k:024x}" for k in range(4)])))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(st.integers(0, 5), slot_values, max_size=6), max_size=5))
def test_with_slots_keeps_counters_and_digest_of_the_slots(changes):
    batch = BatchState.admitted(0, 6)
    for change in changes:
        batch = batch.with_slots(change)
    digest = 0
    for position, slot in enumerate(batch.slots):
        digest ^= slot_term(position, slot)
    assert batch.slots_digest == digest
    assert batch.pending == sum(s is None for s in batch.slots)
    assert batch.completed == sum(isinstance(s, Sample) for s in batch.slots)


def test_swapping_two_samples_changes_the_digest():
    one, two = sample(f"{1:024x}"), sample(f"{2:024x}")
    batch = BatchState.admitted(0, 2)
    assert batch.with_slots({0: one, 1: two}).slots_digest != \
        batch.with_slots({0: two, 1: one}).slots_digest


def spec_minibatch_plan(config, update):
    """PROTOCOL §2.4, written out: positions stably sorted by their plan keys, cut into K
    near-equal chunks, each chunk in id order."""
    n, k = config.samples_per_batch, config.optimizer_steps
    keys = [spec_seed(config.seed, "plan", update, i) for i in range(n)]
    order = sorted(range(n), key=keys.__getitem__)
    cuts = [round(j * n / k) for j in range(k + 1)]
    return tuple(tuple(sorted(order[cuts[j]:cuts[j + 1]])) for j in range(k))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**40), st.integers(1, 9), st.integers(1, 9), st.integers(1, 12),
       st.integers(0, 10**6))
def test_minibatch_plan_and_requests_are_the_spec_plan(seed, prompts, group, steps, update):
    config = RunConfig(prompts_per_batch=prompts, group_size=group, seed=seed,
                       optimizer_steps=min(steps, prompts * group))
    plan = schedule.minibatch_plan.__wrapped__(config, update)  # computed, not remembered
    assert plan == spec_minibatch_plan(config, update)
    assert {type(position) for step in plan for position in step} == {int}
    requests = schedule.request_ids(config, update)
    assert schedule.minibatch_requests(config, update) == tuple(
        tuple(requests[i] for i in step) for step in plan)


@given(st.integers(0, 2**40), st.lists(st.one_of(st.integers(-5, 10**6), st.text(max_size=3)),
                                     max_size=3), st.integers(0, 40))
def test_seed_words_are_the_seed_stream(root, path, count):
    words = schedule.seed_words(root, *path, count=count)
    assert words.tolist() == schedule.seed_stream(root, *path, count=count)
