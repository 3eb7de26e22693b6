"""Policy network and sampler: KV cache, exact behavior log-probs, per-row reproducibility."""

import numpy as np
import pytest
import torch

from invar.runtime.policy import Policy, PolicyConfig
from invar.runtime.sampler import generate, gumbel_noise, sampling_logprobs
from invar.runtime.task import DigitReversal

pytestmark = pytest.mark.usefixtures("few_threads")

TASK = DigitReversal(8)
SETTINGS = [  # (temperature, top_k, top_p)
    (1.0, 0, 1.0),
    (0.7, 4, 1.0),
    (1.3, 0, 0.8),
    (0.9, 6, 0.7),
]


@pytest.fixture(scope="module")
def policy():
    return Policy(PolicyConfig(), seed=0)


@pytest.fixture(scope="module")
def prompts():
    return torch.as_tensor(TASK.prompts("train", range(24)))


def truncated_logprobs(logits: np.ndarray, temperature: float, top_k: int, top_p: float):
    """Independent numpy statement of the sampling distribution of one logits row."""
    scaled = logits / temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    keep = np.ones_like(probs, dtype=bool)
    if 0 < top_k < len(probs):
        keep &= probs >= np.sort(probs)[::-1][top_k - 1]
    if top_p < 1:
        truncated = np.where(keep, probs, 0) / np.where(keep, probs, 0).sum()
        ranked = np.sort(truncated)[::-1]
        mass_before = np.cumsum(ranked) - ranked
        keep &= truncated >= ranked[mass_before < top_p].min()
    with np.errstate(divide="ignore"):
        return np.log(np.where(keep, probs, 0) / np.where(keep, probs, 0).sum())


def test_default_policy_has_about_106k_parameters(policy):
    assert sum(p.numel() for p in policy.parameters()) == 105_728
    tied = Policy(PolicyConfig(tie_head=True), seed=0)
    assert tied.head.weight is tied.token_embedding.weight
    assert sum(p.numel() for p in tied.parameters()) == 105_728 - 12 * 64


def test_initialisation_depends_on_the_seed_only():
    rng_before = torch.get_rng_state()
    first, again, other = (Policy(PolicyConfig(), seed) for seed in (3, 3, 4))
    assert torch.equal(torch.get_rng_state(), rng_before)  # the global RNG is untouched
    for name, tensor in first.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name
    assert not torch.equal(first.head.weight, other.head.weight)


def test_config_is_checked():
    with pytest.raises(ValueError, match="heads"):
        PolicyConfig(width=64, heads=5)
    with pytest.raises(ValueError, match="layers"):
        PolicyConfig(layers=0)


def test_attention_is_causal(policy):
    tokens = torch.as_tensor(TASK.prompts("train", range(3)))
    changed = tokens.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 10
    before, after = policy(tokens), policy(changed)
    torch.testing.assert_close(before[:, :6], after[:, :6], rtol=0, atol=1e-6)
    assert not torch.allclose(before[:, 6:], after[:, 6:])


def test_forward_with_cache_matches_forward(policy, prompts):
    full = policy(prompts)
    pieces, cache = [], None
    for start, end in [(0, 4), (4, 5), (5, 10)]:
        logits, cache = policy.forward_with_cache(prompts[:, start:end], cache)
        pieces.append(logits)
    assert cache.length == 10
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="max_len"):
        policy(torch.zeros(1, 65, dtype=torch.long))


@pytest.mark.parametrize("temperature, top_k, top_p", SETTINGS)
def test_kv_cache_generation_equals_full_recompute(policy, prompts, temperature, top_k, top_p):
    seeds = list(range(100, 100 + len(prompts)))
    options = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    cached = generate(policy, prompts, 8, seeds, **options)
    recomputed = generate(policy, prompts, 8, seeds, use_cache=False, **options)
    assert torch.equal(cached[0], recomputed[0])
    torch.testing.assert_close(cached[1], recomputed[1], rtol=0, atol=1e-5)


