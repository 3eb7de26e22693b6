"""TorchLearner: bound updates, checked commits, determinism, and a learning smoke test."""

import copy
import os

import numpy as np
import pytest
import torch

from invar.runtime.policy import Policy, PolicyConfig
from invar.runtime.sampler import generate
from invar.runtime.task import DigitReversal
from invar.runtime.torch_learner import (
    BindingError,
    CommitError,
    OptimConfig,
    TorchLearner,
    commit_path,
    encode_commit,
    list_commits,
    load_weights_bytes,
    read_commit,
    response_logprobs,
)
from invar.runtime.weights import weights_digest

TASK = DigitReversal(4)
CONFIG = PolicyConfig(max_len=TASK.sequence_length)
START = TASK.prompt_length  # where responses begin in a sequence
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(autouse=True)
def few_threads():
    # The networks are tiny: a second thread barely helps, and thrashes on a busy machine.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def make_learner(commit_dir, seed=0, device="cpu", **optim):
    return TorchLearner(CONFIG, OptimConfig(**optim), seed, commit_dir, device=device)


def rollout(policy, first_prompt, rows, seed):
    """Sequences [rows, L] of train prompts answered by `policy`, as numpy."""
    prompts = TASK.prompts("train", range(first_prompt, first_prompt + rows))
    device = next(policy.parameters()).device
    seeds = [seed * 1_000 + i for i in range(rows)]
    prompt_tokens = torch.as_tensor(prompts, device=device)
    tokens, _ = generate(policy, prompt_tokens, TASK.response_length, seeds)
    return np.concatenate([prompts, tokens.cpu().numpy()], axis=1)


def take_steps(learner, count, first_update=0):
    """`count` bound forward/cotangent round trips with a fixed synthetic cotangent."""
    digests = []
    for update in range(first_update, first_update + count):
        sequences = rollout(learner.model, 8 * update, 8, update)
        digest, logprobs = learner.forward(update, 0, update, sequences, START)
        cotangent = np.linspace(-1, 1, logprobs.size).reshape(logprobs.shape)
        digests.append(learner.apply_cotangent(update, 0, update, digest, cotangent))
    return digests


def assert_same_learner_state(left, right):
    for name, tensor in left.model.state_dict().items():
        assert torch.equal(tensor, right.model.state_dict()[name]), name
    left_optim, right_optim = left.optimizer.state_dict(), right.optimizer.state_dict()
    assert left_optim["param_groups"] == right_optim["param_groups"]
    assert left_optim["state"].keys() == right_optim["state"].keys()
    for index, state in left_optim["state"].items():
        for key, value in state.items():
            assert torch.equal(value, right_optim["state"][index][key]), (index, key)


# -- lifecycle and commits ---------------------------------------------------------------------


def test_start_on_an_empty_directory_writes_commit_zero(tmp_path):
    learner = make_learner(tmp_path)
    version, digest = learner.start()
    assert (version, digest) == (0, learner.state_digest())
    assert [path.name for _, path in list_commits(tmp_path)] == ["commit-000000.pt"]
    assert read_commit(commit_path(tmp_path, 0))["state_digest"] == digest


def test_nothing_runs_before_start(tmp_path):
    learner = make_learner(tmp_path)
    with pytest.raises(RuntimeError, match="start"):
        learner.score(rollout(learner.model, 0, 2, 0), START, need_reference=False)


@pytest.mark.parametrize("device", DEVICES)
def test_commit_restore_round_trip_is_bitwise(tmp_path, device):
    learner = make_learner(tmp_path, device=device)
    learner.start()
    take_steps(learner, 3)
    torch.manual_seed(1234)
    committed_rng = torch.get_rng_state()
    committed_digest = learner.commit(3)

    torch.manual_seed(99)
    restored = make_learner(tmp_path, device=device)
    assert restored.start() == (3, committed_digest)
    assert torch.equal(torch.get_rng_state(), committed_rng)
    assert restored.applied_steps == learner.applied_steps == 3
    assert_same_learner_state(learner, restored)
    # Both continue identically from the restored state.
    assert take_steps(learner, 2, first_update=3) == take_steps(restored, 2, first_update=3)


