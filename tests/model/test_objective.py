"""Tests of invar.model.objective: the losses, their hand-written cotangent, the helpers."""

from __future__ import annotations

import math
from dataclasses import replace
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from invar.model import objective as objective_module
from invar.model.errors import ConfigError
from invar.model.objective import (
    AGGREGATIONS,
    LOSSES,
    ObjectiveConfig,
    ObjectiveTerms,
    group_advantages,
    objective,
    pad,
)
from invar.model.ragged import Ragged

KL_COEFS = (0.0, 0.1)


# ---------------------------------------------------------------------------------------------
# Input builders
# ---------------------------------------------------------------------------------------------


def ragged_mask(rng: np.random.Generator, n: int, width: int) -> np.ndarray:
    """(n, width) prefix mask, every response at least one token, lengths varied."""
    lengths = rng.integers(1, width + 1, size=n)
    lengths[0] = width  # at least one full row
    return np.arange(width)[None, :] < lengths[:, None]


def log_probs_away_from_kinks(
    rng: np.random.Generator, shape: tuple[int, int], config: ObjectiveConfig
) -> dict[str, np.ndarray]:
    """Log-probs whose ratios sit well inside or well outside the clip range, never at an edge.

    Both the proximal ratio exp(c - p) (decoupled_ppo) and the behaviour ratio exp(c - b)
    (behavior_ppo) are kept at least ~0.05 in log space from 1 - eps_low and 1 + eps_high, and
    the behaviour weight exp(p - b) away from its cap, so the loss is smooth at every token.
    """
    low, high = math.log(1 - config.clip_low), math.log(1 + config.clip_high)
    # candidate log-ratios: inside (-0.1, 0.1) or outside the range by a margin
    choices = np.array([-0.6, -0.45, -0.08, -0.03, 0.0, 0.04, 0.09, 0.35, 0.5])
    inside = (choices > low + 0.05) & (choices < high - 0.05)
    assert np.all((choices < low - 0.05) | inside | (choices > high + 0.05))
    current = rng.uniform(-3.0, -0.5, size=shape)
    log_ratio_prox = rng.choice(choices, size=shape) + rng.uniform(-0.01, 0.01, size=shape)
    proximal = current - log_ratio_prox
    # behaviour: b = c - log_ratio_behav, with p - b = log_ratio_behav - log_ratio_prox
    log_ratio_behav = rng.choice(choices, size=shape) + rng.uniform(-0.01, 0.01, size=shape)
    behavior = current - log_ratio_behav
    assert np.all(np.abs((proximal - behavior) - math.log(config.behavior_weight_cap)) > 0.05)
    reference = current + rng.uniform(-0.5, 0.5, size=shape)
    return dict(current=current, proximal=proximal, behavior=behavior, reference=reference)


def random_advantages(rng: np.random.Generator, n: int) -> np.ndarray:
    # |A| >= 0.2 so the clipped and unclipped branches never tie outside the clip range
    return rng.choice([-1.0, 1.0], size=n) * rng.uniform(0.2, 2.0, size=n)


def run(config: ObjectiveConfig, advantages, inputs, mask, **extra):
    reference = inputs["reference"] if config.needs_reference else None
    return objective(
        config,
        advantages,
        inputs["current"],
        inputs["proximal"],
        inputs["behavior"],
        mask,
        reference=reference,
        **extra,
    )


# ---------------------------------------------------------------------------------------------
# Cotangent vs. central finite differences
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("kl_coef", KL_COEFS)
@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("seed", range(3))
def test_cotangent_matches_central_finite_differences(loss, kl_coef, seed, aggregation):
    rng = np.random.default_rng(seed)
    config = ObjectiveConfig(loss=loss, kl_coef=kl_coef, aggregation=aggregation)
    n, width = 4, 5
    mask = ragged_mask(rng, n, width)
    inputs = log_probs_away_from_kinks(rng, (n, width), config)
    advantages = random_advantages(rng, n)

    _, cotangent = run(config, advantages, inputs, mask)

    step = 1e-6
    numeric = np.zeros((n, width))
    for i, t in zip(*np.nonzero(mask)):
        up = dict(inputs, current=inputs["current"].copy())
        down = dict(inputs, current=inputs["current"].copy())
        up["current"][i, t] += step
        down["current"][i, t] -= step
        loss_up = run(config, advantages, up, mask)[0].loss
        loss_down = run(config, advantages, down, mask)[0].loss
        numeric[i, t] = (loss_up - loss_down) / (2 * step)

    np.testing.assert_allclose(cotangent, numeric, rtol=1e-6, atol=1e-9)
    assert np.all(cotangent[~mask] == 0.0)