def test_each_row_depends_on_its_own_seed_only(policy, prompts):
    seeds = [7_000 + 13 * i for i in range(len(prompts))]
    tokens, logprobs = generate(policy, prompts, 8, seeds, temperature=1.2)
    # Re-issued alone, and inside a batch of another size, order and company.
    for row in (0, 5, 23):
        alone = generate(policy, prompts[row : row + 1], 8, seeds[row : row + 1], temperature=1.2)
        assert torch.equal(alone[0][0], tokens[row])
        torch.testing.assert_close(alone[1][0], logprobs[row], rtol=0, atol=1e-6)
    strangers = torch.as_tensor(TASK.prompts("heldout", range(5)))
    order = [23, 5, 0, 11]
    mixed = torch.cat([strangers, prompts[order]])
    mixed_seeds = [1, 2, 3, 4, 5] + [seeds[row] for row in order]
    mixed_tokens, mixed_logprobs = generate(policy, mixed, 8, mixed_seeds, temperature=1.2)
    assert torch.equal(mixed_tokens[5:], tokens[order])
    torch.testing.assert_close(mixed_logprobs[5:], logprobs[order], rtol=0, atol=1e-6)
    # The seed, not the row position, is what drives the sample.
    reseeded = generate(policy, prompts, 8, [s + 1 for s in seeds], temperature=1.2)
    assert not torch.equal(reseeded[0], tokens)


@pytest.mark.parametrize("temperature, top_k, top_p", SETTINGS)
def test_recorded_logprobs_are_the_truncated_distribution(
    policy, prompts, temperature, top_k, top_p
):
    seeds = list(range(len(prompts)))
    options = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    tokens, logprobs = generate(policy, prompts, 8, seeds, **options)
    sequences = torch.cat([prompts, tokens], dim=1)
    with torch.no_grad():
        logits = policy(sequences).double().numpy()
    prompt_length = prompts.shape[1]
    for row in range(len(prompts)):
        for position in range(8):
            expected = truncated_logprobs(
                logits[row, prompt_length - 1 + position], temperature, top_k, top_p
            )
            token = tokens[row, position].item()
            assert np.isfinite(expected[token])  # sampled inside the support
            assert abs(logprobs[row, position].item() - expected[token]) < 1e-5


def test_samples_follow_the_recorded_distribution(policy):
    # Gumbel-max must be an exact sampler: empirical frequencies match exp(log-prob).
    rows = 10_000
    prompt = torch.as_tensor(TASK.prompts("train", [0])).repeat(rows, 1)
    tokens, logprobs = generate(policy, prompt, 1, list(range(rows)), temperature=2.0, top_k=5)
    frequencies = np.bincount(tokens[:, 0].numpy(), minlength=12) / rows
    with torch.no_grad():
        expected = sampling_logprobs(policy(prompt[:1])[:, -1], 2.0, 5).exp()[0].numpy()
    assert (frequencies[expected == 0] == 0).all()
    np.testing.assert_allclose(frequencies, expected, atol=0.015)
    np.testing.assert_allclose(logprobs[:, 0].exp().numpy(), expected[tokens[:, 0].numpy()])


def test_sampling_logprobs_truncates_and_renormalises():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.0625, 0.0625]]))
    assert torch.allclose(sampling_logprobs(logits).exp(), logits.exp().double())
    top2 = sampling_logprobs(logits, top_k=2).exp()[0]
    torch.testing.assert_close(top2, torch.tensor([2 / 3, 1 / 3, 0, 0, 0], dtype=torch.float64))
    # 0.5 + 0.25 reaches 0.75 exactly: nothing further is needed.
    nucleus = sampling_logprobs(logits, top_p=0.75).exp()[0]
    torch.testing.assert_close(nucleus, torch.tensor([2 / 3, 1 / 3, 0, 0, 0], dtype=torch.float64))
    smallest = sampling_logprobs(logits, top_p=0.01).exp()[0]
    torch.testing.assert_close(smallest, torch.tensor([1.0, 0, 0, 0, 0], dtype=torch.float64))
    hot = sampling_logprobs(logits, temperature=1e6).exp()[0]
    torch.testing.assert_close(hot, torch.full((5,), 0.2, dtype=torch.float64), atol=1e-6, rtol=0)


def test_greedy_takes_the_argmax_and_records_certainty(policy, prompts):
    tokens, logprobs = generate(policy, prompts, 8, greedy=True)
    assert torch.equal(logprobs, torch.zeros_like(logprobs))
    sequences = prompts
    with torch.no_grad():
        for position in range(8):
            best = policy(sequences)[:, -1].argmax(dim=-1)
            assert torch.equal(tokens[:, position], best)
            sequences = torch.cat([sequences, best[:, None]], dim=1)
    top1 = generate(policy, prompts, 8, list(range(len(prompts))), top_k=1)
    assert torch.equal(top1[0], tokens)
    assert torch.equal(top1[1], logprobs)


