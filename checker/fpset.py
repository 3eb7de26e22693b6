"""The visited set as a compact table of 64-bit fingerprints with their parents (TLC's `FPSet`).

A Python dict ``fingerprint -> parent`` costs ~70-80 bytes per state (a 36-byte int object per
key, 35-42 bytes of entry and index).  This table keeps two numpy ``uint64`` arrays instead,
the fingerprints and their parents' fingerprints, in open addressing with linear probing:
16 bytes a slot, at a load between 3/8 and 3/4 (the table doubles past 3/4), so 21-43 bytes
per state.

The breadth-first hot loop does not look states up one by one (a numpy scalar access from
Python costs more than a dict lookup): it gathers the fingerprints its chunk generates and
hands them over in one `add_new` call, which dedups and inserts them vectorised and says which
were new, in the order they were met, so that the first discovery of a state, and its parent,
are the ones the dict gave.  The mapping methods (``in``, ``[]``, `get`, `items`) serve the
rest: traces, checkpoints.

Fingerprints are Python ints, in one of two domains a search never mixes (see
`checker.fingerprint`): Python's hash, signed (`signed`), or stable ones and int keys,
unsigned below 2**64.  Both are stored as their 64-bit pattern and read back in their domain.
Slot value 0 marks an empty slot, so fingerprint 0 is kept aside (`_zero_parent`).  An
initial state's parent (`NO_PARENT`) is stored as the state's own fingerprint: no state found
by the search is its own parent (it was visited before its successor was generated).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

__all__ = ["NO_PARENT", "FingerprintSet"]

NO_PARENT = -1  # the parent of an initial state (the engine's mark)

_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the high bits of fp * this
_MIX_INT = int(_MIX)
_MASK64 = (1 << 64) - 1
_EMPTY = np.uint64(0)
_MIN_BITS = 10
_MAX_LOAD = 0.75


class FingerprintSet:
    """Fingerprint -> parent fingerprint, in two numpy arrays (see the module docstring)."""

    def __init__(self, signed: bool, capacity: int = 0) -> None:
        self.signed = signed
        self._in_dtype = np.int64 if signed else np.uint64
        bits = _MIN_BITS
        while (1 << bits) * _MAX_LOAD < capacity:
            bits += 1
        self._alloc(bits)
        self._count = 0
        self._zero_parent: int | None = None  # the parent of fingerprint 0, when visited

    def _alloc(self, bits: int) -> None:
        self._bits = bits
        self._mask = np.uint64((1 << bits) - 1)
        self._shift = np.uint64(64 - bits)
        self._keys = np.zeros(1 << bits, dtype=np.uint64)
        self._parents = np.zeros(1 << bits, dtype=np.uint64)
        self._limit = int((1 << bits) * _MAX_LOAD)

    @classmethod
    def from_items(cls, items: Iterable[tuple[int, int]], signed: bool) -> FingerprintSet:
        pairs = list(items)
        table = cls(signed, len(pairs))
        if pairs:
            table.add_new([g for g, _p in pairs],
                          [g if p == NO_PARENT else p for g, p in pairs])
        return table

    # -- sizes -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._count + (self._zero_parent is not None)

    @property
    def nbytes(self) -> int:
        """The memory the table holds (both arrays)."""
        return self._keys.nbytes + self._parents.nbytes

    # -- conversions between Python ints and the stored 64-bit patterns ---------------------

    def _pattern(self, values: list[int]) -> np.ndarray:
        return np.array(values, dtype=self._in_dtype).view(np.uint64)

    def _value(self, pattern: np.uint64) -> int:
        v = int(pattern)
        return v - (1 << 64) if self.signed and v >= 1 << 63 else v

    # -- the batch insertion of the hot loop ------------------------------------------------

    def add_new(self, fps: list[int], parents: list[int]) -> list[int]:
        """Insert the fingerprints of `fps` not yet in the table, each with its parent in
        `parents` (the first one's, for a fingerprint given twice; an initial state's own
        fingerprint, for `NO_PARENT`); return their indices in `fps`, ascending: the states
        met for the first time, in the order they were met."""
        n = len(fps)
        if n == 0:
            return []
        keys = self._pattern(fps)
        # the first occurrence of each fingerprint in the batch
        uniq, first = np.unique(keys, return_index=True)
        zero = uniq == _EMPTY
        zero_new: list[int] = []
        if zero.any():
            i = int(first[zero][0])
            if self._zero_parent is None:
                self._zero_parent = parents[i]
                zero_new = [i]
            keep = ~zero
            uniq, first = uniq[keep], first[keep]
        if len(uniq):
            if self._count + len(uniq) > self._limit:
                self._grow(self._count + len(uniq))
            fresh = self._insert(uniq, self._pattern(parents)[first], first)
            new = np.sort(first[fresh])
            out: list[int] = new.tolist()
        else:
            out = []
        if zero_new:
            out = sorted(out + zero_new)
        return out

    def _insert(self, keys: np.ndarray, parents: np.ndarray, order: np.ndarray) -> np.ndarray:
        """Insert the distinct, non-zero `keys` absent from the table; a mask of those that
        were absent.  Two absent keys probing to one empty slot: the one first in `order`
        takes it, the other probes on."""
        table, mask = self._keys, self._mask
        slot = (keys * _MIX) >> self._shift
        fresh = np.zeros(len(keys), dtype=bool)
        todo = np.arange(len(keys))
        while len(todo):
            at = table[slot[todo]]
            found = at == keys[todo]
            empty = at == _EMPTY
            # absent keys at an empty slot: the first (in `order`) of each slot claims it
            claim = todo[empty]
            if len(claim):
                claim = claim[np.argsort(order[claim], kind="stable")]
                _, winners = np.unique(slot[claim], return_index=True)
                won = claim[winners]
                table[slot[won]] = keys[won]
                self._parents[slot[won]] = parents[won]
                fresh[won] = True
                self._count += len(won)
            settled = found.copy()
            if len(claim):
                settled[empty] = np.isin(todo[empty], won)
            todo = todo[~settled]
            slot[todo] = (slot[todo] + np.uint64(1)) & mask
        return fresh

    def _grow(self, needed: int) -> None:
        used = self._keys != _EMPTY
        keys, parents = self._keys[used], self._parents[used]
        bits = self._bits + 1
        while (1 << bits) * _MAX_LOAD < needed:
            bits += 1
        self._alloc(bits)
        self._count = 0
        self._insert(keys, parents, np.arange(len(keys)))

    # -- the mapping side: traces, checkpoints ----------------------------------------------

    def _slot_of(self, fp: int) -> int | None:
        key = self._pattern([fp])[0]
        slot = (int(key) * _MIX_INT & _MASK64) >> (64 - self._bits)
        table, mask = self._keys, int(self._mask)
        while True:
            at = table[slot]
            if at == key:
                return slot
            if at == _EMPTY:
                return None
            slot = (slot + 1) & mask

    def __contains__(self, fp: object) -> bool:
        if not isinstance(fp, int):
            return False
        if fp == 0:
            return self._zero_parent is not None
        return self._slot_of(fp) is not None

    def get(self, fp: int, default: Any = None) -> Any:
        if fp == 0:
            p = self._zero_parent
            return default if p is None else (NO_PARENT if p == 0 else p)
        slot = self._slot_of(fp)
        if slot is None:
            return default
        parent = self._parents[slot]
        return NO_PARENT if parent == self._keys[slot] else self._value(parent)

    def __getitem__(self, fp: int) -> int:
        """The parent of `fp` (`NO_PARENT` for an initial state)."""
        parent = self.get(fp, self)
        if parent is self:
            raise KeyError(fp)
        return int(parent)

    def __setitem__(self, fp: int, parent: int) -> None:
        if fp not in self:
            self.add_new([fp], [fp if parent == NO_PARENT else parent])

    def items(self) -> Iterator[tuple[int, int]]:
        used = self._keys != _EMPTY
        keys = self._keys[used].view(self._in_dtype).tolist()
        parents = self._parents[used]
        roots = parents == self._keys[used]
        values = parents.view(self._in_dtype).tolist()
        for g, p, r in zip(keys, values, roots.tolist()):
            yield g, (NO_PARENT if r else p)
        if self._zero_parent is not None:
            p = self._zero_parent
            yield 0, (NO_PARENT if p == 0 else p)

    def __iter__(self) -> Iterator[int]:
        return (g for g, _p in self.items())
