"""Refused events: each ProtocolError reason from a minimal scenario, the refusal leaving the
state untouched and usable, and the harmless cases (duplicates, late replies) counted as
no-ops instead of refused."""

from __future__ import annotations

import math
import pickle
from dataclasses import fields, replace

import numpy as np
import pytest

from helpers.core_driver import Driver, small_config
from invar.model import (
    LearnerPhase,
    ObjectiveConfig,
    ProtocolError,
    Reason,
    initial_state,
    logical_projection,
    outstanding_commands,
    run_complete,
    step,
    violations,
)
from invar.model.messages import (
    Checkpoint,
    CheckpointWritten,
    Completions,
    Evaluate,
    ForwardObserved,
    LaunchRequest,
    LearnerStarted,
    LoadWeights,
    ObservationId,
    ProbabilitiesReported,
    RequestsCompleted,
    RunForward,
    ScoreProbabilities,
    StepFinished,
    TimerFired,
    UpdateCommitted,
    VersionEvaluated,
    VersionPublished,
    WeightsLoaded,
    WorkerConnected,
    WorkerLost,
)
from invar.model.ragged import INT, Ragged
from invar.model.schedule import RequestId
from invar.model.shell import Verdict, deliver
from invar.model.state import Sample, completions_of
from invar.testing import canonical_run, reply, version_digest

CONFIG = small_config()  # B=2, G=2, S=1, P=1, K=2, N=3
K = CONFIG.optimizer_steps


def learner_reply(d: Driver):
    """The correct reply to the learner command now outstanding."""
    (command,) = [c for c in outstanding_commands(d.state) if hasattr(c, "attempt")]
    return reply(command, K)


def first_completion(d: Driver) -> RequestsCompleted:
    launch = d.pump_until_command(lambda c: isinstance(c, LaunchRequest))
    return reply(launch, K)


def changed(frame: RequestsCompleted, **changes) -> RequestsCompleted:
    """`frame` with its first completion changed."""
    first = replace(frame.completions[0], **changes)
    return replace(frame, completions=Completions.of((first, *frame.completions[1:])))


def at_phase(d: Driver, phase: LearnerPhase, step_index: int | None = None) -> Driver:
    d.pump_to_phase(phase, step_index)
    return d


# ---------------------------------------------------------------------------------------------
# Scenarios: each takes a fresh driver, advances it, and returns the event to refuse.


def wrong_version(d):
    good = first_completion(d)
    return changed(good, version=good.completions[0].version + 1)


def unknown_batch(d):
    good = first_completion(d)
    return changed(good, request=RequestId(d.state.admitted + 3, 0, 0))


def unknown_prompt(d):
    good = first_completion(d)
    return changed(good, request=RequestId(0, CONFIG.prompts_per_batch, 0))


def unknown_sample(d):
    good = first_completion(d)
    return changed(good, request=RequestId(0, 0, -1))


def positive_logprob(d):
    good = first_completion(d)
    return changed(good, behavior_logprobs=(0.5,) + good.completions[0].behavior_logprobs[1:])


def nan_logprob(d):
    good = first_completion(d)
    return changed(good, behavior_logprobs=(math.nan,) + good.completions[0].behavior_logprobs[1:])


def infinite_logprob_after_the_first(d):
    """-inf (and a NaN after the first value) passes `max(...) <= 0`: only the sum sees it."""
    good = first_completion(d)
    row = good.completions[0].behavior_logprobs
    return changed(good, behavior_logprobs=row[:1] + (-math.inf,) + row[2:])


def nan_logprob_after_the_first(d):
    good = first_completion(d)
    row = good.completions[0].behavior_logprobs
    return changed(good, behavior_logprobs=row[:1] + (math.nan,) + row[2:])


def length_mismatch(d):
    good = first_completion(d)
    return changed(good, behavior_logprobs=good.completions[0].behavior_logprobs + (-1.0,))


def empty_response(d):
    good = first_completion(d)
    return changed(good, tokens=(), behavior_logprobs=())


