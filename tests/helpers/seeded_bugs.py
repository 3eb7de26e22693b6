"""Seeded bugs: small, plausible mistakes applied to the pure core with pytest's `monkeypatch`.

Each `SeededBug` names the mistake, the smallest bounds under which `invar-check` must catch
it, the properties allowed to catch it (the first one is the one it is *meant* to violate),
and `apply(monkeypatch)`, which swaps one module attribute of `invar.model.core` (a handler
in `core._HANDLERS`, a helper function, or the core's reference to `schedule`) or of its fast
paths, `invar.model.fast`. The invariants
(`invar.model.invariants`) and the world's fakes (`invar.testing`) are never touched: they
keep their own references, so the mutant is judged by the correct specification.

`replay(bug, events, model)` steps the core events of a counterexample (as extracted by
`checker.cli.core_events`) through the core as it currently is (mutated or not) and says
which properties the last event violates: the check that a trace really is a counterexample.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from checker.invar_model import Bounds, InvarModel
from invar.model import core, fast, schedule
from invar.model.core import logical_projection, run_complete
from invar.model.errors import ProtocolError
from invar.model.invariants import transition_violations, violations
from invar.model.messages import (
    Completions,
    ForwardObserved,
    LearnerStarted,
    Publish,
    RequestsCompleted,
    RetainVersion,
    VersionPublished,
    WorkerConnected,
)
from invar.model.ragged import Ragged
from invar.model.shell import deliver
from invar.model.state import (
    LearnerPhase,
    Sample,
    WorkerPhase,
    WorkerState,
    evolve,
    initial_state,
)
from invar.model.transitions import learner_accepts
from invar.model.world import unrefused_forgery

REFUSED = "correct_components_never_refused"
TRANSITION = "transition_invariants"
FINAL = "completed_run_matches_canonical_schedule"
FORGED = "forged_events_are_refused"


@dataclass(frozen=True)
class SeededBug:
    name: str
    description: str
    bounds: Bounds
    prop: str
    """The property the bug must be caught by."""
    detail: str
    """Text the replayed violation's message must contain (which check, what went wrong)."""
    apply: Callable[[Any], None] = field(repr=False)
    """apply(monkeypatch): install the mutant."""
    finish_when: str = "any_failure"
    """How far the search goes: the first alarm, or (for a bug whose first alarm is another
    property) every property decided."""


# ---------------------------------------------------------------------------------------------
# The mutants. Each wraps or replaces one attribute; `original` is read at apply time.


def _duplicate_completion_applied_twice(mp: Any) -> None:
    original = core._HANDLERS[RequestsCompleted]

    def handler(state, event):
        outcome = original(state, event)
        request = event.completions[0].request if event.completions else None
        batch = state.batch(request.batch) if request is not None else None
        if isinstance(outcome, core._NoOp) and "duplicates" in outcome.counts and batch:
            # The bug: a re-delivered completion is applied again: written over its slot and
            # counted a second time.
            position = request.prompt * state.config.group_size + request.sample
            again = batch.with_slots({position: batch.slots[position]})
            again = evolve(again, completed=again.completed + 1)
            return core._put_batch(state, again), []
        return outcome

    mp.setitem(core._HANDLERS, RequestsCompleted, handler)


class _OlderGenVersion(types.ModuleType):
    """The core's view of `schedule`, with gen_version one version older (never below 0)."""

    def __init__(self) -> None:
        super().__init__("schedule_off_by_one")

    def __getattr__(self, name: str) -> Any:
        return getattr(schedule, name)

    @staticmethod
    def gen_version(config, batch):  # noqa: ANN001, ANN205
        return max(0, schedule.gen_version(config, batch) - 1)


def _staleness_off_by_one(mp: Any) -> None:
    # Only the core's reference: invariants and schedule's own helpers keep the true one.
    mp.setattr(core, "schedule", _OlderGenVersion())


def _publish_before_commit(mp: Any) -> None:
    reconcile = core._reconcile
    on_published = core._HANDLERS[VersionPublished]

    def early_reconcile(state, commands):
        state, out = reconcile(state, commands)
        learner = state.learner
        version = state.committed + 1
        # The bug: the version being committed is published as soon as its last step
        # finishes, without waiting for UpdateCommitted.
        if (state.publishing is None and learner.phase is LearnerPhase.COMMITTING
                and schedule.is_published(state.config, version)
                and version not in state.published):
            state = evolve(state, publishing=version)
            out = (*out, Publish(version, learner.step_digest))
        return state, out

    def accept_early(state, event):
        if (event.version == state.publishing and event.version not in state.published
                and event.version >= len(state.commit_digests)):
            state = evolve(state, published=state.published + (event.version,),
                           publishing=None,
                           retained=tuple(sorted({*state.retained, event.version})))
            return state, [RetainVersion(event.version)]
        return on_published(state, event)

    mp.setattr(core, "_reconcile", early_reconcile)
    mp.setitem(core._HANDLERS, VersionPublished, accept_early)


