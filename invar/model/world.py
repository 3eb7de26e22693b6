"""One world around the core: components that misbehave the way real ones do. No I/O.

A `World` is an immutable value: the core's `State`, the journal (what a driver restart
recovers), the network of in-flight messages, and the components — the learner, the rollout
workers, the weights store and the checkpoints — each with exactly the memory a real one has
and loses. The functions at the bottom are the world's actions: deliver a message, drop or
duplicate one, merge two reply frames of a worker or split one (a worker answers launches in
frames of any grouping), fire the timer, crash and restart a worker, the learner or the
driver. The model checker explores them exhaustively, the property tests draw them at
random, `canonical_run` takes the first message each time; all deliver events through
`shell.deliver` and commands through `shell.route`, so there is one definition of what happens
around `step`.

The components keep the rules the real ones keep (`LearnerRules`, `worker_accepts`, the store),
so a protocol that relies on more than a real component does cannot pass:

* the learner answers only its own attempt; runs a forward only if it is newer than the pending
  and the last applied one (an older, re-sent one is ignored: it would replace the binding the
  core's cotangent is for), answers a re-sent pending forward or applied step from memory,
  applies a cotangent only when its observation, pre-step digest *and forward digest* are the
  pending forward's, commits only the state the core expects, evaluates and checkpoints only the
  weights of exactly that commit; a crash loses everything but its newest commit and the
  checkpoints;
* a worker holds the one version it loaded last and refuses launches for any other; it can
  load only what the store holds;
* the store holds what was published and not released;
* with `reproducible_forwards=False`, a forward re-run after a learner restart returns other
  log-probs (a different digest): non-deterministic kernels.

Payloads are synthetic but deterministic functions of the commands' logical content, so a
completed run's `logical_projection` must equal the canonical one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from invar.model import schedule
from invar.model.config import RunConfig
from invar.model.core import outstanding_commands, run_complete
from invar.model.memo import IdentityMemo, cached_repr
from invar.model.messages import (
    ApplyCotangent,
    Checkpoint,
    CheckpointWritten,
    Command,
    Commit,
    Completion,
    Completions,
    Evaluate,
    Event,
    ForwardObserved,
    LaunchRequest,
    LearnerStarted,
    LoadWeights,
    ObservationId,
    ProbabilitiesReported,
    Publish,
    ReleaseVersion,
    RequestsCompleted,
    RetainVersion,
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
    matrix_digest,
    one_per_request,
)
from invar.model.ragged import Ragged
from invar.model.shell import LEARNER, STORE, TIMER, Delivery, Verdict, deliver, route
from invar.model.state import (
    LearnerPhase,
    State,
    WorkerPhase,
    completions_of,
    evolve,
)

CORE = "core"
RESPONSE_TOKENS = 2
"""Tokens of the longest synthetic response: enough to exercise per-token averaging, small to
hash."""


# ---------------------------------------------------------------------------------------------
# Synthetic numerics: deterministic functions of logical content.


def version_digest(version: int) -> str:
    """The synthetic learner's weights digest of committed version `version`."""
    return f"w{version}"


def step_digest(update: int, step: int, optimizer_steps: int) -> str:
    """Digest of the synthetic learner's state after `step` steps of `update`."""
    if step == 0:
        return version_digest(update)
    if step == optimizer_steps:
        return version_digest(update + 1)
    return f"w{update}.{step}"


def _logprob(*key: int) -> float:
    """A deterministic log-probability in [-2, -0.05] from a logical key; exactly 0.0 (a token
    the sampler was certain of, as greedy or top-k 1 sampling gives) for the last token of
    every sample 0, so the edge of the valid range is exercised."""
    if key[2] == 0 and key[-1] == RESPONSE_TOKENS - 1:
        return 0.0
    return -0.05 - (schedule.derive_seed(0, "lp", *key) % 1000) / 520.0


def response_tokens(request: schedule.RequestId) -> int:
    """The synthetic response's length: a response ends at its first EOS, so lengths differ
    within a batch. Even batches are of one length (frames a fixed-shape worker sends), odd
    ones ragged: every other response of an odd batch ends a token early."""
    r = request
    return RESPONSE_TOKENS - (r.batch % 2) * ((r.prompt + r.sample) % 2)


def sample_completion(command: LaunchRequest) -> Completion:
    """What a correct, numerically invariant worker samples for a launch."""
    r = command.request
    length = response_tokens(r)
    tokens = tuple((command.seed >> (4 * i)) % 10 for i in range(length))
    behavior = tuple(_logprob(*r, command.version, i) for i in range(length))
    reward = float(tokens[0] % 2 + r.sample % 2) / 2.0
    return Completion(r, command.version, tokens, behavior, reward)


def sample_reply(*commands: LaunchRequest) -> RequestsCompleted:
    """One reply frame answering `commands` (launches to one worker incarnation)."""
    first = commands[0]
    return RequestsCompleted(first.worker, first.incarnation,
                             Completions.of(sample_completion(c) for c in commands))


def scores_reply(command: ScoreProbabilities) -> ProbabilitiesReported:
    proximal = Ragged.of([[_logprob(*r, command.update, -1, i)
                           for i in range(response_tokens(r))] for r in command.requests])
    reference = (Ragged.of([[_logprob(*r, -2, i) for i in range(response_tokens(r))]
                            for r in command.requests]) if command.reference else None)
    return ProbabilitiesReported(command.update, command.attempt, proximal, reference)