def negative_token(d):
    """(A token of 2**63 or more does not fit the int64 column: `Completions.of` and the wire
    refuse it before the core sees it.)"""
    good = first_completion(d)
    return changed(good, tokens=(-1,) + good.completions[0].tokens[1:])


def infinite_reward(d):
    good = first_completion(d)
    return changed(good, reward=math.inf)


def empty_frame(d):
    return replace(first_completion(d), completions=Completions.of(()))


def good_then_unknown(d):
    """A frame is judged whole: its good first completion does not carry in a bad second."""
    good = first_completion(d)
    bad = replace(good.completions[0], request=RequestId(0, CONFIG.prompts_per_batch, 0))
    return replace(good, completions=Completions.of((*good.completions, bad)))


def scores_wrong_rows(d):
    at_phase(d, LearnerPhase.SCORING)
    good = learner_reply(d)
    return replace(good, proximal=good.proximal.take(range(len(good.proximal) - 1)))


def scores_positive(d):
    at_phase(d, LearnerPhase.SCORING)
    good = learner_reply(d)
    rows = good.proximal.rows()
    return replace(good, proximal=Ragged.of(((0.1,) * len(rows[0]),) + rows[1:]))


def scores_infinite_in_the_last_row(d):
    at_phase(d, LearnerPhase.SCORING)
    good = learner_reply(d)
    rows = good.proximal.rows()
    return replace(good, proximal=Ragged.of(rows[:-1] + ((-math.inf,) + rows[-1][1:],)))


def scores_as_rows_of_floats(d):
    """A hand-built event's rows of Python floats are not a matrix (`Ragged.of` makes one)."""
    at_phase(d, LearnerPhase.SCORING)
    good = learner_reply(d)
    return replace(good, proximal=good.proximal.rows())


def scores_of_integers(d):
    at_phase(d, LearnerPhase.SCORING)
    good = learner_reply(d)
    lengths = good.proximal.lengths
    return replace(good, proximal=Ragged(np.zeros(sum(lengths), dtype=INT), lengths))


def scores_unrequested_reference(d):
    at_phase(d, LearnerPhase.SCORING)
    good = learner_reply(d)
    return replace(good, reference=good.proximal)


def forward_row_length(d):
    at_phase(d, LearnerPhase.FORWARD)
    good = learner_reply(d)
    rows = good.current_logprobs.rows()
    return replace(good, current_logprobs=Ragged.of(((-0.5,),) + rows[1:]))


def forward_nan(d):
    at_phase(d, LearnerPhase.FORWARD)
    good = learner_reply(d)
    rows = good.current_logprobs.rows()
    return replace(good, current_logprobs=Ragged.of(((math.nan,) + rows[0][1:],) + rows[1:]))


def forward_infinite_in_the_last_row(d):
    at_phase(d, LearnerPhase.FORWARD)
    good = learner_reply(d)
    rows = good.current_logprobs.rows()
    return replace(good, current_logprobs=Ragged.of(rows[:-1] + (rows[-1][:-1] + (math.inf,),)))


def forward_wrong_rows(d):
    at_phase(d, LearnerPhase.FORWARD)
    good = learner_reply(d)
    current = good.current_logprobs
    return replace(good, current_logprobs=current.take([*range(len(current)), 0]))


def forward_as_rows_of_floats(d):
    at_phase(d, LearnerPhase.FORWARD)
    good = learner_reply(d)
    return replace(good, current_logprobs=good.current_logprobs.rows())


def observation_from_the_future(d):
    at_phase(d, LearnerPhase.FORWARD)
    good = learner_reply(d)
    obs = good.observation
    return replace(good, observation=ObservationId(obs.update, obs.step,
                                                   d.state.learner.observations + 3))


def observation_while_waiting(d):
    return ForwardObserved(ObservationId(0, 0, 0), 0, version_digest(0),
                           Ragged.of(((-0.5, -0.5),)))


def observation_of_wrong_step(d):
    at_phase(d, LearnerPhase.FORWARD, 0)
    good = learner_reply(d)
    obs = good.observation
    return replace(good, observation=ObservationId(obs.update, obs.step + 1, obs.serial))


