"""The learner backend conformance suite: what every `LearnerBackend` must do (trio style).

Each check takes a backend adapter, an empty directory and a pytest `MonkeyPatch`, and
reaches the learner only through the interface the driver uses (start, score, forward,
apply_cotangent, commit, published_weights, ...), plus the adapter: it builds a learner,
snapshots its state as numpy, captures the gradient the cotangent route hands to the
optimizer, and differentiates a loss written natively in the framework. Last, the driver's
`LearnerExecutor` on the backend must make the decisions of `LearnerRules`, the learner rules
of the model. `TorchAdapter` and `MLXAdapter` are the adapters of the two backends Invar has;
a new backend writes one and runs every check against it:

    @pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
    def test_my_backend_conforms(check, tmp_path, monkeypatch):
        check(MyAdapter(), tmp_path, monkeypatch)

(tests/runtime/test_backend_conformance.py does this for torch and MLX). The checks need
torch (the reference numerics and the commit format) and pytest.
"""

from __future__ import annotations

import copy
import functools
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from invar.model.messages import (
    ApplyCotangent,
    Checkpoint,
    Commit,
    Evaluate,
    ObservationId,
    RunForward,
    ScoreProbabilities,
    matrix_digest,
)
from invar.model.objective import ObjectiveConfig, ObjectiveTerms, objective
from invar.model.ragged import Ragged
from invar.model.schedule import RequestId
from invar.model.world import Decision, LearnerRules
from invar.runtime.backend import BindingError
from invar.runtime.commits import (
    CommitError,
    commit_path,
    encode_commit,
    list_commits,
    read_commit,
)
from invar.runtime.config import OptimConfig
from invar.runtime.policy import Policy, PolicyConfig
from invar.runtime.task import DigitReversal
from invar.runtime.torch_learner import load_weights_bytes
from invar.runtime.weights import weights_digest
from invar.testing.runtime import Counted

TASK = DigitReversal(4)
CONFIG = PolicyConfig(max_len=TASK.sequence_length)
START = TASK.prompt_length  # where responses begin in a sequence


# -- adapters: one per framework -----------------------------------------------------------------


def decoupled_ppo_loss(ops, current, proximal, behavior, advantages, config):
    """The core's decoupled-PPO loss (every token valid), written with framework ops `ops`:
    the expression whose gradient the core's hand-written cotangent claims to be. Only
    `current` carries a gradient; the other inputs are numpy arrays."""
    ratio = ops.exp(current - ops.constant(proximal))
    # The behaviour weight depends on p and b only: a constant.
    weight = np.exp(np.minimum(proximal - behavior, np.log(config.behavior_weight_cap)))
    low, high = 1.0 - config.clip_low, 1.0 + config.clip_high
    a = advantages[:, None]
    token_loss = ops.constant(weight) * ops.maximum(-ops.constant(a) * ratio,
                                                    -ops.constant(a) * ops.clip(ratio, low, high))
    return ops.sum(token_loss) / current.shape[0] / current.shape[1]


class TorchAdapter:
    name = "torch"

    def make(self, commit_dir, seed=0, keep_commits=3, **optim):
        from invar.runtime.torch_learner import TorchLearner
        return TorchLearner(CONFIG, OptimConfig(**optim), seed, commit_dir,
                            keep_commits=keep_commits)

    def snapshot(self, learner):
        out = {f"model/{n}": t.detach().numpy().copy()
               for n, t in learner.model.state_dict().items()}
        optimizer = learner.optimizer.state_dict()
        for index, state in optimizer["state"].items():
            for key, value in state.items():
                out[f"optimizer/{index}/{key}"] = torch.as_tensor(value).numpy().copy()
        out["optimizer/groups"] = np.array(repr(optimizer["param_groups"]))
        return out

    def capture_gradients(self, learner, monkeypatch):
        captured = {}

        def capture():
            captured.update({n: p.grad.numpy().copy()
                             for n, p in learner.model.named_parameters()})

        monkeypatch.setattr(learner.optimizer, "step", capture)
        return captured

    def native_gradients(self, learner, sequences, proximal, behavior, advantages, config):
        from invar.runtime.torch_learner import response_logprobs

        class Ops:
            exp, maximum, sum = torch.exp, torch.maximum, torch.sum
            clip = staticmethod(torch.clamp)
            constant = staticmethod(torch.as_tensor)

        twin = copy.deepcopy(learner.model)
        current = response_logprobs(twin, torch.as_tensor(sequences), START)
        loss = decoupled_ppo_loss(Ops, current, proximal, behavior, advantages, config)
        loss.backward()
        return loss.item(), {n: p.grad.numpy() for n, p in twin.named_parameters()}

    def weights_state_dict(self, learner):
        return learner.model.state_dict()


