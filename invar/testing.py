"""Deterministic fakes of every component, as pure functions of the commands they receive.

Public API (trio style): the model checker's actors, the property tests and the benchmarks
all use these, so they exercise the very `step` the runtime runs. A fake is *correct*: its
replies are what a well-behaved worker or learner would send, and they depend only on the
command's logical content (identity, version, step) — never on the attempt, the worker or the
time — so a redo or a re-issue yields the same payload, as a numerically invariant worker would.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from invar.model import schedule
from invar.model.config import RunConfig
from invar.model.core import step
from invar.model.errors import ProtocolError
from invar.model.messages import (
    ApplyCotangent,
    Command,
    Commit,
    Event,
    ForwardObserved,
    LaunchRequest,
    LearnerStarted,
    LoadWeights,
    ProbabilitiesReported,
    Publish,
    RequestCompleted,
    RunForward,
    ScoreProbabilities,
    StepFinished,
    UpdateCommitted,
    VersionPublished,
    WeightsLoaded,
    WorkerConnected,
)
from invar.model.state import State, initial_state

RESPONSE_TOKENS = 2
"""Tokens per synthetic response: enough to exercise per-token averaging, small to hash."""


def version_digest(version: int) -> str:
    """The synthetic learner's weights digest of committed version `version`."""
    return f"w{version}"


def step_digest(update: int, step: int, optimizer_steps: int) -> str:
    """Digest of the synthetic learner's state after `step` steps of `update`."""
    if step == 0:
        return version_digest(update)
    if step == optimizer_steps:
        return version_digest(update + 1)
    return f"w{update}.{step}"


def _logprob(*key: int) -> float:
    """A deterministic log-probability in [-2, -0.05] from a logical key."""
    return -0.05 - (schedule.derive_seed(0, "lp", *key) % 1000) / 520.0


def worker_reply(command: LaunchRequest | LoadWeights) -> Event:
    """What a correct worker answers to a launch or a load."""
    if isinstance(command, LoadWeights):
        return WeightsLoaded(command.worker, command.incarnation, command.load, command.version)
    r = command.request
    tokens = tuple((command.seed >> (4 * i)) % 10 for i in range(RESPONSE_TOKENS))
    behavior = tuple(_logprob(*r, command.version, i) for i in range(RESPONSE_TOKENS))
    reward = float(tokens[0] % 2 + r.sample % 2) / 2.0
    return RequestCompleted(r, command.worker, command.incarnation, command.version, tokens,
                            behavior, reward)


def learner_reply(command: Command, optimizer_steps: int) -> Event | None:
    """What a correct learner answers to a learner command (None: it sends nothing)."""
    if isinstance(command, ScoreProbabilities):
        proximal = tuple(tuple(_logprob(*r, command.update, -1, i) for i in range(RESPONSE_TOKENS))
                         for r in command.requests)
        reference = (tuple(tuple(_logprob(*r, -2, i) for i in range(RESPONSE_TOKENS))
                           for r in command.requests) if command.reference else None)
        return ProbabilitiesReported(command.update, command.attempt, proximal, reference)
    if isinstance(command, RunForward):
        obs = command.observation
        current = tuple(tuple(_logprob(*r, obs.update, obs.step, i) for i in range(RESPONSE_TOKENS))
                        for r in command.requests)
        return ForwardObserved(obs, command.attempt,
                               step_digest(obs.update, obs.step, optimizer_steps), current)
    if isinstance(command, ApplyCotangent):
        obs = command.observation
        return StepFinished(obs, command.attempt,
                            step_digest(obs.update, obs.step + 1, optimizer_steps))
    if isinstance(command, Commit):
        return UpdateCommitted(command.update, command.expected_digest)
    if isinstance(command, Publish):
        return VersionPublished(command.version, command.weights_digest)
    return None


def reply(command: Command, optimizer_steps: int) -> Event | None:
    """The correct reply of whichever component `command` is addressed to."""
    if isinstance(command, (LaunchRequest, LoadWeights)):
        return worker_reply(command)
    return learner_reply(command, optimizer_steps)


@dataclass
class Run:
    """A run driven to completion in-process: the accepted events and the final state."""

    state: State
    events: list[Event] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)


def start_events(workers: tuple[str, ...] = ("w0",)) -> list[Event]:
    return [LearnerStarted(0, 0, version_digest(0)),
            *(WorkerConnected(name, 0) for name in workers)]


def canonical_run(config: RunConfig, workers: tuple[str, ...] = ("w0",),
                  max_events: int = 1_000_000) -> Run:
    """The reference execution: every command answered at once, in FIFO order, no faults."""
    run = Run(initial_state(config))
    queue: deque[Event] = deque(start_events(workers))
    while queue and len(run.events) < max_events:
        event = queue.popleft()
        outcome = step(run.state, event)
        if isinstance(outcome, ProtocolError):
            raise AssertionError(f"canonical run refused {event}: {outcome}")
        run.state, commands = outcome
        run.events.append(event)
        run.commands.extend(commands)
        for command in commands:
            answer = reply(command, config.optimizer_steps)
            if answer is not None:
                queue.append(answer)
    return run
