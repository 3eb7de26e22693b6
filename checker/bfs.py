"""The sequential breadth-first search (``Checker(processes=1).bfs()``; see `checker.search`).

Level by level, in chunks of `CHUNK` states: each chunk goes through the hot loop
(`checker._expand`, specialised to the properties still open), and between two chunks the
search does its housekeeping: it stops when `finish_when` says so, on request or at
``max_states``, reports progress, and writes checkpoints.  A search resumed from a checkpoint
starts from the levels the checkpoint holds.
"""

from __future__ import annotations

import time
from typing import Any

from checker.checkpoint import CheckpointError, load_checkpoint, pending_states, save_checkpoint
from checker.engine import (
    NO_PARENT,
    Coverage,
    GraphRecorder,
    ModelContext,
    Outcome,
    PropertyTracker,
    SearchOptions,
)
from checker.result import Progress

__all__ = ["CHUNK", "run_sequential_bfs"]

CHUNK = 256  # states expanded between two housekeeping checks (time, limits)
_CLEARED: list[Any] = [None] * CHUNK  # what an expanded chunk's slots of its level become


def run_sequential_bfs(checker: SearchOptions, ctx: ModelContext) -> Outcome:
    return _SequentialBFS(checker, ctx).run()


class _SequentialBFS:
    """One run: the frontier (`current`, expanded from index `i`; `nxt`, the next level), the
    visited set with its parent pointers, and the counters an `Outcome` reports."""

    def __init__(self, checker: SearchOptions, ctx: ModelContext) -> None:
        self.checker = checker
        self.ctx = ctx
        self.props = PropertyTracker(ctx, checker.finish_when)
        self.start = time.perf_counter()
        self.elapsed_before = 0.0  # the search time of the run a checkpoint resumes
        self.base_cov: dict[str, int] = {}  # ... and its coverage
        self.recorder = GraphRecorder(ctx, checker._labelled) if checker.record_graph else None
        self.visited: dict[int, Any] = {}
        self.generated = 0
        self.depth = 0
        self.max_seen = 0
        self.current: list[tuple[Any, int]] = []
        self.nxt: list[tuple[Any, int]] = []
        self.i = 0
        self.complete = True
        self.stop_reason = "exhausted"
        if checker.resume_from is not None:
            self._resume(checker.resume_from)
        else:
            self._start_from_initial_states()
        self.cov = Coverage(ctx, checker.coverage)

    def _resume(self, path: str) -> None:
        """Start from a checkpoint's visited set and levels (and the states it had not yet
        visited, at the frontier's depth)."""
        if self.recorder is not None:
            raise CheckpointError("record_graph cannot be combined with resume_from")
        data = load_checkpoint(path, self.checker._signature())
        props = self.props
        self.visited = visited = data["visited"]
        levels = sorted(data["levels"], key=lambda lv: lv[0])
        self.depth = depth = levels[0][0] if levels else data["depth"]
        self.current = current = list(levels[0][1]) if levels else []
        self.nxt = list(levels[1][1]) if len(levels) > 1 else []
        self.generated = data["generated"]
        self.max_seen = data["max_depth"]
        self.elapsed_before = data["elapsed_s"]
        self.base_cov = dict(data["coverage"])
        props.restore(data["found"])
        for t, g, parent in pending_states(data, depth):
            if g not in visited:
                visited[g] = parent
                if props.wants_new:
                    props.check_new(t, g, depth)
                current.append((t, g))

    def _start_from_initial_states(self) -> None:
        props, recorder = self.props, self.recorder
        for s, g in self.ctx.initial():
            self.generated += 1
            self.visited[g] = NO_PARENT
            if recorder is not None:
                recorder.node(s, g, init=True)
            if props.wants_new:
                props.check_new(s, g, 0)
            self.current.append((s, g))

    def run(self) -> Outcome:
        ctx, props, cov, checker = self.ctx, self.props, self.cov, self.checker
        env = ctx.expand_env(self.visited, self.nxt.append, cov, props)
        recorder = self.recorder
        pairs = recorder.pairs_append if recorder is not None else None
        if recorder is not None:
            env.graph_edge = pairs if pairs is not None else recorder.edge
            env.graph_node = recorder.node
            env.graph_final = recorder.mark_final
        now = time.perf_counter()
        self._next_progress = now + checker.progress_interval if checker.progress else float("inf")
        self._next_checkpoint = self._checkpoint_due(now)
        max_depth = checker.max_depth
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
                                  graph_pairs=pairs is not None)
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
            if self._should_stop():
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

    def _should_stop(self) -> bool:
        """Between two chunks: whether a verdict, a request or ``max_states`` ends the search."""
        checker = self.checker
        if self.props.stop:
            if self.i >= len(self.current) and not self.nxt:
                self._stop(True, "exhausted")
            else:
                reason = "all_decided" if checker.finish_when == "all_decided" else "violation"
                self._stop(False, reason)
            return True
        if checker._stop_requested.is_set():
            self._stop(False, "stop_requested")
            return True
        max_states = checker.max_states
        if (
            max_states is not None
            and len(self.visited) >= max_states
            and (self.i < len(self.current) or self.nxt)
        ):
            self._stop(False, "max_states")
            return True
        return False

    def _report_and_checkpoint(self) -> None:
        """Between two chunks: progress every ``progress_interval`` seconds; a checkpoint every
        ``checkpoint_interval`` seconds or when one was requested."""
        checker = self.checker
        now = time.perf_counter()
        if now >= self._next_progress:
            self._next_progress = now + checker.progress_interval
            checker.progress(  # type: ignore[misc]
                Progress("bfs", self.generated, len(self.visited), self._frontier(), self.depth,
                         self.elapsed_before + now - self.start)
            )
        if now >= self._next_checkpoint or checker._checkpoint_requested.is_set():
            checker._checkpoint_requested.clear()
            if checker.checkpoint_path:
                self._save_checkpoint()
            self._next_checkpoint = self._checkpoint_due(now)

    def _checkpoint_due(self, now: float) -> float:
        checker = self.checker
        interval = checker.checkpoint_interval
        if interval is not None and checker.checkpoint_path:
            return now + interval
        return float("inf")

    def _frontier(self) -> int:
        return len(self.current) - self.i + len(self.nxt)

    def _coverage_now(self) -> dict[str, int]:
        out = dict(self.base_cov)
        for k, n in self.cov.kinds().items():
            out[k] = out.get(k, 0) + n
        return out

    def _save_checkpoint(self) -> None:
        levels = [(self.depth, self.current[self.i :])]
        if self.nxt:
            levels.append((self.depth + 1, self.nxt))
        checker = self.checker
        save_checkpoint(checker.checkpoint_path, {  # type: ignore[arg-type]
            "model": checker._signature(),
            "strategy": "bfs",
            "visited": self.visited,
            "levels": levels,
            "depth": self.depth,
            "pending": None,
            "generated": self.generated,
            "max_depth": self.max_seen,
            "elapsed_s": self.elapsed_before + time.perf_counter() - self.start,
            "coverage": self._coverage_now(),
            "found": dict(self.props.found),
        })
        checker.checkpoints_written += 1

    def _finish(self) -> Outcome:
        checker = self.checker
        elapsed = self.elapsed_before + time.perf_counter() - self.start
        if (
            not self.complete
            and checker.checkpoint_path
            and self.stop_reason in ("max_states", "stop_requested")
        ):
            self._save_checkpoint()
        if checker.progress:
            checker.progress(Progress("bfs", self.generated, len(self.visited), self._frontier(),
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
