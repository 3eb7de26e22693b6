"""Policy-gradient objectives for asynchronous RL, with their gradient written out by hand.

The learner computes log-probabilities with its own framework; this module takes them as numpy
arrays and returns the loss, a few diagnostics and the cotangent dL/d(current log-probs). The
framework side then only has to back-propagate `sum(current * cotangent)`, so the RL math lives
here, in one checked place, free of any tensor library.

Notation (per response i, token t; all arrays are log-probabilities of the sampled token):

    c_t  current policy pi_theta (the one being trained; the only input with a gradient)
    p_t  proximal policy pi_prox (the learner's weights before this update)
    b_t  behaviour policy pi_behav (the weights that actually generated the token, recorded
         by the rollout worker; older than p when generation is asynchronous)
    ref_t fixed reference policy (for the optional KL penalty)
    A_i  advantage of response i (shared by all its tokens)

Losses (`ObjectiveConfig.loss`):

    "decoupled_ppo"  AReaL decoupled PPO (Fu et al. 2025, "AReaL: A Large-Scale Asynchronous
                     Reinforcement Learning System for Language Reasoning", Eq. 5), with the
                     DAPO clip-higher range (Yu et al. 2025) and a cap on the behaviour weight:
                         r_t = exp(c_t - p_t)
                         w_t = min(exp(p_t - b_t), cap)                (a constant: no gradient)
                         l_t = w_t * max(-A_i r_t, -A_i clip(r_t, 1 - eps_low, 1 + eps_high))
    "behavior_ppo"   plain PPO on the behaviour ratio (Schulman et al. 2017, Eq. 7), the
                     baseline that ignores staleness: the same with p := b, so w_t = 1.
    "unclipped_is"   REINFORCE with unclipped token-level importance sampling on the recorded
                     behaviour probabilities (Williams 1992; "REINFORCE-Zero"):
                         l_t = -A_i exp(c_t - b_t)

Optional KL penalty to the fixed reference, the k3 estimator (Schulman 2020, "Approximating KL
divergence"; as used by GRPO, Shao et al. 2024, Eq. 4):

    l_t += beta * (exp(ref_t - c_t) - (ref_t - c_t) - 1)

Aggregation (GRPO, Shao et al. 2024, Eq. 3): average over each response's valid tokens, then
over responses, so a response weighs 1/n whatever its length:

    L = 1/n sum_i 1/|o_i| sum_{t in o_i} l_t

Gradient convention: the same sub-gradients as torch autograd, so the cotangent equals
`torch.autograd.grad` of the same expression written with `torch.maximum` and `torch.clamp`:
`clamp` passes the gradient on its closed interval [1 - eps_low, 1 + eps_high], and `maximum`
splits the gradient evenly between its arguments when they are equal.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import NamedTuple

import numpy as np

from invar.model.errors import ConfigError
from invar.model.memo import IdentityMemo

LOSSES: tuple[str, ...] = ("decoupled_ppo", "unclipped_is", "behavior_ppo")


@dataclass(frozen=True)
class ObjectiveConfig:
    """How the policy loss is formed from advantages and log-probabilities.

    Attributes:
        loss: one of `LOSSES`: "decoupled_ppo" (AReaL, the default), "unclipped_is"
            (REINFORCE with unclipped behaviour importance sampling) or "behavior_ppo"
            (plain PPO against the behaviour policy, the staleness-blind baseline).
        clip_low: eps_low, the ratio is clipped from below at 1 - clip_low; in (0, 1).
        clip_high: eps_high, the ratio is clipped from above at 1 + clip_high (DAPO
            clip-higher: larger than clip_low lets unlikely tokens gain probability); > 0.
        behavior_weight_cap: upper bound on the behaviour weight w = exp(p - b) of
            "decoupled_ppo" (truncated importance sampling: one very stale token cannot
            dominate the batch); >= 1 so that an on-policy token (w = 1) is never cut.
        kl_coef: beta, coefficient of the k3 KL estimate to the fixed reference policy;
            0 turns the penalty off and no reference log-probabilities are needed.
        normalize_advantages: divide the group-centred rewards by the group's standard
            deviation (GRPO); False keeps only the centring (Dr. GRPO style).
    """

    loss: str = "decoupled_ppo"
    clip_low: float = 0.2
    clip_high: float = 0.28
    behavior_weight_cap: float = 5.0
    kl_coef: float = 0.0
    normalize_advantages: bool = True

    def __post_init__(self) -> None:
        # One spelling per number (0 and 0.0, numpy floats): equal configs, equal digests.
        for name in ("clip_low", "clip_high", "behavior_weight_cap", "kl_coef"):
            value = getattr(self, name)
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                object.__setattr__(self, name, float(value))
        if isinstance(self.normalize_advantages, np.bool_):
            object.__setattr__(self, "normalize_advantages", bool(self.normalize_advantages))

    def validate(self) -> None:
        """Raise `ConfigError` naming every field whose value cannot describe an objective."""
        bad: list[str] = []
        reasons: list[str] = []

        def refuse(field: str, reason: str) -> None:
            bad.append(f"objective.{field}")
            reasons.append(f"{field} {reason}")

        if not isinstance(self.loss, str) or self.loss not in LOSSES:
            refuse("loss", f"must be one of {LOSSES}, got {self.loss!r}")
        if not _is_real(self.clip_low) or not 0.0 < self.clip_low < 1.0:
            refuse("clip_low", f"must be in (0, 1), got {self.clip_low!r}")
        if not _is_real(self.clip_high) or not 0.0 < self.clip_high < math.inf:
            refuse("clip_high", f"must be a finite number > 0, got {self.clip_high!r}")
        if not _is_real(self.behavior_weight_cap) or not 1.0 <= self.behavior_weight_cap < math.inf:
            refuse(
                "behavior_weight_cap",
                f"must be a finite number >= 1, got {self.behavior_weight_cap!r}",
            )
        if not _is_real(self.kl_coef) or not 0.0 <= self.kl_coef < math.inf:
            refuse("kl_coef", f"must be a finite number >= 0, got {self.kl_coef!r}")
        if not isinstance(self.normalize_advantages, (bool, np.bool_)):
            refuse(
                "normalize_advantages",
                f"must be a bool, got {self.normalize_advantages!r}",
            )
        if bad:
            raise ConfigError(tuple(bad), "; ".join(reasons))

    @property
    def needs_reference(self) -> bool:
        """True when the KL penalty is on, so reference log-probabilities must be supplied."""
        return self.kl_coef > 0.0


def _is_real(value: object) -> bool:
    # bool is an int subclass; True as a clip range is a typo, not a number.
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )


# ---------------------------------------------------------------------------------------------
# Advantages
# ---------------------------------------------------------------------------------------------


def group_advantages(
    rewards: np.ndarray, group_size: int, normalize: bool, eps: float = 1e-6
) -> np.ndarray:
    """Group-relative advantages (GRPO outcome supervision, Shao et al. 2024, Sec. 4.1.2).

    `rewards` holds n = G * group_size rewards, each consecutive run of `group_size` being
    the responses to one prompt. For response i in group g:

        A_i = R_i - mean(R_g)                          (normalize=False)
        A_i = (R_i - mean(R_g)) / (std(R_g) + eps)     (normalize=True; population std)

    A group whose rewards are all equal carries no learning signal and gets exactly 0.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    if rewards.ndim != 1:
        raise ValueError(f"rewards: expected a 1-D array, got shape {rewards.shape}")
    if not np.isfinite(rewards).all():
        raise ValueError("rewards: every reward must be finite")
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)):
        raise ValueError(f"group_size: expected an int, got {group_size!r}")
    if group_size < 1:
        raise ValueError(f"group_size: must be >= 1, got {group_size}")
    if rewards.shape[0] % group_size != 0:
        raise ValueError(
            f"rewards: length {rewards.shape[0]} is not a multiple of group_size {group_size}"
        )
    if not _is_real(eps) or not 0.0 <= eps < math.inf:
        raise ValueError(f"eps: must be a finite number >= 0, got {eps!r}")

    # Sums along each group, as `mean` and `std` compute them (without their Python wrappers).
    groups = rewards.reshape(-1, group_size)
    group_mean = np.add.reduce(groups, axis=1, keepdims=True) / group_size
    centred = groups - group_mean
    if normalize:
        # The population std (ddof=0): sqrt(mean((R_i - mean(R_g))^2)).
        group_std = np.sqrt(np.add.reduce(np.square(centred), axis=1, keepdims=True)
                            / group_size)
        centred = centred / (group_std + eps)
    # Exact zeros for constant groups: the float mean of equal values need not equal them.
    constant = np.logical_and.reduce(groups == groups[:, :1], axis=1, keepdims=True)
    advantages = np.where(constant, 0.0, centred)
    return advantages.reshape(-1)


