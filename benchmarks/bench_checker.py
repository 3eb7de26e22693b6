"""Benchmark of the invar-check engine: two-phase commit, exhaustive BFS, two ways of writing it.

    .venv/bin/python benchmarks/bench_checker.py                  # R=7: both models, 1 process
    .venv/bin/python benchmarks/bench_checker.py --processes 1 2  # and with 2 worker processes
    .venv/bin/python benchmarks/bench_checker.py --stable         # and the readable one as before
    .venv/bin/python benchmarks/bench_checker.py --profile        # engine share under cProfile
    .venv/bin/python benchmarks/bench_checker.py --decompose      # the engine's part by pieces

Two models of the same spec (TLA+ ``TwoPhase``; R=7: 296,448 distinct states, 2,744,706
generated, depth 22 = TLC's 23, pinned by the tests and checked equal here):

* ``packed``   – `checker.examples.TwoPhaseCommit`, its state one int (the engine's floor);
* ``readable`` – `checker.examples.TwoPhaseReadable`, its state a named tuple of a tuple of
  phase strings, a string and two frozensets: how a user writes a model.  ``--stable`` also
  runs it with the stable SHA-1 fingerprints, which is how every such model ran before the
  fast path (the "before" row).

Per row: wall and CPU seconds of the best of `--repeat` runs (workers' CPU included), distinct
and generated states per second of wall time, the speed against TLC's CPU time, the
fingerprints used and TLC's collision estimate, and — in one process — the **engine's share**:
1 - (the model's own time) / (CPU time of the search).  The model's own time is measured by
replaying exactly the calls the engine makes into the model (each distinct state's successors,
driven to the end; each property on the states the engine checks it on; the fingerprint key,
if the model has one, on every successor), in BFS order, in the same process under the same
collector settings.  The machine's load average is printed before and after: other processes
distort wall time, which is why CPU time is printed next to it.

The "x TLC cpu" column divides TLC's CPU time, one worker, on the same RM count by the row's:
TLC's time is read from reports/checker/tlc_two_phase.json, where `benchmarks/bench_tlc.py`
measured it (on checker/examples/TwoPhase.tla, beside invar-check on the readable model, at the
date it gives: another time than this run's, so only roughly the same machine load).  Without
a measurement for the RM count, the column is empty.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from checker import Checker, CheckResult  # noqa: E402
from checker.examples import TwoPhaseCommit, TwoPhaseReadable  # noqa: E402
from checker.model import PropertyKind, overrides, reachable_states, successors_of  # noqa: E402
from checker.search import _quiet_gc  # noqa: E402

# where the sequential BFS calls the model from
_ENGINE_FILES = ("engine.py", "bfs.py", "search.py")

TLC_REPORT = Path(__file__).resolve().parents[1] / "reports" / "checker" / "tlc_two_phase.json"
MODELS: dict[str, Callable[[int], Any]] = {"packed": TwoPhaseCommit, "readable": TwoPhaseReadable}


def _cpu_seconds() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def tlc_run(rms: int) -> tuple[dict[str, Any], str] | None:
    """TLC's measured run with one worker on `rms` RMs, and the date it was measured."""
    if not TLC_REPORT.is_file():
        return None
    doc = json.loads(TLC_REPORT.read_text())
    runs = [r for r in doc["runs"]
            if r["checker"] == "TLC" and r["rms"] == rms and r["parallelism"] == 1]
    return (runs[0], doc["date"]) if runs else None


def run_once(model: Any, processes: int, fingerprints: str) -> tuple[float, float, CheckResult]:
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    result = Checker(model, processes=processes, fingerprints=fingerprints).bfs()
    return time.perf_counter() - t0, _cpu_seconds() - cpu0, result


def model_seconds(model: Any, states: list[Any]) -> float:
    """CPU seconds of the model's own functions over the calls a BFS makes (see the docstring)."""
    succ = successors_of(model)
    key = model.fingerprint_key if overrides(model, "fingerprint_key") else None
    props = list(model.properties())
    always = [p.predicate for p in props if p.kind is PropertyKind.ALWAYS]
    sometimes = [p.predicate for p in props if p.kind is PropertyKind.SOMETIMES]
    with _quiet_gc():
        t0 = time.process_time()
        for s in states:
            for _a, t in succ(s):
                if key is not None:
                    key(t)
        for pred in always:
            for s in states:
                pred(s)
        for pred in sometimes:  # the engine stops checking one once it holds
            for s in states:
                if pred(s):
                    break
        return time.process_time() - t0


def profile_share(rms: int) -> int:
    """The engine's share as cProfile sees it: the model's entry points (what the engine calls:
    successors, the predicates) with everything they call, against the whole search.  The
    profiler's cost per call falls mostly on the model (many small calls), so this share is
    the low estimate, the replay's (`model_seconds`) the high one."""
    model = TwoPhaseReadable(rms)
    profile = cProfile.Profile()
    profile.runcall(Checker(model).bfs)
    stats = pstats.Stats(profile)
    own = 0.0
    entries = stats.stats.items()  # type: ignore[attr-defined]
    for (path, _line, _name), (_cc, _nc, _tt, cumulative, callers) in entries:
        engine_calls_it = any(
            "checker-expand" in c[0] or c[0].endswith("search.py") for c in callers
        )
        if path.endswith("two_phase_readable.py") and engine_calls_it:
            own += cumulative
    stats.sort_stats("tottime").print_stats(12)
    total = stats.total_tt  # type: ignore[attr-defined]
    print(f"readable 2PC, R={rms}, under cProfile: {total:.2f} s, "
          f"the model's own functions {own:.2f} s, "
          f"engine share {100 * (1 - own / total):.0f}%")
    return 0


