"""Induction: the core's invariants shown inductive on the real `step`, over a declared universe.

The bounded searches check the invariants in the states a fault budget reaches. Induction needs
no budget: every fault reaches the core only as an event (a loss, a connection, a learner's
start, a timer, a repeat, a forgery), `step` accepts or refuses it, and a driver restart takes
the core back to a state it was in. So if the inductive invariant IndInv
(`invar.model.invariants.inductive_violations`: the invariants of §8 and their strengthening)

* holds in the initial state (IndInit: Init ⊆ IndInv), and
* holds after `step` of every event of the alphabet from every state that satisfies it
  (IndNext), with the transition invariants on each such step,

then it holds in every reachable state under any number of drops, duplicates, reorderings,
crashes, restarts, early timers and forged messages, at any run length. This is Apalache's
inductive-invariant check done explicitly (Konnov's Ben-Or and Tendermint specs): here the
states that satisfy IndInv are enumerated, within a universe, and `step` is taken from each.

The universe (`spec/inductive/*.toml`) declares the protocol's sizes (B, G, S, P, K, N, M, E, C
and the KL term), the worker names and the ranges of the counters: worker incarnations, load
serials, learner attempts and forwards requested. Payloads are those of the world's correct
components (`invar.model.world`: functions of the logical content), as the bounded searches
have them; digests are compared, never computed from payloads, by the invariants.

States are built constructively, field by field (`enumerate_states`): a state is a `Recipe`,
each field's values drawn from the universe as the conjuncts that speak of it allow (which
versions are published, retained, loaded; which slots may be assigned to whom; which learner
progress fits a complete batch), and only the complete candidates are held to the whole of
IndInv. The alphabet of a state (`alphabet`) is every event a correct component could send in
some state (answers to the commands in flight, with the current and the previous incarnation,
attempt, load, serial and update: the stale ones), the connection-level events, the timer, and
every forgery `invar.model.world.forgeries` builds. A counterexample to induction (CTI) is a
state, an event and the conjunct the step breaks (or the exception it raised).
"""

from __future__ import annotations

import itertools
import time
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from checker.invar_model import Bounds
from invar.model import schedule
from invar.model import world as w
from invar.model.config import RunConfig
from invar.model.errors import ConfigError
from invar.model.invariants import (
    BUSY_PHASES,
    inductive_violations,
    stale_event_changes_nothing,
    transition_violations,
)
from invar.model.messages import (
    CheckpointWritten,
    Completions,
    Event,
    LaunchRequest,
    LearnerStarted,
    ObservationId,
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
    dumps,
)
from invar.model.shell import Verdict, deliver
from invar.model.state import (
    Assigned,
    BatchState,
    History,
    LearnerPhase,
    LearnerState,
    Sample,
    State,
    WorkerPhase,
    WorkerState,
    chain_ledger,
    evolve,
    initial_state,
)
from invar.testing import canonical_run

PROTOCOL_KEYS = ("prompts_per_batch", "group_size", "max_staleness", "sync_period",
                 "optimizer_steps", "total_updates", "eval_every", "checkpoint_every",
                 "max_inflight_batches", "workers", "kl_coef")
"""The `Bounds` fields a universe sets (the fault budgets mean nothing to induction)."""