def test_commits_are_pruned_and_must_move_forward(tmp_path):
    learner = TorchLearner(CONFIG, OptimConfig(), 0, tmp_path, keep_commits=2)
    learner.start()
    for version in (1, 2, 5):
        learner.commit(version)
    assert [version for version, _ in list_commits(tmp_path)] == [2, 5]
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


@pytest.mark.parametrize(
    "corrupt, reason",
    [
        (corrupt_flip_byte, "checksum mismatch"),
        (corrupt_truncate, "truncated: payload has"),
        (corrupt_truncate_header, "truncated: 20 bytes"),
        (corrupt_append, "unexpected bytes"),
        (corrupt_magic, "not a commit file"),
        (corrupt_missing_field, "missing field.*optimizer"),
        (corrupt_other_seed, "seed 7"),
        (corrupt_digest, "state_digest"),
    ],
    ids=["flipped byte", "truncated", "truncated header", "trailing bytes", "bad magic",
         "missing field", "other seed", "tampered state"],
)
def test_a_bad_commit_is_refused_and_never_loaded(tmp_path, corrupt, reason):
    learner = make_learner(tmp_path)
    learner.start()
    take_steps(learner, 1)
    learner.commit(1)
    newest = commit_path(tmp_path, 1)
    corrupt(newest)

    fresh = make_learner(tmp_path)
    untouched = copy.deepcopy(fresh.model.state_dict())
    with pytest.raises(CommitError, match=reason) as refusal:
        fresh.start()
    assert refusal.value.path == newest
    assert str(newest) in str(refusal.value)
    for name, tensor in fresh.model.state_dict().items():
        assert torch.equal(tensor, untouched[name]), name
    assert fresh.optimizer.state_dict()["state"] == {}


def test_a_crash_mid_commit_leaves_the_old_commit_loadable(tmp_path, monkeypatch):
    learner = make_learner(tmp_path)
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
    # A process killed outright would also leave its temporary file behind.
    (tmp_path / ".commit-000002.pt.x7y8z9.tmp").write_bytes(b"half a commit")

    restored = make_learner(tmp_path)
    assert restored.start() == (1, old_digest)
    assert sorted(os.listdir(tmp_path)) == ["commit-000000.pt", "commit-000001.pt"]


# -- scoring and bound updates -----------------------------------------------------------------


def test_score_gives_proximal_and_reference_logprobs(tmp_path):
    learner = make_learner(tmp_path)
    learner.start()
    prompts = torch.as_tensor(TASK.prompts("train", range(16)))
    tokens, behavior = generate(learner.model, prompts, TASK.response_length, list(range(16)))
    sequences = np.concatenate([prompts.numpy(), tokens.numpy()], axis=1)

    proximal, reference = learner.score(sequences, START, need_reference=True)
    assert proximal.dtype == np.float64 and proximal.shape == (16, TASK.response_length)
    np.testing.assert_array_equal(proximal, reference)  # nothing learnt yet
    np.testing.assert_allclose(proximal, behavior.numpy(), atol=1e-5)  # sampler agrees
    assert learner.score(sequences, START, need_reference=False)[1] is None
    _, current = learner.forward(0, 0, 0, sequences, START)
    np.testing.assert_array_equal(current, proximal)

    take_steps(learner, 2)
    moved, still_reference = learner.score(sequences, START, need_reference=True)
    np.testing.assert_array_equal(still_reference, reference)
    assert np.abs(moved - proximal).max() > 1e-3


def test_score_refuses_malformed_sequences(tmp_path):
    learner = make_learner(tmp_path)
    learner.start()
    sequences = rollout(learner.model, 0, 2, 0)
    with pytest.raises(ValueError, match="response_start"):
        learner.score(sequences, 0, need_reference=False)
    with pytest.raises(ValueError, match="2-D integer"):
        learner.score(sequences.astype(np.float32), START, need_reference=False)


