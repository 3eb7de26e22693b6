"""Metrics of a run: JSONL and CSV rows per update, held-out evaluations, counters,
TensorBoard scalars, a progress bar, and the closing report (Markdown + reward-curve plot).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from invar.model.messages import parse_json
from invar.model.ragged import Ragged
from invar.runtime.files import atomic_write
from invar.runtime.hint import HINT_AFTER
from invar.runtime.tasks import describe

LIFE_COUNTS = ("noops", "refused", "malformed_frames", "worker_deaths")
"""What a life counts beside `counters` (`Stats`' fields), summed over the lives."""
PROGRESS_EVERY_SECONDS = 10.0
"""Outside a terminal, the least time between two progress lines."""
REWARD_PLOT = "reward_curve.png"
"""A run's reward against updates (report.md)."""
UPDATE_FIELDS = ("update", "reward", "staleness", "loss", "clip_fraction", "mean_ratio",
                 "mean_behavior_weight", "kl", "entropy", "response_length_mean",
                 "response_truncated_share", "seconds", "wall", "refused", "noops",
                 "verifier_failures", "verifier_timeouts")


def response_terms(tokens: Ragged, response_length: int) -> dict[str, float]:
    """A batch's mean response length (tokens, EOS included) and the share of its responses
    cut at `response_length` rather than ended at EOS (those that reached the limit)."""
    lengths = np.asarray(tokens.lengths, dtype=np.float64)
    return {"response_length_mean": float(lengths.mean()),
            "response_truncated_share": float((lengths >= response_length).mean())}


class MetricsLog:
    """The metrics of one run, across its lives (a run killed and resumed is one run).

    Rows are kept one per update and one per evaluated version, whatever the crashes: a
    resumed run reads the rows earlier lives wrote, keeps those of the updates and evaluations
    its journal holds (`resume_at`: a row written just before a crash whose journal line was
    lost is dropped; the resumed run writes it again), and rewrites metrics.jsonl and
    metrics.csv from them (atomically, with the CSV header) before appending. `wall` in a row
    is seconds since the run began, counting earlier lives up to their last kept row.
    Each life also records where it began (a `life` row) and its counts so far (a `counts`
    row with each `write_out`, so that a life that crashes keeps them): a resumed run's
    summary counts worker deaths, refusals, no-ops, malformed frames and `counters` over the
    whole run, and an update row's `refused` and `noops` are the whole run's so far.
    Nothing is written until the first row (or `finish`). Each row also goes to the
    experiment trackers named in `trackers` (`invar.runtime.trackers`), once per step across
    the lives.
    """

    def __init__(self, run_dir: Path, config: Any, tensorboard: bool = True,
                 trackers: tuple[str, ...] = ()) -> None:
        self.run_dir = Path(run_dir)
        self.config = config
        self.counters: Counter[str] = Counter()
        self.updates: list[dict[str, Any]] = []
        self.evaluations: list[dict[str, Any]] = []
        self.shown: dict[str, dict[int, list[dict[str, Any]]]] = {"heldout": {}, "train": {}}
        """Shown responses (`invar.runtime.responses`): by split, then version or update."""
        self.started = time.perf_counter()
        self.earlier_seconds = 0.0
        """Seconds of earlier lives of this run (to their last kept row)."""
        self.lives = 1
        self.life_walls: dict[int, float] = {}
        """Where each earlier life began, in run wall seconds (its `life` row)."""
        self.life_counts: dict[int, dict[str, Any]] = {}
        """Each earlier life's counts, as its last `counts` row recorded them."""
        self.stats: Any = None
        """The run's `Stats`, set by its caller: each `write_out` records their counts."""
        self._counts_written: dict[str, Any] | None = None
        self.written: dict[str, set[int]] = {"update": set(), "evaluation": set()}
        """Update numbers and evaluated versions with a row in metrics.jsonl before this life
        (kept or not: each was logged to the trackers before it was written)."""
        jsonl_path = self.run_dir / "metrics.jsonl"
        if jsonl_path.exists():  # a resumed run: the report covers the whole run
            self._load(jsonl_path)
        self._earlier_totals = self.earlier_counts()
        self._session_updates = 0  # rates of the progress bar are of this session
        self._jsonl: Any = None
        self._csv_file: Any = None
        self._tensorboard = tensorboard
        self.deferred = False
        """Set by a caller that writes the rows out itself, with `write_out` (from a thread of
        its own: the driver, so that its event path makes no system call for them)."""
        self._unwritten: list[Callable[[], None]] = []
        self._taking = threading.Lock()
        self._tb: Any = None
        self._tracker_names = trackers
        self._trackers: Any = None

    def _load(self, path: Path) -> None:
        """Rows earlier lives of this run wrote (a torn line is skipped; an update redone
        after a crash keeps its last row)."""
        updates: dict[int, dict[str, Any]] = {}
        evaluations: dict[int, dict[str, Any]] = {}
        lives = 1
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                row = parse_json(line)
                kind = row.pop("kind", None)
                if kind == "update":
                    updates[int(row["update"])] = row
                elif kind == "evaluation":
                    evaluations[int(row["version"])] = row
                elif kind == "responses":
                    self.shown[str(row["split"])][int(row["step"])] = list(row["rows"])
                elif kind == "life":
                    lives = max(lives, int(row["life"]))
                    self.life_walls[int(row["life"])] = float(row.get("wall", 0.0))
                elif kind == "counts":
                    self.life_counts[int(row["life"])] = {
                        **{key: int(row[key]) for key in LIFE_COUNTS},
                        "counters": {str(k): int(v) for k, v in row["counters"].items()}}
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
        self.updates = [updates[u] for u in sorted(updates)]
        self.evaluations = [evaluations[v] for v in sorted(evaluations)]
        self.written = {"update": set(updates), "evaluation": set(evaluations)}
        self.lives = lives + 1
        self._earlier()

    def earlier_counts(self) -> dict[str, Any]:
        """The counts of the earlier lives, summed (`LIFE_COUNTS` and `counters`)."""
        total: dict[str, Any] = {key: 0 for key in LIFE_COUNTS}
        counters: Counter[str] = Counter()
        for counts in self.life_counts.values():
            for key in LIFE_COUNTS:
                total[key] += counts[key]
            counters.update(counts["counters"])
        return {**total, "counters": counters}

    def _counts_row(self) -> dict[str, Any] | None:
        """This life's counts so far, as a `counts` row (None without `stats`)."""
        if self.stats is None:
            return None
        return {"kind": "counts", "life": self.lives,
                **{key: int(getattr(self.stats, key)) for key in LIFE_COUNTS},
                # One C-level copy: safe while the event loop's thread counts.
                "counters": dict(self.counters)}

    def _earlier(self) -> None:
        walls = [float(r.get("wall", 0.0)) for r in (*self.updates, *self.evaluations)]
        self.earlier_seconds = max(walls, default=0.0)

    def resume_at(self, committed: int, evaluated: tuple[int, ...] | list[int]) -> None:
        """Keep the rows of what the journal holds: updates below `committed`, evaluations of
        `evaluated` (rows beyond them were written before a crash whose journal line was
        lost: the resumed run writes them again)."""
        self.updates = [r for r in self.updates if int(r["update"]) < committed]
        self.evaluations = [e for e in self.evaluations if int(e["version"]) in set(evaluated)]
        self._earlier()

    def prepare(self) -> None:
        """Import what `open` needs (TensorBoard's writer: a fraction of a second) in a thread
        while the learner starts, so that `open` does not pay for it. Opens nothing: a run that is
        refused at its start leaves the files as they were. Safe to call from a thread."""
        if self._tensorboard:
            try:
                import torch.utils.tensorboard  # noqa: F401
            except ImportError:  # tensorboard is optional
                pass

    def open(self) -> None:
        """Rewrite metrics.jsonl and metrics.csv from the rows kept, then append to them (and
        open TensorBoard's and the trackers' logs). The driver calls it once the run is
        accepted, before the first event; the first row opens them otherwise. Idempotent."""
        if self._jsonl is not None:
            return
        jsonl_path, csv_path = self.run_dir / "metrics.jsonl", self.run_dir / "metrics.csv"
        rows = [{"kind": "update", **r} for r in self.updates] + \
               [{"kind": "evaluation", **e} for e in self.evaluations]
        rows.sort(key=lambda r: float(r.get("wall", 0.0)))
        rows = [{"kind": "life", "life": life, "wall": wall}
                for life, wall in sorted(self.life_walls.items()) if life < self.lives] + \
            [{"kind": "counts", "life": life, **counts}
             for life, counts in sorted(self.life_counts.items()) if life < self.lives] + rows
        rows.append({"kind": "life", "life": self.lives, "wall": self.earlier_seconds})
        atomic_write(jsonl_path, "".join(json.dumps(r) + "\n" for r in rows).encode())
        table = io.StringIO(newline="")
        writer = csv.DictWriter(table, fieldnames=UPDATE_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(self.updates)
        atomic_write(csv_path, table.getvalue().encode())
        # Append handles that live as long as the log (closed by `close`).
        self._jsonl = open(jsonl_path, "a", encoding="utf-8")  # noqa: SIM115
        self._csv_file = open(csv_path, "a", newline="", encoding="utf-8")  # noqa: SIM115
        self._csv = csv.DictWriter(self._csv_file, fieldnames=UPDATE_FIELDS, extrasaction="ignore")
        if self._tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self._tb = SummaryWriter(str(self.run_dir / "tensorboard"))
            except ImportError:  # tensorboard is optional
                self._tb = None
        if self._tracker_names:
            from invar.runtime.trackers import TrackerSet
            self._trackers = TrackerSet(self.run_dir, self.config, self._tracker_names,
                                        self.written)
            # The kept rows, in step order: skipped by the trackers that have them already.
            kept = [("update", r["update"], _tracked_update(r)) for r in self.updates] + \
                [("evaluation", e["version"], _tracked_evaluation(e)) for e in self.evaluations]
            for kind, step, metrics in sorted(kept, key=lambda item: item[1]):
                self._trackers.log(kind, step, metrics)

    def wall(self) -> float:
        """Seconds since the run began (earlier lives included)."""
        return self.earlier_seconds + time.perf_counter() - self.started

    def count(self, name: str) -> None:
        self.counters[name] += 1

    def update(self, update: int, reward: float, staleness: int, terms: dict[str, float],
               seconds: float, refused: int, noops: int,
               verifier: dict[str, int] | None = None,
               timing: dict[str, float] | None = None, entropy: float | None = None) -> None:
        """`verifier`: the counts of the update's samples whose verifier failed or timed out
        (`verifier_failures`, `verifier_timeouts`); `timing`: seconds of learner work, worker
        generation and core + driver, and the counts of rollout replies and of the samples
        generated for them, since the previous row (JSONL only; for the hint and benchmarks);
        `entropy`: `sampled_entropy` of the update's batch."""
        self.open()
        earlier = self._earlier_totals
        row = {"update": update, "reward": reward, "staleness": staleness, **terms,
               **({} if entropy is None else {"entropy": entropy}),
               "seconds": seconds, "wall": self.wall(),
               "refused": earlier["refused"] + refused, "noops": earlier["noops"] + noops,
               **(verifier or {}), **(timing or {})}
        while self.updates and self.updates[-1]["update"] >= update:
            self.updates.pop()  # a row written just before a crash, for an update redone
        self.updates.append(row)
        self._session_updates += 1
        if self._session_updates == HINT_AFTER:
            self._print_hint()

        def write() -> None:
            self._track("update", update, _tracked_update(row))
            self._write("update", row)
            self._csv.writerow(row)
            self._csv_file.flush()
            if self._tb is not None:
                for key in ("reward", "staleness", *terms, *(verifier or {}),
                            *(() if entropy is None else ("entropy",))):
                    self._tb.add_scalar(f"train/{key}", row[key], update)

        self._emit(write)

    def _print_hint(self) -> None:
        """Once per session, after its first updates: the measured R, T and the most overlap
        can buy on this configuration (invar.runtime.hint). To stderr, which the progress bar
        redirects above itself, so the line neither breaks the bar nor stdout's messages."""
        import sys

        from invar.runtime.hint import hint_line, measure
        protocol = self.config.protocol
        times = measure(self.updates[-HINT_AFTER:], protocol.samples_per_batch,
                        self.config.rollout.workers)
        if times is not None:  # rows without timing (a caller that measures nothing)
            print(hint_line(times, protocol.max_staleness), file=sys.stderr, flush=True)

    def evaluation(self, version: int, reward: float) -> None:
        """The held-out reward of `version`, recorded when its `VersionEvaluated` is accepted.
        A version has one row: one written before a crash whose journal lost the event is
        replaced when the resumed run evaluates it again."""
        self.open()
        row = {"version": version, "heldout_reward": reward, "wall": self.wall()}
        self.evaluations = sorted([e for e in self.evaluations if e["version"] != version]
                                  + [row], key=lambda e: e["version"])

        def write() -> None:
            self._track("evaluation", version, _tracked_evaluation(row))
            self._write("evaluation", row)
            if self._tb is not None:
                self._tb.add_scalar("eval/heldout_reward", reward, version)

        self._emit(write)

    def responses(self, split: str, step: int, rows: list[dict[str, Any]]) -> None:
        """Shown responses (`invar.runtime.responses`) of evaluated version `step` ("heldout")
        or update `step` ("train"): to metrics.jsonl, report.md and the trackers."""
        self.open()
        self.shown[split][step] = rows
        key = f"responses/{split}"

        def write() -> None:
            if self._trackers is not None:
                self._trackers.log_responses(key, step, rows)
            self._write("responses", {"split": split, "step": step, "rows": rows})
            if self._tb is not None:
                from invar.runtime.responses import markdown_table
                self._tb.add_text(key, "\n".join(markdown_table(rows)), step)

        self._emit(write)

    def _emit(self, write: Callable[[], None]) -> None:
        """Write a row now, or keep it for `write_out` when the log is `deferred`."""
        if not self.deferred:
            write()
            return
        with self._taking:
            self._unwritten.append(write)

    def write_out(self) -> None:
        """Write the rows kept since the last call, in order (`deferred`: safe to call from
        another thread than the one recording rows, one call at a time)."""
        with self._taking:
            writes, self._unwritten = self._unwritten, []
        for write in writes:
            write()
        counts = self._counts_row()
        if counts is not None and counts != self._counts_written and self._jsonl is not None:
            self._jsonl.write(json.dumps(counts) + "\n")
            self._jsonl.flush()
            self._counts_written = counts

    def _track(self, kind: str, step: int, metrics: dict[str, float]) -> None:
        """To the trackers, before the row is written to metrics.jsonl: a crash in between
        leaves a step the tracker has and the resumed run does not log again."""
        if self._trackers is not None:
            self._trackers.log(kind, step, metrics)

    def _write(self, kind: str, row: dict[str, Any]) -> None:
        self._jsonl.write(json.dumps({"kind": kind, **row}) + "\n")
        self._jsonl.flush()

    @contextlib.contextmanager
    def progress(self, total: int, enabled: bool) -> Iterator[Callable[[int, float, int], None]]:
        """A callable(updates_done, reward, staleness) that shows the run's progress: a rich
        progress bar on a terminal; elsewhere (a pipe, a file, a batch scheduler's log) a
        plain line for the session's first update, then at most one every
        PROGRESS_EVERY_SECONDS, and one for the last update. Both show the update, the
        sampled reward, the staleness, updates/s and the estimated time left."""
        if not enabled:
            yield lambda done, reward, staleness: None
            return
        import sys
        pace = _Pace(total, self)
        if not sys.stdout.isatty():
            shown = [-math.inf]

            def line(done: int, reward: float, staleness: int) -> None:
                now = time.perf_counter()
                pace.advance(done, now)
                if self._session_updates == 1 or done >= total or \
                        now - shown[0] >= PROGRESS_EVERY_SECONDS:
                    shown[0] = now
                    print(f"update {done}/{total}  reward {reward:.3f}  staleness {staleness}  "
                          f"{pace_text(pace.rate)}  elapsed {_clock(now - pace.began)}  "
                          f"ETA {pace.eta()}", flush=True)

            yield line
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )
        bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("reward {task.fields[reward]}"),
                       TextColumn("staleness {task.fields[staleness]}"),
                       TextColumn("{task.fields[pace]}"), TimeElapsedColumn(),
                       TextColumn("ETA {task.fields[eta]}"))
        with bar:
            # Before this session's first update: a resumed run's earlier ones, no reward yet.
            task = bar.add_task("train", total=total, completed=len(self.updates),
                                reward="-", staleness="-", pace=pace_text(0.0), eta="-")

            def advance(done: int, reward: float, staleness: int) -> None:
                pace.advance(done, time.perf_counter())
                bar.update(task, completed=done, reward=f"{reward:.3f}", staleness=staleness,
                           pace=pace_text(pace.rate), eta=pace.eta())

            yield advance

    def finish(self, stats: Any, learner_seconds: float,
               events: int | None = None) -> dict[str, Any]:
        """Write summary.json and report.md (with reward_curve.png); returns the summary.

        The summary is of the whole run: every update, `wall_seconds` across its lives (the
        earlier ones up to their last recorded row), `events` the journal's (`events`, when
        given), and the counts (`noops`, `refused`, `malformed_frames`, `worker_deaths`,
        `counters`) summed over the lives (each earlier one's as of its last `counts` row);
        the `session_*` keys are of this life alone, as are the shares and seconds of work."""
        self.open()
        self.write_out()
        session = time.perf_counter() - stats.started
        wall = self.earlier_seconds + session
        protocol = self.config.protocol
        n = len(self.updates)
        summary = {
            "updates": n,
            "wall_seconds": wall,
            "updates_per_second": n / wall if wall else 0.0,
            "samples_per_second": n * protocol.samples_per_batch / wall if wall else 0.0,
            "lives": self.lives,
            "session_updates": self._session_updates,
            "session_wall_seconds": session,
            "final_train_reward": self.updates[-1]["reward"] if self.updates else None,
            "final_heldout_reward": (self.evaluations[-1]["heldout_reward"]
                                     if self.evaluations else None),
            "events": stats.events if events is None else events,
            "session_events": stats.events,
            **{key: self._earlier_totals[key] + getattr(stats, key) for key in LIFE_COUNTS},
            **{f"session_{key}": getattr(stats, key) for key in LIFE_COUNTS},
            # Shares and seconds of work are of this life (what this process measured).
            "core_and_driver_share": stats.core_seconds / session if session else 0.0,
            "learner_busy_share": learner_seconds / session if session else 0.0,
            # Absolute seconds behind the shares, and the workers' reported generation and
            # weight-loading seconds (summed over workers): for benchmarks.
            "core_and_driver_seconds": stats.core_seconds,
            "core_and_driver_cpu_seconds": getattr(stats, "core_cpu_seconds", 0.0),
            "core_and_driver_cpu_share": (getattr(stats, "core_cpu_seconds", 0.0) / session
                                          if session else 0.0),
            "learner_busy_seconds": learner_seconds,
            "rollout_compute_seconds": getattr(stats, "rollout_seconds", 0.0),
            "rollout_load_seconds": getattr(stats, "load_seconds", 0.0),
            "rollout_replies": getattr(stats, "rollout_replies", 0),
            "rollout_generated": getattr(stats, "rollout_generated", 0),
            "counters": dict(self._earlier_totals["counters"] + self.counters),
            "session_counters": dict(self.counters),
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        resumes = [wall for life, wall in sorted(self.life_walls.items()) if life >= 2]
        if self.lives > 1:
            resumes.append(self.earlier_seconds)
        write_report(self.run_dir, self.config, self.updates, self.evaluations, summary,
                     resumes, self.shown)
        return summary

    def close(self, complete: bool = False) -> None:
        """Close the files; the trackers' runs end as finished when the run is `complete`
        (else as killed: a resumed run continues them)."""
        self.write_out()
        if self._jsonl is not None:
            self._jsonl.close()
            self._csv_file.close()
        if self._tb is not None:
            self._tb.close()
        if self._trackers is not None:
            self._trackers.close(complete)
            self._trackers = None


def sampled_entropy(completions: Any) -> float:
    """The mean −log-probability of a batch's sampled tokens under the distribution that
    sampled them: an estimate of its per-token entropy, in nats (a mean over the tokens the
    batch holds anyway: no extra forward pass)."""
    values = completions.behavior_logprobs.values
    return float(-values.mean()) if len(values) else 0.0


class _Pace:
    """Updates/s and the time left, from this session's updates: the rate is measured from
    the session's first update on (the start-up before it is no update's time)."""

    def __init__(self, total: int, log: MetricsLog) -> None:
        self.total = total
        self.log = log
        self.began = time.perf_counter()
        self.first: float | None = None
        self.done = 0
        self.rate = 0.0

    def advance(self, done: int, now: float) -> None:
        self.done = done
        session = self.log._session_updates
        if self.first is None:
            self.first = now
        if session >= 2 and now > self.first:
            self.rate = (session - 1) / (now - self.first)
        else:
            self.rate = session / max(now - self.began, 1e-9)

    def eta(self) -> str:
        """The time left at the rate so far, H:MM:SS ("-" before any rate)."""
        left = self.total - self.done
        return "0:00:00" if left <= 0 else _clock(left / self.rate) if self.rate else "-"


def pace_text(updates_per_second: float) -> str:
    """A run's pace as it reads best: updates/s when one takes under a second, else seconds
    per update (a slow run's "0.00 upd/s" says nothing); "- upd/s" before any update."""
    if not updates_per_second > 0:
        return "- upd/s"
    if updates_per_second >= 1:
        return f"{updates_per_second:.2f} upd/s"
    return f"{1 / updates_per_second:.1f} s/upd"


def _clock(seconds: float) -> str:
    """H:MM:SS."""
    whole = int(round(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def _tracked_update(row: dict[str, Any]) -> dict[str, float]:
    """What the trackers get of an update's row (its step is the update number)."""
    return {f"train/{key}": value for key, value in row.items() if key != "update"}


def _tracked_evaluation(row: dict[str, Any]) -> dict[str, float]:
    """What the trackers get of an evaluation's row (its step is the version)."""
    return {"eval/heldout_reward": row["heldout_reward"]}


def describe_policy(policy: Any) -> str:
    """The policy in a few words: the built-in one's shape, a transformers one's source."""
    if policy.kind == "transformers":
        source = policy.path or f"{policy.config.get('model_type')} config, random weights"
        return f"transformers ({source})"
    return f"{policy.layers} layers × width {policy.width}"


def write_report(run_dir: Path, config: Any, updates: list[dict[str, Any]],
                 evaluations: list[dict[str, Any]], summary: dict[str, Any],
                 resumes: list[float] | None = None,
                 shown: dict[str, dict[int, list[dict[str, Any]]]] | None = None) -> None:
    """report.md and its plots (`invar.runtime.plots`), next to the run's files; `resumes`:
    the run wall seconds where each life after the first began; `shown`: the run's shown
    responses (`MetricsLog.shown`)."""
    from invar.runtime.plots import TITLES, Curves, write_plots
    from invar.runtime.responses import report_lines
    run = Curves(run_dir.name, updates, evaluations, list(resumes or ()))
    plots = write_plots(run_dir, [run], reward_name=REWARD_PLOT) if updates else []
    titles = {**TITLES, REWARD_PLOT: TITLES["reward_vs_updates.png"]}
    resumed = ", ".join(f"update {at} ({wall:.1f} s)"
                        for at, wall in zip(run.resumed_at_updates(), run.resumes, strict=True))
    p = config.protocol
    lines = [
        f"# Run report: {run_dir.name}",
        "",
        f"Task: {describe(config.task)} · policy {describe_policy(config.policy)} · "
        f"batch {p.prompts_per_batch} prompts × {p.group_size} "
        f"samples · S = {p.max_staleness}, P = {p.sync_period}, K = {p.optimizer_steps} · "
        f"loss {p.objective.loss}",
        "",
        *(line for name in plots for line in (f"![{titles[name]}]({name})", "")),
        *([f"Resumed {len(run.resumes)} time{'s' if len(run.resumes) > 1 else ''} (dashed "
           f"lines in the plots): at {resumed}.", ""] if run.resumes else []),
        "| held-out version | greedy reward |",
        "|---|---|",
        *(f"| {e['version']} | {e['heldout_reward']:.3f} |" for e in evaluations),
        "",
        "| throughput | value |",
        "|---|---|",
        f"| updates | {summary['updates']} |",
        f"| wall time | {summary['wall_seconds']:.1f} s"
        + (f" over {summary['lives']} lives (this one: {summary['session_updates']} updates "
           f"in {summary['session_wall_seconds']:.1f} s)" if summary.get('lives', 1) > 1
           else "") + " |",
        f"| pace | {pace_text(summary['updates_per_second'])} |",
        f"| samples / s | {summary['samples_per_second']:.1f} |",
        f"| learner busy | {100 * summary['learner_busy_share']:.1f} % of wall |",
        f"| core + driver | {100 * summary['core_and_driver_share']:.2f} % of wall "
        f"({100 * summary.get('core_and_driver_cpu_share', 0.0):.2f} % as its own CPU time) |",
        f"| events / no-ops / refused | {summary['events']} / {summary['noops']} / "
        f"{summary['refused']} |",
        f"| malformed frames / worker deaths | {summary['malformed_frames']} / "
        f"{summary['worker_deaths']} |",
        "",
        *report_lines(shown or {}),
    ]
    (run_dir / "report.md").write_text("\n".join(lines))
