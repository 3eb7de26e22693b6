"""The engine's shared vocabulary: what every search strategy and the liveness checks speak.

`checker.search` (the `Checker`), its strategies (`checker.bfs`, `checker.dfs`,
`checker.simulate`, `checker.parallel`) and `checker.liveness` all import this module and
none of them imports another strategy's, so the engine's modules form no import cycle:

* `ModelContext` – the model's functions resolved once, and the fingerprints in use;
* `Coverage`, `PropertyTracker` – transitions counted per action kind; the properties still
  open and the first discovery (`Found`) for each;
* `Outcome` – what a strategy hands back to `Checker` to become a `CheckResult`;
* `SearchOptions` – what a strategy reads from the `Checker` that runs it, with the stop rule;
  `SearchControl`, the requests it answers while it runs;
* `starting_levels`, `Housekeeping` – where a breadth-first search starts (its initial states
  or a checkpoint's levels), and when a search reports progress and writes checkpoints;
* `GraphRecorder` – the explored graph, for `record_graph` and the livelock check;
  `EdgeArrays`, the parallel search's graph for the livelock check.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from checker._expand import ExpandEnv, expander
from checker.checkpoint import Levels, resume_levels, save_levels
from checker.fingerprint import MASK64, all_hash_by_value, fast_fingerprint, fingerprint
from checker.fpset import NO_PARENT
from checker.model import Property, PropertyKind, overrides, successors_of
from checker.result import Progress
from checker.trace import Trace

__all__ = [
    "NO_PARENT",
    "Coverage",
    "EdgeArrays",
    "Found",
    "GraphRecorder",
    "Housekeeping",
    "ModelContext",
    "Outcome",
    "PropertyTracker",
    "SearchControl",
    "SearchOptions",
    "UnsafeHash",
    "starting_levels",
]


class UnsafeHash(Exception):
    """A state met during a search with fast fingerprints does not hash by value (the search
    starts again with stable ones; see `checker.fingerprint.hashes_by_value`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class Found:
    """The first discovery for one property: a violation, a witness, or a deadlock.

    `fp` is the fingerprint of the state where it was seen (for a transition property: the
    source state; `action`/`state` then hold the transition's action and target)."""

    name: str
    kind: str
    depth: int
    fp: int
    action: Any = None
    state: Any = None
    transition: bool = False
    trace: Trace[Any, Any] | None = None  # set directly by searches that keep their path


class ModelContext:
    """The model's functions, resolved once (defaults skipped) for the hot loops, and the
    fingerprints in use (`fp` computes them as the hot loops do, which inline them).

    When the initial states' keys are ints (`int_keys`), an int key below 2**64 is its own
    fingerprint, and any other key gets the stable one (never Python's hash, under which a
    large int would collide with its residue modulo 2**61 - 1); `inexact` turns true once
    such a key is met.  Otherwise every key gets `fingerprint`: ``"fast"`` (Python's hash,
    valid in this process and its forks) or ``"stable"`` (see `checker.fingerprint`)."""

    def __init__(self, model: Any, check_deadlock: bool, fingerprints: str = "stable") -> None:
        self.model = model
        self.successors = successors_of(model)
        self.key: Callable[[Any], Hashable] | None = (
            model.fingerprint_key if overrides(model, "fingerprint_key") else None
        )
        self.int_keys = self._first_key_is_int()
        self.fp_kind = "stable" if self.int_keys else fingerprints
        self.fingerprint: Callable[[Hashable], int] = (
            fast_fingerprint if self.fp_kind == "fast" else fingerprint
        )
        self.inexact = not self.int_keys
        # With fast fingerprints chosen automatically, a sample of the new states is checked
        # to hash by value (`sample_keys`); a search that meets one that does not restarts.
        self.sampling = False
        self._verified: dict[int, Any] = {}  # parts of sampled keys known to hash by value
        self.is_final: Callable[[Any], bool] | None = (
            model.is_final if overrides(model, "is_final") else None
        )
        self.kind_by_type = not overrides(model, "action_kind")
        self.action_kind: Callable[[Any], str] = (
            model.action_kind if hasattr(model, "action_kind") else (lambda a: type(a).__name__)
        )
        self.format_action: Callable[[Any], str] = getattr(model, "format_action", repr)
        self.check_deadlock = check_deadlock
        props = list(model.properties()) if hasattr(model, "properties") else []
        names = [p.name for p in props]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"duplicate property names: {sorted(dupes)}")
        if "deadlock" in names or "livelock" in names:
            raise ValueError("'deadlock' and 'livelock' are reserved property names")
        self.properties: list[Property] = props
        by = {k: [(p.name, p.predicate) for p in props if p.kind is k] for k in PropertyKind}
        self.always = by[PropertyKind.ALWAYS]
        self.sometimes = by[PropertyKind.SOMETIMES]
        self.transition = by[PropertyKind.TRANSITION]
        self.final = by[PropertyKind.FINAL]
        self.eventually = by[PropertyKind.EVENTUALLY]

    def expand_env(
        self,
        visited: Any,
        nxt_append: Callable[[Any], None],
        cov: Coverage,
        props: PropertyTracker,
    ) -> ExpandEnv:
        """What the hot loop (`checker._expand`) reads: this model's functions and the search's
        state."""
        return ExpandEnv(
            succ=self.successors,
            key=self.key,
            fp=self.fp_of_key,
            visited=visited,
            nxt_append=nxt_append,
            cov_buf=cov.buf if cov.type_buf is None else cov.type_buf,
            cov_code=cov.code,
            cov_new_code=cov.new_code,
            props=props,
            is_final=self.is_final,
        )

    def expander(
        self, cov: Coverage, props: PropertyTracker, *, check_new: bool, graph: bool = False,
        graph_pairs: bool = False, batch: bool = False,
    ) -> Callable[[list[tuple[Any, int]], int, ExpandEnv], int]:
        """The hot loop specialised for this model and the properties still open."""
        return expander(
            coverage=cov.enabled,
            coverage_types=cov.type_buf is not None,
            transition=bool(props.transition),
            key=self.key is not None,
            int_keys=self.int_keys,
            fast=self.fp_kind == "fast",
            check_new=check_new,
            always=len(props.always) if check_new else -1,
            sometimes=len(props.sometimes) if check_new else -1,
            final=self.is_final is not None,
            deadlock=props.deadlock,
            graph=graph,
            graph_pairs=graph_pairs,
            batch=batch,
        )

    def fp(self, state: Any) -> int:
        """The fingerprint of `state` (outside the hot loops, which inline it)."""
        key = self.key
        k = key(state) if key is not None else state
        if self.int_keys and k.__class__ is int and -1 < k <= MASK64:
            return k
        self.inexact = True
        return self.fingerprint(k)

    def fp_of_key(self, k: Any) -> int:
        """The hot loops' fingerprint of a key they do not inline (see `fp`)."""
        self.inexact = True
        return self.fingerprint(k)

    def sample_keys(self, items: list[Any], start: int, at: int = 0) -> None:
        """Check that the first and the last of the states ``items[i][at]`` added since
        ``i = start`` hash by value; raise `UnsafeHash` if one does not.  (Two per chunk of
        256 expansions: a walk through a large state costs microseconds.)"""
        if len(items) <= start or not self.sampling:
            return
        key = self.key
        picks = (items[start][at], items[-1][at])
        problem = all_hash_by_value((key(s) if key is not None else s for s in picks),
                                    self._verified)
        if problem is not None:
            raise UnsafeHash(problem)

    def initial(self) -> list[tuple[Any, int]]:
        """The initial states with their fingerprints, duplicates (by fingerprint) dropped."""
        seen: set[int] = set()
        out = []
        for s in self.model.init_states():
            g = self.fp(s)
            if g not in seen:
                seen.add(g)
                out.append((s, g))
        return out

    def _first_key_is_int(self) -> bool:
        """True when the initial states' fingerprint keys are ints (enables a fast path)."""
        key = self.key
        for s in self.model.init_states():
            k = key(s) if key is not None else s
            return k.__class__ is int
        return False

    def final_state(self, state: Any) -> bool:
        return self.is_final(state) if self.is_final is not None else False

    def replay(self, chain: list[int]) -> list[tuple[Any, Any]]:
        """The concrete steps along a chain of fingerprints starting at an initial state."""
        inits = {g: s for s, g in self.initial()}
        try:
            state = inits[chain[0]]
        except KeyError:
            raise RuntimeError(
                "trace replay failed: no initial state has the recorded fingerprint"
            ) from None
        steps: list[tuple[Any, Any]] = [(None, state)]
        fp = self.fp
        for want in chain[1:]:
            for action, nxt in self.successors(state):
                if fp(nxt) == want:
                    steps.append((action, nxt))
                    state = nxt
                    break
            else:
                raise RuntimeError(
                    "trace replay failed: the model is not deterministic (a recorded successor "
                    "is not produced again from the same state)"
                )
        return steps