def forward_reply(command: RunForward, optimizer_steps: int, noise: int = 0) -> ForwardObserved:
    """`noise` > 0 stands for a non-reproducible re-run (other kernels, other sums)."""
    obs = command.observation
    current = Ragged.of([[_logprob(*r, obs.update, obs.step, noise, i)
                           if noise else _logprob(*r, obs.update, obs.step, i)
                           for i in range(response_tokens(r))] for r in command.requests])
    return ForwardObserved(obs, command.attempt, step_digest(obs.update, obs.step, optimizer_steps),
                           current)


def evaluation_reward(version: int) -> float:
    return (schedule.derive_seed(0, "eval", version) % 1000) / 1000.0


# ---------------------------------------------------------------------------------------------
# The learner's rules: one definition, kept by this world's learner and the runtime's.


class Decision:
    RUN = "run"
    """Carry the command out."""
    REPEAT = "repeat"
    """Answer again with the reply already given (nothing is done twice)."""
    IGNORE = "ignore"
    """Not for this learner (another attempt) or superseded: no reply."""
    REFUSE = "refuse"
    """A binding or state mismatch: no reply, nothing changes (logged and counted)."""


@cached_repr
@dataclass(frozen=True)
class PendingForward:
    observation: ObservationId
    pre_step_digest: str
    forward_digest: str


@cached_repr
@dataclass(frozen=True)
class LearnerRules:
    """The protocol memory of a learner attempt (what a real backend keeps beside its tensors)."""

    attempt: int
    weights: str
    """Digest of the weights (and optimizer state) in memory."""
    version: int
    """The commit the weights started from, or the one written last."""
    stepped: bool = False
    """A step was applied since `version`'s weights: they are no longer exactly that commit."""
    pending: PendingForward | None = None
    applied: tuple[ObservationId, str] | None = None
    """The last applied step and the digest after it."""

    def newest_serial(self) -> int:
        serials = [p.observation.serial for p in (self.pending,) if p is not None]
        if self.applied is not None:
            serials.append(self.applied[0].serial)
        return max(serials, default=-1)

    def decide(self, command: Command) -> str:
        attempt = getattr(command, "attempt", self.attempt)
        if attempt != self.attempt:
            return Decision.IGNORE
        if isinstance(command, RunForward):
            pending = self.pending
            if pending is not None and command.observation == pending.observation:
                return Decision.REPEAT
            # An older forward re-sent or duplicated after a newer one must not replace the
            # binding the core's cotangent is for (the livelock of a later-replaces rule).
            if command.observation.serial <= self.newest_serial():
                return Decision.IGNORE
            return Decision.RUN
        if isinstance(command, ApplyCotangent):
            if self.applied is not None and command.observation == self.applied[0]:
                return Decision.REPEAT
            pending = self.pending
            if pending is None or (command.observation, command.pre_step_digest,
                                   command.forward_digest) != (
                    pending.observation, self.weights, pending.forward_digest):
                return Decision.REFUSE
            return Decision.RUN
        if isinstance(command, Commit):
            if self.version == command.update + 1 and not self.stepped:
                return Decision.REPEAT
            if self.weights != command.expected_digest:
                return Decision.REFUSE
            return Decision.RUN
        if isinstance(command, (Evaluate, Checkpoint)):
            # Exactly the weights of that commit, or nothing (a late re-send after moving on).
            exact = self.version == command.version and not self.stepped
            return Decision.RUN if exact else Decision.IGNORE
        return Decision.RUN

    def forwarded(self, command: RunForward, reply: ForwardObserved) -> LearnerRules:
        pending = PendingForward(command.observation, self.weights,
                                 matrix_digest(reply.current_logprobs))
        return evolve(self, pending=pending)

    def stepped_to(self, command: ApplyCotangent, digest: str) -> LearnerRules:
        return evolve(self, weights=digest, stepped=True, pending=None,
                      applied=(command.observation, digest))

    def committed(self, version: int, digest: str) -> LearnerRules:
        return evolve(self, weights=digest, version=version, stepped=False)


# ---------------------------------------------------------------------------------------------
# The world.


@dataclass(frozen=True, order=True)
class Message:
    """A command in flight to a component, or an event in flight to the core."""

    key: str
    """Canonical text: identifies equal messages (the network is a multiset)."""
    to: str = field(compare=False)
    body: Any = field(compare=False)


def message(to: str, body: Any) -> Message:
    return Message(f"{to}|{body!r}", to, body)


@cached_repr
@dataclass(frozen=True)
class Learner:
    alive: bool
    rules: LearnerRules
    commits: tuple[str, ...]
    """Durable: the digest of every commit written, by version (the disk)."""
    checkpoints: tuple[int, ...] = ()
    """Durable: versions kept as checkpoints."""


@cached_repr
@dataclass(frozen=True)
class Worker:
    name: str
    incarnation: int
    alive: bool
    version: int | None = None
    """The version loaded last (a worker holds one)."""
    load: int = 0
    """The serial of that load: an older LoadWeights (duplicated, delayed) is ignored."""


