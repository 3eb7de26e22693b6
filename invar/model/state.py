"""The core's state: an immutable, hashable value; equal logical histories give equal states.

Numeric payloads (tokens, log-probabilities, rewards, cotangents) are kept out of equality and
hashing and stand behind content digests, so the model checker can hash and compare states
cheaply; everything that decides the protocol's future is compared.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import itertools
import operator
import struct
import sys
import typing
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import numpy as np

from invar.model.completions import Completions
from invar.model.config import RunConfig
from invar.model.memo import IdentityMemo, cached_repr
from invar.model.messages import ApplyCotangent, Matrix, ObservationId
from invar.model.objective import ObjectiveInputs
from invar.model.schedule import RequestId

Record = TypeVar("Record")
RecordType = TypeVar("RecordType", bound=type)
Phase = TypeVar("Phase", bound=enum.Enum)


def evolve(obj: Record, **changes: Any) -> Record:
    """A copy of a frozen record with `changes`: `dataclasses.replace` without re-running
    `__init__` (the hottest call of the model checker). Drops the cached repr and hash."""
    new = object.__new__(type(obj))
    fields = new.__dict__
    fields.update(obj.__dict__)
    fields.pop("_repr", None)
    fields.pop("_hash", None)
    fields.update(changes)
    return new


Item = TypeVar("Item")


class History(tuple[Item, ...]):
    """An append-only record of the run (commit digests, publications, evaluations,
    checkpoints): a tuple that also carries a hash chain over its items, extended as it grows.

    It grows by one item per update, so a state's repr shows it as its length and chain
    (`history_text`): a state digest costs the same at update 10 and at update 10,000. It
    compares and hashes exactly as the tuple of its items does."""

    chain: str
    """`""` when empty, then `chain_item(chain, item)` per item appended."""

    def __new__(cls, items: Iterable[Item] = (), chain: str | None = None) -> History[Item]:
        self = super().__new__(cls, items)
        self.chain = chain if chain is not None else _chained("", self)
        return self

    def __add__(self, more: tuple[Item, ...]) -> History[Item]:  # type: ignore[override]
        return History(tuple.__add__(self, more), _chained(self.chain, more))

    def __getnewargs__(self) -> tuple[tuple[Item, ...], str]:
        return tuple(self), self.chain

    def __repr__(self) -> str:
        return f"History({tuple.__repr__(self)})"


def chain_item(chain: str, item: object) -> str:
    """A history's chain after `item`: blake2b_128(chain ‖ "|" ‖ repr(item)), in hex."""
    return hashlib.blake2b(f"{chain}|{item!r}".encode(), digest_size=16).hexdigest()


def _chained(chain: str, items: Iterable[object]) -> str:
    for item in items:
        chain = chain_item(chain, item)
    return chain


def history_text(items: tuple[str, ...] | tuple[int, ...]) -> str:
    """How a state's repr shows a history: its length and chain (a plain tuple's chain is
    computed from its items: equal contents, one text). A `History` keeps its text: every
    state that holds it shows the same."""
    if isinstance(items, History):
        text: str | None = items.__dict__.get("_text")
        if text is None:
            text = items.__dict__["_text"] = f"<{len(items)} items, chain {items.chain or '-'}>"
        return text
    return f"<{len(items)} items, chain {_chained('', items) or '-'}>"


_HISTORIES = ("commit_digests", "published", "evaluated", "checkpointed")


def _histories_shortened(cls: RecordType) -> RecordType:
    """`State`'s repr: the dataclass repr of its shown fields, then each history as
    `history_text` (their fields are `repr=False`). Made as the dataclass makes its own, one
    f-string over the fields (a state is digested after every event, through its repr)."""
    shown = [f"{f.name}={{self.{f.name}!r}}" for f in dataclasses.fields(cls) if f.repr]
    shown += [f"{name}={{history_text(self.{name})}}" for name in _HISTORIES]
    source = f'def __repr__(self):\n    return f"{cls.__qualname__}({", ".join(shown)})"\n'
    namespace: dict[str, Any] = {"history_text": history_text}
    exec(source, namespace)  # noqa: S102 -- code made from the class's own field names
    cls.__repr__ = namespace["__repr__"]  # type: ignore[method-assign]
    return cls