def test_cotangent_route_equals_autograd_of_the_loss(tmp_path, monkeypatch):
    learner = make_learner(tmp_path, grad_clip=0.0)
    learner.start()
    sequences = rollout(learner.model, 0, 12, 0)
    cotangent = np.random.default_rng(0).normal(size=(12, TASK.response_length))

    # Autograd of loss = sum(c * logp) on an identical copy of the policy.
    twin = copy.deepcopy(learner.model)
    twin_logprobs = response_logprobs(twin, torch.as_tensor(sequences), START)
    (torch.as_tensor(cotangent) * twin_logprobs).sum().backward()

    captured = {}

    def capture_gradients():
        captured.update({n: p.grad.clone() for n, p in learner.model.named_parameters()})

    monkeypatch.setattr(learner.optimizer, "step", capture_gradients)
    digest, _ = learner.forward(0, 0, 0, sequences, START)
    learner.apply_cotangent(0, 0, 0, digest, cotangent)
    for name, parameter in twin.named_parameters():
        torch.testing.assert_close(captured[name], parameter.grad, rtol=1e-5, atol=1e-9)
    assert all(p.grad is None for p in learner.model.parameters())  # zeroed after the step


def test_gradient_norm_is_clipped(tmp_path, monkeypatch):
    learner = make_learner(tmp_path, grad_clip=1e-3)
    learner.start()
    norms = []

    def record_norm():
        gradients = [p.grad for p in learner.model.parameters()]
        norms.append(torch.nn.utils.get_total_norm(gradients).item())

    monkeypatch.setattr(learner.optimizer, "step", record_norm)
    sequences = rollout(learner.model, 0, 8, 0)
    digest, logprobs = learner.forward(0, 0, 0, sequences, START)
    learner.apply_cotangent(0, 0, 0, digest, np.ones_like(logprobs))
    assert norms[0] <= 1e-3 * (1 + 1e-5)


@pytest.mark.parametrize("field", ["update", "step", "observation", "pre_step_digest"])
def test_a_cotangent_with_any_mismatched_binding_is_refused(tmp_path, field):
    learner = make_learner(tmp_path)
    learner.start()
    take_steps(learner, 1)
    sequences = rollout(learner.model, 0, 4, 0)
    digest, logprobs = learner.forward(5, 2, 17, sequences, START)
    binding = dict(update=5, step=2, observation=17, pre_step_digest=digest)
    wrong = "0" * 64 if field == "pre_step_digest" else binding[field] + 1
    stale = dict(binding, **{field: wrong})

    with pytest.raises(BindingError) as refusal:
        learner.apply_cotangent(**stale, cotangent=np.ones_like(logprobs))
    assert refusal.value.fields == (field,)
    assert field in str(refusal.value)
    assert learner.state_digest() == digest  # nothing changed
    # The pending forward survives a refusal, and the right cotangent still lands.
    assert learner.apply_cotangent(**binding, cotangent=np.ones_like(logprobs)) != digest


def test_every_mismatch_is_named(tmp_path):
    learner = make_learner(tmp_path)
    learner.start()
    digest, logprobs = learner.forward(1, 1, 1, rollout(learner.model, 0, 4, 0), START)
    with pytest.raises(BindingError) as refusal:
        learner.apply_cotangent(2, 1, 3, digest, np.ones_like(logprobs))
    assert refusal.value.fields == ("update", "observation")


def test_cotangents_without_a_matching_forward_are_refused(tmp_path):
    learner = make_learner(tmp_path)
    _, start_digest = learner.start()
    with pytest.raises(BindingError, match="no forward is pending"):
        learner.apply_cotangent(0, 0, 0, start_digest, np.zeros((4, 4)))
    digest, logprobs = learner.forward(0, 0, 0, rollout(learner.model, 0, 4, 0), START)
    with pytest.raises(BindingError, match="shape") as refusal:
        learner.apply_cotangent(0, 0, 0, digest, np.zeros((4, 3)))
    assert refusal.value.fields == ("cotangent",)
    with pytest.raises(ValueError, match="non-finite"):
        learner.apply_cotangent(0, 0, 0, digest, np.full(logprobs.shape, np.nan))
    learner.apply_cotangent(0, 0, 0, digest, np.ones_like(logprobs))
    # The graph is spent: replaying the same cotangent is refused.
    with pytest.raises(BindingError, match="no forward is pending"):
        learner.apply_cotangent(0, 0, 0, digest, np.ones_like(logprobs))