@dataclass(frozen=True)
class World:
    core: State
    journal: State
    """What the journal holds durably: the state a driver restart recovers."""
    network: tuple[Message, ...]
    learner: Learner
    workers: tuple[Worker, ...]
    store: tuple[int, ...]
    """Versions whose weights the store holds."""
    reproducible_forwards: bool = True
    launch_frames: bool = False
    """A worker answers the launches one decision gave it (in flight together) in one frame,
    as the runtime's workers do, instead of one frame per launch: a batch of B x G samples
    then arrives as one large frame (the core's column paths for large frames)."""
    timer: bool = False
    """The driver's retry timer: armed by SetTimer, disarmed when it fires (the core only asks;
    a core that never re-arms it is left without one)."""
    refused: str = ""
    """Set when the core refused a correct component's message (must never happen)."""
    broken: str = ""
    """Set when a component could not do what it was told (e.g. load a deleted version)."""

    @property
    def config(self) -> RunConfig:
        return self.core.config

    def worker(self, name: str) -> Worker:
        return next(w for w in self.workers if w.name == name)


def new_world(config: RunConfig, workers: tuple[str, ...] = ("w0",),
              reproducible_forwards: bool = True, launch_frames: bool = False) -> World:
    from invar.model.state import initial_state
    core = initial_state(config)
    network = tuple(message(CORE, e) for e in (
        LearnerStarted(0, 0, version_digest(0)), *(WorkerConnected(n, 0) for n in workers)))
    rules = LearnerRules(attempt=0, weights=version_digest(0), version=0)
    return World(core=core, journal=core, network=network,
                 learner=Learner(True, rules, commits=(version_digest(0),)),
                 workers=tuple(Worker(n, 0, True) for n in workers), store=(),
                 reproducible_forwards=reproducible_forwards, launch_frames=launch_frames)


# -- messages ---------------------------------------------------------------------------------


def _send(world: World, *messages: Message) -> World:
    return evolve(world, network=world.network + messages)


def _take(world: World, key: str) -> tuple[World, Message]:
    network, msg = _without(world.network, key)
    return evolve(world, network=network), msg


def _without(network: tuple[Message, ...], key: str) -> tuple[tuple[Message, ...], Message]:
    """`network` less one message `key`, and that message."""
    for i, m in enumerate(network):
        if m.key == key:
            return network[:i] + network[i + 1:], m
    raise KeyError(key)


def deliver_message(world: World, key: str, delivered: Delivered | None = None,
                    answers: Answers | None = None) -> World:
    """Deliver the in-flight message `key` to its destination (`delivered`: see `to_core`;
    `answers`: how the learner and the workers answer, see `Answers`)."""
    # Each destination builds the next world once, from the network without the message.
    rest, msg = _without(world.network, key)
    if msg.to == CORE:
        return _core_takes(world, rest, msg.body, delivered or _delivered)
    if msg.to == LEARNER:
        return _to_learner(world, rest, msg.body, answers or _answers)
    if msg.to == STORE:
        return _to_store(world, rest, msg.body, answers or _answers)
    return _to_worker(world, rest, msg.body, answers or _answers)


def drop(world: World, key: str) -> World:
    return _take(world, key)[0]


def duplicate(world: World, key: str) -> World:
    msg = next(m for m in world.network if m.key == key)
    return _send(world, msg)


OBSERVATIONS = (WorkerConnected, WorkerLost, LearnerStarted, TimerFired)
"""Connection-level events: the driver's own observations (a worker's connection or loss, the
learner's start, the timer's expiry), not messages on a wire. Never lost, they may be delayed
behind others and observed twice (`repeat_observation`): a transport that reports a
connection again, a loss seen by two tasks, a resume that re-reads what it already knew."""


def is_observation(msg: Message) -> bool:
    return msg.to == CORE and type(msg.body) in OBSERVATIONS


def repeat_observation(world: World, key: str) -> World:
    """The driver observes the connection-level event `key` in flight a second time."""
    msg = next(m for m in world.network if m.key == key)
    if not is_observation(msg):
        raise ValueError(f"not a connection-level event: {key!r}")
    return _send(world, msg)


def observed_too_early(world: World, msg: Message) -> bool:
    """A worker's loss is observed after its connection (one reader task sees both): a
    `WorkerLost` waits while that connection is in flight and not yet observed (a repeat of
    an observed connection may come after the loss)."""
    body = msg.body
    if type(body) is not WorkerLost or msg.to != CORE:
        return False
    known = world.core.worker(body.worker)
    if known is not None and known.incarnation == body.incarnation:
        return False
    connection = message(CORE, WorkerConnected(body.worker, body.incarnation)).key
    return any(m.key == connection for m in world.network)


def merge_replies(world: World, first: str, second: str) -> World:
    """Two reply frames of one worker incarnation travel as one (the worker answered both
    launches in one call). With replies sent one per launch, merging reaches every way a
    worker can group its answers into frames; `split_reply` undoes it."""
    world, a = _take(world, first)
    world, b = _take(world, second)
    if not mergeable(a, b):
        raise ValueError(f"not replies of one worker incarnation: {first!r}, {second!r}")
    return _send(world, _merged_message(a, b))


_merges = IdentityMemo(1 << 16)


def _merged_message(a: Message, b: Message) -> Message:
    """The message of `a` and `b` merged, made once for those very messages (a model checker
    merges the same two in many worlds): its frame is joined and its key printed once, and it
    is one object in every world, so the memos keyed by identity downstream keep hitting."""
    known: Message | None = _merges.lookup(a, b)
    if known is None:
        known = _merges.put(a, b, None, message(CORE, merged(a.body, b.body)))
    return known


