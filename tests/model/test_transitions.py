"""The phase tables of invar.model.transitions agree with `step`.

For every (phase, event type) the learner table lists, a scenario reaches that phase, applies
that event, and must land in one of the listed phases (or where the core's own internal moves,
LEARNER_INTERNAL, take it from there in the same step). Pairs the table does not list are not
in-protocol: such an event is refused or a no-op, and the phase does not move. Same for the
worker table. The renderings name every phase."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from helpers.core_driver import Driver, small_config
from invar.model import (
    LearnerPhase,
    ProtocolError,
    WorkerPhase,
    initial_state,
    outstanding_commands,
    run_complete,
    step,
)
from invar.model.messages import (
    Checkpoint,
    CheckpointWritten,
    Evaluate,
    ForwardObserved,
    LearnerStarted,
    LoadWeights,
    ObservationId,
    ProbabilitiesReported,
    StepFinished,
    TimerFired,
    UpdateCommitted,
    VersionEvaluated,
    WorkerConnected,
    WorkerLost,
)
from invar.model.ragged import Ragged
from invar.model.transitions import (
    LEARNER,
    LEARNER_INTERNAL,
    WORKER,
    WORKER_INTERNAL,
    to_dot,
    to_markdown,
    with_internal_moves,
)
from invar.testing import reply, version_digest

L = LearnerPhase
W = WorkerPhase
CONFIG = small_config()  # K = 2, N = 3
K = CONFIG.optimizer_steps


def finish(d: Driver) -> Driver:
    for _ in range(50):
        d.pump()
        if run_complete(d.state):
            return d
        d.apply(TimerFired())
    raise AssertionError("did not complete")


def learner_command_reply(d: Driver):
    (command,) = [c for c in outstanding_commands(d.state) if hasattr(c, "attempt")]
    return reply(command, K)


def restart(d: Driver, durable: bool = False) -> LearnerStarted:
    version, digest = d.durable
    if durable:
        (commit,) = d.drop_queued(lambda c: type(c).__name__ == "Commit")
        d.answer(commit)
        version, digest = d.durable
    return LearnerStarted(d.state.learner.attempt + 1, version, digest)


def at(phase: LearnerPhase, step_index=None, update=None) -> Driver:
    d = Driver(CONFIG)
    d.pump_to_phase(phase, step_index, update)
    return d


Scenario = Callable[[], tuple[Driver, object]]

LEARNER_SCENARIOS: dict[tuple, list[Scenario]] = {
    (L.OFFLINE, LearnerStarted): [
        lambda: (Driver(CONFIG, start=False), LearnerStarted(0, 0, version_digest(0))),
    ],
    (L.SCORING, ProbabilitiesReported): [
        lambda: (d := at(L.SCORING), learner_command_reply(d)),
    ],
    (L.FORWARD, ForwardObserved): [
        lambda: (d := at(L.FORWARD, 0), learner_command_reply(d)),
        lambda: (d := at(L.FORWARD, K - 1, 1), learner_command_reply(d)),
    ],
    (L.APPLYING, StepFinished): [
        lambda: (d := at(L.APPLYING, 0), learner_command_reply(d)),            # -> FORWARD
        lambda: (d := at(L.APPLYING, K - 1), learner_command_reply(d)),        # -> COMMITTING
    ],
    (L.COMMITTING, UpdateCommitted): [
        lambda: (d := at(L.COMMITTING, update=0), learner_command_reply(d)),
        lambda: (d := at(L.COMMITTING, update=CONFIG.total_updates - 1),
                 learner_command_reply(d)),                                     # -> FINISHED
    ],
    (L.WAITING, LearnerStarted): [lambda: (d := at(L.WAITING, update=0), restart(d))],
    (L.SCORING, LearnerStarted): [lambda: (d := at(L.SCORING, update=1), restart(d))],
    (L.FORWARD, LearnerStarted): [lambda: (d := at(L.FORWARD, 1), restart(d))],
    (L.APPLYING, LearnerStarted): [lambda: (d := at(L.APPLYING, 0), restart(d))],
    (L.COMMITTING, LearnerStarted): [
        lambda: (d := at(L.COMMITTING, update=0), restart(d)),                 # commit lost
        lambda: (d := at(L.COMMITTING, update=0), restart(d, durable=True)),   # commit durable
        lambda: (d := at(L.COMMITTING, update=CONFIG.total_updates - 1),
                 restart(d, durable=True)),                                     # -> FINISHED
    ],
    (L.FINISHED, LearnerStarted): [lambda: (d := finish(Driver(CONFIG)), restart(d))],
}


def test_every_listed_learner_pair_has_a_scenario():
    assert set(LEARNER_SCENARIOS) == set(LEARNER)


CASES = [(key, i) for key, scenarios in LEARNER_SCENARIOS.items() for i in range(len(scenarios))]


@pytest.mark.parametrize("key, index", CASES,
                         ids=[f"{k[0].value}-{k[1].__name__}-{i}" for k, i in CASES])
def test_listed_learner_transition_agrees_with_step(key, index):
    phase, event_type = key
    d, event = LEARNER_SCENARIOS[key][index]()
    assert d.state.learner.phase is phase
    assert isinstance(event, event_type)
    outcome = step(d.state, event)
    assert not isinstance(outcome, ProtocolError), outcome
    after, _ = outcome
    allowed = with_internal_moves(LEARNER[key], LEARNER_INTERNAL)
    assert after.learner.phase in allowed, \
        f"{phase.value} --{event_type.__name__}--> {after.learner.phase.value}, table: {allowed}"
    assert after != d.state, "an in-protocol event must change the state"


def test_listed_targets_are_all_reached():
    """Every target the table lists for a pair is reached by one of its scenarios."""
    reached: dict[tuple, set] = {}
    for key, scenarios in LEARNER_SCENARIOS.items():
        for scenario in scenarios:
            d, event = scenario()
            after, _ = step(d.state, event)
            phase = after.learner.phase
            # Undo the internal move to compare with the table's direct targets.
            for source, targets in LEARNER_INTERNAL.items():
                if phase in targets and source in LEARNER[key]:
                    phase = source
            reached.setdefault(key, set()).add(phase)
    for key, targets in LEARNER.items():
        assert set(targets) <= reached[key], f"{key}: table {targets}, reached {reached[key]}"


# ---------------------------------------------------------------------------------------------
# Unlisted pairs are not in-protocol.

LEARNER_EVENT_TYPES = (ProbabilitiesReported, ForwardObserved, StepFinished, UpdateCommitted)


def plausible(d: Driver, event_type: type):
    """An event of `event_type` shaped for the current update, step and attempt."""
    state = d.state
    learner = state.learner
    batch = state.batch(state.committed)
    rows = Ragged.of([(-0.5,) * len(s.tokens) if hasattr(s, "tokens") else (-0.5, -0.5)
                      for s in (batch.slots if batch is not None else ())])
    observation = learner.observation or ObservationId(state.committed, learner.step,
                                                       learner.observations)
    if event_type is ProbabilitiesReported:
        return ProbabilitiesReported(state.committed, learner.attempt, rows, None)
    if event_type is ForwardObserved:
        return ForwardObserved(observation, learner.attempt, learner.step_digest,
                               rows.take(range(min(1, len(rows)))))
    if event_type is StepFinished:
        return StepFinished(observation, learner.attempt, "after")
    return UpdateCommitted(state.committed, learner.step_digest)


PHASE_REACHERS = {
    L.OFFLINE: lambda: Driver(CONFIG, start=False),
    L.WAITING: lambda: at(L.WAITING, update=0),
    L.SCORING: lambda: at(L.SCORING),
    L.FORWARD: lambda: at(L.FORWARD, 1),
    L.APPLYING: lambda: at(L.APPLYING, 1),
    L.COMMITTING: lambda: at(L.COMMITTING),
    L.FINISHED: lambda: finish(Driver(CONFIG)),
}


def test_every_phase_can_be_reached():
    assert set(PHASE_REACHERS) == set(LearnerPhase)


UNLISTED = [(phase, etype) for phase in LearnerPhase for etype in LEARNER_EVENT_TYPES
            if (phase, etype) not in LEARNER]


@pytest.mark.parametrize("phase, event_type", UNLISTED,
                         ids=[f"{p.value}-{e.__name__}" for p, e in UNLISTED])
def test_unlisted_learner_pair_does_not_move_the_phase(phase, event_type):
    d = PHASE_REACHERS[phase]()
    assert d.state.learner.phase is phase
    outcome = step(d.state, plausible(d, event_type))
    if isinstance(outcome, ProtocolError):
        assert outcome.state is d.state
        return
    after, commands = outcome
    assert after == d.state and commands == (), "an unlisted pair changed the state"


# ---------------------------------------------------------------------------------------------
# The worker table.


def worker_at(phase: WorkerPhase | None) -> Driver:
    """A driver whose worker "w0" is in `phase` (None: never seen)."""
    if phase is W.IDLE:
        d = Driver(CONFIG, start=False)  # nothing published yet, so nothing to load
        d.worker_incarnation["w0"] = 0
        d.apply(WorkerConnected("w0", 0))
        return d
    d = Driver(CONFIG, workers=())
    d.pump()  # version 0 published; no worker yet
    if phase is None:
        return d
    d.worker_incarnation["w0"] = 0
    d.apply(WorkerConnected("w0", 0))
    if phase is W.LOADING:
        return d
    if phase is W.READY:
        (load,) = [c for c in d.queue if isinstance(c, LoadWeights)]
        d.queue.remove(load)
        d.apply(reply(load, K))
        return d
    d.lose_worker("w0", reconnect=False)
    return d


def worker_phase(d: Driver, name: str):
    w = d.state.worker(name)
    return None if w is None else w.phase


def worker_scenario(phase, event_type) -> tuple[Driver, object]:
    d = worker_at(phase)
    name = "w0"
    known = d.state.worker(name)
    if event_type is WorkerConnected:
        return d, WorkerConnected(name, 0 if known is None else known.incarnation + 1)
    if event_type is WorkerLost:
        return d, WorkerLost(name, known.incarnation)
    load = next(c for c in outstanding_commands(d.state) if isinstance(c, LoadWeights))
    return d, reply(load, K)


@pytest.mark.parametrize("key", list(WORKER), ids=[f"{k[0] and k[0].value}-{k[1].__name__}"
                                                    for k in WORKER])
def test_listed_worker_transition_agrees_with_step(key):
    phase, event_type = key
    d, event = worker_scenario(phase, event_type)
    assert worker_phase(d, "w0") is phase
    outcome = step(d.state, event)
    assert not isinstance(outcome, ProtocolError), outcome
    after, _ = outcome
    allowed = with_internal_moves(WORKER[key], WORKER_INTERNAL)
    assert after.worker("w0").phase in allowed


# ---------------------------------------------------------------------------------------------
# Renderings.


def test_dot_names_every_phase():
    dot = to_dot()
    assert dot.startswith("digraph") and dot.rstrip().endswith("}")
    for phase in LearnerPhase:
        assert f'"learner.{phase.value}"' in dot, phase
    for phase in WorkerPhase:
        assert f'"worker.{phase.value}"' in dot, phase
    for (_, event), _ in LEARNER.items():
        assert event.__name__ in dot


def test_markdown_names_every_phase():
    md = to_markdown()
    assert md.splitlines()[0].startswith("|")
    for phase in LearnerPhase:
        assert phase.value in md, phase
    for phase in WorkerPhase:
        assert phase.value in md, phase
    rows = [line for line in md.splitlines()[2:] if line.strip()]
    assert len(rows) == len(LEARNER) + len(WORKER)


def test_initial_phase_is_offline():
    assert initial_state(CONFIG).learner.phase is L.OFFLINE


# ---------------------------------------------------------------------------------------------
# Boundary acknowledgements: not in the learner table; they only release WAITING -> SCORING.


def test_boundary_acknowledgements_move_the_learner_only_out_of_waiting():
    """VersionEvaluated and CheckpointWritten move no phase by themselves: the learner leaves
    WAITING (the table's internal move) only once its batch is complete *and* the newest
    version's boundaries are acknowledged, so the last acknowledgement may take it to SCORING."""
    config = small_config(eval_every=1, checkpoint_every=1)
    d = Driver(config)
    d.pump_until_command(lambda c: isinstance(c, Checkpoint) and c.version == 1)
    d.drop_queued(lambda c: isinstance(c, (Evaluate, Checkpoint)))
    d.pump()
    assert d.state.learner.phase is L.WAITING and d.state.committed == 1
    assert d.state.batches[0].completed == config.samples_per_batch
    after, commands = step(d.state, VersionEvaluated(1, 0.5))
    assert after.learner.phase is L.WAITING and after.evaluated[-1] == 1 and commands == ()
    d.state = after
    after, commands = step(d.state, CheckpointWritten(1, version_digest(1)))
    assert after.learner.phase is L.SCORING
    assert after.learner.phase in with_internal_moves((L.WAITING,), LEARNER_INTERNAL)
    assert [type(c).__name__ for c in commands] == ["ScoreProbabilities"]


@pytest.mark.parametrize("phase", [L.SCORING, L.FORWARD, L.APPLYING, L.COMMITTING, L.FINISHED])
def test_boundary_acknowledgements_do_not_move_a_busy_learner(phase):
    config = small_config(eval_every=1, checkpoint_every=1)
    d = Driver(config)
    if phase is L.FINISHED:
        finish(d)
    else:
        d.pump_to_phase(phase, update=1)
    v = d.state.committed
    for event in (VersionEvaluated(v, 0.5), CheckpointWritten(v, version_digest(v)),
                  VersionEvaluated(v + 1, 0.5), CheckpointWritten(v + 1, version_digest(v + 1))):
        outcome = step(d.state, event)
        if isinstance(outcome, ProtocolError):
            continue
        after, commands = outcome
        assert after == d.state and commands == (), f"{event} in {phase.value}"
