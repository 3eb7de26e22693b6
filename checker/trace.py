"""Traces (paths through a model), field-wise state diffs, and JSON export of traces.

A `Trace` is a path that starts in an initial state: ``steps[0] == (None, init_state)`` and
``steps[i] == (action_i, state_i)`` where ``state_i`` is reached from ``state_{i-1}`` by
``action_i``.  A *lasso* trace (a counterexample to a liveness property) has `loop_start` set:
its last state is equivalent to (has the same fingerprint as) ``steps[loop_start]``'s state, so
``steps[loop_start + 1:]`` repeats forever.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["Trace", "diff_states", "to_jsonable", "trace_to_json"]

S = TypeVar("S")
A = TypeVar("A")


@dataclass(frozen=True)
class Trace(Generic[S, A]):
    """A path from an initial state: a tuple of ``(action, state)`` steps (see module doc)."""

    steps: tuple[tuple[A | None, S], ...]
    loop_start: int | None = None

    def __post_init__(self) -> None:
        if not self.steps:
            raise ValueError("a trace has at least its initial state")
        if self.steps[0][0] is not None:
            raise ValueError("the first step of a trace is (None, initial_state)")

    def __len__(self) -> int:
        """The number of actions (transitions) in the trace."""
        return len(self.steps) - 1

    def __iter__(self) -> Iterator[tuple[A | None, S]]:
        return iter(self.steps)

    @property
    def states(self) -> list[S]:
        return [state for _, state in self.steps]

    @property
    def actions(self) -> list[A]:
        return [action for action, _ in self.steps[1:]]  # type: ignore[misc]

    @property
    def initial_state(self) -> S:
        return self.steps[0][1]

    @property
    def last_state(self) -> S:
        return self.steps[-1][1]

    @property
    def is_lasso(self) -> bool:
        return self.loop_start is not None

    def format(
        self,
        format_action: Callable[[Any], str] = repr,
        view: Callable[[Any], Any] | None = None,
    ) -> list[str]:
        """Numbered lines: step 0 shows the initial state, later steps the action and the diff."""
        show = view or (lambda s: s)
        lines = [f"0. initial state: {show(self.steps[0][1])!r}"]
        for i in range(1, len(self.steps)):
            action, state = self.steps[i]
            before = show(self.steps[i - 1][1])
            mark = ""
            if self.loop_start is not None and i == len(self.steps) - 1:
                mark = f"  (back to state {self.loop_start}: the loop repeats from here)"
            lines.append(f"{i}. {format_action(action)}{mark}")
            diff = diff_states(before, show(state))
            lines.extend("     " + d for d in (diff or ["(no change)"]))
        return lines


def _is_dataclass_instance(x: Any) -> bool:
    return dataclasses.is_dataclass(x) and not isinstance(x, type)


def _short(x: Any, limit: int = 120) -> str:
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def diff_states(a: Any, b: Any, path: str = "") -> list[str]:
    """Field-wise differences from `a` to `b`, one line per changed leaf.

    Dataclasses of the same class are compared field by field, tuples/lists of the same length
    element by element, mappings key by key, and sets by what was added and removed;
    everything else is shown as ``path: old -> new``.  Unchanged fields are not shown.
    """
    if a == b:
        return []
    here = path or "state"
    if _is_dataclass_instance(a) and type(a) is type(b):
        out: list[str] = []
        for f in dataclasses.fields(a):
            out.extend(
                diff_states(getattr(a, f.name), getattr(b, f.name),
                            f"{path}.{f.name}" if path else f.name)
            )
        return out
    if (
        isinstance(a, (tuple, list))
        and type(a) is type(b)
        and len(a) == len(b)
        and not hasattr(a, "_fields")
    ):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out.extend(diff_states(x, y, f"{here}[{i}]"))
        return out
    if isinstance(a, tuple) and hasattr(a, "_fields") and type(a) is type(b):  # named tuple
        out = []
        for name, x, y in zip(a._fields, a, b):
            out.extend(diff_states(x, y, f"{path}.{name}" if path else name))
        return out
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out = []
        keys = list(a) + [k for k in b if k not in a]
        for k in keys:
            sub = f"{here}[{k!r}]"
            if k not in b:
                out.append(f"{sub}: removed (was {_short(a[k])})")
            elif k not in a:
                out.append(f"{sub}: added {_short(b[k])}")
            else:
                out.extend(diff_states(a[k], b[k], sub))
        return out
    if isinstance(a, (set, frozenset)) and isinstance(b, (set, frozenset)):
        added = _ordered(b - a)
        removed = _ordered(a - b)
        parts = []
        if added:
            parts.append("+" + ", +".join(_short(x) for x in added))
        if removed:
            parts.append("-" + ", -".join(_short(x) for x in removed))
        return [f"{here}: {' '.join(parts)}"]
    return [f"{here}: {_short(a)} -> {_short(b)}"]


def _ordered(items: Any) -> list[Any]:
    try:
        return sorted(items)
    except TypeError:
        return sorted(items, key=repr)


def to_jsonable(x: Any) -> Any:
    """A JSON-compatible rendering of a state or action (the default trace encoders).

    Dataclasses become objects (with a ``"_type"`` key), named tuples objects, tuples and lists
    arrays, sets sorted arrays, enums their name, mappings objects with string keys; other
    values that JSON cannot hold become their repr.
    """
    if x is None or isinstance(x, (bool, int, float, str)):
        if isinstance(x, enum.Enum):
            return x.name
        return x
    if isinstance(x, enum.Enum):
        return x.name
    if _is_dataclass_instance(x):
        out: dict[str, Any] = {"_type": type(x).__name__}
        for f in dataclasses.fields(x):
            out[f.name] = to_jsonable(getattr(x, f.name))
        return out
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return {"_type": type(x).__name__, **{k: to_jsonable(v) for k, v in zip(x._fields, x)}}
    if isinstance(x, (tuple, list)):
        return [to_jsonable(v) for v in x]
    if isinstance(x, (set, frozenset)):
        return [to_jsonable(v) for v in _ordered(x)]
    if isinstance(x, Mapping):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    return repr(x)


def trace_to_json(
    trace: Trace[Any, Any],
    encode_action: Callable[[Any], Any] | None = None,
    encode_state: Callable[[Any], Any] | None = None,
    *,
    indent: int | None = 2,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """The trace as a JSON document.

    ``{"length": n, "loop_start": i|null, "steps": [{"index": 0, "action": null, "state": ...},
    ...], **extra}``.  `encode_action` / `encode_state` map actions / states to JSON-compatible
    values (default: `to_jsonable`).
    """
    enc_a = encode_action or to_jsonable
    enc_s = encode_state or to_jsonable
    steps: list[dict[str, Any]] = []
    for i, (action, state) in enumerate(trace.steps):
        steps.append(
            {
                "index": i,
                "action": None if action is None else enc_a(action),
                "state": enc_s(state),
            }
        )
    doc: dict[str, Any] = {"length": len(trace), "loop_start": trace.loop_start, "steps": steps}
    if extra:
        doc.update(extra)
    return json.dumps(doc, indent=indent)

