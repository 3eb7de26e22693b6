"""Targeted recovery scenarios: lost workers, learner restarts (before and after a durable
commit), version retention, and the commands issued at hard boundaries."""

from __future__ import annotations

from collections import Counter

import pytest

from helpers.core_driver import Driver, commands_of, small_config
from invar.model import (
    LearnerPhase,
    WorkerPhase,
    core,
    logical_projection,
    outstanding_commands,
    run_complete,
    schedule,
    violations,
)
from invar.model.messages import (
    Checkpoint,
    Commit,
    Evaluate,
    LaunchRequest,
    LearnerStarted,
    Publish,
    ReleaseVersion,
    RetainVersion,
    RunForward,
    ScoreProbabilities,
    TimerFired,
    UpdateCommitted,
    VersionPublished,
    WorkerConnected,
    one_per_request,
)
from invar.model.state import BatchState, evolve
from invar.testing import canonical_run, reply, version_digest


def finish(d: Driver) -> None:
    """Run to completion, firing the retry timer whenever the network is quiet."""
    for _ in range(100):
        d.pump()
        if run_complete(d.state):
            return
        assert d.state.timer_armed, "stuck without a retry timer"
        d.apply(TimerFired())
    raise AssertionError("did not complete")


def assert_canonical(d: Driver) -> None:
    assert run_complete(d.state)
    assert violations(d.state) == {}
    assert logical_projection(d.state) == logical_projection(canonical_run(d.config).state)


def identity(launch: LaunchRequest) -> tuple:
    return launch.request, launch.version, launch.seed, launch.prompt_index


# ---------------------------------------------------------------------------------------------
# Lost workers.


@pytest.mark.parametrize("reconnect", [True, False])
def test_lost_worker_requests_reissued_with_same_identity(reconnect):
    d = Driver(small_config(), workers=("a", "b"))
    d.pump_until_command(lambda c: isinstance(c, LaunchRequest) and c.worker == "a")
    on_a = [c for c in d.queue if isinstance(c, LaunchRequest) and c.worker == "a"]
    assert on_a
    d.drop_queued(lambda c: c in on_a)  # a dies with its work unfinished
    seen = len(d.commands)
    d.lose_worker("a", reconnect=reconnect)
    finish(d)
    relaunched = [c for c in commands_of(d.commands[seen:], LaunchRequest)
                  if c.request in {x.request for x in on_a}]
    by_request = {c.request: c for c in relaunched}
    assert set(by_request) == {c.request for c in on_a}
    for original in on_a:
        again = by_request[original.request]
        assert identity(again) == identity(original)
        assert (again.worker, again.incarnation) != ("a", 0)
        if not reconnect:
            assert again.worker == "b"
    assert_canonical(d)


def test_single_worker_lost_and_back_resumes_its_requests():
    d = Driver(small_config(), workers=("w0",))
    launches = d.pump_until_command(lambda c: isinstance(c, LaunchRequest))
    before = [c for c in d.queue if isinstance(c, LaunchRequest)]
    d.drop_queued(lambda c: isinstance(c, LaunchRequest))
    assert commands_of(d.lose_worker("w0", reconnect=False), LaunchRequest) == []  # nobody left
    seen = len(d.commands)
    d.apply(WorkerConnected("w0", 1))  # the driver already counts w0#1 as the live one
    finish(d)
    again = {c.request: c for c in commands_of(d.commands[seen:], LaunchRequest)}
    for original in [launches, *before]:
        assert identity(again[original.request]) == identity(original)
        assert again[original.request].incarnation == 1
    assert_canonical(d)


def test_a_repeated_connection_of_the_live_incarnation_changes_nothing():
    """The connection of the incarnation already live (a driver that observes it twice) is a
    duplicate: its assignments stay, nothing is re-queued or re-sent (the mutant
    `_on_worker_connected:cmp-op:1` treats it as a new incarnation)."""
    d = Driver(small_config(), workers=("w0",))
    d.pump_until_command(lambda c: isinstance(c, LaunchRequest))
    before = d.state
    assert before.worker("w0").assigned > 0
    again = d.attempt(WorkerConnected("w0", 0))
    assert again == (before, ()) and again[0].noops.duplicates == before.noops.duplicates + 1
    d.lose_worker("w0", reconnect=False)
    lost = d.state
    late = d.attempt(WorkerConnected("w0", 0))  # the lost incarnation: late, not revived
    assert late == (lost, ()) and late[0].noops.late == lost.noops.late + 1


