"""`LearnerExecutor` on the torch backend (a tiny model): the learner's rules, kept for real.

Regression tests of what the rules prevent: an older forward re-sent after a newer one
replacing the pending binding; a cotangent computed from other log-probs than the pending
forward returned being applied; a checkpoint as a plain copy that a crash could leave
truncated, which evaluated or copied whatever weights were in memory.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from invar.model.messages import (
    ApplyCotangent,
    Checkpoint,
    CheckpointWritten,
    Commit,
    Evaluate,
    ForwardObserved,
    LearnerStarted,
    ObservationId,
    RunForward,
    ScoreProbabilities,
    StepFinished,
    UpdateCommitted,
    VersionEvaluated,
    matrix_digest,
)
from invar.model.objective import ObjectiveTerms
from invar.model.ragged import Ragged
from invar.model.schedule import RequestId
from invar.model.world import Decision, LearnerRules
from invar.runtime.commits import read_commit
from invar.runtime.learner_executor import LearnerExecutor, checkpoint_path
from invar.runtime.metrics import MetricsLog
from invar.runtime.policy import PolicyConfig
from invar.runtime.task import DigitReversal
from invar.runtime.torch_learner import OptimConfig, TorchLearner
from invar.testing.runtime import Counted

TASK = DigitReversal(4)
REQUESTS = tuple(RequestId(0, p, 0) for p in range(4))
TERMS = ObjectiveTerms(0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 16)


@pytest.fixture(autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def make_executor(run_dir, attempt=0):
    learner = Counted(TorchLearner(PolicyConfig(max_len=TASK.sequence_length), OptimConfig(), 0,
                                   run_dir / "commits"))
    metrics = MetricsLog(run_dir, None, tensorboard=False)
    executor = LearnerExecutor(learner, TASK, TASK.prompts("heldout", range(4)), run_dir, metrics)
    executor.start(attempt)
    return executor


def rows(seed=0):
    prompts = TASK.prompts("train", range(seed * 10, seed * 10 + len(REQUESTS)))
    responses = np.random.default_rng(seed).integers(0, 10, (len(REQUESTS), TASK.response_length))
    return np.concatenate([prompts, responses], axis=1)


def forward(serial, update=0, step=0, attempt=0):
    return RunForward(ObservationId(update, step, serial), attempt, REQUESTS)


def cotangent(reply: ForwardObserved, current=None, pre=None, width=None):
    """The core's cotangent for `reply`, computed from `current` log-probs (default: the
    reply's own)."""
    current = reply.current_logprobs if current is None else current
    width = width or len(current[0])
    values = Ragged.of([[0.05 * (i + 1)] * width for i in range(len(current))])
    return ApplyCotangent(reply.observation, reply.attempt, pre or reply.pre_step_digest,
                          matrix_digest(current), values, TERMS)


def test_an_older_forward_resent_after_a_newer_one_does_not_replace_the_binding(tmp_path):
    executor = make_executor(tmp_path)
    executor.execute(forward(1), rows(1))
    newer = executor.execute(forward(2), rows(2))
    assert executor.execute(forward(1), rows(1)) is None  # a duplicate of the older one
    assert executor.last_decision == Decision.IGNORE
    assert executor.learner.calls["forward"] == 2
    step = executor.execute(cotangent(newer), None)
    assert isinstance(step, StepFinished) and step.post_step_digest != newer.pre_step_digest


def test_a_cotangent_from_other_logprobs_than_the_pending_forward_is_refused(tmp_path):
    executor = make_executor(tmp_path)
    reply = executor.execute(forward(1), rows(1))
    other = Ragged(reply.current_logprobs.values - 0.5, reply.current_logprobs.lengths)
    digest = executor.learner.state_digest()
    assert executor.execute(cotangent(reply, current=other), None) is None
    assert executor.last_decision == Decision.REFUSE
    assert executor.learner.calls["apply_cotangent"] == 0  # refused by the rules, untouched
    assert executor.learner.state_digest() == digest
    assert executor.metrics.counters["learner_refused"] == 1
    assert isinstance(executor.execute(cotangent(reply), None), StepFinished)  # still pending


