"""Answers of pure functions remembered for the very objects they were computed from.

A model checker applies the same event to the same core, the same command to the same
component, in many worlds that differ elsewhere; remembering the answer by the arguments'
identity (`is`), not their equality, is exact even where equality leaves something out (no-op
counts, payloads behind digests), and hands out the same result object each time, so results
stay shared and the memos downstream of them keep hitting.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any


class IdentityMemo:
    """`get(first, second, value)` returns what `put(first, second, value, answer)` stored for
    those very objects (`first` and `second` compared by identity; `second` may be None) and an
    equal `value` (compared by equality: for arguments that are rebuilt each time, such as a
    fresh `TimerFired()`), or None. An entry holds its objects, so their ids cannot be reused
    while it is kept. Bounded: forgotten wholesale when full (a forgotten answer is only
    computed again)."""

    def __init__(self, kept: int = 1 << 17) -> None:
        self._kept = kept
        self.entries: dict[tuple[int, int, Hashable], tuple[Any, Any, Any]] = {}
        """`(id(first), id(second), value) -> (first, second, answer)`: a hot loop may read it
        itself (an entry is its answer only if it holds those very objects), saving a call;
        the dict stays the same object (cleared, never replaced)."""

    def get(self, first: Any, second: Any = None, value: Hashable = None) -> Any:
        known = self.entries.get((id(first), id(second), value))
        if known is not None and known[0] is first and known[1] is second:
            return known[2]
        return None

    def put(self, first: Any, second: Any, value: Hashable, answer: Any) -> Any:
        """Remember `answer` for `first`, `second` and `value`; returns it."""
        if len(self.entries) >= self._kept:
            self.entries.clear()
        self.entries[(id(first), id(second), value)] = (first, second, answer)
        return answer

    def of(self, first: Any, compute: Any) -> Any:
        """`compute(first)`, computed once for this very object (the answer must not be None)."""
        known = self.get(first)
        if known is None:
            known = self.put(first, None, None, compute(first))
        return known
