"""`step(state, event)`: the one transition function of Invar. No I/O of any kind.

It returns `(new_state, commands)` or a `ProtocolError` value (the state is then unchanged).
A duplicate or late reply is not an error: it returns the same logical state, with the no-op
counted, and no commands. Every decision — which version generates a request, which update
consumes it, the minibatch of each step, the cotangent, when to commit and publish, what a
restart redoes — is made here or in `schedule`, from logical identities only.

After handling an event, `_reconcile` derives the follow-up commands from the state alone
(admission, assignment, loads, the learner's next request, publication, retention, the retry
timer), so the same state always leads to the same commands whatever the history's timing.

The rules here are the plain ones, one completion at a time, as spec/PROTOCOL.md states them.
Where a large reply frame or a learner's event would make that slow, a rule first asks
`invar.model.fast`, which answers exactly as the rule would (over whole columns, or by knowing
that a pass decides nothing) or declines; `fast.ENABLED` switches every fast path off at once.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
import operator
import typing
from collections import Counter
from collections.abc import Callable
from types import NoneType
from typing import Any

import numpy as np

from invar.model import fast, schedule
from invar.model.config import RunConfig
from invar.model.errors import ProtocolError, Reason
from invar.model.messages import (
    ApplyCotangent,
    Checkpoint,
    CheckpointWritten,
    Command,
    Commit,
    Completions,
    Evaluate,
    Event,
    ForwardObserved,
    LaunchRequests,
    LearnerStarted,
    LoadWeights,
    Matrix,
    ObservationId,
    ProbabilitiesReported,
    Publish,
    ReleaseVersion,
    RequestsCompleted,
    RetainVersion,
    RunForward,
    ScoreProbabilities,
    SetTimer,
    StepFinished,
    TimerFired,
    UpdateCommitted,
    VersionEvaluated,
    VersionPublished,
    WeightsLoaded,
    WorkerConnected,
    WorkerLost,
    matrix_digest,
)
from invar.model.objective import (
    ObjectiveInputs,
    ObjectiveTerms,
    checked_objective,
    group_advantages,
    objective_inputs,
    token_share,
)
from invar.model.ragged import FLOAT, Ragged
from invar.model.schedule import RequestId
from invar.model.state import (
    AppliedStep,
    Assigned,
    BatchInputs,
    BatchRequests,
    BatchState,
    Consumption,
    History,
    JoinedDigests,
    LearnerPhase,
    LearnerState,
    Positions,
    Sample,
    Scores,
    Slot,
    State,
    WorkerPhase,
    WorkerState,
    chain_ledger,
    completions_of,
    evolve,
    sample_of,
)
from invar.model.transitions import learner_accepts

Result = tuple[State, tuple[Command, ...]] | ProtocolError



def step(state: State, event: Event) -> Result:
    """Apply one event. Pure: `state` is never mutated; equal inputs give equal outputs."""
    kind = type(event)
    handler = _HANDLERS.get(kind)
    if handler is None:
        return ProtocolError(state, event, Reason.MALFORMED_PAYLOAD,
                             f"not an event: {kind.__name__}")
    for name, value_of, allowed in _FIELD_TYPES[kind]:
        value = value_of(event)
        if type(value) not in allowed:
            return ProtocolError(state, event, Reason.MALFORMED_PAYLOAD,
                                 f"{name}: expected {_expected(allowed)}, got "
                                 f"{type(value).__name__}")
    outcome = handler(state, event)
    if isinstance(outcome, (ProtocolError, _NoOp)):
        if isinstance(outcome, ProtocolError):
            return outcome
        return _count(state, outcome), ()
    new_state, commands = outcome
    return _reconcile(new_state, commands)


def run_complete(state: State) -> bool:
    """Every update committed, the final version published, evaluated and checkpointed."""
    n = state.config.total_updates
    return (state.committed == n and bool(state.published) and state.published[-1] == n
            and not _boundary_commands(state))


def logical_projection(state: State) -> tuple[Any, ...]:
    """What must not depend on timing: what each update really consumed and applied (as the
    components reported it), publications, evaluations and checkpoints."""
    return state.ledger, state.published, state.evaluated, state.checkpointed


def requires_fsync(event: Event, commands: tuple[Command, ...] | list[Command]) -> bool:
    """Whether the journal must be durable before `commands` go out: the commit points.

    A journal synced here never lags the learner's disk by more than the commit in flight,
    which `LearnerStarted` resolves; a version is deleted from the store only once its
    release is durable (a restart from an older journal may still need it); everything else
    lost with a driver is re-sent.
    """
    return isinstance(event, (UpdateCommitted, LearnerStarted)) or any(
        isinstance(c, (Commit, Publish, ReleaseVersion)) for c in commands)


def outstanding_commands(state: State) -> tuple[Command, ...]:
    """Every command whose reply the core still awaits: what a retry (or a restart) re-sends."""
    out: list[Command] = []
    config = state.config
    for batch in state.batches:
        if batch.pending + batch.completed == len(batch.slots):
            continue
        requests = schedule.request_ids(config, batch.batch)
        launches: dict[Assigned, _Launches] = {}
        for position, slot in enumerate(batch.slots):
            if isinstance(slot, Assigned):
                columns = launches.get(slot)
                if columns is None:
                    columns = launches[slot] = _Launches(slot)
                request = requests[position]
                columns.add(position, request, schedule.sampling_seed(config, request),
                            schedule.prompt_index(config, request.batch, request.prompt))
        version = schedule.gen_version(config, batch.batch)
        out.extend(columns.command(version) for columns in launches.values())
    for w in state.workers:
        if w.phase is WorkerPhase.LOADING:
            out.append(_load(state, w))
    learner_command = _learner_command(state)
    if learner_command is not None:
        out.append(learner_command)
    if state.publishing is not None:
        out.append(Publish(state.publishing, state.commit_digests[state.publishing]))
    out.extend(_boundary_commands(state))
    return tuple(out)


def reconciled(state: State) -> tuple[State, tuple[Command, ...]]:
    """What reconciliation (§4.3) decides on `state`: the state and the commands its passes
    would produce. `step` ends every accepted event with it, so on every reachable state it
    decides nothing (`invariants.reconciliation_settled`)."""
    return _reconcile(state, [])


def _boundary_commands(state: State) -> list[Command]:
    """The evaluation and checkpoint of the newest committed version, until acknowledged.

    Only the newest can be outstanding: the learner does not start the next update before
    both are acknowledged (so it evaluates and keeps exactly these weights)."""
    if not state.commit_digests:
        return []
    version = state.committed
    out: list[Command] = []
    if schedule.is_eval_boundary(state.config, version) and version not in state.evaluated[-1:]:
        out.append(Evaluate(version))
    if (schedule.is_checkpoint_boundary(state.config, version)
            and version not in state.checkpointed[-1:]):
        out.append(Checkpoint(version))
    return out


# ---------------------------------------------------------------------------------------------
# Event handlers: each returns (state, commands), a _NoOp, or a ProtocolError.


class _NoOp:
    """A harmless event: how many repeats of each kind it brought (a frame may repeat several
    samples, even of both kinds)."""

    def __init__(self, **counts: int) -> None:
        self.counts = counts


_DUPLICATE = _NoOp(duplicates=1)
_LATE = _NoOp(late=1)
_DIVERGENT = _NoOp(divergent=1)
Handled = tuple[State, list[Command]] | _NoOp | ProtocolError


def _count(state: State, noop: _NoOp) -> State:
    counts = state.noops
    return evolve(state, noops=evolve(counts, **{
        kind: getattr(counts, kind) + n for kind, n in noop.counts.items()}))


def _on_worker_connected(state: State, event: WorkerConnected) -> Handled:
    known = state.worker(event.worker)
    if known is not None and event.incarnation <= known.incarnation:
        same = event.incarnation == known.incarnation and known.phase is not WorkerPhase.LOST
        return _DUPLICATE if same else _LATE
    fresh = WorkerState(event.worker, event.incarnation, WorkerPhase.IDLE, None, 0, 0)
    if known is not None:
        state = _requeue(state, known)
    return _put_worker(state, fresh), []


def _on_worker_lost(state: State, event: WorkerLost) -> Handled:
    known = state.worker(event.worker)
    if known is None:
        return ProtocolError(state, event, Reason.UNKNOWN_WORKER,
                             f"worker {event.worker!r} never connected")
    if event.incarnation < known.incarnation:
        return _LATE
    if event.incarnation > known.incarnation:
        return ProtocolError(state, event, Reason.UNKNOWN_WORKER,
                             f"worker {event.worker!r} incarnation {event.incarnation} never "
                             f"connected (current {known.incarnation})")
    if known.phase is WorkerPhase.LOST:
        return _DUPLICATE
    state = _requeue(state, known)
    lost = evolve(known, phase=WorkerPhase.LOST, version=None, assigned=0)
    return _put_worker(state, lost), []


def _on_weights_loaded(state: State, event: WeightsLoaded) -> Handled:
    known = state.worker(event.worker)
    if known is None:
        return ProtocolError(state, event, Reason.UNKNOWN_WORKER,
                             f"worker {event.worker!r} never connected")
    if (event.incarnation < known.incarnation or known.phase is WorkerPhase.LOST
            or event.load < known.load):
        return _LATE
    if event.incarnation > known.incarnation or event.load > known.load:
        return ProtocolError(state, event, Reason.UNREQUESTED_LOAD,
                             f"load {event.load} of {event.worker!r}#{event.incarnation} was "
                             f"never requested (last: load {known.load} of #{known.incarnation})")
    if event.version != known.version:
        return ProtocolError(state, event, Reason.UNREQUESTED_LOAD,
                             f"load {event.load} was for version {known.version}, "
                             f"not {event.version}")
    if known.phase is not WorkerPhase.LOADING:
        return _DUPLICATE
    return _put_worker(state, evolve(known, phase=WorkerPhase.READY)), []


def _on_requests_completed(state: State, event: RequestsCompleted) -> Handled:
    """Each completion of the frame fills its slot, repeats it (duplicate) or contradicts it
    (divergent); the frame is refused whole, changing nothing, if any completion is bad."""
    frame = event.completions
    if not len(frame):
        return ProtocolError(state, event, Reason.MALFORMED_PAYLOAD,
                             "completions: an empty frame (a reply has at least one)")
    error = _completions_error(state, event, frame)
    if error is not None:
        return error
    if state.worker(event.worker) is None:
        return ProtocolError(state, event, Reason.UNKNOWN_WORKER,
                             f"worker {event.worker!r} never connected")
    raw_digests = _sample_digests(frame)
    digests = list(map(bytes.hex, raw_digests))
    filled = fast.filled_in_bulk(state, frame, digests, raw_digests)
    if filled is None:
        filled = _filled(state, frame, digests)
    batches, freed, noops = filled
    if not batches:
        return _NoOp(**noops)
    state = _count(state, _NoOp(**noops))
    for batch in batches:
        state = _put_batch(state, batch)
    return _free(state, freed), []


def _filled(state: State, frame: Completions, digests: list[str]) -> fast.Filled:
    """Each completion in turn fills its slot, or repeats the sample there (duplicate) or
    contradicts it (divergent): the batches filled, each worker's completed requests and the
    no-ops, by kind. `digests` are the completions' digests."""
    g = state.config.group_size
    requests = frame.requests.tolist()
    batches = {index: state.batch(index) for index in {request[0] for request in requests}}
    changes: dict[int, dict[int, Slot]] = {i: {} for i, b in batches.items() if b is not None}
    freed: Counter[str] = Counter()  # worker -> its requests done
    noops: Counter[str] = Counter()
    versions = frame.versions.tolist()
    for row, ((index, prompt, sample), digest) in enumerate(zip(requests, digests)):
        batch = batches[index]
        if batch is None:
            noops["duplicates"] += 1  # its batch was consumed: the ledger holds it
            continue
        position = prompt * g + sample
        new = changes[index]
        slot = new[position] if position in new else batch.slots[position]
        if type(slot) is Sample:
            # Same identity, version and seed: a numerically invariant worker repeats itself.
            noops["duplicates" if slot.digest == digest else "divergent"] += 1
            continue
        new[position] = sample_of(frame, row, digest, versions[row])
        if slot is not None:
            freed[slot.worker] += 1  # type: ignore[union-attr]
    filled = [batches[index].with_slots(slots)  # type: ignore[union-attr]
              for index, slots in changes.items() if slots]
    return filled, freed, noops


