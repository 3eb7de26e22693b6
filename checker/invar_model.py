"""The Invar protocol as a checker model: the pure core inside the faulty world of
`invar.model.world`.

The checker adds nothing to the world's semantics: a model state is an `Explored` value, the
`World` (the core's `State`, advanced only through `invar.model.shell.deliver`; the journal's
durable state; the network; the learner, workers, weights store and checkpoints, each keeping
the rules and memory a real one keeps) plus the fault `Budget` left. Actions are the world's:
deliver any message in flight (so delay and reordering come free), drop or duplicate a wire
message, fire the retry timer early, crash and restart a worker or the learner, restart the
driver from its journal.

The retry timer also fires, without budget, whenever nothing is in flight: that is the fairness
the protocol's liveness rests on (a timer eventually fires), modelled so that every bounded
run can complete.
"""

from __future__ import annotations

import itertools
import operator
import tomllib
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

from checker.model import BaseModel, Property
from invar.model import schedule, transitions
from invar.model import world as w
from invar.model.config import RunConfig
from invar.model.core import logical_projection, outstanding_commands, run_complete
from invar.model.errors import ConfigError
from invar.model.invariants import (
    INVARIANTS,
    STRENGTHENING,
    IncrementalInvariants,
    stale_event_changes_nothing,
    transition_violations,
)
from invar.model.memo import IdentityMemo
from invar.model.messages import (
    Checkpoint,
    CheckpointWritten,
    Commit,
    ForwardObserved,
    LaunchRequest,
    LearnerStarted,
    LoadWeights,
    ProbabilitiesReported,
    RequestsCompleted,
    StepFinished,
    TimerFired,
    UpdateCommitted,
    VersionEvaluated,
    VersionPublished,
    WeightsLoaded,
    WorkerConnected,
    WorkerLost,
)
from invar.model.objective import ObjectiveConfig
from invar.model.shell import LEARNER, STORE, Delivery
from invar.model.state import Assigned, NoOps, Sample, State, WorkerPhase, evolve
from invar.model.world import CORE, Message, World, message
from invar.testing import canonical_run


@dataclass(frozen=True)
class Bounds:
    """A bounded model configuration (`spec/*.toml`): protocol sizes and fault budgets."""

    prompts_per_batch: int = 1
    group_size: int = 2
    max_staleness: int = 1
    sync_period: int = 1
    optimizer_steps: int = 1
    total_updates: int = 2
    eval_every: int = 0
    checkpoint_every: int = 0
    max_inflight_batches: int = 2
    workers: int = 1
    drops: int = 0
    duplicates: int = 0
    worker_crashes: int = 0
    worker_restarts: bool = True
    """False: a crashed worker never comes back, so its requests must move to the others (a
    lost worker the core failed to notice would hold them for ever)."""
    learner_crashes: int = 0
    driver_restarts: int = 0
    early_timers: int = 0
    """Timer expiries while messages are still in flight (each re-sends everything)."""
    repeats: int = 0
    """Connection-level events observed twice (`invar.model.world.repeat_observation`: a
    worker's connection or loss, the learner's start, a resume's timer)."""
    kl_coef: float = 0.0
    reproducible_forwards: bool = True
    """False: a forward re-run in a new learner attempt returns other log-probs."""
    frames: bool = False
    """Workers also answer in frames of several completions: any two reply frames of one
    worker incarnation in flight may merge (which, from one frame per launch, reaches every
    grouping a worker can send), and merged frames are dropped and duplicated whole."""
    launch_frames: bool = False
    """A worker answers the launches of one decision in one frame (`World.launch_frames`), as
    the runtime's do: with B x G of 16 or more, the core's column paths for large frames."""
    forgeries: bool = False
    """Also check, in every state, that the core refuses (a ProtocolError, not a no-op) every
    event no correct component could send there (`invar.model.world.forgeries`)."""

    def protocol(self) -> RunConfig:
        return RunConfig(
            prompts_per_batch=self.prompts_per_batch, group_size=self.group_size,
            max_staleness=self.max_staleness, sync_period=self.sync_period,
            optimizer_steps=self.optimizer_steps, total_updates=self.total_updates,
            eval_every=self.eval_every, checkpoint_every=self.checkpoint_every,
            max_inflight_batches=self.max_inflight_batches, seed=0,
            objective=ObjectiveConfig(kl_coef=self.kl_coef)).validate()