# ---------------------------------------------------------------------------------------------
# Rows of Python numbers -> padded (log-prob matrices pad themselves: `Ragged.padded`)
# ---------------------------------------------------------------------------------------------


def pad(rows: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    """Ragged rows -> (values (n, T) float64, mask (n, T) bool), T = longest row.

    Padding is 0.0 under a False mask; row i's values sit at the start of row i.
    """
    try:
        lengths = np.array([len(row) for row in rows], dtype=np.int64)
        if len(lengths) and (lengths == lengths[0]).all():
            # Rows of one length (fixed-length responses, the common case): one conversion.
            values = np.asarray(rows, dtype=np.float64)
            if values.ndim == 2:
                return values, np.ones(values.shape, dtype=bool)
        flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.float64,
                           count=int(lengths.sum()))
    except (TypeError, ValueError):  # a row that is a number, or holds sequences
        index = next(i for i, row in enumerate(rows) if np.ndim(row) != 1)
        raise ValueError(f"rows: row {index} is not a flat sequence") from None
    # Row i's values fill the first lengths[i] columns: one boolean mask, one scatter.
    mask = np.arange(int(lengths.max(initial=0))) < lengths[:, None]
    values = np.zeros(mask.shape, dtype=np.float64)
    values[mask] = flat
    return values, mask


