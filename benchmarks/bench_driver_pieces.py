"""Where the driver's event path spends its time in a real default run, piece by piece.

    .venv/bin/python benchmarks/bench_driver_pieces.py [RUN_DIR] [-- --set KEY=VALUE ...]

Runs `invar train` in this process (the default run unless `--set` options follow `--`) with
plain timers (wall and thread CPU time, no profiler) around each piece of the event path that
`core_and_driver_share` counts: `step` (`shell.deliver`), the metrics row, the journal append,
the dispatch of commands and the decoding of worker frames, and the journal line texts its
syncing thread makes, the states' digests included (counted in the share as CPU seconds; the
digests are also shown alone). Prints each in milliseconds per update beside the run's share,
then `step` per event type: in the run, and replayed alone afterwards in this process from the
run's journal (best of three), side by side.
A profiler would slow the Python pieces far more than the learner's torch kernels and so
distort the very contention that inflates them; `bench_driver_path.py RUN_DIR` times the other
pieces replayed alone, on the run's journal.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from invar.runtime import driver, journal, run  # noqa: E402
from invar.runtime.cli import main as invar_main  # noqa: E402

WALL: defaultdict[str, float] = defaultdict(float)
CPU: defaultdict[str, float] = defaultdict(float)
STEP_CPU: defaultdict[str, float] = defaultdict(float)
"""`step`'s CPU seconds in the run, by event type."""
STEP_EVENTS: defaultdict[str, int] = defaultdict(int)


def _timed(owner: Any, name: str, label: str) -> None:
    original: Callable[..., Any] = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            WALL[label] += time.perf_counter() - wall
            CPU[label] += time.thread_time() - cpu

    setattr(owner, name, timed)


def _step_by_event_type() -> None:
    deliver: Callable[..., Any] = driver.deliver

    def timed(state: Any, event: Any) -> Any:
        cpu = time.thread_time()
        try:
            return deliver(state, event)
        finally:
            STEP_CPU[type(event).__name__] += time.thread_time() - cpu
            STEP_EVENTS[type(event).__name__] += 1

    driver.deliver = timed


def _replayed(journal_path: Path, rounds: int = 3) -> dict[str, float]:
    """`step`'s CPU seconds per event type replaying the journal alone (best of `rounds`)."""
    from invar.model.shell import deliver
    from invar.model.state import initial_state
    config, entries = journal.read(journal_path)
    best: dict[str, float] = {}
    for _ in range(rounds):
        spent: defaultdict[str, float] = defaultdict(float)
        state = initial_state(config)
        for entry in entries:
            cpu = time.thread_time()
            state = deliver(state, entry.event).state
            spent[type(entry.event).__name__] += time.thread_time() - cpu
        best = {k: min(v, best.get(k, v)) for k, v in spent.items()}
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", nargs="?", help="kept afterwards (default: a temp folder)")
    parser.add_argument("train", nargs=argparse.REMAINDER, help="after --: train options")
    args = parser.parse_args()
    scratch = None
    if args.run_dir is None:
        scratch = tempfile.mkdtemp()
        run_dir = Path(scratch) / "run"
    else:
        run_dir = Path(args.run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)
    _timed(driver, "deliver", "step (shell.deliver)")
    _timed(journal, "state_digest", "state digests")  # in the syncing thread
    _timed(run.Run, "record", "metrics row")
    _timed(journal.Journal, "append", "journal append")
    _timed(driver.Driver, "_dispatch", "dispatch")
    _timed(driver.Driver, "_decode_frame", "frame decoding")
    _timed(journal._Line, "text", "journal line texts")  # in it too, digests included
    _step_by_event_type()
    extra = [a for a in args.train if a != "--"]
    invar_main(["train", "--set", f"output.run_dir={run_dir}", *extra])
    summary = json.loads((run_dir / "summary.json").read_text())
    updates = max(summary["updates"], 1)
    print(f"run: {summary['wall_seconds']:.1f} s wall, share "
          f"{100 * summary['core_and_driver_share']:.2f} % "
          f"(CPU share {100 * summary['core_and_driver_cpu_share']:.2f} %)")
    print(f"{'piece':<24}{'wall ms/update':>16}{'CPU ms/update':>15}")
    for label in WALL:
        print(f"{label:<24}{1e3 * WALL[label] / updates:>16.2f}{1e3 * CPU[label] / updates:>15.2f}")
    print(f"{'event path (share)':<24}{1e3 * summary['core_and_driver_seconds'] / updates:>16.2f}"
          f"{1e3 * summary['core_and_driver_cpu_seconds'] / updates:>15.2f}")
    replayed = _replayed(run_dir / "journal.jsonl")
    print(f"\n{'step, by event type':<24}{'events':>8}{'in the run':>12}{'replayed':>10}"
          f"{'ratio':>7}  (CPU ms/update)")
    for name, seconds in sorted(STEP_CPU.items(), key=lambda item: -item[1]):
        alone = replayed.get(name, 0.0)
        print(f"{name:<24}{STEP_EVENTS[name]:>8}{1e3 * seconds / updates:>12.2f}"
              f"{1e3 * alone / updates:>10.2f}{seconds / alone if alone else 0.0:>6.1f}x")
    in_run, alone = sum(STEP_CPU.values()), sum(replayed.values())
    print(f"{'all':<24}{sum(STEP_EVENTS.values()):>8}{1e3 * in_run / updates:>12.2f}"
          f"{1e3 * alone / updates:>10.2f}{in_run / alone if alone else 0.0:>6.1f}x")
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