class MLXAdapter:
    name = "mlx"

    def make(self, commit_dir, seed=0, keep_commits=3, **optim):
        from invar.runtime.mlx_learner import MLXLearner
        return MLXLearner(CONFIG, OptimConfig(**optim), seed, commit_dir,
                          keep_commits=keep_commits)

    def snapshot(self, learner):
        from invar.runtime.mlx_learner import _to_numpy
        out = {f"model/{n}": a for n, a in learner.model.numpy_parameters().items()}
        out.update({f"optimizer/{n}": a for n, a in _to_numpy(learner.optimizer.state).items()})
        return out

    def capture_gradients(self, learner, monkeypatch):
        from mlx.utils import tree_flatten
        captured = {}

        def capture(gradients):
            captured.update({n: np.array(g) for n, g in tree_flatten(gradients)})

        monkeypatch.setattr(learner, "_apply_gradients", capture)
        return captured

    def native_gradients(self, learner, sequences, proximal, behavior, advantages, config):
        import mlx.core as mx
        import mlx.nn as nn
        from mlx.utils import tree_flatten

        from invar.runtime.mlx_learner import response_logprobs
        from invar.runtime.mlx_policy import MLXPolicy

        class Ops:
            exp, maximum, sum, clip = mx.exp, mx.maximum, mx.sum, mx.clip

            @staticmethod
            def constant(value):
                return mx.array(np.asarray(value), dtype=mx.float64)

        twin = MLXPolicy(CONFIG)
        twin.update(learner.model.parameters())
        tokens = mx.array(sequences.astype(np.int32))

        def loss_of_twin():
            current = response_logprobs(twin, tokens, START)
            with mx.stream(mx.cpu):  # float64 lives on the CPU stream
                return decoupled_ppo_loss(Ops, current, proximal, behavior, advantages,
                                          config)

        loss, gradients = nn.value_and_grad(twin, loss_of_twin)()
        return loss.item(), {n: np.array(g) for n, g in tree_flatten(gradients)}

    def weights_state_dict(self, learner):
        return learner.torch_state_dict()


def batch(rows, seed):
    """Sequences [rows, L]: train prompts with fixed pseudo-random digit responses."""
    prompts = TASK.prompts("train", range(seed * 100, seed * 100 + rows))
    responses = np.random.default_rng(seed).integers(0, 10, size=(rows, TASK.response_length))
    return np.concatenate([prompts, responses], axis=1)


def take_steps(learner, count, first_update=0):
    """`count` bound forward/cotangent round trips with a fixed synthetic cotangent."""
    digests = []
    for update in range(first_update, first_update + count):
        digest, logprobs = learner.forward(update, 0, update, batch(6, update), START)
        cotangent = np.linspace(-1, 1, logprobs.size).reshape(logprobs.shape)
        digests.append(learner.apply_cotangent(update, 0, update, digest, cotangent))
    return digests


def assert_same_snapshot(left, right):
    assert left.keys() == right.keys()
    for name in left:
        assert left[name].dtype == right[name].dtype, name
        assert np.array_equal(left[name], right[name]), name


# -- lifecycle ---------------------------------------------------------------------------------


def start_writes_commit_zero_and_nothing_runs_before(backend, directory, monkeypatch):
    learner = backend.make(directory)
    with pytest.raises(RuntimeError, match="start"):
        learner.score(batch(2, 0), START, need_reference=False)
    version, digest = learner.start()
    assert (version, digest) == (0, learner.state_digest())
    assert [path.name for _, path in list_commits(directory)] == ["commit-000000.pt"]
    assert read_commit(commit_path(directory, 0))["state_digest"] == digest


