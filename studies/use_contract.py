"""The use contract (issue 12): the pre-registered sync/async comparison, run and reported.

Runs the study fixed in reports/use-contract/PREREGISTRATION.md (every cell as its own
`invar train` process, through benchmarks/bench_async.py's run machinery: pinning, early stop,
CPU accounting, load and other-work readings), records each run's figures in
reports/use-contract/runs.jsonl as it finishes (so an interrupted study resumes where it
stopped), then writes RESULTS.md, results.json and the plots from the recorded runs.

    .venv/bin/python studies/use_contract.py                # run what is missing, report
    .venv/bin/python studies/use_contract.py --report-only  # regenerate from runs.jsonl
    .venv/bin/python studies/use_contract.py --report-only --out DIR  # ... into DIR
    .venv/bin/python studies/use_contract.py --study 2 ...  # the second study (issue 33)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
# bench_async's machinery, reused: its runs, its /proc readings and figures, its provenance.
import async_measure  # noqa: E402
import async_report  # noqa: E402
import async_runs  # noqa: E402

OUT = ROOT / "reports" / "use-contract"
RECORDS = OUT / "runs.jsonl"
RUNS = ROOT.parent / "runs-use-contract" / "study"
"""Where the runs are written: beside the checkout, outside the repository (PREREGISTRATION.md)."""

SEEDS = (1, 2, 3, 4, 5)
SWEEP_REPEATS = 3
SWEEP_UPDATES = 25
SWEEP_WINDOW = 5
SWEEP_BUDGET = 30.0
"""Driver wall seconds after which a sweep run is stopped (PREREGISTRATION.md, amendment 1:
under load ~7 the colocated 2+2-thread runs took up to 7 s per update)."""

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
        placement = (async_runs.PINNED if self.placement == "pinned"
                     else COLOCATED_SYNC if self.staleness == 0 else async_runs.UNPINNED_1)
        return {**COMMON, **TASKS[self.task]["sets"], **placement,
                **async_runs.staleness(self.staleness), "protocol.objective.loss": self.loss}


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
    "pin-S0": {**async_runs.PINNED, **async_runs.staleness(0)},
    "pin-S1": {**async_runs.PINNED, **async_runs.staleness(1)},
    "col-S0": {**COLOCATED_SYNC, **async_runs.staleness(0)},
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
                             "budget": SWEEP_BUDGET,
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
    spec = async_runs.Spec(entry["id"], entry["kind"], entry["id"], entry["sets"],
                   stop_after=entry.get("budget"))
    total = entry["sets"]["protocol.total_updates"]
    window_start = SWEEP_WINDOW if entry["kind"] == "sweep" else total  # main: no CPU window
    started = time.time()
    result = async_runs.run(spec, RUNS, {}, total, window_start)
    last = max((row["update"] for row in result.updates), default=0)
    if entry["kind"] == "sweep" and result.window is None and last > SWEEP_WINDOW:
        # Stopped by its wall budget before the last update: the steady window runs from
        # update SWEEP_WINDOW to the last row (no CPU marks there: CPU s/update stays None).
        result.window = (SWEEP_WINDOW, last)
    record = {key: value for key, value in entry.items() if key != "sets"}
    record.update({
        "settings": entry["sets"], "started_utc": dt.datetime.fromtimestamp(
            started, dt.UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "returncode": result.returncode, "stopped_early": result.stopped_early,
        "process_wall": result.process_wall, "cpu_total": result.cpu_total,
        "other_cpu": result.other_cpu,
        "other_cores": result.other_cpu / result.process_wall if result.process_wall else None,
        "load_before": result.load_before, "load_after": result.load_after,
        "samples_per_batch": result.samples_per_batch,
        "updates": [{k: row[k] for k in UPDATE_KEYS if k in row} for row in result.updates],
        "evaluations": result.evaluations,
        "steady": async_measure.steady(result) if entry["kind"] == "sweep" else None,
        "run_dir": str(RUNS / entry["id"]),
    })
    return _round(record)


def run_study(args: argparse.Namespace, console: Any) -> None:
    records = load_records()
    todo = [entry for entry in plan() if entry["id"] not in records
            and entry["kind"] in args.only]
    deadline = (dt.datetime.strptime(args.stop_at, "%H:%M").time() if args.stop_at else None)
    console.print(f"[bold]use contract[/]: {len(records)} runs recorded, {len(todo)} to run; "
                  f"load {async_measure.loadavg()}")
    OUT.mkdir(parents=True, exist_ok=True)
    for entry in todo:
        now = dt.datetime.now(dt.UTC)
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
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--study", type=int, choices=(1, 2), default=1)
    known, rest = first.parse_known_args()
    if known.study == 2:
        import use_contract2  # the second study (issue 33): its own plan, records and report
        return use_contract2.main(rest)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=int, choices=(1, 2), default=1,
                        help="which study: 1 (PREREGISTRATION.md, these options) or 2 "
                             "(PREREGISTRATION-2.md; `--study 2 --help` for its options)")
    parser.add_argument("--report-only", action="store_true",
                        help="write the report from reports/use-contract/runs.jsonl; run nothing")
    parser.add_argument("--only", default="main,sweep",
                        help="which parts to run: main, sweep (comma-separated)")
    parser.add_argument("--stop-at", default="14:55",
                        help="UTC HH:MM after which no further run starts ('' for none)")
    parser.add_argument("--out", type=Path, default=OUT,
                        help="folder for RESULTS.md, results.json and the plots (default: "
                             "reports/use-contract; the runs are always recorded there)")
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
        return subprocess.run([sys.executable, __file__, "--report-only", "--out",
                               str(args.out)]).returncode
    args.out.mkdir(parents=True, exist_ok=True)
    write_results(load_records(), args.out, console)
    return 0



# ---------------------------------------------------------------------------------------------
# Analysis (PREREGISTRATION.md, "Metrics", "Analysis", "Decision rule")

DELTA = 0.05
"""δ of the decision rule: the final held-out reward may drop by at most this much."""
BOOTSTRAP = 10_000
DISTURBED = 0.5
"""Other work (cores) above which a pair is left out of the sensitivity analysis."""

# (name, async arm X, baseline Y, primary?)
COMPARISONS = (
    ("P1 task A: S=1 vs S=0, pinned", "A-pin-S1", "A-pin-S0", True),
    ("P2 task A: S=1 pinned vs S=0 colocated", "A-pin-S1", "A-col-S0", True),
    ("P1 task B: S=1 vs S=0, pinned", "B-pin-S1", "B-pin-S0", True),
    ("task A: S=2 vs S=0, pinned", "A-pin-S2", "A-pin-S0", False),
    ("task B: S=2 vs S=0, pinned", "B-pin-S2", "B-pin-S0", False),
    ("task A: S=1 behavior_ppo vs S=0, pinned", "A-pin-S1-beh", "A-pin-S0", False),
    ("task A: S=2 behavior_ppo vs S=0, pinned", "A-pin-S2-beh", "A-pin-S0", False),
    ("task A: S=1 vs S=0, colocated", "A-col-S1", "A-col-S0", False),
    ("task A, S=1: behavior_ppo vs decoupled_ppo", "A-pin-S1-beh", "A-pin-S1", False),
)


def run_figures(record: dict[str, Any]) -> dict[str, Any]:
    """A main-study run's metrics: time and updates to threshold (censored: None), final
    held-out reward within the budget, throughput, CPU cost, R and T."""
    from invar.runtime.hint import measure
    budget, threshold = record["budget"], record["threshold"]
    evaluations = [e for e in record["evaluations"] if e["wall"] <= budget]
    reached = next((e for e in evaluations if e["heldout_reward"] >= threshold), None)
    updates = record["updates"]
    n = len(updates)
    wall = updates[-1]["wall"] if updates else math.nan
    times = measure(updates, record["samples_per_batch"])
    return {
        "time_to_threshold": reached["wall"] if reached else None,
        "updates_to_threshold": reached["version"] if reached else None,
        "final_heldout": evaluations[-1]["heldout_reward"] if evaluations else None,
        "updates": n, "updates_per_second": n / wall,
        "samples_per_second": n * record["samples_per_batch"] / wall,
        "cpu_per_update": record["cpu_total"] / n if n else None,
        "R": times.rollout if times else None, "T": times.learning if times else None,
        "other_cores": record["other_cores"], "load_after": record["load_after"][0],
    }


def bootstrap_median(values: list[float], seed: int = 0) -> tuple[float, float, float]:
    """(median, 2.5 %, 97.5 %) of the median over resamples of `values` (the seed pairs).
    inverted_cdf quantiles: +inf entries (censored async runs) stay +inf, never NaN."""
    import numpy as np
    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    medians = np.median(data[rng.integers(0, len(data), size=(BOOTSTRAP, len(data)))], axis=1)
    low, high = np.quantile(medians, [0.025, 0.975], method="inverted_cdf")
    return float(np.median(data)), float(low), float(high)


def time_ratio(x: float | None, y: float | None, budget: float) -> float:
    """X ÷ Y of times to threshold under the pre-registered censoring rules."""
    if x is None and y is None:
        return 1.0
    if x is None:
        return math.inf
    if y is None:
        return x / budget
    return x / y


def decide(ratio: tuple[float, float, float], diff: tuple[float, float, float]) -> str:
    """The pre-registered decision rule."""
    if ratio[2] < 1 and diff[1] >= -DELTA:
        return "use async"
    if ratio[1] > 1 or diff[2] < -DELTA:
        return "do not use"
    return "inconclusive"


def compare(figs: dict[tuple[str, int], dict[str, Any]], x: str, y: str, budget: float,
            drop_disturbed: bool = False) -> dict[str, Any] | None:
    pairs = [(seed, figs[(x, seed)], figs[(y, seed)]) for seed in SEEDS
             if (x, seed) in figs and (y, seed) in figs]
    if drop_disturbed:
        pairs = [p for p in pairs if max(p[1]["other_cores"], p[2]["other_cores"]) <= DISTURBED]
    if not pairs:
        return None
    out: dict[str, Any] = {"seeds": [p[0] for p in pairs]}
    ratios = [time_ratio(a["time_to_threshold"], b["time_to_threshold"], budget)
              for _, a, b in pairs]
    diffs = [(a["final_heldout"] or 0.0) - (b["final_heldout"] or 0.0) for _, a, b in pairs]
    out["time_ratio"] = bootstrap_median(ratios)
    out["time_ratios"] = ratios
    out["final_diff"] = bootstrap_median(diffs)
    out["final_diffs"] = diffs
    for key in ("updates_per_second", "samples_per_second", "cpu_per_update"):
        out[f"{key}_ratio"] = bootstrap_median([a[key] / b[key] for _, a, b in pairs])
    both = [(a["updates_to_threshold"], b["updates_to_threshold"]) for _, a, b in pairs
            if a["updates_to_threshold"] and b["updates_to_threshold"]]
    out["updates_ratio"] = (bootstrap_median([a / b for a, b in both]) if both else None)
    out["updates_pairs"] = len(both)
    out["decision"] = decide(out["time_ratio"], out["final_diff"])
    return out


def steady_window(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """A sweep run's steady-state figures, or None where it has none: not run, or stopped by
    its wall budget at or before update SWEEP_WINDOW (amendment 1's window, from that update to
    the last, is then empty; the runner had left it unset and async_measure.steady measured
    from update 0, start-up included)."""
    steady = record.get("steady") if record else None
    if not steady or steady["window"][0] < SWEEP_WINDOW:
        return None
    return steady


def _spread(values: list[float]) -> tuple[float, float, float] | None:
    """(median, min, max); None for no values."""
    return (statistics.median(values), min(values), max(values)) if values else None


def sweep_analysis(records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per sweep point: R, T and R/T (pinned S=0), the bound (R+T)/max(R,T), the speedups of
    pinned S=1 over pinned S=0 and over colocated S=0 (per repeat, paired; each only where
    both of its runs have a steady window), their medians and ranges; and the crossovers in
    R/T where a speedup's median crosses 1."""
    points: dict[str, Any] = {}
    for point in SWEEP_POINTS:
        reps = []
        for repeat in range(1, SWEEP_REPEATS + 1):
            got = {c: records.get(f"sweep-{point}-{c}.r{repeat}") for c in SWEEP_CONFIGS}
            s0, s1, col = (steady_window(got[c]) for c in ("pin-S0", "pin-S1", "col-S0"))
            if s0 is None or s1 is None:
                continue
            steady = {"pin-S0": s0, "pin-S1": s1, "col-S0": col}
            reps.append({"repeat": repeat, "R": s0["R"], "T": s0["T"], "ideal": s0["ideal"],
                         "speedup_pinned": s0["period"] / s1["period"],
                         "speedup_colocated": col["period"] / s1["period"] if col else None,
                         "cpu_per_update": {c: w["cpu_per_update"] if w else None
                                            for c, w in steady.items()},
                         "other_cores": max(got[c]["other_cores"] for c in steady if steady[c]),
                         "other_cores_pinned": max(got[c]["other_cores"]
                                                   for c in ("pin-S0", "pin-S1"))})
        if not reps:
            continue
        med = {k: statistics.median(r[k] for r in reps)
               for k in ("R", "T", "ideal", "speedup_pinned")}
        colocated = [r["speedup_colocated"] for r in reps if r["speedup_colocated"] is not None]
        colocated_spread = _spread(colocated)
        med["speedup_colocated"] = colocated_spread[0] if colocated_spread else None
        points[point] = {
            **med, "R_over_T": med["R"] / med["T"], "repeats": reps,
            "share_of_ideal": statistics.median(r["speedup_pinned"] / r["ideal"] for r in reps),
            "range_pinned": (min(r["speedup_pinned"] for r in reps),
                             max(r["speedup_pinned"] for r in reps)),
            "range_colocated": colocated_spread[1:] if colocated_spread else None,
            "repeats_colocated": len(colocated)}
    ordered = sorted(points.items(), key=lambda kv: kv[1]["R_over_T"])
    crossings: dict[str, list[float]] = {}
    for key in ("speedup_pinned", "speedup_colocated"):
        crossings[key] = []
        measured = [p for _, p in ordered if p[key] is not None]
        for a, b in zip(measured, measured[1:]):
            if (a[key] - 1) * (b[key] - 1) < 0:  # log-linear interpolation in R/T
                la, lb = math.log(a["R_over_T"]), math.log(b["R_over_T"])
                t = (1 - a[key]) / (b[key] - a[key])
                crossings[key].append(math.exp(la + t * (lb - la)))
    shares = [r["speedup_pinned"] / r["ideal"] for p in points.values() for r in p["repeats"]]
    return {"points": points, "crossings": crossings,
            "share_of_ideal": bootstrap_median(shares) if shares else None}