_VERSION, _DIGEST = operator.attrgetter("version"), operator.attrgetter("digest")


def _free(state: State, freed: Counter[str]) -> State:
    """Each worker's count of assigned requests less those it has `freed` (completed)."""
    for name, done in freed.items():
        # An Assigned slot names its worker's current incarnation: a new incarnation or a loss
        # re-queues the old one's slots (and `batch_counters_consistent` checks the counts).
        holder = state.worker(name)
        assert holder is not None, name
        state = _put_worker(state, evolve(holder, assigned=holder.assigned - done))
    return state


def _completions_error(state: State, event: RequestsCompleted,
                       frame: Completions) -> ProtocolError | None:
    """The first bad completion of the frame, if any: an unknown request, a version other
    than the one its batch is assigned, or a malformed payload."""
    config, admitted = state.config, state.admitted
    if fast.frame_fine(config, admitted, frame):
        return None
    prompts, group = config.prompts_per_batch, config.group_size
    versions: dict[int, int] = {}
    for i, (request, version, tokens, logprobs, reward) in enumerate(zip(
            frame.requests.tolist(), frame.versions.tolist(), frame.tokens.rows(),
            frame.behavior_logprobs.rows(), frame.rewards.tolist())):
        batch, prompt, sample = request
        if not (0 <= batch < admitted and 0 <= prompt < prompts and 0 <= sample < group):
            return ProtocolError(state, event, Reason.UNKNOWN_REQUEST,
                                 f"completions[{i}]: request {tuple(request)} was never "
                                 f"launched (admitted batches: {admitted})")
        expected = versions.get(batch)
        if expected is None:
            expected = versions[batch] = schedule.gen_version(config, batch)
        if version != expected:
            return ProtocolError(state, event, Reason.WRONG_VERSION,
                                 f"completions[{i}]: request {tuple(request)} is assigned "
                                 f"version {expected}, reply claims {version}")
        problem = _sample_problem(tokens, logprobs, reward)
        if problem:
            return ProtocolError(state, event, Reason.MALFORMED_PAYLOAD,
                                 f"completions[{i}].{problem}")
    return None


