"""The sequential breadth-first search (``Checker(processes=1).bfs()``; see `checker.search`).

Level by level, in chunks of `CHUNK` states: each chunk goes through the hot loop
(`checker._expand`, specialised to the properties still open), and between two chunks the
search does its housekeeping: it stops by the engine's one stop rule
(`SearchOptions.stop_reason`: a verdict, a request, ``max_states``), reports progress, writes
checkpoints (`Housekeeping`) and spills the next level to disk past its memory budget
(`SearchOptions.queue_memory`).  A search resumed from a checkpoint starts from the levels it
holds (`starting_levels`), as the parallel search does.

Memory per state (`checker.statefiles`): the visited set keeps the fingerprints alone, in a
`checker.fpset.FingerprintSet`; the parent pointers go to a file, and so does the frontier
past its budget, in the search's ``states/`` folder, removed once the result is built.
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
from checker.result import Progress
from checker.statefiles import LevelQueue, StatesDirectory, VisitedStates, estimate_pair_bytes

__all__ = ["CHUNK", "run_sequential_bfs"]

CHUNK = 256  # states expanded between two housekeeping checks (time, limits)
_CLEARED: list[Any] = [None] * CHUNK  # what an expanded chunk's slots of its level become


def run_sequential_bfs(options: SearchOptions, ctx: ModelContext) -> Outcome:
    """The search; its files stay until the outcome's `release` (traces are read from them)."""
    files = StatesDirectory(options.work_dir)
    search = None
    try:
        search = _SequentialBFS(options, ctx, files)
        return search.run()
    except BaseException:
        if search is not None:
            search.close()
        files.remove()
        raise