# ---------------------------------------------------------------------------------------------
# Cotangent vs. torch autograd of an independent torch implementation
# ---------------------------------------------------------------------------------------------


def torch_loss(torch, config, advantages, current, proximal, behavior, mask, reference):
    """The same objective, written directly from the papers in torch."""
    A = advantages[:, None]
    if config.loss == "unclipped_is":
        per_token = -A * torch.exp(current - behavior)
    else:
        anchor = proximal if config.loss == "decoupled_ppo" else behavior
        ratio = torch.exp(current - anchor)
        clipped_ratio = torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high)
        per_token = torch.maximum(-A * ratio, -A * clipped_ratio)
        if config.loss == "decoupled_ppo":
            weight = torch.clamp(torch.exp(proximal - behavior), max=config.behavior_weight_cap)
            per_token = weight * per_token
    if config.kl_coef > 0:
        delta = reference - current
        per_token = per_token + config.kl_coef * (torch.exp(delta) - delta - 1)
    maskf = mask.to(per_token.dtype)
    if config.aggregation == "token_mean":  # DAPO Eq. 12: every token of the batch alike
        return (per_token * maskf).sum() / maskf.sum()
    per_response = (per_token * maskf).sum(dim=1) / maskf.sum(dim=1)
    return per_response.mean()


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("kl_coef", KL_COEFS)
@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("seed", range(3))
def test_cotangent_matches_torch_autograd(loss, kl_coef, seed, aggregation):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(100 + seed)
    config = ObjectiveConfig(loss=loss, kl_coef=kl_coef, aggregation=aggregation)
    n, width = 6, 7
    mask = ragged_mask(rng, n, width)
    current = rng.uniform(-3.0, -0.2, size=(n, width))
    # wide log-ratios: many tokens fall outside the clip range, and some weights hit the cap
    proximal = current + rng.uniform(-0.8, 0.8, size=(n, width))
    behavior = proximal - rng.uniform(-1.0, 3.5, size=(n, width))  # p - b up to 3.5 > log 5
    reference = current + rng.uniform(-0.5, 0.5, size=(n, width))
    advantages = random_advantages(rng, n)

    terms, cotangent = objective(
        config, advantages, current, proximal, behavior, mask,
        reference=reference if kl_coef else None,
    )

    as_tensor = lambda a: torch.tensor(a, dtype=torch.float64)  # noqa: E731
    current_t = as_tensor(current).requires_grad_(True)
    expected_loss = torch_loss(
        torch, config, as_tensor(advantages), current_t, as_tensor(proximal),
        as_tensor(behavior), torch.tensor(mask), as_tensor(reference),
    )
    (expected_grad,) = torch.autograd.grad(expected_loss, current_t)

    if loss != "unclipped_is":
        assert terms.clip_fraction > 0.0, "the inputs should exercise the clipped branch"
    if loss == "decoupled_ppo":
        assert np.any((proximal - behavior)[mask] > math.log(config.behavior_weight_cap))
    assert terms.loss == pytest.approx(expected_loss.item(), rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(cotangent, expected_grad.numpy(), rtol=1e-10, atol=1e-14)


def test_cotangent_matches_torch_on_exact_ties():
    """At the clip edges and with A = 0 the max ties; both sides must split the same way."""
    torch = pytest.importorskip("torch")
    config = ObjectiveConfig(loss="behavior_ppo")
    # ratios exactly at the edges (log of the bound) and inside; A = 0 on the second row
    edges = np.log([1 - config.clip_low, 1 + config.clip_high, 1.0, 2.0])
    current = np.array([edges, edges])
    behavior = np.zeros_like(current)
    mask = np.ones_like(current, dtype=bool)
    advantages = np.array([1.5, 0.0])

    _, cotangent = objective(config, advantages, current, behavior, behavior, mask)

    current_t = torch.tensor(current, requires_grad=True)
    behavior_t = torch.tensor(behavior)
    expected = torch_loss(
        torch, config, torch.tensor(advantages), current_t, behavior_t, behavior_t,
        torch.tensor(mask), None,
    )
    (expected_grad,) = torch.autograd.grad(expected, current_t)
    np.testing.assert_allclose(cotangent, expected_grad.numpy(), rtol=1e-12, atol=0)


# ---------------------------------------------------------------------------------------------
# Group advantages
# ---------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    group_size=st.integers(1, 6),
    groups=st.integers(1, 5),
    normalize=st.booleans(),
    data=st.data(),
)
def test_group_advantages_are_centred_per_group(group_size, groups, normalize, data):
    rewards = np.array(
        data.draw(
            st.lists(
                st.floats(-10, 10, allow_nan=False),
                min_size=group_size * groups,
                max_size=group_size * groups,
            )
        )
    )
    advantages = group_advantages(rewards, group_size, normalize)
    assert advantages.shape == rewards.shape
    by_group = advantages.reshape(groups, group_size)
    np.testing.assert_allclose(by_group.mean(axis=1), 0.0, atol=1e-9)
    if not normalize:
        np.testing.assert_allclose(
            by_group, rewards.reshape(groups, group_size)
            - rewards.reshape(groups, group_size).mean(axis=1, keepdims=True), atol=1e-12,
        )


