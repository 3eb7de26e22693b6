"""Parallel breadth-first search over N worker processes (``Checker(processes=N).bfs()``).

Scheme: every state stays in the worker that generated it; only fingerprints travel.  The
search is level-synchronous, one *step* per BFS level:

1. each worker expands its share of the level-``d`` frontier with the sequential engine's
   loop (`checker._expand`), into a local set of the fingerprints it has met, a
   `checker.statefiles.VisitedStates` (a compact table; the parents of the first meeting in
   a file of the search's ``states/`` folder).  Successors it has not met are its
   *candidates* for level ``d + 1``; it sends the coordinator their fingerprints, and keeps
   the states;
2. the coordinator, which holds the global visited set (fingerprint -> the worker whose state
   it is), judges the candidates: those already visited are refused; a new one proposed by
   several workers goes to its owner by fingerprint (`owner_of`) when the owner proposed it,
   else to the first (deterministic for a given N and hash seed).  A worker wins every state
   only it met, so the worker holding the initial state would win them all: when the next
   level's shares differ by more than 64 states and 1/32 of the level, the excess is shipped
   (pickled, with parent pointers) to the workers short of it;
3. with the next step each worker gets its verdicts, keeps the states it won as its next
   frontier (checking invariants and sometimes-properties on them, as the sequential engine
   does when a state is first visited), the others stay among the fingerprints it has met
   (never proposed again), and expands.  The coordinator merges counters and discoveries
   (per property the shallowest; ties to the lowest worker index), reports progress, writes
   checkpoints, and stops when a level has no new state, when a bound is hit, or when
   `finish_when` says so.

Why not partition by fingerprint and ship each state to its owner (the scheme before): in
two-phase commit with 7 RMs almost every state has predecessors in both halves, so 280,467 of
the 296,448 states were pickled and unpickled once (9 µs each for the readable model's named
tuples of frozensets: 2.5 s, half again the 4.8 s of the whole sequential search), and two
processes took more CPU *and* more wall time than one.  Here a transition costs what it costs
in one process, and a worker's extra work is one insert and one verdict per candidate:
what two processes add is the candidates both workers met, the states shipped to even the
levels out, and the coordinator's judging.  The result's notes give each worker's states and
CPU seconds, and the sum over levels of the slowest worker's: the time on idle cores.

Workers are forked (the model, its properties' lambdas included, is inherited, not
pickled); platforms without ``fork`` run the sequential engine.  Being forked, they share the
coordinator's hash secret, so they use the same fingerprints as the sequential engine (fast
ones, Python's hash, for states that hash by value; see `checker.fingerprint`); a worker that
meets a state that does not hash by value says so, and the search starts again with stable
fingerprints.  Counterexamples are rebuilt exactly as in the sequential engine, asking each
state's worker for its parent: they are shortest, though not always the sequential engine's
(another of the shortest may be met first).
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from checker.checkpoint import CheckpointError, Levels
from checker.engine import (
    NO_PARENT,
    Coverage,
    EdgeArrays,
    Found,
    Housekeeping,
    ModelContext,
    Outcome,
    PropertyTracker,
    SearchOptions,
    UnsafeHash,
    starting_levels,
)
from checker.fingerprint import owner_of
from checker.result import Progress
from checker.statefiles import StatesDirectory, VisitedStates

__all__ = ["fork_available", "run_parallel_bfs"]

_CHUNK = 4096  # states a worker expands between two property-list refreshes


def fork_available() -> bool:
    return "fork" in mp.get_all_start_methods()


@dataclass
class _WorkerOptions:
    check_deadlock: bool
    coverage: bool
    fingerprints: str  # the coordinator's kind: forked workers share its hash secret
    sampling: bool
    record_edges: bool  # for the livelock check: each transition's (source, target)
    directory: str  # the search's states/ folder: each worker's parents file in a folder of it


def _worker_main(conn: Any, model: Any, opts: _WorkerOptions, index: int) -> None:
    try:
        _Worker(conn, model, opts, index).serve()
    except BaseException:  # noqa: BLE001 - report anything to the coordinator, then exit
        try:
            conn.send(("error", traceback.format_exc()))
        except Exception:  # noqa: BLE001
            pass
    finally:
        conn.close()


class _Worker:
    """One worker process: its states, the fingerprints it has met, its share of the frontier."""

    def __init__(self, conn: Any, model: Any, opts: _WorkerOptions, index: int) -> None:
        self.conn = conn
        self.ctx = ctx = ModelContext(model, opts.check_deadlock, opts.fingerprints)
        ctx.sampling = opts.sampling
        self.props = PropertyTracker(ctx, "exhausted")
        self.cov = Coverage(ctx, opts.coverage)
        # every fingerprint this worker has met: the states it holds (visited, or candidates
        # awaiting a verdict) and those another worker holds; the parents it met them by (or
        # was handed them with) on disk.  The coordinator asks a state's parent of its holder.
        directory = Path(opts.directory) / f"worker-{index}"
        directory.mkdir()
        self.seen = VisitedStates(ctx.fp_kind == "fast", directory)
        self.cur: list[tuple[Any, int]] = []  # its share of the frontier
        # next-level states already visited (a resumed checkpoint's)
        self.ready: list[tuple[Any, int]] = []
        self.pending: list[tuple[Any, int]] = []  # candidates for the next level
        # with `record_edges`: the transitions this worker expanded and its final states,
        # as arrays of 64-bit patterns, one per step (a list of pairs costs ~100 B an edge)
        self.record_edges = opts.record_edges
        self.dtype = np.int64 if ctx.fp_kind == "fast" else np.uint64
        self.edges: list[np.ndarray] = []
        self.finals: list[np.ndarray] = []

    def serve(self) -> None:
        conn = self.conn
        while True:
            msg = conn.recv()
            cmd = msg[0]
            if cmd == "step":
                _, depth, verdicts, decided, expand_ok = msg
                conn.send(("ok", self.step(depth, verdicts, decided, expand_ok)))
            elif cmd == "accept":
                _, depth, verdicts, decided, give = msg
                self.settle(decided)
                self.accept(depth, verdicts)
                given = []
                # to even the levels out: states with their parents, no longer this worker's
                if give:
                    parents = self.seen.parents.parents_of([g for _t, g in self.cur[-give:]])
                    given = [(t, g, parents[g]) for t, g in self.cur[-give:]]
                    del self.cur[-give:]
                conn.send(("ok", {"events": list(self.props.found.values()), "given": given}))
            elif cmd == "take":
                self.seen.adopt([g for _t, g, _p in msg[1]], [p for _t, _g, p in msg[1]])
                self.cur.extend((t, g) for t, g, _parent in msg[1])
                conn.send(("ok", None))
            elif cmd == "load":  # its share of the starting levels, checked by the coordinator
                _, part_seen, part_cur, part_ready = msg
                self.seen.adopt(list(part_seen), list(part_seen.values()))
                self.cur = list(part_cur)
                self.ready = list(part_ready)
                conn.send(("ok", None))
            elif cmd == "parent":
                conn.send(("ok", self.seen.parents.parent_of(msg[1])))
            elif cmd == "dump":  # the parents it has recorded (the coordinator keeps its own)
                conn.send(("ok", (dict(self.seen.parents.items()), self.cur)))
            elif cmd == "coverage":
                conn.send(("ok", self.cov.kinds()))
            elif cmd == "edges":
                conn.send(("ok", (self.edges, self.finals)))
                self.edges, self.finals = [], []
            elif cmd == "stop":
                return
            else:  # pragma: no cover - protocol error
                raise RuntimeError(f"unknown command {cmd!r}")

    def settle(self, decided: list[str]) -> None:
        """Stop checking the properties decided elsewhere; forget what was reported."""
        for name in decided:
            if name not in self.props.found:
                self.props.close(name)
        self.props.found.clear()

    def accept(self, depth: int, verdicts: bytes | None) -> None:
        """The candidates this worker won become its frontier at `depth` (checked as the
        sequential engine checks a state first visited); the others stay met."""
        if verdicts is None:
            return
        props = self.props
        check_new = props.check_new if props.wants_new else None
        cur = self.ready
        for (t, g), won in zip(self.pending, verdicts):
            if won:
                if check_new is not None:
                    check_new(t, g, depth)
                cur.append((t, g))
        self.cur, self.ready, self.pending = cur, [], []

    def step(
        self, depth: int, verdicts: bytes | None, decided: list[str], expand_ok: bool
    ) -> dict[str, Any]:
        began = time.process_time()
        self.settle(decided)
        self.accept(depth, verdicts)
        ctx, props, cov, cur = self.ctx, self.props, self.cov, self.cur
        generated = 0
        unsafe = None
        edges: list[tuple[int, int]] = []
        finals: list[int] = []
        if expand_ok and cur:
            pending = self.pending
            env = ctx.expand_env(self.seen, pending.append, cov, props)
            if self.record_edges:
                env.graph_edge, env.graph_node, env.graph_final = (
                    edges.append, _no_node, finals.append)
            for lo in range(0, len(cur), _CHUNK):
                # (re-)specialised per chunk: properties may have been decided meanwhile;
                # new states are checked when won (`accept`), not when met
                expand = ctx.expander(cov, props, check_new=False, graph=self.record_edges,
                                      graph_pairs=True, batch=True)
                mark = len(pending)
                try:
                    generated += expand(cur[lo : lo + _CHUNK], depth, env)
                    ctx.sample_keys(pending, mark)
                except UnsafeHash as error:
                    unsafe = error.reason
                    break
                except TypeError as error:  # as in `Checker._run`: a state that is not hashable
                    if not (ctx.sampling and str(error).startswith("unhashable type")):
                        raise
                    unsafe = str(error)
                    break
                cov.flush()
            self.cur = []
        if self.record_edges:
            self.edges.append(np.array(edges, dtype=self.dtype).reshape(-1, 2).view(np.uint64))
            self.finals.append(np.array(finals, dtype=self.dtype).view(np.uint64))
        return {
            "generated": generated,
            "frontier": len(cur),
            "unexpanded": 0 if expand_ok else len(cur),
            "ready": len(self.ready),
            "events": list(props.found.values()),
            "inexact": ctx.inexact,
            "unsafe": unsafe,
            "candidates": [g for _t, g in self.pending],
            "cpu_s": time.process_time() - began,
        }


class _Pool:
    """The coordinator's handle on the forked workers."""

    def __init__(self, n: int, model: Any, opts: _WorkerOptions) -> None:
        ctx = mp.get_context("fork")
        self.n = n
        self.conns = []
        self.procs = []
        for w in range(n):
            parent, child = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=_worker_main, args=(child, model, opts, w), daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)

    def recv(self, w: int) -> Any:
        try:
            status, payload = self.conns[w].recv()
        except EOFError:
            raise RuntimeError(
                f"checker worker {w} died (exit code {self.procs[w].exitcode})"
            ) from None
        if status == "error":
            raise RuntimeError(f"checker worker {w} failed:\n{payload}")
        return payload

    def call_all(self, msgs: list[Any]) -> list[Any]:
        for conn, msg in zip(self.conns, msgs):
            conn.send(msg)
        return [self.recv(w) for w in range(self.n)]

    def call(self, w: int, msg: Any) -> Any:
        self.conns[w].send(msg)
        return self.recv(w)

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(("stop",))
            except (OSError, ValueError):
                pass
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():  # pragma: no cover - a stuck worker
                proc.terminate()
                proc.join(timeout=5)
        for conn in self.conns:
            conn.close()


