"""Runs in the shared world (`invar.model.world`) with every step of the core checked, and
the Hypothesis state machine that chooses their actions and faults (`FaultyRun`, `explore`):
the acceptance property's machinery (tests/model/test_step_properties.py), also used to take
histories both ways (tests/model/test_reference_rules.py).
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
    logical_projection,
    outstanding_commands,
    transition_violations,
    violations,
)
from invar.model import world as w
from invar.model.messages import RequestsCompleted, TimerFired
from invar.model.shell import Delivery, Verdict, deliver
from invar.model.world import CORE, World

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


def explore(start: Callable[[], Run], budget: Budget, at_end: Callable[[Run], None],
            examples: int, derandomize: bool = False) -> None:
    """`examples` runs made by `start` (or more: a run that completes within the drawn rules
    is followed by another), each checked at its end by `at_end`."""
    run_state_machine_as_test(
        lambda: FaultyRun(start, budget, at_end),
        settings=settings(max_examples=examples, stateful_step_count=STEPS, deadline=None,
                          derandomize=derandomize,
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.data_too_large,
                                                 HealthCheck.filter_too_much]))