# ---------------------------------------------------------------------------------------------
# Objective
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ObjectiveTerms:
    """The loss and its diagnostics for one batch; token means are over valid tokens.

    Attributes:
        loss: L, the scalar that is minimised (KL penalty included).
        clip_fraction: share of valid tokens whose clipped branch strictly wins the max, so
            their policy-gradient term is zero (0 for "unclipped_is").
        mean_ratio: mean of exp(c - p) ("decoupled_ppo"), exp(c - b) (the other two losses).
        mean_behavior_weight: mean of the capped w = min(exp(p - b), cap) for
            "decoupled_ppo"; 1.0 for the losses that have no separate behaviour weight.
        kl: mean k3 estimate of KL(pi_theta || pi_ref) (0.0 when the penalty is off).
        mean_staleness: mean of the per-response staleness given (0.0 when none given).
        tokens: number of valid tokens.
    """

    loss: float
    clip_fraction: float
    mean_ratio: float
    mean_behavior_weight: float
    kl: float
    mean_staleness: float
    tokens: int

    def to_dict(self) -> dict[str, float]:
        """Every field as a python float, for logging."""
        return {field.name: float(getattr(self, field.name)) for field in fields(self)}


def objective(
    config: ObjectiveConfig,
    advantages: np.ndarray,
    current: np.ndarray,
    proximal: np.ndarray,
    behavior: np.ndarray,
    mask: np.ndarray,
    reference: np.ndarray | None = None,
    staleness: np.ndarray | None = None,
) -> tuple[ObjectiveTerms, np.ndarray]:
    """The loss of `config.loss` and its cotangent dL/d(current), both in float64.

    Args:
        config: the objective; validated here.
        advantages: (n,) A_i, one per response.
        current, proximal, behavior: (n, T) log-probs c, p, b of the sampled tokens.
        mask: (n, T) bool, True at the valid tokens; n >= 1 and every response needs at
            least one valid token.
        reference: (n, T) log-probs of the fixed reference; required iff config.kl_coef > 0.
        staleness: (n,) per-response staleness (policy versions behind), for the diagnostics.

    Values under a False mask are ignored (they may even be NaN). Returns the terms and the
    cotangent, shaped (n, T) and exactly 0 where the mask is False: back-propagating
    sum(current * cotangent) through the model gives the gradient of L.
    """
    return checked_objective(config, _checked_inputs(config, advantages, current, proximal,
                                                     behavior, mask, reference, staleness))


