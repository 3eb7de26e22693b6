"""A diverged policy (finite log-probs whose ratios overflow) is refused, naming the update, the
step and the ratio, never turned into a non-finite cotangent (unchecked, proximal log-probs
of -800 give NaN cotangents, current ones of -800 with a KL term -inf)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.core_driver import AnsweringWith, Driver, commands_of, small_config
from invar.model import (
    LearnerPhase,
    ObjectiveConfig,
    ProtocolError,
    Reason,
    outstanding_commands,
    run_complete,
    schedule,
    step,
)
from invar.model.messages import ApplyCotangent, ForwardObserved, ProbabilitiesReported
from invar.model.objective import AGGREGATIONS, LOSSES
from invar.model.ragged import Ragged
from invar.testing import reply

PLAIN = small_config()
WITH_KL = small_config(objective=ObjectiveConfig(kl_coef=0.1))


def learner_reply(d: Driver):
    (command,) = [c for c in outstanding_commands(d.state) if hasattr(c, "attempt")]
    return reply(command, d.config.optimizer_steps)


def shifted(matrix: Ragged, to: float | None = None, by: float = 0.0) -> Ragged:
    """Every value set to `to` (or moved by `by`), still a log-probability."""
    values = np.full_like(matrix.values, to) if to is not None else matrix.values + by
    return Ragged(np.minimum(values, 0.0), matrix.lengths)


def scored(d: Driver, **changes: Ragged | None) -> None:
    """Pumped to the learner's scores, which are accepted with `changes`."""
    d.pump_to_phase(LearnerPhase.SCORING)
    scores = learner_reply(d)
    assert isinstance(scores, ProbabilitiesReported)
    d.apply(replace(scores, **changes))
    d.pump_to_phase(LearnerPhase.FORWARD)


def test_proximal_far_below_the_current_policy_is_refused_naming_the_ratio():
    d = Driver(PLAIN)
    d.pump_to_phase(LearnerPhase.SCORING)
    scores = learner_reply(d)
    scored(d, proximal=shifted(scores.proximal, to=-800.0))
    forward = learner_reply(d)
    outcome = step(d.state, forward)
    assert isinstance(outcome, ProtocolError), outcome
    assert outcome.reason is Reason.DIVERGED and outcome.state is d.state
    assert outcome.detail.startswith("update 0 step 0: the ratio exp(current - proximal) "
                                     "overflows"), outcome.detail
    assert "proximal -800.0" in outcome.detail and "the policy diverged" in outcome.detail


def test_current_far_below_the_reference_is_refused_then_the_run_goes_on():
    d = Driver(WITH_KL)
    d.pump_to_phase(LearnerPhase.FORWARD)
    forward = learner_reply(d)
    diverged = replace(forward, current_logprobs=shifted(forward.current_logprobs, to=-800.0))
    outcome = step(d.state, diverged)
    assert isinstance(outcome, ProtocolError) and outcome.reason is Reason.DIVERGED, outcome
    assert "exp(reference - current) of the KL term overflows" in outcome.detail
    assert "current -800.0" in outcome.detail
    d.apply(forward)  # the refusal changed nothing: the learner's real forward is taken
    d.pump()
    assert run_complete(d.state)


def test_current_far_below_without_a_kl_term_is_finite():
    """The ratio exp(current - proximal) underflows to 0, which the math allows: accepted."""
    d = Driver(PLAIN)
    d.pump_to_phase(LearnerPhase.FORWARD)
    forward = learner_reply(d)
    low = replace(forward, current_logprobs=shifted(forward.current_logprobs, to=-800.0))
    _, commands = step(d.state, low)
    (cotangent,) = [c for c in commands if isinstance(c, ApplyCotangent)]
    assert np.isfinite(cotangent.cotangent.values).all()
    assert all(map(math.isfinite, (cotangent.terms.loss, cotangent.terms.mean_ratio)))


