"""Experiment trackers: W&B (offline) and MLflow (local file store) get every metrics row at
its update number, and a run killed and resumed continues the same tracker run with no step
missing or logged twice. MLflow is read back with its client; W&B's offline files are not
readable in this version (its run store moved into a Go service), so the crash test counts
its calls at the `wandb` API boundary (a recording stand-in module), and a separate test runs
the real package offline."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from invar.model.errors import ConfigError
from invar.runtime.config import load_config
from invar.runtime.metrics import MetricsLog
from invar.runtime.trackers import STATE_FILE

UPDATES = 4
FAKE_WANDB = '''
import json, os, uuid

def _record(**fields):
    with open(os.environ["FAKE_WANDB_LOG"], "a") as file:
        file.write(json.dumps(fields) + "\\n")

class Table:
    def __init__(self, columns, data):
        self.columns, self.data = columns, data

class Run:
    def __init__(self, id):
        self.id, self.step = id, 0

    def log(self, metrics, step):
        _record(call="log", id=self.id, step=step, keys=sorted(metrics))

    def finish(self, exit_code=0):
        _record(call="finish", id=self.id, exit_code=exit_code)

def init(project, id=None, resume=None, dir=None, config=None, name=None):
    run = Run(id or uuid.uuid4().hex[:8])
    _record(call="init", id=run.id, resume=resume, project=project)
    return run
'''


def mlflow_steps(run_dir: Path, key: str) -> list[int]:
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # as the tracker sets it
    from mlflow.tracking import MlflowClient
    run_id = json.loads((run_dir / STATE_FILE).read_text())["mlflow"]
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def test_an_unknown_or_missing_tracker_is_refused_naming_it(monkeypatch):
    with pytest.raises(ConfigError) as caught:
        load_config(None, ['output.trackers=["mlflow", "comet"]'])
    assert caught.value.fields == ("output.trackers[1]",) and "known: wandb" in str(caught.value)
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError) as caught:
        load_config(None, ['output.trackers=["wandb"]'])
    assert caught.value.fields == ("output.trackers[0]",)
    assert "pip install -e '.[trackers]' in the Invar checkout" in str(caught.value)


def row(log: MetricsLog, update: int) -> None:
    log.update(update=update, reward=0.1 * update, staleness=0, terms={"loss": 1.0},
               seconds=0.1, refused=0, noops=0,
               verifier={"verifier_failures": update, "verifier_timeouts": 0})


def test_mlflow_does_not_log_twice_a_step_it_got_before_the_crash(tmp_path, rt):
    """Killed after a row went to MLflow but before metrics.jsonl held it: the resumed run
    redoes that update, and MLflow's own history keeps it from being logged again."""
    config = rt.tiny_config(tmp_path, 'output.trackers=["mlflow"]')
    first = MetricsLog(tmp_path, config, tensorboard=False, trackers=("mlflow",))
    for update in range(3):
        row(first, update)
    first.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # row 2 lost
    second = MetricsLog(tmp_path, config, tensorboard=False, trackers=("mlflow",))
    second.resume_at(2, ())
    for update in range(2, UPDATES):
        row(second, update)
    second.close(complete=True)
    assert mlflow_steps(tmp_path, "train/reward") == list(range(UPDATES))
    assert mlflow_steps(tmp_path, "train/verifier_failures") == list(range(UPDATES))


def test_a_tracker_first_named_on_a_resume_gets_the_earlier_rows(tmp_path, rt):
    config = rt.tiny_config(tmp_path)
    first = MetricsLog(tmp_path, config, tensorboard=False)
    for update in range(2):
        row(first, update)
    first.evaluation(2, 0.5)
    first.close()
    second = MetricsLog(tmp_path, config, tensorboard=False, trackers=("mlflow",))
    second.resume_at(2, (2,))
    for update in range(2, UPDATES):
        row(second, update)
    second.close(complete=True)
    assert mlflow_steps(tmp_path, "train/reward") == list(range(UPDATES))
    assert mlflow_steps(tmp_path, "eval/heldout_reward") == [2]


