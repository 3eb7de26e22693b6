"""Asynchronous RL on this machine, measured honestly: placement, colocation, time to quality.

One invocation runs every configuration as its own `invar train` process (fresh interpreter,
its own CPU pinning) and writes `reports/async_benchmark.{md,json}` plus plots:

1. Disaggregated placement: the rollout worker pinned to one CPU, the driver + learner to the
   other, one torch thread each; S = 0 (synchronous), S = 1, S = 2 on the same updates. For each:
   steady-state seconds per update, the measured rollout time R per batch (worker generation
   seconds, reported in the reply frames) and update time T (learner busy seconds per update),
   the speedup over S = 0, the ideal (R + T) / max(R, T) and the share of it reached.
2. Colocated baseline: synchronous with both cores given to whichever phase runs (no pinning,
   2 threads each), and asynchronous runs unpinned for comparison.
3. Time to quality: updates and wall time to the first held-out greedy evaluation >= target, for
   S = 0, 1, 2 with the decoupled objective and with plain PPO on the behaviour ratio (each run
   is stopped at the first evaluation that reaches the target).
4. Core + driver share of wall time for the default `invar train` run, and a cProfile of the
   driver's thread (the learner runs in another thread and is not in that profile).

Resource cost: CPU seconds of the driver process and its workers (getrusage of the reaped
process tree, and /proc samples over the steady-state window) per update. Interference: the
machine's CPU seconds spent outside the benchmarked process tree during each run (/proc/stat),
and the load average before and after, are recorded beside every figure.

    .venv/bin/python benchmarks/bench_async.py            # full (~10 min), writes reports/
    .venv/bin/python benchmarks/bench_async.py --quick  # smoke test (~4 min), temp dir
    .venv/bin/python benchmarks/bench_async.py --only placement,colocated

This file is the command line; the measurement (/proc readings, figures from a run) is in
async_measure.py, the orchestration (configurations, runs, interference) in async_runs.py and
the rendering (report, tables, plots) in async_report.py.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from async_measure import loadavg, profile_breakdown, wait_for_idle, wait_until_quiet
from async_report import assemble, print_tables, write_outputs
from async_runs import ROOT, Result, build_specs, interference, phase_worker, run

SECTIONS = ("placement", "colocated", "quality", "driver", "interference")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="few updates, small batches: checks the script, measures nothing")
    parser.add_argument("--out", type=Path, help="report folder (default: reports/, or a "
                        "temporary folder with --quick)")
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help=f"comma-separated sections: {','.join(SECTIONS)}")
    parser.add_argument("--updates", type=int, help="updates per throughput run (default 30)")
    parser.add_argument("--repeats", type=int, help="rounds of the placement runs (default 3; "
                        "1 with --quick)")
    parser.add_argument("--target", type=float, help="held-out greedy reward (default 0.8)")
    parser.add_argument("--quality-updates", type=int, help="cap on updates per time-to-quality "
                        "run (default 150)")
    parser.add_argument("--max-load", type=float, default=1.5,
                        help="wait until the 1-minute load average is at most this")
    parser.add_argument("--max-wait", type=float, default=900, help="seconds to wait for it")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine")
    parser.add_argument("--keep-runs", action="store_true", help="keep the run directories")
    parser.add_argument("--busy-share", type=float, default=0.2,
                        help="rerun a configuration when other work took more than this many "
                             "cores on average during it (full mode)")
    parser.add_argument("--retries", type=int, default=2, help="reruns per configuration")
    parser.add_argument("--retry-wait", type=float, default=300,
                        help="seconds to wait for idle CPUs before a rerun")
    parser.add_argument("--phase-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase_worker:
        phase_worker(args.phase_worker)
        return 0
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(args.only) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    q = args.quick
    args.updates = args.updates or (6 if q else 30)
    args.repeats = args.repeats or (1 if q else 3)
    args.target = args.target if args.target is not None else (0.2 if q else 0.8)
    args.quality_updates = args.quality_updates or (10 if q else 150)
    args.eval_every = 5
    args.heldout = 64 if q else 256
    args.default_updates = 8 if q else 120
    args.profile_updates = 6 if q else 40
    out = args.out or (Path(tempfile.mkdtemp(prefix="invar-bench-quick-")) if q
                       else ROOT / "reports")
    out.mkdir(parents=True, exist_ok=True)

    from rich.console import Console
    console = Console(width=150)
    load_start = loadavg() if (q or args.no_wait) else wait_until_quiet(
        args.max_load, args.max_wait, console)
    # Every run: no progress bar, no TensorBoard (the default run turns it back on), no
    # checkpoints, evaluation only where a section asks for it.
    base: dict[str, Any] = {"output.progress": False, "output.tensorboard": False,
                            "protocol.total_updates": args.updates, "protocol.eval_every": 0,
                            "protocol.checkpoint_every": 0, "protocol.prompts_per_batch": 64,
                            "protocol.group_size": 8}
    if q:
        base.update({"protocol.prompts_per_batch": 16, "protocol.group_size": 4})
    specs = build_specs(args)
    root = Path(tempfile.mkdtemp(prefix="invar-bench-runs-"))
    console.print(f"[bold]bench_async[/] {'quick' if q else 'full'}: {len(specs)} runs, "
                  f"load {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}; "
                  f"runs in {root}")
    results: dict[str, Result] = {}
    started = time.perf_counter()
    try:
        for spec in specs:
            total = spec.sets.get("protocol.total_updates", base["protocol.total_updates"])
            window_start = max(2, total // 5)
            console.print(f"  {spec.name:<28} ...", end="")
            result = run(spec, root, base, total, window_start)
            attempts = [result.other_cpu / result.process_wall]
            while not q and attempts[-1] > args.busy_share and len(attempts) <= args.retries:
                console.print(f" other work took {attempts[-1]:.2f} cores: rerun")
                shutil.rmtree(root / spec.name, ignore_errors=True)
                wait_for_idle(args.busy_share / 2, args.retry_wait, console)
                console.print(f"  {spec.name:<28} ...", end="")
                again = run(spec, root, base, total, window_start)
                attempts.append(again.other_cpu / again.process_wall)
                if spec.profile or attempts[-1] < min(attempts[:-1]):
                    result = again
            result.extra["interference_attempts"] = attempts
            if spec.profile:
                result.extra["profile"] = profile_breakdown(root / f"{spec.name}.prof",
                                                            result.summary.get("wall_seconds",
                                                                               0.0))
            results[spec.name] = result
            console.print(f" {result.process_wall:6.1f} s  (other work "
                          f"{result.other_cpu / result.process_wall:4.2f} cores, load "
                          f"{result.load_after[0]:.2f})")
    finally:
        if not args.keep_runs:
            shutil.rmtree(root, ignore_errors=True)
    cross = None
    if "interference" in args.only:
        console.print(f"  {'interference':<28} ...", end="")
        began = time.perf_counter()
        cross = interference(args, base)
        console.print(f" {time.perf_counter() - began:6.1f} s")
    elapsed = time.perf_counter() - started
    report = assemble(args, results, base, load_start, loadavg(), elapsed)
    report["interference"] = cross
    print_tables(console, report)
    write_outputs(out, report, results)
    console.print(f"[bold]wrote[/] {out / 'async_benchmark.md'}, {out / 'async_benchmark.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
