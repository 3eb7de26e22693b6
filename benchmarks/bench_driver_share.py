"""Core + driver share of wall time on the default run, before and after: this tree against git
revisions (the target: < 2 %).

    .venv/bin/python benchmarks/bench_driver_share.py --baseline fc5b373 --runs 3

Each tree runs the default `invar train` (120 updates) in a fresh process with its own code,
the trees alternating run by run so that a shared machine's load falls on all alike. Printed
per tree, the mean over its runs of what the run's summary.json records:
`core_and_driver_share` (wall seconds inside the driver's event path, `Driver._apply` and
`Driver._accept_frame`: core step, journal appends, metrics rows, dispatch, frame decoding; and
the CPU seconds the journal's syncing thread spends making line texts, state digests included;
over the session's wall seconds), the same in CPU seconds of the driver's thread, and both per
update.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from git_trees import add_baselines, trees


def default_run(tree: Path, run_dir: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, "-m", "invar.runtime.cli", "train", "--set",
                    f"output.run_dir={run_dir}"], cwd=tree, env=env, check=True,
                   capture_output=True)
    summary: dict[str, float] = json.loads((run_dir / "summary.json").read_text())
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_baselines(parser)
    parser.add_argument("--runs", type=int, default=3, help="default runs per tree")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        compared = trees(args.baseline, Path(tmp) / "trees")
        rows: dict[str, list[dict[str, float]]] = {label: [] for label in compared}
        for run in range(args.runs):
            for label, tree in compared.items():
                summary = default_run(tree, Path(tmp) / "runs" / f"{run}-{label}")
                rows[label].append(summary)
                print(f"  run {run + 1}, {label}: wall {summary['wall_seconds']:.1f} s, "
                      f"share {100 * summary['core_and_driver_share']:.2f} %", flush=True)
        print(f"{'tree':<12}{'wall s':>8}{'share':>9}{'CPU share':>11}{'ms/update':>11}"
              f"{'CPU ms/update':>15}")
        for label, summaries in rows.items():
            def mean(key: str, summaries: list[dict[str, float]] = summaries) -> float:
                # A tree older than the CPU figures (77d59c3 and before) lacks them.
                if any(key not in s for s in summaries):
                    return math.nan
                return statistics.fmean(s[key] for s in summaries)
            updates = mean("session_updates")
            print(f"{label:<12}{mean('wall_seconds'):>8.1f}"
                  f"{100 * mean('core_and_driver_share'):>8.2f}%"
                  f"{100 * mean('core_and_driver_cpu_share'):>10.2f}%"
                  f"{1e3 * mean('core_and_driver_seconds') / updates:>11.1f}"
                  f"{1e3 * mean('core_and_driver_cpu_seconds') / updates:>15.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