def test_every_launch_of_a_request_has_one_identity():
    """Across a run with losses, all launches of one request agree on version and seed."""
    d = Driver(small_config(total_updates=4), workers=("a", "b"))
    d.pump_until_command(lambda c: isinstance(c, LaunchRequest))
    d.lose_worker("a")
    d.pump(lambda d: d.state.committed == 2)
    d.lose_worker("b")
    finish(d)
    identities: dict = {}
    for launch in commands_of(d.commands, LaunchRequest):
        identities.setdefault(launch.request, set()).add(identity(launch))
        assert launch.seed == schedule.sampling_seed(d.config, launch.request)
        assert launch.version == schedule.gen_version(d.config, launch.request.batch)
    assert all(len(ids) == 1 for ids in identities.values())
    assert_canonical(d)


# ---------------------------------------------------------------------------------------------
# Learner restarts.


def test_restart_mid_update_redoes_the_update_whole():
    config = small_config(optimizer_steps=3)
    d = Driver(config)
    d.pump_to_phase(LearnerPhase.FORWARD, step_index=1, update=0)
    first_scores = commands_of(d.commands, ScoreProbabilities)
    first_forwards = [c for c in commands_of(d.commands, RunForward) if c.observation.update == 0]
    assert [f.observation.step for f in first_forwards] == [0, 1]
    seen = len(d.commands)
    restart = d.restart_learner()
    # Proximal log-probs are re-scored by the new attempt, for the same samples.
    (rescore,) = commands_of(restart, ScoreProbabilities)
    assert rescore.attempt == 1 and rescore.update == 0
    assert (rescore.requests, rescore.reference) == (first_scores[0].requests,
                                                     first_scores[0].reference)
    finish(d)
    redo = [c for c in commands_of(d.commands[seen:], RunForward) if c.observation.update == 0]
    assert [f.observation.step for f in redo] == [0, 1, 2]
    assert all(f.attempt == 1 for f in redo)
    # Same minibatches, new observations.
    for old, new in zip(first_forwards, redo):
        assert new.requests == old.requests
        assert new.observation.serial > max(f.observation.serial for f in first_forwards)
    plan = schedule.minibatch_plan(config, 0)
    requests = schedule.request_ids(config, 0)
    assert [f.requests for f in redo] == [tuple(requests[i] for i in part) for part in plan]
    # The ledger records what the redo applied (attempt 1's three steps), not attempt 0's.
    record = d.state.ledger[0]
    assert [s.step for s in record.steps] == [0, 1, 2]
    assert tuple(s.positions for s in record.steps) == plan
    assert record.steps[-1].post_step_digest == record.commit_digest == version_digest(1)
    assert_canonical(d)


@pytest.mark.parametrize("phase, update", [
    (LearnerPhase.WAITING, 0), (LearnerPhase.SCORING, 1), (LearnerPhase.FORWARD, 1),
    (LearnerPhase.APPLYING, 1), (LearnerPhase.COMMITTING, 1), (LearnerPhase.COMMITTING, 2),
])
def test_restart_in_any_phase_ends_canonically(phase, update):
    d = Driver(small_config())
    d.pump_to_phase(phase, update=update)
    d.restart_learner()
    finish(d)
    assert_canonical(d)
    assert [r.update for r in d.state.ledger] == list(range(d.config.total_updates))


def test_committed_update_never_reruns():
    d = Driver(small_config())
    d.pump(lambda d: d.state.committed == 1)
    seen = len(d.commands)
    d.restart_learner()  # from its disk: version 1
    finish(d)
    later = d.commands[seen:]
    assert all(c.update >= 1 for c in commands_of(later, ScoreProbabilities))
    assert all(c.observation.update >= 1 for c in commands_of(later, RunForward))
    assert all(c.update >= 1 for c in commands_of(later, Commit))
    assert Counter(r.update for r in d.state.ledger) == Counter(range(3))
    assert_canonical(d)


def test_restart_after_durable_commit_with_lost_reply_counts_the_commit():
    config = small_config(eval_every=1, checkpoint_every=1)
    d = Driver(config)
    d.pump_to_phase(LearnerPhase.COMMITTING, update=0)
    (commit,) = d.drop_queued(lambda c: isinstance(c, Commit))
    lost_reply = d.answer(commit)  # durable on the learner's disk; the reply dies with it
    assert d.durable == (1, version_digest(1))
    assert d.state.committed == 0
    commands = d.restart_learner()  # LearnerStarted(1, committed_version=1, "w1")
    assert d.state.committed == 1
    assert [r.update for r in d.state.ledger] == [0]
    assert Evaluate(1) in commands and Checkpoint(1) in commands
    assert d.state.learner.phase in (LearnerPhase.WAITING, LearnerPhase.SCORING)
    # The reply, arriving after all, is a duplicate.
    outcome = d.attempt(lost_reply)
    assert outcome[0] == d.state and outcome[1] == ()
    d.state = outcome[0]
    finish(d)
    assert_canonical(d)
    boundary = Counter(c for c in d.commands if isinstance(c, (Evaluate, Checkpoint)))
    reference = Counter(c for c in canonical_run(config).commands
                        if isinstance(c, (Evaluate, Checkpoint)))
    assert boundary == reference


