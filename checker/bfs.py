"""The sequential breadth-first search (``Checker(processes=1).bfs()``; see `checker.search`).

Level by level, in chunks of `CHUNK` states: each chunk goes through the hot loop
(`checker._expand`, specialised to the properties still open), and between two chunks the
search does its housekeeping: it stops by the engine's one stop rule
(`SearchOptions.stop_reason`: a verdict, a request, ``max_states``), reports progress and
writes checkpoints (`Housekeeping`).  A search resumed from a checkpoint starts from the levels
it holds (`starting_levels`), as the parallel search does.
"""

from __future__ import annotations

import time
from typing import Any

from checker.checkpoint import CheckpointError, Levels
from checker.engine import (
    Coverage,
    GraphRecorder,
    Housekeeping,
    ModelContext,
    Outcome,
    PropertyTracker,
    SearchOptions,
    starting_levels,
)
from checker.fpset import FingerprintSet
from checker.result import Progress

__all__ = ["CHUNK", "run_sequential_bfs"]

CHUNK = 256  # states expanded between two housekeeping checks (time, limits)
_CLEARED: list[Any] = [None] * CHUNK  # what an expanded chunk's slots of its level become


def run_sequential_bfs(options: SearchOptions, ctx: ModelContext) -> Outcome:
    return _SequentialBFS(options, ctx).run()


class _SequentialBFS:
    """One run: the frontier (`current`, expanded from index `i`; `nxt`, the next level), the
    visited set with its parent pointers (a `FingerprintSet`), and the counters an `Outcome`
    reports."""

    def __init__(self, options: SearchOptions, ctx: ModelContext) -> None:
        self.options = options
        self.ctx = ctx
        self.props = PropertyTracker(ctx, options.finish_when)
        self.start = time.perf_counter()
        self.recorder = (GraphRecorder(ctx, options.labelled_graph) if options.record_graph
                         else None)
        if self.recorder is not None and options.resume_from is not None:
            raise CheckpointError("record_graph cannot be combined with resume_from")
        levels = starting_levels(options, ctx)
        self.visited = FingerprintSet.from_items(levels.visited.items(),
                                                 signed=ctx.fp_kind == "fast")
        self.depth = levels.depth
        self.current = levels.current
        self.i = 0
        self.nxt = levels.following
        self.generated = levels.generated
        self.max_seen = levels.max_depth
        self.elapsed_before = levels.elapsed_s  # the search time of the run a checkpoint resumes
        self.base_cov = levels.coverage  # ... and its coverage
        self.complete = True
        self.stop_reason = "exhausted"
        self.props.restore(levels.found)
        if self.recorder is not None:  # a fresh search: `current` holds the initial states
            for s, g in self.current:
                self.recorder.node(s, g, init=True)
        if self.props.wants_new:
            for s, g in levels.unchecked:
                self.props.check_new(s, g, self.depth)
        self.cov = Coverage(ctx, options.coverage)

    def run(self) -> Outcome:
        ctx, props, cov, options = self.ctx, self.props, self.cov, self.options
        env = ctx.expand_env(self.visited, self.nxt.append, cov, props)
        recorder = self.recorder
        pairs = recorder.pairs_append if recorder is not None else None
        if recorder is not None:
            env.graph_edge = pairs if pairs is not None else recorder.edge
            env.graph_node = recorder.node
            env.graph_final = recorder.mark_final
        self.housekeeping = Housekeeping(options, time.perf_counter())
        max_depth = options.max_depth
        if max_depth is not None and self.depth >= max_depth and self.current:
            self._stop(False, "max_depth")
            self.current = []
        while True:
            if self.i >= len(self.current):
                if not self.nxt:
                    break
                self._next_level()
                env.nxt_append = self.nxt.append
                if max_depth is not None and self.depth >= max_depth:
                    self._stop(False, "max_depth")
                    break
                continue
            current, lo = self.current, self.i
            chunk = current[lo : lo + CHUNK]
            self.i = hi = lo + len(chunk)
            expand = ctx.expander(cov, props, check_new=props.wants_new, graph=recorder is not None,
                                  graph_pairs=pairs is not None, batch=True)
            nxt = self.nxt
            before = len(nxt)
            self.generated += expand(chunk, self.depth, env)
            # The chunk's states are done with: free them now, not with their level, so that the
            # next level's states reuse their memory while it is still in the caches (and the
            # collector does not walk them).
            current[lo:hi] = _CLEARED[: hi - lo]
            del chunk
            cov.flush()
            if ctx.sampling:
                ctx.sample_keys(nxt, before)
            if nxt and self.depth + 1 > self.max_seen:
                self.max_seen = self.depth + 1
            reason = options.stop_reason(props, len(self.visited), self._frontier() > 0)
            if reason is not None:
                self._stop(False, reason)
                break
            self._report_and_checkpoint()
        return self._finish()

    def _next_level(self) -> None:
        self.current, self.nxt, self.i = self.nxt, [], 0
        self.depth += 1
        if self.depth > self.max_seen:
            self.max_seen = self.depth

    def _stop(self, complete: bool, reason: str) -> None:
        self.complete, self.stop_reason = complete, reason

    def _report_and_checkpoint(self) -> None:
        """Between two chunks: progress and checkpoints, when due (`Housekeeping`)."""
        now = time.perf_counter()
        report = self.housekeeping.progress_due(now)
        if report is not None:
            report(Progress("bfs", self.generated, len(self.visited), self._frontier(),
                            self.depth, self.elapsed_before + now - self.start))
        if self.housekeeping.checkpoint_due(now):
            self._save_checkpoint()

    def _frontier(self) -> int:
        return len(self.current) - self.i + len(self.nxt)

    def _coverage_now(self) -> dict[str, int]:
        out = dict(self.base_cov)
        for k, n in self.cov.kinds().items():
            out[k] = out.get(k, 0) + n
        return out

    def _save_checkpoint(self) -> None:
        self.options.save_checkpoint(Levels(
            visited=dict(self.visited.items()),
            depth=self.depth,
            current=self.current[self.i :],
            following=self.nxt,
            generated=self.generated,
            max_depth=self.max_seen,
            elapsed_s=self.elapsed_before + time.perf_counter() - self.start,
            coverage=self._coverage_now(),
            found=self.props.found,
        ))

    def _finish(self) -> Outcome:
        options = self.options
        elapsed = self.elapsed_before + time.perf_counter() - self.start
        if options.checkpoint_on_stop(self.stop_reason):
            self._save_checkpoint()
        if options.progress:
            options.progress(Progress("bfs", self.generated, len(self.visited), self._frontier(),
                                      self.max_seen, elapsed, done=True))
        return Outcome(
            "bfs",
            self.generated,
            len(self.visited),
            self.max_seen,
            elapsed,
            self._coverage_now(),
            self.complete,
            self.stop_reason,
            self.props.found,
            self.visited.__getitem__,
            self.recorder,
        )