class Coverage:
    """Counts explored transitions per action kind.

    The hot loops only append to a buffer; `flush` folds the buffer into counts in C, keyed
    by action type when the model keeps the default `action_kind` (``type(action).__name__``),
    else by `Model.action_kind`.  Two buffers: `buf` holds actions (the depth-first search and
    the simulation append to it through `append`); `type_buf`, when counting by type, a small
    int per transition, the code of its action's type (`code`, `new_code`): the breadth-first
    loop appends it, so that the action is freed with its transition rather than kept until
    the flush, and the flush counts each code's bytes (``bytes.count``) instead of a dict
    update per transition.
    """

    def __init__(self, ctx: ModelContext, enabled: bool = True) -> None:
        self.enabled = enabled
        self._buf: list[Any] = []
        self.buf: list[Any] | None = self._buf if enabled else None
        self.append: Callable[[Any], None] | None = self._buf.append if enabled else None
        self._counts: Counter[Any] = Counter()
        self._by_type = ctx.kind_by_type
        self._codes: list[int] = []
        self.type_buf: list[int] | None = self._codes if enabled and self._by_type else None
        self.code: dict[type, int] = {}  # action type -> its code in `type_buf`
        self._types: list[type] = []  # code -> action type
        self._kind = ctx.action_kind

    def new_code(self, cls: type) -> int:
        """The code of action type `cls`, given when the hot loop first meets it."""
        code = self.code.get(cls)
        if code is None:
            code = self.code[cls] = len(self._types)
            self._types.append(cls)
        return code

    def flush(self) -> None:
        codes = self._codes
        if codes:
            types = self._types
            try:
                data = bytes(codes)  # a ValueError past 256 types
            except ValueError:
                self._counts.update({types[c]: n for c, n in Counter(codes).items()})
            else:  # every code below 256 then
                for c, cls in enumerate(types[:256]):
                    n = data.count(c)
                    if n:
                        self._counts[cls] += n
            codes.clear()
        buf = self._buf
        if buf:
            # Counted in a fresh Counter first: its counts stay small ints (cached up to 256),
            # while adding one at a time to the running totals allocates an int per transition.
            if self._by_type:
                self._counts.update(Counter(map(type, buf)))
            else:
                # The model's kinds: each distinct action asked once (equal actions are of
                # one kind), the actions counted in C; unhashable ones asked one by one.
                try:
                    counted = Counter(buf)
                except TypeError:
                    self._counts.update(Counter(map(self._kind, buf)))
                else:
                    kinds: Counter[Any] = Counter()
                    kind = self._kind
                    for action, n in counted.items():
                        kinds[kind(action)] += n
                    self._counts.update(kinds)
            buf.clear()

    def kinds(self) -> dict[str, int]:
        self.flush()
        if not self._by_type:
            return dict(self._counts)
        out: dict[str, int] = {}
        for cls, n in self._counts.items():
            out[cls.__name__] = out.get(cls.__name__, 0) + n
        return out


