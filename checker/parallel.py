"""Parallel breadth-first search over N worker processes (``Checker(processes=N).bfs()``).

Scheme: the fingerprint space is partitioned, worker ``owner_of(fp, N)`` owns (keeps in its
visited set, with parent pointers) every state whose fingerprint maps to it.  The search is
level-synchronous; one *step* per BFS level:

1. the coordinator (the calling process) hands each worker the candidate states of level
   ``d`` that other workers produced for it (as the pickled bytes they sent, never unpickled
   by the coordinator);
2. the worker inserts the new ones into its visited set (checking invariants / sometimes
   properties on them) and expands its whole level-``d`` frontier with the same specialised
   loop as the sequential engine (`checker._expand`): successors it owns go straight into its
   visited set and next frontier; the others are batched per owner and returned to the
   coordinator as pickled bytes.  A worker remembers the foreign fingerprints it has sent (in
   the same dict, marked ``FOREIGN``), so each is sent at most once per worker and a
   duplicate transition costs one dict lookup, as in the sequential engine (memory: a worker's
   dict also holds the foreign states it has generated);
3. the coordinator merges counters and discoveries (keeping, per property, the shallowest;
   ties go to the lowest worker index, so the outcome is deterministic for a given N),
   routes the batches, reports progress, writes checkpoints, and stops when the frontier and
   all batches are empty, when a bound is hit, or when `finish_when` says so.

Workers are forked (the model, its properties' lambdas included, is inherited, not
pickled); platforms without ``fork`` run the sequential engine.  Being forked, they share the
coordinator's hash secret, so they use the same fingerprints as the sequential engine (fast
ones, Python's hash, for states that hash by value; see `checker.fingerprint`) and route by
them; a worker that meets a state that does not hash by value says so, and the search starts
again with stable fingerprints.  (Which worker owns a state then depends on the hash secret:
counterexamples are shortest in every run, and the same for a given N and ``PYTHONHASHSEED``.)  Counterexamples are rebuilt
exactly as in the sequential engine, asking each fingerprint's owner for its parent.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import time
import traceback
from dataclasses import dataclass
from itertools import compress, count
from operator import not_
from typing import TYPE_CHECKING, Any

from checker._expand import FOREIGN, ExpandEnv, expander
from checker.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from checker.fingerprint import owner_of
from checker.result import Progress

if TYPE_CHECKING:
    from checker.search import Checker, ModelContext, Outcome

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


def _worker_main(conn: Any, me: int, nparts: int, model: Any, opts: _WorkerOptions) -> None:
    try:
        _worker_loop(conn, me, nparts, model, opts)
    except BaseException:  # noqa: BLE001 - report anything to the coordinator, then exit
        try:
            conn.send(("error", traceback.format_exc()))
        except Exception:  # noqa: BLE001
            pass
    finally:
        conn.close()


def _worker_loop(conn: Any, me: int, nparts: int, model: Any, opts: _WorkerOptions) -> None:
    from checker.search import Coverage, ModelContext, PropertyTracker, UnsafeHash

    ctx = ModelContext(model, opts.check_deadlock, opts.fingerprints)
    ctx.sampling = opts.sampling
    props = PropertyTracker(ctx, "exhausted")
    cov = Coverage(ctx, opts.coverage)
    # fingerprint -> parent for owned states; -> FOREIGN for others already sent to their owner
    visited: dict[int, int] = {}
    cur: list[tuple[Any, int]] = []
    nxt: list[tuple[Any, int]] = []
    int_keys = ctx.int_keys
    while True:
        msg = conn.recv()
        cmd = msg[0]
        if cmd == "step":
            _, depth, blobs, decided, expand_ok = msg
            for name in decided:
                if name not in props.found:
                    props.close(name)
            props.found.clear()
            check_new = props.check_new if props.wants_new else None
            new_in = 0
            for blob in blobs:
                states, fps, parents = pickle.loads(blob)
                # Most candidates are already known (the owner found them in the same level):
                # select the new ones in C, keeping the batch's (deterministic) order.
                for i in compress(count(), map(not_, map(visited.__contains__, fps))):
                    t = states[i]
                    g = fps[i]
                    visited[g] = parents[i]
                    if check_new is not None:
                        check_new(t, g, depth)
                    cur.append((t, g))
                    new_in += 1
            outs: list[tuple[list[Any], list[int], list[int]]] = [([], [], []) for _ in range(nparts)]
            generated = 0
            before = len(nxt)
            unsafe = None
            if expand_ok and cur:
                env = ExpandEnv(
                    succ=ctx.successors,
                    key=ctx.key,
                    fp=ctx.fp_of_key,
                    visited=visited,
                    nxt_append=nxt.append,
                    cov_buf=cov.buf,
                    props=props,
                    is_final=ctx.is_final,
                    me=me,
                    nparts=nparts,
                    out_appends=[(o[0].append, o[1].append, o[2].append) for o in outs],
                )
                flags = dict(
                    coverage=cov.enabled,
                    transition=bool(props.transition),
                    key=ctx.key is not None,
                    int_keys=int_keys,
                    fast=ctx.fp_kind == "fast",
                    check_new=props.wants_new,
                    final=ctx.is_final is not None,
                    deadlock=props.deadlock,
                    graph=False,
                    route=True,
                )
                expand = expander(**flags)
                for lo in range(0, len(cur), _CHUNK):
                    if lo:  # re-specialise: properties may have been decided meanwhile
                        expand = expander(**dict(flags, transition=bool(props.transition),
                                                 check_new=props.wants_new, deadlock=props.deadlock))
                    mark = len(nxt)
                    try:
                        generated += expand(cur[lo : lo + _CHUNK], depth, env)
                        ctx.sample_keys(nxt, mark)
                    except UnsafeHash as error:
                        unsafe = error.reason
                        break
                    except TypeError as error:  # as in `Checker._run`: a state that is not hashable
                        if not (ctx.sampling and str(error).startswith("unhashable type")):
                            raise
                        unsafe = str(error)
                        break
                    cov.flush()
                new_local = len(nxt) - before
                cur, nxt = nxt, []
                unexpanded = 0
            else:
                new_local = 0
                unexpanded = len(cur)
            conn.send(
                (
                    "ok",
                    {
                        "generated": generated,
                        "new_in": new_in,
                        "new_local": new_local,
                        "frontier": len(cur),
                        "unexpanded": unexpanded,
                        "events": list(props.found.values()),
                        "inexact": ctx.inexact,
                        "unsafe": unsafe,
                        "out": [pickle.dumps(o, protocol=5) if o[1] else None for o in outs],
                    },
                )
            )
        elif cmd == "load":
            _, part_visited, part_cur, part_nxt = msg
            visited.update(part_visited)
            cur = list(part_cur)
            nxt = list(part_nxt)
            conn.send(("ok", None))
        elif cmd == "parent":
            conn.send(("ok", visited[msg[1]]))
        elif cmd == "dump":
            conn.send(("ok", ({g: p for g, p in visited.items() if p != FOREIGN}, cur)))
        elif cmd == "coverage":
            conn.send(("ok", cov.kinds()))
        elif cmd == "stop":
            return
        else:  # pragma: no cover - protocol error
            raise RuntimeError(f"unknown command {cmd!r}")


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
            raise RuntimeError(f"checker worker {w} died (exit code {self.procs[w].exitcode})") from None
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


def _partition(items: list[Any], n: int, fp_of: Any) -> list[list[Any]]:
    parts: list[list[Any]] = [[] for _ in range(n)]
    for item in items:
        parts[owner_of(fp_of(item), n)].append(item)
    return parts


def run_parallel_bfs(checker: Checker[Any, Any], ctx: ModelContext) -> Outcome:
    """The parallel BFS (see the module docstring); returns the engine's `Outcome`."""
    from checker.search import NO_PARENT, Found, Outcome, PropertyTracker, UnsafeHash

    n = checker.processes
    props = PropertyTracker(ctx, checker.finish_when)
    start = time.perf_counter()
    elapsed_before = 0.0
    base_cov: dict[str, int] = {}
    pool = _Pool(n, checker.model, _WorkerOptions(checker.check_deadlock, checker.coverage, ctx.fp_kind, ctx.sampling))
    try:
        incoming: list[list[bytes]] = [[] for _ in range(n)]
        if checker.resume_from is not None:
            data = load_checkpoint(checker.resume_from, checker._signature())
            levels = sorted(data["levels"], key=lambda lv: lv[0])
            depth = levels[0][0] if levels else data["depth"]
            cur_items = list(levels[0][1]) if levels else []
            nxt_items = list(levels[1][1]) if len(levels) > 1 else []
            vis_parts: list[dict[int, int]] = [{} for _ in range(n)]
            for g, parent in data["visited"].items():
                vis_parts[owner_of(g, n)][g] = parent
            distinct = len(data["visited"])
            cur_parts = _partition(cur_items, n, lambda it: it[1])
            nxt_parts = _partition(nxt_items, n, lambda it: it[1])
            pool.call_all([("load", vis_parts[w], cur_parts[w], nxt_parts[w]) for w in range(n)])
            del vis_parts
            pending = data.get("pending")
            if pending:
                pdepth, items = pending
                if pdepth != depth:
                    raise CheckpointError("checkpoint: pending states are not at the frontier depth")
                for w, part in enumerate(_partition(list(items), n, lambda it: it[1])):
                    if part:
                        incoming[w].append(_batch(part))
            generated = data["generated"]
            max_seen = data["max_depth"]
            elapsed_before = data["elapsed_s"]
            base_cov = dict(data["coverage"])
            props.restore(data["found"])
        else:
            depth = 0
            distinct = 0
            max_seen = 0
            inits = [(s, g, NO_PARENT) for s, g in ctx.initial()]
            generated = len(inits)
            for w, part in enumerate(_partition(inits, n, lambda it: it[1])):
                if part:
                    incoming[w].append(_batch(part))

        def parent_of(g: int) -> int:
            return pool.call(owner_of(g, n), ("parent", g))

        max_depth = checker.max_depth
        max_states = checker.max_states
        progress = checker.progress
        ck_interval = checker.checkpoint_interval
        now = time.perf_counter()
        next_progress = now + checker.progress_interval if progress else float("inf")
        next_ck = now + ck_interval if (ck_interval is not None and checker.checkpoint_path) else float("inf")
        complete, stop_reason = True, "exhausted"
        frontier = 0
        while True:
            expand_ok = max_depth is None or depth < max_depth
            decided = sorted(props.found)
            replies = pool.call_all([("step", depth, incoming[w], decided, expand_ok) for w in range(n)])
            incoming = [[] for _ in range(n)]
            new_in = sum(r["new_in"] for r in replies)
            new_local = sum(r["new_local"] for r in replies)
            distinct += new_in + new_local
            generated += sum(r["generated"] for r in replies)
            if new_in and depth > max_seen:
                max_seen = depth
            if new_local and depth + 1 > max_seen:
                max_seen = depth + 1
            for r in replies:
                if r["unsafe"] is not None:
                    raise UnsafeHash(r["unsafe"])
                ctx.inexact = ctx.inexact or r["inexact"]
                for f in r["events"]:
                    props.record(f)
                for dest, blob in enumerate(r["out"]):
                    if blob is not None:
                        incoming[dest].append(blob)
            frontier = sum(r["frontier"] for r in replies)
            pending = any(incoming)
            if not expand_ok:
                if sum(r["unexpanded"] for r in replies):
                    complete, stop_reason = False, "max_depth"
                break
            depth += 1
            if frontier == 0 and not pending:
                break
            if props.stop:
                complete = False
                stop_reason = "all_decided" if checker.finish_when == "all_decided" else "violation"
                break
            if checker._stop_requested.is_set():
                complete, stop_reason = False, "stop_requested"
                break
            if max_states is not None and distinct >= max_states:
                complete, stop_reason = False, "max_states"
                break
            now = time.perf_counter()
            if now >= next_progress:
                next_progress = now + checker.progress_interval
                progress(Progress("bfs", generated, distinct, frontier, depth, elapsed_before + now - start))  # type: ignore[misc]
            if now >= next_ck or checker._checkpoint_requested.is_set():
                checker._checkpoint_requested.clear()
                if checker.checkpoint_path:
                    _write_checkpoint(checker, pool, depth, incoming, generated, max_seen, props.found,
                                      _coverage(pool, base_cov), elapsed_before + now - start)
                next_ck = now + ck_interval if (ck_interval is not None and checker.checkpoint_path) else float("inf")
        coverage = _coverage(pool, base_cov)
        elapsed = elapsed_before + time.perf_counter() - start
        if not complete and checker.checkpoint_path and stop_reason in ("max_states", "stop_requested"):
            _write_checkpoint(checker, pool, depth, incoming, generated, max_seen, props.found, coverage, elapsed)
        if progress:
            progress(Progress("bfs", generated, distinct, frontier, max_seen, elapsed, done=True))
        # Rebuild the parent chains now, while the workers are alive.
        chains: dict[int, int] = {}
        for f in props.found.values():
            g = f.fp
            while g != NO_PARENT and g not in chains:
                chains[g] = parent_of(g)
                g = chains[g]
        found: dict[str, Found] = dict(props.found)
    finally:
        pool.close()
    out = Outcome(
        "bfs",
        generated,
        distinct,
        max_seen,
        elapsed,
        coverage,
        complete,
        stop_reason,
        found,
        chains.__getitem__,
        None,
        processes=n,
    )
    return out


