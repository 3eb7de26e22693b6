"""What the sequential breadth-first search keeps on disk, in a ``states/`` folder (as TLC).

* `ParentLog` – the parent pointers: a ``(fingerprint, parent fingerprint)`` record per
  visited state, appended in discovery order to ``parents.bin`` (TLC's trace file), so that
  memory holds the fingerprints alone (`VisitedStates`: a `checker.fpset.FingerprintSet` and
  the log).  A counterexample's chain is read back from the end of the file: a state's
  parent was discovered before it, so each step of the chain looks further back.
* `LevelQueue` – one level of the frontier, ``(state, fingerprint)`` pairs in discovery
  order: past a budget of states in memory, they are pickled to a file in blocks and read
  back in order when the level is expanded.
* `StatesDirectory` – the search's folder, ``<work dir>/states/<time>-<random>/``, removed
  when the search's result is built (or the search fails).
"""

from __future__ import annotations

import os
import pickle
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from enum import Enum
from pathlib import Path
from types import BuiltinFunctionType, FunctionType, ModuleType
from typing import Any

import numpy as np

from checker.fpset import NO_PARENT, FingerprintSet

__all__ = ["LevelQueue", "ParentLog", "StatesDirectory", "VisitedStates", "estimate_pair_bytes"]

_RECORD = np.dtype([("fp", "<u8"), ("parent", "<u8")])  # a parent log record: 16 bytes
_BUFFERED_RECORDS = 1 << 14  # records kept in memory before they are written (256 KiB)
_READ_RECORDS = 1 << 16  # records read at a time when a chain is followed back
SPILL_BLOCK = 4096  # states pickled together when a level spills: what is read back at once


class StatesDirectory:
    """The search's folder for its files: ``<work_dir>/states/<time>-<random>/`` (a fresh
    temporary work dir when `work_dir` is None).  `remove` deletes it, the work dir too when
    it was made here, and ``states/`` when nothing else is left in it."""

    def __init__(self, work_dir: str | os.PathLike[str] | None) -> None:
        self._made_work_dir = work_dir is None
        base = Path(tempfile.mkdtemp(prefix="invar-check-") if work_dir is None else work_dir)
        self._base = base
        root = base / "states"
        root.mkdir(parents=True, exist_ok=True)
        self.path = Path(tempfile.mkdtemp(prefix=time.strftime("%Y-%m-%d-%H-%M-%S-"), dir=root))

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._made_work_dir:
            shutil.rmtree(self._base, ignore_errors=True)
            return
        try:
            (self._base / "states").rmdir()
        except OSError:
            pass  # another search's files, or the user's