def _committed_update_redone_after_restart(mp: Any) -> None:
    original = core._HANDLERS[LearnerStarted]

    def handler(state, event):
        restart = state.learner.phase is not LearnerPhase.OFFLINE
        outcome = original(state, event)
        if restart and not isinstance(outcome, (ProtocolError, core._NoOp)):
            after, commands = outcome
            if after.committed > 0:
                # The bug: a restarted learner resumes at the update *before* the last commit,
                # so that committed update is done (and committed) again.
                after = evolve(after, commit_digests=after.commit_digests[:-1])
                after = evolve(after, learner=core._fresh_learner(after, event.incarnation))
            return after, commands
        return outcome

    mp.setitem(core._HANDLERS, LearnerStarted, handler)


def _cotangent_for_another_step(mp: Any) -> None:
    original = core._HANDLERS[ForwardObserved]

    def handler(state, event):
        learner = state.learner
        if (learner_accepts(learner.phase, ForwardObserved) and event.attempt == learner.attempt
                and learner.scores is not None):
            # The bug: the binding check (observation id and pre-step digest) is skipped: any
            # forward of this attempt is taken as the current step's.
            inputs = learner.scores.inputs
            command = core._cotangent(state.config, inputs.steps[learner.step], event)
            learner = evolve(learner, phase=LearnerPhase.APPLYING, cotangent=command,
                             forward_digest=command.forward_digest)
            return evolve(state, learner=learner), [command]
        return original(state, event)

    mp.setitem(core._HANDLERS, ForwardObserved, handler)


def _reissued_request_new_seed(mp: Any) -> None:
    original = core._Launches.command

    def command(self, version):
        launches = original(self, version)
        if self.slot.incarnation:
            # The bug: the seed is derived with the worker's incarnation, so a request
            # re-issued to a reconnected worker samples with a new seed (the first issue is
            # unaffected).
            seeds = tuple(schedule.derive_seed(seed, "incarnation", self.slot.incarnation)
                          for seed in launches.seeds)
            launches = dataclasses.replace(launches, seeds=seeds)
        return launches

    mp.setattr(core._Launches, "command", command)


def _batch_filled_in_completion_order(mp: Any) -> None:
    original = core._HANDLERS[RequestsCompleted]

    def handler(state, event):
        request = event.completions[0].request if event.completions else None
        before = state.batch(request.batch) if request is not None else None
        outcome = original(state, event)
        if before is None or isinstance(outcome, (ProtocolError, core._NoOp)):
            return outcome
        after, commands = outcome
        batch = after.batch(request.batch)
        position = request.prompt * state.config.group_size + request.sample
        first_free = next(i for i, s in enumerate(before.slots) if not isinstance(s, Sample))
        if first_free != position:
            # The bug: the k-th completion to arrive fills slot k (arrival order), not the
            # slot of its request id.
            batch = batch.with_slots({first_free: batch.slots[position],
                                      position: batch.slots[first_free]})
            after = core._put_batch(after, batch)
        return after, commands

    mp.setitem(core._HANDLERS, RequestsCompleted, handler)


def _version_released_too_early(mp: Any) -> None:
    def needed(state, version):
        if version == state.published[-1]:
            return True
        batches = schedule.batches_of_version(state.config, version)
        # The bug: a version is kept only until its last batch is *admitted*, not completed.
        if any(b >= state.admitted for b in batches):
            return True
        return any(w.phase is core.WorkerPhase.LOADING and w.version == version
                   for w in state.workers)

    mp.setattr(core, "_version_needed", needed)


def _repeated_connection_resets_the_worker(mp: Any) -> None:
    def handler(state, event):
        known = state.worker(event.worker)
        # The bug: `<` for `<=`, so a repeat of the current incarnation's connection is taken
        # for a new worker, which takes back its requests and starts its loads again.
        if known is not None and event.incarnation < known.incarnation:
            return core._LATE
        if known is not None:
            state = core._requeue(state, known)
        fresh = WorkerState(event.worker, event.incarnation, WorkerPhase.IDLE, None, 0, 0)
        return core._put_worker(state, fresh), []

    mp.setitem(core._HANDLERS, WorkerConnected, handler)


def _negative_tokens_accepted(mp: Any) -> None:
    original = core._sample_problem

    def problem(tokens, logprobs, reward):
        # The bug: the check of each completion never looks at a token's sign.
        return original(tuple(map(abs, tokens)), logprobs, reward)

    mp.setattr(core, "_sample_problem", problem)


def _negative_tokens_plausible_in_a_large_frame(mp: Any) -> None:
    original = fast.frame_plausible

    def plausible(config, admitted, frame):
        # The bug: the column pass over a large frame never looks at a token's sign.
        tokens = Ragged(np.abs(frame.tokens.values), frame.tokens.lengths)
        return original(config, admitted, Completions._made(
            frame.requests, frame.versions, tokens, frame.behavior_logprobs, frame.rewards))

    mp.setattr(fast, "frame_plausible", plausible)