def step_finished_before_cotangent(d):
    at_phase(d, LearnerPhase.FORWARD)
    return StepFinished(d.state.learner.observation, d.state.learner.attempt, "w0.1")


def step_finished_future_attempt(d):
    at_phase(d, LearnerPhase.APPLYING)
    good = learner_reply(d)
    return replace(good, attempt=good.attempt + 1)


def binding_mismatch(d):
    at_phase(d, LearnerPhase.FORWARD, 1)
    return replace(learner_reply(d), pre_step_digest="w0")  # the pre-step-0 state


def commit_while_forward(d):
    at_phase(d, LearnerPhase.FORWARD)
    return UpdateCommitted(d.state.committed, version_digest(d.state.committed + 1))


def commit_while_waiting(d):
    return UpdateCommitted(0, version_digest(1))


def commit_of_future_update(d):
    at_phase(d, LearnerPhase.COMMITTING)
    return UpdateCommitted(d.state.committed + 1, version_digest(d.state.committed + 2))


def commit_wrong_digest(d):
    at_phase(d, LearnerPhase.COMMITTING)
    return UpdateCommitted(d.state.committed, "not-what-the-last-step-produced")


def restart_wrong_digest(d):
    at_phase(d, LearnerPhase.FORWARD)
    d.learner_attempt += 1
    return LearnerStarted(d.learner_attempt, d.state.committed, "corrupted")


def restart_after_commit_wrong_digest(d):
    at_phase(d, LearnerPhase.COMMITTING)
    d.learner_attempt += 1
    return LearnerStarted(d.learner_attempt, d.state.committed + 1, "not-the-update's-end")


def publish_unrequested(d):
    d.pump(lambda d: d.state.committed == 1 and d.state.publishing is None)
    return VersionPublished(d.state.committed + 1, version_digest(d.state.committed + 1))


def publish_wrong_digest(d):
    publish = d.pump_until_command(lambda c: type(c).__name__ == "Publish" and c.version == 1)
    return VersionPublished(publish.version, "other-weights")


def publish_uncommitted(d):
    return VersionPublished(2, version_digest(2))


def restart_unknown_version(d):
    at_phase(d, LearnerPhase.FORWARD)
    d.learner_attempt += 1
    return LearnerStarted(d.learner_attempt, d.state.committed + 2,
                          version_digest(d.state.committed + 2))


def restart_rolled_back(d):
    d.pump(lambda d: d.state.committed == 1)
    d.learner_attempt += 1
    return LearnerStarted(d.learner_attempt, 0, version_digest(0))  # lost its last commit


def restart_ahead_while_not_committing(d):
    at_phase(d, LearnerPhase.APPLYING)
    d.learner_attempt += 1
    return LearnerStarted(d.learner_attempt, d.state.committed + 1,
                          version_digest(d.state.committed + 1))


def first_start_not_from_zero(d):
    d.state = initial_state(CONFIG)
    return LearnerStarted(0, 1, version_digest(1))


def load_never_requested(d):
    load = d.pump_until_command(lambda c: isinstance(c, LoadWeights))
    return WeightsLoaded(load.worker, load.incarnation, load.load + 1, load.version)


def load_wrong_version(d):
    load = d.pump_until_command(lambda c: isinstance(c, LoadWeights))
    return WeightsLoaded(load.worker, load.incarnation, load.load, load.version + 1)


def load_future_incarnation(d):
    load = d.pump_until_command(lambda c: isinstance(c, LoadWeights))
    return WeightsLoaded(load.worker, load.incarnation + 1, load.load, load.version)


def ghost_lost(d):
    return WorkerLost("ghost", 0)


def ghost_completed(d):
    return replace(first_completion(d), worker="ghost")


def ghost_loaded(d):
    return WeightsLoaded("ghost", 0, 1, 0)


def lost_future_incarnation(d):
    return WorkerLost("w0", 4)


def scores_while_waiting(d):
    return ProbabilitiesReported(0, 0, Ragged.of(((-0.5, -0.5),) * 4), None)


def scores_future_update(d):
    at_phase(d, LearnerPhase.SCORING)
    good = learner_reply(d)
    return replace(good, update=good.update + 1)