def test_group_advantages_have_unit_std_when_normalized():
    rng = np.random.default_rng(7)
    rewards = rng.normal(size=32) * 3.0 + 1.0
    advantages = group_advantages(rewards, group_size=8, normalize=True)
    np.testing.assert_allclose(advantages.reshape(4, 8).std(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(advantages.reshape(4, 8).mean(axis=1), 0.0, atol=1e-12)


def test_group_advantages_known_values():
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 2.0, 4.0])
    np.testing.assert_allclose(
        group_advantages(rewards, 2, normalize=False), [0.5, -0.5, -0.5, 0.5, -1.0, 1.0]
    )
    np.testing.assert_allclose(
        group_advantages(rewards, 2, normalize=True, eps=0.0), [1, -1, -1, 1, -1, 1]
    )


@pytest.mark.parametrize("normalize", [True, False])
def test_constant_groups_give_exact_zeros(normalize):
    rewards = np.array([0.1, 0.1, 0.1, 1.0, 0.0, 0.5, 7.3, 7.3, 7.3])
    advantages = group_advantages(rewards, 3, normalize)
    assert np.all(advantages[:3] == 0.0)
    assert np.all(advantages[6:] == 0.0)
    assert np.any(advantages[3:6] != 0.0)


@pytest.mark.parametrize(
    "rewards, group_size, name",
    [
        (np.zeros(5), 2, "rewards"),
        (np.zeros((2, 2)), 2, "rewards"),
        (np.array([0.0, np.nan]), 2, "rewards"),
        (np.zeros(4), 0, "group_size"),
        (np.zeros(4), 2.0, "group_size"),
    ],
)
def test_group_advantages_refuses_bad_arguments(rewards, group_size, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        group_advantages(rewards, group_size, normalize=True)


# ---------------------------------------------------------------------------------------------
# Masking and response averaging
# ---------------------------------------------------------------------------------------------


@st.composite
def batches(draw):
    n = draw(st.integers(1, 4))
    width = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(1, width), min_size=n, max_size=n))
    mask = np.arange(width)[None, :] < np.array(lengths)[:, None]
    # a few holes inside rows too (mask need not be a prefix), keeping one token per row
    holes = np.array(draw(st.lists(st.booleans(), min_size=n * width, max_size=n * width)))
    mask = mask & ~holes.reshape(n, width)
    mask[np.arange(n), 0] = True
    floats = st.floats(-2.0, 0.0, allow_nan=False)
    arrays = {
        name: np.array(
            draw(st.lists(floats, min_size=n * width, max_size=n * width))
        ).reshape(n, width)
        for name in ("current", "proximal", "behavior", "reference")
    }
    advantages = np.array(draw(st.lists(st.floats(-2, 2, allow_nan=False), min_size=n, max_size=n)))
    config = ObjectiveConfig(
        loss=draw(st.sampled_from(LOSSES)), kl_coef=draw(st.sampled_from(KL_COEFS))
    )
    return config, advantages, arrays, mask