def the_state_digest_changes_with_a_step_and_only_then(backend, directory, monkeypatch):
    learner = backend.make(directory)
    _, initial = learner.start()
    sequences = batch(6, 0)
    proximal, reference = learner.score(sequences, START, need_reference=True)
    assert proximal.dtype == np.float64 and proximal.shape == (6, TASK.response_length)
    np.testing.assert_array_equal(proximal, reference)  # nothing learnt yet
    assert learner.score(sequences, START, need_reference=False)[1] is None
    digest, current = learner.forward(0, 0, 0, sequences, START)
    np.testing.assert_array_equal(current, proximal)
    assert learner.state_digest() == digest == initial  # scoring and forwards change nothing
    after = learner.apply_cotangent(0, 0, 0, digest, np.full_like(current, 0.1))
    assert after != initial and learner.state_digest() == after
    moved, still_reference = learner.score(sequences, START, need_reference=True)
    np.testing.assert_array_equal(still_reference, reference)
    assert np.abs(moved - proximal).max() > 1e-4
    assert learner.state_digest() == after


def score_refuses_malformed_sequences(backend, directory, monkeypatch):
    learner = backend.make(directory)
    learner.start()
    with pytest.raises(ValueError, match="response_start"):
        learner.score(batch(2, 0), 0, need_reference=False)
    with pytest.raises(ValueError, match="2-D integer"):
        learner.score(batch(2, 0).astype(np.float32), START, need_reference=False)


# -- binding checks ----------------------------------------------------------------------------


def a_cotangent_with_any_mismatched_binding_is_refused(backend, directory, monkeypatch, field):
    learner = backend.make(directory)
    learner.start()
    take_steps(learner, 1)
    digest, logprobs = learner.forward(5, 2, 17, batch(4, 1), START)
    before = backend.snapshot(learner)
    binding = dict(update=5, step=2, observation=17, pre_step_digest=digest)
    wrong = "0" * 64 if field == "pre_step_digest" else binding[field] + 1
    with pytest.raises(BindingError) as refusal:
        learner.apply_cotangent(**dict(binding, **{field: wrong}),
                                cotangent=np.ones_like(logprobs))
    assert refusal.value.fields == (field,)
    assert field in str(refusal.value)
    assert learner.state_digest() == digest  # nothing changed...
    assert_same_snapshot(backend.snapshot(learner), before)
    # ...and the pending forward survives a refusal: the right cotangent still lands.
    assert learner.apply_cotangent(**binding, cotangent=np.ones_like(logprobs)) != digest


def every_mismatch_is_named(backend, directory, monkeypatch):
    learner = backend.make(directory)
    learner.start()
    digest, logprobs = learner.forward(1, 1, 1, batch(4, 0), START)
    with pytest.raises(BindingError) as refusal:
        learner.apply_cotangent(2, 1, 3, digest, np.ones_like(logprobs))
    assert refusal.value.fields == ("update", "observation")


def cotangents_without_a_matching_forward_are_refused(backend, directory, monkeypatch):
    learner = backend.make(directory)
    _, start_digest = learner.start()
    with pytest.raises(BindingError, match="no forward is pending"):
        learner.apply_cotangent(0, 0, 0, start_digest, np.zeros((4, 4)))
    digest, logprobs = learner.forward(0, 0, 0, batch(4, 0), START)
    with pytest.raises(BindingError, match="shape") as refusal:
        learner.apply_cotangent(0, 0, 0, digest, np.zeros((4, 3)))
    assert refusal.value.fields == ("cotangent",)
    with pytest.raises(ValueError, match="non-finite"):
        learner.apply_cotangent(0, 0, 0, digest, np.full(logprobs.shape, np.nan))
    assert learner.state_digest() == start_digest
    learner.apply_cotangent(0, 0, 0, digest, np.ones_like(logprobs))
    # The forward is spent: replaying the same cotangent is refused.
    with pytest.raises(BindingError, match="no forward is pending"):
        learner.apply_cotangent(0, 0, 0, digest, np.ones_like(logprobs))


# -- the cotangent route -----------------------------------------------------------------------