def _no_node(state: Any, g: int) -> None:
    """The parallel search records states as the coordinator visits them, not as met."""


def _judge(candidates: list[list[int]], visited: dict[int, int], n: int) -> tuple[list[bytes], int]:
    """Each worker's verdicts on its candidates (one byte each: 1 won, 0 refused), and how many
    states are new; the new ones enter `visited` (fingerprint -> the worker that holds it)."""
    claims: dict[int, int] = {}
    for w, fps in enumerate(candidates):
        for g in fps:
            if g in visited:
                continue
            other = claims.get(g)
            if other is None or owner_of(g, n) == w:
                claims[g] = w
    visited.update(claims)
    verdicts = [bytes([claims.get(g) == w for g in fps]) for w, fps in enumerate(candidates)]
    return verdicts, len(claims)


def _partition(items: list[tuple[Any, int]], n: int) -> list[list[tuple[Any, int]]]:
    """``(state, fingerprint)`` pairs shared out among `n` workers by fingerprint."""
    parts: list[list[tuple[Any, int]]] = [[] for _ in range(n)]
    for item in items:
        parts[owner_of(item[1], n)].append(item)
    return parts


def run_parallel_bfs(options: SearchOptions, ctx: ModelContext) -> Outcome:
    """The parallel BFS (see the module docstring); returns the engine's `Outcome`."""
    return _Coordinator(options, ctx).run()