def _on_learner_started(state: State, event: LearnerStarted) -> Handled:
    learner = state.learner
    if event.incarnation <= learner.attempt:
        return _DUPLICATE if event.incarnation == learner.attempt else _LATE
    if learner.phase is LearnerPhase.OFFLINE:
        if event.committed_version != 0:
            return ProtocolError(state, event, Reason.UNKNOWN_COMMIT,
                                 f"first start must be from version 0, not "
                                 f"{event.committed_version}")
        state = evolve(state, commit_digests=History((event.weights_digest,)))
        return _restart_learner(state, event.incarnation), _boundary_commands(state)
    committed = state.committed
    commands: list[Command] = []
    if event.committed_version == committed + 1 and learner.phase is LearnerPhase.COMMITTING:
        if event.weights_digest != learner.step_digest:
            return ProtocolError(state, event, Reason.COMMIT_DIGEST_MISMATCH,
                                 f"learner restarted from version {committed + 1} with digest "
                                 f"{event.weights_digest}; the update ended at "
                                 f"{learner.step_digest}")
        # The commit became durable but its reply died with the learner: the disk is the truth.
        state, commands = _apply_commit(state, event.weights_digest)
    elif event.committed_version != committed:
        return ProtocolError(state, event, Reason.UNKNOWN_COMMIT,
                             f"learner restarted from version {event.committed_version}; the "
                             f"last commit is {committed}")
    elif event.weights_digest != state.commit_digests[committed]:
        return ProtocolError(state, event, Reason.COMMIT_DIGEST_MISMATCH,
                             f"version {committed} has digest {state.commit_digests[committed]}, "
                             f"learner restored {event.weights_digest}")
    else:
        # The restarted learner lost whatever boundary work was queued for its predecessor.
        commands = _boundary_commands(state)
    return _restart_learner(state, event.incarnation), commands


def _on_probabilities_reported(state: State, event: ProbabilitiesReported) -> Handled:
    problem = (_not_a_matrix("proximal", event.proximal)
               or (event.reference is not None and _not_a_matrix("reference", event.reference)))
    if problem:
        return ProtocolError(state, event, Reason.MALFORMED_PAYLOAD, problem)
    if not state.config.scores_batch:
        return ProtocolError(state, event, Reason.UNREQUESTED_SCORES,
                             f"scores of update {event.update} were not requested: this run's "
                             f"updates take the proximal log-probs from their forward (one "
                             f"optimizer step, no KL term)")
    learner = state.learner
    if event.attempt < learner.attempt or event.update < state.committed:
        return _LATE
    current = event.attempt == learner.attempt and event.update == state.committed
    if current and learner.phase in (LearnerPhase.FORWARD, LearnerPhase.APPLYING,
                                     LearnerPhase.COMMITTING):
        return _DUPLICATE
    if not (current and learner_accepts(learner.phase, ProbabilitiesReported)):
        return ProtocolError(state, event, Reason.UNREQUESTED_SCORES,
                             f"scores of update {event.update} (attempt {event.attempt}) were "
                             f"not requested")
    batch = state.batch(event.update)
    assert batch is not None
    lengths = completions_of(batch.slots).tokens.lengths
    problem = _matrix_problem("proximal", event.proximal, lengths)
    if state.config.objective.needs_reference:
        problem = problem or _matrix_problem("reference", event.reference, lengths)
    elif event.reference is not None:
        problem = "reference: not requested (kl_coef is 0)"
    if problem:
        return ProtocolError(state, event, Reason.MALFORMED_PAYLOAD, problem)
    scores = Scores(matrix_digest(event.proximal, event.reference), event.proximal,
                    event.reference,
                    _batch_inputs(state.config, batch, event.proximal, event.reference))
    return _request_forward(state, 0, scores=scores)


