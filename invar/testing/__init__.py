"""Public test fakes (trio style): the world around the core and its components.

`invar.model.world` defines components that keep exactly the rules and the memory real ones
keep (a learner that holds its pending forward binding and refuses mismatched cotangents,
workers that hold one loaded version, a weights store, a journal that loses its unsynced
suffix, forwards that may be non-reproducible), and the world's actions (deliver, drop,
duplicate, merge and split reply frames, crash, restart). The model checker, the property
tests, `canonical_run` and the benchmarks all use them, with the very `step` and `shell` the
runtime runs.

The stateless replies below (`reply`, `worker_reply`, `learner_reply`) are what those
components answer when nothing went wrong: handy for step-by-step tests of the core.

`invar.testing.runtime` holds the runtime's fakes (a learner backend with the world's
numerics, in-memory workers speaking the frame protocol): the real driver runs in-process
against them, without torch or processes. `invar.testing.backend_conformance` is the suite
every learner backend (`invar.runtime.backend.LearnerBackend`) must pass.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from invar.journal_format import CHAIN_START, linked, unlinked
from invar.journal_format.payloads import (
    Segments,
    payload_bytes,
    payload_dir,
    record_of,
    reference,
    referenced,
    segment_path,
)
from invar.model.config import RunConfig
from invar.model.messages import (
    ApplyCotangent,
    Checkpoint,
    CheckpointWritten,
    Command,
    Commit,
    Completions,
    Evaluate,
    Event,
    LaunchRequest,
    LaunchRequests,
    LearnerStarted,
    LoadWeights,
    Publish,
    RequestsCompleted,
    RunForward,
    ScoreProbabilities,
    StepFinished,
    UpdateCommitted,
    VersionEvaluated,
    VersionPublished,
    WeightsLoaded,
    WorkerConnected,
)
from invar.model.state import State
from invar.model.world import (
    CORE,
    RESPONSE_TOKENS,
    Answers,
    Decision,
    Delivered,
    Learner,
    LearnerRules,
    Message,
    Worker,
    World,
    crash_learner,
    crash_worker,
    deliver_message,
    drop,
    duplicate,
    evaluation_reward,
    fire_timer,
    forward_reply,
    merge_replies,
    merged,
    new_world,
    restart_driver,
    restart_learner,
    restart_worker,
    run_fifo,
    sample_reply,
    scores_reply,
    split_reply,
    step_digest,
    version_digest,
)

__all__ = [
    "CORE", "RESPONSE_TOKENS", "Decision", "Learner", "LearnerRules", "Message", "Run", "World",
    "Worker", "canonical_run", "crash_learner", "crash_worker", "deliver_message", "drop",
    "duplicate", "edit_completion", "fire_timer", "framed", "learner_reply", "merge_replies",
    "new_world", "relinked", "reply", "restart_driver", "restart_learner", "restart_worker",
    "run_fifo", "split_reply", "start_events", "step_digest", "version_digest", "worker_reply",
]


def worker_reply(command: LaunchRequest | LaunchRequests | LoadWeights) -> Event:
    """What a correct worker answers to a launch (one frame for launches sent together) or a
    load."""
    if isinstance(command, LoadWeights):
        return WeightsLoaded(command.worker, command.incarnation, command.load, command.version)
    if isinstance(command, LaunchRequests):
        return sample_reply(*command.launches())
    return sample_reply(command)


def learner_reply(command: Command, optimizer_steps: int) -> Event | None:
    """What a correct learner (or the store, for Publish) answers (None: nothing)."""
    if isinstance(command, ScoreProbabilities):
        return scores_reply(command)
    if isinstance(command, RunForward):
        return forward_reply(command, optimizer_steps)
    if isinstance(command, ApplyCotangent):
        obs = command.observation
        return StepFinished(obs, command.attempt,
                            step_digest(obs.update, obs.step + 1, optimizer_steps))
    if isinstance(command, Commit):
        return UpdateCommitted(command.update, command.expected_digest)
    if isinstance(command, Publish):
        return VersionPublished(command.version, command.weights_digest)
    if isinstance(command, Evaluate):
        return VersionEvaluated(command.version, evaluation_reward(command.version))
    if isinstance(command, Checkpoint):
        return CheckpointWritten(command.version, version_digest(command.version))
    return None


def reply(command: Command, optimizer_steps: int) -> Event | None:
    """The correct reply of whichever component `command` is addressed to."""
    if isinstance(command, (LaunchRequest, LaunchRequests, LoadWeights)):
        return worker_reply(command)
    return learner_reply(command, optimizer_steps)


@dataclass
class Run:
    """A run driven to completion in-process: the accepted events and the final state."""

    state: State
    events: list[Event] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    world: World | None = None


def start_events(workers: tuple[str, ...] = ("w0",)) -> list[Event]:
    return [LearnerStarted(0, 0, version_digest(0)),
            *(WorkerConnected(name, 0) for name in workers)]


def canonical_run(config: RunConfig, workers: tuple[str, ...] = ("w0",),
                  max_events: int = 1_000_000, delivered: Delivered | None = None,
                  answers: Answers | None = None) -> Run:
    """The reference execution: the world with no faults, first message first (every command
    answered in FIFO order). Records the events the core accepted and the commands it sent.
    `delivered` and `answers`: a model checker's memos (see `deliver_message`), whose search
    has met most of these deliveries already."""
    world = new_world(config, workers)
    run = Run(world.core)
    for _ in range(max_events):
        if not world.network:
            break
        first = world.network[0]
        before = world.core
        sent = len(world.network) - 1
        world = deliver_message(world, first.key, delivered, answers)
        if world.refused or world.broken:
            raise AssertionError(f"canonical run: {world.refused or world.broken}")
        if first.to == CORE and world.core is not before:
            run.events.append(first.body)
        run.commands.extend(m.body for m in world.network[sent:] if m.to != CORE)
    run.state, run.world = world.core, world
    return run


def framed(events: list[Event]) -> list[Event]:
    """`events` with each run of consecutive reply frames of one worker incarnation merged into
    one frame, as a worker process answers the launches it was sent together (a FIFO trace
    from `canonical_run` has one frame per launch). Merging is a world action, so the result is
    a run of its own, ending in the same logical projection."""
    out: list[Event] = []
    for event in events:
        last = out[-1] if out else None
        if (isinstance(event, RequestsCompleted) and isinstance(last, RequestsCompleted)
                and (last.worker, last.incarnation) == (event.worker, event.incarnation)):
            out[-1] = merged(last, event)
        else:
            out.append(event)
    return out


def edit_completion(journal: Path, encoded: dict[str, Any], index: int,
                    **changes: Any) -> dict[str, Any]:
    """A line of `journal`: its `RequestsCompleted` encoding with completion `index` changed
    (fields as `Completion`'s), the changed frame appended to the line's segment file (the
    original stays): how tests tamper with a journal whose completions lie in segments. The
    line's chain link is the caller's to leave stale or compute again (`relinked`)."""
    segment, digest = referenced(encoded["completions"], "completions")
    frame = Segments(payload_dir(journal)).load(segment, digest, line=0, completions=True)
    assert isinstance(frame, Completions)
    completions = list(frame)
    completions[index] = dataclasses.replace(completions[index], **changes)
    changed, record = record_of(payload_bytes(Completions.of(completions)))
    with open(segment_path(payload_dir(journal), segment), "ab") as file:
        file.write(record)
    return {**encoded, "completions": reference(segment, changed)}


def relinked(lines: list[str], key: bytes | None = None) -> str:
    """Journal lines (each with its newline) with their chain links computed again, keyed with
    `key`: what whoever edits a journal can do to an unkeyed chain. How tests tamper with a
    journal past its chain, to reach the model's own checks."""
    chain, out = CHAIN_START, []
    for line in lines:
        parts = unlinked(line.rstrip("\n"))
        if parts is None:
            raise ValueError(f"not a journal line with a chain link: {line[:80]!r}")
        text, chain = linked(key, chain, parts[0])
        out.append(text)
    return "".join(out)