@settings(max_examples=80, deadline=None)
@given(batch=batches(), junk=st.sampled_from([np.nan, np.inf, -np.inf, 1e300, -1e300, 3.0]))
def test_masked_positions_get_zero_cotangent_and_do_not_change_loss(batch, junk):
    config, advantages, arrays, mask = batch
    terms, cotangent = run(config, advantages, arrays, mask)
    assert np.all(cotangent[~mask] == 0.0)
    assert terms.tokens == int(mask.sum())

    scribbled = {name: np.where(mask, values, junk) for name, values in arrays.items()}
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # padding never reaches exp()
        terms_junk, cotangent_junk = run(config, advantages, scribbled, mask)
    assert terms_junk == terms
    np.testing.assert_array_equal(cotangent_junk, cotangent)


@settings(max_examples=80, deadline=None)
@given(batch=batches())
def test_loss_is_the_mean_of_per_response_losses(batch):
    """Each response weighs 1/n, whatever its length: L = mean_i L(response i alone)."""
    config, advantages, arrays, mask = batch
    terms, cotangent = run(config, advantages, arrays, mask)
    alone = []
    for i in range(mask.shape[0]):
        single = {name: values[i : i + 1] for name, values in arrays.items()}
        single_terms, single_cotangent = run(config, advantages[i : i + 1], single, mask[i : i + 1])
        alone.append(single_terms.loss)
        np.testing.assert_allclose(
            cotangent[i] * mask.shape[0], single_cotangent[0], rtol=1e-12, atol=1e-15
        )
    assert terms.loss == pytest.approx(np.mean(alone), rel=1e-12, abs=1e-12)


@settings(max_examples=80, deadline=None)
@given(batch=batches())
def test_token_mean_weighs_each_response_by_its_length(batch):
    """DAPO's token mean: L = sum_i |o_i| L_i / sum_i |o_i|, L_i response i's own loss; with
    responses of one length it is GRPO's sequence mean, bit for bit."""
    config, advantages, arrays, mask = batch
    token_config = replace(config, aggregation="token_mean")
    terms, cotangent = run(token_config, advantages, arrays, mask)
    lengths = mask.sum(axis=1)
    alone = [run(config, advantages[i:i + 1], {k: v[i:i + 1] for k, v in arrays.items()},
                 mask[i:i + 1])[0].loss for i in range(len(lengths))]
    assert terms.loss == pytest.approx(float(np.dot(lengths, alone) / lengths.sum()),
                                       rel=1e-12, abs=1e-12)
    assert np.all(cotangent[~mask] == 0.0)
    whole = np.ones_like(mask)
    (token_terms, token_cotangent), (sequence_terms, sequence_cotangent) = (
        run(c, advantages, arrays, whole) for c in (token_config, config))
    assert token_terms == sequence_terms
    np.testing.assert_array_equal(token_cotangent, sequence_cotangent)


@settings(max_examples=40, deadline=None)
@given(
    loss=st.sampled_from(LOSSES),
    copies=st.integers(1, 8),
    token=st.tuples(st.floats(-2, 0), st.floats(-2, 0), st.floats(-2, 0)),
)
def test_repeating_a_token_does_not_change_its_response_weight(loss, copies, token):
    """Response 0 made of k copies of one token contributes the same as one copy."""
    config = ObjectiveConfig(loss=loss)
    width = 8
    advantages = np.array([1.0, -0.5])
    # row 0: the repeated token (c, p, b); row 1: a fixed one-token other response
    current = np.array([[token[0]] * width, [-1.0] * width])
    proximal = np.array([[token[1]] * width, [-0.7] * width])
    behavior = np.array([[token[2]] * width, [-1.1] * width])
    one_copy = np.zeros((2, width), dtype=bool)
    one_copy[:, 0] = True
    k_copies = one_copy.copy()
    k_copies[0, :copies] = True

    terms_one, _ = objective(config, advantages, current, proximal, behavior, one_copy)
    terms_k, _ = objective(config, advantages, current, proximal, behavior, k_copies)
    assert terms_k.loss == pytest.approx(terms_one.loss, rel=1e-12, abs=1e-12)


# ---------------------------------------------------------------------------------------------
# The losses themselves
# ---------------------------------------------------------------------------------------------