class PropertyTracker:
    """Which properties are still open, and the first discovery for each."""

    def __init__(self, ctx: ModelContext, finish_when: str) -> None:
        self.ctx = ctx
        self.finish_when = finish_when
        self.found: dict[str, Found] = {}
        self.always = list(ctx.always)
        self.sometimes = list(ctx.sometimes)
        self.transition = list(ctx.transition)
        self.final = list(ctx.final)
        self.deadlock = ctx.check_deadlock
        self.any_failure = False
        self.stop = False

    def open_count(self) -> int:
        return (
            len(self.always)
            + len(self.sometimes)
            + len(self.transition)
            + len(self.final)
            + int(self.deadlock)
        )

    def record(self, f: Found) -> bool:
        """Keep `f` if it is the first (or a shallower) discovery for its property."""
        old = self.found.get(f.name)
        if old is not None and old.depth <= f.depth:
            return False
        self.found[f.name] = f
        self._close(f.name, f.kind)
        return True

    def close(self, name: str) -> None:
        """Stop checking property `name` (decided elsewhere)."""
        if name == "deadlock":
            self.deadlock = False
            return
        for attr in ("always", "sometimes", "transition", "final"):
            lst = getattr(self, attr)
            if any(n == name for n, _ in lst):
                setattr(self, attr, [(n, p) for n, p in lst if n != name])

    def _close(self, name: str, kind: str) -> None:
        self.close(name)
        if kind != PropertyKind.SOMETIMES.value:
            self.any_failure = True
        self._update_stop()

    def _update_stop(self) -> None:
        if self.finish_when == "any_failure":
            self.stop = self.any_failure
        elif self.finish_when == "all_decided":
            self.stop = bool(self.found) and self.open_count() == 0

    def restore(self, found: dict[str, Found]) -> None:
        for f in found.values():
            self.record(f)

    # --- checks used by the hot loops (only called when the matching list is non-empty) ---

    def check_new(self, state: Any, fp: int, depth: int) -> None:
        for name, pred in self.always:
            if not pred(state):
                self.record(Found(name, PropertyKind.ALWAYS.value, depth, fp))
        for name, pred in self.sometimes:
            if pred(state):
                self.record(Found(name, PropertyKind.SOMETIMES.value, depth, fp))

    def fail_always(self, name: str, fp: int, depth: int) -> None:
        self.record(Found(name, PropertyKind.ALWAYS.value, depth, fp))

    def hit_sometimes(self, name: str, fp: int, depth: int) -> None:
        self.record(Found(name, PropertyKind.SOMETIMES.value, depth, fp))

    def check_transition(self, s: Any, fs: int, depth: int, action: Any, t: Any) -> None:
        for name, pred in self.transition:
            if not pred(s, action, t):
                self.fail_transition(name, fs, depth, action, t)

    def fail_transition(self, name: str, fs: int, depth: int, action: Any, t: Any) -> None:
        self.record(Found(name, PropertyKind.TRANSITION.value, depth + 1, fs, action, t, True))

    def check_expanded(self, s: Any, fs: int, depth: int, n_succ: int, final: bool) -> None:
        if final:
            for name, pred in self.final:
                if not pred(s):
                    self.record(Found(name, PropertyKind.FINAL.value, depth, fs))
        elif n_succ == 0 and self.deadlock:
            self.record(Found("deadlock", "deadlock", depth, fs))

    @property
    def wants_new(self) -> bool:
        return bool(self.always or self.sometimes)