def merged(a: RequestsCompleted, b: RequestsCompleted) -> RequestsCompleted:
    """One frame with `a`'s completions, then `b`'s (both of one worker incarnation)."""
    return evolve(a, completions=a.completions + b.completions)


def split_reply(world: World, key: str) -> World:
    """A reply frame of several completions arrives as two: its first completion, the rest."""
    world, msg = _take(world, key)
    head, tail = msg.body.completions[:1], msg.body.completions[1:]
    if not len(tail):
        raise ValueError(f"a reply of one completion cannot be split: {key!r}")
    return _send(world, message(CORE, evolve(msg.body, completions=head)),
                 message(CORE, evolve(msg.body, completions=tail)))


def mergeable(a: Message, b: Message) -> bool:
    return (a.to == b.to == CORE and isinstance(a.body, RequestsCompleted)
            and isinstance(b.body, RequestsCompleted) and a.body.worker == b.body.worker
            and a.body.incarnation == b.body.incarnation)


def fire_timer(world: World, delivered: Delivered | None = None) -> World:
    """The armed retry timer expires: it disarms itself and tells the core."""
    return to_core(evolve(world, timer=False), TimerFired(), delivered)


Routed = tuple[tuple[Command, str, Message], ...]
"""A delivery's commands, each with its route and the message that carries it."""
Delivered = Callable[[State, Event], tuple[Delivery, Routed]]
"""How the core answers an event: `routed_delivery`, or a memo of it. A model checker passes
its own (`checker.invar_model`), which also hands out one core object per core value."""


def to_core(world: World, event: Event, delivered: Delivered | None = None) -> World:
    """The driver applies an event: `shell.deliver`, the journal, then the commands' routes.
    `delivered` answers for the core (default: `routed_delivery` remembered per core object)."""
    return _core_takes(world, world.network, event, delivered or _delivered)


def _core_takes(world: World, network: tuple[Message, ...], event: Event,
                delivered: Delivered) -> World:
    """`to_core` on `world` with `network` in flight instead of its own (the message that
    brought `event` already taken off)."""
    delivery, routed = delivered(world.core, event)
    if delivery.verdict is Verdict.REFUSED:
        assert delivery.error is not None
        return evolve(world, network=network,
                      refused=f"{delivery.error.reason.value}: {delivery.error.detail}")
    journal = delivery.state if delivery.durable else world.journal
    if not routed:  # nothing to carry out (a reply that completes nothing, a repeat)
        return evolve(world, core=delivery.state, journal=journal, network=network)
    sent, timer, store = [], world.timer, world.store
    for command, where, msg in routed:
        if isinstance(command, (RetainVersion, ReleaseVersion)):
            store = _kept(store, command)  # the driver's own file system: done at once
        elif isinstance(command, LoadWeights) and command.version not in store:
            # The driver reads the weights from the store as it sends the load.
            return evolve(world, core=delivery.state, journal=journal, timer=timer,
                          network=network, store=store,
                          broken=f"{command.worker} told to load version "
                                 f"{command.version}, which the store no longer holds")
        elif where == TIMER:
            timer = True
        else:
            sent.append(msg)
    return evolve(world, core=delivery.state, journal=journal, timer=timer, store=store,
                  network=network + tuple(sent) if sent else network)


def routed_delivery(core: State, event: Event,
                    carried: Callable[[str, Command], Message] = message
                    ) -> tuple[Delivery, Routed]:
    """`shell.deliver(core, event)` with each command's route and message (`carried`: how a
    message is made, `message` or a memo of it: `Answers.carried`)."""
    delivery = deliver(core, event)
    # Each launch travels alone: the network may lose, repeat or reorder any one of them.
    return delivery, tuple((c, where, carried(where, c)) for c, where in
                           ((c, route(c)) for c in one_per_request(delivery.commands)))


_deliveries = IdentityMemo(1 << 16)


def _delivered(core: State, event: Event) -> tuple[Delivery, Routed]:
    """`routed_delivery`, remembered for the very `core` object and an equal event (see
    `invar.model.memo`: a model checker delivers the same event to the same core in many
    worlds that differ elsewhere)."""
    known: tuple[Delivery, Routed] | None = _deliveries.lookup(core, None, event)
    if known is None:
        known = _deliveries.put(core, None, event, routed_delivery(core, event))
    return known


# -- components -------------------------------------------------------------------------------


# Each takes `world` with `network` in flight (the command's message already taken off) and
# returns the next world.


def _to_learner(world: World, network: tuple[Message, ...], command: Command,
                answers: Answers) -> World:
    learner, reply = answers.learner(world.learner, command, (
        world.reproducible_forwards, world.core.config.optimizer_steps))
    return evolve(world, learner=learner,
                  network=network + (reply,) if reply is not None else network)


LearnerAnswer = tuple[Learner, Message | None]
WorkerAnswer = tuple[Worker, Message | None]


