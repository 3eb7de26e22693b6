"""The core's fast paths (`invar.model.fast`) against its reference rules: every event is
stepped twice, once as the core runs and once with `fast.ENABLED` off (every rule then takes
one completion at a time, every pass of the reconcile runs), and the two outcomes must be the
same in everything the core hands out: the refusal (reason and message) or the new state
(value, digest, every slot with its sample's version, row and frame, the counters, the no-op
counts, the workers, the ledger) and the commands.

Generated frames (a launch's replies in any order and grouping, repeated, divergent, of a lost
incarnation, one completion spoiled in one field), batches (columns of slots changed at once)
and histories (runs with faults, in small worlds and in one of large reply frames, with every
forgery of each state the run passes through).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.bulk_frames import rows_of, started
from helpers.faulty_runs import CONFIGS, Budget, Run, explore
from invar.model import ObjectiveConfig, ProtocolError, RunConfig, fast, state_digest, step
from invar.model import world as w
from invar.model.messages import Completions, RequestsCompleted
from invar.model.schedule import RequestId
from invar.model.state import Assigned, BatchState, Sample
from invar.testing import worker_reply


@contextmanager
def reference_rules() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fast, "ENABLED", False)
        yield


def slot_fields(slot: Any) -> Any:
    """Everything a slot holds (a sample's equality compares its digest only)."""
    if isinstance(slot, Sample):
        return "sample", slot.digest, slot.version, slot.row, id(slot.frame)
    if isinstance(slot, Assigned):
        return "assigned", slot.worker, slot.incarnation
    return slot


def outcome_fields(state: Any, outcome: Any) -> tuple:
    if isinstance(outcome, ProtocolError):
        return ("refused", outcome.reason, outcome.detail, str(outcome),
                outcome.state is state)
    new, commands = outcome
    return ("stepped", new, state_digest(new), repr(new), new.noops, new.workers, new.ledger,
            new.learner, [(b.batch, b.pending, b.completed, b.slots_digest,
                           tuple(map(slot_fields, b.slots))) for b in new.batches],
            commands)


def assert_both_ways_alike(state: Any, event: Any) -> Any:
    """`step(state, event)` as the core runs it, checked against the reference rules."""
    taken = step(state, event)
    with reference_rules():
        reference = step(state, event)
    assert outcome_fields(state, taken) == outcome_fields(state, reference), event
    return taken


# ---------------------------------------------------------------------------------------------
# Frames: a state holding two batches of 128 slots (one of responses of one length, one
# ragged), launched on two workers, one of which may have lost its first incarnation.


@pytest.fixture(scope="module")
def scenarios():
    return {lose_b: started(lose_b) for lose_b in (False, True)}


ODD = (0.5, math.nan, math.inf, -math.inf)


def spoiled(draw: Any, row: Any) -> Any:
    """`row` (a completion) changed in one field, to something odd or merely wrong."""
    length = len(row.tokens)
    changes = {
        "request": lambda: {"request": draw(st.builds(
            RequestId, st.integers(-1, 4), st.integers(-1, 16), st.integers(-1, 8)))},
        "version": lambda: {"version": draw(st.integers(0, 3))},
        "tokens": lambda: {"tokens": tuple(draw(st.lists(
            st.integers(-3, 2**63 - 1), min_size=length, max_size=length)))},
        "empty": lambda: {"tokens": (), "behavior_logprobs": ()},
        "logprobs": lambda: {"behavior_logprobs": tuple(draw(st.lists(
            st.one_of(st.floats(max_value=0.0), st.sampled_from(ODD)),
            min_size=length, max_size=length)))},
        "lengths": lambda: {"behavior_logprobs": draw(st.sampled_from(
            (row.behavior_logprobs[:-1], row.behavior_logprobs + (-1.0,))))},
        "reward": lambda: {"reward": draw(st.one_of(st.sampled_from(ODD), st.floats(-9, 9)))},
    }
    return replace(row, **changes[draw(st.sampled_from(sorted(changes)))]())


@st.composite
def frames(draw: Any, launches: list) -> list[RequestsCompleted]:
    """Replies: of one launch (as its worker sends it) or of all, all or a run of them, maybe
    reordered, some maybe repeated (maybe divergent), maybe one spoiled, maybe cut into frames,
    one maybe delivered twice; from either worker, or from one never connected."""
    if draw(st.booleans()):
        rows = list(worker_reply(draw(st.sampled_from(launches))).completions)
    else:
        rows = rows_of(launches)
    order = list(range(len(rows)))
    if draw(st.booleans()):
        order = draw(st.permutations(order))
    if draw(st.booleans()):
        start = draw(st.integers(0, len(order) - 1))
        order = order[start:draw(st.integers(start + 1, len(order)))]
    if draw(st.integers(0, 2)) == 0:
        for index in draw(st.lists(st.integers(0, len(rows) - 1), min_size=1, max_size=4)):
            order.insert(draw(st.integers(0, len(order))), index)
    chosen = [rows[index] for index in order]
    if draw(st.integers(0, 2)) == 0:
        for index in draw(st.lists(st.integers(0, len(chosen) - 1), min_size=1, max_size=2)):
            chosen[index] = replace(chosen[index], reward=chosen[index].reward + 1.0)
    if draw(st.integers(0, 3)) == 0:
        index = draw(st.integers(0, len(chosen) - 1))
        chosen[index] = spoiled(draw, chosen[index])
    cuts = sorted(set(draw(st.lists(st.integers(1, len(chosen)), max_size=3)))) if draw(
        st.booleans()) else []
    pieces = [chosen[a:b] for a, b in zip([0, *cuts], [*cuts, len(chosen)]) if a < b]
    if draw(st.booleans()):
        pieces.append(draw(st.sampled_from(pieces)))
    senders = st.sampled_from(["a", "b"]) if draw(st.integers(0, 7)) else st.just("stranger")
    return [RequestsCompleted(draw(senders), 0, Completions.of(piece)) for piece in pieces]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), lose_b=st.booleans())