def test_log_probs_travel_as_matrices_and_the_cotangent_as_the_backends_own_array(tmp_path):
    """The backend's arrays become float64 matrices with no Python float per value (what
    the core checks, digests and pads), and a cotangent reaches the backend as a writable
    (n, T) float64 array equal to the command's."""
    executor = make_executor(tmp_path)
    scores = executor.execute(ScoreProbabilities(0, 0, REQUESTS, True), rows(1))
    reply = executor.execute(forward(1), rows(1))
    backend = executor.learner.learner
    proximal, reference = backend.score(rows(1), TASK.prompt_length, True)
    for matrix, array in ((scores.proximal, proximal), (scores.reference, reference),
                          (reply.current_logprobs, None)):
        assert type(matrix) is Ragged and matrix.values.dtype == np.float64
        assert matrix.lengths == (TASK.response_length,) * len(REQUESTS)
        if array is not None:
            assert np.array_equal(matrix.padded()[0], np.asarray(array, dtype=np.float64))
    received = []

    def recording(*args):
        received.append(args[-1])
        return backend.apply_cotangent(*args)

    executor.learner.apply_cotangent = recording
    command = cotangent(reply)
    assert isinstance(executor.execute(command, None), StepFinished)
    (array,) = received
    assert array.flags.writeable and array.dtype == np.float64
    assert np.array_equal(array, command.cotangent.padded()[0])


def test_a_resent_pending_forward_is_answered_from_memory(tmp_path):
    executor = make_executor(tmp_path)
    reply = executor.execute(forward(1), rows(1))
    assert executor.execute(forward(1), rows(1)) is reply
    assert executor.last_decision == Decision.REPEAT
    assert executor.learner.calls["forward"] == 1


def test_an_applied_step_and_a_commit_resent_are_answered_from_memory(tmp_path):
    executor = make_executor(tmp_path)
    reply = executor.execute(forward(1), rows(1))
    step = executor.execute(cotangent(reply), None)
    assert executor.execute(cotangent(reply), None) == step
    assert executor.execute(forward(1), rows(1)) is None  # the applied forward: superseded
    commit = Commit(0, 0, step.post_step_digest)
    committed = executor.execute(commit, None)
    assert committed == UpdateCommitted(0, step.post_step_digest)
    assert executor.execute(commit, None) == committed
    assert executor.last_decision == Decision.REPEAT
    assert executor.learner.calls["apply_cotangent"] == executor.learner.calls["commit"] == 1


def test_a_cotangent_the_backend_refuses_changes_nothing(tmp_path):
    executor = make_executor(tmp_path)
    reply = executor.execute(forward(1), rows(1))
    assert executor.execute(cotangent(reply, width=TASK.response_length - 1), None) is None
    assert executor.last_decision == Decision.REFUSE
    assert executor.rules.pending is not None and executor.rules.applied is None
    assert isinstance(executor.execute(cotangent(reply), None), StepFinished)


def test_evaluate_and_checkpoint_only_the_exact_commit(tmp_path):
    executor = make_executor(tmp_path)
    assert executor.execute(Evaluate(0), None) == VersionEvaluated(
        0, executor.learner.evaluate_greedy(TASK, executor.heldout))
    reply = executor.execute(forward(1), rows(1))
    step = executor.execute(cotangent(reply), None)
    # The weights moved on: neither version 0 nor (not yet committed) version 1.
    for command in (Evaluate(0), Checkpoint(0), Evaluate(1), Checkpoint(1)):
        assert executor.execute(command, None) is None, command
        assert executor.last_decision == Decision.IGNORE
    assert not (tmp_path / "checkpoints").exists()
    executor.execute(Commit(0, 0, step.post_step_digest), None)
    assert isinstance(executor.execute(Evaluate(1), None), VersionEvaluated)
    assert executor.execute(Checkpoint(1), None) == CheckpointWritten(1, step.post_step_digest)


