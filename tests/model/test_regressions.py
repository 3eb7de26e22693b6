"""Regression tests, one per finding of the review of the core and its world (F1-F6).

Each test fails on the code before the fix (the commit before "core: acknowledged evaluations
and checkpoints, forward-bound cotangents, ledger of what was applied, durable releases"):
most for the reason named in its docstring; those that need `invar.model.world`, `shell` or a
new message field import them inside the test, so on the old code they fail at that import and
the others still run against the old core. F6 guards wiring the old code already had right: it
is the test that kills the mutation "the cotangent uses the first len(plan) rows".
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
import pytest

from helpers.core_driver import AnsweringWith, Driver, commands_of, small_config
from invar.model import (
    LearnerPhase,
    ObjectiveConfig,
    ProtocolError,
    Reason,
    RunConfig,
    logical_projection,
    outstanding_commands,
    requires_fsync,
    run_complete,
    schedule,
    step,
    violations,
)
from invar.model import messages as m
from invar.model.invariants import consumed_version_is_scheduled
from invar.model.objective import (
    ObjectiveTerms,
    group_advantages,
    objective,
    pad,
)
from invar.model.ragged import Ragged
from invar.testing import canonical_run, reply, version_digest


def finish(d: Driver, max_timers: int = 50) -> None:
    """Answer everything FIFO, firing the retry timer whenever the network is quiet."""
    for _ in range(max_timers):
        d.pump()
        if run_complete(d.state):
            return
        assert d.state.timer_armed, "stuck without a retry timer"
        d.apply(m.TimerFired())
    raise AssertionError("did not complete")


# ---------------------------------------------------------------------------------------------
# World helpers (imported lazily: the world did not exist before the fix).


def _fifo_until(world, predicate, hold: frozenset = frozenset(), limit: int = 5_000):
    """Deliver the first message in flight whose key is not held, until `predicate(world)`."""
    from invar.model import world as w
    for _ in range(limit):
        if predicate(world):
            return world
        assert not world.refused and not world.broken, world.refused or world.broken
        free = [msg for msg in world.network if msg.key not in hold]
        assert free, "nothing left to deliver before the predicate held"
        world = w.deliver_message(world, free[0].key)
    raise AssertionError("predicate never held")


def _in_flight(world, to: str, kind: type, **fields):
    return [msg for msg in world.network if msg.to == to and isinstance(msg.body, kind)
            and all(_field(msg.body, k) == v for k, v in fields.items())]


def _field(body, name: str):
    if name in ("update", "step", "serial"):
        return getattr(body.observation, name)
    return getattr(body, name)


def _fifo(world, limit: int):
    """`run_fifo` that gives up after `limit` deliveries instead of raising."""
    from invar.model import world as w
    from invar.model.core import outstanding_commands as outstanding
    for _ in range(limit):
        if world.refused or world.broken:
            return world
        if world.network:
            world = w.deliver_message(world, world.network[0].key)
        elif world.timer and outstanding(world.core):
            world = w.fire_timer(world)
        else:
            return world
    return world


# ---------------------------------------------------------------------------------------------
# F1: a duplicated older RunForward must not replace the pending binding (livelock).

F1_CONFIG = RunConfig(prompts_per_batch=1, group_size=2, max_staleness=1, sync_period=1,
                      optimizer_steps=2, total_updates=2, max_inflight_batches=2, seed=1)


def _later_replaces(original):
    """The naive learner rule of the finding: any forward other than the pending one is run
    and replaces the pending binding ("a later forward replaces a pending one")."""
    from invar.model.world import Decision

    def decide(self, command):
        if isinstance(command, m.RunForward) and command.attempt == self.attempt:
            pending = self.pending
            if pending is not None and command.observation == pending.observation:
                return Decision.REPEAT
            return Decision.RUN
        return original(self, command)
    return decide


def _f1_schedule(world):
    """The schedule of the finding: RunForward(o_0) is duplicated; one copy is delivered at
    once, the other only after RunForward(o_1) ran and the core's cotangent for o_1 is on its
    way to the learner. Returns the world just after the late copy reached the learner."""
    from invar.model import world as w
    from invar.model.shell import LEARNER
    world = _fifo_until(world, lambda x: bool(_in_flight(x, LEARNER, m.RunForward, update=0,
                                                          step=0)))
    (first,) = _in_flight(world, LEARNER, m.RunForward, update=0, step=0)
    world = w.duplicate(world, first.key)
    world = w.deliver_message(world, first.key)  # one copy now, the other held back
    world = _fifo_until(world, lambda x: bool(_in_flight(x, LEARNER, m.ApplyCotangent,
                                                          update=0, step=1)),
                        hold=frozenset({first.key}))
    assert world.learner.rules.pending.observation.step == 1
    return w.deliver_message(world, first.key), first.body


def test_f1_duplicated_older_forward_is_ignored_and_the_run_completes():
    """F1 (livelock): with K=2, RunForward(o_0) duplicated and delivered after RunForward(o_1)
    made a "later replaces" learner swap its pending binding to o_0 and then refuse the core's
    cotangent for o_1 at every re-send. `LearnerRules.decide` ignores an older forward: the
    same schedule in the world completes canonically."""
    from invar.model import world as w
    from invar.model.world import Decision
    world, late = _f1_schedule(w.new_world(F1_CONFIG))
    assert world.learner.rules.decide(late) == Decision.IGNORE
    assert world.learner.rules.pending.observation.step == 1, "the binding was replaced"
    world = w.run_fifo(world)
    assert not world.refused and not world.broken
    assert run_complete(world.core)
    assert logical_projection(world.core) == logical_projection(canonical_run(F1_CONFIG).state)


def test_f1_the_later_replaces_rule_refuses_the_cotangent_forever(monkeypatch):
    """F1, the other half: the same schedule with the naive rule never completes. The learner
    is bound to o_0, the core is bound to o_1 and re-sends the same cotangent at every timer,
    and the learner refuses it every time."""
    from invar.model import world as w
    from invar.model.world import Decision, LearnerRules
    monkeypatch.setattr(LearnerRules, "decide", _later_replaces(LearnerRules.decide))
    world, late = _f1_schedule(w.new_world(F1_CONFIG))
    assert world.learner.rules.pending.observation == late.observation  # replaced
    stuck = _fifo(world, limit=400)
    assert not run_complete(stuck.core) and not stuck.refused
    core = stuck.core
    assert core.learner.phase is LearnerPhase.APPLYING and core.learner.step == 1
    (cotangent,) = [c for c in outstanding_commands(core) if isinstance(c, m.ApplyCotangent)]
    assert stuck.learner.rules.decide(cotangent) == Decision.REFUSE
    # Every re-send is the identical command; a refusal changes nothing: refused forever.
    again, commands = step(core, m.TimerFired())
    assert cotangent in commands
    assert stuck.learner.rules.decide(cotangent) == Decision.REFUSE
    assert core.noops.late >= 1  # the re-run o_0's ForwardObserved was late at the core


def test_f1_unit_older_forward_after_a_newer_one():
    """F1 at the level of the rules: after o_0 was applied and o_1 forwarded, a re-delivered
    RunForward(o_0) is ignored, and the cotangent of o_1 is still accepted; the naive rule
    runs o_0 again and then refuses that cotangent (and nothing it does later changes it)."""
    from invar.model.world import Decision, LearnerRules, forward_reply
    k = 2
    requests = schedule.request_ids(F1_CONFIG, 0)
    o0, o1 = m.ObservationId(0, 0, 0), m.ObservationId(0, 1, 1)
    f0 = m.RunForward(o0, 0, requests[:1])
    f1 = m.RunForward(o1, 0, requests[1:])
    r0, r1 = forward_reply(f0, k), forward_reply(f1, k)
    terms = ObjectiveTerms(0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 2)
    c0 = m.ApplyCotangent(o0, 0, "w0", m.matrix_digest(r0.current_logprobs),
                          Ragged.of(((0.1, 0.1),)), terms)
    c1 = m.ApplyCotangent(o1, 0, "w0.1", m.matrix_digest(r1.current_logprobs),
                          Ragged.of(((0.1, 0.1),)), terms)

    def after_o1(rules):
        assert rules.decide(f0) == Decision.RUN
        rules = rules.forwarded(f0, r0)
        assert rules.decide(c0) == Decision.RUN
        rules = rules.stepped_to(c0, "w0.1")
        assert rules.decide(f1) == Decision.RUN
        return rules.forwarded(f1, r1)

    rules = after_o1(LearnerRules(attempt=0, weights="w0", version=0))
    assert rules.decide(f0) == Decision.IGNORE
    assert rules.decide(c1) == Decision.RUN

    class LaterReplaces(LearnerRules):
        decide = _later_replaces(LearnerRules.decide)

    naive = after_o1(LaterReplaces(attempt=0, weights="w0", version=0))
    assert naive.decide(f0) == Decision.RUN
    naive = naive.forwarded(f0, forward_reply(f0, k))
    for _ in range(3):  # the core re-sends c1 unchanged; REFUSE leaves the rules unchanged
        assert naive.decide(c1) == Decision.REFUSE


# ---------------------------------------------------------------------------------------------
# F3: the cotangent names the forward digest it was computed from.


def test_f3_cotangent_names_its_forward_and_a_learner_with_another_refuses():
    """F3: with non-reproducible forwards, a re-sent RunForward may be answered twice with
    different log-probs. The core computes its cotangent from the first answer it accepts and
    must say so (`ApplyCotangent.forward_digest`); the second answer is a divergent no-op, the
    re-sent cotangent still names the first; a learner whose pending forward is the second
    refuses it (applying it would back-propagate a cotangent through another graph)."""
    from invar.model.world import Decision, LearnerRules, forward_reply
    config = small_config()
    k = config.optimizer_steps
    d = Driver(config)
    d.pump_to_phase(LearnerPhase.FORWARD, 0)
    (forward,) = [c for c in outstanding_commands(d.state) if isinstance(c, m.RunForward)]
    first = forward_reply(forward, k, noise=1)
    second = forward_reply(forward, k, noise=2)
    assert first.current_logprobs != second.current_logprobs
    (cotangent,) = commands_of(d.apply(first), m.ApplyCotangent)
    assert cotangent.forward_digest == m.matrix_digest(first.current_logprobs)
    assert cotangent.forward_digest != m.matrix_digest(second.current_logprobs)
    before = d.state
    after, commands = step(before, second)
    assert after == before and commands == () and after.noops.divergent == 1
    _, resent = step(after, m.TimerFired())
    assert cotangent in resent  # the same binding, forward digest included

    rules = LearnerRules(attempt=forward.attempt, weights=version_digest(0), version=0)
    assert rules.forwarded(forward, second).decide(cotangent) == Decision.REFUSE
    assert rules.forwarded(forward, first).decide(cotangent) == Decision.RUN
    wrong_digest = replace(cotangent, forward_digest=m.matrix_digest(second.current_logprobs))
    assert rules.forwarded(forward, first).decide(wrong_digest) == Decision.REFUSE


# ---------------------------------------------------------------------------------------------
# F4: evaluations and checkpoints are outstanding until acknowledged.


def _is(kind: str, version: int):
    return lambda c: type(c).__name__ == kind and c.version == version


def test_f4_boundaries_are_resent_until_acknowledged_and_gate_the_next_update():
    """F4 (core side): Evaluate and Checkpoint used to be fire-and-forget: dropped once, the
    boundary was never evaluated or kept, and the learner went on to the next update (so a
    late Evaluate could not see those weights any more). Now each is outstanding until
    VersionEvaluated / CheckpointWritten arrives: the timer re-sends it, the next update does
    not start before, and `run_complete` needs the final ones."""
    config = small_config(eval_every=1, checkpoint_every=2, total_updates=3)
    d = Driver(config)
    d.pump_until_command(_is("Evaluate", 1))
    dropped = d.drop_queued(_is("Evaluate", 1))
    assert len(dropped) == 1
    d.pump()
    assert m.Evaluate(1) in outstanding_commands(d.state), "a dropped Evaluate is forgotten"
    assert d.state.committed == 1, "the run went on past version 1 without its evaluation"
    batch = d.state.batches[0]
    assert batch.batch == 1 and batch.completed == config.samples_per_batch
    assert d.state.learner.phase is LearnerPhase.WAITING, "update 1 started before Evaluate(1)"
    assert not [c for c in commands_of(d.commands, m.ScoreProbabilities) if c.update == 1]
    assert d.state.timer_armed
    assert m.Evaluate(1) in d.apply(m.TimerFired())
    d.pump_until_command(lambda c: isinstance(c, m.ScoreProbabilities) and c.update == 1)
    assert d.state.evaluated == (0, 1)

    # Version 2 is an evaluation and a checkpoint boundary: lose the Checkpoint.
    d.pump_until_command(_is("Checkpoint", 2))
    assert len(d.drop_queued(_is("Checkpoint", 2))) == 1
    d.pump()
    assert d.state.committed == 2 and d.state.learner.phase is LearnerPhase.WAITING
    assert outstanding_commands(d.state) == (m.Checkpoint(2),)
    assert m.Checkpoint(2) in d.apply(m.TimerFired())

    # The final version: committed and published is not complete without both.
    d.pump_until_command(_is("Checkpoint", 3))
    d.drop_queued(lambda c: isinstance(c, (m.Evaluate, m.Checkpoint)))
    d.pump()
    assert d.state.committed == 3 and d.state.published[-1] == 3
    assert not run_complete(d.state), "complete without the final evaluation and checkpoint"
    assert set(outstanding_commands(d.state)) == {m.Evaluate(3), m.Checkpoint(3)}
    finish(d)
    assert d.state.evaluated == (0, 1, 2, 3) and d.state.checkpointed == (2, 3)
    assert violations(d.state) == {}
    assert logical_projection(d.state) == logical_projection(canonical_run(config).state)


def test_f4_acknowledgements_are_idempotent_and_checked():
    """F4, the acknowledgements: a repeated one is a duplicate, one for a boundary not (yet)
    due is refused, a checkpoint of other weights is refused."""
    config = small_config(eval_every=1, checkpoint_every=2, total_updates=3)
    d = Driver(config)
    d.pump(lambda d: d.state.committed == 2 and d.state.checkpointed == (2,))
    assert isinstance(step(d.state, m.VersionEvaluated(3, 0.5)), ProtocolError)
    refused = step(d.state, m.CheckpointWritten(3, version_digest(3)))
    assert isinstance(refused, ProtocolError) and refused.reason is Reason.UNREQUESTED_BOUNDARY
    again, commands = step(d.state, m.CheckpointWritten(2, version_digest(2)))
    assert again == d.state and commands == () and again.noops.duplicates == 1
    other = step(d.state, m.CheckpointWritten(2, "not-version-2"))
    assert isinstance(other, ProtocolError) and other.reason is Reason.COMMIT_DIGEST_MISMATCH


# ---------------------------------------------------------------------------------------------
# F5: the ledger records what was applied, as the components reported it.

F5_CONFIG = small_config()  # B=2, G=2, K=2, N=3


def as_long_as(forward: m.ForwardObserved, asked: tuple) -> m.ForwardObserved:
    """A forward of other samples, each row cut or padded to the length of the sample asked
    for in its place (responses differ in length: a mixed-up learner of fixed-shape rows)."""
    from invar.model.world import response_tokens
    rows = [tuple(row[:response_tokens(r)]) + (-0.5,) * (response_tokens(r) - len(row))
            for row, r in zip(forward.current_logprobs, asked)]
    return replace(forward, current_logprobs=Ragged.of(rows))


class OtherPositions(Driver):
    """A buggy learner: forwards the samples of another minibatch than the one asked for."""

    def answer(self, command):
        if isinstance(command, m.RunForward) and command.attempt == self.learner_attempt:
            requests = schedule.request_ids(self.config, command.observation.update)
            others = tuple(r for r in requests if r not in command.requests)
            return as_long_as(reply(replace(command, requests=others[:len(command.requests)]),
                                    self.config.optimizer_steps), command.requests)
        return super().answer(command)


class SkipsTheLastStep(Driver):
    """A buggy learner: reports the last step of the last update finished without applying
    it (its weights stay those before the step), then commits (and keeps) those weights."""

    disk: dict

    def answer(self, command):
        k, last = self.config.optimizer_steps, self.config.total_updates - 1
        if (isinstance(command, m.ApplyCotangent) and command.attempt == self.learner_attempt
                and (command.observation.update, command.observation.step) == (last, k - 1)):
            return m.StepFinished(command.observation, command.attempt, command.pre_step_digest)
        if isinstance(command, m.Commit):
            self.disk = {**getattr(self, "disk", {}), command.update + 1: command.expected_digest}
        event = super().answer(command)
        if type(event).__name__ == "CheckpointWritten":  # the weights it really kept
            event = replace(event,
                            weights_digest=self.disk.get(event.version, event.weights_digest))
        return event


def test_f5_a_learner_forwarding_other_positions_changes_the_projection():
    """F5: the ledger used to record the plan recomputed from the schedule, so a learner that
    forwarded other samples left the projection canonical. Now each step records the digest of
    the log-probs the learner returned for it: the projection shows the difference."""
    d = OtherPositions(F5_CONFIG)
    finish(d)
    reference = canonical_run(F5_CONFIG).state
    assert logical_projection(d.state) != logical_projection(reference)
    assert [s.forward_digest for s in d.state.ledger[0].steps] != \
        [s.forward_digest for s in reference.ledger[0].steps]


def test_f5_in_the_world_a_learner_forwarding_other_positions_is_seen(monkeypatch):
    """F5 in the shared world: its learner, made to forward the samples of the other
    minibatch, completes a run the core accepts step by step, and the run's projection is not
    the canonical one (the model checker's "matches canonical" property fails)."""
    from invar.model import world as w
    honest = w.forward_reply
    canonical = logical_projection(canonical_run(F5_CONFIG).state)  # before the bug

    def other_positions(command, optimizer_steps, noise=0):
        requests = schedule.request_ids(F5_CONFIG, command.observation.update)
        others = tuple(r for r in requests if r not in command.requests)
        return as_long_as(honest(replace(command, requests=others[:len(command.requests)]),
                                 optimizer_steps, noise), command.requests)

    monkeypatch.setattr(w, "forward_reply", other_positions)
    world = w.run_fifo(w.new_world(F5_CONFIG))
    assert not world.refused and not world.broken and run_complete(world.core)
    assert violations(world.core) == {}  # positions are the core's: the plan was asked for
    assert logical_projection(world.core) != canonical


def test_f5_a_learner_skipping_a_step_changes_the_projection():
    """F5: a learner that applies one step fewer (reports it finished, weights unchanged) and
    commits: the old projection (consumed samples, recomputed plan, publications) could not
    see it; the ledger now records each step's post-step digest and the commit digest."""
    d = SkipsTheLastStep(F5_CONFIG)
    finish(d)
    reference = canonical_run(F5_CONFIG).state
    assert logical_projection(d.state) != logical_projection(reference)
    last = d.state.ledger[-1]
    assert last.steps[-1].post_step_digest == last.steps[-2].post_step_digest
    assert last.commit_digest != reference.ledger[-1].commit_digest


def test_f5_invariant_catches_a_ledger_of_other_positions_or_fewer_steps():
    """F5, the invariant: `consumed_version_is_scheduled` compares what was applied with the
    schedule, so a record with one step fewer, other positions, or samples of another version
    fails it (with the old, recomputed plan the comparison was a tautology)."""
    state = canonical_run(F5_CONFIG).state
    assert consumed_version_is_scheduled(state) == ""
    record = state.ledger[1]
    fewer = replace(record, steps=record.steps[:-1])
    swapped = replace(record, steps=tuple(replace(s, positions=o.positions) for s, o in
                                          zip(record.steps, reversed(record.steps))))
    assert swapped.steps != record.steps
    stale = replace(record, sample_versions=(record.sample_versions[0] + 1,)
                    + record.sample_versions[1:])
    recommitted = replace(record, commit_digest="elsewhere")
    for bad, words in ((fewer, "applied steps"), (swapped, "minibatch plan"),
                       (stale, "versions"), (recommitted, "committed")):
        broken = replace(state, ledger=state.ledger[:1] + (bad,) + state.ledger[2:])
        assert words in consumed_version_is_scheduled(broken)


def test_f5_ledger_fields_are_what_the_components_reported():
    """F5: nothing in a ledger record is recomputed from the schedule: the scores digest is
    the digest of the reported proximal log-probs, each step's forward digest that of the
    reported current log-probs, the commit digest the learner's."""
    k = F5_CONFIG.optimizer_steps
    reported: dict = {"forwards": [], "scores": []}

    class Shifted(Driver):
        def answer(self, command):
            event = super().answer(command)
            if isinstance(event, m.ProbabilitiesReported):
                shifted = Ragged(event.proximal.values - 0.01, event.proximal.lengths)
                event = replace(event, proximal=shifted)
                reported["scores"].append(m.matrix_digest(event.proximal, event.reference))
            if isinstance(event, m.ForwardObserved):
                current = event.current_logprobs
                event = replace(event, current_logprobs=Ragged(current.values - 0.02,
                                                               current.lengths))
                reported["forwards"].append(m.matrix_digest(event.current_logprobs))
            return event

    d = Shifted(F5_CONFIG)
    finish(d)
    reference = canonical_run(F5_CONFIG).state
    ledger = d.state.ledger
    assert [r.scores_digest for r in ledger] == reported["scores"]
    assert [s.forward_digest for r in ledger for s in r.steps] == reported["forwards"]
    assert [r.scores_digest for r in ledger] != [r.scores_digest for r in reference.ledger]
    assert [r.commit_digest for r in ledger] == list(d.state.commit_digests[1:])
    assert all(r.sample_versions == tuple(schedule.gen_version(F5_CONFIG, r.update)
                                          for _ in r.requests) for r in ledger)
    assert len(reported["forwards"]) == k * F5_CONFIG.total_updates


# ---------------------------------------------------------------------------------------------
# F6: the cotangent is computed from the plan's rows.

F6_CONFIG = RunConfig(prompts_per_batch=2, group_size=3, max_staleness=1, sync_period=1,
                      optimizer_steps=2, total_updates=2, max_inflight_batches=2, seed=0,
                      objective=ObjectiveConfig(kl_coef=0.1))


@dataclass(frozen=True)
class Values:
    """Every row different (rewards, log-probs; lengths too unless `uniform`), so a cotangent
    computed from any rows but the plan's is wrong. Spread enough that some ratios
    current/proximal leave the clip range: the proximal rows then matter to the cotangent too
    (unclipped, decoupled PPO's gradient exp(c - b) does not depend on them)."""

    uniform: bool

    def length(self, r) -> int:
        return 2 if self.uniform else 1 + _pos(r) % 3

    def row(self, r, base: float, slope: float, salt: float = 0.0) -> tuple[float, ...]:
        return tuple(base - slope * _pos(r) - 0.013 * t - salt for t in range(self.length(r)))

    def reward(self, r) -> float:
        return (0.0, 1.0, 5.0, 3.0, 0.5, 1.5)[_pos(r)] + r.batch

    def behavior(self, r):
        return self.row(r, -0.1, 0.12)

    def proximal(self, r, update: int):
        return self.row(r, -0.2, 0.15, 0.01 * update)

    def reference(self, r):
        return self.row(r, -0.3, 0.04)

    def current(self, r, update: int, step_index: int):
        return self.row(r, -0.15, 0.05, 0.02 * update + 0.03 * step_index)


def _pos(r) -> int:
    return r.prompt * F6_CONFIG.group_size + r.sample


def _expected(v: Values, update: int, step_index: int, miswired: str = ""):
    """The objective of (update, step) from the plan's rows, computed here from the values the
    components reported; `miswired` names a part ("advantages", "proximal", "behavior",
    "reference") taken from the first len(plan) rows instead, as a miswired core would (None:
    it cannot even be computed, those rows having other lengths than the plan's)."""
    config = F6_CONFIG
    requests = schedule.request_ids(config, update)
    plan = schedule.minibatch_plan(config, update)[step_index]
    prefix = tuple(range(len(plan)))

    def rows(part: str) -> tuple[int, ...]:
        return prefix if part == miswired else plan

    rewards = np.array([v.reward(r) for r in requests], dtype=np.float64)
    advantages = group_advantages(rewards, config.group_size,
                                  config.objective.normalize_advantages)[list(rows("advantages"))]
    current, mask = pad([v.current(requests[i], update, step_index) for i in plan])
    proximal, _ = pad([v.proximal(requests[i], update) for i in rows("proximal")])
    behavior, _ = pad([v.behavior(requests[i]) for i in rows("behavior")])
    reference, _ = pad([v.reference(requests[i]) for i in rows("reference")])
    staleness = np.full(len(plan), schedule.staleness(config, update), dtype=np.float64)
    try:
        terms, cotangent = objective(config.objective, advantages, current, proximal, behavior,
                                     mask, reference=reference, staleness=staleness)
    except ValueError:
        return None
    return [getattr(terms, f.name) for f in fields(terms)], Ragged.from_padded(cotangent, mask)


def _close(a, b) -> bool:
    """Equal up to rounding: nested sequences of floats of the same shape."""
    if isinstance(a, (int, float)) or isinstance(b, (int, float)):
        return not isinstance(a, (tuple, list)) and not isinstance(b, (tuple, list)) and \
            bool(np.isclose(a, b, rtol=1e-12, atol=1e-15))
    return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("uniform", [False, True], ids=["ragged", "uniform"])
def test_f6_cotangent_is_the_objective_of_the_plans_rows(uniform):
    """F6: for every step of every update (K=2, plan chunks that are not prefixes, KL on), the
    core's ApplyCotangent carries exactly the objective's terms and cotangent computed here,
    independently, from the plan's rows: advantages from `group_advantages` of all the batch's
    rewards then indexed by the plan; proximal, behaviour and reference rows of the plan's
    positions. A core that used the first len(plan) rows for any of them fails: on ragged rows
    it cannot even compute the objective, on rows of one length it computes another one."""
    plans = [schedule.minibatch_plan(F6_CONFIG, u) for u in range(F6_CONFIG.total_updates)]
    prefix = tuple(range(len(plans[0][0])))
    assert all(chunk != prefix for plan in plans for chunk in plan), "pick another seed"
    values = Values(uniform)
    d = AnsweringWith(F6_CONFIG)
    d.values = values
    finish(d)
    cotangents = commands_of(d.commands, m.ApplyCotangent)
    assert [(c.observation.update, c.observation.step) for c in cotangents] == \
        [(u, s) for u in range(F6_CONFIG.total_updates)
         for s in range(F6_CONFIG.optimizer_steps)]
    for command in cotangents:
        update, step_index = command.observation.update, command.observation.step
        expected = _expected(values, update, step_index)
        assert expected is not None
        terms = [getattr(command.terms, f.name) for f in fields(command.terms)]
        assert _close(terms, expected[0]), (update, step_index, "terms")
        assert _close(command.cotangent, expected[1]), (update, step_index, "cotangent")
        # The test can tell: any part taken from the prefix rows gives other terms or another
        # cotangent, or none at all.
        for part in ("advantages", "proximal", "behavior", "reference"):
            miswired = _expected(values, update, step_index, miswired=part)
            assert miswired is None or not _close(miswired, expected), (part, update)
            if uniform:
                assert miswired is not None


# ---------------------------------------------------------------------------------------------
# F2: a release goes out only once it is durable in the journal.

F2_CONFIG = RunConfig(prompts_per_batch=1, group_size=2, max_staleness=2, sync_period=2,
                      optimizer_steps=2, total_updates=6, max_inflight_batches=3, seed=3)
F2_WORKERS = ("a", "b")


def test_f2_releases_require_a_durable_journal():
    """F2 (core side): `requires_fsync` is true for every step that sends a ReleaseVersion
    (the store deletes the weights; a restart from a journal without the release could still
    send a worker to load them)."""
    d = Driver(F2_CONFIG, workers=F2_WORKERS)
    releases = 0
    while (event := d.next_reply()) is not None:
        commands = d.apply(event)
        if any(isinstance(c, m.ReleaseVersion) for c in commands):
            releases += 1
            assert requires_fsync(event, commands), f"{event} releases without an fsync"
    assert run_complete(d.state) and releases >= 2


def _old_requires_fsync(event, commands) -> bool:
    """The durability rule before the fix: releases were not commit points."""
    return isinstance(event, (m.UpdateCommitted, m.LearnerStarted)) or any(
        isinstance(c, (m.Commit, m.Publish)) for c in commands)


def _held(msg, core) -> bool:
    """Batch 2 (the last batch of version 0) completes only after update 1 has committed, and
    version 2's publication (which releases version 0) is heard only after that."""
    body = msg.body
    if isinstance(body, m.RequestsCompleted) and body.completions[0].request.batch == 2:
        return core.committed < 2
    if isinstance(body, m.VersionPublished) and body.version == 2:
        batch = core.batch(2)
        return batch is not None and batch.completed < len(batch.slots)
    return False


def _delayed_path():
    """The FIFO run, except that the completions of batch 2 are held until update 1 has
    committed: the journal sync of that commit (and of version 2's Publish) happens while
    version 0 is still needed, and its release comes later, with version 2's publication.
    Yields the world after each delivery."""
    from invar.model import world as w
    world = w.new_world(F2_CONFIG, F2_WORKERS)
    yield world
    while world.network:
        free = [msg for msg in world.network if not _held(msg, world.core)]
        world = w.deliver_message(world, free[0].key)
        assert not world.refused and not world.broken
        yield world


def _restart_points(old_rule: bool, monkeypatch) -> list[tuple[int, str]]:
    """Restart the driver after each delivery of `_delayed_path`; the points where the
    restarted run breaks (a worker told to load a version the store deleted), with what broke.
    Every other restart must complete canonically."""
    from invar.model import shell
    from invar.model import world as w
    if old_rule:
        monkeypatch.setattr(shell, "requires_fsync", _old_requires_fsync)
    reference = logical_projection(canonical_run(F2_CONFIG, F2_WORKERS).state)
    broken = []
    world = None
    for point, world in enumerate(_delayed_path()):
        restarted = _fifo(w.restart_driver(world), limit=20_000)
        assert not restarted.refused, restarted.refused
        if restarted.broken:
            broken.append((point, restarted.broken))
        else:
            assert run_complete(restarted.core)
            assert logical_projection(restarted.core) == reference
    assert world is not None and run_complete(world.core)
    assert logical_projection(world.core) == reference
    return broken


def test_f2_the_delayed_schedule_releases_a_version_the_journal_needs():
    """The schedule of the F2 tests really sets the trap: at some point the store has deleted
    version 0 while a batch of version 0 was incomplete at the last journal sync of the old
    rule (the commit of update 1, which also sends version 2's Publish)."""
    from invar.model import world as w
    from invar.model.core import requires_fsync as rule
    journal, trap = None, False
    for world in _delayed_path():
        if journal is None and world.core.committed == 2:
            journal = world.core  # synced by the old rule too (UpdateCommitted)
            assert rule(m.UpdateCommitted(1, version_digest(2)), ())
            assert 0 in journal.retained and journal.batch(2).completed < 2
        if journal is not None and 0 not in world.store:
            trap = True
            break
    assert trap and isinstance(world, w.World)


def test_f2_driver_restart_never_loads_a_released_version(monkeypatch):
    """F2 (world side): with S=2, P=2 (versions 0, 2, 4 are released as the run goes on), a
    driver restart from the journal after any delivery of the delayed schedule completes
    canonically and never sends a worker to load a version the store no longer holds."""
    assert _restart_points(old_rule=False, monkeypatch=monkeypatch) == []


def test_f2_with_releases_not_durable_a_restart_breaks_the_world(monkeypatch):
    """F2, the other half: with the old durability rule (a release is not a commit point) the
    store deletes a version while the journal still needs it: a restart after the release
    of version 0 in the same schedule sends a worker to load the deleted version."""
    broken = _restart_points(old_rule=True, monkeypatch=monkeypatch)
    assert broken, "the old rule should break some restart"
    assert all("no longer holds" in text for _, text in broken)