def analyse(records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    main_runs = [r for r in records.values() if r["kind"] == "main"]
    figs = {(r["cell"], r["seed"]): run_figures(r) for r in main_runs}
    cells: dict[str, Any] = {}
    for cell in CELLS:
        runs = [figs[(cell.name, s)] for s in SEEDS if (cell.name, s) in figs]
        if not runs:
            continue
        reached = [f["time_to_threshold"] for f in runs if f["time_to_threshold"] is not None]

        def med(key: str, runs: list[dict[str, Any]] = runs) -> float | None:
            values = [f[key] for f in runs if f[key] is not None]
            return statistics.median(values) if values else None
        # Censored runs count as +inf in the median time (as in the ratios).
        times = [f["time_to_threshold"] if f["time_to_threshold"] is not None else math.inf
                 for f in runs]
        cells[cell.name] = {
            "task": cell.task, "placement": cell.placement, "staleness": cell.staleness,
            "loss": cell.loss, "seeds": [s for s in SEEDS if (cell.name, s) in figs],
            "reached": len(reached), "time_to_threshold": bootstrap_median(times),
            "final_heldout": bootstrap_median([f["final_heldout"] or 0.0 for f in runs]),
            **{key: med(key) for key in ("updates_to_threshold", "updates_per_second",
                                         "samples_per_second", "cpu_per_update", "R", "T",
                                         "other_cores", "load_after")},
            "updates_per_second_ci": bootstrap_median([f["updates_per_second"] for f in runs]),
            "cpu_per_update_ci": bootstrap_median([f["cpu_per_update"] for f in runs]),
            "runs": {str(s): figs[(cell.name, s)] for s in SEEDS if (cell.name, s) in figs}}
    comparisons = []
    for name, x, y, primary in COMPARISONS:
        budget = TASKS[x[0]]["budget"]
        result = compare(figs, x, y, budget)
        if result is None:
            continue
        comparisons.append({"name": name, "x": x, "y": y, "primary": primary, **result,
                            "undisturbed": compare(figs, x, y, budget, drop_disturbed=True)})
    sweep = sweep_analysis(records)
    planned = plan()
    missing = [e["id"] for e in planned if e["id"] not in records]
    every = list(records.values())
    p1 = next((c for c in comparisons if c["x"] == "A-pin-S1" and c["y"] == "A-pin-S0"), None)
    u = p1["updates_ratio"] if p1 else None
    u_pairs = p1["updates_pairs"] if p1 else 0
    return {
        "cells": cells, "comparisons": comparisons, "sweep": sweep,
        "update_inflation": u, "update_inflation_pairs": u_pairs, "missing": missing,
        "planned": len(planned),
        "recorded": len(records),
        "study_wall_seconds": sum(r["process_wall"] for r in every),
        "study_cpu_seconds": sum(r["cpu_total"] for r in every),
        "first_run_utc": min((r["started_utc"] for r in every), default=None),
        "last_run_utc": max((r["started_utc"] for r in every), default=None),
        "other_cores_median": (statistics.median(r["other_cores"] for r in every)
                               if every else None),
        "other_cores_max": max((r["other_cores"] for r in every), default=None),
        "disturbed_runs": sum(r["other_cores"] > DISTURBED for r in every),
        "load_range": ((min(r["load_before"][0] for r in every),
                        max(r["load_after"][0] for r in every)) if every else None),
    }


# ---------------------------------------------------------------------------------------------
# Re-analysis (issue 33, written after the study): what the registered analysis above could not
# show, and the deviations its report left out, from the same records.

COMMON_WALL = 25.0
"""Driver wall seconds at which every task-A run's held-out reward is also compared (5 s before
the budget): the registered final reward is each run's last evaluation before the budget, and
those fall at different times in different arms."""
STUDY_HISTORY = (
    ("b59bf26", "2026-11-30 13:46:08",
     "the analysis, decision rule and RESULTS.md writer (benchmarks/use_contract.py)"),
    ("2bf111d", "2026-11-30 13:48:15", "invar/model/state.py (records hashed by value)"),
    ("472b08f", "2026-11-30 13:49:50",
     "invar/model/state.py (one memoising helper for the cached repr and hash)"),
    ("9958dda", "2026-11-30 14:08:09",
     "the data-conditioned observation on the colocated baseline A-col-S0 (printed when its R "
     "exceeds 5× the pinned R)"),
    ("bd70748", "2026-11-30 14:26:42", "invar/model/core.py (the frame handler's no-op path)"),
    ("42fd818", "2026-11-30 14:38:40",
     "the f-model crossover (the 'Extrapolated from f' line of the R/T rule) and the report"),
)
"""Commits to the study's code and analysis after its first run (hash, committer time UTC,
what changed), from `git log --format='%h %cd %s' --date=iso -- reports/use-contract
benchmarks/use_contract.py invar/model/state.py invar/model/core.py`."""


def median_at_extreme(n: int) -> float:
    """Probability that the median of a bootstrap resample of n distinct values (n odd) is their
    smallest (by symmetry, their largest): at least (n + 1) / 2 of the n draws must hit it. Above
    2.5 % the 95 % percentile interval of the median is [min, max] whatever the values."""
    hit = 1 / n
    return sum(math.comb(n, k) * hit ** k * (1 - hit) ** (n - k)
               for k in range((n + 1) // 2, n + 1))


def heldout_at(record: dict[str, Any], wall: float) -> float | None:
    """The held-out reward known at driver wall `wall`: the last evaluation at or before it
    (None before the first)."""
    known = [e["heldout_reward"] for e in record["evaluations"] if e["wall"] <= wall]
    return known[-1] if known else None


def reanalysis(records: dict[str, dict[str, Any]], result: dict[str, Any]) -> dict[str, Any]:
    """The addendum's figures (issue 33), from the records and the registered analysis."""
    import numpy as np
    main_runs = [r for r in records.values() if r["kind"] == "main"]
    figs = {(r["cell"], r["seed"]): run_figures(r) for r in main_runs}
    both_censored = [c["name"] for c in result["comparisons"]
                     if any(figs[(c["x"], s)]["time_to_threshold"] is None
                            and figs[(c["y"], s)]["time_to_threshold"] is None
                            for s in c["seeds"])]
    # Task A, P1: when each run's last evaluation before the budget fell, and the reward
    # difference at one common wall time instead.
    x, y = "A-pin-S1", "A-pin-S0"
    budget = TASKS["A"]["budget"]
    timing = []
    for seed in SEEDS:
        rx, ry = records.get(f"{x}.seed{seed}"), records.get(f"{y}.seed{seed}")
        if rx is None or ry is None:
            continue
        at_common = [heldout_at(r, COMMON_WALL) for r in (rx, ry)]
        timing.append({
            "seed": seed,
            "last_wall": [max(e["wall"] for e in r["evaluations"] if e["wall"] <= budget)
                          for r in (rx, ry)],
            "diff_at_budget": figs[(x, seed)]["final_heldout"] - figs[(y, seed)]["final_heldout"],
            "diff_at_common": (at_common[0] - at_common[1]
                               if None not in at_common else None)})
    common = [t["diff_at_common"] for t in timing if t["diff_at_common"] is not None]
    repeats = [r for p in result["sweep"]["points"].values() for r in p["repeats"]]
    cpu = [r["cpu_per_update"]["pin-S1"] / r["cpu_per_update"]["pin-S0"] for r in repeats
           if r["cpu_per_update"]["pin-S0"] and r["cpu_per_update"]["pin-S1"]]
    shares = [r["speedup_pinned"] / r["ideal"] for r in repeats]
    others = [r["other_cores_pinned"] for r in repeats]
    colocated_sweep = [r for r in records.values()
                       if r["kind"] == "sweep" and r["config"] == "col-S0"]
    return {
        "median_at_extreme": median_at_extreme(len(SEEDS)),
        "main_runs": len(main_runs),
        "main_runs_reached": sum(f["time_to_threshold"] is not None for f in figs.values()),
        "comparisons_with_both_censored_pair": both_censored,
        "final_timing": timing,
        "final_diff_at_common": statistics.median(common) if common else None,
        "pinned_repeats": len(repeats),
        "pinned_faster": sum(r["speedup_pinned"] > 1 for r in repeats),
        "pinned_speedup": _spread([r["speedup_pinned"] for r in repeats]),
        "pinned_cpu_ratio": _spread(cpu),
        "pinned_cpu_repeats": len(cpu),
        "R_over_T": _spread([r["R"] / r["T"] for r in repeats]),
        "share_of_ideal": _spread(shares),
        "share_other_work_r": (float(np.corrcoef(shares, others)[0, 1])
                               if len(repeats) > 2 else None),
        "colocated_sweep_runs": len(colocated_sweep),
        "colocated_repeats": sum(r["speedup_colocated"] is not None for r in repeats),
        "colocated_single": sorted(name for name, p in result["sweep"]["points"].items()
                                   if p["repeats_colocated"] == 1),
        "start_up_windows": sorted(r["id"] for r in colocated_sweep
                                   if r["steady"] and steady_window(r) is None),
        "history": [{"commit": commit, "utc": utc, "what": what,
                     "runs_started_before": sum(r["started_utc"] < utc
                                                for r in records.values())}
                    for commit, utc, what in STUDY_HISTORY],
        "colocated_sync_before_note": sum(
            r.get("cell") == "A-col-S0" and r["started_utc"] < dict(
                (commit, utc) for commit, utc, _ in STUDY_HISTORY)["9958dda"]
            for r in records.values()),
        "last_run_utc": max((r["started_utc"] for r in records.values()), default=None),
    }


def _ci(triple: Any, fmt: str = ".2f") -> str:
    if triple is None:
        return "–"
    m, lo, hi = triple
    return f"{_num(m, fmt)} [{_num(lo, fmt)}, {_num(hi, fmt)}]"


def _num(value: float | None, fmt: str) -> str:
    if value is None:
        return "–"
    return "∞" if value == math.inf else format(value, fmt)


def plots(out: Path, records: dict[str, dict[str, Any]], result: dict[str, Any]
          ) -> list[tuple[str, str]]:
    import matplotlib
    matplotlib.use("Agg")
    import warnings

    import matplotlib.pyplot as plt
    import numpy as np
    # Before a seed's first evaluation its curve is NaN: nanmedian warns on those columns.
    warnings.filterwarnings("ignore", "All-NaN slice", RuntimeWarning)
    made = []
    cells = result["cells"]
    colours = dict(zip([c.name for c in CELLS], plt.get_cmap("tab10").colors))

    # 1. Held-out reward against wall time: median across seeds, band = min..max.
    figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for axis, task in zip(axes, TASKS):
        budget = TASKS[task]["budget"]
        grid = np.linspace(0, budget, 121)
        for cell in CELLS:
            if cell.task != task or cell.name not in cells:
                continue
            curves = []
            for seed in SEEDS:
                record = records.get(f"{cell.name}.seed{seed}")
                if record is None or not record["evaluations"]:
                    continue
                walls = [e["wall"] for e in record["evaluations"]]
                values = [e["heldout_reward"] for e in record["evaluations"]]
                # The reward known at time t: the last evaluation done by then (a step curve).
                index = np.searchsorted(walls, grid, side="right") - 1
                curves.append(np.where(index >= 0, np.asarray(values)[np.maximum(index, 0)],
                                       np.nan))
            if not curves:
                continue
            stack = np.asarray(curves)
            axis.plot(grid, np.nanmedian(stack, axis=0), color=colours[cell.name],
                      label=f"{cell.name} (n={len(curves)})")
            axis.fill_between(grid, np.nanmin(stack, axis=0), np.nanmax(stack, axis=0),
                              color=colours[cell.name], alpha=0.15, linewidth=0)
        axis.axhline(TASKS[task]["threshold"], color="grey", linestyle=":", linewidth=1)
        axis.set_title(f"task {task} (reverse {TASKS[task]['sets']['task.length']})")
        axis.set_xlabel("driver wall seconds")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7, frameon=False, loc="upper left")
    axes[0].set_ylabel("held-out greedy reward")
    figure.suptitle("median over seeds; band: min–max over seeds", fontsize=9)
    figure.tight_layout()
    figure.savefig(out / "reward_vs_time.png", dpi=110)
    plt.close(figure)
    made.append(("reward_vs_time.png", "held-out reward against wall time, bands across seeds"))

    # 2. Time to threshold per cell: median with bootstrap interval, seeds as dots.
    names = [c.name for c in CELLS if c.name in cells]
    figure, axis = plt.subplots(figsize=(8, 0.45 * len(names) + 1.2))
    for row, name in enumerate(names):
        budget = TASKS[cells[name]["task"]]["budget"]
        m, lo, hi = cells[name]["time_to_threshold"]
        shown = [min(v, budget * 1.05) for v in (m, lo, hi)]
        axis.errorbar(shown[0], row, xerr=[[shown[0] - shown[1]], [shown[2] - shown[0]]],
                      fmt="s", color=colours[name], capsize=3)
        for f in cells[name]["runs"].values():
            t = f["time_to_threshold"]
            axis.plot(t if t is not None else budget * 1.05, row + 0.18,
                      "o" if t is not None else "x", color=colours[name], markersize=3.5)
    axis.set_yticks(range(len(names)), names)
    axis.invert_yaxis()
    axis.set_xlabel("driver wall seconds to held-out reward ≥ 0.8 (x: not reached in budget)")
    axis.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    figure.savefig(out / "time_to_quality.png", dpi=110)
    plt.close(figure)
    made.append(("time_to_quality.png", "time to threshold per arm, 95 % intervals"))

    # 3. Throughput and CPU cost per cell.
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 0.45 * len(names) + 1.2),
                                         sharey=True)
    for axis, key, label in ((left, "updates_per_second_ci", "updates / s"),
                             (right, "cpu_per_update_ci", "CPU seconds / update")):
        m = [cells[n][key][0] for n in names]
        err = [[cells[n][key][0] - cells[n][key][1] for n in names],
               [cells[n][key][2] - cells[n][key][0] for n in names]]
        axis.barh(range(len(names)), m, xerr=err, color=[colours[n] for n in names],
                  capsize=3)
        axis.set_xlabel(label + " (median, 95 % interval)")
        axis.grid(axis="x", alpha=0.3)
    left.set_yticks(range(len(names)), names)
    left.invert_yaxis()
    figure.tight_layout()
    figure.savefig(out / "throughput_cost.png", dpi=110)
    plt.close(figure)
    made.append(("throughput_cost.png", "throughput and CPU cost per arm"))

    # 4. The R/T crossover.
    points = result["sweep"]["points"]
    if points:
        figure, axis = plt.subplots(figsize=(7, 4.2))
        ratios = np.geomspace(0.1, 10, 200)
        ideal = (ratios + 1) / np.maximum(ratios, 1)
        axis.plot(ratios, ideal, color="grey", linestyle="--", label="ideal (R+T)/max(R,T)")
        share = result["sweep"]["share_of_ideal"]
        if share:
            axis.plot(ratios, share[0] * ideal, color="grey", linestyle=":",
                      label=f"{share[0]:.2f} × ideal (median share reached)")
        for key, colour, label in (("speedup_pinned", "tab:blue", "S=1 pinned ÷ S=0 pinned"),
                                   ("speedup_colocated", "tab:red",
                                    "S=1 pinned ÷ S=0 colocated (2+2 threads)")):
            for _name, p in points.items():
                for r in p["repeats"]:
                    if r[key] is not None:
                        axis.plot(r["R"] / r["T"], r[key], ".", color=colour, alpha=0.4)
            xs = sorted((p for p in points.values() if p[key] is not None),
                        key=lambda p: p["R_over_T"])
            axis.plot([p["R_over_T"] for p in xs], [p[key] for p in xs], "o-", color=colour,
                      label=label)
        for name, p in points.items():
            axis.annotate(name, (p["R_over_T"], p["speedup_pinned"]), fontsize=7,
                          textcoords="offset points", xytext=(3, 4))
        axis.axhline(1, color="black", linewidth=0.8)
        axis.set_xscale("log")
        # Log speed-ups: the colocated baseline's collapses (up to ~35x) would flatten the rest.
        axis.set_yscale("log")
        axis.set_xlabel("R / T (rollout s per batch ÷ learner s per update, measured at S=0)")
        axis.set_ylabel("speed-up in updates / s")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7, frameon=False)
        figure.tight_layout()
        figure.savefig(out / "crossover.png", dpi=110)
        plt.close(figure)
        made.append(("crossover.png", "speed-up against R/T: the crossover"))
    return made