@dataclass
class Outcome:
    """What a search hands to `Checker._result` (internal)."""

    strategy: str
    generated: int
    distinct: int
    max_depth: int
    elapsed: float
    coverage: dict[str, int]
    complete: bool
    stop_reason: str
    found: dict[str, Found]
    parent_of: Callable[[int], int] | None
    recorder: GraphRecorder | EdgeArrays | None = None
    processes: int = 1
    notes: list[str] = field(default_factory=list)
    memory: dict[str, float] = field(default_factory=dict)
    """What the search held in memory and on disk (`checker.bfs`'s figures, for benchmarks)."""
    release: Callable[[], None] | None = None
    """Frees what the search kept for its traces (its files): called once they are built."""


class SearchControl:
    """The one channel between a running search and the program around it: requests from other
    threads (a progress callback, a signal handler), which the search answers at its next
    housekeeping point, and the count of the checkpoints it wrote."""

    def __init__(self) -> None:
        self.stop_requested = threading.Event()
        self.checkpoint_requested = threading.Event()
        self.checkpoints_written = 0


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """What a strategy reads from the `Checker` that runs it (see `Checker` for each option),
    fixed for the whole search; `control` is its one channel back."""

    model: Any
    control: SearchControl
    max_states: int | None
    max_depth: int | None
    processes: int
    check_deadlock: bool
    record_graph: bool
    labelled_graph: bool
    """Label the recorded graph's nodes and edges (for DOT/GraphML): only when the graph was
    asked for; the livelock check needs its shape alone, and a state's repr costs."""
    finish_when: str
    progress: Callable[[Progress], None] | None
    progress_interval: float
    checkpoint_path: str | None
    checkpoint_interval: float | None
    resume_from: str | None
    coverage: bool
    queue_memory: int | None = None
    """The bytes the sequential search's next level may hold in memory before it spills to
    disk (None: never)."""
    work_dir: str | None = None
    """Where the sequential search makes its ``states/`` folder (None: a temporary one)."""

    def stop_reason(self, props: PropertyTracker, visited: int, work_left: bool) -> str | None:
        """The stop rule of every search, between two of its steps: why it stops now, or None
        to go on.  A verdict first (`finish_when`), then a request to stop, then `max_states`
        (`visited` distinct states); a search with no work left is exhausted, whatever was
        asked."""
        if not work_left:
            return None
        if props.stop:
            return "all_decided" if self.finish_when == "all_decided" else "violation"
        if self.control.stop_requested.is_set():
            return "stop_requested"
        if self.max_states is not None and visited >= self.max_states:
            return "max_states"
        return None

    def checkpoint_on_stop(self, stop_reason: str) -> bool:
        """Whether a search that stopped for `stop_reason` leaves a checkpoint to resume from:
        when cut short by `max_states` or a request (not by a verdict, nor by `max_depth`,
        which a resumed search would meet again)."""
        return bool(self.checkpoint_path) and stop_reason in ("max_states", "stop_requested")

    def save_checkpoint(self, levels: Levels) -> None:
        """Write `levels` to `checkpoint_path`, and count it."""
        assert self.checkpoint_path, "no checkpoint_path to write to"
        save_levels(self.checkpoint_path, self.model, levels)
        self.control.checkpoints_written += 1


