"""The search engine: breadth-first (sequential or parallel), depth-first, random simulation.

What is checked, exactly:

* ``always`` and ``sometimes`` properties on every *visited* state (each distinct state once,
  when it is first discovered); ``transition`` properties on every explored transition
  (``states_generated`` of them, also those into visited states); ``final`` properties and the
  deadlock check when a state is expanded (a *deadlock* is a state that is not final and has no
  enabled action yielding a next state).
* BFS gives shortest counterexamples (and shortest ``sometimes`` witnesses): parent pointers
  are kept per fingerprint, and a trace is rebuilt by replaying the model from the initial
  state, picking at each step the first successor with the recorded fingerprint.  Models must
  therefore be deterministic (same state -> same successors in the same order).
* ``eventually(p)`` is checked after the main search by a depth-first search restricted to the
  states that do *not* satisfy ``p``, from the initial states that do not: it is violated iff
  that search reaches a final state, a state without successors, or closes a cycle (a state on
  the current DFS stack) — i.e. iff some maximal path (ending in a final state, a deadlock, or
  running forever around a cycle) never meets ``p``.  Final states end paths.  The result is a
  plain trace or a lasso (`Trace.loop_start`).  Exact for finite state spaces; under
  ``max_depth`` paths longer than the bound are not followed (and not reported).
* The livelock check (``check_livelock=True``, needs the state graph, so it turns
  ``record_graph`` on) verifies that from every reachable state some final state stays
  reachable; a violation is reported as a lasso into a terminal strongly connected component
  that contains no final state (or a path to a non-final state without successors).
* Memory: the visited set is one dict ``fingerprint -> parent fingerprint`` (the parent value
  is the parent's own key object, so it costs a pointer).  Measured on CPython 3.11: 71 bytes
  per state at 300 k states, 78 at 1 M (35-42 B of dict entry and index, 36 B for the 64-bit
  int key; int-encoded states below 2**30 use 28-B keys).  The BFS queue adds a
  ``(state, fingerprint)`` tuple (56 B + the state) per queued state only.  In parallel runs
  each worker's dict also holds the fingerprints it has met whose states another worker holds
  (marked, never proposed twice), and the coordinator one ``fingerprint -> worker`` dict.
* Fingerprints (`checker.fingerprint`): Python's hash for states that hash by value, stable
  SHA-1 ones otherwise and wherever fingerprints leave the process (``fingerprints=``); every
  result gives TLC's estimate of the probability that a collision hid a state.
* `finish_when` decides when the search may stop before the state space is exhausted:
  ``"all_decided"`` (default, as stateright) stops once every property has a verdict that
  more search cannot change (every always/transition/final property violated, every sometimes
  property reached, a deadlock found if checked); ``"any_failure"`` stops at the first
  violation (as TLC); ``"exhausted"`` never stops early.  ``max_states`` and ``max_depth``
  bound the search (`CheckResult.complete` is then false).
"""

from __future__ import annotations

import gc
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic

from checker.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from checker.engine import (
    NO_PARENT,
    Coverage,  # noqa: F401 - defined here once, still importable from here
    Found,
    ModelContext,
    Outcome,
    PropertyTracker,
    UnsafeHash,
)
from checker.fingerprint import all_hash_by_value, collision_probability
from checker.liveness import check_eventually, check_livelock
from checker.model import A, PropertyKind, S
from checker.parallel import fork_available, run_parallel_bfs
from checker.result import CheckResult, Progress, PropertyResult, Verdict
from checker.trace import Trace

__all__ = ["Checker", "check"]

_CHUNK = 256  # states expanded between two housekeeping checks (time, limits)
FINISH_MODES = ("all_decided", "any_failure", "exhausted")
FINGERPRINT_MODES = ("auto", "fast", "stable")
# Young objects allocated between two cyclic collections while a search runs (Python's
# default is 700).  A search allocates a state or two per transition and keeps one in ten
# (the new ones, in the frontier): with the default, the collector ran ~15,000 times on
# 2PC(7) and took a fifth of the engine's time, finding nothing (states are immutable trees;
# they form no cycles).  Cycles a model creates are still collected, 100,000 allocations later.
_GC_GEN0 = 100_000


