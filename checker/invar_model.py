"""The Invar protocol as a checker model: the pure core inside a faulty world.

The state is a `World`: the core's `State` (advanced only by `invar.model.step`, never
re-implemented here), the state the driver's journal would recover (`durable`), an unordered
network of in-flight commands and replies, and the components around the core — rollout
workers and one learner — played by the correct fakes of `invar.testing`. Faults are actions
with budgets: drop, duplicate (and, since delivery is unordered, delay/reorder for free), worker
crash and reconnect with a new incarnation, learner crash and restart from its last durable
commit, driver restart from its journal, and an early retry timer.

The retry timer also fires, without budget, whenever nothing is in flight: that is the fairness
the protocol's liveness rests on (a timer eventually fires), modelled so that every bounded
run can complete.
"""

from __future__ import annotations

import itertools
import tomllib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator

from invar.model.config import RunConfig
from invar.model.core import logical_projection, requires_fsync, run_complete, step
from invar.model.errors import ConfigError, ProtocolError
from invar.model.invariants import INVARIANTS, transition_violations
from invar.model.messages import (
    ApplyCotangent,
    Commit,
    Event,
    LaunchRequest,
    LearnerStarted,
    LoadWeights,
    Publish,
    RequestCompleted,
    RunForward,
    ScoreProbabilities,
    TimerFired,
    UpdateCommitted,
    WorkerConnected,
    WorkerLost,
)
from invar.model.objective import ObjectiveConfig
from invar.model.state import Assigned, State, initial_state
from invar.model.state import evolve as replace
from invar.testing import canonical_run, learner_reply, version_digest, worker_reply

from checker.model import BaseModel, Property

CORE = "core"
LEARNER = "learner"
STORE = "store"


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
    learner_crashes: int = 0
    driver_restarts: int = 0
    early_timers: int = 0
    """Timer expiries while messages are still in flight (each re-sends everything)."""
    kl_coef: float = 0.0

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
    unknown = set(data) - {"model", "check", "description"}
    if unknown:
        raise ConfigError((f"{path}: {sorted(unknown)[0]}",), "unknown table")
    model = data.get("model", {})
    names = set(Bounds.__dataclass_fields__)
    for key, value in model.items():
        if key not in names:
            raise ConfigError((f"model.{key}",), f"unknown key in {path}")
        expected = float if key == "kl_coef" else int
        if isinstance(value, bool) or not isinstance(value, (int, float) if expected is float
                                                     else int):
            raise ConfigError((f"model.{key}",), f"expected {expected.__name__}, got {value!r}")
        if value < 0:
            raise ConfigError((f"model.{key}",), "must be >= 0")
    bounds = Bounds(**model)
    if bounds.workers < 1:
        raise ConfigError(("model.workers",), "at least one worker")
    try:
        bounds.protocol()
    except ConfigError as error:
        raise ConfigError(tuple(f"model.{f}" for f in error.fields), error.reason) from None
    return bounds, dict(data.get("check", {}))


@dataclass(frozen=True)
class Budget:
    drops: int
    duplicates: int
    worker_crashes: int
    learner_crashes: int
    driver_restarts: int
    early_timers: int


@dataclass(frozen=True)
class Component:
    """A worker or the learner as the world sees it: which incarnation runs, if any."""

    name: str
    incarnation: int
    alive: bool
    disk_version: int = 0
    """The learner's last durable commit (unused for workers)."""


@dataclass(frozen=True, order=True)
class Message:
    """A command in flight to a component, or an event in flight to the core."""

    key: str  # canonical text: orders the network, keeps it a multiset
    to: str = field(compare=False)
    body: Any = field(compare=False)


def message(to: str, body: Any) -> Message:
    return Message(f"{to}|{body!r}", to, body)


@dataclass(frozen=True)
class World:
    core: State
    durable: State
    network: tuple[Message, ...]
    learner: Component
    workers: tuple[Component, ...]
    budget: Budget
    refused: str = ""
    """The reason of a ProtocolError a correct component provoked (must stay empty)."""