DEVIATIONS = (
    "The runner's first start failed after its first run (A-pin-S0.seed1: bench_async's `run` "
    "needs the batch size among the settings); that run was not recorded, the fix was committed "
    "and the study restarted from the beginning a minute later.",
    "This session's own commits landed while the study ran: `invar train` prints the R/T hint "
    "(one stderr line after update 6) in every run started after 13:43 UTC, and this session "
    "ran its unit tests for `invar report` and the hint during the study: they are part of the "
    "'other work' recorded beside every run.",
    "Amendment 1 (committed before any sweep run): every sweep run stopped at 30 s of driver "
    "wall time, its steady window from update 5 to its last update; sweep runs stopped before "
    "update 24 have no CPU s/update.",
    "Restarting the runner to pick up amendment 1, this session stopped it one run too early, "
    "during A-pin-S1-beh.seed5 (the last cell of round 5); that run was discarded unrecorded "
    "and rerun from scratch a minute later (14:18 UTC), still after every other cell of its "
    "round.",
    "No disturbed run was rerun (declared): the machine was shared the whole time (the "
    "other-work column of every table); the sensitivity analysis drops pairs above 0.5 cores "
    "of other work.",
)


def addendum_lines(again: dict[str, Any], result: dict[str, Any]) -> list[str]:
    """RESULTS.md's addendum (issue 33) from `reanalysis`'s figures."""
    history = {h["commit"]: h for h in again["history"]}

    def when(commit: str) -> str:
        h = history[commit]
        return f"{commit} at {h['utc'][11:16]} UTC, {h['runs_started_before']} runs started before"
    speed, cpu, spanned = again["pinned_speedup"], again["pinned_cpu_ratio"], again["R_over_T"]
    share, points = again["share_of_ideal"], result["sweep"]["points"]
    low = 1 / result["sweep"]["share_of_ideal"][0] - 1  # the f-model's crossover, as above
    p1 = next(c for c in result["comparisons"] if (c["x"], c["y"]) == ("A-pin-S1", "A-pin-S0"))
    lines = [
        "## Addendum (issue 33): what the analysis above could not show, and undisclosed "
        "deviations", "",
        "Written after the study, not part of its registered analysis. An independent "
        "re-analysis of `runs.jsonl` reproduced every figure above and found what follows; "
        "every figure here is computed from `runs.jsonl` (`reanalysis` in "
        "studies/use_contract.py), commit times come from `git log --format='%h %cd %s' "
        "--date=iso -- reports/use-contract benchmarks/use_contract.py invar/model/state.py "
        "invar/model/core.py` (tests/studies/test_use_contract_analysis.py checks them).", "",
        "### What the registered rule could not conclude", "",
        f"- **No comparison could end in 'use async'.** With {len(SEEDS)} seed pairs a "
        f"resample's median is the smallest pair's value with probability "
        f"{again['median_at_extreme']:.3f} (at least {(len(SEEDS) + 1) // 2} of the "
        f"{len(SEEDS)} draws must hit it), more than the 0.025 a 95 % percentile interval "
        "leaves out on each side: the interval of the median is exactly [min, max] of the "
        f"pairs, so 'use async' needed all {len(SEEDS)} pairs below 1 (a "
        f"{len(SEEDS)}/{len(SEEDS)} sign test). And only {again['main_runs_reached']} of "
        f"{again['main_runs']} runs reached 0.8 within their budget: "
        f"{len(again['comparisons_with_both_censored_pair'])} of {len(result['comparisons'])} "
        "comparisons had a seed pair where neither run reached it, which the registered rule "
        "counts as a ratio of 1, so no upper end could fall below 1. Time to threshold, "
        f"censored in {again['main_runs'] - again['main_runs_reached']} of "
        f"{again['main_runs']} runs, is a survival problem.",
        "- **The final held-out reward depends on when each run's last evaluation fell.** P1 "
        "task A, per seed:", "",
        f"| seed | S=1 last evaluation, s | S=0 last evaluation, s | S=1 − S=0 at the budget | "
        f"S=1 − S=0 at {COMMON_WALL:.0f} s |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {t['seed']} | {t['last_wall'][0]:.1f} | {t['last_wall'][1]:.1f} | "
              f"{t['diff_at_budget']:+.3f} | {_num(t['diff_at_common'], '+.3f')} |"
              for t in again["final_timing"]]
    lines += [
        "", f"  Compared at a common {COMMON_WALL:.0f} s, the median difference is "
        f"{_num(again['final_diff_at_common'], '+.3f')}, not {p1['final_diff'][0]:+.3f}.",
        "- **The R/T sweep could not move R/T.** `protocol.optimizer_steps` (K) splits one "
        "fixed batch into K minibatches, so the learner passes over the same samples once "
        f"whatever K, and T does not grow with K (median T {points['k1']['T']:.3f} s at K = 1, "
        f"{points['k8']['T']:.3f} s at K = 8), while longer responses lengthen both phases "
        f"(len16: R {points['len16']['R']:.3f} s, T {points['len16']['T']:.3f} s against "
        f"{points['k1']['R']:.3f} s, {points['k1']['T']:.3f} s at k1); the narrow spread is "
        "that, not the machine's load as said above.",
        f"- **The crossover 'R/T between about {low:.2f} and {1 / low:.1f}' is the f-model's, "
        f"not a measurement.** It was added after the last run ({when('42fd818')}; the last "
        f"run started {again['last_run_utc'][11:19]} UTC); the pinned repeats spanned R/T "
        f"{spanned[1]:.2f}–{spanned[2]:.2f} only. And f is no constant of the runtime: across "
        f"the {again['pinned_repeats']} pinned repeats the share of (R+T)/max(R,T) reached "
        f"ranged {share[1]:.2f}–{share[2]:.2f} and fell with the machine's other work (the "
        f"larger of the pair's, in cores; Pearson r = {again['share_other_work_r']:.2f}).",
        f"- The update inflation u above comes from the {result['update_inflation_pairs']} "
        "seed pair(s) where both runs reached 0.8.",
        "", "### What does hold", "",
        f"- Pinned to separate cores, S = 1 made more updates/s than S = 0 in "
        f"{again['pinned_faster']} of {again['pinned_repeats']} sweep repeats (speed-up median "
        f"{speed[0]:.2f}, range {speed[1]:.2f}–{speed[2]:.2f}) at unchanged CPU per update "
        f"(S = 1 ÷ S = 0: median {cpu[0]:.2f}, range {cpu[1]:.2f}–{cpu[2]:.2f}, "
        f"{again['pinned_cpu_repeats']} repeats). That is throughput only: whether the extra "
        "updates reach quality sooner was not shown.",
        "", "### Deviations the list above left out", "",
        f"- The analysis code was committed after the runs had started ({when('b59bf26')}); "
        "the pre-registration fixed the analysis in words only.",
        f"- The data-conditioned observation on the colocated baseline was committed "
        f"({when('9958dda')}) after {again['colocated_sync_before_note']} of the "
        f"{len(SEEDS)} A-col-S0 runs it describes had run.",
        f"- The core under test changed during the study: invar/model/state.py in "
        f"{when('2bf111d')} and {when('472b08f')}; invar/model/core.py in {when('bd70748')} "
        f"(of {again['main_runs'] + again['colocated_sweep_runs'] * len(SWEEP_CONFIGS)} "
        "runs). Which code a given run imported cannot be established: `runs.jsonl` records "
        "no commit or dirty flag per run and the run directories are gone; that the study ran "
        "from the checkout these commits landed in rests on this report's own second "
        "deviation above (the hint commit reached every run started after 13:43 UTC).",
        f"- {len(again['start_up_windows'])} of {again['colocated_sweep_runs']} colocated "
        f"sweep runs were stopped by the 30 s budget at or before update {SWEEP_WINDOW}, so "
        f"amendment 1's window (update {SWEEP_WINDOW} to the last) was empty; the runner left "
        "it unset and the steady-state code then measured from update 0, start-up included: "
        + ", ".join(f"`{i}`" for i in again["start_up_windows"]) + ". The report as first "
        "committed (42fd818) counted their colocated speed-ups, start-up included; the analysis "
        "now leaves them out (`steady_window`), so the colocated column of the R/T table rests "
        f"on {again['colocated_repeats']} of {again['colocated_sweep_runs']} repeats"
        + (" (one repeat each at " + ", ".join(again["colocated_single"]) + "; the colocated "
           "crossovers above interpolate between such points)" if again["colocated_single"]
           else "")
        + ".",
        f"- The f-model crossover above was added after the data ({when('42fd818')}).",
        "",
    ]
    return lines