def cotangent_route_gradient_equals_autograd_of_the_loss(backend, directory, monkeypatch):
    """The core's decoupled-PPO cotangent, pulled back by the backend, is the gradient that
    the framework's own autograd gives for the same loss written natively."""
    learner = backend.make(directory, grad_clip=0.0)
    learner.start()
    sequences = batch(12, 3)
    digest, current = learner.forward(0, 0, 0, sequences, START)
    rng = np.random.default_rng(3)
    # Proximal and behaviour policies a little off the current one: some tokens clip.
    proximal = current + rng.normal(scale=0.3, size=current.shape)
    behavior = proximal + rng.normal(scale=0.3, size=current.shape)
    advantages = rng.normal(size=len(sequences))
    config = ObjectiveConfig(loss="decoupled_ppo", clip_low=0.2, clip_high=0.28,
                             behavior_weight_cap=5.0, kl_coef=0.0)
    mask = np.ones(current.shape, dtype=bool)
    terms, cotangent = objective(config, advantages, current, proximal, behavior, mask)
    assert 0 < terms.clip_fraction < 1  # both branches of the max are exercised

    loss, expected = backend.native_gradients(learner, sequences, proximal, behavior,
                                              advantages, config)
    assert loss == pytest.approx(terms.loss, rel=1e-6, abs=1e-9)
    captured = backend.capture_gradients(learner, monkeypatch)
    learner.apply_cotangent(0, 0, 0, digest, cotangent)
    assert captured.keys() == expected.keys()
    for name, gradient in expected.items():
        np.testing.assert_allclose(captured[name], gradient, rtol=1e-5,
                                   atol=1e-6 * np.abs(gradient).max() + 1e-12, err_msg=name)


def gradient_norm_is_clipped(backend, directory, monkeypatch):
    learner = backend.make(directory, grad_clip=1e-3)
    learner.start()
    captured = backend.capture_gradients(learner, monkeypatch)
    digest, logprobs = learner.forward(0, 0, 0, batch(8, 0), START)
    learner.apply_cotangent(0, 0, 0, digest, np.ones_like(logprobs))
    norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in captured.values()))
    assert 1e-3 * 0.99 <= norm <= 1e-3 * (1 + 1e-5)


def same_inputs_give_bitwise_identical_results(backend, directory, monkeypatch):
    runs = []
    for name in ("first", "second"):
        learner = backend.make(directory / name)
        learner.start()
        digests = take_steps(learner, 3)
        scores = learner.score(batch(8, 9), START, need_reference=True)
        runs.append((digests, scores, backend.snapshot(learner)))
    (digests_a, scores_a, state_a), (digests_b, scores_b, state_b) = runs
    assert digests_a == digests_b and len(set(digests_a)) == 3
    np.testing.assert_array_equal(scores_a[0], scores_b[0])
    np.testing.assert_array_equal(scores_a[1], scores_b[1])
    assert_same_snapshot(state_a, state_b)


# -- commits -----------------------------------------------------------------------------------


def commit_restore_round_trip_is_bitwise(backend, directory, monkeypatch):
    learner = backend.make(directory)
    learner.start()
    take_steps(learner, 3)
    committed_digest = learner.commit(3)

    restored = backend.make(directory)
    assert restored.start() == (3, committed_digest)
    assert restored.applied_steps == learner.applied_steps == 3
    assert_same_snapshot(backend.snapshot(restored), backend.snapshot(learner))
    # Both continue identically from the restored state.
    assert take_steps(learner, 2, first_update=3) == take_steps(restored, 2, first_update=3)
    assert_same_snapshot(backend.snapshot(restored), backend.snapshot(learner))


def commits_are_pruned_and_must_move_forward(backend, directory, monkeypatch):
    learner = backend.make(directory, keep_commits=2)
    learner.start()
    for version in (1, 2, 5):
        learner.commit(version)
    assert [version for version, _ in list_commits(directory)] == [2, 5]
    with pytest.raises(ValueError, match="not newer"):
        learner.commit(5)


def corrupt_flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def corrupt_truncate(path):
    path.write_bytes(path.read_bytes()[:-100])


def corrupt_truncate_header(path):
    path.write_bytes(path.read_bytes()[:20])