@dataclass(frozen=True)
class Universe:
    """What the states are drawn from: the protocol's sizes and the counters' ranges."""

    bounds: Bounds
    incarnations: int = 2
    """Worker incarnations 0 .. incarnations - 1."""
    loads: int = 2
    """Load serials 0 .. loads."""
    attempts: int = 2
    """Learner attempts 0 .. attempts - 1 (and -1, before the first start)."""
    observations: int = 2
    """Forwards requested (the next observation serial) 0 .. observations."""
    symmetry: bool = False
    """Workers interchangeable: only one state per renaming of them (states whose worker
    records are in order), as the bounded searches' symmetry."""
    relaxed: frozenset[str] = frozenset()  # of RELAXABLE
    """Conjuncts of `STRENGTHENING` left out of IndInv (the fields they constrain then drawn
    from their whole ranges): how a conjunct is shown necessary, by the CTIs that follow."""

    def violations(self, state: State) -> dict[str, str]:
        """`inductive_violations` less the relaxed conjuncts."""
        broken = inductive_violations(state)
        return {k: v for k, v in broken.items() if k not in self.relaxed} if self.relaxed \
            else broken

    @property
    def config(self) -> RunConfig:
        return self.bounds.protocol()

    @property
    def worker_names(self) -> tuple[str, ...]:
        return tuple(f"wkr{i}" for i in range(self.bounds.workers))

    def describe(self) -> str:
        b = self.bounds
        return (f"B={b.prompts_per_batch} G={b.group_size} S={b.max_staleness} "
                f"P={b.sync_period} K={b.optimizer_steps} N={b.total_updates} "
                f"M={b.max_inflight_batches} E={b.eval_every} C={b.checkpoint_every} "
                f"W={b.workers}{f' β={b.kl_coef}' if b.kl_coef else ''}; incarnations "
                f"0..{self.incarnations - 1}, loads 0..{self.loads}, attempts "
                f"0..{self.attempts - 1}, forwards requested 0..{self.observations}; symmetry "
                f"{'on' if self.symmetry else 'off'}")


RELAXABLE = ("reconciliation_settled", "publishing_is_the_next_publication",
             "worker_records_consistent", "learner_works_on_a_complete_batch",
             "needed_versions_retained")
"""The conjuncts of `STRENGTHENING` a universe can leave out (the others, the learner's start
and progress, are how its states are built)."""

_UNIVERSE_KEYS = ("incarnations", "loads", "attempts", "observations", "symmetry")


def load_universe(path: str | Path) -> Universe:
    """A universe from a TOML file: `[model]` (the protocol's sizes, as a gate bound's, and
    `workers`) and `[universe]` (the counters' ranges, `symmetry`); raises ConfigError naming
    the key at fault."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError((str(path),), f"cannot read: {error}") from None
    unknown = set(data) - {"model", "universe", "description", "covers"}
    if unknown:
        raise ConfigError((f"{path}: {sorted(unknown)[0]}",), "unknown table")
    model, ranges = data.get("model", {}), data.get("universe", {})
    for table, keys, values in (("model", PROTOCOL_KEYS, model),
                                ("universe", _UNIVERSE_KEYS, ranges)):
        for key, value in values.items():
            if key not in keys:
                raise ConfigError((f"{table}.{key}",), f"unknown key in {path}")
            if key == "symmetry":
                if not isinstance(value, bool):
                    raise ConfigError((f"{table}.{key}",), "expected true or false")
            elif key == "kl_coef":
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                    raise ConfigError((f"{table}.{key}",), f"expected a number >= 0, got "
                                                           f"{value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError((f"{table}.{key}",), f"expected an integer >= 0, got "
                                                       f"{value!r}")
    for key in ("incarnations", "attempts", "workers"):
        if (ranges if key != "workers" else model).get(key, 1) < 1:
            raise ConfigError((f"{'model' if key == 'workers' else 'universe'}.{key}",),
                              "at least 1")
    bounds = Bounds(**model)
    try:
        bounds.protocol()
    except ConfigError as error:
        raise ConfigError(tuple(f"model.{f}" for f in error.fields), error.reason) from None
    return Universe(bounds, **ranges)


# ---------------------------------------------------------------------------------------------
# The payloads of correct components: what a state's samples, ledger and learner hold.


class Honest:
    """The values a run with correct components gives each payload-bearing field, by logical
    identity: each request's sample, each update's ledger record, and the learner's record at
    each point of an update (phase and step), taken from the canonical run's states."""

    def __init__(self, config: RunConfig) -> None:
        run = canonical_run(config)
        state = initial_state(config)
        self.samples: dict[tuple[int, int], Sample] = {}  # (batch, position)
        self.progress: dict[tuple[int, LearnerPhase, int], LearnerState] = {}
        for event in run.events:
            state = deliver(state, event).state
            for batch in state.batches:
                for position, slot in enumerate(batch.slots):
                    if isinstance(slot, Sample):
                        self.samples.setdefault((batch.batch, position), slot)
            learner = state.learner
            if learner.phase in BUSY_PHASES:
                self.progress.setdefault((state.committed, learner.phase, learner.step), learner)
        self.ledger = state.ledger
        digests = [""]
        for record in self.ledger:
            digests.append(chain_ledger(digests[-1], record))
        self.ledger_digests = tuple(digests)

    def busy(self, update: int) -> list[tuple[LearnerPhase, int]]:
        """The learner's (phase, step) while it works on `update`, in the order it goes."""
        return [(phase, step) for (u, phase, step) in self.progress if u == update]