def scores_future_attempt(d):
    at_phase(d, LearnerPhase.SCORING)
    good = learner_reply(d)
    return replace(good, attempt=good.attempt + 1)


def evaluation_unrequested(d):
    d.pump(lambda d: d.state.committed == 1)
    return VersionEvaluated(1, 0.5)  # version 1 is no evaluation boundary (eval_every = 0)


def evaluation_of_a_future_boundary(d):
    return VersionEvaluated(CONFIG.total_updates, 0.5)  # the final version, not committed yet


def evaluation_infinite_reward(d):
    d.pump_until_command(lambda c: isinstance(c, Evaluate))  # Evaluate(N), the final one
    return VersionEvaluated(CONFIG.total_updates, math.inf)


def checkpoint_unrequested(d):
    d.pump(lambda d: d.state.committed == 1)
    return CheckpointWritten(1, version_digest(1))  # the right weights, but never asked for


def checkpoint_wrong_digest(d):
    d.pump_until_command(lambda c: isinstance(c, Checkpoint))
    return CheckpointWritten(CONFIG.total_updates, "not-the-commit")


SCENARIOS = [
    (wrong_version, Reason.WRONG_VERSION),
    (unknown_batch, Reason.UNKNOWN_REQUEST),
    (unknown_prompt, Reason.UNKNOWN_REQUEST),
    (unknown_sample, Reason.UNKNOWN_REQUEST),
    (positive_logprob, Reason.MALFORMED_PAYLOAD),
    (nan_logprob, Reason.MALFORMED_PAYLOAD),
    (infinite_logprob_after_the_first, Reason.MALFORMED_PAYLOAD),
    (nan_logprob_after_the_first, Reason.MALFORMED_PAYLOAD),
    (length_mismatch, Reason.MALFORMED_PAYLOAD),
    (empty_response, Reason.MALFORMED_PAYLOAD),
    (infinite_reward, Reason.MALFORMED_PAYLOAD),
    (negative_token, Reason.MALFORMED_PAYLOAD),
    (empty_frame, Reason.MALFORMED_PAYLOAD),
    (good_then_unknown, Reason.UNKNOWN_REQUEST),
    (scores_wrong_rows, Reason.MALFORMED_PAYLOAD),
    (scores_positive, Reason.MALFORMED_PAYLOAD),
    (scores_infinite_in_the_last_row, Reason.MALFORMED_PAYLOAD),
    (scores_as_rows_of_floats, Reason.MALFORMED_PAYLOAD),
    (scores_of_integers, Reason.MALFORMED_PAYLOAD),
    (scores_unrequested_reference, Reason.MALFORMED_PAYLOAD),
    (forward_row_length, Reason.MALFORMED_PAYLOAD),
    (forward_nan, Reason.MALFORMED_PAYLOAD),
    (forward_infinite_in_the_last_row, Reason.MALFORMED_PAYLOAD),
    (forward_wrong_rows, Reason.MALFORMED_PAYLOAD),
    (forward_as_rows_of_floats, Reason.MALFORMED_PAYLOAD),
    (observation_from_the_future, Reason.UNREQUESTED_OBSERVATION),
    (observation_while_waiting, Reason.UNREQUESTED_OBSERVATION),
    (step_finished_before_cotangent, Reason.UNREQUESTED_OBSERVATION),
    (step_finished_future_attempt, Reason.UNREQUESTED_OBSERVATION),
    (binding_mismatch, Reason.BINDING_MISMATCH),
    (commit_while_forward, Reason.PREMATURE_COMMIT),
    (commit_while_waiting, Reason.PREMATURE_COMMIT),
    (commit_of_future_update, Reason.PREMATURE_COMMIT),
    (commit_wrong_digest, Reason.COMMIT_DIGEST_MISMATCH),
    (restart_wrong_digest, Reason.COMMIT_DIGEST_MISMATCH),
    (restart_after_commit_wrong_digest, Reason.COMMIT_DIGEST_MISMATCH),
    (publish_unrequested, Reason.UNREQUESTED_PUBLICATION),
    (publish_wrong_digest, Reason.UNREQUESTED_PUBLICATION),
    (publish_uncommitted, Reason.UNREQUESTED_PUBLICATION),
    (restart_unknown_version, Reason.UNKNOWN_COMMIT),
    (restart_ahead_while_not_committing, Reason.UNKNOWN_COMMIT),
    (restart_rolled_back, Reason.UNKNOWN_COMMIT),
    (first_start_not_from_zero, Reason.UNKNOWN_COMMIT),
    (load_never_requested, Reason.UNREQUESTED_LOAD),
    (load_wrong_version, Reason.UNREQUESTED_LOAD),
    (load_future_incarnation, Reason.UNREQUESTED_LOAD),
    (ghost_lost, Reason.UNKNOWN_WORKER),
    (ghost_completed, Reason.UNKNOWN_WORKER),
    (ghost_loaded, Reason.UNKNOWN_WORKER),
    (lost_future_incarnation, Reason.UNKNOWN_WORKER),
    (scores_while_waiting, Reason.UNREQUESTED_SCORES),
    (scores_future_update, Reason.UNREQUESTED_SCORES),
    (scores_future_attempt, Reason.UNREQUESTED_SCORES),
    (evaluation_unrequested, Reason.UNREQUESTED_BOUNDARY),
    (evaluation_of_a_future_boundary, Reason.UNREQUESTED_BOUNDARY),
    (evaluation_infinite_reward, Reason.MALFORMED_PAYLOAD),
    (checkpoint_unrequested, Reason.UNREQUESTED_BOUNDARY),
    (checkpoint_wrong_digest, Reason.COMMIT_DIGEST_MISMATCH),
]