# Actions: (kind, argument) tuples, in a fixed order.


class InvarModel(BaseModel[World, tuple]):
    """The checker's model of an Invar run within `bounds`."""

    def __init__(self, bounds: Bounds, symmetry: bool = False, reduction: bool = False) -> None:
        self.bounds = bounds
        self.config = bounds.protocol()
        self.worker_names = tuple(f"wkr{i}" for i in range(bounds.workers))
        self.symmetry = symmetry and bounds.workers > 1
        self.reduction = reduction
        self._config_text = repr(self.config)
        self._last_step: tuple[State, Event, Any] | None = None

    @cached_property
    def canonical_projection(self) -> tuple:
        return logical_projection(canonical_run(self.config, self.worker_names).state)

    # -- the model API ---------------------------------------------------------------------

    def init_states(self) -> list[World]:
        core = initial_state(self.config)
        b = self.bounds
        network = sorted([message(CORE, LearnerStarted(0, 0, version_digest(0))),
                          *(message(CORE, WorkerConnected(n, 0)) for n in self.worker_names)])
        return [World(core=core, durable=core, network=tuple(network),
                      learner=Component(LEARNER, 0, True, 0),
                      workers=tuple(Component(n, 0, True) for n in self.worker_names),
                      budget=Budget(b.drops, b.duplicates, b.worker_crashes, b.learner_crashes,
                                    b.driver_restarts, b.early_timers))]

    def actions(self, world: World) -> Iterator[tuple]:
        if world.refused:
            return
        distinct = list(dict.fromkeys(m.key for m in world.network))
        # Connections, losses and restarts are the driver's own observations, not messages
        # on the wire: they may be delayed behind others, never dropped or duplicated.
        wire = [k for k in distinct if not k.startswith(_LOCAL_FACTS)]
        ample = self._ample(world, distinct) if self.reduction else None
        if ample is not None:
            yield ("deliver", ample)
            if world.budget.drops:
                yield ("drop", ample)
            if world.budget.duplicates:
                yield ("duplicate", ample)
            return
        for key in distinct:
            if not _overtakes_connection(world, key):
                yield ("deliver", key)
        if world.budget.drops:
            for key in wire:
                yield ("drop", key)
        if world.budget.duplicates:
            for key in wire:
                yield ("duplicate", key)
        if world.core.timer_armed and (not world.network or world.budget.early_timers):
            yield ("timer", None)
        for worker in world.workers:
            if worker.alive and world.budget.worker_crashes:
                yield ("crash_worker", worker.name)
            if not worker.alive:
                yield ("restart_worker", worker.name)
        if world.learner.alive and world.budget.learner_crashes:
            yield ("crash_learner", None)
        if not world.learner.alive:
            yield ("restart_learner", None)
        if world.budget.driver_restarts:
            yield ("restart_driver", None)

    def next_state(self, world: World, action: tuple) -> World | None:
        kind, arg = action
        if kind == "deliver":
            return self._deliver(world, arg)
        if kind == "drop":
            return replace(world, network=_remove(world.network, arg),
                           budget=replace(world.budget, drops=world.budget.drops - 1))
        if kind == "duplicate":
            copy = next(m for m in world.network if m.key == arg)
            return replace(world, network=_insert(world.network, [copy]),
                           budget=replace(world.budget, duplicates=world.budget.duplicates - 1))
        if kind == "timer":
            budget = world.budget
            if world.network:
                budget = replace(budget, early_timers=budget.early_timers - 1)
            return self._to_core(replace(world, budget=budget), TimerFired())
        if kind == "crash_worker":
            worker = next(w for w in world.workers if w.name == arg)
            world = _put(world, replace(worker, alive=False))
            world = replace(world, budget=replace(world.budget,
                                                  worker_crashes=world.budget.worker_crashes - 1))
            # The driver notices the dead connection.
            return replace(world, network=_insert(world.network, [
                message(CORE, WorkerLost(arg, worker.incarnation))]))
        if kind == "restart_worker":
            worker = next(w for w in world.workers if w.name == arg)
            fresh = Component(arg, worker.incarnation + 1, True)
            world = _put(world, fresh)
            return replace(world, network=_insert(world.network, [
                message(CORE, WorkerConnected(arg, fresh.incarnation))]))
        if kind == "crash_learner":
            return replace(world, learner=replace(world.learner, alive=False),
                           budget=replace(world.budget,
                                          learner_crashes=world.budget.learner_crashes - 1))
        if kind == "restart_learner":
            return self._restart_learner(world)
        if kind == "restart_driver":
            # The new driver replays its journal: it knows what was fsynced, nothing after.
            # Replies in flight to the old driver die with it; the learner is in-process.
            network = tuple(m for m in world.network if m.to != CORE)
            world = replace(world, core=world.durable, network=network,
                            learner=replace(world.learner, alive=False),
                            budget=replace(world.budget,
                                           driver_restarts=world.budget.driver_restarts - 1))
            world = self._restart_learner(world)
            # Workers are reached through the driver's connections: the new driver opens new
            # ones, which the core sees as new incarnations.
            workers = tuple(Component(w.name, w.incarnation + 1, True) for w in world.workers)
            hello = [message(CORE, WorkerConnected(w.name, w.incarnation)) for w in workers]
            return replace(world, workers=workers, network=_insert(
                world.network, [*hello, message(CORE, TimerFired())]))
        raise ValueError(f"unknown action {action!r}")  # pragma: no cover

    def is_final(self, world: World) -> bool:
        return run_complete(world.core)

    def properties(self) -> list[Property]:
        props = [Property.always("correct_components_never_refused", lambda w: not w.refused)]
        for name, check in INVARIANTS.items():
            props.append(Property.always(name, lambda w, check=check: not check(w.core)))
        props.append(Property.transition("transition_invariants", self._transition_ok))
        props.append(Property.final("completed_run_matches_canonical_schedule",
                                    lambda w: logical_projection(w.core)
                                    == self.canonical_projection))
        props.append(Property.sometimes("run_completes", self.is_final))
        b = self.bounds
        if b.drops:
            props.append(Property.sometimes("a_message_is_dropped",
                                            lambda w: w.budget.drops < b.drops))
        if b.learner_crashes:
            k = self.config.optimizer_steps
            # More forwards than K per update so far: some update's steps ran twice.
            props.append(Property.sometimes(
                "learner_restart_redoes_an_update",
                lambda w: w.core.learner.attempt > 0
                and w.core.learner.observations > k * (w.core.committed + 1)))
        if b.worker_crashes:
            props.append(Property.sometimes("worker_reconnects",
                                            lambda w: any(x.incarnation > 0 for x in w.workers)))
        if b.driver_restarts:
            props.append(Property.sometimes("driver_restarts",
                                            lambda w: w.budget.driver_restarts < b.driver_restarts))
        return props

    def fingerprint_key(self, world: World) -> Any:
        text = _key_text(world, self._config_text)
        if not self.symmetry:
            return text
        # Interchangeable workers: the representative is the least text over every renaming
        # of the world. The renaming is done on the objects, not on the text: collections
        # ordered by name (the core's workers, the network, the world's workers) must be
        # re-sorted, and a batch's slots stand behind a digest that hashes the names, so a
        # textual replace would map most states to a text no mirror state produces.
        best = text
        names = self.worker_names
        for perm in itertools.permutations(names):
            if perm == names:
                continue
            mapping = dict(zip(names, perm))
            best = min(best, _key_text(_rename_world(world, mapping, names), self._config_text))
        return best

    def format_action(self, action: tuple) -> str:
        kind, arg = action
        return kind if arg is None else f"{kind} {arg}"

    def action_kind(self, action: tuple) -> str:
        kind, arg = action
        if kind in ("deliver", "drop", "duplicate") and isinstance(arg, str):
            body = arg.split("|", 1)[1]
            return f"{kind}:{body.split('(', 1)[0]}"
        return kind

    # -- the world's mechanics --------------------------------------------------------------

    def _deliver(self, world: World, key: str) -> World:
        msg = next(m for m in world.network if m.key == key)
        world = replace(world, network=_remove(world.network, key))
        if msg.to == CORE:
            return self._to_core(world, msg.body)
        if msg.to == STORE:
            reply = learner_reply(msg.body, self.config.optimizer_steps)
            return replace(world, network=_insert(world.network, [message(CORE, reply)]))
        if msg.to == LEARNER:
            return self._to_learner(world, msg.body)
        worker = next(w for w in world.workers if w.name == msg.to)
        if not worker.alive or worker.incarnation != msg.body.incarnation:
            return world  # a dead incarnation's mail is lost
        reply = worker_reply(msg.body)
        return replace(world, network=_insert(world.network, [message(CORE, reply)]))

    def _to_learner(self, world: World, command: Any) -> World:
        learner = world.learner
        if not learner.alive or command.attempt != learner.incarnation:
            return world  # a restarted learner ignores its predecessor's commands
        if isinstance(command, Commit):
            version = command.update + 1
            if learner.disk_version == command.update:
                learner = replace(learner, disk_version=version)
            elif learner.disk_version != version:
                return world
            reply = UpdateCommitted(command.update, version_digest(version))
            return replace(world, learner=learner,
                           network=_insert(world.network, [message(CORE, reply)]))
        reply = learner_reply(command, self.config.optimizer_steps)
        return replace(world, network=_insert(world.network, [message(CORE, reply)]))

    def _restart_learner(self, world: World) -> World:
        learner = world.learner
        fresh = Component(LEARNER, learner.incarnation + 1, True, learner.disk_version)
        started = LearnerStarted(fresh.incarnation, fresh.disk_version,
                                 version_digest(fresh.disk_version))
        return replace(world, learner=fresh,
                       network=_insert(world.network, [message(CORE, started)]))

    def _step(self, core: State, event: Event) -> Any:
        """`step`, remembering the last call: the transition property asks again at once."""
        last = self._last_step
        if last is not None and last[0] is core and last[1] == event:
            return last[2]
        outcome = step(core, event)
        self._last_step = (core, event, outcome)
        return outcome

    def _to_core(self, world: World, event: Event) -> World:
        outcome = self._step(world.core, event)
        if isinstance(outcome, ProtocolError):
            return replace(world, refused=f"{outcome.reason.value}: {outcome.detail}")
        core, commands = outcome
        durable = core if requires_fsync(event, commands) else world.durable
        sent = [message(_destination(c), c) for c in commands if _destination(c)]
        return replace(world, core=core, durable=durable,
                       network=_insert(world.network, sent) if sent else world.network)

    def _transition_ok(self, world: World, action: tuple, after: World) -> bool:
        kind, arg = action
        if kind == "timer":
            event: Any = TimerFired()
        elif kind == "deliver":
            msg = next(m for m in world.network if m.key == arg)
            if msg.to != CORE:
                return True
            event = msg.body
        else:
            return True
        outcome = self._step(world.core, event)
        if isinstance(outcome, ProtocolError):
            return True  # reported by correct_components_never_refused
        return not transition_violations(world.core, outcome[1], outcome[0])

    def _ample(self, world: World, distinct: list[str]) -> str | None:
        """Partial-order reduction: one worker reply stands for all orders of its kind.

        Used only where the core declares the deliveries independent (`independent_completion`)
        and nothing else in the world can interleave with them: no crash or early-timer budget
        left, every component alive, and only completions in flight to the core.
        """
        b = world.budget
        if (b.worker_crashes or b.learner_crashes or b.driver_restarts or b.early_timers
                or not world.learner.alive or not all(w.alive for w in world.workers)):
            return None
        candidates = [m for m in world.network if m.to == CORE]
        if not candidates or not all(isinstance(m.body, RequestCompleted) for m in candidates):
            return None
        for msg in candidates:
            if independent_completion(world.core, msg.body):
                return msg.key
        return None