GAPS = st.sampled_from([0.0, -5.0, -50.0, -700.0, -710.0, -800.0, -1e300])


@settings(max_examples=60, deadline=None)
@given(loss=st.sampled_from(["decoupled_ppo", "behavior_ppo", "unclipped_is"]),
       proximal=GAPS, reference=GAPS, current=GAPS, behavior_cap=st.sampled_from([1.0, 5.0]))
def test_step_never_emits_a_non_finite_cotangent(loss, proximal, reference, current,
                                                 behavior_cap):
    """Log-prob gaps up to -800 (and beyond) in the proximal, reference and current
    log-probs: every cotangent sent is finite, with finite terms, or the forward is refused as
    a divergence."""
    config = small_config(objective=ObjectiveConfig(loss=loss, kl_coef=0.1,
                                                    behavior_weight_cap=behavior_cap))
    d = Driver(config)
    d.pump_to_phase(LearnerPhase.SCORING)
    scores = learner_reply(d)
    scored(d, proximal=shifted(scores.proximal, by=proximal),
           reference=shifted(scores.reference, by=reference))
    forward = learner_reply(d)
    assert isinstance(forward, ForwardObserved)
    outcome = step(d.state, replace(forward, current_logprobs=shifted(
        forward.current_logprobs, by=current)))
    if isinstance(outcome, ProtocolError):
        assert outcome.reason is Reason.DIVERGED, outcome
        return
    for command in outcome[1]:
        if isinstance(command, ApplyCotangent):
            assert np.isfinite(command.cotangent.values).all(), command
            terms = command.terms
            assert all(map(math.isfinite, (terms.loss, terms.clip_fraction, terms.mean_ratio,
                                           terms.mean_behavior_weight, terms.kl))), terms


def test_the_refusal_names_the_request_whose_ratio_overflowed():
    d = Driver(PLAIN)
    d.pump_to_phase(LearnerPhase.SCORING)
    scores = learner_reply(d)
    position = schedule.minibatch_plan(PLAIN, 0)[0][-1]  # the last sample of step 0
    rows = list(scores.proximal.rows())
    rows[position] = (-800.0,) * len(rows[position])  # scores come in request id order
    scored(d, proximal=Ragged.of(rows))
    outcome = step(d.state, learner_reply(d))
    assert isinstance(outcome, ProtocolError) and outcome.reason is Reason.DIVERGED, outcome
    request = schedule.request_ids(PLAIN, 0)[position]
    assert f"at request {tuple(request)}, token 0" in outcome.detail, outcome.detail


EXTREME_LOGPROBS = (0.0, -1e-300, -0.5, -5.0, -700.0, -710.0, -800.0, -1e300, -1e308)
REWARD_SCALES = (1.0, 5e-324, 1e300, 1e308, -1e308)


class _ExtremeValues:
    """Each role's log-probs one value (`logprobs[role]`) at every token, one token more for
    each sample; rewards `scale` for odd samples, else 0 (advantages of either sign)."""

    def __init__(self, logprobs: dict[str, float], scale: float) -> None:
        self.logprobs, self.scale = logprobs, scale

    def length(self, request) -> int:
        return 1 + request.sample

    def _row(self, role: str, request) -> tuple[float, ...]:
        return (self.logprobs[role],) * self.length(request)

    def behavior(self, request) -> tuple[float, ...]:
        return self._row("behavior", request)

    def proximal(self, request, update) -> tuple[float, ...]:
        return self._row("proximal", request)

    def reference(self, request) -> tuple[float, ...]:
        return self._row("reference", request)

    def current(self, request, update, step) -> tuple[float, ...]:
        return self._row("current", request)

    def reward(self, request) -> float:
        return self.scale * (request.sample % 2)


LARGE = (1e-300, 0.28, 1.0, 1e10, 1e300, 1e308)
ROLES = ("behavior", "proximal", "reference", "current")


