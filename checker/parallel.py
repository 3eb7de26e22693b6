"""Parallel breadth-first search over N worker processes (``Checker(processes=N).bfs()``).

Scheme: every state stays in the worker that generated it; only fingerprints travel.  The
search is level-synchronous, one *step* per BFS level:

1. each worker expands its share of the level-``d`` frontier with the sequential engine's
   loop (`checker._expand`), into a local dict of the fingerprints it has met (parent
   pointers for its own states).  Successors it has not met are its *candidates* for level
   ``d + 1``; it sends the coordinator their fingerprints, and keeps the states;
2. the coordinator, which holds the global visited set (fingerprint -> the worker whose state
   it is), judges the candidates: those already visited are refused; a new one proposed by
   several workers goes to its owner by fingerprint (`owner_of`) when the owner proposed it,
   else to the first (deterministic for a given N and hash seed).  A worker wins every state
   only it met, so the worker holding the initial state would win them all: when the next
   level's shares differ by more than 64 states and 1/32 of the level, the excess is shipped
   (pickled, with parent pointers) to the workers short of it;
3. with the next step each worker gets its verdicts, keeps the states it won as its next
   frontier (checking invariants and sometimes-properties on them, as the sequential engine
   does when a state is first visited), marks the others as met (one lookup next time), and
   expands.  The coordinator merges counters and discoveries (per property the shallowest;
   ties to the lowest worker index), reports progress, writes checkpoints, and stops when a
   level has no new state, when a bound is hit, or when `finish_when` says so.

Why not partition by fingerprint and ship each state to its owner (the scheme before): in
two-phase commit with 7 RMs almost every state has predecessors in both halves, so 280,467 of
the 296,448 states were pickled and unpickled once (9 µs each for the readable model's named
tuples of frozensets: 2.5 s, half again the 4.8 s of the whole sequential search), and two
processes took more CPU *and* more wall time than one.  Here a transition costs what it costs
in one process, and a worker's extra work is one dict insert and one verdict per candidate:
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
from typing import Any

from checker.checkpoint import load_checkpoint, pending_states, save_checkpoint
from checker.engine import (
    NO_PARENT,
    Coverage,
    Found,
    ModelContext,
    Outcome,
    PropertyTracker,
    SearchOptions,
    UnsafeHash,
)
from checker.fingerprint import owner_of
from checker.result import Progress

__all__ = ["fork_available", "run_parallel_bfs"]

_CHUNK = 4096  # states a worker expands between two property-list refreshes
# A worker's mark for a fingerprint it has met whose state another worker holds (not an int:
# fast fingerprints are signed, and any int could be a parent pointer).
_ELSEWHERE = None


def fork_available() -> bool:
    return "fork" in mp.get_all_start_methods()


@dataclass
class _WorkerOptions:
    check_deadlock: bool
    coverage: bool
    fingerprints: str  # the coordinator's kind: forked workers share its hash secret
    sampling: bool


def _worker_main(conn: Any, me: int, nparts: int, model: Any, opts: _WorkerOptions) -> None:
    try:
        _Worker(conn, model, opts).serve()
    except BaseException:  # noqa: BLE001 - report anything to the coordinator, then exit
        try:
            conn.send(("error", traceback.format_exc()))
        except Exception:  # noqa: BLE001
            pass
    finally:
        conn.close()


class _Worker:
    """One worker process: its states, the fingerprints it has met, its share of the frontier."""

    def __init__(self, conn: Any, model: Any, opts: _WorkerOptions) -> None:
        self.conn = conn
        self.ctx = ctx = ModelContext(model, opts.check_deadlock, opts.fingerprints)
        ctx.sampling = opts.sampling
        self.props = PropertyTracker(ctx, "exhausted")
        self.cov = Coverage(ctx, opts.coverage)
        # fingerprint -> parent for the states this worker holds (visited, or candidates
        # awaiting a verdict); -> _ELSEWHERE for those another worker holds
        self.seen: dict[int, Any] = {}
        self.cur: list[tuple[Any, int]] = []  # its share of the frontier
        # next-level states already visited (a resumed checkpoint's)
        self.ready: list[tuple[Any, int]] = []
        self.pending: list[tuple[Any, int]] = []  # candidates for the next level

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
                    for t, g in self.cur[-give:]:
                        given.append((t, g, self.seen[g]))
                        self.seen[g] = _ELSEWHERE
                    del self.cur[-give:]
                conn.send(("ok", {"events": list(self.props.found.values()), "given": given}))
            elif cmd == "take":
                for t, g, parent in msg[1]:
                    self.seen[g] = parent
                    self.cur.append((t, g))
                conn.send(("ok", None))
            elif cmd == "load":
                _, depth, part_seen, part_cur, part_ready, part_pending = msg
                self.seen.update(part_seen)
                self.cur = list(part_cur)
                self.ready = list(part_ready)
                self.props.found.clear()
                check_new = self.props.check_new if self.props.wants_new else None
                for t, g, parent in part_pending:  # a checkpoint's states not yet visited
                    if g not in self.seen:
                        self.seen[g] = parent
                        if check_new is not None:
                            check_new(t, g, depth)
                        self.cur.append((t, g))
                conn.send(("ok", {"events": list(self.props.found.values())}))
            elif cmd == "parent":
                conn.send(("ok", self.seen[msg[1]]))
            elif cmd == "dump":
                mine = {g: p for g, p in self.seen.items() if p is not _ELSEWHERE}
                conn.send(("ok", (mine, self.cur)))
            elif cmd == "coverage":
                conn.send(("ok", self.cov.kinds()))
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
        sequential engine checks a state first visited); the others are marked as met."""
        if verdicts is None:
            return
        props = self.props
        check_new = props.check_new if props.wants_new else None
        cur = self.ready
        seen = self.seen
        for (t, g), won in zip(self.pending, verdicts):
            if won:
                if check_new is not None:
                    check_new(t, g, depth)
                cur.append((t, g))
            else:
                seen[g] = _ELSEWHERE
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
        if expand_ok and cur:
            pending = self.pending
            env = ctx.expand_env(self.seen, pending.append, cov, props)
            for lo in range(0, len(cur), _CHUNK):
                # (re-)specialised per chunk: properties may have been decided meanwhile;
                # new states are checked when won (`accept`), not when met
                expand = ctx.expander(cov, props, check_new=False)
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
            proc = ctx.Process(target=_worker_main, args=(child, w, n, model, opts), daemon=True)
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