def _member_reprs_kept(cls: type[Phase]) -> type[Phase]:
    """An enum whose members' reprs are computed once (`Enum.__repr__` is Python code that
    formats them anew on every call; a state's repr shows a phase after every event)."""
    for member in cls:
        member.__dict__["_text"] = enum.Enum.__repr__(member)

    def __repr__(self: enum.Enum) -> str:
        text: str = self.__dict__["_text"]
        return text

    cls.__repr__ = __repr__  # type: ignore[assignment,method-assign]
    return cls


@_member_reprs_kept
class LearnerPhase(enum.Enum):
    OFFLINE = "offline"
    """Never started: waiting for LearnerStarted."""
    WAITING = "waiting"
    """Idle: waiting for the batch of the next update to be complete."""
    SCORING = "scoring"
    """Proximal (and reference) log-probs requested."""
    FORWARD = "forward"
    """Forward of the current step requested."""
    APPLYING = "applying"
    """Cotangent of the current step sent."""
    COMMITTING = "committing"
    """All K steps finished; commit requested."""
    FINISHED = "finished"
    """All updates committed."""


@_member_reprs_kept
class WorkerPhase(enum.Enum):
    IDLE = "idle"
    """Connected, nothing loaded."""
    LOADING = "loading"
    """Loading `version`; no requests until loaded."""
    READY = "ready"
    """Samples from `version`."""
    LOST = "lost"
    """This incarnation is gone; kept so its late replies are recognised."""


@cached_repr
@dataclass(frozen=True)
class WorkerState:
    name: str
    incarnation: int
    phase: WorkerPhase
    version: int | None
    """Loaded (READY) or being loaded (LOADING) version."""
    load: int
    """Serial of the last LoadWeights sent to this incarnation."""
    assigned: int
    """Requests currently assigned to this incarnation."""


@cached_repr
@dataclass(frozen=True)
class Assigned:
    """A request launched on a worker incarnation, not yet completed."""

    worker: str
    incarnation: int


class _SampleFields(NamedTuple):
    digest: str
    version: int
    frame: Completions
    row: int


@dataclass(frozen=True, init=False)
class Sample(_SampleFields):  # type: ignore[misc]  # a NamedTuple under a dataclass
    """A completed request: row `row` of the reply frame it came in (the frame's arrays, shared
    by its samples, not copied out). Only the digest of its content takes part in equality and
    hashing, as the dataclass says (the model checker reads it so, and hashes a state by
    value); with no memo of its repr or hash (both are of one short string).

    A named tuple underneath: a reply makes hundreds at once, each made from its fields in one
    C-level call (`fast.samples_of`), with no dict, its fields read as fast as slots."""

    __slots__ = ()
    digest: str
    version: int = field(compare=False, repr=False)
    """The version the worker reported sampling with (recorded in the ledger)."""
    frame: Completions = field(compare=False, repr=False)
    row: int = field(compare=False, repr=False)

    def __ne__(self, other: object) -> bool:
        # The tuple's own would compare every field: the dataclass's equality, negated.
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.frame.tokens[self.row]

    @property
    def behavior_logprobs(self) -> tuple[float, ...]:
        return self.frame.behavior_logprobs[self.row]

    @property
    def reward(self) -> float:
        return float(self.frame.rewards[self.row])


def sample_of(frame: Completions, row: int, digest: str, version: int) -> Sample:
    """`Sample(digest, version, frame, row)` without the named tuple's Python-level `__new__`
    (a small frame's completions, one at a time)."""
    return _TUPLE_NEW(Sample, (digest, version, frame, row))