class ParentLog:
    """``(fingerprint, parent)`` records as 64-bit patterns, appended in discovery order to
    `path` (see the module docstring); an initial state's parent is recorded as itself.
    Fingerprints are given and read back in the domain of `table` (`FingerprintSet`)."""

    def __init__(self, path: Path, table: FingerprintSet) -> None:
        self.path = path
        self._table = table
        self._file = open(path, "w+b")  # noqa: SIM115 - open while the search runs
        self._buffer: list[np.ndarray] = []
        self._buffered = 0
        self._written = 0
        # fingerprint pattern -> the record index its record is before (its child's)
        self._before: dict[int, int] = {}

    def __len__(self) -> int:
        return self._written + self._buffered

    @property
    def disk_bytes(self) -> int:
        return self._written * _RECORD.itemsize

    @property
    def buffer_bytes(self) -> int:
        """The most the records not yet written hold in memory."""
        return _BUFFERED_RECORDS * _RECORD.itemsize

    def append(self, fps: np.ndarray, parents: np.ndarray) -> None:
        """Record the states of patterns `fps`, discovered in that order, with theirs parents'."""
        records = np.empty(len(fps), dtype=_RECORD)
        records["fp"] = fps
        records["parent"] = parents
        self._buffer.append(records)
        self._buffered += len(records)
        if self._buffered >= _BUFFERED_RECORDS:
            self.flush()

    def flush(self) -> None:
        if self._buffer:
            self._file.seek(0, os.SEEK_END)
            self._file.write(np.concatenate(self._buffer).tobytes())
            self._file.flush()  # read back with `os.pread`, past Python's buffer
            self._written += self._buffered
            self._buffer, self._buffered = [], 0

    def _read(self, lo: int, hi: int) -> np.ndarray:
        size = _RECORD.itemsize
        data = os.pread(self._file.fileno(), (hi - lo) * size, lo * size)
        return np.frombuffer(data, dtype=_RECORD)

    def _find(self, key: int, lo: int, hi: int) -> tuple[int, int] | None:
        """The index and parent pattern of the record of `key` among records [lo, hi),
        searched from the last backwards."""
        while hi > lo:
            start = max(lo, hi - _READ_RECORDS)
            block = self._read(start, hi)
            at = np.flatnonzero(block["fp"] == np.uint64(key))
            if len(at):
                i = int(at[-1])
                return start + i, int(block["parent"][i])
            hi = start
        return None

    def parent_of(self, fp: int) -> int:
        """The parent of `fp` (`NO_PARENT` for an initial state); KeyError if not recorded.
        Read from the end of the file, or, following a chain, from the child's record back:
        a chain costs one pass over the file at most."""
        self.flush()
        key = int(self._table.patterns([fp])[0])
        end = self._before.get(key, self._written)
        found = self._find(key, 0, end) or self._find(key, end, self._written)
        if found is None:
            raise KeyError(fp)
        index, parent = found
        if parent == key:
            return NO_PARENT
        self._before[parent] = index
        return self._table.values(np.array([parent], dtype=np.uint64))[0]

    def parents_of(self, fps: list[int]) -> dict[int, int]:
        """The parent of each of `fps` (their last records), in one pass from the end."""
        self.flush()
        table = self._table
        wanted = np.unique(table.patterns(fps))
        found: dict[int, int] = {}
        hi = self._written
        while hi > 0 and len(found) < len(wanted):
            lo = max(0, hi - _READ_RECORDS)
            block = self._read(lo, hi)[::-1]
            hits = block[np.isin(block["fp"], wanted)]
            for g, p, root in zip(table.values(hits["fp"]), table.values(hits["parent"]),
                                  (hits["fp"] == hits["parent"]).tolist()):
                found.setdefault(g, NO_PARENT if root else p)
            hi = lo
        missing = set(fps) - found.keys()
        if missing:
            raise KeyError(min(missing))
        return found

    def items(self) -> Iterator[tuple[int, int]]:
        """Every ``(fingerprint, parent)``, in discovery order (`NO_PARENT` for the roots)."""
        self.flush()
        for lo in range(0, self._written, _READ_RECORDS):
            block = self._read(lo, min(self._written, lo + _READ_RECORDS))
            roots = (block["fp"] == block["parent"]).tolist()
            fps = self._table.values(block["fp"])
            parents = self._table.values(block["parent"])
            for g, p, root in zip(fps, parents, roots):
                yield g, (NO_PARENT if root else p)

    def close(self) -> None:
        self._file.close()


class VisitedStates:
    """The sequential search's visited set: the fingerprints in memory (`table`), their
    parents on disk (`parents`).  `add_new` is the hot loop's one call per chunk."""

    def __init__(self, signed: bool, directory: Path, capacity: int = 0) -> None:
        self.table = FingerprintSet(signed, capacity)
        self.parents = ParentLog(directory / "parents.bin", self.table)

    @classmethod
    def from_items(cls, items: Iterable[tuple[int, int]], signed: bool,
                   directory: Path) -> VisitedStates:
        """The visited set of ``(fingerprint, parent)`` pairs (a checkpoint's, or the
        initial states with `NO_PARENT`)."""
        pairs = list(items)
        visited = cls(signed, directory, len(pairs))
        if pairs:
            visited.add_new([g for g, _p in pairs], [g if p == NO_PARENT else p for g, p in pairs])
        return visited

    def __len__(self) -> int:
        return len(self.table)

    def __contains__(self, fp: object) -> bool:
        return fp in self.table

    def add_new(self, fps: list[int], parents: list[int]) -> list[int]:
        """Insert the fingerprints of `fps` not yet visited, recording each one's parent from
        `parents` (an initial state's own fingerprint for none); return their indices in
        `fps`, ascending (see `FingerprintSet.add_new`)."""
        if not fps:
            return []
        table = self.table
        keys = table.patterns(fps)
        new = table.add_new_patterns(keys)
        if len(new):
            self.parents.append(keys[new], table.patterns(parents)[new])
        return new.tolist()

    def adopt(self, fps: list[int], parents: list[int]) -> None:
        """Record the states of `fps` with the parents of `parents` (`NO_PARENT`: none),
        whether met before or not: states handed over, whose last record is then theirs."""
        if not fps:
            return
        table = self.table
        keys = table.patterns(fps)
        table.add_new_patterns(keys)
        self.parents.append(keys, table.patterns(
            [g if p == NO_PARENT else p for g, p in zip(fps, parents)]))

    def close(self) -> None:
        self.parents.close()