def load_bounds(path: str | Path) -> tuple[Bounds, dict[str, Any]]:
    """Bounds from a TOML file (`[model]` table; `[check]` options returned as a dict)."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError((str(path),), f"cannot read: {error}") from None
    unknown = set(data) - {"model", "check", "description", "covers"}
    if unknown:
        raise ConfigError((f"{path}: {sorted(unknown)[0]}",), "unknown table")
    model = data.get("model", {})
    names = set(Bounds.__dataclass_fields__)
    for key, value in model.items():
        if key not in names:
            raise ConfigError((f"model.{key}",), f"unknown key in {path}")
        if key in ("reproducible_forwards", "forgeries", "frames", "worker_restarts",
                   "launch_frames"):
            if not isinstance(value, bool):
                raise ConfigError((f"model.{key}",), "expected true or false")
            continue
        expected = float if key == "kl_coef" else int
        if isinstance(value, bool) or not isinstance(value, (int, float) if expected is float
                                                     else int):
            raise ConfigError((f"model.{key}",), f"expected {expected.__name__}, got {value!r}")
        if value < 0:
            raise ConfigError((f"model.{key}",), "must be >= 0")
    bounds = Bounds(**model)
    if bounds.workers < 1:
        raise ConfigError(("model.workers",), "at least one worker")
    if not bounds.worker_restarts and bounds.workers <= bounds.worker_crashes:
        raise ConfigError(("model.worker_restarts", "model.workers"),
                          "without restarts, a worker must outlive the crashes")
    try:
        bounds.protocol()
    except ConfigError as error:
        raise ConfigError(tuple(f"model.{f}" for f in error.fields), error.reason) from None
    return bounds, dict(data.get("check", {}))


class Budget(NamedTuple):
    """The faults still allowed. (A named tuple: part of every state's key, and a tuple of
    ints hashes fastest.)"""

    drops: int
    duplicates: int
    worker_crashes: int
    learner_crashes: int
    driver_restarts: int
    early_timers: int
    repeats: int


class Explored(NamedTuple):
    """A state of the search: the world and the faults still allowed. (A named tuple: built
    for every transition, and a tuple is built fastest.)"""

    world: World
    budget: Budget


class InvarModel(BaseModel[Explored, tuple]):
    """The checker's model of an Invar run within `bounds`."""

    def __init__(self, bounds: Bounds, symmetry: bool = False, reduction: bool = False) -> None:
        self.bounds = bounds
        self.config = bounds.protocol()
        self.worker_names = tuple(f"wkr{i}" for i in range(bounds.workers))
        self.symmetry = symmetry and bounds.workers > 1
        self.reduction = reduction
        self._frames = bounds.frames
        self._worker_restarts = bounds.worker_restarts
        # a message acted on alone stands for all orders (`ample_set`): not when frames
        # may merge (a merge would take a launch's reply with another) or a worker answers
        # the launches in flight beside it together (launch frames)
        self._reduce = reduction and not bounds.frames and not bounds.launch_frames
        # each renaming of the workers but the identity, by the order of the workers it
        # gives: the worker at index i of the result is the one at order[i] before
        self._renamings = {order: _Renaming(self.worker_names,
                                            _renaming_perm(self.worker_names, order))
                           for order in itertools.permutations(range(bounds.workers))
                           if order != tuple(range(bounds.workers))}
        self._transitions = IdentityMemo()
        self._orders = IdentityMemo()
        self._phase_moves = IdentityMemo()
        self._deliveries = IdentityMemo()
        self._answers = w.AnswersByValue()
        self._finals = IdentityMemo()
        self._refusals = IdentityMemo()
        self._kinds: dict[tuple, str] = {}
        self._spent: dict[tuple[Budget, str], Budget] = {}
        self._cores_by_value: dict[tuple[State, NoOps], State] = {}

    @cached_property
    def canonical_projection(self) -> tuple:
        # Through this search's memos: its deliveries were mostly met by the search already.
        return logical_projection(canonical_run(self.config, self.worker_names,
                                                delivered=self._delivered,
                                                answers=self._answers).state)

    # -- the model API ---------------------------------------------------------------------

    def init_states(self) -> list[Explored]:
        b = self.bounds
        world = w.new_world(self.config, self.worker_names, b.reproducible_forwards,
                            b.launch_frames)
        self._core_of_value(world.core)  # later cores of its value become this very object
        return [Explored(world, Budget(b.drops, b.duplicates, b.worker_crashes,
                                       b.learner_crashes, b.driver_restarts, b.early_timers,
                                       b.repeats))]

    def actions(self, state: Explored) -> list[tuple]:
        world, budget = state.world, state.budget
        if world.refused or world.broken:
            return []
        network = world.network
        distinct = sorted({m.key for m in network})
        (drops, duplicates, worker_crashes, learner_crashes, driver_restarts, early_timers,
         repeats) = budget
        if self._reduce:
            ample = self.ample_set(world, budget)
            if ample is not None:
                return ample
        out: list[tuple[str, Any]] = [("deliver", key) for key in distinct
               if not (key.startswith(_LOST) and _lost_before_connected(world, key))]
        # Connections, losses and restarts are the driver's own observations, not messages
        # on the wire: they may be delayed behind others and repeated, never dropped.
        if drops or duplicates:
            wire = [k for k in distinct if not k.startswith(_OBSERVATIONS)]
            if drops:
                out += [("drop", key) for key in wire]
            if duplicates:
                out += [("duplicate", key) for key in wire]
        if repeats:
            out += [("repeat", key) for key in distinct if key.startswith(_OBSERVATIONS)]
        if self._frames:
            out += [("merge", pair) for pair in _mergeable_pairs(world)]
        if world.timer and (not network or early_timers):
            out.append(("timer", None))
        if worker_crashes or self._worker_restarts:
            for worker in world.workers:
                if worker.alive and worker_crashes:
                    out.append(("crash_worker", worker.name))
                if not worker.alive and self._worker_restarts:
                    out.append(("restart_worker", worker.name))
        if world.learner.alive:
            if learner_crashes:
                out.append(("crash_learner", None))
        else:
            out.append(("restart_learner", None))
        if driver_restarts:
            out.append(("restart_driver", None))
        return out

    def successors(self, state: Explored) -> list[tuple[tuple, Explored]]:
        """`actions` with `next_state` of each, fused for the engine's hot loop (the same pairs
        in the same order: `check_successors`): a delivery, nearly every action, is built
        straight from the world, its budget unchanged."""
        world, budget = state.world, state.budget
        deliver, delivered, answers = w.deliver_message, self._delivered, self._answers
        next_state, new = self.next_state, tuple.__new__  # Explored(...), without its frame
        return [(action, new(Explored, (deliver(world, action[1], delivered, answers), budget))
                 if action[0] == "deliver" else next_state(state, action))
                for action in self.actions(state)]

    def next_state(self, state: Explored, action: tuple) -> Explored:
        kind, arg = action
        world, budget = state.world, state.budget
        spent = _SPENDS.get(kind)
        if kind == "timer" and world.network:
            spent = "early_timers"
        if spent:
            less = self._spent.get((budget, spent))
            if less is None:
                less = self._spent[budget, spent] = budget._replace(
                    **{spent: getattr(budget, spent) - 1})
            budget = less
        if kind == "deliver":
            world = w.deliver_message(world, arg, self._delivered, self._answers)
        elif kind in _KEYED:
            world = _KEYED[kind](world, arg)
        elif kind == "merge":
            world = w.merge_replies(world, *arg)
        elif kind == "timer":
            world = w.fire_timer(world, self._delivered)
        elif kind in ("crash_worker", "restart_worker"):
            world = _NAMED[kind](world, arg)
        elif kind in _WHOLE:
            world = _WHOLE[kind](world, self._answers)
        else:  # pragma: no cover
            raise ValueError(f"unknown action {action!r}")
        return Explored(world, budget)

    def _delivered(self, core: State, event: Any) -> tuple[Delivery, w.Routed]:
        """The world's `routed_delivery`, remembered for the very core object and this very
        event object (the usual hit: a message in flight is one object in every world that
        holds it), else an equal event; its state is the one core object kept for its value.

        One object per core value, no-op counts included (equality leaves them out): a core
        reached along two interleavings is then one object, so the memos keyed by identity
        (these deliveries, the verdicts of the invariants) hit for both. What else equality
        leaves out stands behind digests it compares (payloads) or is derived from compared
        fields (the cotangent kept to re-send), so the shared object answers every question as
        the one it stands for does. Every core of the search comes from here or is the initial
        one (a driver restart goes back to a journal, which is one of them), so every core is
        shared. Kept per model instance: a test that patches the core never meets a core
        computed before the patch."""
        deliveries = self._deliveries
        answer: tuple[Delivery, w.Routed] | None = deliveries.lookup(core, event)
        if answer is not None:
            return answer
        answer = deliveries.lookup(core, None, event)
        if answer is None:
            delivery, routed = w.routed_delivery(core, event, self._answers.carried)
            shared = evolve(delivery, state=self._core_of_value(delivery.state))
            answer = deliveries.put(core, None, event, (shared, routed))
        return deliveries.put(core, event, None, answer)

    def _core_of_value(self, core: State) -> State:
        if len(self._cores_by_value) >= _CORES_KEPT:
            self._cores_by_value.clear()
        return self._cores_by_value.setdefault((core, core.noops), core)

    def is_final(self, state: Explored) -> bool:
        # `run_complete`, a function of the core alone: remembered per core object.
        final: bool = self._finals.of(state.world.core, run_complete)
        return final

    def properties(self) -> list[Property]:
        props = [
            Property.always("correct_components_never_refused", lambda s: not s.world.refused),
            Property.always("components_can_do_what_they_are_told",
                            lambda s: not s.world.broken),
        ]
        checks = _StateInvariants()
        for name in INVARIANTS:
            props.append(Property.always(name, checks.predicate(name)))
        for name in STRENGTHENING:  # the inductive invariant's added conjuncts hold here too
            props.append(Property.always(name, checks.strengthening(name)))
        props.append(Property.transition("transition_invariants", self._transition_ok))
        props.append(Property.transition("phase_moves_are_listed", self._phase_moves_listed))
        if self.bounds.forgeries:
            props.append(Property.always("forged_events_are_refused", self._forgeries_refused))
        props.append(Property.final("completed_run_matches_canonical_schedule",
                                    self._matches_canonical))
        props.append(Property.sometimes("run_completes", self.is_final))
        b, config = self.bounds, self.config
        if b.drops:
            props.append(Property.sometimes("a_message_is_dropped",
                                            lambda s: s.budget.drops < b.drops))
        if b.repeats:
            props.append(Property.sometimes("a_connection_level_event_is_repeated",
                                            lambda s: s.budget.repeats < b.repeats))
        if b.reproducible_forwards:
            # Every component of this world is deterministic: a repeat is never "divergent".
            props.append(Property.always("deterministic_components_never_diverge",
                                         lambda s: s.world.core.noops.divergent == 0))
        if b.frames:
            props.append(Property.sometimes("a_frame_repeats_some_completions_and_brings_others",
                                            _mixed_frame_in_flight))
        if b.learner_crashes:
            k = config.optimizer_steps
            # More forwards than K per update so far: some update's steps ran twice.
            props.append(Property.sometimes(
                "learner_restart_redoes_an_update",
                lambda s: s.world.core.learner.attempt > 0
                and s.world.core.learner.observations > k * (s.world.core.committed + 1)))
        if b.worker_crashes and b.worker_restarts:
            props.append(Property.sometimes(
                "worker_reconnects", lambda s: any(x.incarnation > 0 for x in s.world.workers)))
        elif b.worker_crashes:
            props.append(Property.sometimes(
                "a_lost_worker_stays_lost_and_the_run_completes",
                lambda s: self.is_final(s) and not all(x.alive for x in s.world.workers)))
        if b.driver_restarts:
            props.append(Property.sometimes(
                "driver_restarts", lambda s: s.budget.driver_restarts < b.driver_restarts))
        if config.optimizer_steps > 1:
            props.append(Property.sometimes(
                "an_update_takes_several_steps",
                lambda s: len(s.world.core.learner.applied) > 1))
        if len(set(_generating_versions(config))) > 1:
            props.append(Property.sometimes(
                "a_worker_reloads_a_newer_version",
                lambda s: any(x.version not in (None, 0) for x in s.world.workers)))
            props.append(Property.sometimes(
                "a_version_is_released",
                lambda s: any(v not in s.world.store for v in s.world.core.published)))
        if config.eval_every:
            props.append(Property.sometimes(
                "an_evaluation_before_the_last_is_acknowledged",
                lambda s: any(v < config.total_updates for v in s.world.core.evaluated[1:])))
        if config.checkpoint_every and config.checkpoint_every < config.total_updates:
            props.append(Property.sometimes(
                "a_checkpoint_before_the_last_is_written",
                lambda s: any(v < config.total_updates for v in s.world.core.checkpointed)))
        return props

    def fingerprint_key(self, state: Explored) -> Any:
        if not self.symmetry:
            return _key(state)
        # Interchangeable workers: a state stands for every renaming of its world, so its key
        # is one representative of them all (stateright's `representative`): the renaming that
        # sorts the workers by what they are apart from their names (`_worker_signatures`),
        # which the identity often is, so that no renamed key is built at all. Workers alike
        # in that leave several such renamings: the key is then the set of their keys. Either
        # way the same key for every state of one orbit, a different one for two orbits. The
        # renaming is done on the objects: collections ordered by name (the core's workers,
        # the world's workers) must be re-sorted, and a batch's slots stand behind a digest
        # that hashes the names.
        world = state.world
        # The orders depend on the world's and the core's worker records alone, objects that
        # states share: computed once per pair of them.
        orders = self._orders.lookup(world.workers, world.core.workers)
        if orders is None:
            orders = self._orders.put(world.workers, world.core.workers, None, _sorting_orders(
                _worker_signatures(world, self.worker_names)))
        renamings = self._renamings
        if len(orders) == 1:
            order = orders[0]
            return renamings[order].key(state) if order in renamings else _key(state)
        return frozenset([renamings[order].key(state) if order in renamings else _key(state)
                          for order in orders])

    def format_action(self, action: tuple) -> str:
        kind, arg = action
        if kind == "merge":
            return f"merge {arg[0]} + {arg[1]}"
        return kind if arg is None else f"{kind} {arg}"

    def action_kind(self, action: tuple) -> str:
        known = self._kinds.get(action)  # asked once per transition, of few distinct actions
        if known is None:
            kind, arg = action
            known = kind
            if kind in ("deliver", *_KEYED) and isinstance(arg, str):
                body = arg.split("|", 1)[1]
                known = f"{kind}:{body.split('(', 1)[0]}"
            self._kinds[action] = known
        return known

    # -- properties over the world ----------------------------------------------------------

    def _matches_canonical(self, state: Explored) -> bool:
        projection = logical_projection(state.world.core)
        if self.bounds.reproducible_forwards:
            return projection == self.canonical_projection
        # Re-run forwards (and re-scored proximal log-probs) legitimately differ in value:
        # what was consumed, in which steps over which positions, must still be the same.
        return _schedule_part(projection) == _schedule_part(self.canonical_projection)

    def _forgeries_refused(self, state: Explored) -> bool:
        # A function of the core alone: remembered per core object.
        return self._refusals.of(state.world.core, lambda core: not w.unrefused_forgery(core))

    def _transition_ok(self, state: Explored, action: tuple, after: Explored) -> bool:
        kind, arg = action
        if kind == "deliver":
            if not arg.startswith(_TO_CORE):
                return True
        elif kind != "timer":
            return True
        world = after.world
        if world.refused:
            return True  # reported by correct_components_never_refused
        # A function of the two cores and the commands sent, which the event delivered (named
        # by the action) decides, but for a load the store no longer holds: none is then sent
        # (`broken` says so). Remembered for those cores.
        before, now = state.world.core, world.core
        case = (action, world.broken)
        known: bool | None = self._transitions.lookup(before, now, case)
        if known is not None:
            return known
        taken = 0 if kind == "timer" else 1
        sent = world.network[len(state.world.network) - taken:]
        commands = [m.body for m in sent if m.to != CORE]
        event = _event_to_core(state.world, action)
        return self._transitions.put(before, now, case,
                                     not transition_violations(before, commands, now)
                                     and not stale_event_changes_nothing(before, event, now))

    def _phase_moves_listed(self, state: Explored, action: tuple, after: Explored) -> bool:
        """`_phase_moves_are_listed`, remembered per pair of core objects and the action (which
        names the event delivered)."""
        before, now = state.world.core, after.world.core
        if before is now:
            return True  # the core did not move
        known: bool | None = self._phase_moves.lookup(before, now, action)
        if known is not None:
            return known
        return self._phase_moves.put(before, now, action,
                                     _phase_moves_are_listed(state, action, after))

    def ample_set(self, world: World, budget: Budget) -> list[tuple] | None:
        """Partial-order reduction: the actions on one message in flight, taken first, stand
        for every order of them with the rest (None: no message qualifies, expand in full).
        The message is a launch (`launch_ample_set`), else a load (`load_ample_set`), else a
        publication (`publish_ample_set`), else the learner's one command
        (`learner_ample_set`); its delivery comes first in the set.

        From a state where a set qualifies, every action b outside the set, on any path taken
        before an action of the set, either absorbs the delivery (b after the delivery reaches
        the very state b reaches without it) or commutes with each action a of the set that is
        still enabled after it (a after b and b after a are both enabled and reach one state);
        once b has disabled a (spent the budget a needs), a stays disabled. Each candidate's
        docstring argues this per action; `tests/checker/test_checker_reduction.py` checks it
        on every state of small bounds and the paths two steps from it, and that wrong sets
        fail it.

        This is C1 in the form the argument needs: a path from here that takes an action of the
        set before any b that absorbs the delivery is the same path with that action moved
        first, to the same state; one that takes none, or such a b first, is the same path
        after the delivery, to the same state but for the delivery (which, before b, only the
        network and the recipient show). What the set's actions change (the network, a
        worker's record, the learner, the store, a budget) no invariant or transition property
        reads; a `sometimes` property reads a worker's record, which holds here already if it
        holds for the worker the set acts on along such a path, the store's lack of a version
        the core published, which adding v (not yet published in the core) leaves, or a spent
        budget, which stays spent to the path's end (C2: what a moved action changes is
        visible on no state that matters). Each step of a set takes a command off the network
        or spends a budget, so no cycle is made of reduced steps alone (C3); the same measure
        ends the argument's induction.
        `benchmarks/bench_reduction.py` checks the verdicts, livelock included, reduced and
        unreduced on every gate bound."""
        for candidate in (self.launch_ample_set, self.load_ample_set, self.publish_ample_set,
                          self.learner_ample_set):
            ample = candidate(world, budget)
            if ample is not None:
                return ample
        return None

    def launch_ample_set(self, world: World, budget: Budget) -> list[tuple] | None:
        """Deliver the launch L (to worker W), drop and duplicate it if budgeted, and crash W
        if a worker crash is budgeted and W would answer L (`ample_set`).

        L is in flight once and either a dead letter (W dead or of a later incarnation: its
        delivery only takes it off the network) or one W will answer (alive, of L's
        incarnation, holding L's version) while the core holds L's request assigned to that
        incarnation, with no reply for that request and no load to W in flight. Then W's
        record can change only by W's crash: the core loads free workers only, and W is busy
        until L's request is answered, by L alone. For an action b outside the set:
        * a delivery to the core, the learner, the store or another worker, a drop, duplicate
          or repeat of another message, a learner crash or restart, another worker's crash
          or restart: none reads or writes W, L or L's reply; the network is a multiset;
        * a timer expiry: the core's re-sends (a copy of L among them) are a function of the
          core alone, and the network holds L, or L's reply after the delivery, so the timer
          is early in either order. Only for a launch W answers, and when no drop is
          budgeted: a delivery answered by no one, or a drop, could empty the network, and an
          expiry after it would then spend no budget;
        * a crash of W: it absorbs a dead letter's delivery; a launch W answers leaves its
          reply, so W's crash joins the set, and only when it too commutes: it removes the
          messages to W, so L must be the only one, and none can join before an action of the
          set: no TimerFired in flight and no early timer budgeted (a re-send), no batch of
          L's version left to admit or with a pending request (a new launch), every worker
          alive, no connection or loss in flight and one crash budgeted (a requeue onto W:
          another worker's crash then disables W's);
        * a driver restart: it empties the network and resets W, so it absorbs the delivery."""
        drops, duplicates, worker_crashes, _, _, early_timers, _ = budget
        if early_timers and (drops or worker_crashes):
            return None
        network = world.network
        launches = [m for m in network if type(m.body) is LaunchRequest]
        if not launches:
            return None
        copies = Counter(m.key for m in launches)
        loading = {m.body.worker for m in network if type(m.body) is LoadWeights}
        replied = {request for m in network if type(m.body) is RequestsCompleted
                   for request in m.body.completions.request_ids()}
        core = world.core
        group = core.config.group_size
        for m in sorted(launches, key=_KEY_OF):
            launch = m.body
            if copies[m.key] > 1:
                continue
            worker = world.worker(launch.worker)
            if not worker.alive or worker.incarnation != launch.incarnation:
                if early_timers:
                    continue  # its delivery, answered by no one, may empty the network
                return _message_actions(m.key, drops, duplicates)
            if (worker.version != launch.version or launch.worker in loading
                    or launch.request in replied):
                continue
            batch = core.batch(launch.request.batch)
            if batch is None:
                continue
            slot = batch.slots[launch.request.prompt * group + launch.request.sample]
            if slot != Assigned(launch.worker, launch.incarnation):
                continue
            if worker_crashes and not self._crash_commutes(world, budget, launch):
                continue
            out = _message_actions(m.key, drops, duplicates)
            if worker_crashes:
                out.append(("crash_worker", launch.worker))
            return out
        return None

    def _crash_commutes(self, world: World, budget: Budget, launch: LaunchRequest) -> bool:
        """Whether a crash of `launch`'s worker, in the ample set beside it, commutes with
        every action outside the set until one of the set is taken (`ample_set`)."""
        if budget.worker_crashes != 1 or not all(x.alive for x in world.workers):
            return False
        for m in world.network:
            if (m.to == launch.worker and m.body is not launch) or type(m.body) in _REQUEUES:
                return False
        core = world.core
        for index in schedule.batches_of_version(core.config, launch.version):
            if index >= core.admitted:
                return False
            batch = core.batch(index)
            if batch is not None and batch.pending:
                return False
        return True


    def load_ample_set(self, world: World, budget: Budget) -> list[tuple] | None:
        """Deliver the load LW (to worker W), drop and duplicate it if budgeted, and crash W
        if a worker crash is budgeted and W would take LW (`ample_set`).

        LW is the only message to W in flight, and either a dead letter (W dead, of a later
        incarnation, or past LW's serial: its delivery only takes it off the network) or one
        W takes (alive, of LW's incarnation, LW's serial not behind its own) while the core
        holds W loading with LW's serial and no WeightsLoaded of W is in flight. The core
        then sends W nothing before an action of the set but LW again (a timer's re-send):
        it launches onto ready workers and loads free ones only. For an action b outside it:
        * a delivery elsewhere, a drop, duplicate or repeat of another message, a learner
          crash or restart, another worker's crash or restart: none reads or writes W, LW or
          LW's reply (the weights travel with the load: the store is not read);
        * a timer expiry: as for a launch (W takes a re-sent LW again and stays as it is);
        * a crash of W: it absorbs a dead letter's delivery, and joins the set otherwise, with
          no TimerFired in flight and no early timer budgeted (so nothing joins LW);
        * a driver restart absorbs the delivery."""
        drops, duplicates, worker_crashes, _, _, early_timers, _ = budget
        if early_timers and (drops or worker_crashes):
            return None
        network = world.network
        addressed = Counter(m.to for m in network)
        for m in sorted((m for m in network if type(m.body) is LoadWeights), key=_KEY_OF):
            load = m.body
            if addressed[load.worker] > 1:
                continue
            worker = world.worker(load.worker)
            if (not worker.alive or worker.incarnation != load.incarnation
                    or not w.worker_accepts(worker, load)):
                if early_timers:
                    continue  # its delivery, answered by no one, may empty the network
                return _message_actions(m.key, drops, duplicates)
            known = world.core.worker(load.worker)
            if known is None or (known.phase, known.incarnation, known.load) != (
                    WorkerPhase.LOADING, load.incarnation, load.load):
                continue
            if any(type(x.body) is WeightsLoaded and x.body.worker == load.worker
                   or worker_crashes and type(x.body) is TimerFired for x in network):
                continue
            out = _message_actions(m.key, drops, duplicates)
            if worker_crashes:
                out.append(("crash_worker", load.worker))
            return out
        return None

    def publish_ample_set(self, world: World, budget: Budget) -> list[tuple] | None:
        """Deliver the publication P of version v, drop and duplicate it if budgeted
        (`ample_set`).

        P is the only message to the store in flight, the core is publishing v (so it neither
        loads nor releases v before P's reply, which no message in flight brings: no
        VersionPublished is), and the learner has committed v (the store copies its commit).
        The store is written by P alone (a release is the driver's own, done as it is
        decided) and read only when the core loads a version, so, for an action b outside
        the set:
        * a delivery to the core (loads and releases of other versions), the learner (a
          commit writes past v), a worker; a drop, duplicate or repeat of another message; a
          crash or restart of a worker or the learner: none reads or writes v's place in the
          store, P or P's reply;
        * a timer expiry: as for a launch (a re-sent P publishes v again);
        * a driver restart would keep what P wrote: no set while one is budgeted."""
        drops, duplicates, _, _, driver_restarts, early_timers, _ = budget
        if driver_restarts or (early_timers and drops):
            return None
        publication = _sole_message_to(world, STORE, (VersionPublished,))
        if publication is None:
            return None
        version = publication.body.version
        if world.core.publishing != version or version >= len(world.learner.commits):
            return None
        return _message_actions(publication.key, drops, duplicates)

    def learner_ample_set(self, world: World, budget: Budget) -> list[tuple] | None:
        """Deliver the learner's command C, drop and duplicate it if budgeted, and crash the
        learner if budgeted (`ample_set`).

        C is the only message to the learner in flight, the learner is alive, and the core
        still awaits C's reply (C is among its outstanding commands), with no reply of the
        learner, no LearnerStarted and no TimerFired in flight and no early timer budgeted.
        Then the core sends the learner nothing before an action of the set: it does so on
        the learner's replies, a learner start or a timer expiry, and on a batch's last
        completion only while it awaits no learner command. So only C and the learner's
        crash change the learner before an action of the set. For an action b outside it:
        * a delivery to the core, a worker or the store, a drop, duplicate or repeat of
          another message, a worker's crash or restart: none reads or writes the learner, C
          or C's reply (the store reads commits of published versions, which C leaves);
        * a timer expiry: only on an empty network, never while C is in flight;
        * the learner's crash: in the set, since it removes C (of its attempt) or leaves C
          unanswered;
        * a driver restart: it empties the network and restarts the learner from its commits
          and checkpoints, so it absorbs a delivery that leaves them (not a Commit or a
          Checkpoint while a driver restart is budgeted)."""
        drops, duplicates, _, learner_crashes, driver_restarts, early_timers, _ = budget
        if early_timers or not world.learner.alive:
            return None
        command = _sole_message_to(world, LEARNER, _LEARNER_TRIGGERS)
        if command is None or (driver_restarts and type(command.body) in (Commit, Checkpoint)):
            return None
        if command.body not in outstanding_commands(world.core):
            return None
        out = _message_actions(command.key, drops, duplicates)
        if learner_crashes:
            out.append(("crash_learner", None))
        return out


