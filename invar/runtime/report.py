"""`invar report RUN_DIR... [--out DIR] [--threshold X]`: quality, throughput and resource cost
of each run directory, side by side (a Markdown table, report.json and plots).

Everything is read from what `invar train` leaves in a run directory: config.json,
metrics.jsonl (one row per update with the per-update timing the driver measures, one per
held-out evaluation) and summary.json when the run finished (a run that was stopped early has
none; its figures come from the rows alone). Nothing is re-run or re-evaluated.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from invar.model.messages import parse_json
from invar.runtime.hint import measure
from invar.runtime.metrics import pace_text
from invar.runtime.plots import THROUGHPUT_WINDOW, TITLES, Curves
from invar.runtime.responses import latest_lines
from invar.runtime.tasks import describe

DEFAULT_THRESHOLD = 0.8


class ReportError(Exception):
    """Input `invar report` cannot use; str() names the argument at fault."""

    def __init__(self, argument: str, reason: str) -> None:
        super().__init__(f"{argument}: {reason}")


@dataclass
class RunFigures:
    """One run's quality, throughput and resource cost."""

    run: str
    """The run directory as given."""
    label: str
    """Its name (the directory's last component)."""
    task: str
    """The task in a phrase (`invar.runtime.tasks.describe`)."""
    staleness: int
    loss: str
    placement: str
    """"pinned" (rollout.cpus and learner.cpus set) or "unpinned"."""
    finished: bool
    """summary.json exists: the run reached total_updates (False: stopped early, or running)."""
    updates: int
    wall_seconds: float
    """Driver wall seconds to the last update row (earlier lives of a resumed run included)."""
    updates_per_second: float
    samples_per_second: float
    final_heldout: float | None
    best_heldout: float | None
    threshold_seconds: float | None
    """Wall seconds to the first held-out evaluation >= the threshold (None: not reached)."""
    threshold_updates: int | None
    rollout_seconds: float | None
    """R: worker generation seconds per batch (per worker), from the rows."""
    learning_seconds: float | None
    """T: learner busy seconds per update, from the rows."""
    overlap_bound: float | None
    """(R + T) / max(R, T)."""
    busy_seconds_per_update: float | None
    """Resource cost: learner + rollout generation (summed over workers) + core/driver seconds
    per update, the run's own accounting. Busy wall seconds of each part, not CPU time: a
    part using several threads costs more CPU than this says."""
    learner_busy_share: float | None
    rollout_busy_share: float | None
    """Rollout generation seconds (summed over workers) ÷ wall: > 1 with several workers."""
    core_and_driver_share: float | None


