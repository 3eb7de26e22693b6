"""A step-by-step driver of the pure core, shared by the tests under tests/model.

`Driver` is a small, fault-free world: it applies events to `step`, answers every command with
`invar.testing.reply` in FIFO order (the order `canonical_run` uses), and can be paused at any
predicate over the state, so a test can inject a fault or a forged event at a precise point.
Commands addressed to a dead learner attempt or a retired worker incarnation are ignored, as a
real component would ignore them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from invar.model import (
    LearnerPhase,
    ProtocolError,
    RunConfig,
    State,
    initial_state,
    step,
)
from invar.model.messages import (
    ApplyCotangent,
    Command,
    Commit,
    Completions,
    Event,
    ForwardObserved,
    LaunchRequest,
    LearnerStarted,
    LoadWeights,
    ProbabilitiesReported,
    RequestsCompleted,
    RunForward,
    ScoreProbabilities,
    WorkerConnected,
    WorkerLost,
    one_per_request,
)
from invar.model.ragged import Ragged
from invar.testing import reply, version_digest

LEARNER_COMMANDS = (ScoreProbabilities, RunForward, ApplyCotangent, Commit)
WORKER_COMMANDS = (LaunchRequest, LoadWeights)


def small_config(**overrides) -> RunConfig:
    """A tiny run: 2 prompts x 2 samples, 3 updates, K=2 (overridable)."""
    base = dict(prompts_per_batch=2, group_size=2, max_staleness=1, sync_period=1,
                optimizer_steps=2, total_updates=3, max_inflight_batches=2, seed=7)
    base.update(overrides)
    return RunConfig(**base)


class Driver:
    """Apply events one at a time; answer commands FIFO; stop where a test needs to."""

    def __init__(self, config: RunConfig, workers: tuple[str, ...] = ("w0",),
                 start: bool = True) -> None:
        self.config = config
        self.state: State = initial_state(config)
        self.queue: deque[Command] = deque()
        self.commands: list[Command] = []
        self.events: list[Event] = []
        self.learner_attempt = -1
        self.durable = (0, version_digest(0))
        self.worker_incarnation: dict[str, int] = {}
        if start:
            self.apply(LearnerStarted(0, 0, version_digest(0)))
            self.learner_attempt = 0
            for name in workers:
                self.worker_incarnation[name] = 0
                self.apply(WorkerConnected(name, 0))

    # -- applying events -------------------------------------------------------------------

    def apply(self, event: Event) -> tuple[Command, ...]:
        """Apply an event that must be accepted; queue the commands it returns."""
        outcome = step(self.state, event)
        assert not isinstance(outcome, ProtocolError), f"{event} refused: {outcome}"
        self.state, batched = outcome
        commands = one_per_request(batched)  # each launch answered alone, as canonical_run does
        self.events.append(event)
        self.commands.extend(commands)
        self.queue.extend(commands)
        return commands

    def attempt(self, event: Event):
        """The raw outcome of `event` on the current state; the driver's state is unchanged."""
        return step(self.state, event)

    # -- the fake components ---------------------------------------------------------------

    def addressee_alive(self, command: Command) -> bool:
        if isinstance(command, LEARNER_COMMANDS):
            return command.attempt == self.learner_attempt
        if isinstance(command, WORKER_COMMANDS):
            return self.worker_incarnation.get(command.worker) == command.incarnation
        return True

    def answer(self, command: Command) -> Event | None:
        """The reply of the component `command` is addressed to (None: no reply)."""
        if not self.addressee_alive(command):
            return None
        if isinstance(command, Commit):
            self.durable = max(self.durable, (command.update + 1, command.expected_digest))
        return reply(command, self.config.optimizer_steps)

    def next_reply(self) -> Event | None:
        """Pop commands until one has a reply; None when the queue is empty."""
        while self.queue:
            event = self.answer(self.queue.popleft())
            if event is not None:
                return event
        return None

    def pump(self, until: Callable[[Driver], bool] | None = None,
             max_events: int = 100_000) -> bool:
        """Answer queued commands FIFO until `until(self)` holds (True) or the queue empties."""
        for _ in range(max_events):
            if until is not None and until(self):
                return True
            event = self.next_reply()
            if event is None:
                return until is None or until(self)
            self.apply(event)
        raise AssertionError("pump did not terminate")

    def pump_until_command(self, predicate: Callable[[Command], bool]) -> Command:
        """Pump until a command satisfying `predicate` has been *returned* by step (unanswered)."""
        seen = len(self.commands)
        while True:
            for command in self.commands[seen:]:
                if predicate(command):
                    return command
            seen = len(self.commands)
            event = self.next_reply()
            assert event is not None, "queue drained before the command appeared"
            self.apply(event)

    def pump_to_phase(self, phase: LearnerPhase, step_index: int | None = None,
                      update: int | None = None) -> None:
        def reached(d: Driver) -> bool:
            learner = d.state.learner
            return (learner.phase is phase
                    and (step_index is None or learner.step == step_index)
                    and (update is None or d.state.committed == update))
        assert self.pump(reached), f"never reached {phase} step={step_index} update={update}"

    # -- faults ------------------------------------------------------------------------------

    def restart_learner(self, committed_version: int | None = None,
                        digest: str | None = None) -> tuple[Command, ...]:
        """Kill the learner; it comes back from its durable commit (or the version given)."""
        self.learner_attempt += 1
        version, durable_digest = self.durable
        if committed_version is None:
            committed_version = version
        if digest is None:
            digest = durable_digest if committed_version == version else \
                version_digest(committed_version)
        return self.apply(LearnerStarted(self.learner_attempt, committed_version, digest))

    def lose_worker(self, name: str, reconnect: bool = True) -> tuple[Command, ...]:
        incarnation = self.worker_incarnation[name]
        self.worker_incarnation[name] = incarnation + 1  # the old one is gone for good
        commands = self.apply(WorkerLost(name, incarnation))
        if reconnect:
            commands += self.apply(WorkerConnected(name, incarnation + 1))
        return commands

    def drop_queued(self, predicate: Callable[[Command], bool]) -> list[Command]:
        """Remove (lose in the network) every queued command matching `predicate`."""
        dropped = [c for c in self.queue if predicate(c)]
        self.queue = deque(c for c in self.queue if not predicate(c))
        return dropped