class Answers:
    """How the learner and the workers answer a command (`_learner_answer`, `_worker_answer`),
    remembered for the very component and command objects: the same command reaches the same
    component in many worlds (see `invar.model.memo`). The world's functions, called without
    one, use the module's own (`_answers`); a model checker passes its own, kept for one
    search (`AnswersByValue`)."""

    def __init__(self, kept: int = 1 << 16) -> None:
        self._learners = IdentityMemo(kept)
        self._workers = IdentityMemo(kept)

    def learner(self, learner: Learner, command: Command,
                value: tuple[bool, int]) -> LearnerAnswer:
        """What `learner` does with `command` in a world of `value` (reproducible forwards,
        optimizer steps): its next self and its reply (None: no reply)."""
        known: LearnerAnswer | None = self._learners.lookup(learner, command, value)
        if known is None:
            known = self._learners.put(learner, command, value,
                                       self._learner_answer(learner, command, value))
        return known

    def worker(self, worker: Worker, command: LoadWeights | LaunchRequest) -> WorkerAnswer:
        """What `worker` does with `command`: its next self and its reply (None: no reply)."""
        known: WorkerAnswer | None = self._workers.lookup(worker, command)
        if known is None:
            known = self._workers.put(worker, command, None,
                                      self._worker_answer(worker, command))
        return known

    def carried(self, where: str, command: Command) -> Message:
        """The message that carries `command` to `where` (see `routed_delivery`)."""
        return message(where, command)

    def published(self, version: int, digest: str) -> Message:
        """The store's reply to the publication of `version`, whose weights are `digest`."""
        return message(CORE, VersionPublished(version, digest))

    def crashed(self, learner: Learner) -> Learner:
        """`learner` after a crash (its memory lost; its disk is kept)."""
        return evolve(learner, alive=False)

    def restarted(self, learner: Learner) -> tuple[Learner, Message]:
        """`learner` restarted from its newest commit, and its announcement."""
        version = len(learner.commits) - 1
        digest = learner.commits[version]
        rules = LearnerRules(attempt=learner.rules.attempt + 1, weights=digest, version=version)
        return (evolve(learner, alive=True, rules=rules),
                message(CORE, LearnerStarted(rules.attempt, version, digest)))

    def _learner_answer(self, learner: Learner, command: Command,
                        value: tuple[bool, int]) -> LearnerAnswer:
        return _learner_answer(learner, command, *value)

    def _worker_answer(self, worker: Worker, command: LoadWeights | LaunchRequest
                       ) -> WorkerAnswer:
        return _worker_answer(worker, command)


Key = TypeVar("Key")
Answer = TypeVar("Answer")


class AnswersByValue(Answers):
    """`Answers` also remembered by value, for one search (a model checker makes one per
    search and passes it to `deliver_message`): equal components given equal commands answer
    alike, so an answer is computed once per distinct (component, command) value, and the
    component it hands back is one object for all of them (the memos keyed by identity
    downstream keep hitting). Exact: a component's answer is a function of its compared fields
    and the command's (the events and commands of `invar.model.messages` compare every
    field). Never module-wide: an answer computed before a test patches a component's rules
    (`LearnerRules.decide`) must not outlive the search it was computed for."""

    def __init__(self, kept: int = 1 << 16) -> None:
        super().__init__(kept)
        self._kept = kept
        self._learner_values: dict[tuple[Learner, Command, tuple[bool, int]], LearnerAnswer] = {}
        self._worker_values: dict[tuple[Worker, Command], WorkerAnswer] = {}
        self._published: dict[tuple[int, str], Message] = {}
        self._carried: dict[tuple[str, Command], Message] = {}
        self._crashed: dict[Learner, Learner] = {}
        self._restarted: dict[Learner, tuple[Learner, Message]] = {}

    def _remember(self, table: dict[Key, Answer], key: Key, answer: Answer) -> Answer:
        """`answer` kept in `table` under `key` (the table forgotten wholesale when full)."""
        if len(table) >= self._kept:
            table.clear()
        table[key] = answer
        return answer

    def carried(self, where: str, command: Command) -> Message:
        """One message per command value: its key (a repr) made once, and its body one object
        in every world that holds it (the memos keyed by identity downstream keep hitting).
        Exact: the core builds a command's fields from ints, strings, bools and tuples of
        them, so equal commands have equal reprs; an ApplyCotangent, whose terms are floats
        (0.0 and -0.0 are equal, their reprs are not), gets a message of its own."""
        if type(command) is ApplyCotangent:
            return message(where, command)
        known = self._carried.get((where, command))
        if known is None:
            known = self._remember(self._carried, (where, command), message(where, command))
        return known

    def published(self, version: int, digest: str) -> Message:
        known = self._published.get((version, digest))
        if known is None:
            known = self._remember(self._published, (version, digest),
                                   super().published(version, digest))
        return known

    def crashed(self, learner: Learner) -> Learner:
        known = self._crashed.get(learner)
        if known is None:
            known = self._remember(self._crashed, learner, super().crashed(learner))
        return known

    def restarted(self, learner: Learner) -> tuple[Learner, Message]:
        known = self._restarted.get(learner)
        if known is None:
            known = self._remember(self._restarted, learner, super().restarted(learner))
        return known

    def _learner_answer(self, learner: Learner, command: Command,
                        value: tuple[bool, int]) -> LearnerAnswer:
        known = self._learner_values.get((learner, command, value))
        if known is None:
            known = self._remember(self._learner_values, (learner, command, value),
                                   _learner_answer(learner, command, *value))
        return known

    def _worker_answer(self, worker: Worker, command: LoadWeights | LaunchRequest
                       ) -> WorkerAnswer:
        known = self._worker_values.get((worker, command))
        if known is None:
            known = self._remember(self._worker_values, (worker, command),
                                   _worker_answer(worker, command))
        return known


_answers = Answers()


