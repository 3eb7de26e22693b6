"""Executing learner commands against a backend, keeping the learner's rules: shared by the
asynchronous driver (`invar.runtime.driver`) and the serial execution (`invar.runtime.serial`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from invar.model import schedule
from invar.model.config import RunConfig
from invar.model.messages import (
    ApplyCotangent,
    Checkpoint,
    CheckpointWritten,
    Command,
    Commit,
    Evaluate,
    Event,
    ForwardObserved,
    LearnerStarted,
    Matrix,
    ProbabilitiesReported,
    RunForward,
    ScoreProbabilities,
    StepFinished,
    UpdateCommitted,
    VersionEvaluated,
    logprob_matrix,
)
from invar.model.ragged import INT, Ragged
from invar.model.schedule import RequestId
from invar.model.state import Sample, State, completions_of
from invar.model.world import Decision, LearnerRules
from invar.runtime.backend import LearnerBackend
from invar.runtime.commits import commit_path
from invar.runtime.metrics import MetricsLog
from invar.runtime.padding import Prompts, Sequences, response_lengths
from invar.runtime.responses import heldout_rows
from invar.runtime.store import read_digest, write_with_digest
from invar.runtime.tasks import Task, end_token
from invar.runtime.verifier import FAILED, TIMEOUT, InlineVerifier, Job

# The driver's log: a learner command ignored or refused is the driver's news, whichever
# execution runs it.
log = logging.getLogger("invar.driver")

LearnerInputs = Callable[[State, Task, Command], "Sequences | None"]
"""What the learner backend gets beside a command: `learner_inputs` (token rows) for the real
backends; a fake backend may take something else (its numerics need no tokens)."""


def checkpoint_path(run_dir: Path, version: int) -> Path:
    """Where the checkpoint of `version` is kept: a copy of its commit file (same format)."""
    return commit_path(Path(run_dir) / "checkpoints", version)


class LearnerExecutor:
    """Carries out learner commands against a backend, keeping the learner's rules.

    Every command goes through `LearnerRules.decide` (`invar.model.world`), the rules the
    model checker's learner keeps, and the executor does exactly what the decision says:

    * RUN: the backend carries it out and the rules record it (the pending forward with the
      `matrix_digest` of the log-probs returned, the step applied, the commit written);
    * REPEAT: the reply already given is given again, nothing is done twice (a re-sent
      pending forward, an applied cotangent, a repeated commit);
    * IGNORE: another attempt's command, an older forward re-sent after a newer one (running
      it would replace the binding the core's cotangent is for), or an evaluation or
      checkpoint of weights other than exactly that commit's: no reply;
    * REFUSE: a cotangent whose observation, pre-step digest or forward digest is not the
      pending forward's (or that the backend refuses), a commit of another state: no reply,
      nothing changes, logged and counted.

    A checkpoint already on disk is answered again whatever the rules say (it is kept
    whole: written atomically, its digest beside it last). `last_decision` tells which of the
    four the last command got.
    """

    def __init__(self, learner: LearnerBackend, task: Task, heldout: Prompts | np.ndarray,
                 run_dir: Path, metrics: MetricsLog, verifier: Any = None) -> None:
        self.learner = learner
        self.task = task
        self.heldout = heldout
        self.scoring = HeldoutScoring(task, verifier or InlineVerifier(task, 0.0), metrics)
        self.run_dir = Path(run_dir)
        self.metrics = metrics
        self.rules: LearnerRules | None = None
        self.last_decision = ""
        self._forward: ForwardObserved | None = None
        """The reply to the pending forward (answered again on a re-send)."""
        self.busy_seconds = 0.0
        self.training_seconds = 0.0
        """Of `busy_seconds`, those scoring, forwarding and stepping: what a trainer without
        commits or evaluations (TRL's) counts as its learner's time."""

    def start(self, attempt: int) -> LearnerStarted:
        """(Re)start the backend from its newest commit as `attempt`: the rules start afresh,
        with the restored weights and nothing pending."""
        version, digest = self.learner.start()
        self.rules = LearnerRules(attempt=attempt, weights=digest, version=version)
        self._forward = None
        return LearnerStarted(attempt, version, digest)

    def execute(self, command: Command, inputs: Sequences | np.ndarray | None) -> Event | None:
        """The reply to `command` (None: no reply), per the rules."""
        began = time.perf_counter()
        try:
            return self._execute(command, inputs)
        finally:
            seconds = time.perf_counter() - began
            self.busy_seconds += seconds
            if isinstance(command, (ScoreProbabilities, RunForward, ApplyCotangent)):
                self.training_seconds += seconds

    def _execute(self, command: Command, inputs: Sequences | np.ndarray | None) -> Event | None:
        if self.rules is None:
            raise RuntimeError("the learner executor has not started: call start() first")
        if isinstance(command, Checkpoint):
            kept = self._kept_checkpoint(command.version)
            if kept is not None:
                self.last_decision = Decision.REPEAT
                return CheckpointWritten(command.version, kept)
        decision = self.rules.decide(command)
        self.last_decision = decision
        if decision == Decision.RUN:
            return self._run(command, inputs)
        if decision == Decision.REPEAT:
            self.metrics.count("learner_repeated")
            return self._repeat(command)
        if decision == Decision.REFUSE:
            self._refused(command, "not bound to the learner's pending forward or state")
        else:
            self.metrics.count("learner_ignored")
            log.info("ignored %s %s (learner attempt %d, version %d)", type(command).__name__,
                     _identity(command), self.rules.attempt, self.rules.version)
        return None

    def _refused(self, command: Command, why: str) -> None:
        self.last_decision = Decision.REFUSE
        self.metrics.count("learner_refused")
        log.warning("refused %s %s: %s", type(command).__name__, _identity(command), why)

    def _repeat(self, command: Command) -> Event:
        rules = self.rules
        assert rules is not None
        if isinstance(command, RunForward):
            assert self._forward is not None
            return self._forward
        if isinstance(command, ApplyCotangent):
            assert rules.applied is not None
            return StepFinished(command.observation, command.attempt, rules.applied[1])
        assert isinstance(command, Commit)
        return UpdateCommitted(command.update, rules.weights)

    def _run(self, command: Command, inputs: Sequences | np.ndarray | None) -> Event | None:
        rules = self.rules
        assert rules is not None
        start = self.task.prompt_length
        if isinstance(command, ScoreProbabilities):
            assert inputs is not None, command  # `learner_inputs` builds them for this kind
            proximal, reference = self.learner.score(inputs, start, command.reference)
            return ProbabilitiesReported(
                command.update, command.attempt, response_matrix(inputs, proximal),
                None if reference is None else response_matrix(inputs, reference))
        if isinstance(command, RunForward):
            assert inputs is not None, command  # as for scoring
            obs = command.observation
            digest, current = self.learner.forward(obs.update, obs.step, obs.serial, inputs, start)
            reply = ForwardObserved(obs, command.attempt, digest,
                                    response_matrix(inputs, current))
            self.rules = rules.forwarded(command, reply)
            self._forward = reply
            return reply
        if isinstance(command, ApplyCotangent):
            obs = command.observation
            # The backend's own (writable) copy: the command's values are read-only.
            cotangent = np.array(command.cotangent.padded()[0])
            try:
                digest = self.learner.apply_cotangent(obs.update, obs.step, obs.serial,
                                                      command.pre_step_digest, cotangent)
            except ValueError as error:  # BindingError is a ValueError; the forward stays
                self._refused(command, str(error))
                return None
            self.rules = rules.stepped_to(command, digest)
            self._forward = None
            return StepFinished(obs, command.attempt, digest)
        if isinstance(command, Commit):
            version = command.update + 1
            digest = self.learner.commit(version)
            self.rules = rules.committed(version, digest)
            return UpdateCommitted(command.update, digest)
        if isinstance(command, Evaluate):
            reward = self.learner.evaluate_greedy(self.scoring, self.heldout)
            if self.scoring.last is not None:
                self.metrics.responses("heldout", command.version,
                                       heldout_rows(self.task, *self.scoring.last))
            return VersionEvaluated(command.version, reward)
        if isinstance(command, Checkpoint):
            return self._write_checkpoint(command.version, rules.weights)
        raise TypeError(f"not a learner command: {command!r}")  # pragma: no cover

    def _kept_checkpoint(self, version: int) -> str | None:
        """The digest of the checkpoint of `version` if it is on disk, whole."""
        return read_digest(checkpoint_path(self.run_dir, version))

    def _write_checkpoint(self, version: int, digest: str) -> CheckpointWritten | None:
        """Copy commit `version` (the weights in memory, exactly) to the checkpoints, each
        file atomically: a crash leaves the old state or the new, never a truncated file. The
        digest is written last: a checkpoint counts as kept once its digest is there."""
        source = self.learner.commit_file(version)
        if source is None:
            log.error("checkpoint of version %d: its commit file is gone", version)
            return None
        target = checkpoint_path(self.run_dir, version)
        target.parent.mkdir(exist_ok=True)
        write_with_digest(target, source.read_bytes(), digest)
        return CheckpointWritten(version, digest)


class HeldoutScoring:
    """What a learner's `evaluate_greedy(task, prompts)` asks of the task, for the held-out
    prompts (row i is held-out prompt i): the response length, the end token, and the rewards
    of the greedy answers, given by the task's verifier with its time limit. A failed or
    timed-out call is counted (`heldout_verifier_failed`, `heldout_verifier_timeout`)."""

    def __init__(self, task: Task, verifier: Any, metrics: MetricsLog) -> None:
        self.response_length = task.response_length
        self.eos_token = end_token(task)
        self.verifier = verifier
        self.metrics = metrics
        self.last: tuple[list[tuple[int, ...]], list[float]] | None = None
        """The last call's responses (each cut at its end) and rewards."""

    def rewards(self, prompts: Any, responses: np.ndarray) -> np.ndarray:
        """The rewards of `responses` (n, T), each read up to its first end token."""
        responses = np.asarray(responses)
        lengths = response_lengths(responses, self.eos_token).tolist()
        jobs = [Job("heldout", index, tuple(response[:length]))
                for index, (response, length) in enumerate(zip(responses.tolist(), lengths))]
        outcomes = self.verifier.submit(jobs).outcomes()
        for outcome in outcomes:
            if outcome.status in (FAILED, TIMEOUT):
                self.metrics.count(f"heldout_verifier_{outcome.status}")
        rewards = [outcome.reward for outcome in outcomes]
        self.last = ([job.response for job in jobs], rewards)
        return np.array(rewards, dtype=np.float64)


def response_matrix(inputs: Sequences | np.ndarray, values: np.ndarray | Matrix) -> Matrix:
    """A backend's log-probs of `inputs`' responses, (n, R), as a `Matrix` of each
    response's own length (what is computed past a response's end is dropped; rows given as
    a plain array are whole). A backend that answers with a `Matrix` has cut them itself."""
    if isinstance(values, Ragged):
        return values
    if not isinstance(inputs, Sequences) or inputs.response_lengths is None:
        return logprob_matrix(values)
    return Ragged.from_padded(np.asarray(values, dtype=np.float64),
                              np.arange(values.shape[1]) < inputs.response_lengths[:, None])


def _identity(command: Command) -> str:
    """What names a learner command in a log line (not its payload)."""
    for name in ("observation", "update", "version"):
        value = getattr(command, name, None)
        if value is not None:
            return f"{name}={value}"
    return ""


def learner_inputs(state: State, task: Task, command: Command) -> Sequences | None:
    """The token sequences (prompt + response) a learner command works on, from the state:
    prompts left-padded to `prompt_length`, responses right-padded to the longest of them.

    A command's requests share a batch: its rows are gathered with numpy from the batch's
    table (`_batch_table`, built once per batch), not row by row in Python."""
    if isinstance(command, (ScoreProbabilities, RunForward)):
        requests = command.requests
    else:
        return None
    config = state.config
    if requests:
        first = requests[0].batch
        batch = state.batch(first)
        if batch is None:
            return None
        table = _batch_table(_ByIdentity(task), _ByIdentity(batch.slots), batch.batch, config)
        if table is not None:
            if requests is schedule.request_ids(config, first):  # all, in slot order
                return dataclasses.replace(table, tokens=table.tokens.copy())
            group = config.group_size
            positions = [p * group + g for b, p, g in requests if b == first]
            if len(positions) == len(requests):
                return table.take(np.array(positions, dtype=np.intp))
    return _request_rows(state, task, requests)


def _request_rows(state: State, task: Task, requests: tuple[RequestId, ...]
                  ) -> Sequences | None:
    """`learner_inputs` row by row: requests of several batches, or a batch with samples
    missing (the fast path's fallback, with the same result)."""
    config = state.config
    group = config.group_size
    key = _ByIdentity(task)
    prompts, responses = [], []
    batch = None
    for request in requests:
        if batch is None or batch.batch != request.batch:
            batch = state.batch(request.batch)
            if batch is None:
                return None
        sample = batch.slots[request.prompt * group + request.sample]
        assert isinstance(sample, Sample)
        prompts.append(_prompt(key, schedule.prompt_index(config, request.batch, request.prompt)))
        responses.append(sample.tokens)
    return Sequences.of(Prompts.of(prompts, task.prompt_length), Ragged.of(responses, INT))


@functools.lru_cache(maxsize=4)
def _batch_table(key: _ByIdentity, slots: _ByIdentity, batch: int,
                 config: RunConfig) -> Sequences | None:
    """Every slot's row (prompt + response) of a complete batch, in slot order; None when a
    slot is not yet a sample. Remembered by the identity of the (immutable) slots: a batch's
    commands all read the same table."""
    samples = slots.value
    if not all(isinstance(s, Sample) for s in samples):
        return None
    group = config.group_size
    prompts = [_prompt(key, schedule.prompt_index(config, batch, p))
               for p in range(len(samples) // group) for _ in range(group)]
    return Sequences.of(Prompts.of(prompts, key.value.prompt_length),
                        completions_of(samples).tokens)


class _ByIdentity:
    """A cache key by identity (a task, a batch's slots): a plug-in task need not be hashable
    (an `eq` dataclass is not), slots are costly to hash, and the key keeps its value alive,
    so its id is not reused while cached."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ByIdentity) and other.value is self.value


@functools.lru_cache(maxsize=8192)
def _prompt(key: _ByIdentity, index: int) -> tuple[int, ...]:
    """A prompt's tokens: each is read by the scoring and by every forward of its update."""
    return tuple(key.value.prompt(index))
