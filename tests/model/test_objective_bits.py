"""The objective gives main 4be12ee's bits: its formula, frozen here, is the reference.

The objective was rewritten for fewer numpy calls per minibatch (the terms that do not depend
on the current policy computed once per batch, the gradient of the clipped branch folded into
the unclipped one's). Journals record every cotangent's digest, so the rewrite must not move a
bit: checked here against the formula as it stood, over inputs built to hit its edges on
purpose: advantages of 0 and -0 (ties of the two branches), ratios exactly on either clip bound
and just beside it, ratios that overflow to inf or underflow to 0, behaviour weights at their
cap, subnormal and huge advantages, ragged masks with junk under them, every layout, every
loss, with and without the KL penalty; and for the core's minibatches, cut from a batch's
inputs (`ObjectiveInputs.rows`), against the same rows padded on their own.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from invar.model.objective import (
    LOSSES,
    ObjectiveConfig,
    ObjectiveTerms,
    checked_objective,
    objective,
    objective_inputs,
    token_share,
)

# ---------------------------------------------------------------------------------------------
# The reference: main 4be12ee's `objective` for inputs it accepts (its checks left out), frozen.
# ---------------------------------------------------------------------------------------------


def _main_objective(config, advantages, current, proximal, behavior, mask, reference=None,
                    staleness=None):
    advantages = np.asarray(advantages, dtype=np.float64)
    current, proximal, behavior = (np.asarray(m, dtype=np.float64)
                                   for m in (current, proximal, behavior))
    reference = None if reference is None else np.asarray(reference, dtype=np.float64)
    matrices = [m for m in (current, proximal, behavior, reference) if m is not None]
    n = mask.shape[0]
    count = int(np.count_nonzero(mask))
    every = count == mask.size
    lengths = mask.sum(axis=1)
    with np.errstate(all="ignore"):
        total = float(np.add.reduce(advantages)) + sum(
            float(np.add.reduce(m, axis=None) if every else np.add.reduce(m, axis=None,
                                                                         where=mask))
            for m in matrices)
        if staleness is not None:
            total += float(np.add.reduce(staleness))
    dense = (math.isfinite(total) and every
             and all(m.flags.c_contiguous for m in (mask, *matrices)))
    mean_staleness = 0.0 if staleness is None else float(staleness.mean())

    def valid(values):
        return values if dense else np.where(mask, values, 0.0)

    def token_mean(values):
        return float(np.add.reduce(valid(values), axis=None) / count)

    weight = np.exp(np.minimum(valid(proximal) - valid(behavior),
                               math.log(config.behavior_weight_cap))) if (
        config.loss == "decoupled_ppo") else None
    share_column = 1.0 / np.multiply(n, lengths)[:, None]

    c = valid(current)
    p = valid(proximal)
    b = valid(behavior)
    minus_A = -advantages[:, None]

    if config.loss == "unclipped_is":
        ratio = np.exp(c - b)
        token_loss = minus_A * ratio
        token_grad = token_loss
        clipped_active = None
    else:
        anchor = b if config.loss == "behavior_ppo" else p
        ratio = np.exp(c - anchor)
        low, high = 1.0 - config.clip_low, 1.0 + config.clip_high
        clipped_ratio = ratio.clip(low, high)
        unclipped = minus_A * ratio
        clipped = minus_A * clipped_ratio
        token_loss = np.maximum(unclipped, clipped)
        d_unclipped = unclipped
        d_clipped = np.where(clipped_ratio == ratio, unclipped, 0.0)
        tie = unclipped == clipped
        clipped_active = clipped > unclipped
        share_unclipped = np.where(tie, 0.5, unclipped > clipped)
        share_clipped = np.where(tie, 0.5, clipped_active)
        token_grad = share_unclipped * d_unclipped + share_clipped * d_clipped
        if weight is not None:
            token_loss = weight * token_loss
            token_grad = weight * token_grad

    if reference is not None:
        log_ref_ratio = valid(reference) - c
        token_kl = np.exp(log_ref_ratio) - log_ref_ratio - 1.0
        token_loss = token_loss + config.kl_coef * token_kl
        token_grad = token_grad + config.kl_coef * (1.0 - np.exp(log_ref_ratio))
        kl = token_mean(token_kl)
    else:
        kl = 0.0

    share = valid(share_column)
    loss = float(np.add.reduce(share * valid(token_loss), axis=None))
    cotangent = valid(share * token_grad)
    terms = ObjectiveTerms(
        loss=loss,
        clip_fraction=0.0 if clipped_active is None else int(np.count_nonzero(
            clipped_active if dense else clipped_active & mask)) / count,
        mean_ratio=token_mean(ratio),
        mean_behavior_weight=1.0 if weight is None else token_mean(weight),
        kl=kl,
        mean_staleness=mean_staleness,
        tokens=count,
    )
    return terms, cotangent


# ---------------------------------------------------------------------------------------------
# Inputs at the edges
# ---------------------------------------------------------------------------------------------

_CLIPS = ((0.2, 0.28), (0.1, 0.1))
_CAPS = (5.0, 1.0)


def _edge_logprobs() -> list[float]:
    """Log-probs whose differences put a ratio exactly on a clip bound (0 minus them, or they
    minus 0, is exact), a weight exactly at its cap, a ratio that overflows or underflows, or
    nothing apart (equal ones): 0 and -0 pair with each."""
    values = [0.0, -0.0, -0.5, -1.0, -3.0, -5e-324, -1e-300, -800.0, -1000.0]
    for clip_low, clip_high in _CLIPS:
        for bound in (math.log(1.0 - clip_low), -math.log(1.0 + clip_high)):
            values += [bound, float(np.nextafter(bound, 0.0)), float(np.nextafter(bound, -1.0))]
    values += [-math.log(cap) for cap in _CAPS if cap > 1.0]
    return values


_EDGES = _edge_logprobs()
_LOGPROBS = st.one_of(st.sampled_from(_EDGES), st.floats(-3.0, 0.0))
_ADVANTAGES = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 5e-324, -5e-324, 1e-300, 1e308, -1e308]),
    st.floats(-3.0, 3.0))
_JUNK = st.sampled_from([math.nan, math.inf, -math.inf, 7.0, -0.0])


def test_the_edges_are_hit():
    """exp of a bound's log is the bound itself: the ratios do land on the clip bounds."""
    for clip_low, clip_high in _CLIPS:
        assert np.exp(math.log(1.0 - clip_low)) == 1.0 - clip_low
        assert np.exp(0.0 - -math.log(1.0 + clip_high)) == 1.0 + clip_high
    with np.errstate(over="ignore"):
        assert np.exp(0.0 - -1000.0) == math.inf and np.exp(-1000.0 - 0.0) == 0.0