def _learner_answer(learner: Learner, command: Command, reproducible_forwards: bool,
                    k: int) -> tuple[Learner, Message | None]:
    """What `learner` does with `command`: its next self and its reply (None: no reply)."""
    if not learner.alive:
        return learner, None
    if isinstance(command, Checkpoint) and command.version in learner.checkpoints:
        # The file is there (written atomically, so whole): answer again.
        return learner, message(CORE, CheckpointWritten(command.version,
                                                        learner.commits[command.version]))
    rules = learner.rules
    decision = rules.decide(command)
    if decision in (Decision.IGNORE, Decision.REFUSE):
        return learner, None
    reply: Event | None = None
    if isinstance(command, ScoreProbabilities):
        reply = scores_reply(command)
    elif isinstance(command, RunForward):
        # Non-reproducible kernels: each attempt's forwards give other log-probs. (Within an
        # attempt a forward is never re-run: a re-sent one is answered from memory.)
        noise = 0 if reproducible_forwards else rules.attempt + 1
        reply = forward_reply(command, k, noise)
        if decision is Decision.RUN:
            learner = evolve(learner, rules=rules.forwarded(command, reply))
    elif isinstance(command, ApplyCotangent):
        obs = command.observation
        digest = step_digest(obs.update, obs.step + 1, k)
        if decision is Decision.RUN:
            learner = evolve(learner, rules=rules.stepped_to(command, digest))
        reply = StepFinished(obs, command.attempt, digest)
    elif isinstance(command, Commit):
        version = command.update + 1
        if decision is Decision.RUN:
            commits = learner.commits[:version] + (command.expected_digest,)
            learner = evolve(learner, commits=commits,
                             rules=rules.committed(version, command.expected_digest))
        reply = UpdateCommitted(command.update, learner.commits[version])
    elif isinstance(command, Evaluate):
        reply = VersionEvaluated(command.version, evaluation_reward(command.version))
    elif isinstance(command, Checkpoint):
        learner = evolve(learner, checkpoints=learner.checkpoints + (command.version,))
        reply = CheckpointWritten(command.version, learner.commits[command.version])
    return learner, (message(CORE, reply) if reply is not None else None)


def _to_store(world: World, network: tuple[Message, ...], command: Command,
              answers: Answers) -> World:
    if isinstance(command, Publish):
        if command.version >= len(world.learner.commits):
            return evolve(world, network=network,
                          broken=f"publish of version {command.version}: no commit")
        store = tuple(sorted({*world.store, command.version}))
        reply = answers.published(command.version, world.learner.commits[command.version])
        return evolve(world, store=store, network=network + (reply,))
    return evolve(world, store=_kept(world.store, command), network=network)


def _kept(store: tuple[int, ...], command: Command) -> tuple[int, ...]:
    """What the store holds after `command` (RetainVersion or ReleaseVersion): a release
    deletes the version; the store keeps what was published until released (a retain changes
    nothing)."""
    if isinstance(command, ReleaseVersion):
        return tuple(v for v in store if v != command.version)
    return store


def _to_worker(world: World, network: tuple[Message, ...],
               command: LoadWeights | LaunchRequest, answers: Answers) -> World:
    worker = world.worker(command.worker)
    if world.launch_frames and type(command) is LaunchRequest:
        return _launch_frame(world, network, command, answers)
    after, reply = answers.worker(worker, command)
    workers = world.workers if after is worker else _with_worker(world.workers, after)
    return evolve(world, workers=workers,
                  network=network + (reply,) if reply is not None else network)


def _launch_frame(world: World, network: tuple[Message, ...], command: LaunchRequest,
                  answers: Answers) -> World:
    """`command` and the launches in flight beside it from the same decision (to its worker
    incarnation, for its version) taken together: their replies travel as one frame."""
    together = [m for m in network if m.to == command.worker and type(m.body) is LaunchRequest
                and (m.body.incarnation, m.body.version) == (command.incarnation,
                                                             command.version)]
    taken = set(map(id, together))
    worker = world.worker(command.worker)
    replies = [reply for reply in (answers.worker(worker, launch)[1]
                                   for launch in (command, *(m.body for m in together)))
               if reply is not None]
    network = tuple(m for m in network if id(m) not in taken)
    if replies:
        frame = functools.reduce(merged, (reply.body for reply in replies))
        network += (message(CORE, frame),)
    return evolve(world, network=network)


def _worker_answer(worker: Worker, command: LoadWeights | LaunchRequest
                   ) -> tuple[Worker, Message | None]:
    """What `worker` does with `command`: its next self and its reply (None: no reply)."""
    if not worker.alive or worker.incarnation != command.incarnation:
        return worker, None  # a retired incarnation's mail is lost with its connection
    if isinstance(command, LoadWeights):
        if not worker_accepts(worker, command):
            return worker, None
        # The weights travel with the command (read from the store when it was sent).
        loaded = evolve(worker, version=command.version, load=command.load)
        return loaded, message(CORE, WeightsLoaded(command.worker, command.incarnation,
                                                   command.load, command.version))
    if not worker_accepts(worker, command):
        return worker, None  # refused: a launch for a version it does not hold
    return worker, message(CORE, sample_reply(command))


def worker_accepts(worker: Worker, command: LoadWeights | LaunchRequest) -> bool:
    """A worker's rules (the runtime's worker keeps the same): loads only in serial order (a
    re-sent current load is answered again), launches only for the version it holds."""
    if isinstance(command, LoadWeights):
        return command.load >= worker.load
    return command.version == worker.version


def _put_worker(world: World, worker: Worker) -> World:
    return evolve(world, workers=_with_worker(world.workers, worker))