def load_run(path: Path, argument: str) -> tuple[dict[str, Any], Curves, dict[str, Any] | None]:
    """(config, its rows and resume points, summary or None) of a run directory."""
    if not path.is_dir():
        raise ReportError(argument, "does not exist" if not path.exists()
                          else "is not a directory")
    config_path = path / "config.json"
    if not (path / "metrics.jsonl").is_file() or not config_path.is_file():
        missing = "metrics.jsonl" if not (path / "metrics.jsonl").is_file() else "config.json"
        raise ReportError(argument, f"has no {missing}: not a run directory of `invar train` "
                                    "(or one that has not written its first update yet)")
    try:
        config = parse_json(config_path.read_text(encoding="utf-8"))
        config["protocol"]["prompts_per_batch"]  # noqa: B018 (the shape is checked here)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise ReportError(argument, f"config.json is not a configuration of `invar train` "
                                    f"({type(error).__name__}: {error})") from None
    # The rows as a resumed run reads them: a torn line skipped, an update redone after a crash
    # keeping its last row, walls counted across lives.
    from invar.runtime.metrics import MetricsLog
    log = MetricsLog(path, config, tensorboard=False)
    if not log.updates:
        raise ReportError(argument, "metrics.jsonl holds no update row yet")
    summary = None
    if (path / "summary.json").is_file():
        try:
            summary = parse_json((path / "summary.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise ReportError(argument, f"summary.json is not readable JSON ({error})") from None
    resumes = [wall for life, wall in sorted(log.life_walls.items()) if life >= 2]
    return config, Curves(path.name, log.updates, log.evaluations, resumes, log.shown), summary


def figures(run: str, config: dict[str, Any], updates: list[dict[str, Any]],
            evaluations: list[dict[str, Any]], summary: dict[str, Any] | None,
            threshold: float) -> RunFigures:
    """A run's figures from its rows (and summary, for the shares only it records)."""
    protocol = config["protocol"]
    samples = int(protocol["prompts_per_batch"]) * int(protocol["group_size"])
    workers = int(config.get("rollout", {}).get("workers", 1))
    n = len(updates)
    wall = float(updates[-1]["wall"])
    if summary is not None and summary.get("updates") == n:
        wall = float(summary["wall_seconds"])  # includes the closing evaluation and summary
    reached = next((e for e in evaluations if e["heldout_reward"] >= threshold), None)
    times = measure(updates, samples, workers)
    timed = [u for u in updates if "learner_seconds" in u]
    busy = (sum(float(u["learner_seconds"]) + float(u.get("rollout_seconds", 0.0))
                + float(u.get("core_seconds", 0.0)) for u in timed) / len(timed)
            if timed else None)

    def share(key: str) -> float | None:
        return (sum(float(u.get(key, 0.0)) for u in timed) / wall) if timed and wall else None

    pinned = bool(config.get("rollout", {}).get("cpus")) or bool(
        config.get("learner", {}).get("cpus"))
    return RunFigures(
        run=run, label=Path(run).name or run,
        task=describe(config.get("task", {"name": "reverse", "length": "?"})),
        staleness=int(protocol["max_staleness"]),
        loss=str(protocol.get("objective", {}).get("loss", "?")),
        placement="pinned" if pinned else "unpinned", finished=summary is not None,
        updates=n, wall_seconds=wall,
        updates_per_second=n / wall if wall > 0 else math.nan,
        samples_per_second=n * samples / wall if wall > 0 else math.nan,
        final_heldout=evaluations[-1]["heldout_reward"] if evaluations else None,
        best_heldout=max(e["heldout_reward"] for e in evaluations) if evaluations else None,
        threshold_seconds=float(reached["wall"]) if reached else None,
        threshold_updates=int(reached["version"]) if reached else None,
        rollout_seconds=times.rollout if times else None,
        learning_seconds=times.learning if times else None,
        overlap_bound=times.gain if times else None,
        busy_seconds_per_update=busy,
        learner_busy_share=share("learner_seconds"),
        rollout_busy_share=share("rollout_seconds"),
        core_and_driver_share=(summary.get("core_and_driver_share") if summary is not None
                               else share("core_seconds")))


def _f(value: float | int | None, fmt: str = ".3f") -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else format(value, fmt)


def markdown(runs: list[RunFigures], threshold: float, plotted: list[str] | None = None) -> str:
    """The tables of the report (quality, throughput, resource cost), one row per run."""
    lines = [
        f"# Invar runs: quality, throughput, resource cost ({len(runs)} run"
        f"{'s' if len(runs) != 1 else ''})", "",
        "## Quality", "",
        f"| run | task | S | loss | placement | updates | final held-out | best held-out | "
        f"s to ≥ {threshold:g} | updates to ≥ {threshold:g} |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(f"| {r.label} | {r.task} | {r.staleness} | {r.loss} | {r.placement} | "
          f"{r.updates}{'' if r.finished else ' (stopped)'} | {_f(r.final_heldout)} | "
          f"{_f(r.best_heldout)} | {_f(r.threshold_seconds, '.1f')} | "
          f"{_f(r.threshold_updates, 'd')} |" for r in runs),
        "", "## Throughput", "",
        "| run | wall s | pace | samples/s | R s/batch | T s/update | (R+T)/max(R,T) |",
        "|---|---|---|---|---|---|---|",
        *(f"| {r.label} | {_f(r.wall_seconds, '.1f')} | {pace_text(r.updates_per_second)} | "
          f"{_f(r.samples_per_second, '.1f')} | {_f(r.rollout_seconds)} | "
          f"{_f(r.learning_seconds)} | {_f(r.overlap_bound, '.2f')} |" for r in runs),
        "", "## Resource cost", "",
        "| run | busy s/update | learner busy | rollout busy | core + driver |",
        "|---|---|---|---|---|",
        *(f"| {r.label} | {_f(r.busy_seconds_per_update)} | "
          f"{_pct(r.learner_busy_share)} | {_pct(r.rollout_busy_share)} | "
          f"{_pct(r.core_and_driver_share)} |" for r in runs),
        "",
        "Final held-out: the last greedy evaluation; s to ≥ threshold: driver wall seconds of "
        "the first evaluation that reached it (– : never). R, T: rollout generation seconds "
        "per batch and learner seconds per update, the first update (start-up) left out; "
        "(R+T)/max(R,T) is the most overlapping them can buy over the synchronous loop. Busy "
        "s/update: learner + rollout + core/driver busy seconds per update (the run's own "
        "accounting, wall seconds of each part, not CPU time). Shares are of wall time. "
        "(stopped): no summary.json, the run ended before total_updates.",
        "", "Plots: dashed vertical lines are where a run was resumed (after a crash or a "
        "stop); the dotted line is the threshold; throughput over time is a rolling mean over "
        f"the last {THROUGHPUT_WINDOW} updates.", "",
        *(line for name in plotted or () for line in (f"![{TITLES[name]}]({name})", "")),
    ]
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def plots(out: Path, runs: list[RunFigures], curves: dict[str, Curves], threshold: float
          ) -> list[str]:
    """The runs' curves (`invar.runtime.plots.write_plots`: reward against updates and wall
    time, throughput over time, the learner's figures, resumes marked; the threshold dotted
    on the reward plots) and throughput_cost.png (updates/s and busy s/update per run);
    returns the names written."""
    from invar.runtime.plots import save, write_plots
    for r in runs:
        curves[r.run].label = r.label
    written = write_plots(out, [curves[r.run] for r in runs], threshold=threshold)
    save(throughput_cost_figure(runs), out / "throughput_cost.png")
    return [*written, "throughput_cost.png"]


def throughput_cost_figure(runs: list[RunFigures]) -> Any:
    """Updates/s and busy seconds per update (learner; rollout + core/driver) per run, as
    bars; the legend below the axes, where it hides no bar."""
    from invar.runtime.plots import legend_below, pyplot
    figure, (left, right) = pyplot().subplots(1, 2, figsize=(9, 0.5 * len(runs) + 2.0))
    labels = [r.label for r in runs]
    left.barh(labels, [r.updates_per_second for r in runs], color="tab:blue")
    left.set_xlabel("updates / s")
    cost = [[(r.learning_seconds or 0.0), (r.busy_seconds_per_update or 0.0)
             - (r.learning_seconds or 0.0)] for r in runs]
    right.barh(labels, [c[0] for c in cost], color="tab:orange", label="learner")
    right.barh(labels, [c[1] for c in cost], left=[c[0] for c in cost], color="tab:green",
               label="rollout + core/driver")
    right.set_xlabel("busy seconds / update")
    right.set_yticklabels([])
    for axis in (left, right):
        axis.invert_yaxis()
        axis.grid(axis="x", alpha=0.3)
    legend_below(figure, [right])
    return figure


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="run directories written by `invar train` (output.run_dir)")
    parser.add_argument("--out", metavar="DIR",
                        help="where report.md, report.json and the plots go (default: next "
                             "to the runs: RUN_DIR-report for one run, PARENT/report-A-vs-B "
                             "for several)")
    parser.add_argument("--threshold", default=DEFAULT_THRESHOLD, type=float,
                        help=f"held-out reward for 'time to threshold' (default "
                             f"{DEFAULT_THRESHOLD})")


