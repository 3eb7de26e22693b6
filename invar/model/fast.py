"""The core's fast paths: what a large reply frame makes `core` do one completion at a time
(check it, digest it, fill its slots: `BatchState.with_slots`) done over the frame's columns
instead, and the reconcile's rollout passes skipped where they are known to decide nothing.

`core` states each rule in its plain form, as spec/PROTOCOL.md does, and asks here first: every
function below answers exactly as the rule would, or declines (None; False for a check), and
the rule then runs. `ENABLED` is the one switch: off, every function declines, and the core runs
its reference rules alone (tests/model/test_reference_rules.py runs both ways on generated
frames, batches and histories and compares every output, error messages included).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import itertools
import math
import operator
from collections import Counter
from collections.abc import Iterable, Sequence
from types import NoneType

import numpy as np

from invar.model import schedule
from invar.model.completions import Completions
from invar.model.config import RunConfig
from invar.model.memo import IdentityMemo
from invar.model.ragged import Ragged
from invar.model.state import (
    _MIX,
    Assigned,
    BatchState,
    Sample,
    Slot,
    State,
    _all_pending_digest,
    _assigned_hash,
    _pending_hash,
    _slot_hash,
)

ENABLED = True
"""The one switch between the fast paths and the reference rules (False: every function here
declines, so the core takes its reference rules everywhere). Read at each call; only tests
turn it off."""

COLUMNS_FROM = 16
"""Completions in a frame from which passes over its columns pay for their fixed cost (a few
µs each): a smaller frame is looked at completion by completion."""

BULK_FROM = 96
"""Slots changed at once from which `with_column` works on arrays (their fixed cost, a few µs
per pass, is then below the per-slot work it replaces)."""

Filled = tuple[list[BatchState], Counter[str], dict[str, int]]
"""What a reply frame does to the batches (`core._filled`): each batch it fills, as filled; each
worker's count of requests it completed; the no-ops it brought, by kind."""


# ---------------------------------------------------------------------------------------------
# A reply frame: its checks, digests and slots, a column at a time.


def frame_fine(config: RunConfig, admitted: int, frame: Completions) -> bool:
    """`core._completions_error` finds nothing in a large frame: `frame_plausible` (False: look
    at each completion, to name the one at fault)."""
    return ENABLED and len(frame) >= COLUMNS_FROM and frame_plausible(config, admitted, frame)


def frame_plausible(config: RunConfig, admitted: int, frame: Completions) -> bool:
    """`core._completions_error` of a whole frame at once, in a few passes over its columns:
    True only if no completion has a problem."""
    requests = frame.requests
    # Whole-array passes: a reduction along the short axis of (n, 3) costs more than these.
    if requests.min() < 0 or (requests >= (admitted, config.prompts_per_batch,
                                           config.group_size)).any():
        return False
    indices = requests[:, 0]
    first = int(indices.min())
    if first == indices.max():  # one batch (a reply to one launch): one version
        if not (frame.versions == schedule.gen_version(config, first)).all():
            return False
    else:
        batches, row_batch = np.unique(indices, return_inverse=True)
        expected = np.array([schedule.gen_version(config, b) for b in batches.tolist()],
                            dtype=np.int64)
        if not np.array_equal(frame.versions, expected[row_batch]):
            return False
    tokens, logprobs = frame.tokens, frame.behavior_logprobs
    lengths = tokens.lengths
    if lengths != logprobs.lengths or (lengths[0] if tokens.uniform() else min(lengths)) == 0:
        return False
    if tokens.values.min() < 0:
        return False
    return _logprobs(logprobs.values) and bool(np.isfinite(frame.rewards).all())


def matrix_fine(matrix: Ragged, lengths: tuple[int, ...]) -> bool:
    """`core._matrix_problem` finds nothing in `matrix` (of as many rows as `lengths`): the whole
    matrix in two C passes (False: look at each row, to name the one at fault)."""
    return ENABLED and matrix.lengths == lengths and _logprobs(matrix.values)


def _logprobs(values: np.ndarray) -> bool:
    """Every value finite and <= 0: the largest is <= 0 (not NaN, not +inf, not positive) and
    the smallest is not -inf (nor NaN)."""
    return not len(values) or bool(np.maximum.reduce(values) <= 0.0
                                   and np.minimum.reduce(values) > -math.inf)


