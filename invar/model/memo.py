"""Answers of pure functions remembered for the very objects they were computed from, and
on them: a frozen record's repr and hash (`cached_repr`).

A model checker applies the same event to the same core, the same command to the same
component, in many worlds that differ elsewhere; remembering the answer by the arguments'
identity (`is`), not their equality, is exact even where equality leaves something out (no-op
counts, payloads behind digests), and hands out the same result object each time, so results
stay shared and the memos downstream of them keep hitting.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, TypeVar

RecordType = TypeVar("RecordType", bound=type)


class IdentityMemo:
    """`lookup(first, second, value)` returns what `put(first, second, value, answer)` stored
    for those very objects (`first` and `second` compared by identity; `second` may be None)
    and an equal `value` (compared by equality: for arguments that are rebuilt each time, such
    as a fresh `TimerFired()`), or None. An entry holds its objects, so their ids cannot be
    reused while it is kept. Bounded: forgotten wholesale when full (a forgotten answer is only
    computed again)."""

    def __init__(self, kept: int = 1 << 17) -> None:
        self._kept = kept
        self._entries: dict[tuple[int, int, Hashable], tuple[Any, Any, Any]] = {}
        """`(id(first), id(second), value) -> (first, second, answer)`: an entry is its answer
        only if it holds those very objects (an id may be another object's once one is gone)."""

    def lookup(self, first: Any, second: Any = None, value: Hashable = None) -> Any:
        known = self._entries.get((id(first), id(second), value))
        if known is not None and known[0] is first and known[1] is second:
            return known[2]
        return None

    def put(self, first: Any, second: Any, value: Hashable, answer: Any) -> Any:
        """Remember `answer` for `first`, `second` and `value`; returns it."""
        if len(self._entries) >= self._kept:
            self._entries.clear()
        self._entries[(id(first), id(second), value)] = (first, second, answer)
        return answer

    def of(self, first: Any, compute: Any) -> Any:
        """`compute(first)`, computed once for this very object (the answer must not be None)."""
        known = self.lookup(first)
        if known is None:
            known = self.put(first, None, None, compute(first))
        return known

    def clear(self) -> None:
        """Forget every answer."""
        self._entries.clear()


def _memoised(attribute: str, compute: Any) -> Any:
    """A method returning `compute(self)`, kept on the (frozen) instance after the first call."""
    def method(self: Any) -> Any:
        value = self.__dict__.get(attribute)
        if value is None:
            value = compute(self)
            object.__setattr__(self, attribute, value)
        return value
    return method


def cached_repr(cls: RecordType) -> RecordType:
    """Cache a frozen dataclass's repr and hash on the instance: state digests are built from
    reprs, the checker's fingerprints from hashes, and records are shared between many states.
    (The hash is the generated one, so it still hashes by value; it is never pickled, since a
    string's hash differs between processes.)"""
    generated_hash = cls.__hash__

    def __getstate__(self: Any) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    # The dataclass repr without its guard against recursion (a set of ids kept per thread):
    # a record is an immutable value and never contains itself.
    cls.__repr__ = _memoised("_repr", getattr(cls.__repr__, "__wrapped__",  # type: ignore[method-assign]
                                              cls.__repr__))
    if generated_hash is not None:
        cls.__hash__ = _memoised("_hash", generated_hash)  # type: ignore[method-assign]
        cls.__getstate__ = __getstate__  # type: ignore[method-assign,assignment]
    return cls