_TUPLE_NEW = tuple.__new__


Slot = None | Assigned | Sample
"""A request's progress: None = pending (not launched on a live worker)."""


def completions_of(slots: tuple[Slot, ...]) -> Completions:
    """The completions of a batch whose every slot is a `Sample`, in slot order, as one frame's
    columns: the frame itself when the slots are its rows in order, else their rows gathered
    (once per slots tuple: scoring, each step and the commit of an update read the same)."""
    gathered: Completions = _GATHERED.of(slots, _gathered)
    return gathered


_GATHERED = IdentityMemo(8)


def _gathered(slots: tuple[Slot, ...]) -> Completions:
    if set(map(type, slots)) != {Sample}:
        position = next(p for p, slot in enumerate(slots) if type(slot) is not Sample)
        raise ValueError(f"slots[{position}]: not a sample ({slots[position]!r})")
    return Completions.gathered(list(map(_FRAME, slots)), list(map(_ROW, slots)))


_FRAME, _ROW = operator.attrgetter("frame"), operator.attrgetter("row")


@cached_repr
@dataclass(frozen=True)
class BatchState:
    """An admitted, not yet consumed rollout batch; slots in request-id order.

    `pending`, `completed` and `slots_digest` summarise `slots` (kept in step by `with_slots`)
    so that neither the core nor a journal's state digest walks every slot on every event.
    """

    batch: int
    slots: tuple[Slot, ...] = field(repr=False)
    pending: int
    completed: int
    slots_digest: int
    """XOR over positions of a 128-bit hash of (position, slot): updated per slot in O(1)."""

    @classmethod
    def admitted(cls, batch: int, size: int) -> BatchState:
        return cls(batch, (None,) * size, pending=size, completed=0,
                   slots_digest=_all_pending_digest(size))

    def with_slots(self, changes: Mapping[int, Slot]) -> BatchState:
        slots = list(self.slots)
        pending, completed, digest = self.pending, self.completed, self.slots_digest
        # The counters and the digest follow each change: the old slot's hash out, the new
        # one's in (written out per kind of slot: the hottest loop of the core).
        for position, new in changes.items():
            old = slots[position]
            slots[position] = new
            if old is None:
                pending -= 1
                digest ^= _pending_hash(position)
            elif isinstance(old, Sample):
                completed -= 1
                digest ^= _sample_hash(position, old.digest)
            else:
                digest ^= _assigned_hash(position, old.worker, old.incarnation)
            if new is None:
                pending += 1
                digest ^= _pending_hash(position)
            elif isinstance(new, Sample):
                completed += 1
                digest ^= _sample_hash(position, new.digest)
            else:
                digest ^= _assigned_hash(position, new.worker, new.incarnation)
        return BatchState(self.batch, tuple(slots), pending, completed, digest)


# The slot hashes: a stable 128-bit hash of (position, slot) from what takes part in the slot's
# equality (a sample's digest, an assignee); the batch digest XORs them, so a change costs two.


_MIX = 0x9E3779B97F4A7C15F39CC0605CEDC835  # odd: multiplying by it is a bijection mod 2**128


def _sample_hash(position: int, digest: str) -> int:
    """A sample's term, from its digest (already a blake2b hash of its content) with no second
    hash: the multiplication keeps the XOR of terms from cancelling when two positions swap
    their samples."""
    return ((int(digest, 16) << 32) ^ _pending_hash(position)) * _MIX & _MASK_128


_MASK_128 = (1 << 128) - 1


def _text_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=16).digest(), "big")


@functools.lru_cache(maxsize=64)
def _all_pending_digest(size: int) -> int:
    digest = 0
    for position in range(size):
        digest ^= _pending_hash(position)
    return digest


@functools.lru_cache(maxsize=1 << 16)
def _pending_hash(position: int) -> int:
    return _text_hash(f"{position}:-")