def _batch(items: list[tuple[Any, int, int]]) -> bytes:
    """A batch of candidate states as workers exchange them: (states, fingerprints, parents)."""
    states, fps, parents = (list(col) for col in zip(*items)) if items else ([], [], [])
    return pickle.dumps((states, fps, parents), protocol=5)


def _coverage(pool: _Pool, base: dict[str, int]) -> dict[str, int]:
    out = dict(base)
    for part in pool.call_all([("coverage",)] * pool.n):
        for k, v in part.items():
            out[k] = out.get(k, 0) + v
    return out


def _write_checkpoint(
    checker: Checker[Any, Any],
    pool: _Pool,
    depth: int,
    incoming: list[list[bytes]],
    generated: int,
    max_seen: int,
    found: dict[str, Any],
    coverage: dict[str, int],
    elapsed: float,
) -> None:
    """Checkpoint between two steps: the next level is the workers' frontiers plus the
    routed-but-undelivered candidates (`pending`), all at `depth`."""
    visited: dict[int, int] = {}
    level: list[Any] = []
    for part_visited, part_cur in pool.call_all([("dump",)] * pool.n):
        visited.update(part_visited)
        level.extend(part_cur)
    pending = [item for blobs in incoming for blob in blobs for item in zip(*pickle.loads(blob))]
    save_checkpoint(
        checker.checkpoint_path,  # type: ignore[arg-type]
        {
            "model": checker._signature(),
            "strategy": "bfs",
            "visited": visited,
            "levels": [(depth, level)],
            "depth": depth,
            "pending": (depth, pending),
            "generated": generated,
            "max_depth": max_seen,
            "elapsed_s": elapsed,
            "coverage": coverage,
            "found": dict(found),
        },
    )
    checker.checkpoints_written += 1
