"""The acceptance property of the core, in the shared world.

The runs here are driven in `invar.model.world`: the same `World`, components and actions the
model checker explores (a learner that keeps `LearnerRules`, workers that hold one loaded
version, a weights store, a journal that loses its unsynced suffix). A Hypothesis state machine
(`FaultyRun`) chooses what happens next, one rule at a time: deliver any message in flight,
duplicate or drop one on the wire, repeat one of the driver's own observations (connections,
losses, starts and timer firings: never lost, but possibly observed twice), merge two reply
frames of a worker or split one (every grouping of a worker's answers), fire the retry timer
early, crash a worker or the learner, bring a dead one back, restart the driver from its
journal; each fault within a budget per run, and only from an update drawn once per example.
When nothing is in flight, dead components come back and then the core's retry timer fires.
After the drawn rules the run is delivered first in, first out to its end, so a failure
shrinks to the few choices that cause it.

After every step of the core the run checks: every invariant and transition invariant; no
correct component refused (`world.refused`) and none told to do the impossible
(`world.broken`); the step did not mutate its input and is deterministic (`shell.deliver` twice
on the same state); a no-op changes nothing and is counted, anything else changes something.
Every run must complete, and its `logical_projection` must equal `canonical_run`'s.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from invar.model import (
    ObjectiveConfig,
    RunConfig,
    core,
    fast,
    logical_projection,
    outstanding_commands,
    run_complete,
    schedule,
    transition_violations,
    violations,
)
from invar.model import world as w
from invar.model.messages import (
    LaunchRequests,
    LoadWeights,
    RequestsCompleted,
    TimerFired,
)
from invar.model.shell import Delivery, Verdict, deliver
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
from invar.model.world import CORE, World
from invar.testing import canonical_run

MAX_CORE_STEPS = 8_000


# ---------------------------------------------------------------------------------------------
# Configurations: several optimizer steps, reloads and releases (S = 2, P = 2), evaluation and
# checkpoint boundaries, the KL term, two workers.

CONFIGS: dict[str, tuple[RunConfig, tuple[str, ...]]] = {
    "sync S0 P1 K2 2w": (RunConfig(prompts_per_batch=1, group_size=2, max_staleness=0,
                                   sync_period=1, optimizer_steps=2, total_updates=3,
                                   max_inflight_batches=1, seed=1), ("w0", "w1")),
    "S1 P1 K3 2w": (RunConfig(prompts_per_batch=2, group_size=2, max_staleness=1, sync_period=1,
                              optimizer_steps=3, total_updates=3, max_inflight_batches=2,
                              seed=2), ("w0", "w1")),
    "S2 P2 K2 eval2 ckpt3 2w": (RunConfig(prompts_per_batch=1, group_size=2, max_staleness=2,
                                          sync_period=2, optimizer_steps=2, total_updates=5,
                                          eval_every=2, checkpoint_every=3,
                                          max_inflight_batches=3, seed=3), ("a", "b")),
    "S1 P2 K2 kl eval1 2w": (RunConfig(prompts_per_batch=2, group_size=2, max_staleness=1,
                                       sync_period=2, optimizer_steps=2, total_updates=3,
                                       eval_every=1, max_inflight_batches=2, seed=4,
                                       objective=ObjectiveConfig(kl_coef=0.1)), ("w0", "w1")),
}

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


# ---------------------------------------------------------------------------------------------
# Purity: a snapshot of every field of a state, cached reprs left out.


class _Snapshot(pickle.Pickler):
    """Pickles records field by field without the `_repr` cache (`state.cached_repr` fills it
    lazily, e.g. when a ledger record is hashed: a cache, not a change of the value)."""

    def reducer_override(self, obj: Any) -> Any:
        fields_ = getattr(obj, "__dict__", None)
        if isinstance(fields_, dict) and "_repr" in fields_ and not isinstance(obj, type):
            return copyreg.__newobj__, (type(obj),), {k: v for k, v in fields_.items()
                                                       if k != "_repr"}
        return NotImplemented


def snapshot(value: Any) -> bytes:
    buffer = io.BytesIO()
    _Snapshot(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


def noop_total(state) -> int:
    return sum(getattr(state.noops, f.name) for f in fields(state.noops))


def same_delivery(a: Delivery, b: Delivery) -> bool:
    return (a.verdict, a.state, a.commands, a.durable) == (b.verdict, b.state, b.commands,
                                                          b.durable)


# ---------------------------------------------------------------------------------------------
# The checked run: world actions, with every core step checked.


@dataclass
class Budget:
    """How many faults of each kind one run may have."""

    duplicates: int = 3
    drops: int = 3
    early_timers: int = 2
    worker_crashes: int = 2
    learner_crashes: int = 2
    driver_restarts: int = 1
    repeats: int = 2


NO_FAULTS = Budget(0, 0, 0, 0, 0, 0, 0)


class Run:
    def __init__(self, config: RunConfig, workers: tuple[str, ...],
                 reproducible_forwards: bool = True) -> None:
        self.world: World = w.new_world(config, workers, reproducible_forwards)
        self.core_steps = 0
        self.noops = 0
        self.applied: Counter = Counter()
        self.log: list[str] = []

    # -- the core's steps ------------------------------------------------------------------

    def _core_step(self, event: Any, act) -> None:
        """Carry out `act` (a world action that delivers `event` to the core), checking it."""
        before_world = self.world
        before = before_world.core
        frozen = snapshot(before)
        first = deliver(before, event)
        second = deliver(before, event)
        assert snapshot(before) == frozen, f"step mutated its input state on {event}"
        assert same_delivery(first, second), f"step is not deterministic on {event}"
        self.core_steps += 1
        self.log.append(repr(event)[:160])
        after_world = act()
        assert not after_world.refused, \
            f"a correct component's message was refused: {after_world.refused}\n{self.tail()}"
        assert first.verdict is not Verdict.REFUSED
        after, commands = first.state, first.commands
        assert after_world.core == after, "the world's core is not what shell.deliver says"
        counted = noop_total(after) - noop_total(before)
        if first.verdict is Verdict.NOOP:
            assert counted >= 1 and after == before and commands == (), \
                f"no-op {event} changed something"
            assert counted == 1 or isinstance(event, RequestsCompleted), \
                f"{event} counted {counted} no-ops"
            self.noops += 1
        else:
            # A frame that repeats some completions and brings others counts the repeats.
            assert counted == 0 or isinstance(event, RequestsCompleted), \
                f"{event} was accepted and counted as a no-op"
            assert not (after == before and commands == ()), \
                f"{event} changed nothing but was not counted as a no-op"
        assert violations(after) == {}, f"after {event}: {violations(after)}\n{self.tail()}"
        assert transition_violations(before, commands, after) == {}, \
            f"on {event}: {transition_violations(before, commands, after)}\n{self.tail()}"
        self.world = after_world

    def tail(self, n: int = 15) -> str:
        return "\n".join(f"  {e}" for e in self.log[-n:])

    # -- the world's actions ---------------------------------------------------------------

    def deliver(self, key: str) -> None:
        msg = next(m for m in self.world.network if m.key == key)
        if msg.to == CORE:
            self._core_step(msg.body, lambda: w.deliver_message(self.world, key))
        else:
            self.log.append(f"-> {msg.to}: {repr(msg.body)[:140]}")
            self.world = w.deliver_message(self.world, key)

    def fire_timer(self) -> None:
        self._core_step(TimerFired(), lambda: w.fire_timer(self.world))

    def fault(self, kind: str, arg: Any = None) -> None:
        self.applied[kind] += 1
        self.log.append(f"!! {kind} {arg if arg is not None else ''}")
        if kind in ("drop", "duplicate", "repeat_observation", "crash_worker", "restart_worker"):
            self.world = getattr(w, kind)(self.world, arg)
        else:
            self.world = getattr(w, kind)(self.world)
        if kind == "restart_driver":  # the core is back at its journal's durable state
            assert violations(self.world.core) == {}, violations(self.world.core)

    def regroup(self, kind: str, keys: tuple[str, ...]) -> None:
        """A worker's reply frames merged or split (not a fault: how its answers are grouped)."""
        self.applied[kind] += 1
        self.log.append(f"<> {kind} {' + '.join(k[:60] for k in keys)}")
        if kind == "merge":
            self.world = w.merge_replies(self.world, *keys)
        else:
            self.world = w.split_reply(self.world, *keys)

    def revive(self, who: str) -> None:
        if who == "learner":
            self.fault("restart_learner")
        else:
            self.fault("restart_worker", who)

    def check_components(self) -> None:
        """No component was told to do the impossible (`world.broken` stays set once set)."""
        assert not self.world.broken, f"{self.world.broken}\n{self.tail()}"

    # -- what may happen now ---------------------------------------------------------------

    def deliverable(self) -> list[str]:
        """Distinct keys in flight, in network order; a worker's loss is not seen before its
        connection (one reader task observes both)."""
        network = self.world.network
        out = []
        for m in network:
            if m.key in out:
                continue
            if w.observed_too_early(self.world, m):
                continue
            out.append(m.key)
        return out

    def mergeable(self) -> list[tuple[str, str]]:
        """Pairs of reply frames of one worker incarnation in flight (copies included)."""
        replies = [m for m in self.world.network if isinstance(m.body, RequestsCompleted)]
        return [(a.key, b.key) for i, a in enumerate(replies) for b in replies[i + 1:]
                if w.mergeable(a, b)]

    def splittable(self) -> list[str]:
        return list(dict.fromkeys(m.key for m in self.world.network
                                  if isinstance(m.body, RequestsCompleted)
                                  and len(m.body.completions) > 1))

    def wire(self) -> list[str]:
        return list(dict.fromkeys(m.key for m in self.world.network
                                  if not w.is_observation(m)))

    def observations(self) -> list[str]:
        return list(dict.fromkeys(m.key for m in self.world.network if w.is_observation(m)))

    def dead(self) -> list[str]:
        out = [x.name for x in self.world.workers if not x.alive]
        return out + ([] if self.world.learner.alive else ["learner"])

    # -- what happens when nobody chooses --------------------------------------------------

    def advance(self) -> None:
        """The first message in flight is delivered; with nothing in flight a dead component
        comes back, else the retry timer fires (armed, with something outstanding: anything
        else is a deadlock)."""
        if self.world.network:
            self.deliver(self.deliverable()[0])
        elif self.dead():
            self.revive(self.dead()[0])
        else:
            assert self.world.timer and outstanding_commands(self.world.core), \
                f"deadlock: nothing in flight, nothing outstanding\n{self.tail()}"
            self.fire_timer()

    def settle(self) -> None:
        """An incomplete run with nothing in flight moves by itself."""
        while not self.world.network and not w.complete(self.world):
            self.advance()

    def finish(self) -> None:
        """First in, first out until the run completes; then drain what is in flight (late and
        duplicate replies after the end change nothing)."""
        while not w.complete(self.world):
            assert self.core_steps < MAX_CORE_STEPS, f"the run did not complete\n{self.tail()}"
            self.advance()
        final = logical_projection(self.world.core)
        for _ in range(MAX_CORE_STEPS):
            if self.world.network:
                self.deliver(self.world.network[0].key)
            elif self.world.timer and outstanding_commands(self.world.core):
                self.fire_timer()
            else:
                break
        assert w.complete(self.world)
        assert logical_projection(self.world.core) == final, "a message after the end changed it"
        self.check_components()