def _on_forward_observed(state: State, event: ForwardObserved) -> Handled:
    problem = _not_a_matrix("current_logprobs", event.current_logprobs)
    if problem:
        return ProtocolError(state, event, Reason.MALFORMED_PAYLOAD, problem)
    learner = state.learner
    status = _observation_status(state, event.observation, event.attempt)
    if status == "late":
        return _LATE
    if status == "pending" and learner.phase is LearnerPhase.APPLYING:
        same = matrix_digest(event.current_logprobs) == learner.forward_digest
        return _DUPLICATE if same else _DIVERGENT
    if status != "pending" or not learner_accepts(learner.phase, ForwardObserved):
        return ProtocolError(state, event, Reason.UNREQUESTED_OBSERVATION,
                             f"forward {tuple(event.observation)} was never requested "
                             f"(pending: {learner.observation and tuple(learner.observation)})")
    if event.pre_step_digest != learner.step_digest:
        return ProtocolError(state, event, Reason.BINDING_MISMATCH,
                             f"forward ran from state {event.pre_step_digest}, step "
                             f"{learner.step} starts from {learner.step_digest}")
    scores = learner.scores
    if scores is None:  # a batch not scored (`RunConfig.scores_batch`): its inputs, once
        batch = state.batch(state.committed)
        assert batch is not None
        scores = Scores("", None, None, _batch_inputs(state.config, batch, None, None))
    inputs = scores.inputs
    problem = _matrix_problem("current_logprobs", event.current_logprobs,
                              inputs.lengths[learner.step])
    if problem:
        return ProtocolError(state, event, Reason.MALFORMED_PAYLOAD, problem)
    command = _cotangent(state.config, inputs.steps[learner.step], event)
    if isinstance(command, str):
        return ProtocolError(state, event, Reason.DIVERGED,
                             f"update {state.committed} step {learner.step}: {command}")
    learner = evolve(learner, phase=LearnerPhase.APPLYING, cotangent=command,
                     forward_digest=command.forward_digest, scores=scores)
    return evolve(state, learner=learner), [command]


def _on_step_finished(state: State, event: StepFinished) -> Handled:
    learner = state.learner
    status = _observation_status(state, event.observation, event.attempt)
    if status == "late":
        return _LATE
    if status != "pending" or not learner_accepts(learner.phase, StepFinished):
        return ProtocolError(state, event, Reason.UNREQUESTED_OBSERVATION,
                             f"no cotangent was sent for {tuple(event.observation)}")
    applied = AppliedStep(learner.step, learner.positions, learner.forward_digest,
                          event.post_step_digest)
    finished = dict(step_digest=event.post_step_digest, cotangent=None, forward_digest="",
                    applied=learner.applied + (applied,))
    if learner.step + 1 < state.config.optimizer_steps:
        return _request_forward(state, learner.step + 1, **finished)
    learner = evolve(learner, phase=LearnerPhase.COMMITTING, observation=None, positions=(),
                     **finished)
    return evolve(state, learner=learner), [_commit_command(state.committed, learner)]


def _on_update_committed(state: State, event: UpdateCommitted) -> Handled:
    if event.update < 0:
        return ProtocolError(state, event, Reason.MALFORMED_PAYLOAD,
                             f"update: {event.update} is negative")
    if event.update < state.committed:
        if event.weights_digest != state.commit_digests[event.update + 1]:
            return ProtocolError(state, event, Reason.COMMIT_DIGEST_MISMATCH,
                                 f"update {event.update} committed as "
                                 f"{state.commit_digests[event.update + 1]}, a repeat says "
                                 f"{event.weights_digest}")
        return _DUPLICATE
    learner = state.learner
    if event.update > state.committed or not learner_accepts(learner.phase, UpdateCommitted):
        return ProtocolError(state, event, Reason.PREMATURE_COMMIT,
                             f"update {event.update} has not run all its "
                             f"{state.config.optimizer_steps} steps (learner: "
                             f"{learner.phase.value}, step {learner.step})")
    if event.weights_digest != learner.step_digest:
        return ProtocolError(state, event, Reason.COMMIT_DIGEST_MISMATCH,
                             f"commit of update {event.update} has digest {event.weights_digest}, "
                             f"the last step ended at {learner.step_digest}")
    state, commands = _apply_commit(state, event.weights_digest)
    learner = _fresh_learner(state, state.learner.attempt)
    return evolve(state, learner=learner), commands


def _on_version_published(state: State, event: VersionPublished) -> Handled:
    if event.version in state.published:
        return _DUPLICATE
    if event.version != state.publishing or (
            event.weights_digest != state.commit_digests[event.version]):
        return ProtocolError(state, event, Reason.UNREQUESTED_PUBLICATION,
                             f"publication of version {event.version} ({event.weights_digest}) "
                             f"was not requested (publishing: {state.publishing})")
    state = evolve(state, published=state.published + (event.version,), publishing=None,
                   retained=tuple(sorted({*state.retained, event.version})))
    return state, [RetainVersion(event.version)]


def _on_version_evaluated(state: State, event: VersionEvaluated) -> Handled:
    if event.version in state.evaluated:
        return _DUPLICATE
    if Evaluate(event.version) not in _boundary_commands(state):
        return ProtocolError(state, event, Reason.UNREQUESTED_BOUNDARY,
                             f"evaluation of version {event.version} was not requested")
    if not math.isfinite(event.reward):
        return ProtocolError(state, event, Reason.MALFORMED_PAYLOAD, "reward: must be finite")
    return evolve(state, evaluated=state.evaluated + (event.version,)), []


def _on_checkpoint_written(state: State, event: CheckpointWritten) -> Handled:
    known = 0 <= event.version < len(state.commit_digests)
    if known and event.weights_digest != state.commit_digests[event.version]:
        return ProtocolError(state, event, Reason.COMMIT_DIGEST_MISMATCH,
                             f"checkpoint of version {event.version} has digest "
                             f"{event.weights_digest}, the commit has "
                             f"{state.commit_digests[event.version]}")
    if event.version in state.checkpointed:
        return _DUPLICATE
    if Checkpoint(event.version) not in _boundary_commands(state):
        return ProtocolError(state, event, Reason.UNREQUESTED_BOUNDARY,
                             f"checkpoint of version {event.version} was not requested")
    return evolve(state, checkpointed=state.checkpointed + (event.version,)), []


def _on_timer_fired(state: State, event: TimerFired) -> Handled:
    if not state.timer_armed:
        return _LATE
    return evolve(state, timer_armed=False), list(outstanding_commands(state))


_HANDLERS: dict[type, Callable[[State, Any], Handled]] = {
    WorkerConnected: _on_worker_connected,
    WorkerLost: _on_worker_lost,
    WeightsLoaded: _on_weights_loaded,
    RequestsCompleted: _on_requests_completed,
    LearnerStarted: _on_learner_started,
    ProbabilitiesReported: _on_probabilities_reported,
    ForwardObserved: _on_forward_observed,
    StepFinished: _on_step_finished,
    UpdateCommitted: _on_update_committed,
    VersionPublished: _on_version_published,
    VersionEvaluated: _on_version_evaluated,
    CheckpointWritten: _on_checkpoint_written,
    TimerFired: _on_timer_fired,
}