def _sole_message_to(world: World, to: str, blockers: tuple[type, ...]) -> Message | None:
    """The one message in flight to `to`; None when there is none, more than one, or a
    message of a `blockers` type in flight to anyone else."""
    sole: Message | None = None
    for m in world.network:
        if m.to == to:
            if sole is not None:
                return None
            sole = m
        elif type(m.body) in blockers:
            return None
    return sole


def _message_actions(key: str, drops: int, duplicates: int) -> list[tuple]:
    """Deliver the message `key`, and drop and duplicate it as budgeted."""
    out: list[tuple] = [("deliver", key)]
    if drops:
        out.append(("drop", key))
    if duplicates:
        out.append(("duplicate", key))
    return out


def _phase_moves_are_listed(state: Explored, action: tuple, after: Explored) -> bool:
    """The phase tables of `invar.model.transitions` are the protocol's phase machines, not a
    description of them: every phase move of the learner and of each worker that a delivery
    makes is listed there.  An event the table lists for the phase, accepted, moves to one of
    its listed phases; any other event (a no-op, or an event the table does not list for the
    phase) leaves the phase where it was; either way the core's internal moves
    (`LEARNER_INTERNAL`, `WORKER_INTERNAL`) may follow in the same step."""
    before, now = state.world.core, after.world.core
    if before is now or after.world.refused or action[0] == "restart_driver":
        # The core did not move, refused the event (correct_components_never_refused says
        # so), or went back to its journal: to a state whose moves were checked when made.
        return True
    event = _event_to_core(state.world, action)
    accepted = now.noops == before.noops
    if not _phase_move_listed(transitions.LEARNER, transitions.LEARNER_INTERNAL,
                              before.learner.phase, event if accepted else None, now.learner.phase):
        return False
    phases = {worker.name: worker.phase for worker in before.workers}
    for worker in now.workers:
        own = event if accepted and getattr(event, "worker", None) == worker.name else None
        if not _phase_move_listed(transitions.WORKER, transitions.WORKER_INTERNAL,
                                  phases.get(worker.name), own, worker.phase):
            return False
    return True