def test_behavior_weight_is_capped():
    config = ObjectiveConfig(loss="decoupled_ppo", behavior_weight_cap=5.0)
    mask = np.ones((2, 3), dtype=bool)
    current = np.full((2, 3), -1.0)
    proximal = current.copy()  # ratio 1: no clipping, l_t = -A w_t
    behavior = np.array([[-1.0 - 3.0, -1.0 - 10.0, -1.0 - 1e6], [-1.0, -1.5, -1.0 + 2.0]])
    advantages = np.array([1.0, 1.0])

    terms, cotangent = objective(config, advantages, current, proximal, behavior, mask)

    weights = np.array([[5.0, 5.0, 5.0], [1.0, math.exp(0.5), math.exp(-2.0)]])
    assert terms.mean_behavior_weight == pytest.approx(weights.mean())
    assert terms.loss == pytest.approx(-weights.mean(axis=1).mean())
    np.testing.assert_allclose(cotangent, -weights / 6.0)
    assert terms.mean_ratio == pytest.approx(1.0)
    assert terms.clip_fraction == 0.0


@settings(max_examples=60, deadline=None)
@given(batch=batches())
def test_behavior_ppo_equals_decoupled_ppo_when_proximal_is_behavior(batch):
    config, advantages, arrays, mask = batch
    arrays = dict(arrays, proximal=arrays["behavior"])
    results = {}
    for loss in ("decoupled_ppo", "behavior_ppo"):
        results[loss] = run(
            ObjectiveConfig(loss=loss, kl_coef=config.kl_coef), advantages, arrays, mask
        )
    assert results["decoupled_ppo"][0] == results["behavior_ppo"][0]
    np.testing.assert_array_equal(results["decoupled_ppo"][1], results["behavior_ppo"][1])


def test_known_values_of_each_loss():
    # one response, two tokens; log-ratios chosen so token 0 is inside, token 1 above the range
    A = 2.0
    current = np.array([[math.log(1.1), math.log(1.5)]])
    proximal = np.zeros((1, 2))
    behavior = np.array([[math.log(0.5), 0.0]])  # w = exp(p - b) = 2, 1
    mask = np.ones((1, 2), dtype=bool)
    advantages = np.array([A])

    decoupled, grad = objective(ObjectiveConfig(), advantages, current, proximal, behavior, mask)
    # token 0: w=2, r=1.1 (inside) -> -2*2*1.1 = -4.4; token 1: w=1, r=1.5 clipped to 1.28
    assert decoupled.loss == pytest.approx((-4.4 + -2.56) / 2)
    np.testing.assert_allclose(grad, [[-4.4 / 2, 0.0]])
    assert decoupled.clip_fraction == pytest.approx(0.5)
    assert decoupled.mean_ratio == pytest.approx((1.1 + 1.5) / 2)
    assert decoupled.mean_behavior_weight == pytest.approx(1.5)

    unclipped, grad = objective(
        ObjectiveConfig(loss="unclipped_is"), advantages, current, proximal, behavior, mask
    )
    # exp(c - b) = 2.2, 1.5
    assert unclipped.loss == pytest.approx(-A * (2.2 + 1.5) / 2)
    np.testing.assert_allclose(grad, [[-A * 2.2 / 2, -A * 1.5 / 2]])
    assert unclipped.clip_fraction == 0.0
    assert unclipped.mean_ratio == pytest.approx((2.2 + 1.5) / 2)
    assert unclipped.mean_behavior_weight == 1.0

    behavior_ppo, grad = objective(
        ObjectiveConfig(loss="behavior_ppo"), advantages, current, proximal, behavior, mask
    )
    # behaviour ratios 2.2 and 1.5: both above 1.28 with A > 0 -> both clipped
    assert behavior_ppo.loss == pytest.approx(-A * 1.28)
    np.testing.assert_allclose(grad, 0.0)
    assert behavior_ppo.clip_fraction == 1.0
    assert behavior_ppo.mean_behavior_weight == 1.0


def test_negative_advantage_is_clipped_from_below():
    config = ObjectiveConfig(loss="behavior_ppo", clip_low=0.2)
    current = np.array([[math.log(0.5), math.log(1.5)]])
    behavior = np.zeros((1, 2))
    mask = np.ones((1, 2), dtype=bool)
    terms, grad = objective(config, np.array([-1.0]), current, behavior, behavior, mask)
    # A < 0: r = 0.5 is clipped to 0.8 (no gradient); r = 1.5 is not clipped (pessimistic max)
    assert terms.loss == pytest.approx((0.8 + 1.5) / 2)
    np.testing.assert_allclose(grad, [[0.0, 1.5 / 2]])
    assert terms.clip_fraction == 0.5