_ACCEPTED_TYPES: dict[Any, frozenset[type]] = {
    int: frozenset({int}),  # not bool, as decoding
    float: frozenset({float, int, np.float64}),
    str: frozenset({str}),
    Ragged: frozenset({Ragged}),
    Ragged | None: frozenset({Ragged, NoneType}),
    Completions: frozenset({Completions}),
    ObservationId: frozenset({ObservationId}),
}


def _field_types(kind: type) -> tuple[tuple[str, Callable[[Any], Any], frozenset[type]], ...]:
    """Each field of event type `kind` (an observation's own after it), a getter and the exact
    types it may hold: what `decode` makes of it. `step` checks them before any handler
    reads a field, so an event built by hand with a wrong type is refused, naming the field,
    instead of raising wherever the handler first uses it."""
    fields: list[tuple[str, Callable[[Any], Any], frozenset[type]]] = []
    for name, hint in typing.get_type_hints(kind).items():
        fields.append((name, operator.attrgetter(name), _ACCEPTED_TYPES[hint]))
        if hint is ObservationId:
            fields += [(f"{name}.{part}", operator.attrgetter(f"{name}.{part}"),
                        _ACCEPTED_TYPES[int]) for part in ObservationId._fields]
    return tuple(fields)


_FIELD_TYPES = {kind: _field_types(kind) for kind in _HANDLERS}


def _expected(allowed: frozenset[type]) -> str:
    return " or ".join(sorted(kind.__name__ for kind in allowed))


# ---------------------------------------------------------------------------------------------
# The learner's path through one update.


def _fresh_learner(state: State, attempt: int) -> LearnerState:
    done = state.committed == state.config.total_updates
    return LearnerState(
        attempt=attempt,
        phase=LearnerPhase.FINISHED if done else LearnerPhase.WAITING,
        step=0,
        observation=None,
        step_digest=state.commit_digests[state.committed],
        scores=None,
        observations=state.learner.observations,
    )


def _restart_learner(state: State, attempt: int) -> State:
    """Whatever the update in progress had done is abandoned: it is redone whole."""
    return evolve(state, learner=_fresh_learner(state, attempt))


def _request_forward(state: State, step: int, **learner_changes: Any
                     ) -> tuple[State, list[Command]]:
    """Ask for the forward of `step`, the learner changed also by `learner_changes` (what
    led to it: one new learner per event)."""
    learner = state.learner
    observation = ObservationId(state.committed, step, learner.observations)
    positions = _plan_positions(state.config, state.committed)[step]
    learner = evolve(learner, phase=LearnerPhase.FORWARD, step=step, observation=observation,
                     observations=learner.observations + 1, positions=positions,
                     **learner_changes)
    state = evolve(state, learner=learner)
    return state, [_forward_command(state, learner)]


@functools.lru_cache(maxsize=16)
def _plan_positions(config: RunConfig, update: int) -> tuple[Positions, ...]:
    """`schedule.minibatch_plan` as `Positions`: each step's text is rendered once for every
    state (and ledger record) that shows it."""
    return tuple(map(Positions, schedule.minibatch_plan(config, update)))


def _forward_command(state: State, learner: LearnerState) -> RunForward:
    assert learner.observation is not None
    observation = learner.observation
    requests = schedule.minibatch_requests(state.config, observation.update)[observation.step]
    return RunForward(observation, learner.attempt, requests)


def _commit_command(update: int, learner: LearnerState) -> Commit:
    return Commit(update, learner.attempt, learner.step_digest)


def _batch_inputs(config: RunConfig, batch: BatchState, proximal_scores: Matrix | None,
                  reference_scores: Matrix | None) -> BatchInputs:
    """The objective inputs of each step of the batch's update: the batch's, gathered once in
    the order of the update's plan with the terms that do not depend on the current policy,
    then each step's rows of them (consecutive rows). Without proximal scores (the batch was
    not scored) each step takes its forward's (`_cotangent`)."""
    completions = completions_of(batch.slots)
    tokens = completions.tokens
    plan = schedule.minibatch_plan(config, batch.batch)
    order = schedule.minibatch_order(config, batch.batch)
    ends = list(itertools.accumulate(map(len, plan)))
    # Every log-prob matrix of the batch has the tokens' row lengths (checked): one mask.
    mask = None if tokens.uniform() else tokens.padded()[1]

    def in_plan_order(values: np.ndarray) -> np.ndarray:
        ordered = values.take(order, axis=0)
        ordered.flags.writeable = False
        return ordered

    def padded(matrix: Matrix) -> np.ndarray:
        return in_plan_order(matrix.padded_values(mask))

    behavior = padded(completions.behavior_logprobs)
    proximal = None if proximal_scores is None else padded(proximal_scores)
    reference = None if reference_scores is None else padded(reference_scores)
    sizes = [len(positions) for positions in plan]
    step_sizes = np.repeat(np.array(sizes, dtype=np.intp), sizes)
    if mask is None:
        lengths = tokens.lengths
        row_lengths: np.ndarray | int = lengths[0]  # every row's
        widths = [lengths[0]] * len(plan)
        step_tokens = step_sizes * lengths[0]
    else:
        mask = in_plan_order(mask)
        lengths = tuple(map(tokens.lengths.__getitem__, order.tolist()))  # in plan order
        row_lengths = np.array(lengths, dtype=np.intp)
        widths = [max(lengths[start:end]) for start, end in zip([0, *ends], ends)]
        step_tokens = np.repeat([sum(lengths[start:end]) for start, end in
                                 zip([0, *ends], ends)], sizes)
    advantages = group_advantages(completions.rewards, config.group_size,
                                  config.objective.normalize_advantages)
    inputs = objective_inputs(config.objective, in_plan_order(advantages), proximal, behavior,
                              reference, mask,
                              token_share(step_sizes, row_lengths, config.objective.aggregation,
                                          step_tokens),
                              mean_staleness=float(schedule.staleness(config, batch.batch)))
    steps = [slice(start, end) for start, end in zip([0, *ends], ends)]
    return BatchInputs(steps=tuple(map(inputs.rows, steps, widths)),
                       lengths=tuple(lengths[rows] for rows in steps))