def _event_to_core(world: World, action: tuple) -> Any:
    """The event `action` delivers to the core (None: it delivers none)."""
    kind, arg = action
    if kind == "timer":
        return TimerFired()
    if kind == "deliver":
        return next((m.body for m in world.network if m.key == arg and m.to == CORE), None)
    return None


def _phase_move_listed(table: dict[tuple[Any, type], tuple[Any, ...]],
                       internal: dict[Any, tuple[Any, ...]],
                       phase: Any, event: Any, after: Any) -> bool:
    """Whether `table` (with the core's `internal` moves after it) takes a component from
    `phase` to `after` on the accepted `event` (None: no event of this component's)."""
    listed = table.get((phase, type(event))) if event is not None else None
    if not listed and after == phase:
        return True
    return after in transitions.with_internal_moves(listed or (phase,), internal)


class _StateInvariants:
    """The state invariants of a core state, decided together: the engine asks for each one in
    turn on the same state, and `IncrementalInvariants.all_hold` settles the usual case (every
    one holds) at once, from what changed since the state it saw last; only when it cannot is
    the invariant asked for computed on its own.

    The answer is remembered per core object: many search states share one (the world's
    deliveries hand out the same successor object for the same core and event), and an
    invariant is a function of the core alone."""

    def __init__(self) -> None:
        self._incremental = IncrementalInvariants()
        self._core: State | None = None
        self._all_hold = False
        self._known = IdentityMemo()

    def predicate(self, name: str) -> Any:
        """The property's predicate over search states: whether invariant `name` holds."""
        invariant = INVARIANTS[name]

        def holds(state: Explored) -> bool:
            core = state.world.core
            if core is not self._core:
                self._core, self._all_hold = core, self._known.of(core, self._incremental.all_hold)
            return self._all_hold or not invariant(core)
        return holds

    def strengthening(self, name: str) -> Any:
        """The property's predicate for conjunct `name` of `STRENGTHENING`, remembered per
        core object."""
        conjunct, known = STRENGTHENING[name], IdentityMemo()

        def holds(state: Explored) -> bool:
            verdict: bool = known.of(state.world.core, lambda core: not conjunct(core))
            return verdict
        return holds


