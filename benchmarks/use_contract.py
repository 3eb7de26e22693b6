"""The use contract (issue 12): the pre-registered sync/async comparison, run and reported.

Runs the study fixed in reports/use-contract/PREREGISTRATION.md (every cell as its own
`invar train` process, through benchmarks/bench_async.py's run machinery: pinning, early stop,
CPU accounting, load and other-work readings), records each run's figures in
reports/use-contract/runs.jsonl as it finishes (so an interrupted study resumes where it
stopped), then writes RESULTS.md, results.json and the plots from the recorded runs.

    .venv/bin/python benchmarks/use_contract.py                # run what is missing, report
    .venv/bin/python benchmarks/use_contract.py --report-only  # regenerate from runs.jsonl
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_async as ba  # noqa: E402  (the machinery this study reuses)

OUT = ROOT / "reports" / "use-contract"
RECORDS = OUT / "runs.jsonl"
RUNS = Path("/work/runs-use-contract/study")

SEEDS = (1, 2, 3, 4, 5)
SWEEP_REPEATS = 3
SWEEP_UPDATES = 25
SWEEP_WINDOW = 5

COLOCATED_SYNC = {"rollout.cpus": [], "rollout.threads": 2, "learner.cpus": [],
                  "learner.threads": 2}
COMMON: dict[str, Any] = {
    "output.progress": False, "output.tensorboard": False, "protocol.checkpoint_every": 0,
    "protocol.eval_every": 5, "task.heldout_prompts": 128, "protocol.total_updates": 400,
    "protocol.prompts_per_batch": 64, "protocol.group_size": 8,  # the defaults, stated
}
TASKS: dict[str, dict[str, Any]] = {
    "A": {"sets": {"task.length": 8}, "threshold": 0.8, "budget": 30.0},
    "B": {"sets": {"task.length": 10}, "threshold": 0.8, "budget": 50.0},
}


@dataclass(frozen=True)
class Cell:
    name: str
    task: str
    placement: str
    staleness: int
    loss: str

    def sets(self) -> dict[str, Any]:
        placement = (ba.PINNED if self.placement == "pinned"
                     else COLOCATED_SYNC if self.staleness == 0 else ba.UNPINNED_1)
        return {**COMMON, **TASKS[self.task]["sets"], **placement, **ba.staleness(self.staleness),
                "protocol.objective.loss": self.loss}


CELLS = (
    Cell("A-pin-S0", "A", "pinned", 0, "decoupled_ppo"),
    Cell("A-pin-S1", "A", "pinned", 1, "decoupled_ppo"),
    Cell("A-pin-S2", "A", "pinned", 2, "decoupled_ppo"),
    Cell("A-pin-S1-beh", "A", "pinned", 1, "behavior_ppo"),
    Cell("A-pin-S2-beh", "A", "pinned", 2, "behavior_ppo"),
    Cell("A-col-S0", "A", "colocated", 0, "decoupled_ppo"),
    Cell("A-col-S1", "A", "colocated", 1, "decoupled_ppo"),
    Cell("B-pin-S0", "B", "pinned", 0, "decoupled_ppo"),
    Cell("B-pin-S1", "B", "pinned", 1, "decoupled_ppo"),
    Cell("B-pin-S2", "B", "pinned", 2, "decoupled_ppo"),
)
SWEEP_POINTS: dict[str, dict[str, Any]] = {
    "k1": {"task.length": 8, "protocol.optimizer_steps": 1},
    "k2": {"task.length": 8, "protocol.optimizer_steps": 2},
    "k4": {"task.length": 8, "protocol.optimizer_steps": 4},
    "k8": {"task.length": 8, "protocol.optimizer_steps": 8},
    "len16": {"task.length": 16, "protocol.optimizer_steps": 1},
}
SWEEP_CONFIGS: dict[str, dict[str, Any]] = {
    "pin-S0": {**ba.PINNED, **ba.staleness(0)},
    "pin-S1": {**ba.PINNED, **ba.staleness(1)},
    "col-S0": {**COLOCATED_SYNC, **ba.staleness(0)},
}
SWEEP_BASE: dict[str, Any] = {
    "output.progress": False, "output.tensorboard": False, "protocol.checkpoint_every": 0,
    "protocol.eval_every": 0, "protocol.total_updates": SWEEP_UPDATES,
    "protocol.prompts_per_batch": 64, "protocol.group_size": 8,
}


# ---------------------------------------------------------------------------------------------
# The plan: which runs, in which order (PREREGISTRATION.md, "Order, interleaving and budget")


def plan() -> list[dict[str, Any]]:
    """Every run of the study in the pre-registered order: five seed rounds of the ten cells
    (order rotated by one cell per round), then three sweep repeats."""
    runs: list[dict[str, Any]] = []
    for index, seed in enumerate(SEEDS):
        rotated = CELLS[index % len(CELLS):] + CELLS[:index % len(CELLS)]
        for cell in rotated:
            task = TASKS[cell.task]
            runs.append({"id": f"{cell.name}.seed{seed}", "kind": "main", "cell": cell.name,
                         "task": cell.task, "placement": cell.placement,
                         "staleness": cell.staleness, "loss": cell.loss, "seed": seed,
                         "sets": {**cell.sets(), "protocol.seed": seed},
                         "budget": task["budget"], "threshold": task["threshold"]})
    for repeat in range(1, SWEEP_REPEATS + 1):
        for point, point_sets in SWEEP_POINTS.items():
            for config, config_sets in SWEEP_CONFIGS.items():
                runs.append({"id": f"sweep-{point}-{config}.r{repeat}", "kind": "sweep",
                             "point": point, "config": config, "repeat": repeat,
                             "sets": {**SWEEP_BASE, **point_sets, **config_sets,
                                      "protocol.seed": repeat}})
    return runs


def load_records(path: Path = RECORDS) -> dict[str, dict[str, Any]]:
    """Recorded runs by id (a torn last line, from a study killed mid-write, is skipped)."""
    records: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            records[record["id"]] = record
    return records


def _round(value: Any) -> Any:
    """Floats to 5 significant decimals: the record stays small and nothing measured is lost
    (timings are not better than a millisecond here)."""
    if isinstance(value, float):
        return round(value, 5)
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_round(v) for v in value]
    return value


UPDATE_KEYS = ("update", "wall", "reward", "staleness", "learner_seconds", "rollout_seconds",
               "core_seconds", "rollout_replies")


def execute(entry: dict[str, Any]) -> dict[str, Any]:
    """Run one planned configuration as `invar train` and return its record."""
    RUNS.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(RUNS / entry["id"], ignore_errors=True)  # a run cut short earlier
    spec = ba.Spec(entry["id"], entry["kind"], entry["id"], entry["sets"],
                   stop_after=entry.get("budget"))
    total = entry["sets"]["protocol.total_updates"]
    window_start = SWEEP_WINDOW if entry["kind"] == "sweep" else total  # main: no CPU window
    started = time.time()
    result = ba.run(spec, RUNS, {}, total, window_start)
    record = {key: value for key, value in entry.items() if key != "sets"}
    record.update({
        "settings": entry["sets"], "started_utc": dt.datetime.fromtimestamp(
            started, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "returncode": result.returncode, "stopped_early": result.stopped_early,
        "process_wall": result.process_wall, "cpu_total": result.cpu_total,
        "other_cpu": result.other_cpu,
        "other_cores": result.other_cpu / result.process_wall if result.process_wall else None,
        "load_before": result.load_before, "load_after": result.load_after,
        "samples_per_batch": result.samples_per_batch,
        "updates": [{k: row[k] for k in UPDATE_KEYS if k in row} for row in result.updates],
        "evaluations": result.evaluations,
        "steady": ba.steady(result) if entry["kind"] == "sweep" else None,
        "run_dir": str(RUNS / entry["id"]),
    })
    return _round(record)


def run_study(args: argparse.Namespace, console: Any) -> None:
    records = load_records()
    todo = [entry for entry in plan() if entry["id"] not in records
            and entry["kind"] in args.only]
    deadline = (dt.datetime.strptime(args.stop_at, "%H:%M").time() if args.stop_at else None)
    console.print(f"[bold]use contract[/]: {len(records)} runs recorded, {len(todo)} to run; "
                  f"load {ba.loadavg()}")
    OUT.mkdir(parents=True, exist_ok=True)
    for entry in todo:
        now = dt.datetime.now(dt.timezone.utc)
        if deadline is not None and now.time() >= deadline:
            console.print(f"[red]stop: {args.stop_at} UTC reached; {entry['id']} and the runs "
                          "after it did not run")
            break
        console.print(f"  {entry['id']:<28} ...", end="")
        try:
            record = execute(entry)
        except RuntimeError as error:  # a failed run is reported, not hidden: stop the study
            console.print(f"[red] failed: {error}")
            raise
        with open(RECORDS, "a") as stream:
            stream.write(json.dumps(record) + "\n")
        console.print(f" {record['process_wall']:6.1f} s, {len(record['updates'])} updates, "
                      f"other work {record['other_cores']:.2f} cores, load "
                      f"{record['load_after'][0]:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report-only", action="store_true",
                        help="write the report from reports/use-contract/runs.jsonl; run nothing")
    parser.add_argument("--only", default="main,sweep",
                        help="which parts to run: main, sweep (comma-separated)")
    parser.add_argument("--stop-at", default="14:55",
                        help="UTC HH:MM after which no further run starts ('' for none)")
    args = parser.parse_args()
    args.only = {part.strip() for part in args.only.split(",") if part.strip()}
    if args.only - {"main", "sweep"}:
        parser.error(f"--only: unknown parts {sorted(args.only - {'main', 'sweep'})}; "
                     "known: main, sweep")
    from rich.console import Console
    console = Console(width=150)
    if not args.report_only:
        run_study(args, console)
        # The report in a fresh interpreter: a study runs for most of an hour, and the report
        # code it ends with is the code on disk then.
        import subprocess
        return subprocess.run([sys.executable, __file__, "--report-only"]).returncode
    write_results(load_records(), OUT, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