def test_the_real_wandb_offline_run_is_continued_by_id(tmp_path, rt, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    config = rt.tiny_config(tmp_path, 'output.trackers=["wandb"]')
    first = MetricsLog(tmp_path, config, tensorboard=False, trackers=("wandb",))
    row(first, 0)
    first.close()
    run_id = json.loads((tmp_path / STATE_FILE).read_text())["wandb"]
    second = MetricsLog(tmp_path, config, tensorboard=False, trackers=("wandb",))
    second.resume_at(1, ())
    row(second, 1)
    second.close(complete=True)
    assert json.loads((tmp_path / STATE_FILE).read_text())["wandb"] == run_id
    offline = sorted(p.name for p in (tmp_path / "wandb").glob("offline-run-*"))
    # wandb names a life's folder by its start second and run id, and adds "-1" when the
    # second life starts within the same second as the first.
    assert len(offline) == 2 and all(
        re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{run_id}(-\d+)?", name) for name in offline)


def _env(tmp_path: Path) -> dict[str, str]:
    """The environment of `invar train` with the recording stand-in for `wandb`."""
    fake = tmp_path / "fake"
    (fake / "wandb").mkdir(parents=True)
    (fake / "wandb" / "__init__.py").write_text(FAKE_WANDB)
    return {**os.environ, "FAKE_WANDB_LOG": str(tmp_path / "wandb_calls.jsonl"),
            "PYTHONPATH": os.pathsep.join([str(fake), *sys.path])}


def test_a_run_killed_and_resumed_continues_both_tracker_runs_step_by_step(tmp_path, rt):
    run_dir = tmp_path / "run"
    overrides = rt.tiny_overrides(run_dir, f"protocol.total_updates={UPDATES}",
                                  "protocol.eval_every=2", 'output.trackers=["wandb", "mlflow"]')
    env = _env(tmp_path)
    process = subprocess.Popen(
        rt.cli("train", *(arg for item in overrides for arg in ("--set", item))), env=env,
        # The child's stderr, open for as long as the child runs.
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "first.err", "wb"),  # noqa: SIM115
        start_new_session=True)
    journal = run_dir / "journal.jsonl"
    deadline = time.monotonic() + 120
    try:
        while not (journal.exists() and journal.read_text().count('"UpdateCommitted"') >= 2):
            assert process.poll() is None, (tmp_path / "first.err").read_text()
            assert time.monotonic() < deadline, "invar train made no progress"
            time.sleep(0.005)
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the driver and its workers
        process.wait()
    assert journal.read_text().count('"UpdateCommitted"') < UPDATES
    done = subprocess.run(rt.cli("train", "--resume", str(run_dir)), env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert mlflow_steps(run_dir, "train/reward") == list(range(UPDATES))
    assert mlflow_steps(run_dir, "eval/heldout_reward") == [0, 2, 4]
    calls = [json.loads(line) for line in (tmp_path / "wandb_calls.jsonl").read_text()
             .splitlines()]
    ids = {call["id"] for call in calls}
    assert len(ids) == 1 and ids == {json.loads((run_dir / STATE_FILE).read_text())["wandb"]}
    assert [c["resume"] for c in calls if c["call"] == "init"] == ["allow", "allow"]
    logged = [c["step"] for c in calls if c["call"] == "log" and "train/reward" in c["keys"]]
    assert logged == list(range(UPDATES))
    evaluated = [c["step"] for c in calls if c["call"] == "log" and
                 c["keys"] == ["eval/heldout_reward"]]
    assert evaluated == [0, 2, 4]
    tables = {key: {c["step"] for c in calls if c["call"] == "log" and c["keys"] == [key]}
              for key in ("responses/heldout", "responses/train")}
    assert tables == {"responses/heldout": {0, 2, 4}, "responses/train": set(range(UPDATES))}
    shown = sorted(p.name for p in (run_dir / "mlruns").rglob("responses/heldout/*.md"))
    assert shown == ["000000.md", "000002.md", "000004.md"]
    assert calls[-1] == {"call": "finish", "id": calls[0]["id"], "exit_code": 0}