def test_frames_are_taken_as_completion_by_completion(scenarios, data, lose_b):
    state, launches = scenarios[lose_b]
    for frame in data.draw(frames(launches)):
        outcome = assert_both_ways_alike(state, frame)
        if not isinstance(outcome, ProtocolError):
            state = outcome[0]


# ---------------------------------------------------------------------------------------------
# Batches: columns of slots changed at once.


SIZE = 2 * fast.BULK_FROM
digests = st.integers(0, 2**96 - 1).map(lambda k: f"{k:024x}")
samples = digests.map(lambda digest: Sample(digest, 0, None, 0))  # type: ignore[arg-type]
assignees = st.builds(Assigned, st.sampled_from("ab"), st.integers(0, 1))


@st.composite
def columns(draw: Any) -> tuple[list[int], list[Any], np.ndarray | None]:
    """Distinct positions (every one in order, or some in any order), their new slots (of one
    kind, or mixed) and, for samples only, their digests' bytes as a reply frame gives them."""
    positions = list(range(SIZE))
    if draw(st.booleans()):
        positions = draw(st.permutations(positions))[:draw(st.integers(1, SIZE))]
    kind = draw(st.sampled_from(["pending", "assigned", "samples", "mixed"]))
    if kind == "pending":
        slots: list[Any] = [None] * len(positions)
    elif kind == "assigned":
        slots = [draw(assignees)] * len(positions)
    elif kind == "samples":
        slots = [draw(samples) for _ in positions]
    else:
        slots = [draw(st.one_of(st.none(), assignees, samples)) for _ in positions]
    packed = None
    if kind == "samples" and draw(st.booleans()):
        packed = np.frombuffer(b"".join(bytes.fromhex(s.digest) for s in slots),
                               np.uint8).reshape(-1, 12)
    return positions, slots, packed


@settings(max_examples=120, deadline=None)
@given(st.lists(columns(), min_size=1, max_size=4))
def test_columns_are_taken_as_slot_by_slot(changes):
    batch = BatchState.admitted(0, SIZE)
    for positions, slots, packed in changes:
        column = fast.with_column(batch, positions, slots, packed)
        reference = batch.with_slots(dict(zip(positions, slots)))
        assert (column is None) == (len(positions) < fast.BULK_FROM)
        if column is not None:
            assert (column, repr(column), column.pending, column.completed,
                    column.slots_digest, tuple(map(slot_fields, column.slots))) == \
                (reference, repr(reference), reference.pending, reference.completed,
                 reference.slots_digest, tuple(map(slot_fields, reference.slots)))
        batch = reference


# ---------------------------------------------------------------------------------------------
# Histories: runs with faults, every core step (and every forgery of the state it starts from)
# taken both ways.


class BothWaysRun(Run):
    def __init__(self, config: RunConfig, workers: tuple[str, ...],
                 launch_frames: bool) -> None:
        super().__init__(config, workers)
        self.world = w.new_world(config, workers, launch_frames=launch_frames)

    def _core_step(self, event: Any, act: Any) -> None:
        core = self.world.core
        assert_both_ways_alike(core, event)
        for forged in w.forgeries(core):
            assert isinstance(assert_both_ways_alike(core, forged), ProtocolError), forged
        super()._core_step(event, act)


LARGE = RunConfig(prompts_per_batch=48, group_size=2, max_staleness=0, sync_period=1,
                  optimizer_steps=2, total_updates=2, seed=5,
                  objective=ObjectiveConfig(kl_coef=0.1))
"""Batches of 96 slots, a version each (even batches of one response length, odd ones
ragged), answered a launch per frame: the column paths and the bulk ones."""

HISTORIES = {**{name: (config, workers, False) for name, (config, workers) in CONFIGS.items()},
             "large frames 1w": (LARGE, ("w0",), True),
             "large frames S1 2w": (replace(LARGE, max_staleness=1, max_inflight_batches=2),
                                    ("w0", "w1"), True)}


@pytest.mark.parametrize("name", list(HISTORIES))
def test_histories_are_taken_as_by_the_reference_rules(name):
    config, workers, launch_frames = HISTORIES[name]
    explore(lambda: BothWaysRun(config, workers, launch_frames), Budget(), lambda run: None,
            examples=8)