# ---------------------------------------------------------------------------------------------
# States, field by field.


class WorkerRecord(NamedTuple):
    incarnation: int
    phase: str
    version: int | None
    load: int


class Recipe(NamedTuple):
    """A state of the universe, as the choices that build it (`build`): small, printable,
    and what a regression test rebuilds its state from."""

    committed: int | None
    """None: the learner never started (nothing committed, not even version 0)."""
    published: int
    """How many versions of Pub (in order) are published."""
    publishing: int | None
    admitted: int
    retained: tuple[int, ...]
    evaluated: int
    checkpointed: int
    """How many evaluation and checkpoint boundaries (in order) are acknowledged."""
    learner: tuple[int, str, int, int]
    """(attempt, phase, step, forwards requested)."""
    workers: tuple[WorkerRecord | None, ...]
    """Per worker name; None: never connected."""
    slots: tuple[tuple[str | None, ...], ...]
    """Per batch in flight, per slot: None (pending), "" (its sample) or the assignee's name
    (its current incarnation)."""
    timer_armed: bool


class Builder:
    """Builds the `State` of a `Recipe` in a universe."""

    def __init__(self, universe: Universe) -> None:
        self.universe = universe
        self.config = universe.config
        self.names = universe.worker_names
        self.honest = Honest(self.config)
        config = self.config
        self.pub = [v for v in range(config.total_updates + 1) if schedule.is_published(config, v)]
        self.evaluations = [v for v in range(config.total_updates + 1)
                            if schedule.is_eval_boundary(config, v)]
        self.checkpoints = [v for v in range(config.total_updates + 1)
                            if schedule.is_checkpoint_boundary(config, v)]

    def build(self, recipe: Recipe) -> State:
        config, honest = self.config, self.honest
        state = initial_state(config)
        if recipe.committed is None:
            learner = state.learner
        else:
            c = recipe.committed
            attempt, phase_name, step, observations = recipe.learner
            phase = LearnerPhase(phase_name)
            digests = History(w.version_digest(v) for v in range(c + 1))
            if phase in BUSY_PHASES:
                learner = evolve(honest.progress[c, phase, step], attempt=attempt,
                                 observations=observations)
                if learner.observation is not None:
                    learner = evolve(learner, observation=ObservationId(
                        c, step, observations - 1))
                if learner.cotangent is not None:
                    learner = evolve(learner, cotangent=evolve(
                        learner.cotangent, observation=learner.observation, attempt=attempt))
            else:
                learner = LearnerState(attempt=attempt, phase=phase, step=0, observation=None,
                                       step_digest=digests[c], scores=None,
                                       observations=observations)
            state = evolve(state, commit_digests=digests, ledger=honest.ledger[:c],
                           ledger_digest=honest.ledger_digests[c])
        workers = tuple(WorkerState(name, r.incarnation, WorkerPhase(r.phase), r.version,
                                    r.load, 0)
                        for name, r in zip(self.names, recipe.workers) if r is not None)
        incarnation = {x.name: x.incarnation for x in workers}
        batches = []
        committed = recipe.committed or 0
        for index, codes in zip(range(committed, recipe.admitted), recipe.slots):
            batch = BatchState.admitted(index, config.samples_per_batch)
            changes: dict[int, Sample | Assigned] = {}
            for position, code in enumerate(codes):
                if code == "":
                    changes[position] = honest.samples[index, position]
                elif code is not None:
                    changes[position] = Assigned(code, incarnation[code])
            batches.append(batch.with_slots(changes) if changes else batch)
        held: dict[str, int] = {}
        for batch in batches:
            for slot in batch.slots:
                if isinstance(slot, Assigned):
                    held[slot.worker] = held.get(slot.worker, 0) + 1
        workers = tuple(evolve(x, assigned=held.get(x.name, 0)) for x in workers)
        return evolve(state, learner=learner, workers=workers, admitted=recipe.admitted,
                      batches=tuple(batches),
                      published=History(self.pub[:recipe.published]),
                      publishing=recipe.publishing, retained=recipe.retained,
                      evaluated=History(self.evaluations[:recipe.evaluated]),
                      checkpointed=History(self.checkpoints[:recipe.checkpointed]),
                      timer_armed=recipe.timer_armed)