@st.composite
def _arguments(draw):
    n, width = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    if draw(st.booleans()):
        mask = np.ones((n, width), dtype=bool)
    else:
        lengths = draw(st.lists(st.integers(1, width), min_size=n, max_size=n))
        mask = np.arange(width) < np.array(lengths)[:, None]

    def matrix():
        values = np.array(draw(st.lists(_LOGPROBS, min_size=n * width, max_size=n * width)),
                          dtype=np.float64).reshape(n, width)
        junk = np.array(draw(st.lists(_JUNK, min_size=n * width, max_size=n * width)),
                        dtype=np.float64).reshape(n, width)
        values = np.where(mask, values, junk)
        form = draw(st.sampled_from(["c", "c", "fortran", "view"]))
        if form == "fortran":
            return np.asfortranarray(values)
        if form == "view":
            wide = np.zeros((n, width + 1))
            wide[:, :width] = values
            return wide[:, :width]
        return values

    clip_low, clip_high = draw(st.sampled_from(_CLIPS))
    config = ObjectiveConfig(loss=draw(st.sampled_from(LOSSES)),
                             kl_coef=draw(st.sampled_from([0.0, 0.05])), clip_low=clip_low,
                             clip_high=clip_high,
                             behavior_weight_cap=draw(st.sampled_from(_CAPS)))
    advantages = np.array(draw(st.lists(_ADVANTAGES, min_size=n, max_size=n)))
    staleness = np.array(draw(st.lists(st.sampled_from([0.0, 1.0, 2.5]), min_size=n,
                                       max_size=n))) if draw(st.booleans()) else None
    return dict(config=config, advantages=advantages, current=matrix(), proximal=matrix(),
                behavior=matrix(), mask=mask,
                reference=matrix() if config.needs_reference else None, staleness=staleness)