SEEDED_BUGS: tuple[SeededBug, ...] = (
    SeededBug("duplicate_completion_applied_twice",
              "a re-delivered completion is applied (and counted) again",
              Bounds(duplicates=1), "batch_counters_consistent", "counts 0/2, holds 0/1",
              _duplicate_completion_applied_twice),
    # The first alarm is launch_only_published_and_loaded (the batch is admitted before its
    # true version is published); searched on, the consumption record is caught too.
    SeededBug("staleness_off_by_one",
              "the core's gen_version returns one version older than the schedule",
              Bounds(max_staleness=0), "consumed_version_is_scheduled",
              "update 1 consumed samples of versions [0], scheduled 1", _staleness_off_by_one,
              finish_when="exhausted"),
    SeededBug("publish_before_commit",
              "the version being committed is published before UpdateCommitted",
              Bounds(), TRANSITION, "commands_respect_schedule: version 1 published before "
              "its commit", _publish_before_commit),
    SeededBug("committed_update_redone_after_restart",
              "a restarted learner resumes at the update before the last commit",
              Bounds(learner_crashes=1), "each_update_commits_once",
              "0 versions committed for 1 commits", _committed_update_redone_after_restart),
    SeededBug("cotangent_for_another_step",
              "ForwardObserved's binding check is skipped: a forward of another step is used",
              Bounds(optimizer_steps=2, duplicates=1), TRANSITION,
              "cotangent_bound_to_its_step", _cotangent_for_another_step),
    SeededBug("reissued_request_new_seed",
              "a request re-issued to a new worker incarnation gets a new seed",
              Bounds(worker_crashes=1, total_updates=1), TRANSITION,
              "commands_respect_schedule: request (0, 0, 0) launched with another seed",
              _reissued_request_new_seed),
    # The first alarm is deterministic_components_never_diverge (a repeat lands on another
    # slot's sample); searched on, the final projection is caught too.
    SeededBug("batch_filled_in_completion_order",
              "completions fill a batch's slots in arrival order, not request-id order",
              Bounds(), FINAL, "projection", _batch_filled_in_completion_order,
              finish_when="all_decided"),
    SeededBug("version_released_too_early",
              "a version is released once its batches are admitted, though still incomplete",
              Bounds(), "version_retained_while_in_use",
              "version 0 released while batch 1 is incomplete", _version_released_too_early),
    # Only a world that repeats a connection sees it (`Bounds.repeats`): no other fault does.
    SeededBug("repeated_connection_resets_the_worker",
              "a repeat of the current incarnation's WorkerConnected resets the worker",
              Bounds(repeats=1), TRANSITION, "every_event_counts",
              _repeated_connection_resets_the_worker),
    # Only forgeries send a negative token id; the large frame reaches the column pass.
    SeededBug("negative_token_accepted",
              "a completion's negative token id is not refused", Bounds(forgeries=True),
              FORGED, "tokens=(-1,)", _negative_tokens_accepted),
    SeededBug("negative_token_plausible_in_a_large_frame",
              "a large frame's column pass does not look at the tokens' sign",
              Bounds(forgeries=True), FORGED, "tokens=(-1,)",
              _negative_tokens_plausible_in_a_large_frame),
)

BY_NAME = {bug.name: bug for bug in SEEDED_BUGS}


# ---------------------------------------------------------------------------------------------
# Replaying a counterexample's core events through the core as it is now.


def replay(events: list[Any], model: InvarModel) -> dict[str, str]:
    """Step `events` (from `checker.cli.core_events`; a tuple entry is a driver restart)
    through `step` as it is now; return the properties the *last* event violates, each with
    what is wrong (empty: none). A refusal ends the replay, wherever it happens."""
    state = durable = initial_state(model.config)
    broken: dict[str, str] = {}
    for index, event in enumerate(events):
        last = index == len(events) - 1
        if isinstance(event, tuple):
            state = durable
            continue
        delivery = deliver(state, event)
        if delivery.error is not None:
            where = "" if last else f"event {index} of {len(events)}, before the last: "
            return {REFUSED: f"{where}{delivery.error.reason.value}: {delivery.error.detail}"}
        after = delivery.state
        if last:
            broken.update(violations(after))
            moved = transition_violations(state, delivery.commands, after)
            if moved:
                broken[TRANSITION] = "; ".join(f"{k}: {v}" for k, v in moved.items())
            if run_complete(after) and logical_projection(after) != model.canonical_projection:
                broken[FINAL] = "the completed run's projection is not the canonical one"
            forgery = unrefused_forgery(after) if model.bounds.forgeries else ""
            if forgery:
                broken[FORGED] = forgery
        if delivery.durable:
            durable = after
        state = after
    return broken