def starting_levels(options: SearchOptions, ctx: ModelContext) -> Levels:
    """Where a breadth-first search starts: the levels of the checkpoint it resumes, or the
    initial states (depth 0, every one unchecked)."""
    if options.resume_from is not None:
        return resume_levels(options.resume_from, options.model)
    initial = ctx.initial()
    return Levels(visited=dict.fromkeys((g for _s, g in initial), NO_PARENT), depth=0,
                  current=list(initial), generated=len(initial), unchecked=list(initial))


class Housekeeping:
    """When a search, between two of its steps, reports progress (every `progress_interval`
    seconds, given a callback) and writes a checkpoint (every `checkpoint_interval` seconds
    or on request, given a path)."""

    def __init__(self, options: SearchOptions, now: float) -> None:
        self.options = options
        self._next_progress = now + options.progress_interval if options.progress else _NEVER
        self._next_checkpoint = self._checkpoint_after(now)

    def progress_due(self, now: float) -> Callable[[Progress], None] | None:
        """The progress callback when a report is due at `now` (the next is then due an
        interval later), else None."""
        if now < self._next_progress:
            return None
        self._next_progress = now + self.options.progress_interval
        return self.options.progress

    def checkpoint_due(self, now: float) -> bool:
        """Whether to write a checkpoint at `now`; a request is answered by it (and dropped
        when there is no path to write to)."""
        requested = self.options.control.checkpoint_requested
        if now < self._next_checkpoint and not requested.is_set():
            return False
        requested.clear()
        self._next_checkpoint = self._checkpoint_after(now)
        return bool(self.options.checkpoint_path)

    def _checkpoint_after(self, now: float) -> float:
        interval = self.options.checkpoint_interval
        if interval is not None and self.options.checkpoint_path:
            return now + interval
        return _NEVER