class _SequentialBFS:
    """One run: the level being expanded (`level`, read back part by part: `current`, its
    part `part`, expanded from index `i`), the next one (`nxt`), the visited set with its
    parent pointers (`VisitedStates`), and the counters an `Outcome` reports."""

    def __init__(self, options: SearchOptions, ctx: ModelContext, files: StatesDirectory) -> None:
        self.options = options
        self.ctx = ctx
        self.files = files
        self.props = PropertyTracker(ctx, options.finish_when)
        self.start = time.perf_counter()
        self.recorder = (GraphRecorder(ctx, options.labelled_graph) if options.record_graph
                         else None)
        if self.recorder is not None and options.resume_from is not None:
            raise CheckpointError("record_graph cannot be combined with resume_from")
        levels = starting_levels(options, ctx)
        self.visited = VisitedStates.from_items(levels.visited.items(),
                                                signed=ctx.fp_kind == "fast", directory=files.path)
        self.depth = levels.depth
        # The queue's budget in states: `queue_memory` over the size of a queued state (None:
        # not yet known, or no budget), estimated on the first states queued, then again on
        # each level's first `_SAMPLE` (at `estimated`: the depth they were queued from).
        self.budget: int | None = None
        self.pair_bytes = 0
        self.estimated = -1
        self.level = LevelQueue(files.path, None, levels.current)
        self.part = 0
        self.current = self.level.part(0)
        self.i = 0
        self.level_left = 0  # the states of the level's parts after `part`
        self.nxt = LevelQueue(files.path, None, levels.following)
        self.peak_queue_states = self.peak_queue_bytes = self.peak_queue_disk = 0
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
        env = ctx.expand_env(self.visited, self.nxt.items.append, cov, props)
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
            # a chunk is the level's next `CHUNK` states, across its parts: the stop rule is
            # then met where it would be with the whole level in memory
            if len(self.current) - self.i < CHUNK and self.part + 1 < self.level.parts:
                self._next_part()
                continue
            if self.i >= len(self.current):
                if not self.nxt:
                    break
                self._next_level()
                env.nxt_append = self.nxt.items.append
                if max_depth is not None and self.depth >= max_depth:
                    self._stop(False, "max_depth")
                    break
                continue
            current, lo = self.current, self.i
            chunk = current[lo : lo + CHUNK]
            self.i = hi = lo + len(chunk)
            expand = ctx.expander(cov, props, check_new=props.wants_new, graph=recorder is not None,
                                  graph_pairs=pairs is not None, batch=True)
            nxt = self.nxt.items
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
            self._bound_queue()
            reason = options.stop_reason(props, len(self.visited), self._frontier() > 0)
            if reason is not None:
                self._stop(False, reason)
                break
            self._report_and_checkpoint()
        return self._finish()

    def _bound_queue(self) -> None:
        """Spill the next level to disk past the budget (known once a state is queued), and
        keep the queue's peaks."""
        nxt = self.nxt
        queue_memory = self.options.queue_memory
        if queue_memory is not None and nxt.items and self.estimated < self.depth and (
                self.budget is None or len(nxt.items) >= _SAMPLE):
            self.pair_bytes = estimate_pair_bytes(nxt.items[:_SAMPLE])
            self.budget = nxt.budget = max(1, queue_memory // self.pair_bytes)
            if len(nxt.items) >= _SAMPLE:
                self.estimated = self.depth
        in_memory = len(self.current) - self.i + len(nxt.items)
        self.peak_queue_states = max(self.peak_queue_states, in_memory)
        self.peak_queue_bytes = max(self.peak_queue_bytes, in_memory * self.pair_bytes)
        nxt.spill_if_over()
        self.peak_queue_disk = max(self.peak_queue_disk, self.level.disk_bytes + nxt.disk_bytes)

    def _next_part(self) -> None:
        """The level's next part read back after the states of `current` left to expand."""
        rest = self.current[self.i :]
        self.part += 1
        part = self.level.part(self.part)
        self.level_left -= len(part)
        self.current, self.i = rest + part, 0

    def _next_level(self) -> None:
        self.level.close()
        self.level, self.nxt = self.nxt, LevelQueue(self.files.path, self.budget)
        self.part, self.i = 0, 0
        self.level_left = len(self.level)
        self.current = self.level.part(0)
        self.level_left -= len(self.current)
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
        return len(self.current) - self.i + self.level_left + len(self.nxt)

    def _coverage_now(self) -> dict[str, int]:
        out = dict(self.base_cov)
        for k, n in self.cov.kinds().items():
            out[k] = out.get(k, 0) + n
        return out

    def _save_checkpoint(self) -> None:
        """The whole search in one file: the parents read back from theirs, the levels from
        theirs (a checkpoint holds what the search keeps on disk)."""
        self.options.save_checkpoint(Levels(
            visited=dict(self.visited.parents.items()),
            depth=self.depth,
            current=self.current[self.i :] + self.level.states_from(self.part + 1),
            following=self.nxt.states_from(0),
            generated=self.generated,
            max_depth=self.max_seen,
            elapsed_s=self.elapsed_before + time.perf_counter() - self.start,
            coverage=self._coverage_now(),
            found=self.props.found,
        ))

    def close(self) -> None:
        """Close the files (the folder is the caller's to remove)."""
        self.visited.close()
        self.level.close()
        self.nxt.close()

    def release(self) -> None:
        self.close()
        self.files.remove()

    def memory(self) -> dict[str, float]:
        """What the search held, for the benchmarks: the visited set's bytes in memory (its
        table, and the parent records not yet written), the parent file's, and the queue's
        peaks (states in memory, their estimated bytes: 0 without a budget; bytes on disk)."""
        visited = self.visited
        return {
            "visited_bytes": visited.table.nbytes + visited.parents.buffer_bytes,
            "parents_disk_bytes": visited.parents.disk_bytes,
            "queue_peak_states": self.peak_queue_states,
            "queue_peak_bytes": self.peak_queue_bytes,
            "queue_peak_disk_bytes": self.peak_queue_disk,
        }

    def _finish(self) -> Outcome:
        options = self.options
        elapsed = self.elapsed_before + time.perf_counter() - self.start
        if options.checkpoint_on_stop(self.stop_reason):
            self._save_checkpoint()
        if options.progress:
            options.progress(Progress("bfs", self.generated, len(self.visited), self._frontier(),
                                      self.max_seen, elapsed, done=True))
        outcome = Outcome(
            "bfs",
            self.generated,
            len(self.visited),
            self.max_seen,
            elapsed,
            self._coverage_now(),
            self.complete,
            self.stop_reason,
            self.props.found,
            self.visited.parents.parent_of,
            self.recorder,
        )
        outcome.memory = self.memory()
        outcome.release = self.release
        return outcome


_SAMPLE = 1024  # queued states whose size estimates every one's (they share parts)
