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

Aggregation (`ObjectiveConfig.aggregation`), over a response's valid tokens: those up to and
including its first EOS, never any after it.

    "sequence_mean"  GRPO (Shao et al. 2024, Eq. 3): average over each response's tokens,
                     then over responses, so a response weighs 1/n whatever its length:
                         L = 1/n sum_i 1/|o_i| sum_{t in o_i} l_t
    "token_mean"     DAPO's token-level loss (Yu et al. 2025, Eq. 12): one average over every
                     token of the minibatch, so a long response weighs more than a short one:
                         L = 1/(sum_i |o_i|) sum_i sum_{t in o_i} l_t

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
AGGREGATIONS: tuple[str, ...] = ("sequence_mean", "token_mean")


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
        aggregation: one of `AGGREGATIONS`: "sequence_mean" (GRPO: each response's tokens
            averaged, then the responses; the default) or "token_mean" (DAPO: one average
            over every token of the minibatch).
    """

    loss: str = "decoupled_ppo"
    clip_low: float = 0.2
    clip_high: float = 0.28
    behavior_weight_cap: float = 5.0
    kl_coef: float = 0.0
    normalize_advantages: bool = True
    aggregation: str = "sequence_mean"

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
        if not isinstance(self.aggregation, str) or self.aggregation not in AGGREGATIONS:
            refuse("aggregation", f"must be one of {AGGREGATIONS}, got {self.aggregation!r}")
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

    groups = rewards.reshape(-1, group_size)
    if not np.abs(groups).max(initial=0.0) > math.sqrt(_FLOAT_MAX / (4 * group_size)):
        centred = _centred(groups, normalize, eps)
    else:
        # Rewards this large can overflow the sums (of G squares of differences up to twice
        # the largest): the same advantages from the rewards over their group's largest
        # magnitude (a normalised advantage does not change with the scale; a centred one is
        # scaled back, infinite only where its true value is past the float maximum).
        scale = np.max(np.abs(groups), axis=1, keepdims=True)
        scale = np.where(scale > 0.0, scale, 1.0)
        centred = _centred(groups / scale, normalize, eps / scale)
        if not normalize:
            with np.errstate(over="ignore"):
                centred = centred * scale
    # Exact zeros for constant groups: the float mean of equal values need not equal them.
    constant = np.logical_and.reduce(groups == groups[:, :1], axis=1, keepdims=True)
    advantages = np.where(constant, 0.0, centred)
    return advantages.reshape(-1)


_FLOAT_MAX = float(np.finfo(np.float64).max)


def _centred(groups: np.ndarray, normalize: bool, eps: float | np.ndarray) -> np.ndarray:
    """R_i - mean(R_g), over std(R_g) + eps when `normalize`, of each group (a row)."""
    # Sums along each group, as `mean` and `std` compute them (without their Python wrappers).
    size = groups.shape[1]
    centred: np.ndarray = groups - np.add.reduce(groups, axis=1, keepdims=True) / size
    if normalize:
        # The population std (ddof=0): sqrt(mean((R_i - mean(R_g))^2)).
        group_std = np.sqrt(np.add.reduce(np.square(centred), axis=1, keepdims=True) / size)
        centred = centred / (group_std + eps)
    return centred


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
    inputs, current = _checked_inputs(config, advantages, current, proximal, behavior, mask,
                                      reference, staleness)
    return checked_objective(config, inputs, current)


def behavior_weight(config: ObjectiveConfig, proximal: np.ndarray,
                    behavior: np.ndarray) -> np.ndarray:
    """w_t = min(exp(p_t - b_t), cap) of "decoupled_ppo" (AReaL Eq. 5): corrects the
    proximal/behaviour mismatch; capped via the log, so it cannot overflow. It does not depend
    on the current policy: the minibatches of an update may share one computed for the batch."""
    weight: np.ndarray = np.exp(np.minimum(proximal - behavior,
                                           math.log(config.behavior_weight_cap)))
    return weight


def token_share(responses: int | np.ndarray, lengths: np.ndarray | int,
                aggregation: str = "sequence_mean",
                tokens: int | np.ndarray | None = None) -> np.ndarray:
    """The weight of each token of response i in L, as an (n, 1) column: 1 / (n |o_i|) for
    "sequence_mean" (`responses` is n, the responses averaged over, or each response's n, and
    `lengths` each response's |o_i|, or their one length); 1 / sum_j |o_j| for "token_mean"
    (`tokens`: the valid tokens averaged over, or each response's count of them)."""
    if aggregation == "token_mean":
        assert tokens is not None, "token_mean needs the tokens averaged over"
        shape = np.shape(np.multiply(responses, lengths))
        count: np.ndarray = np.broadcast_to(np.asarray(tokens, dtype=np.float64), shape)
        return 1.0 / count[:, None]
    weights: np.ndarray = np.multiply(responses, lengths)  # n |o_i|, exact in integers
    return 1.0 / weights[:, None]


def checked_objective(config: ObjectiveConfig, inputs: ObjectiveInputs,
                      current: np.ndarray) -> tuple[ObjectiveTerms, np.ndarray]:
    """`objective` of inputs already checked (`ObjectiveInputs`) and the current log-probs c,
    an (n, T) float64 array that is 0.0 at the invalid positions, as the inputs are: so is
    every term below (a token that is not there has ratio 1, advantage 0 and share 0), and
    nothing is masked but the ratios' mean."""
    minus_A = inputs.minus_advantage

    if config.loss == "unclipped_is":
        ratio = np.exp(current - inputs.behavior)
        token_loss = minus_A * ratio
        token_grad = token_loss  # d(-A exp(c - b)) / dc = -A exp(c - b)
        clipped_tokens = 0
    else:
        # plain PPO: the behaviour policy is the trust-region centre; decoupled: the proximal
        # one, and w (`behavior_weight`) corrects the proximal/behaviour mismatch.
        anchor = inputs.behavior if config.loss == "behavior_ppo" else inputs.proximal
        assert anchor is not None, "the proximal log-probs are supplied before the objective"
        ratio = np.exp(current - anchor)
        # ratio.clip(low, high) (ratio is never NaN), without the Python wrapper of `clip`.
        clipped_ratio = np.minimum(np.maximum(ratio, 1.0 - config.clip_low),
                                   1.0 + config.clip_high)
        unclipped = minus_A * ratio
        clipped = minus_A * clipped_ratio
        token_loss = np.maximum(unclipped, clipped)

        # torch.maximum: the gradient goes to the larger argument, split evenly on a tie.
        share_unclipped = np.where(unclipped == clipped, 0.5, unclipped > clipped)
        # d unclipped / dc = -A r;  d clipped / dc = -A r where the clip leaves r as it is
        # (torch.clamp: on [low, high]), else 0. Where it leaves r, clipped == unclipped: a
        # tie, whose two halves are equal; elsewhere the clipped branch adds 0.
        unclipped_part = share_unclipped * unclipped
        token_grad = unclipped_part + np.where(clipped_ratio == ratio, unclipped_part, 0.0)
        clipped_tokens = int(np.count_nonzero(clipped > unclipped))
        if inputs.weight is not None:
            token_loss = inputs.weight * token_loss
            token_grad = inputs.weight * token_grad

    tokens = inputs.tokens
    if inputs.reference is not None:  # checked: present iff config.needs_reference
        log_ref_ratio = inputs.reference - current
        ref_ratio = np.exp(log_ref_ratio)
        token_kl = ref_ratio - log_ref_ratio - 1.0  # k3: >= 0 at every token
        token_loss = token_loss + config.kl_coef * token_kl
        token_grad = token_grad + config.kl_coef * (1.0 - ref_ratio)
        kl = float(np.add.reduce(token_kl, axis=None) / tokens)
    else:
        kl = 0.0

    # L = 1/n sum_i 1/|o_i| sum_t l_t: each token weighs 1 / (n |o_i|).
    share = inputs.token_share
    loss = float(np.add.reduce(share * token_loss, axis=None))
    cotangent = share * token_grad

    valid_ratio = ratio if inputs.mask is None else np.where(inputs.mask, ratio, 0.0)
    terms = ObjectiveTerms(
        loss=loss,
        clip_fraction=clipped_tokens / tokens,
        mean_ratio=float(np.add.reduce(valid_ratio, axis=None) / tokens),
        mean_behavior_weight=inputs.mean_behavior_weight,
        kl=kl,
        mean_staleness=inputs.mean_staleness,
        tokens=tokens,
    )
    return terms, cotangent


class ObjectiveInputs(NamedTuple):
    """`objective`'s inputs other than the current policy, once checked, with the terms that do
    not depend on it, each computed once (the minibatches of an update share them: the core
    builds every step's inputs when the batch is scored, and checks each forward's log-probs
    as they come). Every array is (n, T) float64, C-ordered (the sums then add in the order
    masking gives), and 0.0 at the invalid positions."""

    proximal: np.ndarray | None
    """None until `with_proximal` supplies it: an update that does not score its batch
    (`RunConfig.scores_batch`) takes each step's from that step's forward."""
    behavior: np.ndarray
    reference: np.ndarray | None
    """None without the KL penalty."""
    minus_advantage: np.ndarray
    """-A_i at each token of response i."""
    weight: np.ndarray | None
    """`behavior_weight` of the proximal and behaviour log-probs ("decoupled_ppo"; None for
    the other losses, whose weight is 1)."""
    token_share: np.ndarray
    """`token_share` of each token's response, 1 / (n |o_i|), |o_i| its valid tokens."""
    mask: np.ndarray | None
    """The valid tokens; None when every token is valid."""
    tokens: int
    """Valid tokens in all."""
    mean_behavior_weight: float
    """The mean of `weight` over the valid tokens (1.0 without one)."""
    mean_staleness: float

    def rows(self, rows: slice, width: int) -> ObjectiveInputs:
        """The inputs of the responses `rows` alone, cut to `width` tokens, the longest of them:
        the arrays their log-probs padded on their own give (the core's minibatches)."""
        whole = width == self.behavior.shape[1]  # then the rows are C-ordered as they lie

        def cut(values: np.ndarray) -> np.ndarray:
            return values[rows] if whole else np.ascontiguousarray(values[rows, :width])

        mask = None if self.mask is None else cut(self.mask)
        if mask is not None and mask.all():
            mask = None
        weight = None if self.weight is None else cut(self.weight)
        behavior = cut(self.behavior)
        return ObjectiveInputs(
            None if self.proximal is None else cut(self.proximal), behavior,
            None if self.reference is None else cut(self.reference),
            cut(self.minus_advantage), weight, cut(self.token_share), mask,
            *_tokens_and_mean_weight(weight, mask, behavior.size), self.mean_staleness)

    def with_proximal(self, config: ObjectiveConfig, proximal: np.ndarray) -> ObjectiveInputs:
        """These inputs with the proximal log-probs p (checked, 0.0 at the invalid positions)
        and the behaviour weight they give. An update of one optimizer step passes its
        forward's current log-probs: the proximal policy is then the current one, so
        r_t = exp(c_t - p_t) = 1 and w_t = min(exp(c_t - b_t), cap), constants as ever."""
        weight = behavior_weight(config, proximal, self.behavior) if (
            config.loss == "decoupled_ppo") else None
        if weight is not None and self.mask is not None:
            weight = np.where(self.mask, weight, 0.0)
        tokens, mean_weight = _tokens_and_mean_weight(weight, self.mask, proximal.size)
        return self._replace(proximal=proximal, weight=weight, tokens=tokens,
                             mean_behavior_weight=mean_weight)


def objective_inputs(config: ObjectiveConfig, advantages: np.ndarray,
                     proximal: np.ndarray | None, behavior: np.ndarray,
                     reference: np.ndarray | None, mask: np.ndarray | None, share: np.ndarray,
                     mean_staleness: float) -> ObjectiveInputs:
    """The `ObjectiveInputs` of checked, C-ordered (n, T) log-probs that are 0.0 at the
    invalid positions (`mask`; None when every position is valid), the responses' advantages
    (n,) and their `token_share` (n, 1); `proximal` None leaves it to `with_proximal`."""
    width = behavior.shape[1]
    inputs = ObjectiveInputs(None, behavior, reference,
                             _per_token(-advantages[:, None], mask, width), None,
                             _per_token(share, mask, width), mask,
                             *_tokens_and_mean_weight(None, mask, behavior.size), mean_staleness)
    return inputs if proximal is None else inputs.with_proximal(config, proximal)


def _per_token(column: np.ndarray, mask: np.ndarray | None, width: int) -> np.ndarray:
    """An (n, 1) column's value at each of its response's `width` tokens, 0.0 at the invalid
    ones."""
    return column.repeat(width, axis=1) if mask is None else np.where(mask, column, 0.0)


def _tokens_and_mean_weight(weight: np.ndarray | None, mask: np.ndarray | None,
                            size: int) -> tuple[int, float]:
    """The valid tokens (all `size` of them, when there is no mask) and the mean behaviour
    weight over them."""
    tokens = size if mask is None else int(np.count_nonzero(mask))
    if weight is None:
        return tokens, 1.0
    with np.errstate(over="ignore"):
        mean_weight = float(np.add.reduce(weight, axis=None) / tokens)
    if not math.isfinite(mean_weight):
        # Weights near the float maximum (a cap as large) overflow their sum: the mean of the
        # weights over the largest, times it, is at most the largest, as a mean is.
        largest = float(weight.max())
        mean_weight = min(largest * float(np.add.reduce(weight / largest, axis=None) / tokens),
                          largest)
    return tokens, mean_weight


def _checked_inputs(
    config: ObjectiveConfig,
    advantages: np.ndarray,
    current: np.ndarray,
    proximal: np.ndarray,
    behavior: np.ndarray,
    mask: np.ndarray,
    reference: np.ndarray | None,
    staleness: np.ndarray | None,
) -> tuple[ObjectiveInputs, np.ndarray]:
    """`objective`'s inputs and current log-probs, each refused by name when it is not a
    float64 array of the mask's shape, finite at the valid positions: kept apart so that the
    objective reads as the math.

    Inputs that are already such arrays pass in a few passes over all of them together
    (`_dense_inputs`); anything else, and any fault, goes through the checks one input at a
    time, which name the first input at fault."""
    if not _VALIDATED.lookup(config):
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
    return _objective_inputs(config, mask, advantages, current, proximal, behavior, reference,
                             mask.sum(axis=1), mean_staleness, dense=False)


def _objective_inputs(config: ObjectiveConfig, mask: np.ndarray, advantages: np.ndarray,
                      current: np.ndarray, proximal: np.ndarray, behavior: np.ndarray,
                      reference: np.ndarray | None, lengths: np.ndarray, mean_staleness: float,
                      dense: bool) -> tuple[ObjectiveInputs, np.ndarray]:
    """Checked inputs as `objective_inputs` takes them: a dense batch (every token valid,
    every array C-ordered) as it is, any other with its invalid positions set to 0.0."""
    valid: np.ndarray | None = None
    if not dense:
        current, proximal, behavior = (np.where(mask, values, 0.0)
                                       for values in (current, proximal, behavior))
        if reference is not None:
            reference = np.where(mask, reference, 0.0)
        valid = None if lengths.sum() == mask.size else mask
    share = token_share(lengths.shape[0], lengths, config.aggregation, int(lengths.sum()))
    return objective_inputs(config, advantages, proximal, behavior, reference, valid, share,
                            mean_staleness), current


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
) -> tuple[ObjectiveInputs, np.ndarray] | None:
    """The checked inputs when each is already a float64 array of its shape and each is
    finite where it counts; None when that is not so plainly true, for the one-at-a-time
    checks to decide. Accepts only what they accept, with equal arrays.

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
                             lengths, mean_staleness, dense)


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
