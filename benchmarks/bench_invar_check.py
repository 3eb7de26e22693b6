"""Benchmark of `invar-check` on the Invar model: each reduction, and 1 vs N processes.

    .venv/bin/python benchmarks/bench_invar_check.py                 # every gate bound
    .venv/bin/python benchmarks/bench_invar_check.py --only wire --only driver
    .venv/bin/python benchmarks/bench_invar_check.py --only driver --max-depth 10

For each bound of the gate (`spec/gate/*.toml`), measured side by side in one run: distinct
states, states generated, seconds and distinct states/s of an exhaustive BFS with no
reduction, with worker symmetry only, with partial-order reduction only, and with both; then
the spec's default configuration (its `[check]` table) with 1 process and with N processes
(`--processes`, default 1 and 2). A reduction that cannot apply (symmetry with one worker)
is still measured: its row shows what its bookkeeping costs.

A search cut by `--max-states` or `--max-depth` is marked incomplete. Under a depth bound
every configuration explores every state up to that depth, so the reductions' state counts
stay comparable; under a state bound only states/s is. CPU seconds (this process and its
children) are printed next to the wall clock, with the load average: on a shared machine,
other processes' load distorts wall-clock figures.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from checker import Checker  # noqa: E402
from checker.invar_model import InvarModel, load_bounds  # noqa: E402

SPECS = {path.stem: path for path in sorted((ROOT / "spec" / "gate").glob("*.toml"))}
VARIANTS = [("none", False, False), ("symmetry", True, False), ("por", False, True),
            ("both", True, True)]


def _cpu_seconds() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def measure(bounds, symmetry: bool, reduction: bool, processes: int,
            max_states: int | None, max_depth: int | None = None) -> dict:
    model = InvarModel(bounds, symmetry=symmetry, reduction=reduction)
    cpu0 = _cpu_seconds()
    t0 = time.perf_counter()
    result = Checker(model, processes=processes, max_states=max_states,
                     max_depth=max_depth).bfs()
    wall = time.perf_counter() - t0
    return {
        "distinct": result.distinct_states, "generated": result.states_generated,
        "depth": result.max_depth, "wall": wall, "cpu": _cpu_seconds() - cpu0,
        "rate": result.distinct_states / wall if wall > 0 else 0.0,
        "complete": result.complete, "stop": result.stop_reason, "ok": result.ok,
        "violations": [p.name for p in result.violations],
        "symmetry": model.symmetry, "reduction": model.reduction,
    }


def _row(label: str, m: dict) -> str:
    flag = "" if m["complete"] else f"  (incomplete: {m['stop']})"
    verdict = "ok" if m["ok"] else f"FAILS: {', '.join(m['violations'])}"
    if not m["complete"] and not m["ok"]:
        verdict = "bounded"
    return (f"  {label:24} {m['distinct']:>11,} {m['generated']:>12,} {m['depth']:>6} "
            f"{m['wall']:>9.1f} {m['cpu']:>9.1f} {m['rate']:>10,.0f}  {verdict}{flag}")


HEADER = (f"  {'configuration':24} {'distinct':>11} {'generated':>12} {'depth':>6} "
          f"{'wall s':>9} {'cpu s':>9} {'states/s':>10}  verdict")


def bench(name: str, processes: list[int], max_states: int | None,
          max_depth: int | None) -> None:
    bounds, options = load_bounds(SPECS[name])
    print(f"\n{name}: {SPECS[name].relative_to(ROOT)} — {bounds}")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(HEADER)
    base = None
    for label, symmetry, reduction in VARIANTS:
        m = measure(bounds, symmetry, reduction, 1, max_states, max_depth)
        base = base or m
        note = ""
        if base is not m and max_states is None:
            note = f" [{m['distinct'] / base['distinct']:.1%} of the states]"
        print(_row(f"{label} (1 process)", m) + note, flush=True)
    symmetry = options.get("symmetry", True)
    reduction = options.get("reduction", True)
    print(f"  default [check] (symmetry {'on' if symmetry else 'off'}, reduction "
          f"{'on' if reduction else 'off'}):")
    for n in processes:
        m = measure(bounds, symmetry, reduction, n, max_states, max_depth)
        print(_row(f"default, {n} process{'es' if n > 1 else ''}", m), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=sorted(SPECS), action="append",
                        help="run only this bound (repeatable; default: every gate bound)")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2],
                        help="process counts for the default configuration (default: 1 2)")
    parser.add_argument("--max-states", type=int, default=None,
                        help="cut each search at this many distinct states (default: none)")
    parser.add_argument("--max-depth", type=int, default=None,
                        help="explore only this many steps from the initial state (default: "
                             "none)")
    args = parser.parse_args(argv)
    print(f"invar-check benchmark; {os.cpu_count()} CPUs")
    for name in args.only or list(SPECS):
        bench(name, args.processes, args.max_states, args.max_depth)
    return 0


if __name__ == "__main__":
    sys.exit(main())