@dataclass
class Enumeration:
    """The states of IndInv in a universe, with what each stage of the construction kept."""

    states: dict[State, Recipe] = field(default_factory=dict)
    candidates: int = 0
    """Complete candidates built and held to IndInv."""
    rejected: dict[str, int] = field(default_factory=dict)
    """Candidates refused, by the first conjunct they break."""
    naive: int = 0
    """The size of the plain product of the fields' ranges, for comparison."""


def enumerate_states(universe: Universe, builder: Builder | None = None) -> Enumeration:
    """Every state of IndInv in `universe` (one per renaming of the workers with symmetry)."""
    builder = builder or Builder(universe)
    out = Enumeration(naive=_naive_size(universe, builder))
    for recipe in recipes(universe, builder):
        state = builder.build(recipe)
        out.candidates += 1
        broken = universe.violations(state)
        if broken:
            first = next(iter(broken))
            out.rejected[first] = out.rejected.get(first, 0) + 1
            continue
        out.states.setdefault(state, recipe)
    return out


def recipes(universe: Universe, builder: Builder) -> Iterator[Recipe]:
    """The candidates: each field drawn from its range as far as the conjuncts that speak of
    it, given the fields drawn before, allow."""
    config = builder.config
    n, m = config.total_updates, config.max_inflight_batches
    names = universe.worker_names
    for committed in (None, *range(n + 1)):
        if committed is None:  # learner_started_once_committed: nothing before the start
            offline = (-1, LearnerPhase.OFFLINE.value, 0, 0)
            for workers in _worker_choices(universe, names, (), set()):
                for timer in (False, True):
                    yield Recipe(None, 0, None, 0, (), 0, 0, offline, workers, (), timer)
            continue
        # publish_after_commit_in_order: a prefix of Pub up to the committed version;
        # publishing_is_the_next_publication.
        ordered = [v for v in builder.pub if v <= committed]
        for published in range(len(ordered) + 1):
            newest = ordered[published - 1] if published else -1
            upcoming = builder.pub[published] if published < len(builder.pub) else None
            publishing_choices = [None] + ([upcoming] if upcoming is not None
                                           and upcoming <= committed else [])
            if "publishing_is_the_next_publication" in universe.relaxed:
                publishing_choices = [None, *range(n + 1)]
            # inflight_batches_bounded; launch_only_published_and_loaded: each batch's version
            # published.
            admitted_choices = [a for a in range(committed, min(n, committed + m) + 1)
                                if all(schedule.gen_version(config, b) <= newest
                                       for b in range(committed, a))]
            for publishing, admitted in itertools.product(publishing_choices, admitted_choices):
                yield from _with_boundaries(universe, builder, committed, published, publishing,
                                            admitted)


