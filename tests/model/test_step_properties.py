"""The acceptance property of the core, in the shared world.

The runs here are driven in `invar.model.world`: the same `World`, components and actions the
model checker explores (a learner that keeps `LearnerRules`, workers that hold one loaded
version, a weights store, a journal that loses its unsynced suffix). A Hypothesis state machine
(`FaultyRun`, tests/helpers/faulty_runs.py) chooses what happens next, one rule at a time:
deliver any message in flight, duplicate or drop one on the wire, repeat one of the driver's own
observations (connections, losses, starts and timer firings: never lost, but possibly observed
twice), merge two reply frames of a worker or split one (every grouping of a worker's answers),
fire the retry timer early, crash a worker or the learner, bring a dead one back, restart the
driver from its journal; each fault within a budget per run, and only from an update drawn once
per example. When nothing is in flight, dead components come back and then the core's retry
timer fires. After the drawn rules the run is delivered first in, first out to its end, so a
failure shrinks to the few choices that cause it.

After every step of the core the run checks: every invariant and transition invariant; no
correct component refused (`world.refused`) and none told to do the impossible
(`world.broken`); the step did not mutate its input and is deterministic (`shell.deliver` twice
on the same state); a no-op changes nothing and is counted, anything else changes something.
Every run must complete, and its `logical_projection` must equal `canonical_run`'s.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any
from unittest import mock

import pytest

from helpers.faulty_runs import CONFIGS, NO_FAULTS, Budget, Run, noop_total, same_delivery
from helpers.faulty_runs import explore as explore_runs
from invar.model import core, fast, logical_projection, run_complete, schedule
from invar.model import world as w
from invar.model.messages import LaunchRequests, LoadWeights
from invar.model.shell import deliver
from invar.model.state import (
    BatchState,
    History,
    Sample,
    WorkerPhase,
    WorkerState,
    evolve,
    initial_state,
    state_digest,
)
from invar.testing import canonical_run

_CANONICAL: dict[str, Any] = {}


def canonical(name: str):
    if name not in _CANONICAL:
        config, workers = CONFIGS[name]
        run = canonical_run(config, workers)
        assert run_complete(run.state)
        _CANONICAL[name] = run
    return _CANONICAL[name]


def schedule_part(projection: tuple) -> tuple:
    """What must not depend even on the values of re-run forwards: what each update consumed,
    in which steps over which positions, and the boundaries (as the model checker compares)."""
    ledger, *rest = projection
    return (tuple((r.update, r.requests, r.sample_versions, r.sample_digests,
                   tuple((s.step, s.positions) for s in r.steps)) for r in ledger), *rest)


def explore(name: str, budget: Budget, at_end: Callable[[Run], None], examples: int,
            run: Callable[..., Run] = Run, reproducible_forwards: bool = True,
            derandomize: bool = False) -> None:
    """`explore_runs` on configuration `name`."""
    config, workers = CONFIGS[name]
    explore_runs(lambda: run(config, workers, reproducible_forwards), budget, at_end, examples,
                 derandomize)


def assert_canonical(run: Run, name: str) -> None:
    reference = canonical(name)
    assert run_complete(run.world.core)
    assert logical_projection(run.world.core) == logical_projection(reference.state)
    # The learner's disk: every version committed once, with the canonical digests; every
    # checkpoint boundary kept once.
    assert run.world.learner.commits == reference.world.learner.commits
    assert sorted(run.world.learner.checkpoints) == sorted(reference.world.learner.checkpoints)
    assert len(set(run.world.learner.checkpoints)) == len(run.world.learner.checkpoints)
    assert run.world.core.noops.divergent == 0, "the world's components are deterministic"


# ---------------------------------------------------------------------------------------------
# The properties.


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_interleaving_with_faults_ends_canonically(name):
    explore(name, Budget(), lambda run: assert_canonical(run, name), examples=50)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_reordering_alone_ends_canonically_without_noops(name):
    """No faults at all: any delivery order, the same run, nothing is a no-op and the retry
    timer is never needed."""
    def at_end(run: Run) -> None:
        assert_canonical(run, name)
        assert run.noops == 0 and noop_total(run.world.core) == 0
        assert not any("TimerFired" in line for line in run.log)
    explore(name, NO_FAULTS, at_end, examples=10)


def test_non_reproducible_forwards_keep_the_schedule():
    """Forwards re-run after a restart return other log-probs (non-deterministic kernels): the
    values in the ledger may differ, what was consumed and applied where may not."""
    name = "S2 P2 K2 eval2 ckpt3 2w"

    def at_end(run: Run) -> None:
        assert run_complete(run.world.core)
        assert schedule_part(logical_projection(run.world.core)) == \
            schedule_part(logical_projection(canonical(name).state))
    explore(name, Budget(learner_crashes=3, driver_restarts=1), at_end, examples=25,
            reproducible_forwards=False)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_canonical_run_keeps_every_invariant(name):
    """The FIFO run itself, through the same checks; the worker set changes nothing."""
    config, workers = CONFIGS[name]
    run = Run(config, workers)
    run.finish()
    assert_canonical(run, name)
    assert run.noops == 0
    assert logical_projection(canonical_run(config, ("x", "y", "z")).state) == \
        logical_projection(run.world.core)
    assert logical_projection(canonical_run(config, ("solo",)).state) == \
        logical_projection(run.world.core)
    assert logical_projection(w.run_fifo(w.new_world(config, workers)).core) == \
        logical_projection(run.world.core)


class SettledCheckedRun(Run):
    """A run whose core steps are each also taken with `fast._SETTLED` forgotten: every
    rollout pass of the reconcile then runs, and the answer must be the one the skipping gave;
    `skipped` counts the steps that did skip them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.skipped = 0

    def _core_step(self, event: Any, act) -> None:
        before = self.world.core
        settled = fast.rollout_settled
        seen: list[bool] = []
        with mock.patch.object(fast, "rollout_settled",
                               lambda state: seen.append(settled(state)) or seen[-1]):
            skipping = deliver(before, event)
        fast._SETTLED.clear()
        full = deliver(before, event)
        assert same_delivery(skipping, full) and state_digest(skipping.state) == \
            state_digest(full.state), f"skipping the settled passes changed {event}"
        self.skipped += any(seen)
        super()._core_step(event, act)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_skipping_a_settled_rollout_side_is_the_full_reconcile(name):
    """The reconcile's fast path (`fast._SETTLED`: the rollout passes skipped on a rollout side
    they were seen to leave alone) gives exactly what running every pass gives, on every step
    of runs with faults; and it is taken (most of the learner's events take it)."""
    config, _ = CONFIGS[name]

    def at_end(run: Run) -> None:
        assert isinstance(run, SettledCheckedRun)
        assert run.skipped >= config.total_updates * config.optimizer_steps
    explore(name, Budget(), at_end, examples=15, run=SettledCheckedRun)