@functools.lru_cache(maxsize=1 << 16)
def _assigned_hash(position: int, worker: str, incarnation: int) -> int:
    return _text_hash(f"{position}:A:{worker}#{incarnation}")


def _slot_hash(position: int, slot: Slot) -> int:
    if slot is None:
        return _pending_hash(position)
    if isinstance(slot, Sample):
        return _sample_hash(position, slot.digest)
    return _assigned_hash(position, slot.worker, slot.incarnation)


@cached_repr
@dataclass(frozen=True)
class Scores:
    """Proximal and reference log-probs of the batch under update, behind their digest; an
    update that does not score its batch (`RunConfig.scores_batch`) has neither, digest ""."""

    digest: str
    proximal: Matrix | None = field(compare=False, repr=False)
    reference: Matrix | None = field(compare=False, repr=False)
    inputs: BatchInputs = field(compare=False, repr=False)
    """The objective inputs of each step, built once per update."""


class BatchInputs(NamedTuple):
    """The objective inputs of each optimizer step of an update, built once when the batch is
    scored (from its rewards and log-probs, final by then): a forward's log-probs are all the
    step still needs."""

    steps: tuple[ObjectiveInputs, ...]
    """Optimizer step k's minibatch: the rows of `minibatch_plan(update)[k]`, in that order."""
    lengths: tuple[tuple[int, ...], ...]
    """Each step's rows' token counts, which its forward's log-probs must have."""


class Positions(tuple[int, ...]):
    """The batch positions of one optimizer step (a chunk of `schedule.minibatch_plan`), as
    a tuple that renders its repr once: a state digest shows the pending forward's positions
    and every applied step's (128 ints each by default) on each learner event. Equal to, and
    hashed as, the tuple of its items; the text is that tuple's."""

    def __repr__(self) -> str:
        text: str | None = self.__dict__.get("_text")
        if text is None:
            text = self.__dict__["_text"] = tuple.__repr__(self)
        return text

    def __reduce__(self) -> tuple[type[Positions], tuple[tuple[int, ...]]]:
        return Positions, (tuple(self),)  # the items: the text is a cache


@cached_repr
@dataclass(frozen=True)
class AppliedStep:
    """One optimizer step as it happened: the minibatch positions the forward was asked for,
    the digest of the log-probs it returned, and the learner's digest after the step."""

    step: int
    positions: tuple[int, ...]
    forward_digest: str
    post_step_digest: str


@cached_repr
@dataclass(frozen=True)
class LearnerState:
    attempt: int
    """The learner's incarnation; -1 before its first start."""
    phase: LearnerPhase
    step: int
    """Current optimizer step of the update in progress (0..K-1)."""
    observation: ObservationId | None
    """The forward requested (FORWARD) or whose cotangent was sent (APPLYING)."""
    step_digest: str
    """Digest of the learner state the current step starts from (after K steps: to commit)."""
    scores: Scores | None
    observations: int
    """Forwards ever requested: the next observation serial, unique across attempts."""
    forward_digest: str = ""
    """Digest of the current log-probs observed in APPLYING: what the cotangent derives from."""
    positions: tuple[int, ...] = ()
    """Batch positions of the pending forward (FORWARD, APPLYING), as requested."""
    applied: tuple[AppliedStep, ...] = ()
    """The steps of the update in progress applied so far (this attempt): the ledger's record."""
    cotangent: ApplyCotangent | None = field(default=None, compare=False, repr=False)
    """The command sent in APPLYING (kept to re-send on retry; determined by the rest)."""


class _Packed(Sequence[Item]):
    """A sequence a ledger record keeps packed: its items are made again when read."""

    def _items(self) -> tuple[Item, ...]:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._items())

    @typing.overload
    def __getitem__(self, index: int) -> Item: ...
    @typing.overload
    def __getitem__(self, index: slice) -> tuple[Item, ...]: ...
    def __getitem__(self, index: int | slice) -> Item | tuple[Item, ...]:
        return self._items()[index]

    def __iter__(self) -> Iterator[Item]:
        return iter(self._items())