def _with_boundaries(universe: Universe, builder: Builder, committed: int, published: int,
                     publishing: int | None, admitted: int) -> Iterator[Recipe]:
    config = builder.config
    newest = builder.pub[published - 1] if published else -1
    # version_retained_while_in_use, needed_versions_retained: the newest publication, and
    # any of the published ones before it.
    optional = [v for v in builder.pub[:published] if v < newest]
    # boundaries_acknowledged_before_moving_on: all due, or all but the newest version's.
    due_eval = len([v for v in builder.evaluations if v <= committed])
    due_ckpt = len([v for v in builder.checkpoints if v <= committed])
    evaluated_choices = {due_eval, max(due_eval - 1, 0)}
    checkpointed_choices = {due_ckpt, max(due_ckpt - 1, 0)}
    learners = _learner_choices(universe, builder, committed)
    for extra in _subsets(optional):
        retained = tuple(sorted({newest, *extra} if published else extra))
        for workers in _worker_choices(universe, universe.worker_names, retained,
                                       set(builder.pub[:published])):
            slot_choices = [_slot_choices(universe, builder, b, workers)
                            for b in range(committed, admitted)]
            for evaluated, checkpointed, learner in itertools.product(
                    sorted(evaluated_choices), sorted(checkpointed_choices), learners):
                busy = LearnerPhase(learner[1]) in BUSY_PHASES
                per_batch = list(slot_choices)
                if busy and "learner_works_on_a_complete_batch" not in universe.relaxed:
                    if not per_batch:
                        continue
                    per_batch[0] = [("",) * config.samples_per_batch]
                for slots in itertools.product(*per_batch):
                    for timer in (False, True):
                        yield Recipe(committed, published, publishing, admitted, retained,
                                     evaluated, checkpointed, learner, workers, slots, timer)


def _subsets(items: Sequence[int]) -> Iterator[tuple[int, ...]]:
    for size in range(len(items) + 1):
        yield from itertools.combinations(items, size)


def _learner_choices(universe: Universe, builder: Builder,
                     committed: int) -> list[tuple[int, str, int, int]]:
    """(attempt, phase, step, forwards requested): idle (waiting; finished once every update is
    committed, learner_bound_to_its_step) or at a point of update `committed`, with a
    pending forward only if one was requested."""
    points: list[tuple[LearnerPhase, int]] = []
    if committed == builder.config.total_updates:
        points.append((LearnerPhase.FINISHED, 0))
    else:
        points += [(LearnerPhase.WAITING, 0), *builder.honest.busy(committed)]
    out = []
    for attempt, (phase, step), observations in itertools.product(
            range(universe.attempts), points, range(universe.observations + 1)):
        if phase in (LearnerPhase.FORWARD, LearnerPhase.APPLYING) and observations < 1:
            continue
        out.append((attempt, phase.value, step, observations))
    return out


def _worker_choices(universe: Universe, names: tuple[str, ...], retained: tuple[int, ...],
                    published: set[int]) -> Iterator[tuple[WorkerRecord | None, ...]]:
    """Each worker: never connected, or an incarnation that is idle (nothing loaded,
    worker_records_consistent), loading a retained version (version_retained_while_in_use),
    ready with a published one, or lost (nothing held, batch_counters_consistent)."""
    one: list[WorkerRecord | None] = [None]
    every_load = range(universe.loads + 1)
    relaxed = "worker_records_consistent" in universe.relaxed
    loads = every_load if relaxed else range(1, universe.loads + 1)
    idle: list[tuple[int | None, int]] = [(None, 0)]
    ready = sorted(published)
    if relaxed:  # any version, any load
        ready = list(range(universe.config.total_updates + 1))
        idle = [(v, load) for v in (None, *ready) for load in every_load]
    for incarnation in range(universe.incarnations):
        one += [WorkerRecord(incarnation, WorkerPhase.IDLE.value, v, load) for v, load in idle]
        one += [WorkerRecord(incarnation, WorkerPhase.LOADING.value, v, load)
                for v in retained for load in loads]
        one += [WorkerRecord(incarnation, WorkerPhase.READY.value, v, load)
                for v in ready for load in loads]
        one += [WorkerRecord(incarnation, WorkerPhase.LOST.value, None, load)
                for load in every_load]
    if not universe.symmetry:
        yield from itertools.product(one, repeat=len(names))
        return
    order = {record: i for i, record in enumerate(one)}
    for combination in itertools.combinations_with_replacement(one, len(names)):
        yield tuple(sorted(combination, key=order.__getitem__))