def independent_completion(state: State, event: RequestCompleted) -> bool:
    """True when delivering `event` commutes with every other completion delivery: it fills
    a slot of a batch that stays incomplete, so no command follows from it."""
    batch = state.batch(event.request.batch)
    if batch is None:
        return False
    position = event.request.prompt * state.config.group_size + event.request.sample
    slot = batch.slots[position]
    if not isinstance(slot, Assigned) or batch.completed + 1 == len(batch.slots):
        return False
    holder = state.worker(slot.worker)
    # The worker keeps other requests, so it does not become free (and get a new load).
    return holder is not None and holder.incarnation == slot.incarnation and holder.assigned > 1


_LOCAL_FACTS = tuple(f"{CORE}|{t.__name__}(" for t in (WorkerConnected, WorkerLost, LearnerStarted,
                                                        TimerFired))


def _overtakes_connection(world: World, key: str) -> bool:
    """A worker's loss is observed after its connection (one reader task sees both)."""
    if not key.startswith(f"{CORE}|WorkerLost("):
        return False
    lost = next(m.body for m in world.network if m.key == key)
    return message(CORE, WorkerConnected(lost.worker, lost.incarnation)).key in \
        {m.key for m in world.network}


def _destination(command: Any) -> str:
    if isinstance(command, (LaunchRequest, LoadWeights)):
        return command.worker
    if isinstance(command, (ScoreProbabilities, RunForward, ApplyCotangent, Commit)):
        return LEARNER
    if isinstance(command, Publish):
        return STORE
    return ""  # Evaluate, Checkpoint, Retain/Release, SetTimer: no reply in the protocol