class _Coordinator:
    """One parallel search, as the coordinator runs it: the global visited set (fingerprint ->
    the worker holding its state), the verdicts not yet handed out, the counters an `Outcome`
    reports, and the CPU seconds its notes give."""

    def __init__(self, options: SearchOptions, ctx: ModelContext) -> None:
        self.options = options
        self.ctx = ctx
        self.n = n = options.processes
        self.props = PropertyTracker(ctx, options.finish_when)
        self.start = time.perf_counter()
        self.visited: dict[int, int] = {}
        self.depth = self.generated = self.max_seen = self.frontier = 0
        self.elapsed_before = 0.0  # the search time of the run a checkpoint resumes
        self.base_cov: dict[str, int] = {}  # ... and its coverage
        self.complete, self.stop_reason = True, "exhausted"
        self.verdicts: Sequence[bytes | None] = [None] * n
        # CPU seconds: each worker's steps, the slowest worker's per level (what a level takes
        # when every worker has a core of its own), and the coordinator's judging
        self.worker_cpu = [0.0] * n
        self.critical = self.judging = 0.0
        self.expanded = [0] * n
        if options.labelled_graph:
            raise ValueError("a labelled graph is recorded in one process")
        if options.record_graph and options.resume_from is not None:
            raise CheckpointError("record_graph cannot be combined with resume_from")
        self.initial: list[int] = []
        self.files = StatesDirectory(options.work_dir)
        try:
            self.pool = _Pool(n, options.model, _WorkerOptions(
                options.check_deadlock, options.coverage, ctx.fp_kind, ctx.sampling,
                options.record_graph, str(self.files.path)))
        except BaseException:
            self.files.remove()
            raise

    def run(self) -> Outcome:
        try:
            levels = starting_levels(self.options, self.ctx)
            self.initial = [g for _s, g in levels.current]
            self._load(levels)
            self._search()
            return self._finish()
        finally:
            self.pool.close()
            self.files.remove()

    def _load(self, levels: Levels) -> None:
        """Share the starting levels out among the workers, each state to its fingerprint's
        owner (`owner_of`); the states not yet checked are checked here."""
        n, props = self.n, self.props
        self.depth, self.generated = levels.depth, levels.generated
        self.max_seen, self.elapsed_before = levels.max_depth, levels.elapsed_s
        self.base_cov = levels.coverage
        props.restore(levels.found)
        if props.wants_new:
            for s, g in levels.unchecked:
                props.check_new(s, g, levels.depth)
        seen: list[dict[int, Any]] = [{} for _ in range(n)]
        for g, parent in levels.visited.items():
            w = owner_of(g, n)
            seen[w][g] = parent
            self.visited[g] = w
        current, following = _partition(levels.current, n), _partition(levels.following, n)
        self.pool.call_all([("load", seen[w], current[w], following[w]) for w in range(n)])

    def _search(self) -> None:
        """Level by level, until none is left, `max_depth` is reached or the stop rule says."""
        options = self.options
        max_depth = options.max_depth
        self.housekeeping = Housekeeping(options, time.perf_counter())
        while True:
            expand = max_depth is None or self.depth < max_depth
            replies = self._step(expand)
            if not expand:
                if sum(r["unexpanded"] for r in replies):
                    self._stop("max_depth")
                return
            new = self._judge_candidates(replies)
            self.depth += 1
            self.frontier = new + sum(r["ready"] for r in replies)
            if self.frontier == 0:
                return  # exhausted
            self.max_seen = max(self.max_seen, self.depth)
            reason = options.stop_reason(self.props, len(self.visited), work_left=True)
            if reason is not None:
                self._settle()  # every visited state checked, as the sequential engine leaves them
                self._stop(reason)
                return
            self._even_out([sum(v or b"") + r["ready"] for v, r in zip(self.verdicts, replies)])
            self._report_and_checkpoint()

    def _step(self, expand: bool) -> list[dict[str, Any]]:
        """Each worker takes its verdicts and, when `expand`, expands its share of the level;
        their counters and discoveries are merged here."""
        n = self.n
        decided = sorted(self.props.found)
        replies = self.pool.call_all(
            [("step", self.depth, self.verdicts[w], decided, expand) for w in range(n)]
        )
        self.verdicts = [None] * n
        self.generated += sum(r["generated"] for r in replies)
        self.frontier = sum(r["frontier"] for r in replies)
        for w, r in enumerate(replies):
            self.worker_cpu[w] += r["cpu_s"]
            self.expanded[w] += r["frontier"] if expand else 0
        self.critical += max(r["cpu_s"] for r in replies)
        for r in replies:
            if r["unsafe"] is not None:
                raise UnsafeHash(r["unsafe"])
            self.ctx.inexact = self.ctx.inexact or r["inexact"]
            self._merge(r["events"])
        return replies

    def _judge_candidates(self, replies: list[dict[str, Any]]) -> int:
        """The verdicts on the workers' candidates (handed out with the next step), and how
        many states are new."""
        began = time.process_time()
        self.verdicts, new = _judge([r["candidates"] for r in replies], self.visited, self.n)
        self.judging += time.process_time() - began
        return new

    def _settle(self, give: list[int] | None = None) -> list[Any]:
        """Hand out the verdicts now (the states won are then visited and checked); each
        worker gives away the number of them in `give`, returned."""
        given: list[Any] = []
        if any(v is not None for v in self.verdicts):
            decided = sorted(self.props.found)
            for reply in self.pool.call_all(
                [("accept", self.depth, self.verdicts[w], decided, give[w] if give else 0)
                 for w in range(self.n)]
            ):
                self._merge(reply["events"])
                given.extend(reply["given"])
            self.verdicts = [None] * self.n
        return given

    def _even_out(self, loads: list[int]) -> None:
        """Even out the next level (`loads`: each worker's share of it) when the shares differ
        by more than 64 states and 1/32 of the level: a worker wins the states it alone met,
        and when one meets most of them (from the start, the one holding the initial state
        does), the others would idle.  The excess is shipped (states with their parents), only
        then."""
        n = self.n
        if max(loads) - min(loads) <= max(64, self.frontier // 32):
            return
        total = sum(loads)
        want = [total // n + (w < total % n) for w in range(n)]
        given = self._settle([max(0, have - wanted) for have, wanted in zip(loads, want)])
        at = 0
        takes = []
        for w in range(n):
            need = max(0, want[w] - loads[w])
            part = given[at : at + need]
            at += need
            for _t, g, _parent in part:
                self.visited[g] = w
            takes.append(("take", part))
        self.pool.call_all(takes)

    def _report_and_checkpoint(self) -> None:
        """Between two steps: progress and checkpoints, when due (`Housekeeping`)."""
        now = time.perf_counter()
        report = self.housekeeping.progress_due(now)
        if report is not None:
            report(Progress("bfs", self.generated, len(self.visited), self.frontier, self.depth,
                            self.elapsed_before + now - self.start))
        if self.housekeeping.checkpoint_due(now):
            self._settle()
            self._save_checkpoint(self._coverage(), self.elapsed_before + now - self.start)

    def _save_checkpoint(self, coverage: dict[str, int], elapsed: float) -> None:
        """Checkpoint between two steps, the verdicts handed out: the workers' frontiers at
        `depth` are the level to expand, and what they hold is the visited set with its parent
        pointers."""
        visited: dict[int, Any] = {}
        level: list[tuple[Any, int]] = []
        for w, (part_visited, part_current) in enumerate(self.pool.call_all([("dump",)] * self.n)):
            # a worker records the states it met that another holds, too
            visited.update((g, p) for g, p in part_visited.items() if self.visited.get(g) == w)
            level.extend(part_current)
        self.options.save_checkpoint(Levels(
            visited=visited, depth=self.depth, current=level, generated=self.generated,
            max_depth=self.max_seen, elapsed_s=elapsed, coverage=coverage, found=self.props.found,
        ))

    def _finish(self) -> Outcome:
        options = self.options
        coverage = self._coverage()
        elapsed = self.elapsed_before + time.perf_counter() - self.start
        if options.checkpoint_on_stop(self.stop_reason):
            self._save_checkpoint(coverage, elapsed)
        if options.progress:
            options.progress(Progress("bfs", self.generated, len(self.visited), self.frontier,
                                      self.max_seen, elapsed, done=True))
        outcome = Outcome("bfs", self.generated, len(self.visited), self.max_seen, elapsed,
                          coverage, self.complete, self.stop_reason, dict(self.props.found),
                          self._parent_chains().__getitem__, self._edge_arrays(),
                          processes=self.n)
        outcome.notes.append(self._cpu_note())
        return outcome

    def _edge_arrays(self) -> EdgeArrays | None:
        """The state graph for the livelock check, from the workers' edges (when recorded)."""
        if not self.options.record_graph:
            return None
        edges: list[np.ndarray] = []
        finals: list[np.ndarray] = []
        for part_edges, part_finals in self.pool.call_all([("edges",)] * self.n):
            edges.extend(part_edges)
            finals.extend(part_finals)
        return EdgeArrays(self.ctx.fp_kind == "fast", list(self.visited), self.initial, edges,
                          finals)

    def _parent_chains(self) -> dict[int, int]:
        """The parent pointers from every discovery back to an initial state, asked of the
        workers holding the states (so, while they are alive)."""
        chains: dict[int, int] = {}
        for f in self.props.found.values():
            g = f.fp
            while g != NO_PARENT and g not in chains:
                chains[g] = self.pool.call(self.visited[g], ("parent", g))
                g = chains[g]
        return chains

    def _cpu_note(self) -> str:
        critical, judging = self.critical, self.judging
        return (
            f"states expanded per worker: {', '.join(f'{e:,}' for e in self.expanded)}; "
            f"CPU seconds in the workers' steps: "
            f"{', '.join(f'{c:.2f}' for c in self.worker_cpu)}; "
            f"the slowest worker's, level by level: {critical:.2f}; "
            f"the coordinator's judging: {judging:.2f} (on {self.n} idle "
            f"cores the search would take about {critical + judging:.2f} s)"
        )

    def _coverage(self) -> dict[str, int]:
        out = dict(self.base_cov)
        for part in self.pool.call_all([("coverage",)] * self.n):
            for k, v in part.items():
                out[k] = out.get(k, 0) + v
        return out

    def _merge(self, events: list[Found]) -> None:
        for f in events:
            self.props.record(f)

    def _stop(self, reason: str) -> None:
        self.complete, self.stop_reason = False, reason