def _slot_choices(universe: Universe, builder: Builder, batch: int,
                  workers: tuple[WorkerRecord | None, ...]) -> list[tuple[str | None, ...]]:
    """A batch's slots: pending, its sample, or assigned to a worker ready with its version
    (launch_only_published_and_loaded)."""
    version = schedule.gen_version(builder.config, batch)
    ready = [name for name, r in zip(universe.worker_names, workers)
             if r is not None and r.phase == WorkerPhase.READY.value and r.version == version]
    one: list[str | None] = [None, "", *ready]
    return list(itertools.product(one, repeat=builder.config.samples_per_batch))


def _naive_size(universe: Universe, builder: Builder) -> int:
    """The plain product of every field's range in the universe (what the construction is
    spared): committed, published, publishing, admitted, retained, acknowledgements, the
    learner, each worker, each slot, the timer."""
    config = builder.config
    n = config.total_updates
    versions = n + 1
    worker = 1 + universe.incarnations * len(WorkerPhase) * (versions + 1) * (universe.loads + 1)
    learner = (universe.attempts + 1) * len(LearnerPhase) * config.optimizer_steps * (
        universe.observations + 1)
    slot = 2 + universe.bounds.workers * universe.incarnations
    slots = sum(slot ** (config.samples_per_batch * batches) for batches in range(n + 1))
    return ((n + 2) * (len(builder.pub) + 1) * (versions + 1) * 2 ** versions
            * (len(builder.evaluations) + 1) * (len(builder.checkpoints) + 1) * learner
            * worker ** universe.bounds.workers * slots * 2)


# ---------------------------------------------------------------------------------------------
# The alphabet: every event a component could send, stale ones, faults and forgeries.


def alphabet(state: State, universe: Universe) -> list[Event]:
    """The events applied to `state`: each distinct one once."""
    events: list[Event] = [TimerFired()]
    for name in universe.worker_names:
        events += _worker_events(state, name)
    events += _completions(state, universe)
    events += _learner_events(state)
    try:
        events += w.forgeries(state)
    except ValueError:  # a busy learner's batch not complete: only with that conjunct relaxed
        pass
    unique: dict[str, Event] = {}
    for event in events:
        unique.setdefault(f"{type(event).__name__}{event!r}", event)
    return list(unique.values())


def _worker_events(state: State, name: str) -> list[Event]:
    """Its connections and losses (the previous, current and next incarnation), and its loads'
    replies (the current and previous incarnation and serial, any version)."""
    known = state.worker(name)
    current = known.incarnation if known is not None else -1
    out: list[Event] = []
    for incarnation in range(max(current - 1, 0), current + 2):
        out += [WorkerConnected(name, incarnation), WorkerLost(name, incarnation)]
    if known is not None:
        for incarnation in {max(current - 1, 0), current}:
            for load in {max(known.load - 1, 0), known.load}:
                for version in range(state.config.total_updates + 1):
                    out.append(WeightsLoaded(name, incarnation, load, version))
    return out


def _completions(state: State, universe: Universe) -> list[Event]:
    """A worker's reply for every request of every batch admitted (the last consumed one too:
    a late reply), from every known worker's current and previous incarnation: one completion
    per frame, and a whole batch in one frame."""
    config = state.config
    senders = [(x.name, i) for x in state.workers
               for i in sorted({max(x.incarnation - 1, 0), x.incarnation})]
    out: list[Event] = []
    for batch in range(max(state.committed - 1, 0), state.admitted):
        version = schedule.gen_version(config, batch)
        requests = schedule.request_ids(config, batch)
        completions = [w.sample_completion(LaunchRequest(
            "", 0, r, version, schedule.sampling_seed(config, r),
            schedule.prompt_index(config, r.batch, r.prompt))) for r in requests]
        frames = [Completions.of([c]) for c in completions]
        if len(completions) > 1:
            frames.append(Completions.of(completions))
        out += [RequestsCompleted(name, incarnation, frame)
                for name, incarnation in senders for frame in frames]
    return out