def test_every_reason_has_a_scenario():
    """DIVERGED has its own (tests/model/test_divergence.py): a correct learner's forward is
    what is refused there, and the run cannot carry on past it."""
    assert {reason for _, reason in SCENARIOS} | {Reason.DIVERGED} == set(Reason)


@pytest.mark.parametrize("scenario, reason", SCENARIOS, ids=[s.__name__ for s, _ in SCENARIOS])
def test_refusal(scenario, reason):
    d = Driver(CONFIG)
    bad = scenario(d)
    state = d.state
    frozen = pickle.dumps(state)
    outcome = step(state, bad)
    assert isinstance(outcome, ProtocolError), f"{bad} accepted"
    assert outcome.reason is reason, outcome
    assert outcome.state is state and outcome.event is bad
    assert outcome.detail and reason.value in str(outcome) and type(bad).__name__ in str(outcome)
    assert pickle.dumps(state) == frozen, "a refusal mutated the state"
    # Refusing is a pure function of (state, event) too.
    again = step(state, bad)
    assert isinstance(again, ProtocolError) and again.reason is reason
    # The refused state is still current: the correct run carries on from it, to the end.
    if d.state.learner.phase is LearnerPhase.OFFLINE:
        d.apply(LearnerStarted(0, 0, version_digest(0)))
        d.learner_attempt = 0
        d.apply(WorkerConnected("w0", 0))
        d.worker_incarnation["w0"] = 0
    elif isinstance(bad, LearnerStarted):
        d.restart_learner()  # the learner that sent the bad start comes back from its disk
    d.pump()
    while not run_complete(d.state) and d.state.timer_armed:
        d.apply(TimerFired())
        d.pump()
    assert run_complete(d.state)
    assert violations(d.state) == {}
    assert logical_projection(d.state) == logical_projection(canonical_run(CONFIG).state)


def test_a_refused_frame_names_the_completion_at_fault():
    for scenario, prefix in ((good_then_unknown, "completions[1]: "),
                             (nan_logprob, "completions[0].behavior_logprobs: "),
                             (infinite_logprob_after_the_first,
                              "completions[0].behavior_logprobs: "),
                             (nan_logprob_after_the_first, "completions[0].behavior_logprobs: ")):
        d = Driver(CONFIG)
        bad = scenario(d)
        outcome = step(d.state, bad)
        assert isinstance(outcome, ProtocolError) and outcome.detail.startswith(prefix), outcome