def behavior_weight(config: ObjectiveConfig, proximal: np.ndarray,
                    behavior: np.ndarray) -> np.ndarray:
    """w_t = min(exp(p_t - b_t), cap) of "decoupled_ppo" (AReaL Eq. 5): corrects the
    proximal/behaviour mismatch; capped via the log, so it cannot overflow. It does not depend
    on the current policy: the minibatches of an update may share one computed for the batch."""
    weight: np.ndarray = np.exp(np.minimum(proximal - behavior,
                                           math.log(config.behavior_weight_cap)))
    return weight


def token_share(responses: int | np.ndarray, lengths: np.ndarray | int) -> np.ndarray:
    """1 / (n |o_i|), the weight of each token of response i in L (GRPO aggregation), as an
    (n, 1) column: `responses` is n, the responses averaged over (or each response's n), and
    `lengths` each response's |o_i| (or their one length)."""
    tokens: np.ndarray = np.multiply(responses, lengths)  # n |o_i|, exact in integers
    return 1.0 / tokens[:, None]


def checked_objective(config: ObjectiveConfig,
                      inputs: ObjectiveInputs) -> tuple[ObjectiveTerms, np.ndarray]:
    """`objective` of inputs already checked (`ObjectiveInputs`)."""
    valid, tokens = inputs.valid, inputs.tokens

    # Ignored positions become 0, so exp() of padding can neither overflow nor spread NaN.
    c = valid(inputs.current)
    p = valid(inputs.proximal)
    b = valid(inputs.behavior)
    minus_A = -inputs.advantages[:, None]

    if config.loss == "unclipped_is":
        ratio = np.exp(c - b)
        token_loss = minus_A * ratio
        token_grad = token_loss  # d(-A exp(c - b)) / dc = -A exp(c - b)
        weight = None
        clipped_active = None
    else:
        # plain PPO: the behaviour policy is the trust-region centre; decoupled: the proximal
        # one, and w (`behavior_weight`) corrects the proximal/behaviour mismatch.
        anchor = b if config.loss == "behavior_ppo" else p
        weight = inputs.weight
        ratio = np.exp(c - anchor)
        low, high = 1.0 - config.clip_low, 1.0 + config.clip_high
        clipped_ratio = ratio.clip(low, high)
        unclipped = minus_A * ratio
        clipped = minus_A * clipped_ratio
        token_loss = np.maximum(unclipped, clipped)

        # d unclipped / dc = -A r;  d clipped / dc = -A r on [low, high] (where the clip leaves
        # r as it is: r is never NaN), else 0 (torch.clamp).
        d_unclipped = unclipped
        d_clipped = np.where(clipped_ratio == ratio, unclipped, 0.0)
        # torch.maximum: the gradient goes to the larger argument, split evenly on a tie.
        tie = unclipped == clipped
        clipped_active = clipped > unclipped
        share_unclipped = np.where(tie, 0.5, unclipped > clipped)
        share_clipped = np.where(tie, 0.5, clipped_active)
        token_grad = share_unclipped * d_unclipped + share_clipped * d_clipped
        if weight is not None:
            token_loss = weight * token_loss
            token_grad = weight * token_grad

    if inputs.reference is not None:  # checked: present iff config.needs_reference
        log_ref_ratio = valid(inputs.reference) - c
        token_kl = np.exp(log_ref_ratio) - log_ref_ratio - 1.0  # k3: >= 0 at every token
        token_loss = token_loss + config.kl_coef * token_kl
        token_grad = token_grad + config.kl_coef * (1.0 - np.exp(log_ref_ratio))
        kl = inputs.token_mean(token_kl)
    else:
        kl = 0.0

    # L = 1/n sum_i 1/|o_i| sum_t l_t: each token weighs 1 / (n |o_i|).
    share = valid(inputs.token_share)
    loss = float(np.add.reduce(share * valid(token_loss), axis=None))
    cotangent = valid(share * token_grad)

    terms = ObjectiveTerms(
        loss=loss,
        clip_fraction=0.0 if clipped_active is None else int(np.count_nonzero(
            clipped_active if inputs.dense else clipped_active & inputs.mask)) / tokens,
        mean_ratio=inputs.token_mean(ratio),
        mean_behavior_weight=1.0 if weight is None else inputs.token_mean(weight),
        kl=kl,
        mean_staleness=inputs.mean_staleness,
        tokens=tokens,
    )
    return terms, cotangent