def _learner_events(state: State) -> list[Event]:
    """The learner's replies for the current and the previous update and attempt, to every
    forward serial requested, and its starts; the store's and the boundaries' replies."""
    config = state.config
    learner = state.learner
    c, k = state.committed, config.optimizer_steps
    updates = sorted({max(c - 1, 0), c} & set(range(config.total_updates)))
    attempts = sorted({max(learner.attempt - 1, 0), max(learner.attempt, 0)})
    out: list[Event] = []
    for update, attempt in itertools.product(updates, attempts):
        if config.scores_batch:
            out.append(w.scores_reply(ScoreProbabilities(
                update, attempt, schedule.request_ids(config, update),
                config.objective.needs_reference)))
        plan = schedule.minibatch_requests(config, update)
        for step, serial in itertools.product(range(k), range(learner.observations)):
            observation = ObservationId(update, step, serial)
            out.append(w.forward_reply(RunForward(observation, attempt, plan[step]), k))
            out.append(StepFinished(observation, attempt, w.step_digest(update, step + 1, k)))
        out.append(UpdateCommitted(update, w.version_digest(update + 1)))
    for version in range(min(c + 2, config.total_updates + 1)):
        digest = w.version_digest(version)
        out += [VersionPublished(version, digest), CheckpointWritten(version, digest),
                VersionEvaluated(version, w.evaluation_reward(version))]
    for attempt in range(max(learner.attempt - 1, 0), learner.attempt + 2):
        for version in (c, c + 1):
            if version <= config.total_updates:
                out.append(LearnerStarted(attempt, version, w.version_digest(version)))
    return out


# ---------------------------------------------------------------------------------------------
# The check.


class Counterexample(NamedTuple):
    """A counterexample to induction: from `state` (which satisfies IndInv), `event` leads to
    a state that breaks `conjunct` (or a transition invariant, or `step` raised)."""

    recipe: Recipe
    state: State
    event: Event
    conjunct: str
    detail: str


@dataclass
class InductiveResult:
    universe: Universe
    init_holds: bool
    init_broken: dict[str, str]
    states: int
    candidates: int
    naive: int
    rejected: dict[str, int]
    transitions: int
    """Events applied (states times their alphabets)."""
    accepted: int
    """Of them, accepted or counted as no-ops (the others refused)."""
    outside: int
    """Accepted steps to a state outside the enumeration (a counter past its range): IndInv
    checked on it all the same."""
    counterexamples: list[Counterexample]
    enumerate_s: float
    check_s: float
    peak_kib: int = 0

    @property
    def proved(self) -> bool:
        return self.init_holds and not self.counterexamples

    def summary(self) -> dict[str, Any]:
        return {
            "universe": self.universe.describe(), "proved": self.proved,
            "init_in_indinv": self.init_holds, "states": self.states,
            "candidates": self.candidates, "naive_product": self.naive,
            "rejected_candidates": self.rejected, "transitions": self.transitions,
            "accepted": self.accepted, "outside_universe": self.outside,
            "counterexamples": len(self.counterexamples),
            "enumerate_s": round(self.enumerate_s, 2), "check_s": round(self.check_s, 2),
            "states_per_s": round(self.states / self.check_s) if self.check_s else None,
        }