def commands_of(commands, kind) -> list:
    return [c for c in commands if isinstance(c, kind)]


class AnsweringWith(Driver):
    """A `Driver` whose components answer with `values`' payloads instead of
    `invar.testing.reply`'s: per request, `values.length(r)` tokens, `behavior(r)` log-probs
    and `reward(r)` from the worker, `proximal(r, update)` (and `reference(r)` when the
    command asks for it) from scoring, `current(r, update, step)` from each forward."""

    values: Any

    def answer(self, command: Command) -> Event | None:
        event = super().answer(command)
        v = self.values
        if isinstance(event, RequestsCompleted):
            return replace(event, completions=Completions.of(
                replace(c, tokens=tuple(range(v.length(c.request))),
                        behavior_logprobs=v.behavior(c.request), reward=v.reward(c.request))
                for c in event.completions))
        if isinstance(event, ProbabilitiesReported):
            assert isinstance(command, ScoreProbabilities)
            return replace(event, proximal=Ragged.of([v.proximal(r, command.update)
                                                      for r in command.requests]),
                           reference=Ragged.of([v.reference(r) for r in command.requests])
                           if command.reference else None)
        if isinstance(event, ForwardObserved):
            assert isinstance(command, RunForward)
            obs = command.observation
            return replace(event, current_logprobs=Ragged.of([v.current(r, obs.update, obs.step)
                                                              for r in command.requests]))
        return event