_NEVER = float("inf")


class GraphRecorder:
    """Adds the explored states and transitions to a networkx graph of fingerprints; labels
    them (for DOT/GraphML) only when `labelled`: the livelock check needs the graph's shape
    alone, and a state's repr costs. Unlabelled, the graph is recorded as plain lists (an
    append per transition instead of an `add_edge` call) and built only when `graph` is first
    read: the same nodes and edges in the same order, so the livelock check walks it alike.
    The usual livelock verdict (every state can finish) is read from the lists themselves
    (`every_state_can_finish`): networkx is then neither imported nor built."""

    def __init__(self, ctx: ModelContext, labelled: bool) -> None:
        self._graph: Any = None
        self.ctx = ctx
        self.labelled = labelled
        self._nodes: dict[int, bool] = {}
        self._finals: list[int] = []
        self._edges: list[tuple[int, int]] = []
        if labelled:
            self._graph = _new_graph()

    @property
    def graph(self) -> Any:
        """The recorded graph (a networkx.DiGraph of fingerprints)."""
        if self._graph is None:
            self._graph = _new_graph()
            self._graph.add_nodes_from((g, {"init": init, "final": False})
                                       for g, init in self._nodes.items())
            self._graph.add_edges_from(self._edges)
            for f in self._finals:
                self._graph.nodes[f]["final"] = True
            self._nodes, self._edges, self._finals = {}, [], []
        return self._graph

    def every_state_can_finish(self) -> bool | None:
        """Whether a final state is reachable from every recorded state, from the lists (None:
        they were handed over to the built graph, or never kept: ask `graph`)."""
        if self._graph is not None:
            return None
        # The states that can finish: the finals, then every source of an edge to one, until
        # nothing is added. Passes over the edges, last recorded first: a breadth-first search
        # records a state's edges before those of the states it finds, so one pass takes in
        # every path that goes deeper at each step, and a pass or two more the rest (an edge
        # back to a shallower state); after `_PASSES`, the predecessors are indexed instead.
        edges, total = self._edges, len(self._nodes)
        can_finish = set(self._finals)
        add = can_finish.add
        for _ in range(_PASSES):
            before = len(can_finish)
            for f, g in reversed(edges):
                if g in can_finish:
                    add(f)
            if len(can_finish) in (before, total):
                return len(can_finish) == total
        predecessors: dict[int, list[int]] = {}
        for f, g in edges:
            known = predecessors.get(g)
            if known is None:
                predecessors[g] = [f]
            else:
                known.append(f)
        stack = list(can_finish)
        while stack:
            for f in predecessors.get(stack.pop(), ()):
                if f not in can_finish:
                    add(f)
                    stack.append(f)
        return len(can_finish) == total

    @property
    def pairs_append(self) -> Callable[[tuple[int, int]], None] | None:
        """Where the hot loop may append each transition's `(f, g)` itself (None: labelled,
        call `edge`)."""
        return None if self.labelled else self._edges.append

    def node(self, state: Any, g: int, init: bool = False) -> None:
        if not self.labelled:
            self._nodes[g] = init
            return
        label = repr(state)
        if len(label) > 200:
            label = label[:197] + "..."
        self._graph.add_node(g, label=label, init=init, final=False)

    def edge(self, f: int, g: int, action: Any) -> None:
        if not self.labelled:
            # A new target's `node` follows at once: where `add_edge` would have added it.
            self._edges.append((f, g))
            return
        graph = self._graph
        text = self.ctx.format_action(action)
        if graph.has_edge(f, g):
            data = graph.edges[f, g]
            if text not in data["label"].split(" | "):
                data["label"] += " | " + text
        else:
            graph.add_edge(f, g, label=text)

    def mark_final(self, f: int) -> None:
        if not self.labelled:
            self._finals.append(f)
            return
        self._graph.nodes[f]["final"] = True


