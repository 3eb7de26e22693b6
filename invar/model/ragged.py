"""Ragged rows of numbers held as one read-only array: log-prob matrices and token rows.

A batch's log-probs and tokens are rows of different lengths. Held as tuples of Python
numbers, every update turns hundreds of rows into objects, and every check, digest, padding
and encoding walks them one number at a time. `Ragged` keeps the rows as one flat, read-only
numpy array and their lengths: checks and digests are single passes in C, padding is one
scatter (or a reshape, when every row has the same length), and the wire's packed encoding
is the array's bytes.

It is a value, like the tuple of tuples it stands for: immutable, equal and hashed by its
dtype, row lengths and bytes (bitwise: -0.0 and 0.0 differ, a NaN equals itself, as in the
digests), so states and messages that hold one compare and hash by value (the checker relies
on it). Indexing and iterating give rows as tuples of Python numbers; `row` gives a view.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

FLOAT = np.dtype("<f8")
INT = np.dtype("<i8")


class Ragged:
    """Rows of float64 or int64 numbers of any lengths, as one flat read-only array."""

    __slots__ = ("values", "lengths", "_starts", "_hash")

    values: np.ndarray
    """The rows back to back: 1-D, little-endian float64 or int64, read-only."""
    lengths: tuple[int, ...]
    """Each row's length, in order."""
    _starts: np.ndarray | None
    _hash: int | None

    def __init__(self, values: np.ndarray, lengths: Sequence[int]) -> None:
        values = np.asarray(values)
        if values.ndim != 1:
            raise ValueError(f"values: expected a 1-D array, got shape {values.shape}")
        if values.dtype not in (FLOAT, INT):
            raise ValueError(f"values: expected little-endian float64 or int64, got "
                             f"{values.dtype}")
        lengths = tuple(lengths)
        # Two passes in C: every length a Python int (not a bool), none negative.
        if not (set(map(type, lengths)) <= _INT_TYPE and min(lengths, default=0) >= 0):
            raise ValueError("lengths: expected non-negative integers")
        if sum(lengths) != len(values):
            raise ValueError(f"lengths: rows of {sum(lengths)} values in all, values has "
                             f"{len(values)}")
        set_ = object.__setattr__
        set_(self, "values", read_only(values))
        set_(self, "lengths", lengths)
        set_(self, "_starts", None)
        set_(self, "_hash", None)

    @classmethod
    def of(cls, rows: Sequence[Sequence[float]] | Sequence[Sequence[int]],
           dtype: np.dtype[Any] = FLOAT) -> Ragged:
        """The rows given as sequences of numbers; `ValueError` names the first row that is
        not a flat sequence of them."""
        if isinstance(rows, Ragged):
            return rows if rows.values.dtype == dtype else cls(rows.values.astype(dtype),
                                                                rows.lengths)
        try:
            lengths = [len(row) for row in rows]
            flat = list(itertools.chain.from_iterable(rows))
        except TypeError:
            flat = None
        # Python ints (and floats, for float rows) only: no bool, no silent truncation of a
        # float to an int, no string that numpy would parse.
        allowed = INTEGER_TYPES if dtype == INT else NUMBER_TYPES
        if flat is None or not set(map(type, flat)) <= allowed:
            index = next((i for i, row in enumerate(rows) if not _flat_of(row, allowed)), None)
            where = "rows" if index is None else f"rows[{index}]"
            raise ValueError(f"{where}: not a flat sequence of "
                             f"{'integers' if dtype == INT else 'numbers'}") from None
        try:
            values = np.fromiter(flat, dtype=dtype, count=len(flat))
        except OverflowError:
            raise ValueError("rows: an integer outside int64") from None
        values.flags.writeable = False
        return cls(values, lengths)

    @classmethod
    def from_table(cls, table: np.ndarray) -> Ragged:
        """The rows of an (n, T) array of float64 or int64, every row whole (fixed-shape
        generation): its values as they lie, when nothing can write them, else one copy."""
        table = np.asarray(table)
        if table.ndim != 2:
            raise ValueError(f"table: expected an (n, T) array, got shape {table.shape}")
        rows, width = table.shape
        return cls(table.reshape(-1), (width,) * rows)

    @classmethod
    def from_padded(cls, values: np.ndarray, mask: np.ndarray) -> Ragged:
        """The rows of `values` (n, T) under a mask whose True entries lead each row."""
        values = np.asarray(values)
        mask = np.asarray(mask, dtype=bool)
        if values.ndim != 2 or mask.shape != values.shape:
            raise ValueError(f"values {values.shape} and mask {mask.shape}: expected two "
                             f"2-D arrays of one shape")
        dtype = INT if values.dtype.kind in "iu" else FLOAT
        lengths = mask.sum(axis=1)
        flat = np.ascontiguousarray(values[mask], dtype=dtype)
        flat.flags.writeable = False
        return cls(flat, lengths.tolist())

    def unpadded(self, values: np.ndarray, mask: np.ndarray | None = None) -> Ragged:
        """The rows of `values`, an (n, T) float64 array shaped as `padded()` pads this one, cut
        to this one's row lengths: what `from_padded(values, mask)` gives with the mask of
        `padded()` (or `mask`, that mask when the caller holds it), without counting the mask
        or checking the lengths again."""
        values = np.asarray(values, dtype=FLOAT)
        lengths = self.lengths
        uniform = self.uniform()
        width = lengths[0] if uniform else max(lengths, default=0)
        if values.shape != (len(lengths), width):
            raise ValueError(f"values: expected shape {(len(lengths), width)}, got "
                             f"{values.shape}")
        if uniform:
            flat = values.reshape(-1).copy()
        else:
            flat = values[np.arange(width) < np.asarray(lengths)[:, None] if mask is None
                          else mask]
        flat.flags.writeable = False
        rows = object.__new__(Ragged)
        for name, value in (("values", flat), ("lengths", lengths), ("_starts", self._starts),
                            ("_hash", None)):
            object.__setattr__(rows, name, value)
        return rows

    # -- reading ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.lengths)

    def row(self, index: int) -> np.ndarray:
        """Row `index` as a read-only view."""
        start = int(self.starts()[index])
        return self.values[start:start + self.lengths[index]]

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        return tuple(self.row(index).tolist())

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.rows())

    def rows(self) -> tuple[tuple[Any, ...], ...]:
        """Every row as a tuple of Python numbers (what the value stands for)."""
        if self.uniform():
            width = self.lengths[0]
            if width == 0:
                return ((),) * len(self.lengths)
            return tuple(map(tuple, self.values.reshape(len(self.lengths), width).tolist()))
        flat, out, start = self.values.tolist(), [], 0
        for length in self.lengths:
            out.append(tuple(flat[start:start + length]))
            start += length
        return tuple(out)

    def starts(self) -> np.ndarray:
        """Where each row begins in `values`."""
        if self._starts is None:
            starts = np.zeros(len(self.lengths), dtype=np.int64)
            if len(self.lengths) > 1:
                np.cumsum(self.lengths[:-1], out=starts[1:])
            starts.flags.writeable = False
            object.__setattr__(self, "_starts", starts)
        assert self._starts is not None
        return self._starts

    def uniform(self) -> bool:
        """Every row has the same length (fixed-shape generation: the common case)."""
        lengths = self.lengths
        return bool(lengths) and lengths.count(lengths[0]) == len(lengths)

    def padded(self) -> tuple[np.ndarray, np.ndarray]:
        """(values (n, T), mask (n, T)), T the longest row: row i's values lead row i, 0 under
        a False mask. Rows of one length are a read-only view, with no copy."""
        n = len(self.lengths)
        if self.uniform():
            shape = (n, self.lengths[0])
            return self.values.reshape(shape), np.ones(shape, dtype=bool)
        mask = np.arange(max(self.lengths, default=0)) < np.asarray(self.lengths)[:, None]
        return self.padded_values(mask), mask

    def padded_values(self, mask: np.ndarray | None) -> np.ndarray:
        """`padded()[0]`, given `padded()[1]` (None when every row has one length): the
        caller's mask, counted once for the many matrices of these row lengths."""
        if mask is None:
            return self.values.reshape(len(self.lengths), -1)
        values = np.zeros(mask.shape, dtype=self.values.dtype)
        values[mask] = self.values
        return values

    def take(self, rows: Sequence[int] | np.ndarray) -> Ragged:
        """The rows at `rows`, in that order: one gather (of the table's rows, when every row
        has the same length), no Python loop over rows."""
        picked = np.asarray(rows, dtype=np.int64).reshape(-1)
        if not len(picked):
            return Ragged(self.values[:0], ())
        if self.uniform():
            width = self.lengths[0]
            values = self.values.reshape(len(self.lengths), width)[picked].reshape(-1)
            values.flags.writeable = False
            return Ragged(values, (width,) * len(picked))
        lengths = np.asarray(self.lengths, dtype=np.int64)[picked]
        # Value j of the result comes from the start of its row plus its offset in the row.
        ends = np.cumsum(lengths)
        firsts = np.repeat(self.starts()[picked] - (ends - lengths), lengths)
        values = self.values[firsts + np.arange(int(ends[-1]))]
        values.flags.writeable = False
        return Ragged(values, lengths.tolist())

    @classmethod
    def concatenate(cls, parts: Sequence[Ragged]) -> Ragged:
        """The rows of `parts` (one at least, all of one dtype), one after the other."""
        if len({part.values.dtype for part in parts}) != 1:
            raise ValueError("parts: expected at least one, all of one dtype")
        if len(parts) == 1:
            return parts[0]
        values = np.concatenate([part.values for part in parts])
        values.flags.writeable = False
        return cls(values, tuple(itertools.chain.from_iterable(p.lengths for p in parts)))

    def tobytes(self) -> bytes:
        """The values' little-endian bytes, back to back (digests and the wire use these)."""
        return self.values.tobytes()

    # -- a value ----------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Ragged):
            return NotImplemented
        return (self.values.dtype == other.values.dtype and self.lengths == other.lengths
                and self.values.tobytes() == other.values.tobytes())

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(self, "_hash", hash((self.values.dtype.char, self.lengths,
                                                   self.values.tobytes())))
        assert self._hash is not None
        return self._hash

    def __repr__(self) -> str:
        kind = ", INT" if self.values.dtype == INT else ""
        return f"Ragged.of({self.rows()!r}{kind})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Ragged, (self.values, self.lengths))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Ragged is immutable: cannot set {name}")


def read_only(values: np.ndarray) -> np.ndarray:
    """`values` if neither it nor any array it views can be written (immutable memory is
    shared as is), else a read-only copy: no one holding the source can change a value after
    the fact."""
    if _frozen(values):
        return values
    values = values.copy()
    values.flags.writeable = False
    return values


def _frozen(values: np.ndarray) -> bool:
    """A read-only array none of whose bases can be written either."""
    base: Any = values
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return False
        base = base.base
    return base is None or isinstance(base, bytes)


_INT_TYPE = frozenset({int})
INTEGER_TYPES = frozenset({int, np.int64})
"""What an int64 column or row may be made of: no bool, no float to truncate."""
NUMBER_TYPES = frozenset({int, float, np.int64, np.float64})
"""What a float64 column or row may be made of: no bool, no string for numpy to parse."""


def _flat_of(row: Any, allowed: frozenset[type]) -> bool:
    try:
        return set(map(type, row)) <= allowed
    except TypeError:
        return False