def _mixed_frame_in_flight(state: Explored) -> bool:
    """A reply frame in flight to the core holds a completion the core has and one it lacks."""
    core = state.world.core
    g = core.config.group_size
    for m in state.world.network:
        if isinstance(m.body, RequestsCompleted) and len(m.body.completions) > 1:
            filled = set()
            for request in m.body.completions.request_ids():
                batch = core.batch(request.batch)
                slot = batch.slots[request.prompt * g + request.sample] if batch else None
                filled.add(batch is None or isinstance(slot, Sample))
            if filled == {True, False}:
                return True
    return False


def _mergeable_pairs(world: World) -> list[tuple[str, str]]:
    """Key pairs of reply frames that `merge_replies` may join, each pair once (first <= second:
    the order of completions inside a frame changes nothing the core decides, since a correct
    worker's repeats are equal, so the other order would only add states); a frame in flight
    twice (duplicated) may merge with its copy."""
    replies = Counter(m.key for m in world.network if isinstance(m.body, RequestsCompleted))
    bodies = {m.key: m for m in world.network if m.key in replies}
    keys = sorted(replies)
    return [(a, b) for i, a in enumerate(keys) for b in keys[i:]
            if (a != b or replies[a] > 1) and w.mergeable(bodies[a], bodies[b])]


