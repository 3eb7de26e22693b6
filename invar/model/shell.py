"""The shell around `step`, written once: delivery, routing and durability. No I/O.

Everything that happens between the core and the components is decided here, as data and pure
functions, and used by every place that runs the protocol: the model checker's world and the
property tests' world (`invar.model.world`), `canonical_run`, the serial runner, journal replay
and the asynchronous driver (the one place that performs it with real I/O).

* **Delivery** (`deliver`): an event is *accepted* (the state moves; journal it, then send the
  commands, after an fsync when `durable` says so), a *no-op* (a duplicate, late or divergent
  re-delivery: counted, nothing journalled, nothing sent) or *refused* (a `ProtocolError`:
  logged, the state is unchanged).
* **Routing** (`route`, `ROUTES`): which component carries out each command.
* **Durability** (`DURABLE_AT`): what survives a crash of each component, and where the
  journal must be synced before a command may take effect.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from invar.model.core import requires_fsync, step
from invar.model.errors import ProtocolError
from invar.model.messages import (
    ApplyCotangent,
    Checkpoint,
    Command,
    Commit,
    Evaluate,
    Event,
    LaunchRequest,
    LaunchRequests,
    LoadWeights,
    Publish,
    ReleaseVersion,
    RetainVersion,
    RunForward,
    ScoreProbabilities,
    SetTimer,
)
from invar.model.state import State

LEARNER = "learner"
"""The learner: scores, forwards, steps, commits, evaluates and keeps checkpoints."""
STORE = "store"
"""The weights store workers load from: publication writes a version, release deletes it."""
TIMER = "timer"
"""The retry timer: armed by SetTimer, it delivers TimerFired when nothing happens."""
WORKER = "worker"
"""A rollout worker: the command's `worker` field names which one (and `incarnation` which
incarnation: a command for a retired incarnation is not delivered)."""

ROUTES: dict[type, str] = {
    LoadWeights: WORKER,
    LaunchRequest: WORKER,
    LaunchRequests: WORKER,
    ScoreProbabilities: LEARNER,
    RunForward: LEARNER,
    ApplyCotangent: LEARNER,
    Commit: LEARNER,
    Evaluate: LEARNER,
    Checkpoint: LEARNER,
    Publish: STORE,
    RetainVersion: STORE,
    ReleaseVersion: STORE,
    SetTimer: TIMER,
}
"""Command type -> the component that carries it out (one table for every world)."""

REPLIED: frozenset[type] = frozenset({
    LoadWeights, LaunchRequest, LaunchRequests, ScoreProbabilities, RunForward, ApplyCotangent,
    Commit, Evaluate, Checkpoint, Publish,
})
"""Commands answered by an event; the core re-sends them (`outstanding_commands`) until it is
accepted. RetainVersion and ReleaseVersion are idempotent orders to the store, made durable by
the journal; SetTimer is answered by TimerFired."""

DURABLE_AT: dict[str, str] = {
    "journal": "synced when `deliver(...).durable`: before Commit, Publish or ReleaseVersion "
               "go out and when UpdateCommitted or LearnerStarted is accepted; a driver crash "
               "loses the unsynced suffix",
    LEARNER: "its newest commit (written atomically); a crash loses the update in progress",
    STORE: "every published version not yet released",
    "checkpoints": "every checkpoint written (atomically: temp file, fsync, rename, dir fsync)",
    WORKER: "nothing: a new incarnation starts empty",
}
"""What each component keeps across a crash (documentation the worlds implement)."""


def route(command: Command) -> str:
    """The component that carries out `command`: LEARNER, STORE, TIMER or the worker's name."""
    where = ROUTES[type(command)]
    return command.worker if where == WORKER else where  # type: ignore[union-attr]


class Verdict(enum.Enum):
    ACCEPTED = "accepted"
    NOOP = "noop"
    REFUSED = "refused"


@dataclass(frozen=True)
class Delivery:
    """What delivering one event did: the new state, the commands to carry out, and whether
    the journal must be durable before they take effect."""

    verdict: Verdict
    state: State
    commands: tuple[Command, ...] = ()
    durable: bool = False
    error: ProtocolError | None = None


def deliver(state: State, event: Event) -> Delivery:
    """Apply `event` with `step` and classify the outcome (the only way any world calls step)."""
    outcome = step(state, event)
    if isinstance(outcome, ProtocolError):
        return Delivery(Verdict.REFUSED, state, error=outcome)
    after, commands = outcome
    # A no-op changes only the counts; a frame that repeats some completions and brings
    # others is counted *and* accepted.
    if not commands and after.noops != state.noops and after == state:
        return Delivery(Verdict.NOOP, after)
    return Delivery(Verdict.ACCEPTED, after, commands, requires_fsync(event, commands))