def _with_worker(workers: tuple[Worker, ...], worker: Worker) -> tuple[Worker, ...]:
    return tuple(worker if w.name == worker.name else w for w in workers)


# -- faults -----------------------------------------------------------------------------------


def crash_worker(world: World, name: str) -> World:
    """The worker process dies; the driver notices its connection end. Commands in flight to
    it die with the connection (its replies already sent may still be read)."""
    worker = world.worker(name)
    world = _put_worker(world, evolve(worker, alive=False, version=None))
    world = evolve(world, network=tuple(m for m in world.network if m.to != name))
    return _send(world, message(CORE, WorkerLost(name, worker.incarnation)))


def restart_worker(world: World, name: str) -> World:
    worker = world.worker(name)
    fresh = Worker(name, worker.incarnation + 1, True)
    return _send(_put_worker(world, fresh), message(CORE, WorkerConnected(name, fresh.incarnation)))


def crash_learner(world: World, answers: Answers | None = None) -> World:
    """Silent: everything in memory is lost; the commits and checkpoints on disk stay.
    Commands in flight for this attempt die with it (its successor would ignore them)."""
    attempt = world.learner.rules.attempt
    network = tuple(m for m in world.network
                    if not (m.to == LEARNER and getattr(m.body, "attempt", None) == attempt))
    return evolve(world, learner=(answers or _answers).crashed(world.learner), network=network)


def restart_learner(world: World, answers: Answers | None = None) -> World:
    """The learner restores its newest commit and announces itself with a new attempt."""
    learner, hello = (answers or _answers).restarted(world.learner)
    return evolve(world, learner=learner, network=world.network + (hello,))


def restart_driver(world: World, answers: Answers | None = None) -> World:
    """The driver dies and resumes from its journal's durable part. Everything in flight dies
    with it (replies to it, its learner's queue, its worker connections, its publication
    tasks); its in-process learner restarts from its newest commit; every worker connection is
    new (a new incarnation); the resume fires the timer to re-send what is outstanding."""
    world = evolve(world, core=world.journal, network=(), timer=False,
                   learner=(answers or _answers).crashed(world.learner))
    world = restart_learner(world, answers)
    workers = tuple(Worker(w.name, w.incarnation + 1, True) for w in world.workers)
    hello = tuple(message(CORE, WorkerConnected(w.name, w.incarnation)) for w in workers)
    return _send(evolve(world, workers=workers), *hello, message(CORE, TimerFired()))


# -- the adversary ----------------------------------------------------------------------------

INTRUDER = "intruder"
"""A worker name that never connected."""


LARGE_FRAME = 16
"""Completions in a forged frame that the core judges by its columns (`fast.COLUMNS_FROM`)."""

_FORGED_ROW = Ragged.of(((-0.5,),))
"""One log-prob row, well formed: made once (a matrix is a value, shared by every forgery)."""


