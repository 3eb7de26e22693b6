"""Depth-first search (``Checker.dfs()``; see `checker.search`): a small frontier, not the
shortest counterexamples.  Checkpoints are not supported (a resumed search would need the
stack's order)."""

from __future__ import annotations

import time
from typing import Any

from checker.checkpoint import CheckpointError
from checker.engine import (
    NO_PARENT,
    Coverage,
    GraphRecorder,
    Housekeeping,
    ModelContext,
    Outcome,
    PropertyTracker,
    SearchOptions,
)
from checker.result import Progress

__all__ = ["run_dfs"]


def run_dfs(options: SearchOptions, ctx: ModelContext) -> Outcome:
    if options.resume_from is not None:
        raise CheckpointError("checkpoint/resume is supported by bfs() only")
    props = PropertyTracker(ctx, options.finish_when)
    start = time.perf_counter()
    recorder = GraphRecorder(ctx, options.labelled_graph) if options.record_graph else None
    visited: dict[int, int] = {}
    stack: list[tuple[Any, int, int]] = []
    generated = 0
    for s, g in ctx.initial():
        generated += 1
        visited[g] = NO_PARENT
        if recorder is not None:
            recorder.node(s, g, init=True)
        if props.wants_new:
            props.check_new(s, g, 0)
        stack.append((s, g, 0))
    stack.reverse()
    succ = ctx.successors
    fp = ctx.fp
    need_final = ctx.is_final is not None
    is_final: Any = ctx.is_final  # called only when need_final
    cov = Coverage(ctx, options.coverage)
    cov_append = cov.append
    max_depth = options.max_depth
    housekeeping = Housekeeping(options, start)
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
            if recorder is not None:
                recorder.edge(f, g, a)
            if g in visited:
                continue
            visited[g] = f
            if props.wants_new:
                props.check_new(t, g, depth + 1)
            if recorder is not None:
                recorder.node(t, g)
            fresh.append((t, g, depth + 1))
        generated += n
        fin = is_final(s) if need_final else False
        if fin or n == 0:
            props.check_expanded(s, f, depth, n, fin)
            if recorder is not None and fin:
                recorder.mark_final(f)
        fresh.reverse()
        stack.extend(fresh)
        count += 1
        if count & 255 == 0:
            cov.flush()
            ctx.sample_keys(stack, max(0, len(stack) - 16))
            reason = options.stop_reason(props, len(visited), bool(stack))
            if reason is not None:
                complete, stop_reason = False, reason
                break
            now = time.perf_counter()
            report = housekeeping.progress_due(now)
            if report is not None:
                report(Progress("dfs", generated, len(visited), len(stack), max_seen, now - start))
    elapsed = time.perf_counter() - start
    if options.progress:
        options.progress(Progress("dfs", generated, len(visited), len(stack), max_seen, elapsed,
                                  done=True))
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
        recorder,
    )