@dataclass(frozen=True)
class BatchRequests(_Packed[RequestId]):
    """`schedule.request_ids` of a whole batch, kept as (batch, prompts, group) instead of one
    `RequestId` per sample: the ledger keeps a record per update for the whole run (as tuples,
    97 KiB an update of the default shape, and every full garbage collection walked its
    half-million request ids at 1,000 updates). A value: equal to another `BatchRequests` of the
    same batch and shape (compare `tuple(...)` with a tuple)."""

    batch: int
    prompts_per_batch: int
    group_size: int

    def _items(self) -> tuple[RequestId, ...]:
        return tuple(RequestId(self.batch, p, g) for p in range(self.prompts_per_batch)
                     for g in range(self.group_size))

    def __len__(self) -> int:
        return self.prompts_per_batch * self.group_size


@dataclass(frozen=True)
class JoinedDigests(_Packed[str]):
    """Sample digests (hex: never a comma) as one string joined by ",", for the same reason
    as `BatchRequests`: one string per update instead of one per sample. A value: equal to the
    `JoinedDigests` of the same digests (compare `tuple(...)` with a tuple)."""

    joined: str
    size: int

    @classmethod
    def of(cls, digests: Iterable[str]) -> JoinedDigests:
        digests = tuple(digests)
        joined = ",".join(digests)
        if digests and joined.count(",") != len(digests) - 1:
            raise ValueError("a sample digest cannot contain ','")
        return cls(joined, len(digests))

    def _items(self) -> tuple[str, ...]:
        return tuple(self.joined.split(",")) if self.size else ()

    def __len__(self) -> int:
        return self.size


@dataclass(frozen=True)
class Consumption:
    """The ledger's record of one committed update: what was really consumed and applied, as
    the components reported it (nothing here is recomputed from the schedule, so comparing it
    with the schedule is a check, not a tautology)."""

    update: int
    requests: Sequence[RequestId]
    """The consumed batch's request ids, in slot order (`BatchRequests`)."""
    sample_versions: tuple[int, ...]
    """The generating version each sample's worker reported."""
    sample_digests: Sequence[str]
    """Each consumed sample's digest, in slot order (`JoinedDigests`)."""
    scores_digest: str
    """Digest of the proximal (and reference) log-probs the cotangents were computed with."""
    steps: tuple[AppliedStep, ...]
    """Every optimizer step applied, in order (the forwarded positions, forward digests)."""
    commit_digest: str
    """The digest of the committed version update + 1."""


@dataclass(frozen=True)
class NoOps:
    """Counted, harmless events: not part of equality (they change nothing logical)."""

    duplicates: int = 0
    """Re-deliveries of something already applied, with the same content."""
    late: int = 0
    """Replies to a request that was superseded (old attempt, old load, old forward)."""
    divergent: int = 0
    """Re-deliveries of a completion with *different* content: evidence that a worker is not
    numerically invariant (the first completion is kept)."""