def forgeries(state: State) -> tuple[Event, ...]:
    """Events that no correct component could send in `state`: the core must refuse each (a
    ProtocolError), neither accept it nor pass it off as a duplicate or late reply. Forged from
    the state, each wrong in one respect only (payloads well formed where the check under
    probe comes after them): a stranger's messages, a future incarnation or attempt, a load or
    forward never requested, a wrong version, a negative token id, a digest that is not the
    real one, a malformed score matrix, a commit or boundary acknowledgement out of turn."""
    config = state.config
    row = _FORGED_ROW
    out: list[Event] = [WorkerLost(INTRUDER, 0), WeightsLoaded(INTRUDER, 0, 1, 0)]
    for worker in state.workers:
        out.append(WorkerLost(worker.name, worker.incarnation + 1))
        if worker.phase is not WorkerPhase.LOST:
            out.append(WeightsLoaded(worker.name, worker.incarnation, worker.load + 1,
                                     worker.version or 0))
            out.append(WeightsLoaded(worker.name, worker.incarnation + 1, worker.load,
                                     worker.version or 0))
        if worker.phase is WorkerPhase.LOADING and worker.version is not None:
            out.append(WeightsLoaded(worker.name, worker.incarnation, worker.load,
                                     worker.version + 1))
    sender = state.workers[0] if state.workers else None
    for batch in (*state.batches, None):
        index = batch.batch if batch is not None else state.admitted
        if index >= config.total_updates:
            continue
        request = schedule.request_ids(config, index)[0]
        version = schedule.gen_version(config, index)
        forged = Completion(request, version, (1,), (-0.5,), 0.0)
        out.append(RequestsCompleted(INTRUDER, 0, _forged_frame(forged)))
        if sender is not None and batch is not None:
            # A sample and a prompt just outside the batch, either side: never launched.
            for outside in (request._replace(sample=config.group_size),
                            request._replace(prompt=config.prompts_per_batch),
                            request._replace(sample=-1), request._replace(prompt=-1)):
                out.append(RequestsCompleted(sender.name, sender.incarnation,
                                             _forged_frame(evolve(forged, request=outside))))
            # A frame is judged whole: a good completion does not carry a bad one in.
            out.append(RequestsCompleted(sender.name, sender.incarnation, _forged_frame(
                forged, evolve(forged, request=request._replace(sample=config.group_size)))))
            # A negative token id; then it, a request never launched and a wrong version in a
            # frame the core judges by its columns.
            negative = evolve(forged, tokens=(-1,))
            out.append(RequestsCompleted(sender.name, sender.incarnation,
                                         _forged_frame(negative)))
            for bad in (negative, evolve(forged, request=request._replace(
                    sample=config.group_size)), evolve(forged, version=version + 1)):
                out.append(RequestsCompleted(sender.name, sender.incarnation,
                                             _forged_frame(*(bad,) * LARGE_FRAME)))
        if sender is not None:
            wrong = version + 1 if batch is not None else version  # unadmitted: any version
            out.append(RequestsCompleted(sender.name, sender.incarnation,
                                         _forged_frame(evolve(forged, version=wrong))))
    if sender is not None:
        out.append(RequestsCompleted(sender.name, sender.incarnation, _forged_frame()))
        # A batch before the first: no request was ever launched there.
        before_first = Completion(schedule.RequestId(-1, 0, 0), 0, (1,), (-0.5,), 0.0)
        out.append(RequestsCompleted(sender.name, sender.incarnation,
                                     _forged_frame(before_first)))
    learner = state.learner
    newest = state.committed
    if state.commit_digests:
        out += [LearnerStarted(learner.attempt + 1, newest, "forged"),
                UpdateCommitted(newest, "forged"), CheckpointWritten(newest, "forged"),
                VersionEvaluated(newest + 1, 0.0), VersionPublished(newest + 1, "forged")]
        if newest > 0:
            out.append(UpdateCommitted(newest - 1, "forged"))
        if learner.phase is not LearnerPhase.COMMITTING:
            out += [UpdateCommitted(newest, learner.step_digest),
                    LearnerStarted(learner.attempt + 1, newest + 1, learner.step_digest)]
        else:
            out.append(UpdateCommitted(newest + 1, learner.step_digest))
        if not schedule.is_eval_boundary(config, newest):
            out.append(VersionEvaluated(newest, 0.0))
        if not schedule.is_checkpoint_boundary(config, newest):
            out.append(CheckpointWritten(newest, state.commit_digests[newest]))
    if learner.attempt >= 0:
        never = ObservationId(newest, 0, learner.observations)
        out += [ProbabilitiesReported(newest + 1, learner.attempt, row, None),
                ForwardObserved(never, learner.attempt, learner.step_digest, row),
                StepFinished(never, learner.attempt, "forged")]
        if learner.observations > 0:
            # A serial that was issued, bound to an update not begun (ahead of the learner).
            ahead = ObservationId(newest + 1, 0, 0)
            out += [ForwardObserved(ahead, learner.attempt, learner.step_digest, row),
                    StepFinished(ahead, learner.attempt, "forged")]
        batch = state.batch(newest)
        if learner.phase is LearnerPhase.SCORING and batch is not None:
            every = tuple((-0.5,) * n for n in completions_of(batch.slots).tokens.lengths)
            rows = Ragged.of(every)
            reference = rows if config.objective.needs_reference else None
            out.append(ProbabilitiesReported(newest, learner.attempt + 1, rows, reference))
            # The current attempt's scores, malformed in one matrix only: a positive "log-prob"
            # in either; a reference missing where the KL term needs one, or sent where not.
            positive = Ragged.of(((0.5,) * len(every[0]),) + every[1:])
            out.append(ProbabilitiesReported(newest, learner.attempt, positive, reference))
            if reference is not None:
                out += [ProbabilitiesReported(newest, learner.attempt, rows, positive),
                        ProbabilitiesReported(newest, learner.attempt, rows, None)]
            else:
                out.append(ProbabilitiesReported(newest, learner.attempt, rows, rows))
        pending = learner.observation
        if learner.phase is LearnerPhase.FORWARD and pending is not None and batch is not None:
            lengths = completions_of(batch.slots).tokens.lengths
            rows = Ragged.of([(-0.5,) * lengths[i] for i in learner.positions])
            out += [ForwardObserved(pending, learner.attempt, "forged", rows),
                    ForwardObserved(pending, learner.attempt + 1, learner.step_digest, rows)]
        if learner.phase is LearnerPhase.APPLYING and pending is not None:
            out.append(StepFinished(pending, learner.attempt + 1, "forged"))
    return tuple(out)


@functools.lru_cache(maxsize=1024)
def _forged_frame(*completions: Completion) -> Completions:
    """The frame of these forged completions: the same few in many states, made once each."""
    return Completions.of(completions)


def unrefused_forgery(state: State) -> str:
    """The first forgery `state` does not refuse (empty when the core refuses every one)."""
    for event in forgeries(state):
        try:
            verdict = deliver(state, event).verdict
        except Exception as error:  # a crash on bad input is a refusal the core failed to make
            return f"{event!r} raised {type(error).__name__}: {error}"
        if verdict is not Verdict.REFUSED:
            return f"{event!r} was {verdict.value}"
    return ""


# -- observations -----------------------------------------------------------------------------


def complete(world: World) -> bool:
    return run_complete(world.core)


def run_fifo(world: World, max_deliveries: int = 1_000_000) -> World:
    """Deliver the first message in flight until none is left (firing the timer when the run
    is stuck with something outstanding): the canonical schedule when nothing fails."""
    for _ in range(max_deliveries):
        if world.refused or world.broken:
            return world
        if world.network:
            world = deliver_message(world, world.network[0].key)
        elif world.timer and outstanding_commands(world.core):
            world = fire_timer(world)
        else:
            return world
    raise RuntimeError(f"no quiescence after {max_deliveries} deliveries")
