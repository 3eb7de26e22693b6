"""Benchmark of the invar-check engine: two-phase commit, exhaustive BFS.

    .venv/bin/python benchmarks/bench_checker.py            # R=7, 1 process vs all CPUs
    .venv/bin/python benchmarks/bench_checker.py --rms 5 --repeat 5 --processes 1 2

Prints, side by side, distinct states/s (wall clock) of single-process and multi-process BFS
(best of `--repeat` runs), the counts (pinned by the tests: R=7 has 296,448 distinct states,
2,744,706 generated, depth 22 = TLC's 23), the CPU seconds used, and the machine's load
average: on a shared machine other processes' load distorts the wall-clock figures, which
is why the best of several runs is shown and CPU time is printed next to it.
Reference: TLC with one worker does TwoPhase R=7 in about 18 s (~16k distinct states/s).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from checker import Checker  # noqa: E402
from checker.examples import TwoPhaseCommit  # noqa: E402

TLC_STATES_PER_S = 296_448 / 18.0


def _cpu_seconds() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run_once(rms: int, processes: int, symmetry: bool) -> tuple[float, float, object]:
    model = TwoPhaseCommit(rms, symmetry=symmetry)
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    result = Checker(model, processes=processes).bfs()
    wall = time.perf_counter() - t0
    return wall, _cpu_seconds() - cpu0, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rms", type=int, default=7, help="resource managers (default 7)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per configuration; the best is shown")
    parser.add_argument(
        "--processes", type=int, nargs="+", default=None, help="process counts to compare (default: 1 and all CPUs)"
    )
    parser.add_argument("--symmetry", action="store_true", help="also run the symmetry-reduced model")
    args = parser.parse_args(argv)
    ncpu = os.cpu_count() or 1
    counts = args.processes or sorted({1, ncpu})
    print(f"two-phase commit, R={args.rms}; {ncpu} CPUs; load average before: {os.getloadavg()[0]:.2f}")
    rows = []
    reference = None
    for processes in counts:
        best = None
        for _ in range(args.repeat):
            wall, cpu, result = run_once(args.rms, processes, False)
            if best is None or wall < best[0]:
                best = (wall, cpu, result)
        wall, cpu, result = best  # type: ignore[misc]
        key = (result.distinct_states, result.states_generated, result.max_depth)  # type: ignore[attr-defined]
        if reference is None:
            reference = key
        elif key != reference:
            print(f"MISMATCH: {processes} processes counted {key}, expected {reference}")
            return 1
        rows.append((processes, wall, cpu, result))
    print(
        f"{'processes':>9} {'wall s':>8} {'cpu s':>8} {'distinct/s':>12} {'generated/s':>12} "
        f"{'x TLC':>6} {'speedup':>8}"
    )
    base = rows[0][1]
    for processes, wall, cpu, result in rows:
        rate = result.distinct_states / wall  # type: ignore[attr-defined]
        print(
            f"{processes:>9} {wall:>8.2f} {cpu:>8.2f} {rate:>12,.0f} "
            f"{result.states_generated / wall:>12,.0f} {rate / TLC_STATES_PER_S:>6.1f} {base / wall:>8.2f}"  # type: ignore[attr-defined]
        )
    distinct, generated, depth = reference  # type: ignore[misc]
    print(f"counts: {distinct:,} distinct, {generated:,} generated, depth {depth} (TLC depth {depth + 1})")
    verdicts = {n: p.verdict.value for n, p in rows[0][3].properties.items()}  # type: ignore[attr-defined]
    print(f"verdicts: {verdicts}")
    if args.symmetry:
        wall, cpu, result = run_once(args.rms, 1, True)
        print(
            f"symmetry-reduced: {result.distinct_states:,} distinct, {result.states_generated:,} generated "  # type: ignore[attr-defined]
            f"in {wall:.2f} s"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