def _insert(network: tuple[Message, ...], messages: list[Message]) -> tuple[Message, ...]:
    return tuple(sorted((*network, *messages)))


def _remove(network: tuple[Message, ...], key: str) -> tuple[Message, ...]:
    for i, m in enumerate(network):
        if m.key == key:
            return network[:i] + network[i + 1:]
    raise KeyError(key)  # pragma: no cover


def _put(world: World, worker: Component) -> World:
    return replace(world, workers=tuple(worker if w.name == worker.name else w
                                        for w in world.workers))


def _rename_world(world: World, mapping: dict[str, str], names: tuple[str, ...]) -> World:
    """`world` with its workers renamed by `mapping`, every name-ordered collection re-sorted."""
    by_name = {mapping[w.name]: replace(w, name=mapping[w.name]) for w in world.workers}
    durable = world.durable
    if world.budget.driver_restarts:  # only then part of the key (see _key_text)
        durable = _rename_core(durable, mapping)
    return replace(world, core=_rename_core(world.core, mapping), durable=durable,
                   network=tuple(sorted(_rename_message(m, mapping) for m in world.network)),
                   workers=tuple(by_name[n] for n in names))


def _rename_core(core: State, mapping: dict[str, str]) -> State:
    workers = tuple(sorted((replace(w, name=mapping[w.name]) for w in core.workers),
                           key=lambda w: w.name))
    batches = tuple(
        batch.with_slots({p: Assigned(mapping[s.worker], s.incarnation)
                          for p, s in enumerate(batch.slots) if isinstance(s, Assigned)})
        for batch in core.batches)
    return replace(core, workers=workers, batches=batches)


def _rename_message(msg: Message, mapping: dict[str, str]) -> Message:
    body = msg.body
    name = getattr(body, "worker", None)
    if name is None:
        return msg
    return message(mapping.get(msg.to, msg.to), replace(body, worker=mapping[name]))


def _key_text(world: World, config_text: str) -> str:
    """Canonical text of a world: reprs leave out payloads that stand behind digests, and the
    configuration (the same in every state). What a driver restart would recover counts only
    while a restart can still happen."""
    durable = repr(world.durable) if world.budget.driver_restarts else ""
    return "\n".join((
        repr(world.core).replace(config_text, ""), durable.replace(config_text, ""),
        "|".join(m.key for m in world.network), repr(world.learner), repr(world.workers),
        repr(world.budget), world.refused))