def test_a_checkpoint_is_the_commit_and_is_answered_again_once_kept(tmp_path):
    executor = make_executor(tmp_path)
    reply = executor.execute(forward(1), rows(1))
    step = executor.execute(cotangent(reply), None)
    executor.execute(Commit(0, 0, step.post_step_digest), None)
    written = executor.execute(Checkpoint(1), None)
    path = checkpoint_path(tmp_path, 1)
    assert read_commit(path)["state_digest"] == written.weights_digest == step.post_step_digest
    assert path.read_bytes() == executor.learner.commit_file(1).read_bytes()
    # Kept: answered again even once the weights moved on, without writing it again.
    executor.execute(forward(2, update=1), rows(2))
    stamp = path.stat().st_mtime_ns
    assert executor.execute(Checkpoint(1), None) == written
    assert path.stat().st_mtime_ns == stamp


def test_a_crash_while_writing_a_checkpoint_leaves_no_truncated_file(tmp_path, monkeypatch):
    executor = make_executor(tmp_path)
    target = checkpoint_path(tmp_path, 0)
    real_fsync = os.fsync

    def power_loss(descriptor):
        # What reached the disk when the power went: half the bytes written so far.
        os.ftruncate(descriptor, os.fstat(descriptor).st_size // 2)
        raise OSError("power lost while writing")

    monkeypatch.setattr(os, "fsync", power_loss)
    with pytest.raises(OSError, match="power lost"):
        executor.execute(Checkpoint(0), None)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert not target.exists()
    assert [p.name for p in target.parent.iterdir()] == []  # no leftover either
    assert executor.execute(Checkpoint(0), None) == CheckpointWritten(
        0, read_commit(target)["state_digest"])


def test_a_restart_starts_the_rules_afresh(tmp_path):
    executor = make_executor(tmp_path)
    reply = executor.execute(forward(1), rows(1))
    step = executor.execute(cotangent(reply), None)
    executor.execute(Commit(0, 0, step.post_step_digest), None)
    executor.execute(forward(2, update=1), rows(2))  # pending when the learner dies
    assert executor.start(1) == LearnerStarted(1, 1, step.post_step_digest)
    assert executor.rules == LearnerRules(attempt=1, weights=step.post_step_digest, version=1)
    assert executor.execute(forward(3, update=1), rows(2)) is None  # the old attempt's
    assert executor.last_decision == Decision.IGNORE
    redone = executor.execute(forward(3, update=1, attempt=1), rows(2))
    assert isinstance(redone, ForwardObserved) and redone.attempt == 1


def test_learner_inputs_from_the_batch_table_equal_the_rows_built_one_by_one():
    """The numpy fast path (a batch's token table, rows gathered by position) gives exactly
    the rows `_request_rows` builds request by request, for the scoring and every forward."""
    from invar.model import RunConfig, initial_state, step
    from invar.model.messages import RunForward, ScoreProbabilities
    from invar.runtime.learner_executor import _request_rows, learner_inputs
    from invar.testing import canonical_run

    config = RunConfig(prompts_per_batch=3, group_size=2, max_staleness=1, sync_period=1,
                       optimizer_steps=3, total_updates=3)
    task = DigitReversal(4)
    state, compared = initial_state(config), 0
    for event in canonical_run(config).events:
        state, commands = step(state, event)
        for command in commands:
            if isinstance(command, (ScoreProbabilities, RunForward)):
                fast = learner_inputs(state, task, command)
                assert fast is not None
                assert fast == _request_rows(state, task, command.requests)
                compared += 1
    assert compared == 3 * (1 + 3)  # per update: the scoring and K forwards


def test_training_seconds_count_scoring_forwards_and_steps_only(tmp_path, monkeypatch):
    """`training_seconds` (what TRL's learner time covers) against `busy_seconds` (all)."""
    clock = iter(float(t) for t in range(100))
    monkeypatch.setattr("invar.runtime.learner_executor.time.perf_counter", lambda: next(clock))
    executor = make_executor(tmp_path)
    executor.execute(ScoreProbabilities(0, 0, REQUESTS, False), rows(1))  # 1 s
    reply = executor.execute(forward(1), rows(1))  # 1 s
    step = executor.execute(cotangent(reply), None)  # 1 s
    executor.execute(Commit(0, 0, step.post_step_digest), None)  # 1 s, not training
    executor.execute(Evaluate(1), None)  # 1 s, not training
    assert (executor.training_seconds, executor.busy_seconds) == (3.0, 5.0)