def _cotangent(config: RunConfig, inputs: ObjectiveInputs,
               event: ForwardObserved) -> ApplyCotangent | str:
    """Objective terms and dL/d(current log-prob) of one minibatch (see objective.py), from
    log-probs checked as they came (`_matrix_problem`) and the step's inputs built when the
    batch was scored; or, when a term or the cotangent is not finite (the policy diverged:
    finite log-probs whose ratios overflow), what overflowed, where."""
    logprobs = event.current_logprobs
    current = logprobs.padded_values(inputs.mask)
    if inputs.proximal is None:  # one optimizer step: the proximal policy is the current one
        inputs = inputs.with_proximal(config.objective, current)
    with np.errstate(over="ignore", invalid="ignore"):  # overflows are looked for below
        terms, cotangent = checked_objective(config.objective, inputs, current)
    if not (np.isfinite(np.add.reduce(cotangent, axis=None))
            and all(map(math.isfinite, (terms.loss, terms.mean_ratio, terms.kl)))):
        return _divergence(config, inputs, current, terms, event.observation)
    return ApplyCotangent(event.observation, event.attempt, event.pre_step_digest,
                          matrix_digest(logprobs), logprobs.unpadded(cotangent, inputs.mask),
                          terms)


_LOG_FLOAT_MAX = math.log(np.finfo(FLOAT).max)
"""The largest log-ratio whose exp is a float64."""


def _divergence(config: RunConfig, inputs: ObjectiveInputs, current: np.ndarray,
                terms: ObjectiveTerms, observation: ObservationId) -> str:
    """What made a minibatch's objective non-finite: the first ratio whose exp overflows, with
    its request and token, else the terms themselves."""
    anchor, name = ((inputs.behavior, "behavior") if config.objective.loss != "decoupled_ppo"
                    else (inputs.proximal, "proximal"))
    assert anchor is not None  # `_cotangent` supplied the proximal log-probs
    ratios = [(f"exp(current - {name})", ("current", current), (name, anchor))]
    if inputs.reference is not None:
        ratios.append(("exp(reference - current) of the KL term",
                       ("reference", inputs.reference), ("current", current)))
    for quantity, (top, above), (bottom, below) in ratios:
        log_ratio = above - below
        over = np.argwhere(log_ratio > _LOG_FLOAT_MAX)
        if len(over):
            row, token = over[0].tolist()
            # The step's rows are its forward's, in the order of its RunForward's requests.
            request = schedule.minibatch_requests(config, observation.update)[
                observation.step][row]
            return (f"the ratio {quantity} overflows (log-ratio {log_ratio[row, token]:.1f}: "
                    f"{top} {above[row, token]:.1f}, {bottom} {below[row, token]:.1f}) at "
                    f"request {tuple(request)}, token {token}: the policy diverged")
    return (f"the objective is not finite (loss {terms.loss}, mean_ratio {terms.mean_ratio}, "
            f"kl {terms.kl}): the policy diverged")


def _observation_status(state: State, observation: ObservationId, attempt: int) -> str:
    """"pending", "late" (a forward the core asked for earlier) or "unrequested"."""
    learner = state.learner
    if attempt > learner.attempt or observation.serial >= learner.observations:
        return "unrequested"
    if observation == learner.observation:
        return "pending" if attempt == learner.attempt else "late"
    if attempt < learner.attempt:
        return "late"
    pending = learner.observation
    if pending is not None and observation.serial == pending.serial:
        return "unrequested"  # the serial of the pending forward, with another binding
    ahead = (observation.update, observation.step) > (state.committed, learner.step)
    return "unrequested" if ahead else "late"


def _apply_commit(state: State, digest: str) -> tuple[State, list[Command]]:
    """The commit point: update `committed` is consumed, version committed+1 exists."""
    config = state.config
    update = state.committed
    batch = state.batches[0]
    samples: tuple[Sample, ...] = batch.slots  # type: ignore[assignment]
    scores = state.learner.scores
    record = Consumption(
        update=update,
        requests=BatchRequests(batch.batch, config.prompts_per_batch, config.group_size),
        sample_versions=tuple(map(_VERSION, samples)),
        sample_digests=JoinedDigests.of(map(_DIGEST, samples)),
        scores_digest=scores.digest if scores is not None else "",
        steps=state.learner.applied,
        commit_digest=digest,
    )
    state = evolve(state, batches=state.batches[1:],
                    commit_digests=state.commit_digests + (digest,),
                    ledger=state.ledger + (record,),
                    ledger_digest=chain_ledger(state.ledger_digest, record))
    return state, _boundary_commands(state)


def _learner_command(state: State) -> Command | None:
    learner = state.learner
    if learner.phase is LearnerPhase.SCORING:
        return _score_command(state)
    if learner.phase is LearnerPhase.FORWARD:
        return _forward_command(state, learner)
    if learner.phase is LearnerPhase.APPLYING:
        return learner.cotangent
    if learner.phase is LearnerPhase.COMMITTING:
        return _commit_command(state.committed, learner)
    return None


def _score_command(state: State) -> ScoreProbabilities:
    update = state.committed
    return ScoreProbabilities(update, state.learner.attempt,
                              schedule.request_ids(state.config, update),
                              state.config.objective.needs_reference)


# ---------------------------------------------------------------------------------------------
# Reconciliation: the commands that follow from a state, whatever led to it.


def _reconcile(state: State, commands: list[Command]) -> tuple[State, tuple[Command, ...]]:
    """Every pass that follows from the state, in order; each appends what it decides.

    The passes over the rollout side (admission, loads, launches, publication, release) are
    skipped where `fast.rollout_settled` knows they decide nothing."""
    rollout = not fast.rollout_settled(state)
    before = state
    if rollout:
        state = _admit_batches(state)
        state = _schedule_loads(state, commands)
        state = _assign_pending(state, commands)
    state = _start_next_update(state, commands)  # changes only the learner, which they do not read
    if rollout:
        state = _publish_next_version(state, commands)
        state = _release_unneeded_versions(state, commands)
        fast.settle(before, state)
    state = _arm_timer(state, commands)
    return state, tuple(commands)