@pytest.mark.parametrize("device", DEVICES)
def test_same_inputs_give_bitwise_identical_results(tmp_path, device):
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        runs = []
        for name in ("first", "second"):
            learner = make_learner(tmp_path / name, device=device)
            learner.start()
            digests = take_steps(learner, 3)
            scores = learner.score(rollout(learner.model, 0, 8, 9), START, need_reference=True)
            runs.append((digests, scores, learner.weights_bytes()))
    finally:
        torch.use_deterministic_algorithms(deterministic)
    (digests_a, scores_a, weights_a), (digests_b, scores_b, weights_b) = runs
    assert digests_a == digests_b and len(set(digests_a)) == 3
    np.testing.assert_array_equal(scores_a[0], scores_b[0])
    np.testing.assert_array_equal(scores_a[1], scores_b[1])
    assert weights_a == weights_b


# -- workers and evaluation --------------------------------------------------------------------


def test_published_weights_load_into_a_worker(tmp_path):
    learner = make_learner(tmp_path)
    learner.start()
    take_steps(learner, 1)
    worker = Policy(CONFIG, seed=123)
    loaded_digest = load_weights_bytes(worker, learner.weights_bytes())
    assert loaded_digest == weights_digest(learner.model.state_dict())
    assert weights_digest(worker.state_dict()) == loaded_digest


def test_published_weights_are_read_back_from_the_commit(tmp_path):
    learner = TorchLearner(CONFIG, OptimConfig(), 0, tmp_path, keep_commits=1)
    learner.start()
    take_steps(learner, 1)
    state_digest = learner.commit(1)
    take_steps(learner, 1, first_update=1)  # the live weights move on; the commit does not
    blob, digest, committed_digest = learner.published_weights(1)
    assert committed_digest == state_digest
    worker = Policy(CONFIG, seed=5)
    assert load_weights_bytes(worker, blob) == digest
    assert digest != weights_digest(learner.model.state_dict())
    assert learner.commit_file(1) == commit_path(tmp_path, 1)
    assert learner.commit_file(0) is None  # pruned
    with pytest.raises(CommitError, match="no such file"):
        learner.published_weights(0)


def test_evaluate_greedy_is_the_mean_greedy_reward(tmp_path):
    learner = make_learner(tmp_path)
    learner.start()
    prompts = TASK.prompts("heldout", range(32))
    prompt_tokens = torch.as_tensor(prompts)
    tokens, _ = generate(learner.model, prompt_tokens, TASK.response_length, greedy=True)
    expected = np.mean([TASK.reward(p, r) for p, r in zip(prompts, tokens.numpy())])
    assert learner.evaluate_greedy(TASK, prompts) == pytest.approx(expected)


def test_reinforce_improves_reversal_reward(tmp_path):
    """REINFORCE with a group-mean baseline, driven through the learner's bound-update API.

    Each response position is rewarded for holding the right digit (the task reward is the
    mean of these), and its advantage is that reward minus the mean over the prompt's group.
    """
    learner = make_learner(tmp_path, lr=3e-3)
    learner.start()
    worker = Policy(CONFIG, seed=1)
    heldout = TASK.prompts("heldout", range(64))
    initial = learner.evaluate_greedy(TASK, heldout)
    prompts_per_update, group = 32, 8
    sampled_rewards = []
    for update in range(30):
        load_weights_bytes(worker, learner.weights_bytes())
        indices = range(update * prompts_per_update, (update + 1) * prompts_per_update)
        prompts = np.repeat(TASK.prompts("train", indices), group, axis=0)
        seeds = [update * 10_000 + row for row in range(len(prompts))]
        tokens, _ = generate(worker, torch.as_tensor(prompts), TASK.response_length, seeds)
        answers = np.array([TASK.answer(prompt) for prompt in prompts])
        correct = (tokens.numpy() == answers).astype(np.float64)  # [n, R]
        grouped = correct.reshape(prompts_per_update, group, -1)
        advantages = (grouped - grouped.mean(axis=1, keepdims=True)).reshape(correct.shape)
        sequences = np.concatenate([prompts, tokens.numpy()], axis=1)
        digest, _ = learner.forward(update, 0, update, sequences, START)
        # loss = -sum(advantage * logp) / n, so d(loss)/d(logp) = -advantage / n.
        learner.apply_cotangent(update, 0, update, digest, -advantages / len(sequences))
        sampled_rewards.append(correct.mean())
    final = learner.evaluate_greedy(TASK, heldout)
    assert np.mean(sampled_rewards[-5:]) > np.mean(sampled_rewards[:5]) + 0.1
    assert final > initial + 0.2, (initial, final)
