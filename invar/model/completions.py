"""A worker's reply frame as columns: the completions of one call, as the core receives them.

A frame answers the launches a worker was sent together: hundreds of samples in a real run.
Held as one record per sample with tuples of Python numbers, every frame was turned into
objects when decoded, walked value by value to be checked and digested, kept sample by sample,
then padded and packed again. `Completions` keeps a frame as five columns — the requests
(n × 3 int64: batch, prompt, sample), the versions, the tokens (`Ragged` int64), the behaviour
log-probs (`Ragged` float64) and the rewards — so that decoding is a view of the wire's bytes,
the core's checks and digests are passes over arrays, and a stored sample is a row of its
frame (`state.Sample`).

It is a value, like the tuple of records it stands for: immutable, equal and hashed by its
columns' bytes (bitwise, as `Ragged`: -0.0 and 0.0 differ, a NaN equals itself), read as
`Completion` records by index and iteration, sliced (a frame split in two) and added (two
frames merged). `Completions.of` makes one from records: how tests and the model's synthetic
workers write a frame.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from invar.model.ragged import FLOAT, INT, INTEGER_TYPES, NUMBER_TYPES, Ragged, read_only
from invar.model.schedule import RequestId


@dataclass(frozen=True)
class Completion:
    """One request a worker sampled with `version`; log-probs are its own sampler's, per token.
    A row of `Completions`, as a record."""

    request: RequestId
    version: int
    tokens: tuple[int, ...]
    behavior_logprobs: tuple[float, ...]
    reward: float


class Completions:
    """The completions of one reply frame as columns: row i is completion i."""

    __slots__ = ("requests", "versions", "tokens", "behavior_logprobs", "rewards", "_hash",
                 "_repr", "_request_ids")

    requests: np.ndarray
    """(n, 3) int64: each completion's request id (batch, prompt, sample)."""
    versions: np.ndarray
    """(n,) int64: the version each was sampled with, as the worker reports it."""
    tokens: Ragged
    """A row of int64 token ids per completion."""
    behavior_logprobs: Ragged
    """A row of float64 per completion: the sampler's log-prob of each token."""
    rewards: np.ndarray
    """(n,) float64."""
    _hash: int | None
    _repr: str | None
    _request_ids: tuple[RequestId, ...] | None

    def __init__(self, requests: np.ndarray, versions: np.ndarray, tokens: Ragged,
                 behavior_logprobs: Ragged, rewards: np.ndarray) -> None:
        requests, versions, rewards = map(np.asarray, (requests, versions, rewards))
        n = len(versions)
        for name, column, dtype, shape in (("requests", requests, INT, (n, 3)),
                                           ("versions", versions, INT, (n,)),
                                           ("rewards", rewards, FLOAT, (n,))):
            if column.dtype != dtype or column.shape != shape:
                raise ValueError(f"{name}: expected {dtype.str} of shape {shape}, got "
                                 f"{column.dtype.str} of shape {column.shape}")
        for name, rows, dtype in (("tokens", tokens, INT),
                                  ("behavior_logprobs", behavior_logprobs, FLOAT)):
            if not isinstance(rows, Ragged) or rows.values.dtype != dtype or len(rows) != n:
                raise ValueError(f"{name}: expected a Ragged of {n} rows of {dtype.str}")
        self._set(read_only(requests), read_only(versions), tokens, behavior_logprobs,
                  read_only(rewards))

    def _set(self, requests: np.ndarray, versions: np.ndarray, tokens: Ragged,
             behavior_logprobs: Ragged, rewards: np.ndarray) -> None:
        set_ = object.__setattr__
        set_(self, "requests", requests)
        set_(self, "versions", versions)
        set_(self, "tokens", tokens)
        set_(self, "behavior_logprobs", behavior_logprobs)
        set_(self, "rewards", rewards)
        set_(self, "_hash", None)
        set_(self, "_repr", None)
        set_(self, "_request_ids", None)

    @classmethod
    def _made(cls, requests: np.ndarray, versions: np.ndarray, tokens: Ragged,
              behavior_logprobs: Ragged, rewards: np.ndarray) -> Completions:
        """Columns taken from valid frames (slices, gathers, joins): read-only, not checked."""
        made = object.__new__(cls)
        made._set(requests, versions, tokens, behavior_logprobs, rewards)
        return made

    @classmethod
    def of(cls, completions: Iterable[Completion]) -> Completions:
        """The frame of these records, in order. `ValueError` names the first record whose
        field a column cannot hold (a bool, a float token, a request not of three integers, a
        number outside int64)."""
        records = tuple(completions)
        try:
            return cls._of_records(records)
        except ValueError:
            for i, record in enumerate(records):
                try:
                    cls._of_records((record,))
                except ValueError as error:
                    raise ValueError(f"completions[{i}].{error}") from None
            raise

    @classmethod
    def _of_records(cls, records: tuple[Completion, ...]) -> Completions:
        n = len(records)
        requests = [c.request for c in records]
        if any(len(request) != 3 for request in requests):
            raise ValueError("request: expected (batch, prompt, sample)")
        return cls._made(
            _column(list(itertools.chain.from_iterable(requests)), INT, "request").reshape(n, 3),
            _column([c.version for c in records], INT, "version"),
            _rows([c.tokens for c in records], INT, "tokens"),
            _rows([c.behavior_logprobs for c in records], FLOAT, "behavior_logprobs"),
            _column([c.reward for c in records], FLOAT, "reward"))

    # -- reading ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.versions)

    def request_ids(self) -> tuple[RequestId, ...]:
        """Each completion's request id (made once per frame)."""
        if self._request_ids is None:
            rows = self.requests.tolist()
            # What RequestId._make does, without a Python-level call per row.
            ids = tuple(map(tuple.__new__, itertools.repeat(RequestId, len(rows)), rows))
            object.__setattr__(self, "_request_ids", ids)
        assert self._request_ids is not None
        return self._request_ids

    def __iter__(self) -> Iterator[Completion]:
        return map(Completion, self.request_ids(), self.versions.tolist(), self.tokens.rows(),
                   self.behavior_logprobs.rows(), self.rewards.tolist())

    @overload
    def __getitem__(self, index: int) -> Completion: ...
    @overload
    def __getitem__(self, index: slice) -> Completions: ...
    def __getitem__(self, index: int | slice) -> Completion | Completions:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return self.take(range(start, stop, step))
            stop = max(start, stop)
            return self._made(self.requests[start:stop], self.versions[start:stop],
                              _between(self.tokens, start, stop),
                              _between(self.behavior_logprobs, start, stop),
                              self.rewards[start:stop])
        i = operator.index(index)
        return Completion(self.request_ids()[i], int(self.versions[i]), self.tokens[i],
                          self.behavior_logprobs[i], float(self.rewards[i]))

    def take(self, rows: Sequence[int] | np.ndarray) -> Completions:
        """The completions at `rows`, in that order (one gather per column)."""
        picked = np.asarray(rows, dtype=np.int64).reshape(-1)
        return self._made(_owned(self.requests[picked]), _owned(self.versions[picked]),
                          self.tokens.take(picked), self.behavior_logprobs.take(picked),
                          _owned(self.rewards[picked]))

    @classmethod
    def concatenate(cls, parts: Sequence[Completions]) -> Completions:
        """The completions of `parts` (one at least), one frame after the other."""
        if len(parts) == 1:
            return parts[0]
        return cls._made(_owned(np.concatenate([p.requests for p in parts])),
                         _owned(np.concatenate([p.versions for p in parts])),
                         Ragged.concatenate([p.tokens for p in parts]),
                         Ragged.concatenate([p.behavior_logprobs for p in parts]),
                         _owned(np.concatenate([p.rewards for p in parts])))

    @classmethod
    def gathered(cls, frames: Sequence[Completions], rows: Sequence[int]) -> Completions:
        """Row `rows[i]` of `frames[i]` for each i, in order, as one frame. Rows that follow
        one another in one frame are a slice of it (no copy: a frame's own rows in order give
        the frame itself); others are the frames joined, then one gather per column."""
        n = len(rows)
        if not n:
            return cls.of(())
        first, start = frames[0], rows[0]
        if all(map(operator.is_, frames, itertools.repeat(first))):
            if list(rows) == list(range(start, start + n)):
                return first if n == len(first) else first[start:start + n]
            return first.take(rows)
        offsets: dict[int, int] = {}  # id(frame) -> where its rows start among those joined
        joined: list[Completions] = []
        size = 0
        for frame in frames:
            if id(frame) not in offsets:
                offsets[id(frame)] = size
                joined.append(frame)
                size += len(frame)
        picked = [offsets[id(frame)] + row for frame, row in zip(frames, rows)]
        return cls.concatenate(joined).take(picked)

    def __add__(self, other: Completions) -> Completions:
        if not isinstance(other, Completions):
            return NotImplemented
        return Completions.concatenate((self, other))

    # -- a value ----------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Completions):
            return NotImplemented
        return (self.requests.tobytes() == other.requests.tobytes()
                and self.versions.tobytes() == other.versions.tobytes()
                and self.rewards.tobytes() == other.rewards.tobytes()
                and self.tokens == other.tokens
                and self.behavior_logprobs == other.behavior_logprobs)

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(self, "_hash", hash((
                self.requests.tobytes(), self.versions.tobytes(), self.tokens,
                self.behavior_logprobs, self.rewards.tobytes())))
        assert self._hash is not None
        return self._hash

    def __repr__(self) -> str:
        # The records' tuple inside: the model checker's message keys sort by it, and make it
        # again for each renaming of the worker that sent the frame (kept, so made once).
        if self._repr is None:
            object.__setattr__(self, "_repr", f"Completions.of({tuple(self)!r})")
        assert self._repr is not None
        return self._repr

    def __reduce__(self) -> tuple[Any, ...]:
        return (Completions, (self.requests, self.versions, self.tokens,
                              self.behavior_logprobs, self.rewards))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Completions is immutable: cannot set {name}")