def test_a_refused_matrix_names_the_field_and_the_row_at_fault():
    last = CONFIG.prompts_per_batch * CONFIG.group_size - 1
    for scenario, detail in (
            (scores_wrong_rows, f"proximal: {last} rows for {last + 1} samples"),
            (scores_positive, "proximal[0]: every value must be a finite log-probability"),
            (scores_infinite_in_the_last_row, f"proximal[{last}]: every value must be a finite"),
            (scores_as_rows_of_floats, "proximal: expected Ragged, got tuple"),
            (scores_of_integers, "proximal: expected float64 log-probs, got int64"),
            (scores_unrequested_reference, "reference: not requested"),
            (forward_row_length, "current_logprobs[0]: 1 values for 2 tokens"),
            (forward_nan, "current_logprobs[0]: every value must be a finite log-probability"),
            (forward_infinite_in_the_last_row, "current_logprobs[1]: every value must be"),
            (forward_wrong_rows, "current_logprobs: 3 rows for 2 samples"),
            (forward_as_rows_of_floats, "current_logprobs: expected Ragged, got tuple")):
        d = Driver(CONFIG)
        bad = scenario(d)
        outcome = step(d.state, bad)
        assert isinstance(outcome, ProtocolError) and outcome.detail.startswith(detail), outcome


def test_a_resent_forward_that_is_no_matrix_is_refused_not_digested():
    """In APPLYING a re-sent forward is digested to tell a duplicate from a divergent one: a
    payload that is no matrix is refused before that, the state untouched."""
    d = Driver(CONFIG)
    at_phase(d, LearnerPhase.FORWARD)
    good = learner_reply(d)
    d.apply(good)
    assert d.state.learner.phase is LearnerPhase.APPLYING
    lengths = good.current_logprobs.lengths
    for payload in (good.current_logprobs.rows(),
                    Ragged(np.zeros(sum(lengths), dtype=INT), lengths)):
        outcome = step(d.state, replace(good, current_logprobs=payload))
        assert isinstance(outcome, ProtocolError), outcome
        assert outcome.reason is Reason.MALFORMED_PAYLOAD and outcome.state is d.state
        assert outcome.detail.startswith("current_logprobs: expected "), outcome
    after, commands = step(d.state, good)
    assert after.noops.duplicates == d.state.noops.duplicates + 1 and commands == ()


def test_non_event_is_refused():
    state = initial_state(CONFIG)
    outcome = step(state, RunForward(ObservationId(0, 0, 0), 0, ()))
    assert isinstance(outcome, ProtocolError) and outcome.state is state
    assert outcome.reason is Reason.MALFORMED_PAYLOAD


def test_reference_scores_required_when_kl_is_on():
    config = small_config(objective=ObjectiveConfig(kl_coef=0.2))
    d = Driver(config)
    d.pump_to_phase(LearnerPhase.SCORING)
    (score,) = [c for c in outstanding_commands(d.state) if isinstance(c, ScoreProbabilities)]
    assert score.reference is True
    good = reply(score, config.optimizer_steps)
    outcome = d.attempt(replace(good, reference=None))
    assert isinstance(outcome, ProtocolError) and outcome.reason is Reason.MALFORMED_PAYLOAD
    assert "reference" in outcome.detail
    # A reference that is not a matrix at all is refused by name too, changing nothing.
    as_rows = tuple(good.reference.rows())
    outcome = d.attempt(replace(good, reference=as_rows))
    assert isinstance(outcome, ProtocolError) and outcome.reason is Reason.MALFORMED_PAYLOAD
    assert outcome.detail.startswith("reference: ") and outcome.state is d.state
    d.apply(good)
    assert d.state.learner.phase is LearnerPhase.FORWARD


# ---------------------------------------------------------------------------------------------
# Duplicates and late replies: recorded no-ops, never refusals.


def noop_total(state) -> int:
    return sum(getattr(state.noops, f.name) for f in fields(state.noops))