# ---------------------------------------------------------------------------------------------
# The state machine: which action comes next, as rules with preconditions.


STEPS = 100
"""Rules drawn per example; what is left of the run is then delivered first in, first out."""


class FaultyRun(RuleBasedStateMachine):
    """Runs of one configuration, each action chosen by Hypothesis among those possible now:
    a message in flight delivered, frames regrouped, or a fault while its budget lasts. A run
    that completes is finished and checked (`at_end`), and a new one starts with a full
    budget; the run under way when the rules stop is finished first in, first out and checked
    the same way."""

    def __init__(self, start: Callable[[], Run], budget: Budget,
                 at_end: Callable[[Run], None]) -> None:
        super().__init__()
        self.start, self.budget, self.at_end = start, budget, at_end
        self.run, self.left = self.fresh()
        self.faults_from = 0
        self.raised_before = sys.exc_info()[1]

    def fresh(self) -> tuple[Run, Budget]:
        """A new run, moved to where something is in flight, and its whole budget."""
        run = self.start()
        run.settle()
        return run, replace(self.budget)

    def in_flight(self) -> bool:
        return bool(self.run.world.network)

    def may(self, fault: str) -> bool:
        """A fault of this kind is within the budget, and the run is far enough."""
        return (self.in_flight() and getattr(self.left, fault) > 0
                and self.run.world.core.committed >= self.faults_from)

    def spend(self, fault: str) -> None:
        setattr(self.left, fault, getattr(self.left, fault) - 1)

    def settle(self) -> None:
        """After every rule: nothing in flight, the run moves by itself; complete, it is
        finished and checked, and the next run starts."""
        self.run.settle()
        if w.complete(self.run.world):
            ended = self.run
            self.run, self.left = self.fresh()
            ended.finish()
            self.at_end(ended)

    @initialize(data=st.data())
    def choose_the_first_update_with_faults(self, data: st.DataObject) -> None:
        """Faults only from this update on, so that late updates see them too."""
        last = self.run.world.core.config.total_updates - 1
        self.faults_from = data.draw(st.integers(0, last), label="faults from update")

    @precondition(lambda self: self.in_flight())
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        self.run.deliver(data.draw(st.sampled_from(self.run.deliverable()), label="deliver"))
        self.settle()

    @precondition(lambda self: self.in_flight() and self.run.mergeable())
    @rule(data=st.data())
    def merge_replies(self, data: st.DataObject) -> None:
        self.run.regroup("merge", data.draw(st.sampled_from(self.run.mergeable()),
                                            label="merge"))

    @precondition(lambda self: self.in_flight() and self.run.splittable())
    @rule(data=st.data())
    def split_reply(self, data: st.DataObject) -> None:
        self.run.regroup("split", (data.draw(st.sampled_from(self.run.splittable()),
                                             label="split"),))

    @precondition(lambda self: self.may("repeats") and self.run.observations())
    @rule(data=st.data())
    def repeat_observation(self, data: st.DataObject) -> None:
        self.spend("repeats")
        self.run.fault("repeat_observation", data.draw(st.sampled_from(self.run.observations()),
                                                       label="repeat"))

    @precondition(lambda self: self.may("duplicates") and self.run.wire())
    @rule(data=st.data())
    def duplicate(self, data: st.DataObject) -> None:
        self.spend("duplicates")
        self.run.fault("duplicate", data.draw(st.sampled_from(self.run.wire()),
                                              label="duplicate"))

    @precondition(lambda self: self.may("drops") and self.run.wire())
    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        self.spend("drops")
        self.run.fault("drop", data.draw(st.sampled_from(self.run.wire()), label="drop"))
        self.settle()

    @precondition(lambda self: self.may("early_timers") and self.run.world.timer)
    @rule()
    def fire_the_timer_early(self) -> None:
        self.spend("early_timers")
        self.run.applied["early_timer"] += 1
        self.run.fire_timer()
        self.settle()

    @precondition(lambda self: self.may("worker_crashes")
                  and any(x.alive for x in self.run.world.workers))
    @rule(data=st.data())
    def crash_worker(self, data: st.DataObject) -> None:
        self.spend("worker_crashes")
        alive = [x.name for x in self.run.world.workers if x.alive]
        self.run.fault("crash_worker", data.draw(st.sampled_from(alive), label="crash"))
        self.settle()

    @precondition(lambda self: self.may("learner_crashes") and self.run.world.learner.alive)
    @rule()
    def crash_learner(self) -> None:
        self.spend("learner_crashes")
        self.run.fault("crash_learner")
        self.settle()

    @precondition(lambda self: self.may("driver_restarts"))
    @rule()
    def restart_driver(self) -> None:
        self.spend("driver_restarts")
        self.run.fault("restart_driver")
        self.settle()

    @precondition(lambda self: self.in_flight() and self.run.dead())
    @rule(data=st.data())
    def revive(self, data: st.DataObject) -> None:
        self.run.revive(data.draw(st.sampled_from(self.run.dead()), label="revive"))
        self.settle()

    @invariant()
    def no_component_is_told_the_impossible(self) -> None:
        self.run.check_components()

    def teardown(self) -> None:
        # Hypothesis calls teardown in a `finally`: while an exception propagates (a rule
        # failed, and is reported as it is; or no enabled rule could run and the example is
        # given up) the run is left as it is. Otherwise it is finished and checked.
        if sys.exc_info()[1] is self.raised_before:
            self.run.finish()
            self.at_end(self.run)


def explore(name: str, budget: Budget, at_end: Callable[[Run], None], examples: int,
            run: Callable[..., Run] = Run, reproducible_forwards: bool = True,
            derandomize: bool = False) -> None:
    """`examples` runs of configuration `name` (or more: a run that completes within the
    drawn rules is followed by another), each checked at its end by `at_end`."""
    config, workers = CONFIGS[name]
    run_state_machine_as_test(
        lambda: FaultyRun(lambda: run(config, workers, reproducible_forwards), budget, at_end),
        settings=settings(max_examples=examples, stateful_step_count=STEPS, deadline=None,
                          derandomize=derandomize,
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.data_too_large,
                                                 HealthCheck.filter_too_much]))


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