def corrupt_append(path):
    path.write_bytes(path.read_bytes() + b"\0")


def corrupt_magic(path):
    path.write_bytes(b"NOTACOMM" + path.read_bytes()[8:])


def corrupt_older_format(path):
    path.write_bytes(b"INVARCKP" + path.read_bytes()[8:])  # format 1's magic


def corrupt_missing_field(path):
    content = read_commit(path)
    del content["optimizer"]
    path.write_bytes(encode_commit(content))  # a well-checksummed but incomplete commit


def corrupt_other_seed(path):
    content = read_commit(path)
    content["seed"] = 7
    path.write_bytes(encode_commit(content))


def corrupt_digest(path):
    content = read_commit(path)
    content["model"]["head.weight"][0, 0] += 1
    path.write_bytes(encode_commit(content))


def a_bad_commit_is_refused_and_never_loaded(backend, directory, monkeypatch, corrupt, reason):
    learner = backend.make(directory)
    learner.start()
    take_steps(learner, 1)
    learner.commit(1)
    newest = commit_path(directory, 1)
    corrupt(newest)

    fresh = backend.make(directory)
    untouched = backend.snapshot(fresh)
    with pytest.raises(CommitError, match=reason) as refusal:
        fresh.start()
    assert refusal.value.path == newest
    assert str(newest) in str(refusal.value)
    assert_same_snapshot(backend.snapshot(fresh), untouched)
    assert fresh.committed_version is None


def a_crash_mid_commit_leaves_the_old_commit_loadable(backend, directory, monkeypatch):
    learner = backend.make(directory)
    learner.start()
    take_steps(learner, 1)
    old_digest = learner.commit(1)
    take_steps(learner, 1, first_update=1)

    def crash(*args):
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        learner.commit(2)
    monkeypatch.undo()
    (directory / ".commit-000002.pt.x7y8z9.tmp").write_bytes(b"half a commit")

    restored = backend.make(directory)
    assert restored.start() == (1, old_digest)
    assert sorted(os.listdir(directory)) == ["commit-000000.pt", "commit-000001.pt"]


# -- weights for workers and evaluation --------------------------------------------------------


def published_weights_are_the_commits_not_the_live_ones(backend, directory, monkeypatch):
    learner = backend.make(directory, keep_commits=1)
    learner.start()
    take_steps(learner, 1)
    state_digest = learner.commit(1)
    committed_weights = weights_digest(backend.weights_state_dict(learner))
    take_steps(learner, 1, first_update=1)  # the live weights move on; the commit does not
    blob, digest, committed_digest = learner.published_weights(1)
    assert committed_digest == state_digest and digest == committed_weights
    worker = Policy(CONFIG, seed=5)  # published weights load into a torch worker as they are
    assert load_weights_bytes(worker, blob) == digest
    assert digest != weights_digest(backend.weights_state_dict(learner))
    assert learner.commit_file(1) == commit_path(directory, 1)
    assert learner.commit_file(0) is None  # pruned
    with pytest.raises(CommitError, match="no such file"):
        learner.published_weights(0)


def the_publication_made_at_commit_is_the_commit_files(backend, directory, monkeypatch):
    learner = backend.make(directory)
    learner.start()
    take_steps(learner, 1)
    learner.commit(1)
    take_steps(learner, 1, first_update=1)  # the live weights move on after the commit
    from_file = learner.published_from_commit_file(1)
    assert learner.published_weights(1) == from_file  # made at commit time, bit for bit
    assert learner.published_weights(1) == from_file  # asked again: read back from the file
    assert learner.published_weights(0) == learner.published_from_commit_file(0)


def evaluate_greedy_is_the_mean_greedy_reward(backend, directory, monkeypatch):
    from invar.runtime.sampler import generate
    learner = backend.make(directory)
    learner.start()
    take_steps(learner, 2)
    prompts = TASK.prompts("heldout", range(16))
    twin = Policy(CONFIG, seed=0)
    twin.load_state_dict(backend.weights_state_dict(learner))
    tokens, _ = generate(twin, torch.as_tensor(prompts), TASK.response_length, greedy=True)
    expected = np.mean([TASK.reward(p, r) for p, r in zip(prompts, tokens.numpy())])
    assert learner.evaluate_greedy(TASK, prompts) == pytest.approx(expected)