def test_kl_term_k3():
    config = ObjectiveConfig(loss="unclipped_is", kl_coef=0.5)
    current = np.array([[-1.0, -2.0]])
    reference = np.array([[-1.0, -1.5]])
    zeros = np.zeros((1, 2))
    mask = np.ones((1, 2), dtype=bool)
    terms, grad = objective(
        config, np.array([0.0]), current, zeros, current, mask, reference=reference
    )
    k3 = math.exp(0.5) - 0.5 - 1
    assert terms.kl == pytest.approx(k3 / 2)
    assert terms.loss == pytest.approx(0.5 * k3 / 2)
    np.testing.assert_allclose(grad, [[0.0, 0.5 * (1 - math.exp(0.5)) / 2]])


def test_kl_is_zero_when_off_and_reference_is_ignored():
    mask = np.ones((1, 2), dtype=bool)
    zeros = np.zeros((1, 2))
    terms, _ = objective(ObjectiveConfig(), np.array([1.0]), zeros, zeros, zeros, mask)
    assert terms.kl == 0.0
    assert not ObjectiveConfig().needs_reference
    assert ObjectiveConfig(kl_coef=0.01).needs_reference


def test_terms_report_staleness_and_tokens():
    mask = np.array([[True, True, False], [True, False, False]])
    zeros = np.zeros((2, 3))
    terms, _ = objective(
        ObjectiveConfig(), np.array([1.0, -1.0]), zeros, zeros, zeros, mask,
        staleness=np.array([0, 3]),
    )
    assert terms.mean_staleness == 1.5
    assert terms.tokens == 3
    as_dict = terms.to_dict()
    assert set(as_dict) == {
        "loss", "clip_fraction", "mean_ratio", "mean_behavior_weight", "kl",
        "mean_staleness", "tokens",
    }
    assert all(type(value) is float for value in as_dict.values())
    assert isinstance(terms, ObjectiveTerms)


# ---------------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------------


def _good_arguments():
    mask = np.array([[True, True], [True, False]])
    zeros = np.zeros((2, 2))
    return dict(
        config=ObjectiveConfig(),
        advantages=np.array([1.0, -1.0]),
        current=zeros, proximal=zeros, behavior=zeros, mask=mask,
    )


@pytest.mark.parametrize(
    "name, value",
    [
        ("advantages", np.zeros(3)),
        ("advantages", np.array([np.nan, 0.0])),
        ("current", np.zeros((2, 3))),
        ("current", np.array([[0.0, np.inf], [0.0, 0.0]])),
        ("proximal", np.zeros(2)),
        ("behavior", np.array([[np.nan, 0.0], [0.0, 0.0]])),
        ("mask", np.ones((2, 2))),  # not bool
        ("mask", np.array([[True, True], [False, False]])),  # an empty response
        ("mask", np.zeros((0, 2), dtype=bool)),  # no responses
        ("staleness", np.array([1.0])),
        ("staleness", np.array([-1.0, 0.0])),
    ],
)
def test_objective_refuses_bad_arguments_naming_them(name, value):
    arguments = _good_arguments()
    arguments[name] = value
    with pytest.raises(ValueError, match=f"^{name}:"):
        objective(**arguments)


def test_objective_requires_reference_when_kl_is_on():
    arguments = _good_arguments()
    arguments["config"] = ObjectiveConfig(kl_coef=0.1)
    with pytest.raises(ValueError, match="^reference:"):
        objective(**arguments)
    with pytest.raises(ValueError, match="^reference:"):
        objective(**arguments, reference=np.zeros((3, 2)))
    terms, _ = objective(**arguments, reference=np.zeros((2, 2)))
    assert terms.kl == 0.0


def test_objective_validates_its_config():
    arguments = _good_arguments()
    arguments["config"] = ObjectiveConfig(clip_low=2.0)
    with pytest.raises(ConfigError) as error:
        objective(**arguments)
    assert error.value.fields == ("objective.clip_low",)


# ---------------------------------------------------------------------------------------------
# ObjectiveConfig
# ---------------------------------------------------------------------------------------------


def test_default_config_is_valid():
    ObjectiveConfig().validate()
    for loss in LOSSES:
        ObjectiveConfig(loss=loss).validate()
    assert LOSSES == ("decoupled_ppo", "unclipped_is", "behavior_ppo")