@contextmanager
def _quiet_gc() -> Iterator[None]:
    """Collect less often during a search (see `_GC_GEN0`); the old thresholds come back after."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], _GC_GEN0), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)



class Checker(Generic[S, A]):
    """Explicit-state model checker for a `Model` (see the module docstring for semantics).

    Options:
      max_states       stop once this many distinct states are visited (checked every
                       256 expansions, or every BFS level in parallel runs, so it may be
                       overshot);
      max_depth        do not expand states at this depth (initial states have depth 0);
      processes        worker processes for `bfs` (1 = in-process; 0/None = os.cpu_count());
      check_deadlock   report non-final states without successors (default True);
      check_livelock   verify a final state stays reachable from every state (records graph);
      record_graph     keep the explored graph (networkx.DiGraph of fingerprints; small models);
      finish_when      "all_decided" (default) | "any_failure" | "exhausted";
      progress         callback(Progress), every `progress_interval` seconds and at the end;
      checkpoint_path  where `bfs` writes checkpoints: every `checkpoint_interval` seconds,
                       when `request_checkpoint()` was called, and when a bound stops it;
      resume_from      a checkpoint to resume `bfs` from;
      coverage         count explored transitions per action kind (default True);
      fingerprints     "auto" (default): fast fingerprints (Python's hash, computed in C)
                       when the states hash by value (`checker.fingerprint.hashes_by_value`:
                       checked on the initial states and on a sample of the new states of
                       every chunk; a search that meets one that does not starts again with
                       stable ones, and says so in its notes), stable ones when checkpoints
                       are written; "stable": always the stable SHA-1 fingerprints; "fast":
                       Python's hash unchecked (for states you know hash by value; not with
                       checkpoints).  The result reports
                       which was used and TLC's estimate of the collision probability.
    """

    def __init__(
        self,
        model: Any,
        *,
        max_states: int | None = None,
        max_depth: int | None = None,
        processes: int | None = 1,
        check_deadlock: bool = True,
        check_livelock: bool = False,
        record_graph: bool = False,
        finish_when: str = "all_decided",
        progress: Callable[[Progress], None] | None = None,
        progress_interval: float = 1.0,
        checkpoint_path: str | os.PathLike[str] | None = None,
        checkpoint_interval: float | None = None,
        resume_from: str | os.PathLike[str] | None = None,
        coverage: bool = True,
        fingerprints: str = "auto",
    ) -> None:
        if finish_when not in FINISH_MODES:
            raise ValueError(f"finish_when must be one of {FINISH_MODES}, not {finish_when!r}")
        if fingerprints not in FINGERPRINT_MODES:
            raise ValueError(f"fingerprints must be one of {FINGERPRINT_MODES}, not {fingerprints!r}")
        if fingerprints == "fast" and (checkpoint_path or resume_from):
            raise ValueError(
                "fast fingerprints are valid in one process only: checkpoints need "
                "fingerprints='stable' (or 'auto', which picks it)"
            )
        self.model = model
        self.max_states = max_states
        self.max_depth = max_depth
        self.processes = processes if processes else (os.cpu_count() or 1)
        self.check_deadlock = check_deadlock
        self.check_livelock = check_livelock
        self.record_graph = record_graph or check_livelock
        self._labelled = record_graph
        """Label the graph's nodes and edges (for DOT/GraphML): only when the graph was asked
        for; the livelock check needs its shape alone, and a state's repr costs."""
        self.finish_when = "exhausted" if check_livelock else finish_when
        self.progress = progress
        self.progress_interval = progress_interval
        self.checkpoint_path = os.fspath(checkpoint_path) if checkpoint_path is not None else None
        self.checkpoint_interval = checkpoint_interval
        self.resume_from = os.fspath(resume_from) if resume_from is not None else None
        self.coverage = coverage
        self.fingerprints = fingerprints
        self._checkpoint_requested = threading.Event()
        self._stop_requested = threading.Event()
        self.checkpoints_written = 0

    # ------------------------------------------------------------------ public API

    def request_checkpoint(self) -> None:
        """Ask a running `bfs` to write a checkpoint at its next housekeeping point."""
        self._checkpoint_requested.set()

    def request_stop(self) -> None:
        """Ask a running search to stop at its next housekeeping point (result incomplete)."""
        self._stop_requested.set()

    def _start(self, fingerprints: str | None = None) -> ModelContext:
        self._stop_requested.clear()
        mode = fingerprints or self.fingerprints
        if mode == "auto":
            ctx = ModelContext(self.model, self.check_deadlock, "stable")
            # A recorded graph (livelock) is built in one process: fast fingerprints label
            # its nodes as well as stable ones would.
            if not (self.checkpoint_path or self.resume_from):
                key = ctx.key
                keys = [key(s) if key is not None else s for s in self.model.init_states()]
                if all_hash_by_value(keys) is None:
                    ctx = ModelContext(self.model, self.check_deadlock, "fast")
                    ctx.sampling = ctx.fp_kind == "fast"
            return ctx
        return ModelContext(self.model, self.check_deadlock, mode)

    def _run(self, search: Callable[[ModelContext], Outcome]) -> CheckResult:
        """Run `search` with fast fingerprints when they are valid, else with stable ones."""
        ctx = self._start()
        with _quiet_gc():
            try:
                outcome = search(ctx)
            except UnsafeHash as unsafe:
                reason = unsafe.reason
            except TypeError as error:
                # A state holding an unhashable value (a list, a dict) cannot have a fast
                # fingerprint; the stable one encodes it.  Any other TypeError is the model's.
                if not (ctx.sampling and str(error).startswith("unhashable type")):
                    raise
                reason = str(error)
            else:
                return self._result(ctx, outcome)
            ctx = self._start("stable")
            outcome = search(ctx)
        outcome.notes.append(f"started again with stable fingerprints: {reason}")
        return self._result(ctx, outcome)

    def bfs(self) -> CheckResult:
        """Breadth-first search: shortest counterexamples; parallel when ``processes > 1``."""
        notes: list[str] = []
        if self.processes > 1 and not self.record_graph:
            if fork_available():
                return self._run(lambda ctx: run_parallel_bfs(self, ctx))
            notes = ["parallel search needs the 'fork' start method; ran in one process"]
        elif self.processes > 1:
            notes = ["record_graph/check_livelock run in one process"]

        def sequential(ctx: ModelContext) -> Outcome:
            outcome = self._bfs_sequential(ctx)
            outcome.notes[:0] = notes
            return outcome

        return self._run(sequential)

    def dfs(self) -> CheckResult:
        """Depth-first search (not shortest counterexamples; small frontier)."""
        return self._run(self._dfs)

    def simulate(self, runs: int = 100, max_depth: int = 1000, seed: int = 0) -> CheckResult:
        """`runs` random walks of at most `max_depth` steps (reproducible from `seed`).

        Checks always/sometimes on every visited state, transition properties on the steps
        taken, final properties and deadlocks at walk ends (a walk ends in a final state,
        a state without successors, or at `max_depth`).  ``eventually`` properties are
        checked on walks that end, and on walks that revisit a state (a lasso) before
        meeting the predicate.  Never `complete`: unreached ``sometimes`` stay NOT_REACHED.
        """
        return self._run(lambda ctx: self._simulate(ctx, runs, max_depth, seed))

    # ------------------------------------------------------------------ sequential BFS

    def _why_stopped(self, props: PropertyTracker) -> str:
        """Why a search with work left stopped (when neither bound on depth nor exhaustion)."""
        if props.stop:
            return "all_decided" if self.finish_when == "all_decided" else "violation"
        return "stop_requested" if self._stop_requested.is_set() else "max_states"

    def _signature(self) -> str:
        model = self.model
        cls = type(model)
        sig = f"{cls.__module__}.{cls.__qualname__}"
        if cls.__repr__ is not object.__repr__:
            sig += f":{model!r}"
        return sig

    def _bfs_sequential(self, ctx: ModelContext) -> Outcome:
        props = PropertyTracker(ctx, self.finish_when)
        start = time.perf_counter()
        elapsed_before = 0.0
        base_cov: dict[str, int] = {}
        graph = None
        if self.record_graph:
            import networkx as nx

            graph = nx.DiGraph()
        visited: dict[int, int] = {}
        generated = 0
        if self.resume_from is not None:
            data = load_checkpoint(self.resume_from, self._signature())
            visited = data["visited"]
            levels = sorted(data["levels"], key=lambda lv: lv[0])
            depth = levels[0][0] if levels else data["depth"]
            current = list(levels[0][1]) if levels else []
            nxt = list(levels[1][1]) if len(levels) > 1 else []
            generated = data["generated"]
            max_seen = data["max_depth"]
            elapsed_before = data["elapsed_s"]
            base_cov = dict(data["coverage"])
            props.restore(data["found"])
            pending = data.get("pending")
            if pending:
                pdepth, items = pending
                if pdepth != depth:
                    raise CheckpointError("checkpoint: pending states are not at the frontier depth")
                for t, g, parent in items:
                    if g not in visited:
                        visited[g] = parent
                        if props.wants_new:
                            props.check_new(t, g, depth)
                        current.append((t, g))
            if graph is not None:
                raise CheckpointError("record_graph cannot be combined with resume_from")
        else:
            depth = 0
            max_seen = 0
            current = []
            nxt = []
            for s, g in ctx.initial():
                generated += 1
                visited[g] = NO_PARENT
                if graph is not None:
                    self._graph_node(graph, ctx, s, g, init=True)
                if props.wants_new:
                    props.check_new(s, g, 0)
                current.append((s, g))

        cov = Coverage(ctx, self.coverage)
        env = ctx.expand_env(visited, nxt.append, cov, props)
        if graph is not None:
            env.graph_edge = lambda f, g, a: self._graph_edge(graph, ctx, f, g, a)
            env.graph_node = lambda t, g: self._graph_node(graph, ctx, t, g)
            env.graph_final = lambda f: graph.nodes[f].__setitem__("final", True)
        max_states = self.max_states
        max_depth = self.max_depth
        progress = self.progress
        p_interval = self.progress_interval
        ck_interval = self.checkpoint_interval
        now = time.perf_counter()
        next_progress = now + p_interval if progress else float("inf")
        next_ck = now + ck_interval if (ck_interval is not None and self.checkpoint_path) else float("inf")
        stop_reason = "exhausted"
        complete = True
        i = 0

        def coverage_now() -> dict[str, int]:
            out = dict(base_cov)
            for k, n in cov.kinds().items():
                out[k] = out.get(k, 0) + n
            return out

        def snapshot() -> dict[str, Any]:
            levels = [(depth, current[i:])]
            if nxt:
                levels.append((depth + 1, nxt))
            return {
                "model": self._signature(),
                "strategy": "bfs",
                "visited": visited,
                "levels": levels,
                "depth": depth,
                "pending": None,
                "generated": generated,
                "max_depth": max_seen,
                "elapsed_s": elapsed_before + time.perf_counter() - start,
                "coverage": coverage_now(),
                "found": dict(props.found),
            }

        if max_depth is not None and depth >= max_depth and current:
            complete = False
            stop_reason = "max_depth"
            current = []
        while True:
            if i >= len(current):
                if not nxt:
                    break
                current, nxt, i = nxt, [], 0
                env.nxt_append = nxt.append
                depth += 1
                if depth > max_seen:
                    max_seen = depth
                if max_depth is not None and depth >= max_depth:
                    complete = False
                    stop_reason = "max_depth"
                    break
                continue
            chunk = current[i : i + _CHUNK]
            i += len(chunk)
            expand = ctx.expander(cov, props, check_new=props.wants_new, graph=graph is not None)
            before = len(nxt)
            generated += expand(chunk, depth, env)
            cov.flush()
            if ctx.sampling:
                ctx.sample_keys(nxt, before)
            if nxt and depth + 1 > max_seen:
                max_seen = depth + 1
            # ---- housekeeping between chunks
            if props.stop:
                complete = False
                stop_reason = "all_decided" if self.finish_when == "all_decided" else "violation"
                if i >= len(current) and not nxt:
                    complete, stop_reason = True, "exhausted"
                break
            if self._stop_requested.is_set():
                complete, stop_reason = False, "stop_requested"
                break
            if max_states is not None and len(visited) >= max_states:
                if i < len(current) or nxt:
                    complete, stop_reason = False, "max_states"
                    break
            now = time.perf_counter()
            if now >= next_progress:
                next_progress = now + p_interval
                progress(  # type: ignore[misc]
                    Progress("bfs", generated, len(visited), len(current) - i + len(nxt), depth, elapsed_before + now - start)
                )
            if now >= next_ck or self._checkpoint_requested.is_set():
                self._checkpoint_requested.clear()
                if self.checkpoint_path:
                    save_checkpoint(self.checkpoint_path, snapshot())
                    self.checkpoints_written += 1
                next_ck = now + ck_interval if (ck_interval is not None and self.checkpoint_path) else float("inf")

        elapsed = elapsed_before + time.perf_counter() - start
        if not complete and self.checkpoint_path and stop_reason in ("max_states", "stop_requested"):
            save_checkpoint(self.checkpoint_path, snapshot())
            self.checkpoints_written += 1
        if progress:
            progress(Progress("bfs", generated, len(visited), len(current) - i + len(nxt), max_seen, elapsed, done=True))
        return Outcome(
            "bfs",
            generated,
            len(visited),
            max_seen,
            elapsed,
            coverage_now(),
            complete,
            stop_reason,
            props.found,
            visited.__getitem__,
            graph,
        )

    def _graph_node(self, graph: Any, ctx: ModelContext, state: Any, g: int,
                    init: bool = False) -> None:
        if not self._labelled:
            graph.add_node(g, init=init, final=False)
            return
        label = repr(state)
        if len(label) > 200:
            label = label[:197] + "..."
        graph.add_node(g, label=label, init=init, final=False)

    def _graph_edge(self, graph: Any, ctx: ModelContext, f: int, g: int, action: Any) -> None:
        if not self._labelled:
            graph.add_edge(f, g)
            return
        text = ctx.format_action(action)
        if graph.has_edge(f, g):
            data = graph.edges[f, g]
            if text not in data["label"].split(" | "):
                data["label"] += " | " + text
        else:
            graph.add_edge(f, g, label=text)

    # ------------------------------------------------------------------ DFS

    def _dfs(self, ctx: ModelContext) -> Outcome:
        if self.resume_from is not None:
            raise CheckpointError("checkpoint/resume is supported by bfs() only")
        props = PropertyTracker(ctx, self.finish_when)
        start = time.perf_counter()
        graph = None
        if self.record_graph:
            import networkx as nx

            graph = nx.DiGraph()
        visited: dict[int, int] = {}
        stack: list[tuple[Any, int, int]] = []
        generated = 0
        for s, g in ctx.initial():
            generated += 1
            visited[g] = NO_PARENT
            if graph is not None:
                self._graph_node(graph, ctx, s, g, init=True)
            if props.wants_new:
                props.check_new(s, g, 0)
            stack.append((s, g, 0))
        stack.reverse()
        succ = ctx.successors
        fp = ctx.fp
        need_final = ctx.is_final is not None
        is_final = ctx.is_final
        cov = Coverage(ctx, self.coverage)
        cov_append = cov.append
        max_states = self.max_states
        max_depth = self.max_depth
        progress = self.progress
        next_progress = start + self.progress_interval if progress else float("inf")
        complete, stop_reason = True, "exhausted"
        max_seen = 0
        count = 0
        while stack:
            s, f, depth = stack.pop()
            if depth > max_seen:
                max_seen = depth
            if max_depth is not None and depth >= max_depth:
                complete, stop_reason = False, "max_depth"
                continue
            n = 0
            fresh = []
            for a, t in succ(s):
                n += 1
                if cov_append is not None:
                    cov_append(a)
                if props.transition:
                    props.check_transition(s, f, depth, a, t)
                g = fp(t)
                if graph is not None:
                    self._graph_edge(graph, ctx, f, g, a)
                if g in visited:
                    continue
                visited[g] = f
                if props.wants_new:
                    props.check_new(t, g, depth + 1)
                if graph is not None:
                    self._graph_node(graph, ctx, t, g)
                fresh.append((t, g, depth + 1))
            generated += n
            fin = is_final(s) if need_final else False
            if fin or n == 0:
                props.check_expanded(s, f, depth, n, fin)
                if graph is not None and fin:
                    graph.nodes[f]["final"] = True
            fresh.reverse()
            stack.extend(fresh)
            count += 1
            if count & 255 == 0:
                cov.flush()
                ctx.sample_keys(stack, max(0, len(stack) - 16))
                if props.stop or self._stop_requested.is_set():
                    break
                if max_states is not None and len(visited) >= max_states:
                    break
                now = time.perf_counter()
                if now >= next_progress:
                    next_progress = now + self.progress_interval
                    progress(Progress("dfs", generated, len(visited), len(stack), max_seen, now - start))  # type: ignore[misc]
        if stack:
            complete, stop_reason = False, self._why_stopped(props)
        elapsed = time.perf_counter() - start
        if progress:
            progress(Progress("dfs", generated, len(visited), len(stack), max_seen, elapsed, done=True))
        return Outcome(
            "dfs",
            generated,
            len(visited),
            max_seen,
            elapsed,
            cov.kinds(),
            complete,
            stop_reason,
            props.found,
            visited.__getitem__,
            graph,
        )

    # ------------------------------------------------------------------ simulation

    def _simulate(self, ctx: ModelContext, runs: int, max_depth: int, seed: int) -> Outcome:
        rng = random.Random(seed)
        props = PropertyTracker(ctx, self.finish_when)
        start = time.perf_counter()
        cov = Coverage(ctx, self.coverage)
        inits = ctx.initial()
        if not inits:
            raise ValueError("the model has no initial state")
        seen: set[int] = set()
        generated = 0
        max_seen = 0
        eventually = list(ctx.eventually)
        ev_found: dict[str, Found] = {}
        progress = self.progress
        next_progress = start + self.progress_interval if progress else float("inf")
        runs_done = 0
        for _run in range(runs):
            if props.stop or self._stop_requested.is_set():
                break
            s, f = inits[rng.randrange(len(inits))]
            path: list[tuple[Any, Any]] = [(None, s)]
            index: dict[int, int] = {f: 0}
            ev_open = [(n, p) for n, p in eventually if n not in ev_found and not p(s)]
            generated += 1
            seen.add(f)
            self._sim_check_state(props, s, f, path)
            for depth in range(max_depth + 1):
                succs = list(ctx.successors(s))
                fin = ctx.final_state(s)
                if fin or not succs:
                    self._sim_check_end(props, s, f, depth, len(succs), fin, path)
                    for name, _p in ev_open:
                        ev_found.setdefault(name, Found(name, "eventually", depth, f, trace=Trace(tuple(path))))
                    break
                if depth == max_depth:
                    break
                a, t = succs[rng.randrange(len(succs))]
                generated += 1
                if cov.append is not None:
                    cov.append(a)
                path.append((a, t))
                if props.transition:
                    for name, pred in props.transition:
                        if not pred(s, a, t):
                            props.record(
                                Found(name, "transition", depth + 1, f, a, t, True, trace=Trace(tuple(path)))
                            )
                g = ctx.fp(t)
                seen.add(g)
                if depth + 1 > max_seen:
                    max_seen = depth + 1
                self._sim_check_state(props, t, g, path)
                if ev_open:
                    ev_open = [(n, p) for n, p in ev_open if not p(t)]
                    if g in index and ev_open:
                        loop = index[g]
                        for name, _p in ev_open:
                            ev_found.setdefault(
                                name, Found(name, "eventually", depth + 1, g, trace=Trace(tuple(path), loop))
                            )
                        ev_open = []
                    index.setdefault(g, depth + 1)
                s, f = t, g
            runs_done += 1
            ctx.sample_keys(path, 0, at=1)
            now = time.perf_counter()
            if now >= next_progress:
                next_progress = now + self.progress_interval
                progress(Progress("simulate", generated, len(seen), runs - runs_done, max_seen, now - start))  # type: ignore[misc]
        elapsed = time.perf_counter() - start
        if progress:
            progress(Progress("simulate", generated, len(seen), 0, max_seen, elapsed, done=True))
        found = dict(props.found)
        found.update(ev_found)
        out = Outcome(
            "simulate",
            generated,
            len(seen),
            max_seen,
            elapsed,
            cov.kinds(),
            False,
            "simulation",
            found,
            None,
        )
        out.notes.append(f"{runs_done} random walks, at most {max_depth} steps each, seed {seed}")
        return out

    @staticmethod
    def _sim_check_state(props: PropertyTracker, s: Any, f: int, path: list[tuple[Any, Any]]) -> None:
        depth = len(path) - 1
        for name, pred in props.always:
            if not pred(s):
                props.record(Found(name, "always", depth, f, trace=Trace(tuple(path))))
        for name, pred in props.sometimes:
            if pred(s):
                props.record(Found(name, "sometimes", depth, f, trace=Trace(tuple(path))))

    @staticmethod
    def _sim_check_end(
        props: PropertyTracker, s: Any, f: int, depth: int, n: int, fin: bool, path: list[tuple[Any, Any]]
    ) -> None:
        if fin:
            for name, pred in props.final:
                if not pred(s):
                    props.record(Found(name, "final", depth, f, trace=Trace(tuple(path))))
        elif n == 0 and props.deadlock:
            props.record(Found("deadlock", "deadlock", depth, f, trace=Trace(tuple(path))))

    # ------------------------------------------------------------------ results

    def _trace_of(self, ctx: ModelContext, outcome: Outcome, f: Found) -> Trace[Any, Any]:
        if f.trace is not None:
            return f.trace
        assert outcome.parent_of is not None
        chain = [f.fp]
        parent = outcome.parent_of(f.fp)
        while parent != NO_PARENT:
            chain.append(parent)
            parent = outcome.parent_of(parent)
        chain.reverse()
        steps = ctx.replay(chain)
        if f.transition:
            steps.append((f.action, f.state))
        return Trace(tuple(steps))

    def _result(self, ctx: ModelContext, outcome: Outcome) -> CheckResult:
        results: dict[str, PropertyResult] = {}
        found = outcome.found
        for prop in ctx.properties:
            kind = prop.kind.value
            if prop.kind is PropertyKind.EVENTUALLY:
                continue
            hit = found.get(prop.name)
            if prop.kind is PropertyKind.SOMETIMES:
                if hit is None:
                    results[prop.name] = PropertyResult(prop.name, kind, Verdict.NOT_REACHED)
                else:
                    results[prop.name] = PropertyResult(
                        prop.name, kind, Verdict.HOLDS, self._trace_of(ctx, outcome, hit), "witness"
                    )
            elif hit is None:
                results[prop.name] = PropertyResult(prop.name, kind, Verdict.HOLDS)
            else:
                results[prop.name] = PropertyResult(prop.name, kind, Verdict.VIOLATED, self._trace_of(ctx, outcome, hit))
        for name, pred in ctx.eventually:
            if outcome.strategy == "simulate":
                hit = found.get(name)
                if hit is not None:
                    results[name] = PropertyResult(name, "eventually", Verdict.VIOLATED, hit.trace)
                else:
                    results[name] = PropertyResult(name, "eventually", Verdict.HOLDS, note="on the simulated walks")
                continue
            results[name] = check_eventually(ctx, name, pred, self.max_depth, self.max_states)
        if self.check_deadlock:
            hit = found.get("deadlock")
            if hit is None:
                results["deadlock"] = PropertyResult("deadlock", "deadlock", Verdict.HOLDS)
            else:
                results["deadlock"] = PropertyResult(
                    "deadlock", "deadlock", Verdict.VIOLATED, self._trace_of(ctx, outcome, hit)
                )
        if self.check_livelock:
            if outcome.graph is None or not outcome.complete:
                results["livelock"] = PropertyResult(
                    "livelock", "livelock", Verdict.UNKNOWN, note="needs a complete search with the graph recorded"
                )
            else:
                results["livelock"] = check_livelock(ctx, outcome.graph)
        kind = ctx.fp_kind if ctx.inexact else "exact"
        return CheckResult(
            strategy=outcome.strategy,
            properties=results,
            states_generated=outcome.generated,
            distinct_states=outcome.distinct,
            max_depth=outcome.max_depth,
            duration_s=outcome.elapsed,
            coverage=outcome.coverage,
            complete=outcome.complete,
            stop_reason=outcome.stop_reason,
            processes=outcome.processes,
            graph=outcome.graph,
            notes=list(outcome.notes),
            fingerprints=kind,
            collision_probability=0.0 if kind == "exact" else collision_probability(outcome.distinct, outcome.generated),
        )


def check(model: Any, strategy: str = "bfs", **options: Any) -> CheckResult:
    """One-call convenience: ``Checker(model, **options).bfs()`` (or ``dfs`` / ``simulate``).

    For ``strategy="simulate"`` the options ``runs``, ``sim_depth`` and ``seed`` go to
    `Checker.simulate`.
    """
    sim = {k: options.pop(k) for k in ("runs", "sim_depth", "seed") if k in options}
    checker = Checker(model, **options)
    if strategy == "bfs":
        return checker.bfs()
    if strategy == "dfs":
        return checker.dfs()
    if strategy == "simulate":
        return checker.simulate(sim.get("runs", 100), sim.get("sim_depth", 1000), sim.get("seed", 0))
    raise ValueError(f"unknown strategy {strategy!r} (bfs, dfs, simulate)")

