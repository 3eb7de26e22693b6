"""The plots of a run's report.md and of `invar report`: how fast a run learns, against
updates and against wall time, how fast it goes, and the learner's own figures, with the
points where a resumed run's lives began marked.

Each figure takes one or several runs (`Curves`, read from metrics.jsonl's rows); a legend
sits below its axes, so it covers no curve and no bar.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TITLES = {"reward_vs_updates.png": "reward against updates",
          "reward_vs_time.png": "reward against wall time",
          "throughput.png": "throughput over time",
          "learner.png": "loss, KL, clip fraction, entropy, response length",
          "throughput_cost.png": "throughput and cost per run"}
"""What each plot shows, for the reports' image links."""
THROUGHPUT_WINDOW = 10
"""Updates over which the throughput curve averages (a rolling window)."""

LEARNER_PANELS = (
    ("loss", "loss", None),
    ("kl", "KL to the reference (k3; 0 when kl_coef = 0)", None),
    ("clip_fraction", "clip fraction", (0.0, None)),
    ("entropy", "entropy of sampled tokens (nats/token)", (0.0, None)),
    ("response_length_mean", "mean response length (tokens)", (0.0, None)),
    ("response_truncated_share", "responses cut at response_length", (0.0, 1.02)),
)
"""(metrics row key, title, y limits) of the learner panels; a panel whose key no row of any
run holds is left out."""


@dataclass
class Curves:
    """One run's rows, as `MetricsLog` reads them back."""

    label: str
    updates: list[dict[str, Any]]
    evaluations: list[dict[str, Any]]
    resumes: list[float] = field(default_factory=list)
    """Run wall seconds where each life after the first began (a crash or stop, resumed)."""
    shown: dict[str, dict[int, list[dict[str, Any]]]] = field(default_factory=dict)
    """Its shown responses (`MetricsLog.shown`), for the report's tables."""

    def resumed_at_updates(self) -> list[int]:
        """The update count at each resume: the updates recorded before it."""
        return [sum(1 for u in self.updates if float(u["wall"]) <= wall) for wall in self.resumes]


def pyplot() -> Any:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _mark_resumes(axis: Any, points: list[float], run: Curves, color: str | None) -> None:
    """Dashed lines where `run` was resumed: grey for a run alone, else in its colour."""
    label = "resumed (crash or stop before)" if color is None else f"{run.label}: resumed"
    for index, point in enumerate(points):
        axis.axvline(point, color=color or "grey", linestyle="--", linewidth=1,
                     label=label if index == 0 else None)


def legend_below(figure: Any, axes: list[Any]) -> None:
    """One legend for the figure, below every axis (entries shared by name), in as many
    columns (at most 3) as fit the figure's width; the figure grows by the legend's height
    (and, for a label wider than the figure, to its width), so nothing is cut off."""
    handles: dict[str, Any] = {}
    for axis in axes:
        for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    renderer = figure.canvas.get_renderer()
    margin = 0.1  # inches of the figure's width and height left around the legend
    for columns in range(min(3, max(len(handles), 1)), 0, -1):
        legend = figure.legend(list(handles.values()), list(handles), loc="lower center",
                               ncol=columns, frameon=False, fontsize=8)
        box = legend.get_window_extent(renderer)
        width, height = box.width / figure.dpi + margin, box.height / figure.dpi + margin
        if width <= figure.get_figwidth() or columns == 1:
            break
        legend.remove()
    figure.set_figwidth(max(figure.get_figwidth(), width))
    figure.set_figheight(figure.get_figheight() + height)
    figure.tight_layout(rect=(0, height / figure.get_figheight(), 1, 1))


