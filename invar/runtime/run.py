"""What every run sets up and records, whatever executes its schedule: the asynchronous
`invar.runtime.driver.Driver` (a `Run`) and the serial `invar.runtime.serial.run_serial`.

    Run(config, learner)  ->  task, metrics, verifier, learner executor, counts
    open_files(key)       ->  journal, weights store
    record(event, before, after)  ->  the metrics rows an accepted event makes

A run that differs from another in how it executes commands makes the same rows from the same
accepted events: `record` is the one place they are made.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from invar.journal_format import Binding, leaves
from invar.model import schedule
from invar.model.messages import (
    Event,
    LearnerStarted,
    StepFinished,
    UpdateCommitted,
    VersionEvaluated,
)
from invar.model.state import State, completions_of
from invar.runtime import journal as journal_io
from invar.runtime.backend import LearnerBackend
from invar.runtime.binding import bound_files, bound_settings
from invar.runtime.config import TrainConfig, task_section, to_dict
from invar.runtime.files import atomic_write
from invar.runtime.learner_executor import LearnerExecutor
from invar.runtime.metrics import MetricsLog, response_terms, sampled_entropy
from invar.runtime.responses import training_rows
from invar.runtime.run_stats import Stats, VerifierFailures
from invar.runtime.store import WeightsStore
from invar.runtime.tasks import build_task, end_token, heldout_count, prompt_rows
from invar.runtime.verifier import make_verifier

TIMING = ("learner_seconds", "learner_training_seconds", "rollout_seconds", "core_seconds",
          "rollout_replies", "rollout_generated")
"""The per-update timing of a `timing` run's rows (`MetricsLog.update`)."""


class Run:
    """One run's components and its bookkeeping.

    `tensorboard`, `trackers`: where the metrics go beside metrics.jsonl and metrics.csv;
    `timing`: each update row also carries the seconds of each part since the previous row
    (`TIMING`: what the R/T hint and the benchmarks read).
    """

    def __init__(self, config: TrainConfig, learner: LearnerBackend, *, tensorboard: bool,
                 trackers: tuple[str, ...], timing: bool) -> None:
        self.config = config
        self.run_dir = Path(config.output.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.learner = learner
        self.task = build_task(task_section(config))
        self.metrics = MetricsLog(self.run_dir, config, tensorboard=tensorboard,
                                  trackers=trackers)
        heldout = prompt_rows(self.task, "heldout",
                              range(heldout_count(self.task, config.task.heldout_prompts)))
        self.verifier = make_verifier(self.task, task_section(config))
        self.executor = LearnerExecutor(learner, self.task, heldout, self.run_dir, self.metrics,
                                        self.verifier)
        self.verifier_failures = VerifierFailures()
        self.stats = Stats()
        self.journal: journal_io.Journal
        self.store: WeightsStore
        self._terms: dict[int, list[dict[str, float]]] = {}
        """The loss terms of each update's optimizer steps, until its row is written."""
        self._update_started = time.perf_counter()
        # The `TIMING` counts at the last update row (None: not a `timing` run); replies and
        # samples are counted in ints, so that the rows write them as ints.
        self._timing_marks: tuple[float, ...] | None = ((0.0, 0.0, 0.0, 0.0, 0, 0) if timing
                                                        else None)
        self._progress: Callable[[int, float, int], None] = _no_progress

    def write_config(self) -> None:
        atomic_write(self.run_dir / "config.json",
                     json.dumps(to_dict(self.config), indent=2).encode())

    def open_files(self, journal_key: bytes | None) -> None:
        """The journal (`journal_key`: its chain's key; None: unkeyed; a new one binds the
        configuration and the files it names: `invar.runtime.binding`) and the weights
        store."""
        path = self.run_dir / journal_io.JOURNAL
        fresh = not path.is_file() or path.stat().st_size == 0
        self.journal = journal_io.Journal(
            path, self.config.protocol, journal_key, self.config.output.journal_keep_updates,
            bound_settings(self.config), bound_files(self.config) if fresh else None)
        self.store = WeightsStore(self.run_dir / "store")

    def record_settings(self, binding: Binding | None) -> None:
        """Journal how this run's settings differ from those its journal binds (`binding`,
        as read when the run resumed): the operational changes a resume made."""
        if binding is None or not binding.history():
            return
        bound = binding.history()[-1]
        self.journal.record_settings({key: value for key, value in
                                      leaves(bound_settings(self.config)).items()
                                      if bound.get(key) != value})

    @contextlib.contextmanager
    def showing_progress(self) -> Iterator[None]:
        """The progress bar (or lines) of `output.progress`, advanced by each update row."""
        with self.metrics.progress(self.config.protocol.total_updates,
                                   self.config.output.progress) as progress:
            self._progress = progress
            yield

    def record(self, event: Event, before: State, after: State) -> None:
        """The metrics an accepted event makes (each accepted once: duplicates are no-ops)."""
        if isinstance(event, StepFinished) and before.learner.cotangent is not None:
            self._terms.setdefault(event.observation.update, []).append(
                before.learner.cotangent.terms.to_dict())
        elif isinstance(event, (UpdateCommitted, LearnerStarted)) and \
                after.committed > before.committed:
            self._record_update(before)
        elif isinstance(event, VersionEvaluated):
            self.metrics.evaluation(event.version, event.reward)

    def _record_update(self, before: State) -> None:
        """The row of the update `before` commits."""
        update = before.committed
        completions = completions_of(before.batches[0].slots)
        terms = self._terms.pop(update, [])
        now = time.perf_counter()
        timing = self._timing()
        reward = float(completions.rewards.mean())
        staleness = schedule.staleness(self.config.protocol, update)
        self.metrics.update(
            update=update,
            reward=reward,
            staleness=staleness,
            terms={**{k: statistics.fmean([t[k] for t in terms])
                      for k in (terms[0] if terms else {})},
                   # Without an end token every response has response_length tokens.
                   **(response_terms(completions.tokens, self.task.response_length)
                      if end_token(self.task) is not None else {})},
            seconds=now - self._update_started,
            refused=self.stats.refused,
            noops=self.stats.noops,
            verifier=self.verifier_failures.take(update),
            timing=timing,
            entropy=sampled_entropy(completions),
        )
        self._update_started = now
        self.metrics.responses("train", update, training_rows(
            self.task, completions, schedule.batch_prompt_indices(self.config.protocol, update),
            self.config.protocol.group_size))
        self._progress(update + 1, reward, staleness)

    def _timing(self) -> dict[str, float] | None:
        """Each `TIMING` count's growth since the previous update row."""
        if self._timing_marks is None:
            return None
        marks = (self.executor.busy_seconds, self.executor.training_seconds,
                 self.stats.rollout_seconds, self.stats.core_seconds, self.stats.rollout_replies,
                 self.stats.rollout_generated)
        timing = {name: now - then for name, now, then in zip(TIMING, marks, self._timing_marks)}
        self._timing_marks = marks
        return timing


def _no_progress(done: int, reward: float, staleness: int) -> None:
    """Before the progress bar is shown: nothing to advance."""