def sample_digests(frame: Completions) -> list[bytes] | None:
    """`core._sample_digests` of a large frame of one length (fixed-shape generation): one
    table, a bytes object per row, hashed in C-level passes (a Python-level step per completion
    would cost as much as its hash)."""
    n = len(frame)
    if not ENABLED or n < COLUMNS_FROM or not frame.tokens.uniform():
        return None
    tokens, logprobs, rewards = frame.tokens, frame.behavior_logprobs, frame.rewards
    width = tokens.lengths[0]
    table = np.concatenate([tokens.values.reshape(n, width).view(np.uint8),
                            logprobs.values.reshape(n, width).view(np.uint8),
                            rewards.reshape(n, 1).view(np.uint8)], axis=1)
    # Rows as opaque (void) items: `tolist` gives each as bytes, trailing zeros kept.
    rows = table.view(np.dtype((np.void, table.shape[1]))).ravel().tolist()
    hashes = list(map(_COPY, itertools.repeat(_BLAKE2B_96, n)))
    collections.deque(map(_UPDATE, hashes, rows), 0)
    return list(map(_DIGEST_BYTES, hashes))


_BLAKE2B_96 = hashlib.blake2b(digest_size=12)
_COPY, _UPDATE, _DIGEST_BYTES = (getattr(type(_BLAKE2B_96), name)
                                 for name in ("copy", "update", "digest"))


def filled_in_bulk(state: State, frame: Completions, digests: list[str],
                   raw_digests: list[bytes]) -> Filled | None:
    """`core._filled` of a large frame whose completions fill distinct slots that hold no
    sample yet (a worker's reply to one launch), a batch at a time: None for any other frame
    (a repeat), which is then taken completion by completion. `digests` are the completions'
    digests, `raw_digests` their bytes."""
    if not ENABLED or len(frame) < BULK_FROM:
        return None
    requests = frame.requests
    positions = requests[:, 1] * state.config.group_size + requests[:, 2]
    indices = requests[:, 0]
    first, last = int(indices.min()), int(indices.max())
    rows_of_batches = ([(first, None)] if first == last else  # None: every row
                       [(index, np.flatnonzero(indices == index))
                        for index in range(first, last + 1)])
    versions = frame.versions.tolist()
    filled: list[BatchState] = []
    freed: Counter[str] = Counter()
    consumed = 0
    packed: np.ndarray | None = None  # the digests' bytes, an (n, 12) array once needed
    for index, rows in rows_of_batches:
        batch = state.batch(index)
        if batch is None:
            consumed += len(frame) if rows is None else len(rows)
            continue
        if rows is not None and not len(rows):
            continue
        batch_positions = (positions if rows is None else positions[rows]).tolist()
        if len(set(batch_positions)) != len(batch_positions):
            return None
        old = _slots_at(batch.slots, batch_positions)
        assignee = old[0]
        if old.count(assignee) == len(old):  # one launch's slots (identical: no comparison)
            if isinstance(assignee, Sample):
                return None
            if assignee is not None:  # None: pending
                freed[assignee.worker] += len(old)
        else:
            if Sample in set(map(type, old)):
                return None
            freed.update(map(_WORKER, filter(None, old)))  # the assigned (None: pending)
        rows_list = range(len(frame)) if rows is None else rows.tolist()
        if packed is None:
            packed = np.frombuffer(b"".join(raw_digests), np.uint8).reshape(len(frame), 12)
        samples = samples_of(frame, rows_list, digests, versions)
        column = with_column(batch, batch_positions, samples,
                             packed if rows is None else packed[rows])
        filled.append(column if column is not None else
                      batch.with_slots(dict(zip(batch_positions, samples))))
    return filled, freed, {"duplicates": consumed}  # consumed: the ledger holds them


def _slots_at(slots: tuple[Slot, ...], positions: list[int]) -> tuple[Slot, ...]:
    """The slots at `positions`, in one C-level call (`itemgetter` of one position gives the
    slot itself, not a tuple)."""
    if len(positions) == 1:
        return (slots[positions[0]],)
    return operator.itemgetter(*positions)(slots)  # type: ignore[no-any-return]


_WORKER = operator.attrgetter("worker")


def samples_of(frame: Completions, rows: Sequence[int], digests: Sequence[str],
               versions: Sequence[int]) -> list[Sample]:
    """The samples of `rows` of `frame` (`digests[row]`, `versions[row]` theirs), made without
    a Python-level step per sample (hundreds come per reply): each made from its fields' tuple
    in one C-level call."""
    if type(rows) is not range or rows != range(len(digests)):
        digests = list(map(digests.__getitem__, rows))
        versions = list(map(versions.__getitem__, rows))
    return list(map(_TUPLE_NEW, itertools.repeat(Sample, len(rows)),
                    zip(digests, versions, itertools.repeat(frame), rows)))