def test_restart_resends_an_unacknowledged_evaluation():
    """The learner died with Evaluate(1) unanswered: its successor is asked again (the
    boundary is outstanding until acknowledged), and the next update waits for it."""
    config = small_config(eval_every=1)
    d = Driver(config)
    d.pump_until_command(lambda c: isinstance(c, Evaluate) and c.version == 1)
    assert d.drop_queued(lambda c: isinstance(c, Evaluate)) == [Evaluate(1)]
    d.pump()
    assert d.state.learner.phase is LearnerPhase.WAITING and d.state.committed == 1
    commands = d.restart_learner()
    assert Evaluate(1) in commands and not commands_of(commands, ScoreProbabilities)
    finish(d)
    assert d.state.evaluated == (0, 1, 2, 3)
    assert_canonical(d)


def test_restart_before_the_commit_landed_redoes_the_update():
    d = Driver(small_config())
    d.pump_to_phase(LearnerPhase.COMMITTING, update=0)
    d.drop_queued(lambda c: isinstance(c, Commit))  # never reached the learner
    commands = d.restart_learner()
    assert d.state.committed == 0
    assert commands_of(commands, ScoreProbabilities)[0].update == 0
    finish(d)
    assert_canonical(d)


def test_two_restarts_in_a_row():
    d = Driver(small_config())
    d.pump_to_phase(LearnerPhase.APPLYING, update=0)
    d.restart_learner()
    d.pump_to_phase(LearnerPhase.FORWARD, update=0)
    d.restart_learner()
    assert d.state.learner.attempt == 2
    finish(d)
    assert_canonical(d)


# ---------------------------------------------------------------------------------------------
# Version retention.


def test_versions_retained_while_needed_then_released():
    # S=2, P=3: version 0 generates batches 0..2, version 3 batches 3..5.
    config = small_config(prompts_per_batch=1, group_size=2, max_staleness=2, sync_period=3,
                          optimizer_steps=1, total_updates=6, max_inflight_batches=3)
    assert list(schedule.batches_of_version(config, 0)) == [0, 1, 2]
    assert list(schedule.batches_of_version(config, 3)) == [3, 4, 5]
    d = Driver(config, workers=("a", "b"))
    store: set[int] = set()
    released: list[int] = []
    while True:
        before = d.state
        event = d.next_reply()
        if event is None:
            break
        commands = d.apply(event)
        for c in commands:
            if isinstance(c, RetainVersion):
                assert c.version not in store and c.version in d.state.published
                assert isinstance(event, VersionPublished) and event.version == c.version
                store.add(c.version)
            if isinstance(c, ReleaseVersion):
                assert c.version in store
                store.discard(c.version)
                released.append(c.version)
                # Released exactly when the last batch it generates is complete and a newer
                # version is published (the store always holds the newest publication).
                def releasable(state, version=c.version):
                    return state.published[-1] > version and all(
                        _complete(state, b) for b in schedule.batches_of_version(config, version))
                assert releasable(d.state) and not releasable(before)
        assert store == set(d.state.retained)
        for b in range(d.state.committed, d.state.admitted):
            if not _complete(d.state, b):
                assert schedule.gen_version(config, b) in store
    assert run_complete(d.state)
    assert released == [0, 3]
    assert store == {config.total_updates}  # the newest publication stays


def _complete(state, batch: int) -> bool:
    if batch < state.committed:
        return True
    held = state.batch(batch)
    return held is not None and held.completed == len(held.slots)


# ---------------------------------------------------------------------------------------------
# Hard boundaries and publication.