def check(universe: Universe, stop_after: int | None = None,
          builder: Builder | None = None) -> InductiveResult:
    """IndInit and IndNext in `universe`: every counterexample to induction, shortest first
    (`stop_after`: stop once that many are found; `builder`: one made before, e.g. before a
    test patches the core, whose correct payloads it then keeps)."""
    builder = builder or Builder(universe)
    began = time.perf_counter()
    found = enumerate_states(universe, builder)
    enumerated = time.perf_counter()
    init = initial_state(universe.config)
    init_broken = universe.violations(init)
    known: dict[State, bool] = {state: True for state in found.states}
    transitions = accepted = outside = 0
    ctis: list[Counterexample] = []
    for state, recipe in sorted(found.states.items(), key=lambda item: _size(item[1])):
        for event in alphabet(state, universe):
            transitions += 1
            cti = _step_checked(universe, state, recipe, event, known)
            if cti is None:
                continue
            if isinstance(cti, Counterexample):
                ctis.append(cti)
            else:
                accepted += 1
                outside += cti
        if stop_after is not None and len(ctis) >= stop_after:
            break
    return InductiveResult(universe, not init_broken, init_broken, len(found.states),
                           found.candidates, found.naive, found.rejected, transitions,
                           accepted + len(ctis), outside, ctis, enumerated - began,
                           time.perf_counter() - enumerated)


def _step_checked(universe: Universe, state: State, recipe: Recipe, event: Event,
                  known: dict[State, bool]) -> Counterexample | int | None:
    """None: refused; a counterexample; else 1 when the successor lies outside the
    enumeration (checked on its own), 0 when inside (IndInv holds there)."""
    try:
        delivery = deliver(state, event)
    except Exception as error:  # noqa: BLE001 -- a crash on some input is what we look for
        return Counterexample(recipe, state, event, "step_raises",
                              f"{type(error).__name__}: {error}")
    if delivery.verdict is Verdict.REFUSED:
        return None
    after = delivery.state
    broken = transition_violations(state, delivery.commands, after)
    stale = stale_event_changes_nothing(state, event, after)
    if stale:
        broken["stale_event_changes_nothing"] = stale
    if broken:
        name, detail = next(iter(broken.items()))
        return Counterexample(recipe, state, event, name, detail)
    if after in known:
        return 0
    broken = universe.violations(after)
    if broken:
        name, detail = next(iter(broken.items()))
        return Counterexample(recipe, state, event, name, detail)
    known[after] = True
    return 1


def _size(recipe: Recipe) -> tuple[int, ...]:
    """Shortest first: fewer workers, updates, batches, attempts and forwards."""
    workers = [r for r in recipe.workers if r is not None]
    return (len(workers), -1 if recipe.committed is None else recipe.committed,
            recipe.admitted, recipe.learner[0], recipe.learner[3],
            sum(r.incarnation + r.load for r in workers), len(repr(recipe)))


# ---------------------------------------------------------------------------------------------
# Output.


def format_counterexample(cti: Counterexample) -> str:
    return (f"{cti.conjunct}: {cti.detail}\n  state: {cti.recipe}\n"
            f"  event: {type(cti.event).__name__}{cti.event!r}")


def regression_test(universe_path: str, cti: Counterexample) -> str:
    """A pytest file that rebuilds the counterexample's state and steps its event: it fails
    while the step breaks IndInv (or a transition invariant) from there."""
    return f'''"""Regression test generated by invar-check --inductive: a counterexample to
induction for {cti.conjunct!r} in {universe_path}.

The state satisfies the inductive invariant; the event leads to one that does not. It fails
while the step from there breaks it (a fix that strengthens IndInv instead leaves the state
out of IndInv: the test then passes too).
"""

from checker.inductive import Builder, Recipe, WorkerRecord, load_universe
from invar.model import loads
from invar.model.invariants import (
    inductive_violations,
    stale_event_changes_nothing,
    transition_violations,
)
from invar.model.shell import Verdict, deliver

UNIVERSE = {universe_path!r}
RECIPE = {cti.recipe!r}
EVENT = {dumps(cti.event)!r}


def test_counterexample_to_induction_{cti.conjunct}_is_fixed():
    state = Builder(load_universe(UNIVERSE)).build(RECIPE)
    if inductive_violations(state):
        return  # IndInv was strengthened to leave this state out
    event = loads(EVENT)
    delivery = deliver(state, event)
    if delivery.verdict is Verdict.REFUSED:
        return
    assert not transition_violations(state, delivery.commands, delivery.state)
    assert not stale_event_changes_nothing(state, event, delivery.state)
    assert not inductive_violations(delivery.state)
'''

