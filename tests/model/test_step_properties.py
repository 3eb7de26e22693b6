"""The acceptance property of the core.

A small world simulator: a multiset network of in-flight messages (commands from `step`, reply
events from the fake components of `invar.testing`), delivered in an order hypothesis draws, with
small budgets of faults mixed in: duplicated and dropped messages, spurious timer firings, lost
and reconnected workers, learner restarts from what the learner really has on disk. Every run
must end complete with the canonical run's logical projection, and every step must keep the
invariants, never mutate its input, never refuse a correct component's message, and count
duplicates and late replies as no-ops that change nothing.
"""

from __future__ import annotations

import pickle
import random
import sys
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))

from invar_model_harness import LEARNER_COMMANDS, WORKER_COMMANDS  # noqa: E402

from invar.model import (  # noqa: E402
    ObjectiveConfig,
    ProtocolError,
    RunConfig,
    State,
    initial_state,
    logical_projection,
    outstanding_commands,
    run_complete,
    step,
    transition_violations,
    violations,
)
from invar.model.messages import (  # noqa: E402
    Checkpoint,
    Command,
    Commit,
    Evaluate,
    Event,
    LearnerStarted,
    TimerFired,
    WorkerConnected,
    WorkerLost,
)
from invar.testing import canonical_run, reply, start_events, version_digest  # noqa: E402

LIFECYCLE = (WorkerConnected, WorkerLost, LearnerStarted)
"""Events of the connection layer: delayed and reordered, never lost (a reconnect arrives)."""

MAX_DELIVERIES = 6_000


def noop_total(state: State) -> int:
    return sum(getattr(state.noops, f.name) for f in fields(state.noops))


@dataclass
class Faults:
    duplicates: int = 3
    drops: int = 3
    timers: int = 3
    worker_losses: int = 2
    learner_restarts: int = 2


@dataclass
class World:
    """The network, the fake components' liveness and the learner's disk."""

    config: RunConfig
    workers: tuple[str, ...]
    state: State
    network: list = field(default_factory=list)
    """In-flight messages: ("core", event) or ("component", command)."""
    worker_incarnation: dict = field(default_factory=dict)
    connected: set = field(default_factory=set)
    """(worker, incarnation) whose WorkerConnected the core has accepted."""
    learner_attempt: int = 0
    durable: tuple = (0, version_digest(0))
    """What the learner has on stable storage: the last commit it actually performed."""
    boundary_commands: list = field(default_factory=list)
    steps: int = 0
    noops: int = 0
    applied: Counter = field(default_factory=Counter)
    """Faults actually injected, by kind."""
    log: list = field(default_factory=list)

    # -- the core's side -----------------------------------------------------------------------

    def deliver_event(self, event: Event) -> None:
        before = self.state
        frozen = pickle.dumps(before)
        outcome = step(before, event)
        self.steps += 1
        self.log.append(event)
        assert not isinstance(outcome, ProtocolError), \
            f"a correct component's message was refused: {outcome}\nhistory: {self.tail()}"
        assert pickle.dumps(before) == frozen, f"step mutated its input state on {event}"
        after, commands = outcome
        assert isinstance(commands, tuple)
        again = step(before, event)
        assert not isinstance(again, ProtocolError) and again[0] == after and \
            again[1] == commands, f"step is not deterministic on {event}"
        counted = noop_total(after) - noop_total(before)
        assert counted in (0, 1)
        if counted:
            self.noops += 1
            assert after == before and commands == (), f"no-op {event} changed something"
        else:
            assert not (after == before and commands == ()), \
                f"{event} changed nothing but was not counted as a no-op"
        assert violations(after) == {}, f"after {event}: {violations(after)}\n{self.tail()}"
        assert transition_violations(before, commands, after) == {}, \
            f"on {event}: {transition_violations(before, commands, after)}"
        if isinstance(event, WorkerConnected) and not counted:
            self.connected.add((event.worker, event.incarnation))
        self.state = after
        for command in commands:
            if isinstance(command, (Evaluate, Checkpoint)):
                self.boundary_commands.append(command)
            if reply(command, self.config.optimizer_steps) is not None:
                self.network.append(("component", command))

    def tail(self, n: int = 12) -> str:
        return "\n".join(f"  {e}" for e in self.log[-n:])

    # -- the components' side ------------------------------------------------------------------

    def deliver_command(self, command: Command) -> None:
        if isinstance(command, LEARNER_COMMANDS) and command.attempt != self.learner_attempt:
            return  # addressed to a dead learner attempt, or ignored by its successor
        if isinstance(command, WORKER_COMMANDS) and \
                self.worker_incarnation[command.worker] != command.incarnation:
            return  # addressed to a retired worker incarnation
        if isinstance(command, Commit):
            self.durable = max(self.durable, (command.update + 1, command.expected_digest))
        answer = reply(command, self.config.optimizer_steps)
        if answer is not None:
            self.network.append(("core", answer))

    def deliver(self, index: int) -> None:
        kind, message = self.network.pop(index)
        if kind == "core":
            self.deliver_event(message)
        else:
            self.deliver_command(message)

    # -- faults ----------------------------------------------------------------------------------

    def droppable(self) -> list[int]:
        return [i for i, (kind, msg) in enumerate(self.network)
                if not isinstance(msg, LIFECYCLE)]

    def losable_workers(self) -> list[str]:
        return [w for w in self.workers if (w, self.worker_incarnation[w]) in self.connected]

    def lose_worker(self, name: str) -> None:
        incarnation = self.worker_incarnation[name]
        self.worker_incarnation[name] = incarnation + 1
        self.network.append(("core", WorkerLost(name, incarnation)))
        self.network.append(("core", WorkerConnected(name, incarnation + 1)))

    def restart_learner(self) -> None:
        self.learner_attempt += 1
        version, digest = self.durable
        self.network.append(("core", LearnerStarted(self.learner_attempt, version, digest)))