@settings(max_examples=300, deadline=None)
@given(loss=st.sampled_from(LOSSES), clip_low=st.sampled_from((1e-300, 0.2, 0.999999)),
       clip_high=st.sampled_from(LARGE), cap=st.sampled_from((1.0, 5.0, 1e10, 1e300, 1e308)),
       kl_coef=st.sampled_from((0.0, *LARGE)), normalize=st.booleans(),
       aggregation=st.sampled_from(AGGREGATIONS), optimizer_steps=st.sampled_from((1, 2)),
       logprobs=st.fixed_dictionaries({role: st.sampled_from(EXTREME_LOGPROBS)
                                       for role in ROLES}),
       scale=st.sampled_from(REWARD_SCALES))
def test_no_configuration_makes_the_core_emit_a_non_finite_number(
        loss, clip_low, clip_high, cap, kl_coef, normalize, aggregation, optimizer_steps,
        logprobs, scale):
    """Issue 41: with the valid behavior_weight_cap = clip_high = 1e308 and behaviour
    log-probs of -800, mean_behavior_weight was inf in the ApplyCotangent sent. Over every
    loss and extreme (valid) objective settings, log-probs and rewards: each cotangent sent
    and each of its terms is finite, or the forward is refused as a divergence."""
    config = small_config(optimizer_steps=optimizer_steps, group_size=4, objective=ObjectiveConfig(
        loss=loss, clip_low=clip_low, clip_high=clip_high, behavior_weight_cap=cap,
        kl_coef=kl_coef, normalize_advantages=normalize, aggregation=aggregation)).validate()
    d = AnsweringWith(config)
    d.values = _ExtremeValues(logprobs, scale)
    while (event := d.next_reply()) is not None:
        outcome = d.attempt(event)
        if isinstance(outcome, ProtocolError):
            assert outcome.reason is Reason.DIVERGED, outcome
            return
        d.apply(event)
        for command in commands_of(outcome[1], ApplyCotangent):
            assert np.isfinite(command.cotangent.values).all(), command
            assert all(map(math.isfinite, command.terms.to_dict().values())), command.terms


def test_the_behaviour_weights_of_issue_41_have_a_finite_mean():
    """cap = clip_high = 1e308, behaviour log-probs of -800: every weight is 1e308, their
    mean too (their sum overflowed)."""
    config = small_config(group_size=4, objective=ObjectiveConfig(
        clip_high=1e308, behavior_weight_cap=1e308)).validate()
    d = AnsweringWith(config)
    d.values = _ExtremeValues(dict(behavior=-800.0, proximal=-0.5, reference=-0.5,
                                   current=-0.5), 1.0)
    d.pump()
    (first, *_) = commands_of(d.commands, ApplyCotangent)
    assert first.terms.mean_behavior_weight == pytest.approx(1e308, rel=1e-12)
    assert np.isfinite(first.cotangent.values).all()


def test_rewards_near_the_float_maximum_give_finite_advantages():
    """Their sums overflowed: NaN advantages, and a forward refused as if the policy had
    diverged. The advantages are the same math over the rewards scaled by the largest."""
    from invar.model.objective import group_advantages
    normalised = group_advantages(np.array([1e308, -1e308, 1e308, -1e308, 1.0, 3.0]), 2, True)
    assert np.allclose(normalised, [1.0, -1.0, 1.0, -1.0, -1.0, 1.0], atol=1e-6)
    centred = group_advantages(np.array([1e308, 1e308, 0.0, 0.0]), 4, False)
    assert np.allclose(centred, [5e307, 5e307, -5e307, -5e307])
    # Past the float maximum the centred advantage is infinite; the core refuses that forward.
    past = group_advantages(np.array([1.7e308, 1.7e308, 1.7e308, -1.7e308]), 4, False)
    assert np.allclose(past[:3], 0.85e308) and past[3] == -np.inf  # -2.55e308