def assert_noop(d: Driver, event, kind: str | None = None) -> None:
    before = d.state
    outcome = step(before, event)
    assert not isinstance(outcome, ProtocolError), outcome
    after, commands = outcome
    assert commands == ()
    assert after == before
    assert noop_total(after) == noop_total(before) + 1
    if kind is not None:
        assert getattr(after.noops, kind) == getattr(before.noops, kind) + 1, after.noops
    d.state = after


def test_step_finished_of_an_old_observation_is_late():
    d = Driver(CONFIG)
    d.pump_to_phase(LearnerPhase.APPLYING, 0)
    old = learner_reply(d)
    d.apply(old)
    assert d.state.learner.phase is LearnerPhase.FORWARD and d.state.learner.step == 1
    assert_noop(d, old, "late")
    d.pump_to_phase(LearnerPhase.COMMITTING)
    assert_noop(d, old, "late")


def test_forward_observed_of_an_old_observation_is_late():
    d = Driver(CONFIG)
    d.pump_to_phase(LearnerPhase.FORWARD, 0)
    old = learner_reply(d)
    d.apply(old)
    assert_noop(d, old, "duplicates")  # the same forward, its cotangent already sent
    d.pump_to_phase(LearnerPhase.FORWARD, 1)
    assert_noop(d, old, "late")


def test_completion_from_a_retired_incarnation_of_a_completed_request_is_a_noop():
    d = Driver(CONFIG, workers=("a", "b"))
    launch = d.pump_until_command(lambda c: isinstance(c, LaunchRequest) and c.worker == "a")
    stale_reply = reply(launch, K)
    d.drop_queued(lambda c: c == launch)
    d.lose_worker("a")
    d.pump(lambda d: _completed(d, launch.request))
    assert _completed(d, launch.request)
    assert_noop(d, stale_reply)
    d.pump()
    assert run_complete(d.state)


def _completed(d: Driver, request: RequestId) -> bool:
    batch = d.state.batch(request.batch)
    if batch is None:
        return request.batch < d.state.committed
    slot = batch.slots[request.prompt * CONFIG.group_size + request.sample]
    return type(slot).__name__ == "Sample"


def test_second_update_committed_is_a_duplicate():
    d = Driver(CONFIG)
    d.pump_to_phase(LearnerPhase.COMMITTING)
    commit = learner_reply(d)
    d.apply(commit)
    assert d.state.committed == 1
    assert_noop(d, commit, "duplicates")
    d.pump()
    assert_noop(d, commit, "duplicates")


def test_same_event_twice_is_a_duplicate():
    d = Driver(CONFIG)
    completion = first_completion(d)
    d.apply(completion)
    assert_noop(d, completion, "duplicates")
    assert_noop(d, WorkerConnected("w0", 0), "duplicates")
    assert_noop(d, LearnerStarted(0, 0, version_digest(0)), "duplicates")
    assert_noop(d, VersionPublished(0, version_digest(0)), "duplicates")


def test_replies_of_the_past_are_late():
    d = Driver(CONFIG)
    d.pump_to_phase(LearnerPhase.SCORING)
    scores = learner_reply(d)
    d.restart_learner()  # attempt 1 redoes update 0
    assert_noop(d, scores, "late")  # scores of the dead attempt 0
    assert_noop(d, LearnerStarted(0, 0, version_digest(0)), "late")
    d.lose_worker("w0")  # WorkerLost(w0#0), then WorkerConnected(w0#1)
    assert_noop(d, WorkerLost("w0", 0), "late")
    assert_noop(d, WorkerConnected("w0", 0), "late")
    assert_noop(d, WorkerConnected("w0", 1), "duplicates")
    d.pump()
    assert run_complete(d.state)
    # After the end: old commits, scores, publications and a disarmed timer change nothing.
    assert_noop(d, UpdateCommitted(0, version_digest(1)))
    assert_noop(d, scores, "late")
    assert_noop(d, VersionPublished(CONFIG.total_updates, version_digest(CONFIG.total_updates)))
    if not d.state.timer_armed:
        assert_noop(d, TimerFired(), "late")


