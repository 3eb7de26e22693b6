"""The visited set as a compact table of 64-bit fingerprints (TLC's `FPSet`).

A Python dict ``fingerprint -> parent`` costs ~70-80 bytes per state (a 36-byte int object per
key, 35-42 bytes of entry and index).  This table keeps one numpy ``uint64`` array instead, in
open addressing with linear probing: 8 bytes a slot, at a load between 3/8 and 3/4 (the table
doubles past 3/4), so 11-22 bytes per state.  The parents are not here: as TLC does, the
sequential search appends them to a file (`checker.statefiles.ParentLog`) and reads a
counterexample's chain back from it.

The breadth-first hot loop does not look states up one by one (a numpy scalar access from
Python costs more than a dict lookup): it gathers the fingerprints its chunk generates and
hands them over in one `add_new` call, which dedups and inserts them vectorised and says which
were new, in the order they were met, so that the first discovery of a state is the one the
dict gave.

Fingerprints are Python ints, in one of two domains a search never mixes (see
`checker.fingerprint`): Python's hash, signed (`signed`), or stable ones and int keys,
unsigned below 2**64.  Both are stored as their 64-bit pattern (`patterns`) and read back in
their domain (`values`).  Slot value 0 marks an empty slot, so fingerprint 0 is kept aside
(`_zero_seen`).
"""

from __future__ import annotations

from collections.abc import Iterator

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
    """A set of fingerprints in one numpy array (see the module docstring)."""

    def __init__(self, signed: bool, capacity: int = 0) -> None:
        self.signed = signed
        self._in_dtype = np.int64 if signed else np.uint64
        bits = _MIN_BITS
        while (1 << bits) * _MAX_LOAD < capacity:
            bits += 1
        self._alloc(bits)
        self._count = 0
        self._zero_seen = False

    def _alloc(self, bits: int) -> None:
        self._bits = bits
        self._mask = np.uint64((1 << bits) - 1)
        self._shift = np.uint64(64 - bits)
        self._keys = np.zeros(1 << bits, dtype=np.uint64)
        self._limit = int((1 << bits) * _MAX_LOAD)

    # -- sizes -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._count + self._zero_seen

    @property
    def nbytes(self) -> int:
        """The memory the table holds (its array)."""
        return self._keys.nbytes

    # -- conversions between Python ints and the stored 64-bit patterns ---------------------

    def patterns(self, values: list[int]) -> np.ndarray:
        """The 64-bit patterns of fingerprints in this set's domain."""
        return np.array(values, dtype=self._in_dtype).view(np.uint64)

    def values(self, patterns: np.ndarray) -> list[int]:
        """The fingerprints, in this set's domain, of 64-bit patterns."""
        return list(patterns.view(self._in_dtype).tolist())

    # -- the batch insertion of the hot loop ------------------------------------------------

    def add_new(self, fps: list[int]) -> list[int]:
        """Insert the fingerprints of `fps` not yet in the table; return their indices in
        `fps`, ascending (the first one's, for a fingerprint given twice): the states met for
        the first time, in the order they were met."""
        if not fps:
            return []
        return self.add_new_patterns(self.patterns(fps)).tolist()

    def add_new_patterns(self, keys: np.ndarray) -> np.ndarray:
        """`add_new` for the 64-bit patterns `keys`: the new ones' indices, ascending."""
        # the first occurrence of each fingerprint in the batch
        uniq, first = np.unique(keys, return_index=True)
        zero = uniq == _EMPTY
        zero_new = None
        if zero.any():
            if not self._zero_seen:
                self._zero_seen = True
                zero_new = first[zero]
            keep = ~zero
            uniq, first = uniq[keep], first[keep]
        new = first[:0]
        if len(uniq):
            if self._count + len(uniq) > self._limit:
                self._grow(self._count + len(uniq))
            new = first[self._insert(uniq, first)]
        if zero_new is not None:
            new = np.concatenate([new, zero_new])
        return np.sort(new)

    def _insert(self, keys: np.ndarray, order: np.ndarray) -> np.ndarray:
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
                fresh[won] = True
                self._count += len(won)
            settled = found.copy()
            if len(claim):
                settled[empty] = np.isin(todo[empty], won)
            todo = todo[~settled]
            slot[todo] = (slot[todo] + np.uint64(1)) & mask
        return fresh

    def _grow(self, needed: int) -> None:
        keys = self._keys[self._keys != _EMPTY]
        bits = self._bits + 1
        while (1 << bits) * _MAX_LOAD < needed:
            bits += 1
        self._alloc(bits)
        self._count = 0
        self._insert(keys, np.arange(len(keys)))

    # -- membership, one at a time ----------------------------------------------------------

    def __contains__(self, fp: object) -> bool:
        if not isinstance(fp, int):
            return False
        if fp == 0:
            return self._zero_seen
        key = self.patterns([fp])[0]
        slot = (int(key) * _MIX_INT & _MASK64) >> (64 - self._bits)
        table, mask = self._keys, int(self._mask)
        while True:
            at = table[slot]
            if at == key:
                return True
            if at == _EMPTY:
                return False
            slot = (slot + 1) & mask

    def __iter__(self) -> Iterator[int]:
        yield from self.values(self._keys[self._keys != _EMPTY])
        if self._zero_seen:
            yield 0