def _column(values: list[Any], dtype: np.dtype[Any], name: str) -> np.ndarray:
    """Python numbers as a read-only column; Python ints only for int64 (no bool, no float)."""
    if not set(map(type, values)) <= (INTEGER_TYPES if dtype == INT else NUMBER_TYPES):
        raise ValueError(f"{name}: expected {'integers' if dtype == INT else 'numbers'}")
    try:
        return _owned(np.array(values, dtype=dtype))
    except OverflowError:
        raise ValueError(f"{name}: an integer outside int64") from None


def _rows(rows: list[Any], dtype: np.dtype[Any], name: str) -> Ragged:
    try:
        return Ragged.of(rows, dtype)
    except ValueError:
        kind = "integers" if dtype == INT else "numbers"
        raise ValueError(f"{name}: expected a flat sequence of {kind} (in int64 or float64)"
                         ) from None


def _between(rows: Ragged, start: int, stop: int) -> Ragged:
    """Rows start..stop-1 of `rows`: a view of its values."""
    lengths = rows.lengths[start:stop]
    if rows.uniform():
        first = start * rows.lengths[0]
    else:
        first = int(rows.starts()[start]) if start < len(rows) else len(rows.values)
    return Ragged(rows.values[first:first + sum(lengths)], lengths)


def _owned(values: np.ndarray) -> np.ndarray:
    """A freshly made array, made read-only (nothing else holds it)."""
    values.flags.writeable = False
    return values