_TUPLE_NEW = tuple.__new__


# ---------------------------------------------------------------------------------------------
# A batch's slots, a column at a time: the counters follow counts of kinds, the digest the XOR
# of each side's terms, as 128-bit values in two uint64 lanes (high, low): the XOR of many terms
# is the lanes' XOR, a sample's term a 128-bit product done in 32-bit halves. Each gives exactly
# `state._slot_hash`'s values.


def with_column(batch: BatchState, positions: list[int], slots: Sequence[Slot],
                digests: np.ndarray | None = None) -> BatchState | None:
    """`batch.with_slots(dict(zip(positions, slots)))` for distinct `positions`, in bulk: for
    the hundreds of slots a reply frame fills or a launch assigns, in a few array passes per
    kind of slot; None for fewer than `BULK_FROM` (numpy's fixed cost would not pay).
    `digests`: given only when `slots` are all samples, their digests' bytes (`bytes.fromhex`
    of each `digest`) as an (n, 12) uint8 array, as the reply frame's were computed: their
    terms are then taken over arrays."""
    if not ENABLED or len(positions) < BULK_FROM:
        return None
    current = batch.slots
    size = len(current)
    olds = operator.itemgetter(*positions)(current)
    chosen: list[int] | None = positions
    if positions == _every_position(size):
        chosen, updated = None, tuple(slots)
    else:
        changed = list(current)
        for position, slot in zip(positions, slots):
            changed[position] = slot
        updated = tuple(changed)
    old_pending, old_completed, old_terms = _summary(chosen, olds, size)
    new_pending, new_completed, new_terms = _summary(chosen, slots, size, digests)
    pending = batch.pending - old_pending + new_pending
    completed = batch.completed - old_completed + new_completed
    digest = batch.slots_digest ^ old_terms ^ new_terms
    return BatchState(batch.batch, updated, pending, completed, digest)


def _summary(positions: list[int] | None, slots: Sequence[Slot], size: int,
             digests: np.ndarray | None = None) -> tuple[int, int, int]:
    """How many of `slots` are pending, how many are samples, and the XOR of their terms
    (`_slot_hash(p, s)` over `zip(positions, slots)`; positions None: every one in order):
    in bulk when the slots are all pending, all one assignee, or all samples whose digests'
    bytes are given (`with_column`: only then)."""
    n, first = len(slots), slots[0]
    if digests is not None:
        return 0, n, _sample_terms(positions, digests, size)
    # Counting the first slot among identical slots calls no comparison; samples are not
    # counted so (each is another object: their dataclass __eq__ would run).
    if type(first) is not Sample and slots.count(first) == n:
        if first is None:
            if positions is None:
                return n, 0, _all_pending_digest(size)
            return n, 0, _lanes_xor(_pending_lanes(size), positions)
        assert isinstance(first, Assigned)
        worker, incarnation = first.worker, first.incarnation
        if positions is None:
            return 0, 0, _all_assigned_digest(worker, incarnation, size)
        return 0, 0, _lanes_xor(_assigned_lanes(worker, incarnation, size), positions)
    kinds = list(map(type, slots))
    samples = kinds.count(Sample)
    terms = functools.reduce(operator.xor, map(_slot_hash, positions or range(size), slots), 0)
    return kinds.count(NoneType), samples, terms


def _sample_terms(positions: list[int] | None, digests: np.ndarray, size: int) -> int:
    """The XOR of `_sample_hash(p, d.hex())` over positions and digests' bytes (n, 12)."""
    # digest << 32 as 16 big-endian bytes: the digest's 12, then 4 zero bytes.
    shifted = np.zeros((len(digests), 16), np.uint8)
    shifted[:, :12] = digests
    value = shifted.view(">u8").astype(np.uint64)
    pending_high, pending_low = _pending_lanes(size)
    if positions is not None:
        pending_high, pending_low = pending_high[positions], pending_low[positions]
    high, low = _times_mix(value[:, 0] ^ pending_high, value[:, 1] ^ pending_low)
    return _joined(np.bitwise_xor.reduce(high), np.bitwise_xor.reduce(low))


