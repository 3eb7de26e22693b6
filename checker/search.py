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
  that contains no final state (or a path to a non-final state without successors).  With
  ``processes > 1`` each worker records the transitions it expands (as arrays of 64-bit
  fingerprints) and the coordinator answers from all of them (`checker.engine.EdgeArrays`).
* Memory: the sequential breadth-first search keeps its visited set as a compact
  open-addressing table of 64-bit fingerprints (`checker.fpset.FingerprintSet`, TLC's FPSet):
  8 bytes a slot, 11-22 bytes per state, and, as TLC, writes each state's parent fingerprint
  to a file in discovery order, read back for a counterexample (`checker.statefiles`;
  `reports/checker/visited_memory.md` measures it against the layouts it replaced).  The BFS
  queue adds a ``(state, fingerprint)`` tuple (56 B + the state) per queued state, up to
  `queue_memory` bytes for the next level; past it the level is pickled to disk and read
  back in order (at a cost in time: pickling, and the states read back are copies, on which
  a model that memoises by object identity, as the Invar model does, misses).  Both files
  lie in a ``states/`` folder of `work_dir`, removed when the result is built.  The
  depth-first search keeps a dict (a lookup per transition, no batch to hand over).  In
  parallel runs each worker keeps the fingerprints it has met (its states', and those
  another worker holds: never proposed twice) in such a table, and their parents in a file
  of its own; the coordinator keeps one ``fingerprint -> worker`` dict, and the queue stays
  in the workers' memory.
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic

from checker.bfs import run_sequential_bfs
from checker.dfs import run_dfs
from checker.engine import (
    NO_PARENT,
    Found,
    ModelContext,
    Outcome,
    SearchControl,
    SearchOptions,
    UnsafeHash,
)
from checker.fingerprint import all_hash_by_value, collision_probability
from checker.liveness import check_eventually, check_livelock
from checker.model import A, PropertyKind, S
from checker.parallel import fork_available, run_parallel_bfs
from checker.result import CheckResult, Progress, PropertyResult, Verdict
from checker.simulate import run_simulation
from checker.trace import Trace

__all__ = ["Checker", "check"]

FINISH_MODES = ("all_decided", "any_failure", "exhausted")
FINGERPRINT_MODES = ("auto", "fast", "stable")
DEFAULT_QUEUE_MEMORY = 512 << 20  # bytes of the next BFS level kept in memory (see Checker)
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
      queue_memory     bytes the sequential `bfs` keeps of its next level in memory (by the
                       estimated size of its first queued states; default 512 MiB): past
                       them the level is spilled to disk and read back in order (None: never);
      work_dir         where the sequential `bfs` makes its ``states/`` folder, for the
                       parent pointers and the spilled levels (default: a temporary folder);
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
        queue_memory: int | None = DEFAULT_QUEUE_MEMORY,
        work_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if finish_when not in FINISH_MODES:
            raise ValueError(f"finish_when must be one of {FINISH_MODES}, not {finish_when!r}")
        if fingerprints not in FINGERPRINT_MODES:
            raise ValueError(
                f"fingerprints must be one of {FINGERPRINT_MODES}, not {fingerprints!r}"
            )
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
        if queue_memory is not None and queue_memory < 0:
            raise ValueError(f"queue_memory must be at least 0 bytes, not {queue_memory}")
        self.queue_memory = queue_memory
        self.work_dir = os.fspath(work_dir) if work_dir is not None else None
        self._control = SearchControl()

    # ------------------------------------------------------------------ public API

    @property
    def checkpoints_written(self) -> int:
        """The checkpoints this checker's searches have written."""
        return self._control.checkpoints_written

    def request_checkpoint(self) -> None:
        """Ask a running `bfs` to write a checkpoint at its next housekeeping point."""
        self._control.checkpoint_requested.set()

    def request_stop(self) -> None:
        """Ask a running search to stop at its next housekeeping point (result incomplete)."""
        self._control.stop_requested.set()

    def _options(self) -> SearchOptions:
        """What the strategies read: the options as they are when a search starts."""
        return SearchOptions(
            model=self.model,
            control=self._control,
            max_states=self.max_states,
            max_depth=self.max_depth,
            processes=self.processes,
            check_deadlock=self.check_deadlock,
            record_graph=self.record_graph,
            labelled_graph=self._labelled,
            finish_when=self.finish_when,
            progress=self.progress,
            progress_interval=self.progress_interval,
            checkpoint_path=self.checkpoint_path,
            checkpoint_interval=self.checkpoint_interval,
            resume_from=self.resume_from,
            coverage=self.coverage,
            queue_memory=self.queue_memory,
            work_dir=self.work_dir,
        )

    def _start(self, fingerprints: str | None = None) -> ModelContext:
        self._control.stop_requested.clear()
        mode = fingerprints or self.fingerprints
        if mode == "auto":
            ctx = ModelContext(self.model, self.check_deadlock, "stable")
            # A recorded graph (livelock) is built in one process or its forks: fast
            # fingerprints label its nodes as well as stable ones would.
            if not (self.checkpoint_path or self.resume_from):
                key = ctx.key
                keys = [key(s) if key is not None else s for s in self.model.init_states()]
                if all_hash_by_value(keys) is None:
                    ctx = ModelContext(self.model, self.check_deadlock, "fast")
                    ctx.sampling = ctx.fp_kind == "fast"
            return ctx
        return ModelContext(self.model, self.check_deadlock, mode)

    def _run(self, search: Callable[[SearchOptions, ModelContext], Outcome]) -> CheckResult:
        """Run `search` with fast fingerprints when they are valid, else with stable ones."""
        options = self._options()
        ctx = self._start()
        with _quiet_gc():
            try:
                outcome = search(options, ctx)
            except UnsafeHash as unsafe:
                reason = unsafe.reason
            except TypeError as error:
                # A state holding an unhashable value (a list, a dict) cannot have a fast
                # fingerprint; the stable one encodes it.  Any other TypeError is the model's.
                if not (ctx.sampling and str(error).startswith("unhashable type")):
                    raise
                reason = str(error)
            else:
                return self._result_released(ctx, outcome)
            ctx = self._start("stable")
            outcome = search(options, ctx)
        outcome.notes.append(f"started again with stable fingerprints: {reason}")
        return self._result_released(ctx, outcome)

    def _result_released(self, ctx: ModelContext, outcome: Outcome) -> CheckResult:
        """The result, then the search's files freed (its traces are read from them)."""
        try:
            return self._result(ctx, outcome)
        finally:
            if outcome.release is not None:
                outcome.release()

    def bfs(self) -> CheckResult:
        """Breadth-first search: shortest counterexamples; parallel when ``processes > 1``."""
        notes: list[str] = []
        # The livelock check's graph is gathered from the workers' edges; a labelled graph
        # (asked for, to be written out) is recorded in one process.
        if self.processes > 1 and not self._labelled:
            if fork_available():
                return self._run(run_parallel_bfs)
            notes = ["parallel search needs the 'fork' start method; ran in one process"]
        elif self.processes > 1:
            notes = [f"one process, not {self.processes}: the recorded graph is held whole"]

        def sequential(options: SearchOptions, ctx: ModelContext) -> Outcome:
            outcome = run_sequential_bfs(options, ctx)
            outcome.notes[:0] = notes
            return outcome

        return self._run(sequential)

    def dfs(self) -> CheckResult:
        """Depth-first search (not shortest counterexamples; small frontier)."""
        return self._run(run_dfs)

    def simulate(self, runs: int = 100, max_depth: int = 1000, seed: int = 0) -> CheckResult:
        """`runs` random walks of at most `max_depth` steps (reproducible from `seed`).

        Checks always/sometimes on every visited state, transition properties on the steps
        taken, final properties and deadlocks at walk ends (a walk ends in a final state,
        a state without successors, or at `max_depth`).  ``eventually`` properties are
        checked on walks that end, and on walks that revisit a state (a lasso) before
        meeting the predicate.  Never `complete`: unreached ``sometimes`` stay NOT_REACHED.
        """
        return self._run(
            lambda options, ctx: run_simulation(options, ctx, runs, max_depth, seed)
        )

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
                results[prop.name] = PropertyResult(
                    prop.name, kind, Verdict.VIOLATED, self._trace_of(ctx, outcome, hit)
                )
        for name, pred in ctx.eventually:
            if outcome.strategy == "simulate":
                hit = found.get(name)
                if hit is not None:
                    results[name] = PropertyResult(name, "eventually", Verdict.VIOLATED, hit.trace)
                else:
                    results[name] = PropertyResult(
                        name, "eventually", Verdict.HOLDS, note="on the simulated walks"
                    )
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
            recorder = outcome.recorder
            if recorder is None or not outcome.complete:
                results["livelock"] = PropertyResult(
                    "livelock",
                    "livelock",
                    Verdict.UNKNOWN,
                    note="needs a complete search with the graph recorded",
                )
            elif recorder.every_state_can_finish():
                results["livelock"] = PropertyResult("livelock", "livelock", Verdict.HOLDS)
            else:
                results["livelock"] = check_livelock(ctx, recorder.graph)
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
            recorded=outcome.recorder,
            notes=list(outcome.notes),
            fingerprints=kind,
            collision_probability=(
                0.0
                if kind == "exact"
                else collision_probability(outcome.distinct, outcome.generated)
            ),
        )


def check(model: Any, strategy: str = "bfs", **options: Any) -> CheckResult:
    """One-call convenience: ``Checker(model, **options).bfs()`` (or ``dfs`` / ``simulate``).

    For ``strategy="simulate"`` the options ``runs``, ``sim_depth`` and ``seed`` go to
    `Checker.simulate`.
    """
    sim = {k: options.pop(k) for k in ("runs", "sim_depth", "seed") if k in options}
    checker: Checker[Any, Any] = Checker(model, **options)
    if strategy == "bfs":
        return checker.bfs()
    if strategy == "dfs":
        return checker.dfs()
    if strategy == "simulate":
        return checker.simulate(
            sim.get("runs", 100), sim.get("sim_depth", 1000), sim.get("seed", 0)
        )
    raise ValueError(f"unknown strategy {strategy!r} (bfs, dfs, simulate)")