@pytest.mark.parametrize("eval_every, checkpoint_every, evaluated, kept", [
    (2, 3, [0, 2, 4, 6], [3, 6]),
    (0, 0, [6], [6]),
    (4, 0, [0, 4, 6], [6]),
])
def test_evaluate_and_checkpoint_at_boundaries(eval_every, checkpoint_every, evaluated, kept):
    config = small_config(prompts_per_batch=1, group_size=2, max_staleness=2, sync_period=3,
                          optimizer_steps=1, total_updates=6, max_inflight_batches=3,
                          eval_every=eval_every, checkpoint_every=checkpoint_every)
    d = Driver(config, start=False)
    for event in (LearnerStarted(0, 0, version_digest(0)), WorkerConnected("w0", 0)):
        d.apply(event)
    d.learner_attempt, d.worker_incarnation = 0, {"w0": 0}
    evaluations, checkpoints = [], []
    while (event := d.next_reply()) is not None:
        for c in d.apply(event):
            if isinstance(c, Evaluate):
                assert c.version <= d.state.committed
                evaluations.append(c.version)
            if isinstance(c, Checkpoint):
                assert c.version <= d.state.committed
                checkpoints.append(c.version)
    # Evaluate(0) comes with the learner's first start.
    if 0 in evaluated:
        assert Evaluate(0) in d.commands[:3]
        evaluations.insert(0, 0)
    assert evaluations == evaluated
    assert checkpoints == kept
    for v in evaluated + kept:
        assert v in schedule.published_versions(config)


def test_publications_follow_commits_in_order_with_their_contents():
    config = small_config(max_staleness=2, sync_period=2, total_updates=5, eval_every=3)
    d = Driver(config)
    finish(d)
    publishes = commands_of(d.commands, Publish)
    assert [p.version for p in publishes] == list(schedule.published_versions(config))
    assert d.state.published == schedule.published_versions(config)
    for p in publishes:
        assert p.weights_digest == d.state.commit_digests[p.version] == version_digest(p.version)
    # Each Publish was sent only once its version was committed.
    committed_at_publish = []
    replay = Driver(config)
    while (event := replay.next_reply()) is not None:
        for c in replay.apply(event):
            if isinstance(c, Publish):
                committed_at_publish.append((c.version, replay.state.committed))
    assert all(v <= committed for v, committed in committed_at_publish)


def test_lost_publish_is_resent_by_the_timer():
    d = Driver(small_config())
    d.pump(lambda d: d.state.committed == 1)
    assert d.state.publishing == 1
    dropped = d.drop_queued(lambda c: isinstance(c, Publish))
    assert [p.version for p in dropped] == [1]
    d.pump()
    assert d.state.publishing == 1 and d.state.published == (0,)
    resent = d.apply(TimerFired())
    assert Publish(1, version_digest(1)) in resent
    assert Publish(1, version_digest(1)) in outstanding_commands(d.state)
    finish(d)
    assert_canonical(d)


def test_timer_resends_exactly_the_outstanding_commands():
    d = Driver(small_config(), workers=("a", "b"))
    d.pump_until_command(lambda c: isinstance(c, LaunchRequest))
    outstanding = outstanding_commands(d.state)
    assert outstanding and d.state.timer_armed
    resent = d.apply(TimerFired())
    assert [c for c in resent if type(c).__name__ != "SetTimer"] == list(
        one_per_request(outstanding))
    d.queue.clear()
    d.queue.extend(resent)
    finish(d)
    assert_canonical(d)


def test_late_update_committed_after_restart_is_harmless():
    d = Driver(small_config())
    d.pump_to_phase(LearnerPhase.COMMITTING, update=1)
    (commit,) = d.drop_queued(lambda c: isinstance(c, Commit))
    late = d.answer(commit)
    assert isinstance(late, UpdateCommitted)
    d.restart_learner()  # accepted as the commit
    committed = d.state.committed
    outcome = d.attempt(late)
    assert outcome[1] == () and outcome[0] == d.state and outcome[0].committed == committed
    finish(d)
    assert_canonical(d)
    assert reply(commit, 2) == late


def test_free_workers_spread_over_the_versions_pending_requests_need():
    """Two free workers and pending requests of two versions: each loads a different one
    (the second is pointed at the version no worker holds, not at the first's again)."""
    config = small_config(max_staleness=0, sync_period=1, total_updates=3)
    done = canonical_run(config, ("a", "b")).state
    idle = tuple(evolve(w, phase=WorkerPhase.IDLE, version=None, assigned=0)
                 for w in done.workers)
    pending = tuple(BatchState.admitted(b, config.samples_per_batch) for b in (1, 2))
    assert [schedule.gen_version(config, b.batch) for b in pending] == [1, 2]
    commands: list = []
    core._schedule_loads(evolve(done, workers=idle, batches=pending), commands)
    assert sorted((c.worker, c.version) for c in commands) == [("a", 1), ("b", 2)]