def _admit_batches(state: State) -> State:
    """Batches enter in order while the in-flight bound and their version allow."""
    config = state.config
    while (state.admitted < config.total_updates
           and state.admitted - state.committed < config.max_inflight_batches
           and _is_published(state, schedule.gen_version(config, state.admitted))):
        fresh = BatchState.admitted(state.admitted, config.samples_per_batch)
        state = evolve(state, admitted=state.admitted + 1, batches=state.batches + (fresh,))
    return state


def _start_next_update(state: State, commands: list[Command]) -> State:
    """The waiting learner starts the next update once its batch is complete and the
    boundaries before it are acknowledged."""
    learner = state.learner
    if learner.phase is LearnerPhase.WAITING and state.batches and state.batches[0].completed == \
            state.config.samples_per_batch and state.batches[0].batch == state.committed \
            and not _boundary_commands(state):
        if state.config.scores_batch:
            state = evolve(state, learner=evolve(learner, phase=LearnerPhase.SCORING))
            commands.append(_score_command(state))
        else:  # its inputs are built when the forward's log-probs come (`_on_forward_observed`)
            state, forward = _request_forward(state, 0)
            commands += forward
    return state


def _publish_next_version(state: State, commands: list[Command]) -> State:
    """One publication at a time, in version order, only of committed versions."""
    if state.publishing is None:
        last = state.published[-1] if state.published else -1
        # The next version of Pub, if committed (a scan of at most P versions, not of Pub).
        upcoming = next((v for v in range(last + 1, state.committed + 1)
                         if schedule.is_published(state.config, v)), None)
        if upcoming is not None and state.commit_digests:
            state = evolve(state, publishing=upcoming)
            commands.append(Publish(upcoming, state.commit_digests[upcoming]))
    return state


def _release_unneeded_versions(state: State, commands: list[Command]) -> State:
    """A version is dropped once every batch it generates is complete and a newer one is
    published."""
    for version in state.retained:
        if not _version_needed(state, version):
            state = evolve(state, retained=tuple(v for v in state.retained if v != version))
            commands.append(ReleaseVersion(version))
    return state


def _arm_timer(state: State, commands: list[Command]) -> State:
    """The retry timer runs while any command awaits its reply (armed once, not again)."""
    if not state.timer_armed and (outstanding_commands(state)):
        state = evolve(state, timer_armed=True)
        commands.append(SetTimer())
    return state


def _is_published(state: State, version: int) -> bool:
    return bool(state.published) and version <= state.published[-1]


def _version_needed(state: State, version: int) -> bool:
    if version == state.published[-1]:
        return True  # the store always holds the newest publication, until one replaces it
    for b in schedule.batches_of_version(state.config, version):
        if b >= state.admitted:
            return True
        held = state.batch(b)
        if held is not None and held.completed < len(held.slots):
            return True
    return any(w.phase is WorkerPhase.LOADING and w.version == version for w in state.workers)


def _assign_pending(state: State, commands: list[Command]) -> State:
    """Launch pending requests, a prompt group at a time, on the least-loaded live worker
    holding their version: one `LaunchRequests` per batch and worker."""
    config = state.config
    group_size = config.group_size
    for index, batch in enumerate(state.batches):
        if batch.pending == 0:
            continue
        version = schedule.gen_version(config, batch.batch)
        ready = [w for w in state.workers
                 if w.phase is WorkerPhase.READY and w.version == version]
        if not ready:
            continue
        loads = {w.name: w.assigned for w in ready}
        slots = batch.slots
        kinds = None if batch.pending == len(slots) else list(map(type, slots))  # None: all free
        runs = _group_runs(slots, kinds, group_size, loads)
        requests = schedule.request_ids(config, batch.batch)
        seeds = schedule.batch_seeds(config, batch.batch)
        prompts = schedule.batch_prompt_indices(config, batch.batch)
        positions: list[int] = []
        assignees: list[Slot] = []
        for name, bounds in runs.items():
            holder = next(w for w in ready if w.name == name)
            columns = _Launches(Assigned(name, holder.incarnation))
            for start, end in zip(bounds[::2], bounds[1::2]):
                columns.add_run(start, end, requests, seeds, prompts)
            commands.append(columns.command(version))
            positions += columns.positions
            assignees += [columns.slot] * len(columns.positions)
        assigned = fast.with_column(batch, positions, assignees)
        if assigned is None:
            assigned = batch.with_slots(dict(zip(positions, assignees)))
        state = evolve(state, batches=_set(state.batches, index, assigned))
        for w in ready:
            state = _put_worker(state, evolve(w, assigned=loads[w.name]))
    return state


def _group_runs(slots: tuple[Slot, ...], kinds: list[type] | None, group_size: int,
                loads: dict[str, int]) -> dict[str, list[int]]:
    """Each prompt group with free slots given to the least-loaded worker of `loads` (counted
    in): each worker's free positions as runs, bounds [start, end, start, end, ...] (a worker
    given consecutive groups gets one run: its columns are then slices of the batch's)."""
    whole = fast.whole_batch_run(kinds is None, len(slots), loads)
    if whole is not None:
        return whole
    runs: dict[str, list[int]] = {}
    # A prompt's group goes to one worker: its samples share the prompt's prefill, and the
    # worker computes them in one fixed-shape call (see runtime.worker on invariance).
    for start in range(0, len(slots), group_size):
        end = start + group_size
        free = group_size if kinds is None else kinds[start:end].count(NoneType)
        if not free:
            continue
        name = min(loads, key=lambda k: (loads[k], k))
        loads[name] += free
        bounds = runs.setdefault(name, [])
        if free == group_size:
            _extend_runs(bounds, start, end)
            continue
        for position in range(start, end):
            if slots[position] is None:
                _extend_runs(bounds, position, position + 1)
    return runs


def _extend_runs(bounds: list[int], start: int, end: int) -> None:
    """Positions [start, end) added to runs `bounds`: the last run grows if they follow it."""
    if bounds and bounds[-1] == start:
        bounds[-1] = end
    else:
        bounds += (start, end)