# -- the learner's rules, kept by the executor on each backend ---------------------------------


REQUESTS = tuple(RequestId(0, p, 0) for p in range(4))
WORK = ("score", "forward", "apply_cotangent", "commit", "evaluate_greedy", "commit_file")
"""Backend methods that do (or write) something: a repeat or a refusal by the rules calls none."""


def _forward(serial, update=0, attempt=0):
    return RunForward(ObservationId(update, 0, serial), attempt, REQUESTS)


def _cotangent(reply, current=None, pre=None):
    current = reply.current_logprobs if current is None else current
    values = Ragged.of([[0.05 * (i + 1) for _ in row] for i, row in enumerate(current)])
    terms = ObjectiveTerms(0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 16)
    return ApplyCotangent(reply.observation, reply.attempt, pre or reply.pre_step_digest,
                          matrix_digest(current), values, terms)


class RulesCheck:
    """Sends commands to a real executor and checks each against `LearnerRules` (the rules of
    `invar.model.world`'s learner), evolved on the side from the executor's replies."""

    def __init__(self, backend, directory):
        from invar.runtime.learner_executor import LearnerExecutor
        from invar.runtime.metrics import MetricsLog
        self.learner = Counted(backend.make(directory / "commits"))
        self.executor = LearnerExecutor(self.learner, TASK, TASK.prompts("heldout", range(4)),
                                        directory, MetricsLog(directory, None, tensorboard=False))
        self.restart(0)

    def restart(self, attempt):
        started = self.executor.start(attempt)
        self.rules = LearnerRules(attempt, started.weights_digest, started.committed_version)

    def send(self, command, expected, inputs=None):
        from invar.runtime.learner_executor import checkpoint_path
        kept = (isinstance(command, Checkpoint)
                and checkpoint_path(self.executor.run_dir, command.version).exists())
        # A checkpoint on disk is answered again before any rule (as the world's learner does).
        assert (Decision.REPEAT if kept else self.rules.decide(command)) == expected, command
        digest, calls = self.learner.state_digest(), Counter(self.learner.calls)
        reply = self.executor.execute(command, inputs)
        assert self.executor.last_decision == expected, command
        if expected != Decision.RUN:
            assert all(self.learner.calls[m] == calls[m] for m in WORK), command
            assert self.learner.state_digest() == digest
            assert (reply is None) == (expected != Decision.REPEAT)
        elif isinstance(command, RunForward):
            self.rules = self.rules.forwarded(command, reply)
        elif isinstance(command, ApplyCotangent):
            self.rules = self.rules.stepped_to(command, reply.post_step_digest)
        elif isinstance(command, Commit):
            self.rules = self.rules.committed(command.update + 1, reply.weights_digest)
        assert self.executor.rules == self.rules
        return reply


def the_executor_decides_as_the_learner_rules(backend, directory, monkeypatch):
    check = RulesCheck(backend, directory)
    run, repeat, ignore, refuse = Decision.RUN, Decision.REPEAT, Decision.IGNORE, Decision.REFUSE
    rows = batch(len(REQUESTS), 0)
    check.send(ScoreProbabilities(0, 0, REQUESTS, True), run, rows)
    first = check.send(_forward(1), run, rows)
    pending = check.send(_forward(2), run, batch(len(REQUESTS), 1))  # a newer one replaces it
    check.send(_forward(1), ignore, rows)  # an older one re-sent does not
    assert check.send(_forward(2), repeat, rows) == pending  # from memory, not re-run
    check.send(_forward(3, attempt=1), ignore, rows)  # another attempt's
    check.send(_cotangent(first), refuse)  # for the replaced forward
    current = pending.current_logprobs
    other = Ragged(current.values + 0.25, current.lengths)
    check.send(_cotangent(pending, current=other), refuse)  # from other log-probs
    check.send(_cotangent(pending, pre="0" * 64), refuse)  # from another state
    check.send(Evaluate(0), run)  # nothing applied yet: exactly commit 0's weights
    step = check.send(_cotangent(pending), run)
    assert check.send(_cotangent(pending), repeat) == step
    check.send(_forward(2), ignore, rows)  # the applied forward, re-sent
    for command in (Evaluate(0), Checkpoint(0), Evaluate(1), Checkpoint(1)):
        check.send(command, ignore)  # the weights are no commit's
    check.send(Commit(0, 0, "0" * 64), refuse)
    committed = check.send(Commit(0, 0, step.post_step_digest), run)
    assert check.send(Commit(0, 0, step.post_step_digest), repeat) == committed
    check.send(Evaluate(0), ignore)
    check.send(Evaluate(1), run)
    written = check.send(Checkpoint(1), run)
    assert written.weights_digest == committed.weights_digest
    assert check.send(Checkpoint(1), repeat) == written
    check.send(_forward(4, update=1), run, rows)
    assert check.send(Checkpoint(1), repeat) == written  # kept, though the weights moved on

    check.restart(1)  # the rules start afresh: the restored commit, nothing pending
    check.send(_forward(4, update=1), ignore, rows)
    check.send(Evaluate(1), run)
    check.send(_forward(5, update=1, attempt=1), run, rows)