def _bits(terms: ObjectiveTerms, cotangent: np.ndarray) -> tuple[str, tuple[int, ...], bytes]:
    return repr(terms), cotangent.shape, np.ascontiguousarray(cotangent).tobytes()


@settings(max_examples=600, deadline=None)
@given(_arguments())
def test_objective_gives_main_bits(arguments):
    with np.errstate(all="ignore"):
        assert _bits(*objective(**arguments)) == _bits(*_main_objective(**arguments))


@settings(max_examples=300, deadline=None)
@given(_arguments(), st.data())
def test_a_minibatch_cut_from_the_batch_gives_main_bits_of_its_rows(arguments, data):
    """The core's way: the batch's inputs zero-padded and built once (`objective_inputs`), a
    step's consecutive rows cut from them (`rows`), against main on those rows padded alone."""
    mask = arguments["mask"]
    n = mask.shape[0]
    start = data.draw(st.integers(0, n - 1))
    stop = data.draw(st.integers(start + 1, n))
    lengths = mask.sum(axis=1)
    width = int(lengths[start:stop].max())
    config = arguments["config"]

    def padded(values):
        return None if values is None else np.where(mask, values, 0.0)

    batch = objective_inputs(
        config, arguments["advantages"], padded(arguments["proximal"]),
        padded(arguments["behavior"]), padded(arguments["reference"]),
        None if mask.all() else mask, token_share(stop - start, lengths),
        mean_staleness=0.0)
    rows = slice(start, stop)
    with np.errstate(all="ignore"):
        terms, cotangent = checked_objective(config, batch.rows(rows, width),
                                             padded(arguments["current"])[rows, :width])
        expected = _main_objective(
            config, arguments["advantages"][rows],
            *(padded(arguments[name])[rows, :width] for name in ("current", "proximal",
                                                                "behavior")),
            mask[rows, :width], reference=None if arguments["reference"] is None else
            padded(arguments["reference"])[rows, :width])
    cut = mask[rows, :width]
    assert repr(terms) == repr(expected[0])
    assert cotangent[cut].tobytes() == expected[1][cut].tobytes()


def test_every_pair_of_edges_gives_main_bits():
    """Every log-prob edge against every other, for every advantage edge, in one grid."""
    edges = np.array(_EDGES)
    advantages = np.array([0.0, -0.0, 1.0, -1.0, 5e-324, -5e-324, 1e308, -1e308])
    c, p = np.meshgrid(edges, edges, indexing="ij")
    c, p = c.reshape(-1), p.reshape(-1)
    current = np.tile(c, (len(advantages), 1))
    proximal = np.tile(p, (len(advantages), 1))
    behavior = np.tile(np.roll(p, 7), (len(advantages), 1))
    reference = np.tile(np.roll(c, 3), (len(advantages), 1))
    mask = np.ones(current.shape, dtype=bool)
    for loss in LOSSES:
        for kl_coef in (0.0, 0.05):
            for clip_low, clip_high in _CLIPS:
                config = ObjectiveConfig(loss=loss, kl_coef=kl_coef, clip_low=clip_low,
                                         clip_high=clip_high)
                arguments = dict(config=config, advantages=advantages, current=current,
                                 proximal=proximal, behavior=behavior, mask=mask,
                                 reference=reference if kl_coef else None)
                with np.errstate(all="ignore"):
                    assert _bits(*objective(**arguments)) == _bits(
                        *_main_objective(**arguments)), (loss, kl_coef, clip_low)