def make_world(config: RunConfig, workers: tuple[str, ...]) -> World:
    world = World(config, workers, initial_state(config))
    world.worker_incarnation = {w: 0 for w in workers}
    world.network = [("core", e) for e in start_events(workers)]
    return world


class Choices:
    """Every choice of an interleaving, drawn by hypothesis (so failures shrink toward FIFO)."""

    def __init__(self, data) -> None:
        self.data = data

    def action(self) -> int:
        return self.data.draw(st.integers(0, 99), label="action")

    def index(self, n: int) -> int:
        return self.data.draw(st.integers(0, n - 1), label="index")


def play(world: World, choices: Choices, faults: Faults) -> None:
    """Deliver drawn messages with drawn faults until the run completes, then drain."""
    while not run_complete(world.state):
        assert world.steps < MAX_DELIVERIES, "the run did not complete"
        if not world.network:
            # Quiescent and incomplete: only the retry timer can make progress.
            assert world.state.timer_armed, \
                f"deadlock: nothing in flight, no timer armed\n{world.tail()}"
            world.deliver_event(TimerFired())
            continue
        choice = choices.action()
        if choice < 88:
            world.deliver(choices.index(len(world.network)))
        elif choice < 91 and faults.duplicates:
            faults.duplicates -= 1
            world.applied["duplicate"] += 1
            world.network.append(world.network[choices.index(len(world.network))])
        elif choice < 94 and faults.drops and world.droppable():
            faults.drops -= 1
            world.applied["drop"] += 1
            candidates = world.droppable()
            world.network.pop(candidates[choices.index(len(candidates))])
        elif choice < 96 and faults.timers:
            faults.timers -= 1
            world.applied["timer"] += 1
            world.deliver_event(TimerFired())
        elif choice < 98 and faults.worker_losses and world.losable_workers():
            faults.worker_losses -= 1
            world.applied["worker_loss"] += 1
            candidates = world.losable_workers()
            world.lose_worker(candidates[choices.index(len(candidates))])
        elif choice < 100 and faults.learner_restarts:
            faults.learner_restarts -= 1
            world.applied["learner_restart"] += 1
            world.restart_learner()
        else:
            world.deliver(0)
    # Drain whatever is still in flight: late and duplicate replies after the end change nothing.
    final = logical_projection(world.state)
    for _ in range(MAX_DELIVERIES):
        if world.network:
            world.deliver(0)
        elif outstanding_commands(world.state) and world.state.timer_armed:
            world.deliver_event(TimerFired())
        else:
            break
    assert run_complete(world.state)
    assert logical_projection(world.state) == final