def decompose(rms: int, repeat: int) -> int:
    """What the engine adds to the readable model's own successors, piece by piece: loops over
    the reachable states, each adding one piece of a BFS to the one before (fingerprint,
    visited lookup, keeping each new state as the next level's, freed level by level as the
    engine frees expanded chunks), best of `repeat`, interleaved, the collector quiet."""
    model = TwoPhaseReadable(rms)
    states = reachable_states(model)
    succ = successors_of(model)

    def successors() -> None:
        for s in states:
            for _a, _t in succ(s):
                pass

    def hashed() -> None:
        for s in states:
            for _a, t in succ(s):
                hash(t)

    def looked_up() -> None:
        visited: dict[int, int] = {}
        for s in states:
            for _a, t in succ(s):
                g = hash(t)
                if g in visited:
                    continue
                visited[g] = 0

    def kept() -> None:
        visited: dict[int, int] = {}
        level: list[tuple[Any, int]] = []
        for i, s in enumerate(states):
            if i % 4096 == 0:
                level = []  # a chunk's new states, freed with the next (as the engine does)
            for _a, t in succ(s):
                g = hash(t)
                if g in visited:
                    continue
                visited[g] = 0
                level.append((t, g))

    loops = [("the model's successors", successors), ("+ hash(t)", hashed),
             ("+ the visited dict", looked_up), ("+ keeping new states", kept)]
    best = {name: float("inf") for name, _ in loops}
    with _quiet_gc():
        for _ in range(repeat):
            for name, loop in loops:
                t0 = time.process_time()
                loop()
                best[name] = min(best[name], time.process_time() - t0)
    print(f"readable 2PC, R={rms}: CPU s, best of {repeat}")
    before = None
    for name, seconds in best.items():
        extra = "" if before is None else f"  (+{seconds - before:.2f})"
        print(f"  {name:<24} {seconds:6.2f}{extra}")
        before = seconds
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rms", type=int, default=7, help="resource managers (default 7)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per row; the fastest is shown")
    parser.add_argument("--processes", type=int, nargs="+", default=[1],
                        help="process counts (default: 1)")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS),
                        default=["packed", "readable"])
    parser.add_argument("--stable", action="store_true",
                        help="also run the readable model with stable fingerprints "
                             "(as before the fast path)")
    parser.add_argument("--profile", action="store_true",
                        help="instead: profile the readable model in one process (cProfile), "
                             "and its engine share")
    parser.add_argument("--decompose", action="store_true",
                        help="instead: the engine's part on the readable model, piece by piece")
    args = parser.parse_args(argv)
    if args.profile:
        return profile_share(args.rms)
    if args.decompose:
        return decompose(args.rms, max(args.repeat, 1))
    ncpu = os.cpu_count() or 1
    print(f"two-phase commit, R={args.rms}; {ncpu} CPUs; "
          f"load average before: {os.getloadavg()[0]:.2f}")
    rows = []
    configs = [(name, p, "auto") for p in args.processes for name in args.models]
    if args.stable:
        configs.append(("readable", 1, "stable"))
    reference = None
    for name, processes, fingerprints in configs:
        model = MODELS[name](args.rms)
        wall, cpu, result = min(
            (run_once(model, processes, fingerprints) for _ in range(args.repeat)),
            key=lambda run: run[0],
        )
        counts = (result.distinct_states, result.states_generated, result.max_depth,
                  result.coverage)
        if reference is None:
            reference = counts
        elif counts != reference:
            print(f"MISMATCH: {name} with {processes} processes counted {counts[:3]}, "
                  f"expected {reference[:3]}")
            return 1
        share = None
        if processes == 1:
            share = 1 - model_seconds(model, reachable_states(model)) / cpu
        rows.append((name, processes, fingerprints, wall, cpu, result, share))
    tlc = tlc_run(args.rms)
    print(f"{'model':>9} {'procs':>5} {'wall s':>7} {'cpu s':>7} "
          f"{'distinct/s':>11} {'generated/s':>12} "
          f"{'x TLC cpu':>9} {'engine':>7} {'fingerprints':>12} {'P(collision)':>12}")
    for name, processes, _fp, wall, cpu, result, share in rows:
        x_tlc = "" if tlc is None else f"{tlc[0]['cpu_s'] / cpu:.1f}"
        print(f"{name:>9} {processes:>5} {wall:>7.2f} {cpu:>7.2f} "
              f"{result.distinct_states / wall:>11,.0f} "
              f"{result.states_generated / wall:>12,.0f} {x_tlc:>9} "
              f"{'' if share is None else f'{100 * share:.0f}%':>7} {result.fingerprints:>12} "
              f"{result.collision_probability:>12.1e}")
    for name, processes, _fp, _wall, _cpu, result, _share in rows:
        for note in result.notes:
            if note.startswith("states expanded per worker"):
                print(f"{name}, {processes} processes: {note}")
    distinct, generated, depth, _cov = reference  # type: ignore[misc]
    print(f"counts (every row): {distinct:,} distinct, {generated:,} generated, "
          f"depth {depth} (TLC depth {depth + 1})")
    print(f"verdicts: { {n: p.verdict.value for n, p in rows[0][5].properties.items()} }")
    if tlc is None:
        print(f"TLC: no one-worker run on R={args.rms} in {TLC_REPORT} (benchmarks/bench_tlc.py)")
    else:
        run, date = tlc
        print(f"TLC, one worker, measured {date} by benchmarks/bench_tlc.py: "
              f"{run['cpu_s']:.1f} s CPU, {run['wall_s']:.1f} s wall, "
              f"{run['distinct_per_s']:,} distinct/s, {run['distinct']:,} distinct")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
