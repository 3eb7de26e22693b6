"""The logical schedule: every identity, version and plan as a function of the configuration.

Nothing here sees an event. Which version generates a request, which update consumes it, in
which position and minibatch, and which versions are published are all fixed before the run
starts; timing can only change *when* these things happen, never *what* they are.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import operator
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from invar.model.config import RunConfig


class RequestId(NamedTuple):
    """One sample's logical identity: rollout batch b, prompt p within it, sample g of p."""

    batch: int
    prompt: int
    sample: int


def derive_seed(root: int, *path: object) -> int:
    """A 63-bit seed from the root seed and a logical path; stable across processes and hosts."""
    text = ":".join(str(part) for part in (root, *path)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") >> 1


def seed_stream(root: int, *path: object, count: int) -> list[int]:
    """`count` 63-bit seeds from the root seed and a logical path: the SHAKE-128 output of the
    path's text, cut into big-endian 8-byte words, each shifted right by one. One hash call for
    a prompt group's seeds or a batch's plan keys; the first k of `count` are the seeds of
    `count=k` (an extendable output); stable across processes and hosts."""
    words = struct.unpack(f">{count}Q", _stream_bytes(root, path, count))
    return [word >> 1 for word in words]


def seed_words(root: int, *path: object, count: int) -> np.ndarray:
    """`seed_stream(root, *path, count=count)` as a uint64 array, the words read in one pass
    (a batch's plan keys: hundreds of them)."""
    words: np.ndarray = np.frombuffer(_stream_bytes(root, path, count), dtype=">u8")
    return words >> 1


def _stream_bytes(root: int, path: tuple[object, ...], count: int) -> bytes:
    """The 8 * `count` bytes of SHAKE-128 over the path's text that a seed stream is cut from."""
    return hashlib.shake_128(_path_text(root, path).encode()).digest(8 * count)


def _path_text(root: int, path: tuple[object, ...]) -> str:
    return ":".join(str(part) for part in (root, *path))


@lru_cache(maxsize=4096)
def group_seeds(config: RunConfig, batch: int, prompt: int) -> tuple[int, ...]:
    """The sampling seeds of samples 0..G-1 of one prompt: the core launches a group at once."""
    return tuple(seed_stream(config.seed, "sample", batch, prompt, count=config.group_size))


@lru_cache(maxsize=64)
def batch_seeds(config: RunConfig, batch: int) -> tuple[int, ...]:
    """The sampling seeds of every request of `batch` in id order: each prompt's
    `group_seeds`, one after another (the core launches a batch at once). The prompts' seed
    streams are hashed in C-level passes and their words read in one array pass: the paths'
    texts are `_stream_bytes`' own (the batch's prefix, then each prompt)."""
    prefix = _path_text(config.seed, ("sample", batch, ""))
    texts = [f"{prefix}{prompt}".encode() for prompt in range(config.prompts_per_batch)]
    stream = b"".join(map(_SHAKE_DIGEST, map(hashlib.shake_128, texts),
                          itertools.repeat(8 * config.group_size)))
    words: list[int] = (np.frombuffer(stream, dtype=">u8") >> 1).tolist()
    return tuple(words)


_SHAKE_DIGEST = type(hashlib.shake_128()).digest


def sampling_seed(config: RunConfig, request: RequestId) -> int:
    """The seed a worker samples `request` with: the same on every re-issue, on every worker."""
    return group_seeds(config, request.batch, request.prompt)[request.sample]


def prompt_index(config: RunConfig, batch: int, prompt: int) -> int:
    """Which task prompt fills slot `prompt` of `batch` (the task maps it to tokens)."""
    return batch * config.prompts_per_batch + prompt


@lru_cache(maxsize=64)
def batch_prompt_indices(config: RunConfig, batch: int) -> tuple[int, ...]:
    """`prompt_index` of every request of `batch` in id order: each prompt's, group_size
    times (the core launches a batch at once)."""
    first = prompt_index(config, batch, 0)
    return tuple(itertools.chain.from_iterable(map(
        itertools.repeat, range(first, first + config.prompts_per_batch),
        itertools.repeat(config.group_size))))


@lru_cache(maxsize=1024)
def request_ids(config: RunConfig, batch: int) -> tuple[RequestId, ...]:
    """The samples of `batch` in id order: the order in which its update consumes them."""
    # Made from (batch, p, g) triples without a Python call per id: hundreds per batch.
    triples = itertools.product((batch,), range(config.prompts_per_batch),
                                range(config.group_size))
    return tuple(map(tuple.__new__, itertools.repeat(RequestId), triples))


def hard_boundaries(config: RunConfig) -> frozenset[int]:
    """Versions that are always published: eval and checkpoint intervals, and the final version."""
    n = config.total_updates
    points = {0, n}
    for every in (config.eval_every, config.checkpoint_every):
        if every:
            points.update(range(0, n + 1, every))
    return frozenset(points)


def is_eval_boundary(config: RunConfig, version: int) -> bool:
    """Evaluated versions: multiples of eval_every (version 0 included) and the final one."""
    if version == config.total_updates:
        return True
    return bool(config.eval_every) and version % config.eval_every == 0


def is_checkpoint_boundary(config: RunConfig, version: int) -> bool:
    """Kept versions: multiples of checkpoint_every and the final one (0 is the initial state)."""
    if version == config.total_updates:
        return True
    return bool(config.checkpoint_every) and version > 0 and version % config.checkpoint_every == 0


def is_published(config: RunConfig, version: int) -> bool:
    """Pub = {0} ∪ {v : v mod P = 0} ∪ hard boundaries, within [0, N]."""
    if not 0 <= version <= config.total_updates:
        return False
    return version % config.sync_period == 0 or version in _boundaries(config)


@lru_cache(maxsize=64)
def _boundaries(config: RunConfig) -> frozenset[int]:
    return hard_boundaries(config)


@lru_cache(maxsize=64)
def _sorted_boundaries(config: RunConfig) -> tuple[int, ...]:
    return tuple(sorted(_boundaries(config)))


@lru_cache(maxsize=64)
def published_versions(config: RunConfig) -> tuple[int, ...]:
    """Pub in increasing order: the publication decisions of the run."""
    return tuple(v for v in range(config.total_updates + 1) if is_published(config, v))


def last_boundary(config: RunConfig, batch: int) -> int:
    """The newest hard boundary at or before `batch`: data past a boundary never predates it."""
    # By bisection: a scan of the boundaries for every batch made the schedule quadratic.
    boundaries = _sorted_boundaries(config)
    return boundaries[bisect.bisect_right(boundaries, batch) - 1]


@lru_cache(maxsize=65536)
def gen_version(config: RunConfig, batch: int) -> int:
    """The version that generates every request of `batch`.

    gen_version(b) = max(min{v ∈ Pub : v ≥ b − S}, last boundary ≤ b). The first term is the
    oldest published version the staleness budget allows (the least publication traffic); the
    second makes eval/checkpoint boundaries hard: admitted work drains at a boundary, so data
    consumed after it is generated by weights at least as new as it.
    """
    lowest = max(0, batch - config.max_staleness)
    published = published_versions(config)  # by bisection, as `last_boundary`
    oldest_allowed = published[bisect.bisect_left(published, lowest)]
    return max(oldest_allowed, last_boundary(config, batch))


def staleness(config: RunConfig, batch: int) -> int:
    """Updates between the generating version and the update that consumes the data: in [0, S]."""
    return batch - gen_version(config, batch)


def batches_of_version(config: RunConfig, version: int) -> range:
    """The batches generated by `version` (contiguous, since gen_version is non-decreasing)."""
    return _batches_by_version(config).get(version, range(0))


@lru_cache(maxsize=64)
def _batches_by_version(config: RunConfig) -> dict[int, range]:
    """`batches_of_version` of every generating version, from one pass over the batches (a
    pass per version made the run's work grow with the square of its updates)."""
    firsts: dict[int, int] = {}
    ends: dict[int, int] = {}
    for batch in range(config.total_updates):
        version = gen_version(config, batch)
        firsts.setdefault(version, batch)
        ends[version] = batch + 1
    return {version: range(first, ends[version]) for version, first in firsts.items()}


@lru_cache(maxsize=256)
def minibatch_plan(config: RunConfig, update: int) -> tuple[tuple[int, ...], ...]:
    """Positions (into `request_ids(update)`) used by each of the K optimizer steps of `update`.

    A permutation keyed by seed_stream(seed, "plan", update)[position] (a stable sort), cut into K
    near-equal contiguous chunks; each chunk is kept in id order. Redoing an update reuses
    this plan.
    """
    positions = minibatch_order(config, update).tolist()
    return tuple(tuple(positions[start:end]) for start, end in _step_bounds(config))


@lru_cache(maxsize=256)
def minibatch_order(config: RunConfig, update: int) -> np.ndarray:
    """`minibatch_plan(update)`'s positions, one step's after the other, as one read-only int64
    array: a batch's arrays gathered in this order hold each step's rows consecutively."""
    keys = seed_words(config.seed, "plan", update, count=config.samples_per_batch)
    order = np.argsort(keys, kind="stable")
    for start, end in _step_bounds(config):
        order[start:end].sort()  # each chunk in id order
    order.flags.writeable = False
    return order


def _step_bounds(config: RunConfig) -> list[tuple[int, int]]:
    """Where each of the K steps' chunks of the plan starts and ends: near-equal cuts."""
    n, k = config.samples_per_batch, config.optimizer_steps
    cuts = [round(j * n / k) for j in range(k + 1)]
    return list(zip(cuts, cuts[1:]))


@lru_cache(maxsize=256)
def minibatch_requests(config: RunConfig, update: int) -> tuple[tuple[RequestId, ...], ...]:
    """The request ids each optimizer step of `update` forwards: `request_ids(update)` at the
    positions `minibatch_plan(update)[step]` (asked for again on every retry of the step)."""
    requests = request_ids(config, update)
    # One C call per step (itemgetter of one position gives the id, not a 1-tuple).
    return tuple(operator.itemgetter(*positions)(requests) if len(positions) > 1
                 else (requests[positions[0]],) for positions in minibatch_plan(config, update))


@dataclass(frozen=True)
class ScheduleReport:
    """What the declared budget actually yields once boundaries and admission are applied."""

    declared_staleness: int
    effective_staleness: int
    declared_sync_period: int
    effective_sync_period: int
    published_versions: tuple[int, ...]
    staleness_per_batch: tuple[int, ...]
    notes: tuple[str, ...]


def report(config: RunConfig) -> ScheduleReport:
    """State the effective budget, with a note for each part of the declared one not spent."""
    per_batch = tuple(staleness(config, b) for b in range(config.total_updates))
    pub = published_versions(config)
    gaps = [b - a for a, b in zip(pub, pub[1:])]
    effective_period = max(gaps, default=config.sync_period)
    effective_staleness = max(per_batch, default=0)
    notes = []
    if effective_staleness < config.max_staleness:
        notes.append(
            f"max_staleness={config.max_staleness} is never reached: hard boundaries "
            f"(eval_every={config.eval_every}, checkpoint_every={config.checkpoint_every}, "
            f"total_updates={config.total_updates}) clamp it to {effective_staleness}"
        )
    if effective_period < config.sync_period:
        notes.append(
            f"sync_period={config.sync_period} is clamped by hard boundaries: the longest gap "
            f"between publications is {effective_period}"
        )
    if config.max_inflight_batches < config.max_staleness + 1:
        notes.append(
            f"max_inflight_batches={config.max_inflight_batches} < max_staleness + 1 = "
            f"{config.max_staleness + 1}: rollouts of a batch wait for admission although their "
            "version is older, so part of the staleness budget buys no overlap"
        )
    if config.max_staleness == 0:
        notes.append("max_staleness=0: synchronous; rollout and learning never overlap")
    return ScheduleReport(
        declared_staleness=config.max_staleness,
        effective_staleness=effective_staleness,
        declared_sync_period=config.sync_period,
        effective_sync_period=effective_period,
        published_versions=pub,
        staleness_per_batch=per_batch,
        notes=tuple(notes),
    )