CONFIGS = {
    "sync S0 P1 K1 1w": (RunConfig(prompts_per_batch=1, group_size=2, max_staleness=0,
                                   sync_period=1, optimizer_steps=1, total_updates=3,
                                   max_inflight_batches=1, seed=1), ("w0",)),
    "S1 P1 K3 2w": (RunConfig(prompts_per_batch=2, group_size=2, max_staleness=1, sync_period=1,
                              optimizer_steps=3, total_updates=3, max_inflight_batches=2,
                              seed=2), ("w0", "w1")),
    "S2 P3 eval ckpt K1 2w": (RunConfig(prompts_per_batch=1, group_size=2, max_staleness=2,
                                        sync_period=3, optimizer_steps=1, total_updates=5,
                                        eval_every=2, checkpoint_every=4,
                                        max_inflight_batches=3, seed=3), ("a", "b")),
    "S1 P2 K2 kl 1w": (RunConfig(prompts_per_batch=2, group_size=2, max_staleness=1,
                                 sync_period=2, optimizer_steps=2, total_updates=3,
                                 max_inflight_batches=2, seed=4,
                                 objective=ObjectiveConfig(kl_coef=0.1)), ("w0",)),
    "S1 P1 K3 inflight1 2w": (RunConfig(prompts_per_batch=1, group_size=3, max_staleness=1,
                                        sync_period=1, optimizer_steps=3, total_updates=2,
                                        max_inflight_batches=1, seed=5), ("w0", "w1")),
}

_CANONICAL: dict[str, object] = {}


def canonical(name: str):
    if name not in _CANONICAL:
        config, workers = CONFIGS[name]
        run = canonical_run(config, workers)
        assert run_complete(run.state)
        _CANONICAL[name] = run
    return _CANONICAL[name]


@pytest.mark.parametrize("name", list(CONFIGS))
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_every_interleaving_with_faults_ends_canonically(name, data):
    config, workers = CONFIGS[name]
    reference = canonical(name)
    world = make_world(config, workers)
    play(world, Choices(data), Faults())
    assert run_complete(world.state)
    assert logical_projection(world.state) == logical_projection(reference.state)
    boundary = Counter(c for c in reference.commands if isinstance(c, (Evaluate, Checkpoint)))
    assert Counter(world.boundary_commands) == boundary, "each boundary evaluated/kept once"
    assert noop_total(world.state) == world.noops
    assert getattr(world.state.noops, "divergent", 0) == 0, "the fakes are deterministic"


@pytest.mark.parametrize("name", list(CONFIGS))
@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_reordering_alone_ends_canonically_without_noops(name, data):
    """No faults at all: any delivery order, the same run, and nothing is a no-op."""
    config, workers = CONFIGS[name]
    world = make_world(config, workers)
    play(world, Choices(data), Faults(0, 0, 0, 0, 0))
    assert logical_projection(world.state) == logical_projection(canonical(name).state)
    assert world.noops == 0


@pytest.mark.parametrize("name", list(CONFIGS))
def test_canonical_run_keeps_every_invariant(name):
    """The FIFO run itself, through the same checks (and the fixed worker set changes nothing)."""
    config, workers = CONFIGS[name]
    world = make_world(config, workers)
    while world.network:
        world.deliver(0)
    assert run_complete(world.state)
    assert logical_projection(world.state) == logical_projection(canonical(name).state)
    assert logical_projection(canonical_run(config, ("x", "y", "z")).state) == \
        logical_projection(world.state)
    assert world.noops == 0


class SeededChoices:
    """The same choices from a seeded PRNG, with a fault rate: a fixed, reproducible sweep."""

    def __init__(self, seed: int, fault_rate: float) -> None:
        self.rng = random.Random(seed)
        self.fault_rate = fault_rate

    def action(self) -> int:
        return self.rng.randint(88, 99) if self.rng.random() < self.fault_rate else 0

    def index(self, n: int) -> int:
        return self.rng.randrange(n)


def test_seeded_sweep_exercises_every_fault():
    """A deterministic sweep with heavier fault budgets; also shows that the simulator really
    injects every kind of fault and that the core really sees duplicates and late replies."""
    applied: Counter = Counter()
    noops = Counter()
    for seed in range(40):
        name = list(CONFIGS)[seed % len(CONFIGS)]
        config, workers = CONFIGS[name]
        world = make_world(config, workers)
        play(world, SeededChoices(seed, fault_rate=0.25), Faults(6, 6, 4, 3, 3))
        assert logical_projection(world.state) == logical_projection(canonical(name).state)
        applied.update(world.applied)
        noops.update({f.name: getattr(world.state.noops, f.name)
                      for f in fields(world.state.noops)})
    for kind in ("duplicate", "drop", "timer", "worker_loss", "learner_restart"):
        assert applied[kind] >= 10, applied
    assert noops["duplicates"] > 0 and noops["late"] > 0, noops