def report(run_dirs: list[str], out: Path, threshold: float) -> list[RunFigures]:
    """Read every run, then write report.md, report.json and the plots into `out`; raises
    ReportError (naming the argument) before writing anything if any input is unusable."""
    if not (math.isfinite(threshold) and 0 < threshold <= 1):
        raise ReportError("--threshold", f"must be a reward in (0, 1], got {threshold}")
    if out.exists() and not out.is_dir():
        raise ReportError("--out", f"{str(out)!r} exists and is not a directory")
    seen: set[Path] = set()
    runs, curves = [], {}
    for given in run_dirs:
        path = Path(given)
        if path.resolve() in seen:
            raise ReportError(f"RUN_DIR {given!r}", "given twice")
        seen.add(path.resolve())
        config, curve, summary = load_run(path, f"RUN_DIR {given!r}")
        runs.append(figures(given, config, curve.updates, curve.evaluations, summary,
                            threshold))
        curves[given] = curve
    labels = [r.label for r in runs]
    for r in runs:  # equal directory names (a/run, b/run): label by the path given
        if labels.count(r.label) > 1:
            r.label = r.run
    out.mkdir(parents=True, exist_ok=True)
    written = plots(out, runs, curves, threshold)
    (out / "report.md").write_text("\n".join([
        markdown(runs, threshold, written),
        *(line for r in runs for line in latest_lines(r.label, curves[r.run].shown))]))
    (out / "report.json").write_text(json.dumps(
        {"threshold": threshold, "runs": [asdict(r) for r in runs]}, indent=2))
    return runs


def default_out(run_dirs: list[str]) -> Path:
    """Next to the runs: RUN_DIR-report beside one run; beside several, in their common
    parent, report-A-vs-B-... (report-of-N-runs when the names make too long a name)."""
    paths = [Path(given).resolve() for given in run_dirs]
    if len(paths) == 1:
        return Path(run_dirs[0].rstrip("/") + "-report")
    parent = Path(os.path.commonpath([p.parent for p in paths]))
    name = "report-" + "-vs-".join(p.name for p in paths)
    return parent / (name if len(name) <= 80 else f"report-of-{len(paths)}-runs")


def main(args: argparse.Namespace) -> int:
    """`invar report`: 0 when written, 2 (one line naming the argument) on unusable input."""
    import sys
    out = Path(args.out) if args.out else default_out(args.run_dirs)
    try:
        runs = report(args.run_dirs, out, args.threshold)
    except ReportError as error:
        print(f"invar: report refused: {error}", file=sys.stderr)
        return 2
    print(markdown(runs, args.threshold).split("\n## Throughput")[0].rstrip())
    pngs = ", ".join(sorted(p.name for p in out.glob("*.png")))
    print(f"\nreport: {out / 'report.md'} (+ report.json, {pngs})")
    return 0
