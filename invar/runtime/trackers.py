"""Experiment trackers a run's metrics also go to: Weights & Biases and MLflow (imported only
when `output.trackers` names them; the configuration refuses one that is not installed).

A tracker logs `{name: value}` at a step: an update's row at its update number (the journal's),
as `train/<name>`; a held-out evaluation at its version, as `eval/heldout_reward`. A run killed
and resumed is one tracker run: the ids are kept in RUN_DIR/trackers.json, and the resumed run
reattaches (W&B `init(id=..., resume="allow")`, MLflow the same run id). A row is logged to the
trackers before it is written to metrics.jsonl, and a resumed run logs no step that the
earlier lives' metrics.jsonl holds or that the tracker itself reports (MLflow's metric
history), so no step is missing and none is logged twice. A tracker first named on a resume
(`output.trackers` is operational) gets the kept rows of the earlier lives when it opens.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from invar.runtime.files import atomic_write

STATE_FILE = "trackers.json"
"""In the run directory: each tracker's run id, for the resumed run to reattach."""


class Tracker(Protocol):
    run_id: str
    """What names this tracker's run, kept in RUN_DIR so that a resume reattaches to it."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record `metrics` at `step`."""
        ...

    def logged_steps(self, key: str) -> set[int]:
        """The steps at which `key` is already recorded, as far as the tracker can tell."""
        ...

    def log_responses(self, key: str, step: int, rows: list[dict[str, Any]]) -> None:
        """Record shown responses (`invar.runtime.responses`) as a table named `key`."""
        ...

    def close(self, finished: bool) -> None:
        """End this life's connection; `finished`: the run is complete."""
        ...


class WandbTracker:
    """A W&B run (`wandb.init`), resumed by id. Offline mode (WANDB_MODE=offline) keeps it in
    RUN_DIR/wandb until `wandb sync`."""

    def __init__(self, run_dir: Path, config: Any, run_id: str | None) -> None:
        import wandb

        from invar.runtime.config import to_dict
        self.run = wandb.init(project=config.output.wandb_project, id=run_id, resume="allow",
                              dir=str(run_dir), config=to_dict(config),
                              name=Path(run_dir).name)
        self.run_id = self.run.id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def logged_steps(self, key: str) -> set[int]:
        """W&B drops a step below the run's current one: those before it count as logged."""
        return set(range(int(self.run.step)))

    def log_responses(self, key: str, step: int, rows: list[dict[str, Any]]) -> None:
        import wandb

        from invar.runtime.responses import COLUMNS
        table = wandb.Table(columns=list(COLUMNS),
                            data=[[row.get(column) for column in COLUMNS] for row in rows])
        self.run.log({key: table}, step=step)

    def close(self, finished: bool) -> None:
        self.run.finish(exit_code=0 if finished else 1)


class MlflowTracker:
    """An MLflow run in `output.mlflow_experiment`, through the tracking client (no global
    active run), resumed by id; the default store is the local files RUN_DIR/mlruns."""

    def __init__(self, run_dir: Path, config: Any, run_id: str | None) -> None:
        output = config.output
        uri = output.mlflow_tracking_uri or (Path(run_dir).resolve() / "mlruns").as_uri()
        if uri.startswith("file:"):
            # MLflow 3 keeps its file store only on request; a local store needs no server
            # and no database package, which is why it is the default here.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient
        self.client = MlflowClient(tracking_uri=uri)
        if run_id is None:
            experiment = self.client.get_experiment_by_name(output.mlflow_experiment)
            experiment_id = experiment.experiment_id if experiment is not None else \
                self.client.create_experiment(output.mlflow_experiment)
            run_id = self.client.create_run(experiment_id, run_name=Path(run_dir).name).info.run_id
            self._log_config(run_id, config)
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id

    def _log_config(self, run_id: str, config: Any) -> None:
        """The configuration as the run's parameters (dotted keys; MLflow takes at most 100
        a call)."""
        from mlflow.entities import Param

        from invar.runtime.config import leaves, to_dict
        params = [Param(key, json.dumps(value)) for key, value in
                  leaves(to_dict(config)).items()]
        for first in range(0, len(params), 100):
            self.client.log_batch(run_id, params=params[first:first + 100])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(key, float(value), now, step)
                                                    for key, value in metrics.items()])

    def logged_steps(self, key: str) -> set[int]:
        return {metric.step for metric in self.client.get_metric_history(self.run_id, key)}

    def log_responses(self, key: str, step: int, rows: list[dict[str, Any]]) -> None:
        from invar.runtime.responses import markdown_table
        self.client.log_text(self.run_id, "\n".join(markdown_table(rows)),
                             f"{key}/{step:06d}.md")

    def close(self, finished: bool) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED" if finished else "KILLED")


TRACKERS: dict[str, Callable[[Path, Any, str | None], Tracker]] = {
    "wandb": WandbTracker, "mlflow": MlflowTracker}


class TrackerSet:
    """The trackers of one run, across its lives: each step logged once to each."""

    def __init__(self, run_dir: Path, config: Any, names: tuple[str, ...],
                 written: dict[str, set[int]]) -> None:
        """`written`: the steps of "update" and "evaluation" rows in metrics.jsonl before
        this life (each was logged to the trackers before it was written there)."""
        self.run_dir = Path(run_dir)
        state_path = self.run_dir / STATE_FILE
        ids = json.loads(state_path.read_text()) if state_path.exists() else {}
        self.trackers = {name: TRACKERS[name](self.run_dir, config, ids.get(name))
                         for name in names}
        # A tracker first named on a resume starts a run of its own: it has nothing yet.
        earlier = {name: written if name in ids else {} for name in names}
        ids.update({name: tracker.run_id for name, tracker in self.trackers.items()})
        atomic_write(state_path, json.dumps(ids, indent=2).encode())
        self.skip = {name: {"update": earlier[name].get("update", set())
                            | tracker.logged_steps("train/reward"),
                            "evaluation": earlier[name].get("evaluation", set())
                            | tracker.logged_steps("eval/heldout_reward")}
                     for name, tracker in self.trackers.items()}

    def log(self, kind: str, step: int, metrics: dict[str, float]) -> None:
        """Log a row of `kind` ("update" or "evaluation") at `step`, once per tracker."""
        for name, tracker in self.trackers.items():
            if step not in self.skip[name][kind]:
                tracker.log(step, metrics)
                self.skip[name][kind].add(step)

    def log_responses(self, key: str, step: int, rows: list[dict[str, Any]]) -> None:
        """Shown responses at `step` as table `key`, to every tracker (a table repeated after
        a resume is harmless: it shows the same responses)."""
        for tracker in self.trackers.values():
            tracker.log_responses(key, step, rows)

    def close(self, finished: bool) -> None:
        for tracker in self.trackers.values():
            tracker.close(finished)
