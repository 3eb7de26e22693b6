"""TorchLearner: what is torch's own (CUDA, the process RNG in commits, the sampler's
log-probs, deterministic algorithms) and a learning smoke test. What every backend must do
(bound updates, checked commits, ...) is checked in test_backend_conformance.py."""

import numpy as np
import pytest
import torch

from invar.runtime.policy import Policy, PolicyConfig
from invar.runtime.sampler import generate
from invar.runtime.task import DigitReversal
from invar.runtime.torch_learner import OptimConfig, TorchLearner, load_weights_bytes
from invar.runtime.weights import weights_digest

pytestmark = pytest.mark.usefixtures("few_threads")

TASK = DigitReversal(4)
CONFIG = PolicyConfig(max_len=TASK.sequence_length)
START = TASK.prompt_length  # where responses begin in a sequence
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


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