_PASSES = 4  # passes over the edges before `every_state_can_finish` indexes them


def _new_graph() -> Any:
    import networkx as nx  # optional dependency, needed only when a graph is built

    return nx.DiGraph()


class EdgeArrays:
    """The unlabelled state graph of a parallel search, as the livelock check needs it: the
    visited fingerprints, the initial and final ones, and the transitions (each worker's, as
    numpy arrays of 64-bit patterns; see `checker.fpset` for the two domains).  It answers
    what `GraphRecorder` answers: `every_state_can_finish` (vectorised: backward reachability
    from the final states over the reversed edges) and `graph` (networkx, built when a
    livelock needs its counterexample)."""

    def __init__(self, signed: bool, nodes: list[int], initial: list[int],
                 edges: list[np.ndarray], finals: list[np.ndarray]) -> None:
        self.signed = signed
        dtype = np.int64 if signed else np.uint64
        self.nodes = np.array(nodes, dtype=dtype).view(np.uint64)
        self.initial = np.array(initial, dtype=dtype).view(np.uint64)
        self.edges = (np.concatenate(edges) if edges
                      else np.zeros((0, 2), dtype=np.uint64)).reshape(-1, 2)
        self.finals = np.concatenate(finals) if finals else np.zeros(0, dtype=np.uint64)
        self._graph: Any = None

    def every_state_can_finish(self) -> bool:
        n = len(self.nodes)
        order = np.argsort(self.nodes)
        ordered = self.nodes[order]

        def index(patterns: np.ndarray) -> np.ndarray:
            return order[np.searchsorted(ordered, patterns)]

        src, dst = index(self.edges[:, 0]), index(self.edges[:, 1])
        by_dst = np.argsort(dst, kind="stable")
        predecessors = src[by_dst]
        starts = np.searchsorted(dst[by_dst], np.arange(n + 1))
        can_finish = np.zeros(n, dtype=bool)
        frontier = np.unique(index(self.finals))
        can_finish[frontier] = True
        while len(frontier):
            lo, counts = starts[frontier], starts[frontier + 1] - starts[frontier]
            total = int(counts.sum())
            if total == 0:
                break
            # the predecessors of every frontier state, gathered from their ranges at once
            at = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(total)
            found = predecessors[at]
            frontier = np.unique(found[~can_finish[found]])
            can_finish[frontier] = True
        return bool(can_finish.all())

    @property
    def graph(self) -> Any:
        if self._graph is None:
            dtype = np.int64 if self.signed else np.uint64

            def ints(patterns: np.ndarray) -> list[Any]:
                return list(patterns.view(dtype).tolist())

            initial, finals = set(ints(self.initial)), set(ints(self.finals))
            graph = _new_graph()
            graph.add_nodes_from((g, {"init": g in initial, "final": g in finals})
                                 for g in ints(self.nodes))
            graph.add_edges_from(zip(ints(self.edges[:, 0]), ints(self.edges[:, 1])))
            self._graph = graph
        return self._graph