_CORES_KEPT = 1 << 17
_SPENDS = {"drop": "drops", "duplicate": "duplicates", "repeat": "repeats",
           "crash_worker": "worker_crashes",
           "crash_learner": "learner_crashes", "restart_driver": "driver_restarts"}
_KEYED = {"drop": w.drop, "duplicate": w.duplicate, "repeat": w.repeat_observation}
_NAMED = {"crash_worker": w.crash_worker, "restart_worker": w.restart_worker}
_WHOLE = {"crash_learner": w.crash_learner, "restart_learner": w.restart_learner,
          "restart_driver": w.restart_driver}

_TO_CORE = f"{CORE}|"
_LOST = f"{CORE}|WorkerLost("
_COMPLETIONS = f"{CORE}|{RequestsCompleted.__name__}("
_KEY_OF = operator.attrgetter("key")
_OBSERVATIONS = tuple(f"{CORE}|{t.__name__}(" for t in w.OBSERVATIONS)
_REQUEUES = (TimerFired, WorkerConnected, WorkerLost)
"""Events that may make the core launch onto a busy worker: a re-send, a requeue."""
_LEARNER_TRIGGERS = (ProbabilitiesReported, ForwardObserved, StepFinished, UpdateCommitted,
                     VersionEvaluated, CheckpointWritten, LearnerStarted, TimerFired)