@pytest.mark.parametrize(
    "field, value",
    [
        ("loss", "ppo"),
        ("loss", 3),
        ("clip_low", 0.0),
        ("clip_low", 1.0),
        ("clip_low", -0.1),
        ("clip_low", math.nan),
        ("clip_low", True),
        ("clip_high", 0.0),
        ("clip_high", -0.2),
        ("clip_high", math.inf),
        ("clip_high", "0.2"),
        ("behavior_weight_cap", 0.99),
        ("behavior_weight_cap", math.nan),
        ("behavior_weight_cap", math.inf),
        ("kl_coef", -0.01),
        ("kl_coef", math.nan),
        ("kl_coef", math.inf),
        ("normalize_advantages", "yes"),
        ("normalize_advantages", 1),
    ],
)
def test_config_validate_refuses_each_bad_field(field, value):
    config = ObjectiveConfig(**{field: value})
    with pytest.raises(ConfigError) as error:
        config.validate()
    assert error.value.fields == (f"objective.{field}",)
    assert isinstance(error.value, ValueError)


def test_config_validate_names_every_bad_field():
    config = ObjectiveConfig(loss="nope", clip_high=0.0, kl_coef=-1.0)
    with pytest.raises(ConfigError) as error:
        config.validate()
    assert error.value.fields == ("objective.loss", "objective.clip_high", "objective.kl_coef")


def test_config_edges_are_accepted():
    ObjectiveConfig(behavior_weight_cap=1.0, clip_low=0.999, clip_high=5.0).validate()
    ObjectiveConfig(clip_low=1e-9, clip_high=1e-9, kl_coef=0.0).validate()


# ---------------------------------------------------------------------------------------------
# pad
# ---------------------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=6), max_size=5
    )
)
def test_pad_is_what_the_rows_as_a_matrix_pad_to(rows):
    values, mask = pad(rows)
    assert values.dtype == np.float64 and mask.dtype == np.bool_
    assert values.shape == mask.shape == (len(rows), max((len(r) for r in rows), default=0))
    assert np.all(values[~mask] == 0.0)
    assert mask.sum(axis=1).tolist() == [len(row) for row in rows]
    matrix_values, matrix_mask = Ragged.of(rows).padded()
    assert np.array_equal(values, matrix_values) and np.array_equal(mask, matrix_mask)
    assert Ragged.from_padded(values, mask).rows() == tuple(tuple(row) for row in rows)


def test_pad_accepts_tuples_and_arrays():
    values, mask = pad([(1.0, 2.0), np.array([3.0]), []])
    np.testing.assert_array_equal(values, [[1.0, 2.0], [3.0, 0.0], [0.0, 0.0]])
    np.testing.assert_array_equal(mask, [[True, True], [True, False], [False, False]])


def test_from_padded_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="expected two 2-D arrays of one shape"):
        Ragged.from_padded(np.zeros((2, 3)), np.ones((2, 2), dtype=bool))
    with pytest.raises(ValueError, match="expected two 2-D arrays of one shape"):
        Ragged.from_padded(np.zeros(4), np.ones(4, dtype=bool))


# ---------------------------------------------------------------------------------------------
# The checks of all inputs together against the checks one input at a time
# ---------------------------------------------------------------------------------------------

_entries = st.one_of(st.floats(-4.0, 0.5), st.sampled_from([0.0, -0.0, 1e308, -1e308, math.nan,
                                                            math.inf, -math.inf]))


@st.composite
def _objective_arguments(draw):
    """Arguments of every kind `objective` meets: mostly well-formed (dense or ragged), some
    with a non-finite, overflowing or misshapen input, a mask with an empty row, lists, views
    and Fortran-ordered arrays."""
    n, width = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    lengths = draw(st.lists(st.integers(0 if draw(st.booleans()) else 1, width),
                            min_size=n, max_size=n))
    mask = np.arange(width) < np.array(lengths)[:, None]
    if draw(st.booleans()):
        mask = np.ones((n, width), dtype=bool)

    def matrix(shape=(n, width)):
        values = np.array(draw(st.lists(_entries, min_size=shape[0] * shape[1],
                                        max_size=shape[0] * shape[1])), dtype=np.float64)
        values = values.reshape(shape)
        form = draw(st.sampled_from(["array", "array", "array", "fortran", "view", "list"]))
        if form == "fortran":
            return np.asfortranarray(values)
        if form == "view":
            wide = np.zeros((shape[0], shape[1] + 2))
            wide[:, :shape[1]] = values
            return wide[:, :shape[1]]
        return values.tolist() if form == "list" else values

    def vector(low=-2.0):
        return np.array(draw(st.lists(st.one_of(st.floats(low, 3.0), _entries),
                                      min_size=n, max_size=n)), dtype=np.float64)

    config = ObjectiveConfig(loss=draw(st.sampled_from(LOSSES)),
                             kl_coef=draw(st.sampled_from(KL_COEFS)))
    arguments = dict(config=config, advantages=vector(), current=matrix(), proximal=matrix(),
                     behavior=matrix(), mask=mask,
                     reference=matrix() if draw(st.booleans()) else None,
                     staleness=vector(low=-1.0) if draw(st.booleans()) else None)
    if draw(st.integers(0, 9)) == 0:  # one input of another shape
        name = draw(st.sampled_from(["advantages", "current", "behavior", "staleness"]))
        arguments[name] = matrix((n + 1, width)) if name in ("current", "behavior") else (
            np.zeros(n + 1))
    return arguments