def test_late_load_is_a_noop():
    d = Driver(CONFIG)
    load = d.pump_until_command(lambda c: isinstance(c, LoadWeights))
    d.drop_queued(lambda c: c == load)
    late = reply(load, K)
    d.lose_worker("w0")
    assert_noop(d, late, "late")
    d.pump()
    while not run_complete(d.state):
        d.apply(TimerFired())
        d.pump()
    assert logical_projection(d.state) == logical_projection(canonical_run(CONFIG).state)


def test_a_frame_that_repeats_some_completions_is_accepted_and_counts_them():
    d = Driver(CONFIG)
    launches = []
    while len(launches) < 2:
        launches.append(d.pump_until_command(
            lambda c: isinstance(c, LaunchRequest) and c not in launches))
    first, second = (reply(c, K) for c in launches)
    d.apply(first)
    both = replace(first, completions=first.completions + second.completions + second.completions)
    outcome = step(d.state, both)
    assert not isinstance(outcome, ProtocolError), outcome
    after, _ = outcome
    assert after != d.state, "the new completion was not taken"
    assert after.noops.duplicates == d.state.noops.duplicates + 2  # the repeat and the copy
    request = second.completions[0].request
    slot = after.batch(request.batch).slots[request.prompt * CONFIG.group_size + request.sample]
    assert isinstance(slot, Sample)
    assert deliver(d.state, both).verdict is Verdict.ACCEPTED


def test_divergent_completion_is_kept_out_and_counted():
    """A second completion of a sample with other content: the first one stays."""
    d = Driver(CONFIG, workers=("a", "b"))
    completion = first_completion(d)
    d.apply(completion)
    digest_before = d.state.batch(0).slots_digest if hasattr(d.state.batch(0), "slots_digest") \
        else None
    other = changed(completion, reward=completion.completions[0].reward + 1.0)
    assert_noop(d, other)
    if digest_before is not None:
        assert d.state.batch(0).slots_digest == digest_before


# ---------------------------------------------------------------------------------------------
# Known deviations of the core from "a reply no correct component could send is refused":
# these forged replies are silently counted as no-ops instead. The state stays unchanged, so
# they are harmless to the run, but a broken component would go unnoticed.


def test_observation_of_a_step_never_requested_is_refused():
    d = Driver(CONFIG)
    bad = observation_of_wrong_step(d)  # ForwardObserved((0, 1, 0)) while (0, 0, 0) is pending
    outcome = d.attempt(bad)
    assert isinstance(outcome, ProtocolError)
    assert outcome.reason is Reason.UNREQUESTED_OBSERVATION


def test_observation_from_a_future_attempt_is_refused():
    d = Driver(CONFIG)
    d.pump_to_phase(LearnerPhase.FORWARD, 0)
    good = learner_reply(d)
    d.apply(good)  # now APPLYING, bound to good.observation
    outcome = d.attempt(replace(good, attempt=good.attempt + 1))
    assert isinstance(outcome, ProtocolError)


def test_old_commit_with_another_digest_is_refused():
    d = Driver(CONFIG)
    d.pump(lambda d: d.state.committed == 1)
    outcome = d.attempt(UpdateCommitted(0, "not-w1"))
    assert isinstance(outcome, ProtocolError)
    assert outcome.reason is Reason.COMMIT_DIGEST_MISMATCH


def test_scores_in_a_run_that_scores_no_batch_are_refused():
    """One optimizer step and no KL term: each update's forward supplies its proximal
    log-probs, so no ScoreProbabilities is ever sent and any scores are unrequested, the
    current update's included."""
    config = small_config(optimizer_steps=1)
    assert not config.scores_batch
    d = Driver(config)
    at_phase(d, LearnerPhase.FORWARD)
    assert not any(isinstance(c, ScoreProbabilities) for c in d.commands)
    lengths = completions_of(d.state.batches[0].slots).tokens.lengths
    scores = Ragged.of([(-0.5,) * n for n in lengths])
    for update in (d.state.committed, d.state.committed + 1):
        outcome = step(d.state, ProbabilitiesReported(update, d.state.learner.attempt,
                                                      scores, None))
        assert isinstance(outcome, ProtocolError)
        assert outcome.reason is Reason.UNREQUESTED_SCORES
        assert "one optimizer step, no KL term" in outcome.detail