@cached_repr
@_histories_shortened
@dataclass(frozen=True)
class State:
    config: RunConfig
    learner: LearnerState
    workers: tuple[WorkerState, ...]
    """Every worker ever seen, by name."""
    admitted: int
    """Batches [0, admitted) have been admitted for rollout."""
    batches: tuple[BatchState, ...]
    """Admitted batches not yet consumed, in order: batches [committed, admitted)."""
    commit_digests: History[str] = field(repr=False)
    """Digest of each committed version v at index v; empty before the learner's first start."""
    published: History[int] = field(repr=False)
    """Published versions in publication order."""
    publishing: int | None
    """Version whose Publish was sent and not yet acknowledged."""
    retained: tuple[int, ...]
    """Published versions whose weights the store keeps, ascending."""
    ledger: tuple[Consumption, ...] = field(repr=False)
    """Every committed update's consumption record, in commit order."""
    ledger_digest: str
    """Hash chain over the ledger (so a state digest need not walk the whole history)."""
    timer_armed: bool
    evaluated: History[int] = field(default=History(), repr=False)
    """Versions whose evaluation the learner reported, in order (`VersionEvaluated`)."""
    checkpointed: History[int] = field(default=History(), repr=False)
    """Versions durably kept as checkpoints, in order (`CheckpointWritten`)."""
    noops: NoOps = field(default_factory=NoOps, compare=False, repr=False)

    @property
    def committed(self) -> int:
        """Committed updates = the newest committed version."""
        return max(len(self.commit_digests) - 1, 0)

    def worker(self, name: str) -> WorkerState | None:
        for w in self.workers:
            if w.name == name:
                return w
        return None

    def batch(self, index: int) -> BatchState | None:
        offset = index - self.committed
        if 0 <= offset < len(self.batches):
            return self.batches[offset]
        return None


def initial_state(config: RunConfig) -> State:
    """The state before anything happened (config is validated here: bad configs never run)."""
    config.validate()
    return State(
        config=config,
        learner=LearnerState(attempt=-1, phase=LearnerPhase.OFFLINE, step=0, observation=None,
                             step_digest="", scores=None, observations=0),
        workers=(),
        admitted=0,
        batches=(),
        commit_digests=History(),
        published=History(),
        publishing=None,
        retained=(),
        ledger=(),
        ledger_digest="",
        timer_armed=False,
    )


def chain_ledger(digest: str, record: Consumption) -> str:
    """The ledger digest after appending `record`: blake2b_128 over the previous digest and
    the record's fields in order, each behind its length (numbers as int64 LE, texts as UTF-8;
    no per-sample repr)."""
    h = hashlib.blake2b(digest.encode(), digest_size=16)
    parts = (
        _int64s([record.update]),
        _request_int64s(record.requests),
        _int64s(record.sample_versions),
        (record.sample_digests.joined if type(record.sample_digests) is JoinedDigests
         else ",".join(record.sample_digests)).encode(),
        f"{record.scores_digest}|{record.steps!r}|{record.commit_digest}".encode(),
    )
    for part in parts:
        h.update(struct.pack("<q", len(part)))
        h.update(part)
    return h.hexdigest()


def _request_int64s(requests: Sequence[RequestId]) -> bytes:
    """The ids' (batch, prompt, sample) triples as int64 LE; a whole batch's without making
    its ids (a commit chains 512 of them)."""
    if type(requests) is not BatchRequests:
        return _int64s(itertools.chain.from_iterable(requests))
    triples = _request_triples(requests.prompts_per_batch, requests.group_size).copy()
    triples[:, 0] = requests.batch
    return triples.tobytes()


@functools.lru_cache(maxsize=16)
def _request_triples(prompts_per_batch: int, group_size: int) -> np.ndarray:
    """(0, prompt, sample) of each request of a batch of this shape, as (n, 3) int64 LE (a
    batch's are these with its index in column 0)."""
    prompts, samples = np.divmod(np.arange(prompts_per_batch * group_size, dtype="<i8"),
                                 group_size)
    triples = np.stack([np.zeros_like(prompts), prompts, samples], axis=1).astype("<i8")
    triples.flags.writeable = False
    return triples


def _int64s(values: Iterable[int]) -> bytes:
    packed = array("q", values)
    if sys.byteorder == "big":  # `array` packs in the machine's order
        packed.byteswap()
    return packed.tobytes()


def state_digest(state: State) -> str:
    """Content digest of the compared part of a state (journals record it before and after).

    The repr of a state is canonical and leaves out exactly the parts that stand behind a
    digest (slots, ledger, payloads) or take no part in equality (no-op counts).
    """
    return hashlib.blake2b(repr(state).encode(), digest_size=16).hexdigest()