def _outcome(arguments):
    try:
        with np.errstate(all="ignore"):  # inputs of 1e308 overflow in the math too
            terms, cotangent = objective(**arguments)
    except ValueError as error:
        return str(error)
    return repr(terms), cotangent.shape, cotangent.tobytes()


@settings(max_examples=400, deadline=None)
@given(_objective_arguments())
def test_checks_together_refuse_and_compute_exactly_as_one_at_a_time(arguments):
    """The inputs checked together (one sum per array, no masking of a dense batch) are refused
    exactly when, and with the message, the checks one input at a time refuse them; accepted,
    the terms and cotangent are the same bits."""
    together = _outcome(arguments)
    with mock.patch.object(objective_module, "_dense_inputs", return_value=None):
        one_at_a_time = _outcome(arguments)
    assert together == one_at_a_time


def test_a_dense_batch_is_checked_together_and_kept_as_it_is():
    """Float64 arrays of the mask's shape, every token valid, pass the checks together and go
    to the objective as they are, with no mask; a ragged batch with its mask, its invalid
    positions set to 0."""
    rng = np.random.default_rng(0)
    dense = dict(config=ObjectiveConfig(), advantages=rng.normal(size=3),
                 current=-rng.random((3, 4)), proximal=-rng.random((3, 4)),
                 behavior=-rng.random((3, 4)), mask=np.ones((3, 4), dtype=bool),
                 reference=None, staleness=np.ones(3))
    checked, current = objective_module._dense_inputs(**dense)
    assert checked.mask is None and checked.tokens == 12 and current is dense["current"]
    assert checked.proximal is dense["proximal"] and checked.mean_staleness == 1.0
    mask = np.arange(4) < np.array([4, 1, 2])[:, None]
    checked, current = objective_module._dense_inputs(**dict(dense, mask=mask))
    assert checked.mask is mask and checked.tokens == 7
    assert checked.token_share[:, 0].tolist() == [1 / 12, 1 / 3, 1 / 6]
    for values in (current, checked.proximal, checked.token_share, checked.minus_advantage,
                   checked.weight):
        assert (values[~mask] == 0.0).all()


def test_fortran_ordered_inputs_are_summed_as_masking_would():
    """Inputs in Fortran order are masked as any others (masking gives C-ordered arrays): summed
    in their own order, the loss of these advantages would differ in its last bits."""
    zeros = np.asfortranarray(np.zeros((2, 3)))
    arguments = dict(config=ObjectiveConfig(loss="unclipped_is"),
                     advantages=np.array([-536953235.3602852, 5811181.041963532]),
                     current=zeros, proximal=zeros, behavior=zeros,
                     mask=np.ones((2, 3), dtype=bool))
    checked, current = objective_module._dense_inputs(**arguments, reference=None,
                                                      staleness=None)
    assert current.flags.c_contiguous and checked.behavior.flags.c_contiguous
    loss = objective(**arguments)[0].loss
    assert loss == objective(**dict(arguments, current=np.zeros((2, 3)), proximal=np.zeros(
        (2, 3)), behavior=np.zeros((2, 3))))[0].loss == 265571027.1591608


def test_pad_names_the_row_that_is_not_flat():
    with pytest.raises(ValueError, match=r"rows: row 1 is not a flat sequence"):
        pad([[0.0, -1.0], 5.0, [-2.0]])


def test_pad_of_no_rows_is_empty():
    values, mask = pad([])
    assert values.shape == mask.shape == (0, 0)