def write_results(records: dict[str, dict[str, Any]], out: Path, console: Any) -> None:
    import torch
    result = analyse(records)
    made = plots(out, records, result)
    result["generated_utc"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                         "torch": torch.__version__, "commit": async_report._git_head()}
    result["deviations_declared"] = list(DEVIATIONS)
    again = result["reanalysis"] = reanalysis(records, result)
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str,
                                                 allow_nan=True))
    cells, comparisons, sweep = result["cells"], result["comparisons"], result["sweep"]
    lines = [
        "# The use contract: when is asynchronous training worth it? (results)", "",
        "Generated by `.venv/bin/python studies/use_contract.py --report-only"
        + ("" if out.resolve() == OUT.resolve() else f" --out {out}") + "` from "
        f"`reports/use-contract/runs.jsonl` (the recorded runs; without `--report-only` the "
        f"command also runs whatever of the pre-registered plan is missing) on "
        f"{result['generated_utc']} UTC. Plan: [PREREGISTRATION.md](PREREGISTRATION.md). "
        f"Report written at commit `{(result['machine']['commit'] or '?')[:10]}` with Python "
        f"{platform.python_version()} and torch {torch.__version__}; the runs ran on the "
        "plan's shared machine and record no commit of their own (see the addendum).", "",
        f"Runs recorded: {result['recorded']} of {result['planned']} planned, from "
        f"{result['first_run_utc']} to {result['last_run_utc']} UTC. The study took "
        f"**{result['study_wall_seconds'] / 60:.1f} min of wall time and "
        f"{result['study_cpu_seconds'] / 60:.1f} CPU-minutes** (getrusage of every run's "
        f"process tree). Other people's work ran throughout: median "
        f"{_num(result['other_cores_median'], '.2f')} cores of other work per run (max "
        f"{_num(result['other_cores_max'], '.2f')}; {result['disturbed_runs']} runs above "
        f"{DISTURBED} cores), 1-min load average between "
        + (" and ".join(f"{v:.2f}" for v in result["load_range"]) if result["load_range"]
           else "–") + ".", "",
        "**CUDA arm: not run.** No GPU was available to this session; the comparison of "
        "rollout and learning overlapping on one GPU at S = 1 against the synchronous loop "
        "has not been made.", "",
        "## Verdict (pre-registered rule, δ = 0.05)", "",
        "| comparison | time-to-0.8 ratio X÷Y [95 % CI] | final held-out X−Y [95 % CI] | "
        "updates/s ratio | CPU s/update ratio | seeds | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        lines.append(
            f"| {'**' if c['primary'] else ''}{c['name']}{'**' if c['primary'] else ''} | "
            f"{_ci(c['time_ratio'])} | {_ci(c['final_diff'], '+.3f')} | "
            f"{_ci(c['updates_per_second_ratio'])} | {_ci(c['cpu_per_update_ratio'])} | "
            f"{len(c['seeds'])} | {c['decision']} |")
    lines += [
        "", "Ratios are medians over seed pairs (X and Y of one seed ran in the same round); "
        "intervals are 95 % percentile bootstraps of the median (10 000 resamples). A ratio "
        "below 1 means X reached 0.8 sooner. Censoring as pre-registered (∞: X never reached "
        "it within the budget while Y did). Primary comparisons in bold. Rule: use async when "
        "the ratio's interval lies below 1 and the reward difference's lower end is ≥ −0.05; "
        "do not use when the ratio's interval lies above 1 or the difference's upper end is "
        "< −0.05; otherwise inconclusive.", "",
        "Sensitivity (pairs where neither run had more than 0.5 cores of other work):", "",
        "| comparison | pairs left | time ratio [95 % CI] | final X−Y [95 % CI] | verdict |",
        "|---|---|---|---|---|",
    ]
    for c in comparisons:
        u = c["undisturbed"]
        lines.append(f"| {c['name']} | {len(u['seeds']) if u else 0} | "
                     + (f"{_ci(u['time_ratio'])} | {_ci(u['final_diff'], '+.3f')} | "
                        f"{u['decision']} |" if u else "– | – | no pairs left |"))
    lines += [
        "", "## Per arm", "",
        "| arm | seeds | reached 0.8 | s to 0.8 [95 % CI] | updates to 0.8 | final held-out "
        "[95 % CI] | updates/s | samples/s | CPU s/update | R s/batch | T s/update | other "
        "work, cores |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in cells.items():
        lines.append(
            f"| {name} | {len(c['seeds'])} | {c['reached']}/{len(c['seeds'])} | "
            f"{_ci(c['time_to_threshold'], '.1f')} | {_num(c['updates_to_threshold'], '.0f')} | "
            f"{_ci(c['final_heldout'], '.3f')} | {_num(c['updates_per_second'], '.2f')} | "
            f"{_num(c['samples_per_second'], '.0f')} | {_num(c['cpu_per_update'], '.2f')} | "
            f"{_num(c['R'], '.3f')} | {_num(c['T'], '.3f')} | {_num(c['other_cores'], '.2f')} |")
    lines += [
        "", f"Task A: reverse 8, budget {TASKS['A']['budget']:.0f} s; task B: reverse 10, "
        f"budget {TASKS['B']['budget']:.0f} s; threshold 0.8 held-out greedy reward, evaluated "
        "every 5 updates. Times are driver wall seconds (interpreter start excluded). R, T: "
        "per-update timing rows, the first update left out (invar.runtime.hint.measure). CPU "
        "s/update: whole process tree, start-up included, ÷ updates. Medians over seeds.", "",
    ]
    col, pin = cells.get("A-col-S0"), cells.get("A-pin-S0")
    if col and pin and col["R"] and pin["R"] and col["R"] > 5 * pin["R"]:
        # Data-conditioned: says what the P2 baseline measured, so its verdict is read right.
        lines += [
            f"Observation: the colocated synchronous baseline (A-col-S0, 2 torch threads in the "
            f"worker and 2 in the learner, unpinned) generated a batch in R = {col['R']:.2f} s "
            f"(median) against {pin['R']:.3f} s pinned with 1 thread, and made "
            f"{col['updates_per_second']:.2f} updates/s. On a 2-vCPU machine already carrying "
            f"other jobs, a 2-thread torch process whose threads are descheduled stalls at every "
            f"parallel region; bench_async measured R = 0.084 s for the same arm on a quiet "
            f"machine. P2 therefore compares against a baseline that collapsed under sharing, "
            f"not against a fair use of both cores.", ""]
    for name, caption in made:
        if name != "crossover.png":
            lines += [f"![{caption}]({name})", ""]
    lines += ["## The R/T rule", ""]
    points = sweep["points"]
    if points:
        lines += [
            "| point | R s/batch | T s/update | R/T | ideal (R+T)/max(R,T) | S=1 ÷ S=0 pinned "
            "[range] | share of ideal | S=1 pinned ÷ S=0 colocated [range] | repeats, pinned "
            "/ colocated | other work, cores (max) |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, p in sorted(points.items(), key=lambda kv: kv[1]["R_over_T"]):
            lines.append(
                f"| {name} | {p['R']:.3f} | {p['T']:.3f} | {p['R_over_T']:.2f} | "
                f"{p['ideal']:.2f} | {p['speedup_pinned']:.2f} [{p['range_pinned'][0]:.2f}, "
                f"{p['range_pinned'][1]:.2f}] | {100 * p['share_of_ideal']:.0f} % | "
                + (f"{p['speedup_colocated']:.2f} [{p['range_colocated'][0]:.2f}, "
                   f"{p['range_colocated'][1]:.2f}]" if p["range_colocated"] else "–")
                + f" | {len(p['repeats'])} / {p['repeats_colocated']} | "
                f"{max(r['other_cores'] for r in p['repeats']):.2f} |")
        share = sweep["share_of_ideal"]
        cross = sweep["crossings"]
        u = result["update_inflation"]
        lines += [
            "", f"Steady window from update {SWEEP_WINDOW} to update {SWEEP_UPDATES - 1}, or to "
            "the last update of a run stopped by its wall budget (amendment 1); a run stopped at "
            f"or before update {SWEEP_WINDOW} has no window, and its repeat no speed-up against "
            "it. Speed-ups pair the configurations of one repeat; the interval is the range of "
            "the repeats. Points: k1…k8 = reverse 8 with K = 1…8 optimizer steps; len16 = "
            "reverse 16 with K = 1.", "",
            "![speed-up against R/T](crossover.png)", "",
            f"- Share of the ideal (R+T)/max(R,T) this runtime reached, pinned S = 1 over "
            f"pinned S = 0, all points and repeats: f = {_ci(share)}.",
            "- Crossover of S = 1 pinned over S = 0 pinned (speed-up = 1): "
            + (", ".join(f"R/T ≈ {x:.2f}" for x in cross["speedup_pinned"])
               or "none within the R/T swept (the sign does not change between points)") + ".",
            "- Crossover of S = 1 pinned over S = 0 colocated: "
            + (", ".join(f"R/T ≈ {x:.2f}" for x in cross["speedup_colocated"])
               or "none within the R/T swept (the sign does not change between points)") + ".",
            f"- Update inflation from staleness (updates to 0.8, S = 1 ÷ S = 0, task A, seed "
            f"pairs where both reached it: {result['update_inflation_pairs']}): u = {_ci(u)}.",
            "- The rule for your own setup: `invar train` prints R, T and (R+T)/max(R,T) once "
            "after its first updates (a `hint:` line). Predicted time-to-quality gain of S = 1 "
            "≈ f × (R+T)/max(R,T) ÷ u; asynchronous training is predicted worth it when this "
            "exceeds 1 *and* the two phases get separate cores (or devices).",
        ]
        if share:
            spanned = [p["R_over_T"] for p in points.values()]
            # f·(R+T)/max(R,T) = 1  <=>  min(R,T)/max(R,T) = 1/f - 1: the crossover the model
            # fitted on the swept points predicts, its interval from f's.
            lines.append(
                f"- The sweep spanned R/T {min(spanned):.2f}…{max(spanned):.2f} only (under the "
                f"machine's load R and T moved less with K and length than planned), so no "
                f"measured crossover. Extrapolated from f (a model, not a measurement): S = 1 "
                f"pinned beats S = 0 pinned in updates/s when min(R,T)/max(R,T) > 1/f − 1 = "
                f"{1 / share[0] - 1:.2f} [{1 / share[2] - 1:.2f}, {1 / share[1] - 1:.2f}], i.e. "
                f"for R/T between about {1 / share[0] - 1:.2f} and {1 / (1 / share[0] - 1):.1f}.")
        if share and u:
            best = share[0] * 2 / u[0]
            lines.append(f"- With the medians above: f × 2 ÷ u = {best:.2f} at the best possible "
                         f"R/T (= 1); the gain falls to f ÷ u = {share[0] / u[0]:.2f} where one "
                         "phase dominates.")
    else:
        lines.append("The R/T sweep has not run (see deviations).")
    lines += ["", "## Deviations from the pre-registration", ""]
    lines += [f"- {d}" for d in DEVIATIONS]
    if result["missing"]:
        lines.append(f"- Not run ({len(result['missing'])} of {result['planned']}): "
                     + ", ".join(result["missing"]) + ".")
    else:
        lines.append("- Every planned run was recorded.")
    lines.append("- The CUDA arm did not run (no GPU).")
    lines += [""] + addendum_lines(again, result)
    lines += ["## Reproduce", "",
              "- Everything (runs what is missing, then this report): "
              "`.venv/bin/python studies/use_contract.py`",
              "- This report, the JSON and every figure from the recorded runs, here or into "
              "another folder (nothing runs): "
              "`.venv/bin/python studies/use_contract.py --report-only [--out DIR]`",
              "- Quality, throughput and cost of any run directories: "
              "`invar report RUN_DIR... --out DIR`", ""]
    (out / "RESULTS.md").write_text("\n".join(lines))
    console.print(f"[bold]wrote[/] {out / 'RESULTS.md'}, {out / 'results.json'}")


if __name__ == "__main__":
    sys.exit(main())
