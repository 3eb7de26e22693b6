"""A diverged policy (finite log-probs whose ratios overflow) is refused, naming the update, the
step and the ratio, never turned into a non-finite cotangent (unchecked, proximal log-probs
of -800 give NaN cotangents, current ones of -800 with a KL term -inf)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.core_driver import Driver, small_config
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