class ObjectiveInputs(NamedTuple):
    """`objective`'s inputs once checked: float64 arrays of the mask's shape, the facts about
    its valid tokens that the objective reads, and the terms that do not depend on the current
    policy (the minibatches of an update may share them: the core computes them for the whole
    batch when it is scored, and checks each forward's log-probs as they come)."""

    mask: np.ndarray
    advantages: np.ndarray
    current: np.ndarray
    proximal: np.ndarray
    behavior: np.ndarray
    reference: np.ndarray | None
    """None without the KL penalty."""
    tokens: int
    """Valid tokens in all."""
    mean_staleness: float
    dense: bool
    """Every token valid and every (n, T) input in C order: masking changes nothing, and the
    arrays computed from the inputs have the layout (hence the sums) masking would give."""
    weight: np.ndarray | None
    """`behavior_weight` of the valid proximal and behaviour log-probs ("decoupled_ppo"; None
    for the other losses, whose weight is 1)."""
    token_share: np.ndarray
    """`token_share(n, lengths)`, lengths the valid tokens of each response (each >= 1)."""

    def valid(self, values: np.ndarray) -> np.ndarray:
        """`values` at the valid tokens and 0.0 elsewhere (`_valid`)."""
        return _valid(values, self.mask, self.dense)

    def token_mean(self, values: np.ndarray) -> float:
        """The mean of (n, T) `values` over the valid tokens."""
        return float(np.add.reduce(self.valid(values), axis=None) / self.tokens)


def _checked_inputs(
    config: ObjectiveConfig,
    advantages: np.ndarray,
    current: np.ndarray,
    proximal: np.ndarray,
    behavior: np.ndarray,
    mask: np.ndarray,
    reference: np.ndarray | None,
    staleness: np.ndarray | None,
) -> ObjectiveInputs:
    """`objective`'s inputs, each refused by name when it is not a float64 array of the mask's
    shape, finite at the valid positions: kept apart so that the objective reads as the math.

    Inputs that are already such arrays pass in a few passes over all of them together
    (`_dense_inputs`); anything else, and any fault, goes through the checks one input at a
    time, which name the first input at fault."""
    if not _VALIDATED.get(config):
        config.validate()
        _VALIDATED.put(config, None, None, True)
    checked = _dense_inputs(config, advantages, current, proximal, behavior, mask, reference,
                            staleness)
    if checked is not None:
        return checked
    mask = _check_mask(mask)
    n, _ = mask.shape
    advantages = _check_array("advantages", advantages, (n,), np.ones(n, dtype=bool))
    current = _check_array("current", current, mask.shape, mask)
    proximal = _check_array("proximal", proximal, mask.shape, mask)
    behavior = _check_array("behavior", behavior, mask.shape, mask)
    if config.needs_reference:
        if reference is None:
            raise ValueError("reference: required when objective.kl_coef > 0")
        reference = _check_array("reference", reference, mask.shape, mask)
    if staleness is None:
        mean_staleness = 0.0
    else:
        staleness = _check_array("staleness", staleness, (n,), np.ones(n, dtype=bool))
        if np.any(staleness < 0):
            raise ValueError("staleness: must be >= 0")
        mean_staleness = float(staleness.mean())
    lengths = mask.sum(axis=1)
    return _objective_inputs(config, mask, advantages, current, proximal, behavior, reference,
                             lengths, int(lengths.sum()), mean_staleness, dense=False)


def _objective_inputs(config: ObjectiveConfig, mask: np.ndarray, advantages: np.ndarray,
                      current: np.ndarray, proximal: np.ndarray, behavior: np.ndarray,
                      reference: np.ndarray | None, lengths: np.ndarray, tokens: int,
                      mean_staleness: float, dense: bool) -> ObjectiveInputs:
    """Checked inputs with the terms that do not depend on the current policy."""
    weight = behavior_weight(config, _valid(proximal, mask, dense),
                             _valid(behavior, mask, dense)) if (
        config.loss == "decoupled_ppo") else None
    return ObjectiveInputs(mask, advantages, current, proximal, behavior, reference, tokens,
                           mean_staleness, dense, weight,
                           token_share(lengths.shape[0], lengths))