class LevelQueue:
    """One level of the breadth-first frontier, ``(state, fingerprint)`` pairs in discovery
    order.  The newest are in `items` (the hot loop appends to it; the list object stays the
    same); `spill_if_over` pickles them to the level's file in blocks of `SPILL_BLOCK` when
    they number more than `budget` (None: never).  Once complete, the level is read back as
    `parts`: its spilled blocks in order, then `items`."""

    def __init__(self, directory: Path, budget: int | None,
                 items: list[tuple[Any, int]] | None = None) -> None:
        self.items: list[tuple[Any, int]] = items if items is not None else []
        self.budget = budget
        self._directory = directory
        self._file: Any = None
        self._blocks: list[tuple[int, int, int]] = []  # (offset, bytes, states) of each block
        self.spilled = 0
        self.disk_bytes = 0

    def __len__(self) -> int:
        return self.spilled + len(self.items)

    def spill_if_over(self) -> None:
        if self.budget is not None and len(self.items) > self.budget:
            self._spill()

    def _spill(self) -> None:
        if self._file is None:
            fd, name = tempfile.mkstemp(prefix="level-", suffix=".pickle", dir=self._directory)
            self._file = os.fdopen(fd, "w+b")
            os.unlink(name)  # the open file is the level's: nothing to leave behind
        items = self.items
        for lo in range(0, len(items), SPILL_BLOCK):
            blob = pickle.dumps(items[lo : lo + SPILL_BLOCK], protocol=pickle.HIGHEST_PROTOCOL)
            self._file.write(blob)
            count = min(SPILL_BLOCK, len(items) - lo)
            self._blocks.append((self.disk_bytes, len(blob), count))
            self.disk_bytes += len(blob)
            self.spilled += count
        self._file.flush()
        items.clear()

    @property
    def parts(self) -> int:
        return len(self._blocks) + 1

    def part(self, k: int) -> list[tuple[Any, int]]:
        """Part `k` of the level: a spilled block read back, or (the last) `items`, handed over
        (the level no longer holds them: the search frees them as it expands them)."""
        if k == len(self._blocks):
            items, self.items = self.items, []
            return items
        return self._block(k)

    def _block(self, k: int) -> list[tuple[Any, int]]:
        offset, size, _count = self._blocks[k]
        block: list[tuple[Any, int]] = pickle.loads(os.pread(self._file.fileno(), size, offset))
        return block

    def states_from(self, k: int) -> list[tuple[Any, int]]:
        """Every state of parts `k` onwards, read back and left in place (for a checkpoint)."""
        out: list[tuple[Any, int]] = []
        for j in range(k, len(self._blocks)):
            out.extend(self._block(j))
        if k <= len(self._blocks):
            out.extend(self.items)
        return out

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


_SHARED = (type, ModuleType, FunctionType, BuiltinFunctionType, Enum)
"""What a state may reach but does not hold: classes, code, enum members (one for all)."""


def estimate_pair_bytes(sample: list[tuple[Any, int]]) -> int:
    """The memory a queued ``(state, fingerprint)`` pair holds, on average over `sample`:
    the objects it reaches (each counted once across the sample: states share parts) and
    its list slot."""
    seen: set[int] = set()
    total = 0
    stack: list[Any] = list(sample)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _SHARED):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, (tuple, list, frozenset, set)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif hasattr(obj, "__dict__"):
            stack.append(vars(obj))
        for name in getattr(type(obj), "__slots__", ()):
            if hasattr(obj, name):
                stack.append(getattr(obj, name))
    return total // max(1, len(sample)) + 8
