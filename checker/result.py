"""What a check returns: per-property verdicts with traces, counters, coverage, optional graph."""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from checker.trace import Trace

__all__ = [
    "CheckResult",
    "Progress",
    "PropertyResult",
    "Verdict",
    "write_dot",
    "write_graphml",
]


class Verdict(enum.Enum):
    """The outcome for one property.

    * ``HOLDS``       – no violation was found (``always``/``transition``/``final``/
      ``eventually``/deadlock/livelock) or the state was reached (``sometimes``; its trace is
      then a shortest-under-BFS *witness*).  When the search was bounded
      (`CheckResult.complete` is false) this only speaks for the explored part.
    * ``VIOLATED``    – a counterexample was found; `PropertyResult.trace` holds it.
    * ``NOT_REACHED`` – a ``sometimes`` property no explored state satisfies: reported as a
      failure, so that a vacuous model is noticed.
    * ``UNKNOWN``     – not decided (e.g. a livelock check on an incomplete search).
    """

    HOLDS = "holds"
    VIOLATED = "violated"
    NOT_REACHED = "not reached"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class PropertyResult:
    """The verdict on one property (``kind`` is a `PropertyKind` value, or
    ``"deadlock"`` / ``"livelock"`` for the built-in checks)."""

    name: str
    kind: str
    verdict: Verdict
    trace: Trace[Any, Any] | None = None
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.HOLDS

    @property
    def counterexample(self) -> Trace[Any, Any] | None:
        return self.trace if self.verdict is Verdict.VIOLATED else None


@dataclass(frozen=True)
class Progress:
    """A progress snapshot handed to the `progress` callback."""

    strategy: str
    generated: int
    distinct: int
    queue: int
    depth: int
    elapsed_s: float
    done: bool = False

    @property
    def states_per_s(self) -> float:
        return self.distinct / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass
class CheckResult:
    """The result of `Checker.bfs` / `dfs` / `simulate`.

    Counters follow TLC: `states_generated` counts the initial states plus every transition
    explored (also those into already-visited states, and self-loops); `distinct_states` the
    states (fingerprints) visited; `max_depth` the largest number of transitions from an
    initial state to a visited state (TLC's "depth" is this plus one).
    `coverage` counts explored transitions per action kind (`Model.action_kind`).
    `complete` is true when the whole reachable state space (within no bound) was explored.
    `fingerprints` says which fingerprints the visited set held: ``"exact"`` (every state's
    key was an int below 2**64, its own fingerprint), ``"fast"`` (Python's hash) or
    ``"stable"`` (SHA-1; see `checker.fingerprint`); `collision_probability` is TLC's
    "calculated (optimistic)" estimate that two distinct states shared one and a state was
    missed, ``n * (g - n) / 2**64`` (`checker.fingerprint.collision_probability`; 0 when exact).
    """

    strategy: str
    properties: dict[str, PropertyResult]
    states_generated: int
    distinct_states: int
    max_depth: int
    duration_s: float
    coverage: dict[str, int]
    complete: bool
    stop_reason: str
    processes: int = 1
    recorded: Any = field(default=None, repr=False, compare=False)
    """The search's `checker.engine.GraphRecorder` when record_graph=True: see `graph`."""
    notes: list[str] = field(default_factory=list)
    fingerprints: str = "stable"
    collision_probability: float = 0.0

    @property
    def graph(self) -> Any:
        """The explored graph, a networkx.DiGraph of fingerprints, when record_graph=True
        (else None); built when first read."""
        return self.recorded.graph if self.recorded is not None else None

    @property
    def states_per_s(self) -> float:
        """Distinct states per second of search."""
        return self.distinct_states / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def ok(self) -> bool:
        """True when every property (and deadlock/livelock check) holds."""
        return all(p.ok for p in self.properties.values())

    @property
    def violations(self) -> list[PropertyResult]:
        """The failing properties (violated or not reached)."""
        return [
            p
            for p in self.properties.values()
            if p.verdict in (Verdict.VIOLATED, Verdict.NOT_REACHED)
        ]

    def verdict(self, name: str) -> Verdict:
        return self.properties[name].verdict

    def counterexample(self, name: str) -> Trace[Any, Any] | None:
        """The counterexample of property `name` (None when it was not violated)."""
        return self.properties[name].counterexample

    def witness(self, name: str) -> Trace[Any, Any] | None:
        """The trace reaching a ``sometimes`` property (None when not reached)."""
        p = self.properties[name]
        return p.trace if p.verdict is Verdict.HOLDS else None

    def write_dot(self, path: str | os.PathLike[str]) -> None:
        """Write the recorded state graph as Graphviz DOT (needs ``record_graph=True``)."""
        write_dot(self._need_graph(), path)

    def write_graphml(self, path: str | os.PathLike[str]) -> None:
        """Write the recorded state graph as GraphML (needs ``record_graph=True``)."""
        write_graphml(self._need_graph(), path)

    def _need_graph(self) -> Any:
        if self.graph is None:
            raise ValueError("no graph was recorded: run the checker with record_graph=True")
        return self.graph

    def summary(self) -> Mapping[str, Any]:
        """The headline figures as a plain mapping (for logs and JSON)."""
        return {
            "strategy": self.strategy,
            "processes": self.processes,
            "states_generated": self.states_generated,
            "distinct_states": self.distinct_states,
            "max_depth": self.max_depth,
            "duration_s": round(self.duration_s, 3),
            "states_per_s": round(self.states_per_s, 1),
            "complete": self.complete,
            "stop_reason": self.stop_reason,
            "fingerprints": self.fingerprints,
            "collision_probability": self.collision_probability,
            "properties": {n: p.verdict.value for n, p in self.properties.items()},
            "coverage": dict(self.coverage),
        }


def _dot_quote(text: Any) -> str:
    s = str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{s}"'


def write_dot(graph: Any, path: str | os.PathLike[str]) -> None:
    """A small DOT writer (pydot is not required): nodes keep their ``label``/flags,
    edges their ``label``; initial states are drawn bold, final states double-circled."""
    lines = ["digraph states {", "  node [shape=ellipse, fontsize=10];"]
    for node, data in graph.nodes(data=True):
        attrs = [f"label={_dot_quote(data.get('label', node))}"]
        if data.get("init"):
            attrs.append("style=bold")
        if data.get("final"):
            attrs.append("shape=doublecircle")
        lines.append(f"  {_dot_quote(node)} [{', '.join(attrs)}];")
    for u, v, data in graph.edges(data=True):
        label = data.get("label")
        extra = f" [label={_dot_quote(label)}]" if label else ""
        lines.append(f"  {_dot_quote(u)} -> {_dot_quote(v)}{extra};")
    lines.append("}")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")


def write_graphml(graph: Any, path: str | os.PathLike[str]) -> None:
    """GraphML through networkx (node ids are the fingerprints as decimal strings)."""
    import networkx as nx

    relabelled = nx.relabel_nodes(graph, {n: str(n) for n in graph.nodes}, copy=True)
    nx.write_graphml(relabelled, path)