def _valid(values: np.ndarray, mask: np.ndarray, dense: bool) -> np.ndarray:
    """`values` at the valid tokens and 0.0 elsewhere, shaped (n, T) — or `values` as they
    are, when the batch is dense (an (n, 1) column then stands for its broadcast)."""
    return values if dense else np.where(mask, values, 0.0)


_VALIDATED = IdentityMemo(16)
"""Configs that passed `validate` (by identity: the core hands the same one to every call)."""


def _dense_inputs(
    config: ObjectiveConfig,
    advantages: np.ndarray,
    current: np.ndarray,
    proximal: np.ndarray,
    behavior: np.ndarray,
    mask: np.ndarray,
    reference: np.ndarray | None,
    staleness: np.ndarray | None,
) -> ObjectiveInputs | None:
    """The checked inputs when each is already a float64 array of its shape and each is
    finite where it counts (the core's minibatches); None when that is not so plainly true,
    for the one-at-a-time checks to decide. Accepts only what they accept, with equal arrays.

    Finiteness is one sum per array: a finite sum has no NaN and no infinity among its terms
    (a sum that overflows merely sends finite inputs to the one-at-a-time checks)."""
    if not (type(mask) is np.ndarray and mask.dtype == np.bool_ and mask.ndim == 2
            and mask.shape[0]):
        return None
    shape, n = mask.shape, mask.shape[0]
    if config.needs_reference != (reference is not None):
        return None
    matrices = (current, proximal, behavior) if reference is None else (
        current, proximal, behavior, reference)
    for values in matrices:
        if not (type(values) is np.ndarray and values.dtype == _FLOAT and values.shape == shape):
            return None
    vectors = (advantages,) if staleness is None else (advantages, staleness)
    for values in vectors:
        if not (type(values) is np.ndarray and values.dtype == _FLOAT and values.shape == (n,)):
            return None
    count = int(np.count_nonzero(mask))
    every = count == mask.size
    if every:  # every token valid: the common case, no row to count
        lengths = np.full(n, shape[1], dtype=np.intp)
    else:
        lengths = mask.sum(axis=1)
        if not lengths.all():
            return None
    mean_staleness = 0.0
    with np.errstate(over="ignore", invalid="ignore"):  # such sums are only looked at
        total = float(np.add.reduce(advantages))
        for values in matrices:
            total += float(np.add.reduce(values, axis=None) if every
                           else np.add.reduce(values, axis=None, where=mask))
        if staleness is not None:
            if not staleness.min() >= 0.0:
                return None
            staleness_sum = float(np.add.reduce(staleness))
            total += staleness_sum
            mean_staleness = staleness_sum / n  # what `staleness.mean()` computes
    if not math.isfinite(total):
        return None
    dense = every and all(values.flags.c_contiguous for values in (mask, *matrices))
    return _objective_inputs(config, mask, advantages, current, proximal, behavior, reference,
                             lengths, count, mean_staleness, dense)


_FLOAT = np.dtype(np.float64)


def _check_mask(mask: np.ndarray) -> np.ndarray:
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        raise ValueError(f"mask: expected a bool array, got dtype {mask.dtype}")
    if mask.ndim != 2:
        raise ValueError(f"mask: expected shape (n, T), got {mask.shape}")
    if mask.shape[0] == 0:
        raise ValueError("mask: no responses (the mean over responses is undefined)")
    empty = np.flatnonzero(~mask.any(axis=1))
    if empty.size:
        raise ValueError(
            f"mask: responses {empty.tolist()} have no valid token (their mean is undefined)"
        )
    return mask


def _check_array(
    name: str, values: np.ndarray, shape: tuple[int, ...], valid: np.ndarray
) -> np.ndarray:
    try:
        values = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name}: not convertible to a float64 array ({error})") from None
    if values.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {values.shape}")
    if not np.all(np.isfinite(values[valid])):
        raise ValueError(f"{name}: non-finite value at a valid position")
    return values