CORRUPTIONS = {
    "flipped byte": (corrupt_flip_byte, "checksum mismatch"),
    "truncated": (corrupt_truncate, "truncated: payload has"),
    "truncated header": (corrupt_truncate_header, "truncated: 20 bytes"),
    "trailing bytes": (corrupt_append, "unexpected bytes"),
    "bad magic": (corrupt_magic, "not a commit file"),
    "older format": (corrupt_older_format, "a commit of an older Invar, format 1"),
    "missing field": (corrupt_missing_field, "missing field.*optimizer"),
    "other seed": (corrupt_other_seed, "seed 7"),
    "tampered state": (corrupt_digest, "state_digest"),
}
"""Damage done to a backend's newest commit, and the refusal it must meet."""

Check = Callable[[Any, Any, pytest.MonkeyPatch], None]

CHECKS: dict[str, Check] = {
    "start_writes_commit_zero_and_nothing_runs_before":
        start_writes_commit_zero_and_nothing_runs_before,
    "the_state_digest_changes_with_a_step_and_only_then":
        the_state_digest_changes_with_a_step_and_only_then,
    "score_refuses_malformed_sequences": score_refuses_malformed_sequences,
    **{f"a_cotangent_with_any_mismatched_binding_is_refused[{field}]":
       functools.partial(a_cotangent_with_any_mismatched_binding_is_refused, field=field)
       for field in ("update", "step", "observation", "pre_step_digest")},
    "every_mismatch_is_named": every_mismatch_is_named,
    "cotangents_without_a_matching_forward_are_refused":
        cotangents_without_a_matching_forward_are_refused,
    "cotangent_route_gradient_equals_autograd_of_the_loss":
        cotangent_route_gradient_equals_autograd_of_the_loss,
    "gradient_norm_is_clipped": gradient_norm_is_clipped,
    "same_inputs_give_bitwise_identical_results": same_inputs_give_bitwise_identical_results,
    "commit_restore_round_trip_is_bitwise": commit_restore_round_trip_is_bitwise,
    "commits_are_pruned_and_must_move_forward": commits_are_pruned_and_must_move_forward,
    **{f"a_bad_commit_is_refused_and_never_loaded[{name}]":
       functools.partial(a_bad_commit_is_refused_and_never_loaded, corrupt=corrupt,
                         reason=reason)
       for name, (corrupt, reason) in CORRUPTIONS.items()},
    "a_crash_mid_commit_leaves_the_old_commit_loadable":
        a_crash_mid_commit_leaves_the_old_commit_loadable,
    "published_weights_are_the_commits_not_the_live_ones":
        published_weights_are_the_commits_not_the_live_ones,
    "the_publication_made_at_commit_is_the_commit_files":
        the_publication_made_at_commit_is_the_commit_files,
    "evaluate_greedy_is_the_mean_greedy_reward": evaluate_greedy_is_the_mean_greedy_reward,
    "the_executor_decides_as_the_learner_rules": the_executor_decides_as_the_learner_rules,
}
"""Every check of the suite by name (a parametrized one once per case, "name[case]"), each
called as `check(adapter, empty_directory, monkeypatch)`."""