def test_generate_refuses_bad_requests(policy, prompts):
    with pytest.raises(ValueError, match="one seed per prompt row"):
        generate(policy, prompts, 8, [1, 2])
    with pytest.raises(ValueError, match="one seed per prompt row"):
        generate(policy, prompts, 8)
    with pytest.raises(ValueError, match="exceed max_len"):
        generate(policy, prompts, 60, list(range(len(prompts))))
    with pytest.raises(ValueError, match="temperature"):
        generate(policy, prompts, 8, list(range(len(prompts))), temperature=0)
    with pytest.raises(ValueError, match="top_p"):
        generate(policy, prompts, 8, list(range(len(prompts))), top_p=0)


def test_noise_drawn_position_by_position_is_each_row_s_generator_read_in_one_go():
    """Sampling holds one position's noise at a time; the values are those of one draw of
    [new_tokens, V] from each row's seeded generator (what the recorded runs were made with)."""
    seeds, new_tokens, vocabulary = [3, 2**40, 7], 5, 300
    drawn_at_once = torch.stack([
        torch.rand(new_tokens, vocabulary, dtype=torch.float64,
                   generator=torch.Generator().manual_seed(seed)) for seed in seeds])
    expected = -torch.log(-torch.log(drawn_at_once.clamp(min=torch.finfo(torch.float64).tiny)))
    assert torch.equal(gumbel_noise(seeds, new_tokens, vocabulary), expected)


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_left_padded_prompt_samples_and_scores_what_it_does_alone(policy, use_cache):
    """Prompts of different lengths, left-padded in one call: with the mask and positions each
    row draws the tokens it draws alone, with its log-probs (to float32 rounding), and the
    learner's scoring of the padded rows gives them too; an end token stops every row."""
    from invar.runtime.padding import Prompts, Sequences, positions_of, response_lengths
    from invar.runtime.torch_learner import response_logprobs

    rows = [row[-length:] for row, length in
            zip(TASK.prompts("train", range(6)).tolist(), (10, 4, 7, 2, 10, 5))]
    prompts = Prompts.of(rows, 10)
    seeds = list(range(40, 46))
    tokens, logprobs = generate(policy, torch.as_tensor(prompts.tokens), 8, seeds,
                                use_cache=use_cache, prompt_lengths=prompts.lengths, eos=3)
    lengths = response_lengths(tokens.numpy(), 3)
    assert tokens.shape[1] == lengths.max()
    sequences = Sequences(np.concatenate([prompts.tokens, tokens.numpy()], axis=1), 10,
                          prompts.lengths)
    mask = sequences.attention_mask()
    with torch.no_grad():
        scored = response_logprobs(policy, torch.as_tensor(sequences.tokens), 10,
                                   (torch.as_tensor(mask), torch.as_tensor(positions_of(mask))))
    for i, row in enumerate(rows):
        alone, alone_logprobs = generate(policy, torch.as_tensor([row]), 8, seeds[i:i + 1],
                                         use_cache=use_cache, eos=3)
        n = lengths[i]
        assert tokens[i, :n].tolist() == alone[0, :n].tolist()
        np.testing.assert_allclose(logprobs[i, :n], alone_logprobs[0, :n], rtol=0, atol=1e-5)
        np.testing.assert_allclose(scored[i, :n], alone_logprobs[0, :n], rtol=0, atol=1e-5)
    unmasked, _ = generate(policy, torch.as_tensor(prompts.tokens), 8, seeds,
                           use_cache=use_cache)
    assert unmasked[:, :tokens.shape[1]].tolist() != tokens.tolist()


def test_the_cpu_gather_picks_the_one_hot_rule_s_values_and_gradients_bit_for_bit():
    from invar.runtime.policy import picked_by_one_hot, sequence_logprobs
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 7, 300, generator=generator, dtype=torch.float32)
    tokens = torch.randint(0, 300, (5, 7), generator=generator)
    cotangent = torch.randn(5, 7, generator=generator, dtype=torch.float64)
    results = []
    for pick in (sequence_logprobs, lambda lg, tk: picked_by_one_hot(
            torch.log_softmax(lg.double(), dim=-1), tk)):
        leaf = logits.clone().requires_grad_(True)
        values = pick(leaf, tokens)
        values.backward(cotangent)
        results.append((values.detach(), leaf.grad))
    (fast, fast_grad), (rule, rule_grad) = results
    assert torch.equal(fast, rule) and torch.equal(fast_grad, rule_grad)