def _partition(items: list[Any], n: int, fp_of: Any) -> list[list[Any]]:
    parts: list[list[Any]] = [[] for _ in range(n)]
    for item in items:
        parts[owner_of(fp_of(item), n)].append(item)
    return parts


def run_parallel_bfs(checker: SearchOptions, ctx: ModelContext) -> Outcome:
    """The parallel BFS (see the module docstring); returns the engine's `Outcome`."""
    n = checker.processes
    props = PropertyTracker(ctx, checker.finish_when)
    start = time.perf_counter()
    elapsed_before = 0.0
    base_cov: dict[str, int] = {}
    visited: dict[int, int] = {}  # fingerprint -> the worker holding its state
    options = _WorkerOptions(checker.check_deadlock, checker.coverage, ctx.fp_kind, ctx.sampling)
    pool = _Pool(n, checker.model, options)

    def merge(events: list[Found]) -> None:
        for f in events:
            props.record(f)

    try:
        if checker.resume_from is not None:
            data = load_checkpoint(checker.resume_from, checker._signature())
            levels = sorted(data["levels"], key=lambda lv: lv[0])
            depth = levels[0][0] if levels else data["depth"]
            cur_parts = _partition(list(levels[0][1]) if levels else [], n, lambda it: it[1])
            ready_parts = _partition(
                list(levels[1][1]) if len(levels) > 1 else [], n, lambda it: it[1]
            )
            seen_parts: list[dict[int, int]] = [{} for _ in range(n)]
            for g, parent in data["visited"].items():
                w = owner_of(g, n)
                seen_parts[w][g] = parent
                visited[g] = w
            pending_parts: list[list[Any]] = [[] for _ in range(n)]
            for t, g, parent in pending_states(data, depth):
                if g not in visited:
                    visited[g] = owner_of(g, n)
                    pending_parts[visited[g]].append((t, g, parent))
            generated = data["generated"]
            max_seen = data["max_depth"]
            elapsed_before = data["elapsed_s"]
            base_cov = dict(data["coverage"])
            props.restore(data["found"])
        else:
            depth = max_seen = 0
            inits = ctx.initial()
            generated = len(inits)
            seen_parts = [{} for _ in range(n)]
            cur_parts = [[] for _ in range(n)]
            ready_parts = [[] for _ in range(n)]
            pending_parts = [[] for _ in range(n)]
            for s, g in inits:
                w = owner_of(g, n)
                visited[g] = w
                seen_parts[w][g] = NO_PARENT
                cur_parts[w].append((s, g))
                if props.wants_new:
                    props.check_new(s, g, 0)
        for reply in pool.call_all(
            [("load", depth, seen_parts[w], cur_parts[w], ready_parts[w], pending_parts[w])
             for w in range(n)]
        ):
            merge(reply["events"])
        del seen_parts, cur_parts, ready_parts, pending_parts

        max_depth = checker.max_depth
        max_states = checker.max_states
        progress = checker.progress
        ck_interval = checker.checkpoint_interval
        now = time.perf_counter()
        next_progress = now + checker.progress_interval if progress else float("inf")
        next_ck = (
            now + ck_interval
            if (ck_interval is not None and checker.checkpoint_path)
            else float("inf")
        )
        complete, stop_reason = True, "exhausted"
        frontier = 0
        verdicts: Sequence[bytes | None] = [None] * n
        # CPU seconds: each worker's steps, the slowest worker's per level (what a level takes
        # when every worker has a core of its own), and the coordinator's judging
        worker_cpu = [0.0] * n
        critical = judging = 0.0
        expanded = [0] * n

        def settle(give: list[int] | None = None) -> list[Any]:
            """Hand out the verdicts now (the states won are then visited and checked); each
            worker gives away the number of them in `give`, returned."""
            nonlocal verdicts
            given: list[Any] = []
            if any(v is not None for v in verdicts):
                decided = sorted(props.found)
                for _w, reply in enumerate(pool.call_all(
                    [("accept", depth, verdicts[w], decided, give[w] if give else 0)
                     for w in range(n)]
                )):
                    merge(reply["events"])
                    given.extend(reply["given"])
                verdicts = [None] * n
            return given

        def rebalance(loads: list[int]) -> None:
            """Even out the next level: a worker wins the states it alone met, and when one
            meets most of them (from the start, the one holding the initial state does), the
            others would idle.  The excess is shipped (states with their parents), only then."""
            total = sum(loads)
            want = [total // n + (w < total % n) for w in range(n)]
            given = settle([max(0, have - wanted) for have, wanted in zip(loads, want)])
            at = 0
            takes = []
            for w in range(n):
                need = max(0, want[w] - loads[w])
                part = given[at : at + need]
                at += need
                for _t, g, _parent in part:
                    visited[g] = w
                takes.append(("take", part))
            pool.call_all(takes)

        while True:
            expand_ok = max_depth is None or depth < max_depth
            decided = sorted(props.found)
            replies = pool.call_all(
                [("step", depth, verdicts[w], decided, expand_ok) for w in range(n)]
            )
            verdicts = [None] * n
            generated += sum(r["generated"] for r in replies)
            frontier = sum(r["frontier"] for r in replies)
            for w, r in enumerate(replies):
                worker_cpu[w] += r["cpu_s"]
                expanded[w] += r["frontier"] if expand_ok else 0
            critical += max(r["cpu_s"] for r in replies)
            for r in replies:
                if r["unsafe"] is not None:
                    raise UnsafeHash(r["unsafe"])
                ctx.inexact = ctx.inexact or r["inexact"]
                merge(r["events"])
            if not expand_ok:
                if sum(r["unexpanded"] for r in replies):
                    complete, stop_reason = False, "max_depth"
                break
            judged = time.process_time()
            verdicts, new = _judge([r["candidates"] for r in replies], visited, n)
            judging += time.process_time() - judged
            depth += 1
            frontier = new + sum(r["ready"] for r in replies)
            if frontier == 0:
                break  # exhausted
            max_seen = max(max_seen, depth)
            if props.stop or checker._stop_requested.is_set() or (
                    max_states is not None and len(visited) >= max_states):
                settle()  # every visited state checked, as the sequential engine leaves them
                complete, stop_reason = False, checker._why_stopped(props)
                break
            loads = [sum(verdicts[w] or b"") + r["ready"] for w, r in enumerate(replies)]
            if max(loads) - min(loads) > max(64, frontier // 32):
                rebalance(loads)
            now = time.perf_counter()
            if now >= next_progress:
                next_progress = now + checker.progress_interval
                progress(Progress("bfs", generated, len(visited), frontier, depth,  # type: ignore[misc]
                                  elapsed_before + now - start))
            if now >= next_ck or checker._checkpoint_requested.is_set():
                checker._checkpoint_requested.clear()
                if checker.checkpoint_path:
                    settle()
                    _write_checkpoint(checker, pool, depth, generated, max_seen, props.found,
                                      _coverage(pool, base_cov), elapsed_before + now - start)
                next_ck = (
                    now + ck_interval
                    if (ck_interval is not None and checker.checkpoint_path)
                    else float("inf")
                )
        coverage = _coverage(pool, base_cov)
        elapsed = elapsed_before + time.perf_counter() - start
        if (
            not complete
            and checker.checkpoint_path
            and stop_reason in ("max_states", "stop_requested")
        ):
            _write_checkpoint(
                checker, pool, depth, generated, max_seen, props.found, coverage, elapsed
            )
        if progress:
            progress(
                Progress("bfs", generated, len(visited), frontier, max_seen, elapsed, done=True)
            )
        # Rebuild the parent chains now, while the workers are alive.
        chains: dict[int, int] = {}
        for f in props.found.values():
            g = f.fp
            while g != NO_PARENT and g not in chains:
                chains[g] = pool.call(visited[g], ("parent", g))
                g = chains[g]
        found: dict[str, Found] = dict(props.found)
    finally:
        pool.close()
    outcome = Outcome("bfs", generated, len(visited), max_seen, elapsed, coverage, complete,
                      stop_reason, found, chains.__getitem__, None, processes=n)
    outcome.notes.append(
        f"states expanded per worker: {', '.join(f'{e:,}' for e in expanded)}; "
        f"CPU seconds in the workers' steps: {', '.join(f'{c:.2f}' for c in worker_cpu)}; "
        f"the slowest worker's, level by level: {critical:.2f}; "
        f"the coordinator's judging: {judging:.2f} (on {n} idle "
        f"cores the search would take about {critical + judging:.2f} s)"
    )
    return outcome


def _coverage(pool: _Pool, base: dict[str, int]) -> dict[str, int]:
    out = dict(base)
    for part in pool.call_all([("coverage",)] * pool.n):
        for k, v in part.items():
            out[k] = out.get(k, 0) + v
    return out


def _write_checkpoint(
    checker: SearchOptions,
    pool: _Pool,
    depth: int,
    generated: int,
    max_seen: int,
    found: dict[str, Any],
    coverage: dict[str, int],
    elapsed: float,
) -> None:
    """Checkpoint between two steps, the verdicts handed out: the workers' frontiers at `depth`
    are the level to expand, and what they hold is the visited set with its parent pointers."""
    visited: dict[int, int] = {}
    level: list[Any] = []
    for part_visited, part_cur in pool.call_all([("dump",)] * pool.n):
        visited.update(part_visited)
        level.extend(part_cur)
    save_checkpoint(
        checker.checkpoint_path,  # type: ignore[arg-type]
        {
            "model": checker._signature(),
            "strategy": "bfs",
            "visited": visited,
            "levels": [(depth, level)],
            "depth": depth,
            "pending": None,
            "generated": generated,
            "max_depth": max_seen,
            "elapsed_s": elapsed,
            "coverage": coverage,
            "found": dict(found),
        },
    )
    checker.checkpoints_written += 1