def test_a_rollout_side_is_settled_only_for_the_very_objects_it_was_seen_with():
    """`fast._SETTLED` answers for the objects the rollout passes were seen to leave alone:
    a state that differs from a settled one in any field those passes read, even by an equal
    copy, is not taken as settled; one that differs elsewhere (the learner) is."""
    config, workers = CONFIGS["S2 P2 K2 eval2 ckpt3 2w"]
    state = None
    for event in canonical_run(config, workers).events:
        state = deliver(state or initial_state(config), event).state
        if fast.rollout_settled(state) and state.retained and state.batches:
            break
    assert state is not None and fast.rollout_settled(state)
    copies = {
        "config": replace(state.config),
        "admitted": state.admitted + 1,
        "batches": tuple(list(state.batches)),
        "workers": tuple(list(state.workers)),
        "commit_digests": History(tuple(state.commit_digests), state.commit_digests.chain),
        "published": History(tuple(state.published), state.published.chain),
        "publishing": state.committed,
        "retained": tuple(list(state.retained)),
    }
    for name, value in copies.items():
        assert value is not getattr(state, name)
        assert not fast.rollout_settled(evolve(state, **{name: value})), name
    assert fast.rollout_settled(evolve(state, learner=evolve(state.learner, step=1)))


def test_a_rollout_side_is_not_settled_by_a_reconcile_that_launched():
    """Loads are decided before launches: a launch can leave a worker free whose version no
    longer has pending requests, which the next reconcile points at another version. So a
    reconcile that launched does not mark its state settled (the next one runs every pass)."""
    config, workers = CONFIGS["S1 P1 K3 2w"]  # batches 1 (version 0) and 2 (version 1)
    state = initial_state(config)
    for event in canonical_run(config, workers).events:
        state = deliver(state, event).state
        if state.committed == 1 and state.admitted == 3:
            break
    assert [schedule.gen_version(config, b.batch) for b in state.batches] == [0, 1]
    done = Sample("0" * 24, 0, None, 0)  # type: ignore[arg-type]
    first = BatchState.admitted(1, config.samples_per_batch).with_slots({0: done, 1: done})
    second = BatchState.admitted(2, config.samples_per_batch)
    ready = tuple(WorkerState(name, 0, WorkerPhase.READY, 0, 1, 0) for name in workers)
    state = evolve(state, batches=(first, second), workers=ready)
    state, launched = core._reconcile(state, [])
    assert [type(c) for c in launched if isinstance(c, (LaunchRequests, LoadWeights))] == \
        [LaunchRequests]  # one prompt group left: one worker launched, the other still free
    _, then = core._reconcile(evolve(state, learner=evolve(state.learner, step=1)), [])
    assert [(c.worker, c.version) for c in then if isinstance(c, LoadWeights)] == \
        [(workers[1], 1)]


def test_seeded_sweep_exercises_every_fault():
    """A deterministic sweep with heavier budgets; shows that every kind of fault is really
    injected and that the core really sees duplicates and late replies."""
    applied: Counter = Counter()
    noops: Counter = Counter()
    for name in CONFIGS:
        def at_end(run: Run, name: str = name) -> None:
            assert_canonical(run, name)
            applied.update(run.applied)
            noops.update({f.name: getattr(run.world.core.noops, f.name)
                          for f in fields(run.world.core.noops)})
        explore(name, Budget(5, 5, 3, 3, 3, 2, 3), at_end, examples=10, derandomize=True)
    for kind in ("duplicate", "repeat_observation", "drop", "early_timer", "crash_worker",
                 "restart_worker", "crash_learner", "restart_learner", "restart_driver",
                 "merge", "split"):
        assert applied[kind] >= 4, applied
    assert noops["duplicates"] > 0 and noops["late"] > 0, noops