"""Events on which the core may send the learner a command while it awaits another."""


def _generating_versions(config: RunConfig) -> list[int]:
    return [schedule.gen_version(config, b) for b in range(config.total_updates)]


def _schedule_part(projection: tuple) -> tuple:
    ledger, *rest = projection
    return (tuple((r.update, r.requests, r.sample_versions, r.sample_digests,
                   tuple((s.step, s.positions) for s in r.steps)) for r in ledger), *rest)


def _lost_before_connected(world: World, key: str) -> bool:
    """The loss `key` may not be delivered yet: `invar.model.world.observed_too_early`."""
    return w.observed_too_early(world, next(m for m in world.network if m.key == key))


def _worker_signatures(world: World, names: tuple[str, ...]) -> list[tuple]:
    """What each worker of `names` is apart from its name, comparable across workers and the
    same in every process: its record in the world and its records in the core."""
    signature: dict[str, list[Any]] = {
        x.name: [x.incarnation, x.alive, -1 if x.version is None else x.version, x.load]
        for x in world.workers}
    for y in sorted((y.name, y.incarnation, y.phase.value,
                     -1 if y.version is None else y.version, y.load, y.assigned)
                    for y in world.core.workers):
        signature[y[0]].append(y[1:])
    return [tuple(signature[n]) for n in names]