class _Launches:
    """The columns of one `LaunchRequests`, as `_assign_pending` and `outstanding_commands`
    fill them, and the batch positions of its requests."""

    def __init__(self, slot: Assigned) -> None:
        self.slot = slot
        self.positions: list[int] = []
        self.requests: list[RequestId] = []
        self.seeds: list[int] = []
        self.prompt_indices: list[int] = []

    def add(self, position: int, request: RequestId, seed: int, prompt_index: int) -> None:
        self.positions.append(position)
        self.requests.append(request)
        self.seeds.append(seed)
        self.prompt_indices.append(prompt_index)

    def add_run(self, start: int, end: int, requests: tuple[RequestId, ...],
                seeds: tuple[int, ...], prompt_indices: tuple[int, ...]) -> None:
        """Positions [start, end), from the batch's columns."""
        self.positions.extend(range(start, end))
        self.requests.extend(requests[start:end])
        self.seeds.extend(seeds[start:end])
        self.prompt_indices.extend(prompt_indices[start:end])

    def command(self, version: int) -> LaunchRequests:
        return LaunchRequests(self.slot.worker, self.slot.incarnation, version,
                              tuple(self.requests), tuple(self.seeds),
                              tuple(self.prompt_indices))


def _schedule_loads(state: State, commands: list[Command]) -> State:
    """Point free workers at the versions pending requests need and no worker holds."""
    needed: list[int] = []
    for batch in state.batches:
        if batch.pending:
            version = schedule.gen_version(state.config, batch.batch)
            if version not in needed:
                needed.append(version)
    if not needed:
        return state
    for w in state.workers:
        free = w.phase in (WorkerPhase.IDLE, WorkerPhase.READY) and w.assigned == 0
        if not free or (w.phase is WorkerPhase.READY and w.version in needed):
            continue
        holders = {v: sum(1 for o in state.workers if o.version == v
                          and o.phase in (WorkerPhase.READY, WorkerPhase.LOADING))
                   for v in needed}
        target = min(needed, key=lambda v: (holders[v], v))
        loading = evolve(w, phase=WorkerPhase.LOADING, version=target, load=w.load + 1)
        state = _put_worker(state, loading)
        commands.append(_load(state, loading))
    return state


def _load(state: State, worker: WorkerState) -> LoadWeights:
    assert worker.version is not None
    return LoadWeights(worker.name, worker.incarnation, worker.load, worker.version,
                       state.commit_digests[worker.version])


def _requeue(state: State, worker: WorkerState) -> State:
    """Requests of a retired incarnation go back to pending: same identity, version and seed."""
    if worker.assigned == 0:
        return state
    mine = Assigned(worker.name, worker.incarnation)
    return evolve(state, batches=tuple(
        batch.with_slots({p: None for p, slot in enumerate(batch.slots) if slot == mine})
        for batch in state.batches))


def _put_worker(state: State, worker: WorkerState) -> State:
    others = [w for w in state.workers if w.name != worker.name]
    return evolve(state, workers=tuple(sorted([*others, worker], key=lambda w: w.name)))


def _put_batch(state: State, batch: BatchState) -> State:
    return evolve(state, batches=_set(state.batches, batch.batch - state.committed, batch))


def _set(items: tuple[Any, ...], index: int, value: Any) -> tuple[Any, ...]:
    return items[:index] + (value,) + items[index + 1:]


# ---------------------------------------------------------------------------------------------
# Payload checks and digests.


def _sample_problem(tokens: tuple[int, ...], logprobs: tuple[float, ...], reward: float) -> str:
    if not tokens:
        return "tokens: empty response"
    if min(tokens) < 0:  # an int64 column holds nothing above 2**63 - 1
        return "tokens: every token must be an id in [0, 2**63)"
    if len(logprobs) != len(tokens):
        return f"behavior_logprobs: {len(logprobs)} values for {len(tokens)} tokens"
    if not all(-math.inf < value <= 0.0 for value in logprobs):  # False for a NaN
        return "behavior_logprobs: every value must be a finite log-probability (<= 0)"
    if not math.isfinite(reward):
        return "reward: must be finite"
    return ""


def _not_a_matrix(name: str, matrix: Ragged) -> str:
    """What is wrong with the values' type of a log-prob matrix field (empty: float64): checked
    before anything reads them, as decoding would (a hand-built event may hold rows of Python
    ints, which `Ragged.of` turns into an int64 matrix)."""
    if matrix.values.dtype != FLOAT:
        return f"{name}: expected float64 log-probs, got {matrix.values.dtype}"
    return ""


def _matrix_problem(name: str, matrix: Matrix | None, lengths: tuple[int, ...]) -> str:
    if matrix is None:
        return f"{name}: missing"
    if len(matrix) != len(lengths):
        return f"{name}: {len(matrix)} rows for {len(lengths)} samples"
    if fast.matrix_fine(matrix, lengths):
        return ""
    for i, length in enumerate(lengths):
        row = matrix.row(i).tolist()
        if len(row) != length:
            return f"{name}[{i}]: {len(row)} values for {length} tokens"
        if not all(-math.inf < value <= 0.0 for value in row):  # False for a NaN
            return f"{name}[{i}]: every value must be a finite log-probability (<= 0)"
    return ""


def sample_digests(frame: Completions) -> list[str]:
    """Each completion's digest, as a `Sample` holds it (hex): how a stored sample is checked
    against its content (a journal's snapshot)."""
    return list(map(bytes.hex, _sample_digests(frame)))


def _sample_digests(frame: Completions) -> list[bytes]:
    """Each completion's digest, as its 12 bytes (a sample's `digest` is their hex; the batch
    digest's terms are taken from the bytes): blake2b_96 over its tokens as little-endian
    int64, its log-probs as float64 and its reward as float64, hashed from the frame's columns
    where they lie (token and log-prob rows of one length: checked)."""
    digests = fast.sample_digests(frame)
    if digests is not None:
        return digests
    tokens, logprobs, rewards = frame.tokens, frame.behavior_logprobs, frame.rewards
    token_bytes = np.ascontiguousarray(tokens.values).data.cast("B")
    logprob_bytes = np.ascontiguousarray(logprobs.values).data.cast("B")
    reward_bytes = rewards.tobytes()
    digests, start = [], 0
    for i, length in enumerate(tokens.lengths):
        end = start + 8 * length
        h = _BLAKE2B_96.copy()  # cheaper than a constructor call with its keyword
        h.update(token_bytes[start:end])
        h.update(logprob_bytes[start:end])
        h.update(reward_bytes[8 * i:8 * i + 8])
        digests.append(h.digest())
        start = end
    return digests


_BLAKE2B_96 = hashlib.blake2b(digest_size=12)