_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_MIX_HIGH, _MIX_LOW = np.uint64(_MIX >> 64), np.uint64(_MIX & 0xFFFFFFFFFFFFFFFF)
_MIX_LOW_HALVES = np.uint64(_MIX & 0xFFFFFFFF), np.uint64((_MIX >> 32) & 0xFFFFFFFF)
Lanes = tuple[np.ndarray, np.ndarray]
"""128-bit values as their high and low 64 bits, each an array."""


def _times_mix(high: np.ndarray, low: np.ndarray) -> Lanes:
    """(high, low) * _MIX mod 2**128, lane-wise (uint64 arithmetic wraps mod 2**64)."""
    m0, m1 = _MIX_LOW_HALVES
    a0, a1 = low & _M32, low >> _S32
    p00, p01, p10, p11 = a0 * m0, a0 * m1, a1 * m0, a1 * m1
    carry = ((p00 >> _S32) + (p01 & _M32) + (p10 & _M32)) >> _S32
    low_times_low_high = p11 + (p01 >> _S32) + (p10 >> _S32) + carry
    return low_times_low_high + high * _MIX_LOW + low * _MIX_HIGH, low * _MIX_LOW


def _lanes_xor(lanes: Lanes, positions: list[int]) -> int:
    high, low = lanes
    return _joined(np.bitwise_xor.reduce(high[positions]), np.bitwise_xor.reduce(low[positions]))


def _joined(high: np.uint64, low: np.uint64) -> int:
    return int(high) << 64 | int(low)


def _lanes(terms: Iterable[int]) -> Lanes:
    values = list(terms)
    return (np.array([t >> 64 for t in values], dtype=np.uint64),
            np.array([t & 0xFFFFFFFFFFFFFFFF for t in values], dtype=np.uint64))


@functools.lru_cache(maxsize=64)
def _every_position(size: int) -> list[int]:
    return list(range(size))


@functools.lru_cache(maxsize=64)
def _pending_lanes(size: int) -> Lanes:
    return _lanes(map(_pending_hash, range(size)))


@functools.lru_cache(maxsize=256)
def _assigned_lanes(worker: str, incarnation: int, size: int) -> Lanes:
    return _lanes(_assigned_hash(p, worker, incarnation) for p in range(size))


@functools.lru_cache(maxsize=256)
def _all_assigned_digest(worker: str, incarnation: int, size: int) -> int:
    high, low = _assigned_lanes(worker, incarnation, size)
    return _joined(np.bitwise_xor.reduce(high), np.bitwise_xor.reduce(low))


# ---------------------------------------------------------------------------------------------
# Launches and the reconcile.


def whole_batch_run(every_slot_free: bool, size: int,
                    loads: dict[str, int]) -> dict[str, list[int]] | None:
    """`core._group_runs` of a batch whose every slot is free, with one worker: every group
    its, one run, without the loop over groups (`loads` counted in, as there)."""
    if not ENABLED or not every_slot_free or len(loads) != 1:
        return None
    (name,) = loads
    loads[name] += size
    return {name: [0, size]}


def rollout_settled(state: State) -> bool:
    """The rollout passes of `core._reconcile` (admission, loads, launches, publication,
    release) would decide nothing on `state`: they were seen to leave these very objects
    alone (`settle`). After a learner's event, most often (its scores, forwards and steps
    change nothing they read)."""
    if not ENABLED:
        return False
    known = _SETTLED.lookup(state.batches, state.workers, (state.admitted, state.publishing))
    return (known is not None and known[0] is state.config and known[1] is state.commit_digests
            and known[2] is state.published and known[3] is state.retained)


def settle(before: State, after: State) -> None:
    """Remember `after`'s rollout side as settled if the rollout passes that took `before` to
    it decided nothing. Admission, loads and launches decided nothing when the batches and the
    workers are the very objects they were given (each would have changed one); then no pass
    has anything left to do there: publication and release read nothing the others write, and
    neither finds more after acting once (one publication at a time; a release looks at every
    retained version)."""
    if not ENABLED:
        return
    if after.batches is before.batches and after.workers is before.workers:
        _SETTLED.put(after.batches, after.workers, (after.admitted, after.publishing),
                     (after.config, after.commit_digests, after.published, after.retained))


_SETTLED = IdentityMemo(16)
"""Rollout sides on which the rollout passes of `core._reconcile` decide nothing: (batches,
workers, (admitted, publishing)) -> (config, commit_digests, published, retained), every object
by identity. The passes are pure functions of exactly these fields, so on any state holding the
same objects they decide nothing. A few are kept: they hold their batches' reply frames."""