def reward_figure(runs: list[Curves], against: str = "update",
                  threshold: float | None = None) -> tuple[Any, Any]:
    """(figure, axis): sampled train reward and greedy held-out reward of each run against
    updates (`against="update"`; version v = v updates) or run wall seconds ("wall"), and
    the `threshold` of time to quality, dotted."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6.4, 3.6))
    several = len(runs) > 1
    for index, run in enumerate(runs):
        color = f"C{index}"
        name = f"{run.label}: " if several else ""
        xs = [u["update"] + 1 if against == "update" else u["wall"] for u in run.updates]
        axis.plot(xs, [u["reward"] for u in run.updates], color=color,
                  alpha=0.45 if run.evaluations else 1.0, linewidth=1,
                  label=f"{name}train reward (sampled)")
        if run.evaluations:
            axis.plot([e["version"] if against == "update" else e["wall"]
                       for e in run.evaluations],
                      [e["heldout_reward"] for e in run.evaluations], "o-", color=color,
                      markersize=3, label=f"{name}held-out reward (greedy)")
        _mark_resumes(axis, [float(x) for x in run.resumed_at_updates()] if against == "update"
                      else run.resumes, run, color if several else None)
    axis.set_xlabel("version (committed updates)" if against == "update"
                    else "run wall seconds (all lives)")
    if threshold is not None:
        axis.axhline(threshold, color="grey", linestyle=":", linewidth=1,
                     label=f"threshold {threshold:g}")
    axis.set_ylabel("mean reward")
    axis.set_ylim(0, 1.02)
    axis.grid(alpha=0.3)
    legend_below(figure, [axis])
    return figure, axis


def throughput_points(run: Curves, window: int = THROUGHPUT_WINDOW) -> tuple[list[float],
                                                                             list[float]]:
    """(wall seconds, updates/s): the rate over the last `window` updates at each update row
    (fewer at the start), from the rows' wall seconds."""
    walls = [0.0] + [float(u["wall"]) for u in run.updates]
    xs, rates = [], []
    for end in range(1, len(walls)):
        start = max(0, end - window)
        span = walls[end] - walls[start]
        if span > 0:
            xs.append(walls[end])
            rates.append((end - start) / span)
    return xs, rates


def throughput_figure(runs: list[Curves]) -> tuple[Any, Any]:
    """(figure, axis): updates/s over run wall time, a rolling mean over THROUGHPUT_WINDOW
    updates (the first includes start-up; a resumed life's first one, its start-up)."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(6.4, 3.6))
    for index, run in enumerate(runs):
        xs, rates = throughput_points(run)
        axis.plot(xs, rates, color=f"C{index}", label=run.label)
        _mark_resumes(axis, run.resumes, run, f"C{index}" if len(runs) > 1 else None)
    axis.set_xlabel("run wall seconds (all lives)")
    axis.set_ylabel(f"updates / s (last {THROUGHPUT_WINDOW} updates)")
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    legend_below(figure, [axis])
    return figure, axis


def learner_figure(runs: list[Curves]) -> tuple[Any, list[Any]] | None:
    """(figure, axes): the learner's figures per update (LEARNER_PANELS that some run logs),
    None when no run logs any."""
    panels = [(key, title, limits) for key, title, limits in LEARNER_PANELS
              if any(key in u for run in runs for u in run.updates)]
    if not panels:
        return None
    plt = pyplot()
    columns = 2
    rows = math.ceil(len(panels) / columns)
    figure, grid = plt.subplots(rows, columns, figsize=(9, 2.4 * rows + 0.6), squeeze=False)
    axes = list(grid.flat)
    for axis, (key, title, limits) in zip(axes, panels, strict=False):
        for index, run in enumerate(runs):
            rows_with = [u for u in run.updates if key in u]
            axis.plot([u["update"] + 1 for u in rows_with], [u[key] for u in rows_with],
                      color=f"C{index}", linewidth=1, label=run.label)
            _mark_resumes(axis, [float(x) for x in run.resumed_at_updates()], run,
                          f"C{index}" if len(runs) > 1 else None)
        axis.set_title(title, fontsize=9)
        axis.set_xlabel("version (committed updates)", fontsize=8)
        axis.tick_params(labelsize=8)
        if limits is not None:
            axis.set_ylim(*limits)
        axis.grid(alpha=0.3)
    for axis in axes[len(panels):]:
        axis.set_visible(False)
    legend_below(figure, axes[:len(panels)])
    return figure, axes[:len(panels)]


def save(figure: Any, path: Path) -> None:
    plt = pyplot()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_plots(out: Path, runs: list[Curves], reward_name: str = "reward_vs_updates.png",
                threshold: float | None = None) -> list[str]:
    """`reward_name`, reward_vs_time.png, throughput.png and (when some run logs them)
    learner.png into `out`; returns the names written, in that order."""
    written = []
    for name, (figure, _) in ((reward_name, reward_figure(runs, "update", threshold)),
                              ("reward_vs_time.png", reward_figure(runs, "wall", threshold)),
                              ("throughput.png", throughput_figure(runs))):
        save(figure, out / name)
        written.append(name)
    learner = learner_figure(runs)
    if learner is not None:
        save(learner[0], out / "learner.png")
        written.append("learner.png")
    return written
