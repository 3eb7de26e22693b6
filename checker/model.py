"""The model interface: what a system under check must provide, and the properties to check.

A *model* is a nondeterministic transition system: a set of initial states, and for each state
a deterministic, ordered list of enabled actions, each leading to one next state.  States must be
hashable, picklable and immutable (frozen dataclasses, tuples, ints); they are compared through
their *fingerprint* (see `checker.fingerprint`), never by identity.

`Model` is the structural protocol the engine relies on; `BaseModel` supplies every optional
method with its default, so a concrete model only writes `init_states`, `actions`,
`next_state` and `properties`.

Properties (`Property`) come in five kinds:

* ``always(name, p)``      – invariant: ``p(s)`` holds in every reachable state;
* ``sometimes(name, p)``   – reachability: some reachable state satisfies ``p``.  A ``sometimes``
  property that is never reached is reported as **failing** (verdict ``NOT_REACHED``), so that a
  vacuous model (one that never gets anywhere interesting) is noticed;
* ``transition(name, p)``  – ``p(s, a, t)`` holds for every explored transition ``s --a--> t``
  (including transitions into already-visited states);
* ``final(name, p)``       – ``p(s)`` holds in every reachable *final* state (``is_final``);
* ``eventually(name, p)``  – every *maximal* path from an initial state contains a state
  satisfying ``p``.  A maximal path is one that ends in a final state, ends in a state without
  successors (a deadlock), or is infinite (which, in a finite state graph, means it reaches a
  cycle).  See `checker.search` for exactly how this is decided.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

__all__ = [
    "A",
    "BaseModel",
    "Model",
    "Property",
    "PropertyKind",
    "S",
    "reachable_states",
    "successors_of",
]

S = TypeVar("S")
A = TypeVar("A")


class PropertyKind(enum.Enum):
    """The temporal shape of a property."""

    ALWAYS = "always"
    SOMETIMES = "sometimes"
    TRANSITION = "transition"
    FINAL = "final"
    EVENTUALLY = "eventually"


@dataclass(frozen=True)
class Property:
    """A named property of a model; build one with the class-method constructors.

    `predicate` takes ``(state)`` for every kind but ``TRANSITION``, which takes
    ``(state, action, next_state)``.
    """

    name: str
    kind: PropertyKind
    predicate: Callable[..., bool]

    @classmethod
    def always(cls, name: str, predicate: Callable[[Any], bool]) -> Property:
        """Invariant: `predicate(state)` holds in every reachable state."""
        return cls(name, PropertyKind.ALWAYS, predicate)

    @classmethod
    def sometimes(cls, name: str, predicate: Callable[[Any], bool]) -> Property:
        """Reachability: some reachable state satisfies `predicate` (else reported failing)."""
        return cls(name, PropertyKind.SOMETIMES, predicate)

    @classmethod
    def transition(cls, name: str, predicate: Callable[[Any, Any, Any], bool]) -> Property:
        """`predicate(state, action, next_state)` holds on every explored transition."""
        return cls(name, PropertyKind.TRANSITION, predicate)

    @classmethod
    def final(cls, name: str, predicate: Callable[[Any], bool]) -> Property:
        """`predicate(state)` holds in every reachable final state (completed runs)."""
        return cls(name, PropertyKind.FINAL, predicate)

    @classmethod
    def eventually(cls, name: str, predicate: Callable[[Any], bool]) -> Property:
        """Every maximal path from an initial state contains a state satisfying `predicate`."""
        return cls(name, PropertyKind.EVENTUALLY, predicate)


@runtime_checkable
class Model(Protocol[S, A]):
    """What the engine needs from a system under check (all methods are called, none stored).

    `BaseModel` implements every method but the first three with its documented default.
    """

    def init_states(self) -> Iterable[S]:
        """The initial states (at least one; duplicates are merged)."""
        ...

    def actions(self, state: S) -> Iterable[A]:
        """The actions enabled in `state`, in a fixed, deterministic order."""
        ...

    def next_state(self, state: S, action: A) -> S | None:
        """The state after `action`; ``None`` means the action is disabled / a no-op here."""
        ...

    def properties(self) -> Sequence[Property]:
        """The properties to check (default: none)."""
        ...

    def is_final(self, state: S) -> bool:
        """True for a completed state: it is never a deadlock (default: False)."""
        ...

    def fingerprint_key(self, state: S) -> Hashable:
        """The value fingerprinted for `state` (symmetry representative / view; default: state)."""
        ...

    def format_action(self, action: A) -> str:
        """How an action is shown in traces and reports (default: repr)."""
        ...

    def action_kind(self, action: A) -> str:
        """The coverage bucket of an action (default: ``type(action).__name__``)."""
        ...


class BaseModel(Generic[S, A]):
    """Base class with the defaults of every optional `Model` method.

    Subclasses must implement `init_states`, `actions` and `next_state`, and usually
    `properties`.  `view_state` is a display-only hook used by `checker.report`.  A model may
    also override `successors` with a fused, faster generator of ``(action, next_state)``
    pairs; it must then agree exactly with `actions` + `next_state`
    (same pairs, same order, disabled actions skipped), which `check_successors` verifies.
    """

    def init_states(self) -> Iterable[S]:
        raise NotImplementedError

    def actions(self, state: S) -> Iterable[A]:
        raise NotImplementedError

    def next_state(self, state: S, action: A) -> S | None:
        raise NotImplementedError

    def properties(self) -> Sequence[Property]:
        return ()

    def is_final(self, state: S) -> bool:
        return False

    def fingerprint_key(self, state: S) -> Hashable:
        return state

    def format_action(self, action: A) -> str:
        return repr(action)

    def action_kind(self, action: A) -> str:
        return type(action).__name__

    def view_state(self, state: S) -> Any:
        """How a state is shown in traces and diffs (display only; default: the state)."""
        return state

    def successors(self, state: S) -> Iterable[tuple[A, S]]:
        """``(action, next_state)`` for every enabled action of `state`, in action order (a
        generator here; an override may return a list)."""
        next_state = self.next_state
        for action in self.actions(state):
            nxt = next_state(state, action)
            if nxt is not None:
                yield action, nxt

    def check_successors(self, state: S) -> bool:
        """True when `successors(state)` agrees with `actions` + `next_state` on `state`."""
        expected = list(BaseModel.successors(self, state))
        return list(self.successors(state)) == expected


def successors_of(model: Any) -> Callable[[Any], Iterable[tuple[Any, Any]]]:
    """The successor function of any `Model` (its own `successors` when it has one)."""
    fused = getattr(model, "successors", None)
    if fused is not None:
        return fused
    next_state = model.next_state
    actions = model.actions

    def successors(state: Any) -> Iterator[tuple[Any, Any]]:
        for action in actions(state):
            nxt = next_state(state, action)
            if nxt is not None:
                yield action, nxt

    return successors


def overrides(model: Any, name: str) -> bool:
    """True when `model` provides `name` (as a method or an instance attribute) other than
    `BaseModel`'s default; the engine then calls it, else it skips the call in its hot loop."""
    impl = getattr(model, name, None)
    if impl is None:
        return False
    func = getattr(impl, "__func__", impl)
    return func is not getattr(BaseModel, name, None)


def reachable_states(model: Any) -> list[Any]:
    """Every reachable state of `model` once, in breadth-first order, told apart by value (its
    `fingerprint_key`, in a Python set: no fingerprints).  The engine's order, without the
    engine: for tests and benchmarks of models small enough to hold in memory."""
    succ = successors_of(model)
    key = model.fingerprint_key if overrides(model, "fingerprint_key") else None
    order: list[Any] = []
    seen: set[Any] = set()
    for state in [*model.init_states()]:
        k = key(state) if key is not None else state
        if k not in seen:
            seen.add(k)
            order.append(state)
    for state in order:  # grows while it is walked: a queue
        for _action, nxt in succ(state):
            k = key(nxt) if key is not None else nxt
            if k not in seen:
                seen.add(k)
                order.append(nxt)
    return order