def _sorting_orders(signatures: list[tuple]) -> list[tuple[int, ...]]:
    """Every order of the workers that sorts `signatures` (several when some are equal)."""
    order = sorted(range(len(signatures)), key=signatures.__getitem__)
    orders: list[list[int]] = [[]]
    i = 0
    while i < len(order):
        j = i
        while j < len(order) and signatures[order[j]] == signatures[order[i]]:
            j += 1
        if j - i == 1:
            for o in orders:
                o.append(order[i])
        else:
            orders = [o + list(p) for o in orders for p in itertools.permutations(order[i:j])]
        i = j
    return [tuple(o) for o in orders]


def _renaming_perm(names: tuple[str, ...], order: tuple[int, ...]) -> tuple[str, ...]:
    """The renaming (`_Renaming`'s `perm`: names[i] becomes perm[i]) that moves the worker
    at `order[j]` to index j."""
    perm = list(names)
    for j, i in enumerate(order):
        perm[i] = names[j]
    return tuple(perm)


class _Renaming:
    """One renaming of the interchangeable workers (`perm` for `names`), and the renamed part
    of each search state part it met, remembered: search states share their cores, journals
    and workers (per object), and their messages (per key, which the renamed key follows
    from: only the worker names in it change)."""

    def __init__(self, names: tuple[str, ...], perm: tuple[str, ...]) -> None:
        self.names = names
        self.mapping = dict(zip(names, perm))
        self._parts = IdentityMemo()
        self._message_keys: dict[str, str] = {}

    def key(self, state: Explored) -> tuple:
        """`_key` of `state` with its workers renamed."""
        world = state.world
        journal = self._part(world.journal, _rename_core) if state.budget.driver_restarts \
            else None
        return (self._part(world.core, _rename_core), journal, self._network_keys(world.network),
                world.learner, self._part(world.workers, self._rename_workers), world.store,
                world.timer, state.budget, world.refused, world.broken)

    def _part(self, part: Any, rename: Any) -> Any:
        known = self._parts.lookup(part)
        if known is None:
            known = self._parts.put(part, None, None, rename(part, self.mapping))
        return known

    def _network_keys(self, network: tuple[Message, ...]) -> tuple[str, ...]:
        known = self._message_keys
        keys = []
        for msg in network:
            key = known.get(msg.key)
            if key is None:
                key = known[msg.key] = _renamed_message_key(msg, self.mapping)
            keys.append(key)
        keys.sort()
        return tuple(keys)

    def _rename_workers(self, workers: tuple[w.Worker, ...],
                        mapping: dict[str, str]) -> tuple[w.Worker, ...]:
        by_name = {mapping[x.name]: evolve(x, name=mapping[x.name]) for x in workers}
        return tuple(by_name[n] for n in self.names)


def _rename_core(core: State, mapping: dict[str, str]) -> State:
    workers = tuple(sorted((evolve(x, name=mapping[x.name]) for x in core.workers),
                           key=lambda x: x.name))
    batches = tuple(
        batch.with_slots({p: Assigned(mapping[s.worker], s.incarnation)
                          for p, s in enumerate(batch.slots) if isinstance(s, Assigned)})
        for batch in core.batches)
    return evolve(core, workers=workers, batches=batches)


def _renamed_message_key(msg: Message, mapping: dict[str, str]) -> str:
    body = msg.body
    name = getattr(body, "worker", None)
    if name is None:
        return msg.key
    return message(mapping.get(msg.to, msg.to), evolve(body, worker=mapping[name])).key


def _key(state: Explored) -> tuple:
    """A search state's identity, as values that hash by value (the engine's fast path): the
    records are shared between states and keep their hashes, so this costs little. Reprs and
    equality leave out payloads that stand behind digests; the network is a multiset (sorted
    keys); what a driver restart would recover counts only while a restart can still happen."""
    world = state.world
    return (world.core, world.journal if state.budget.driver_restarts else None,
            tuple(sorted(map(_KEY_OF, world.network))), world.learner, world.workers,
            world.store, world.timer, state.budget, world.refused, world.broken)
