"""Metrics after kill -9 and resume: one row per update in metrics.csv (with its header) and
metrics.jsonl, and a summary (summary.json, report.md, the done line) of the whole run."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path

UPDATES = 3


def _start(rt, run_dir: Path) -> subprocess.Popen:
    overrides = rt.tiny_overrides(run_dir, f"protocol.total_updates={UPDATES}")
    command = rt.cli("train", *(arg for item in overrides for arg in ("--set", item)))
    # The train process writes to it for as long as it runs, past this function.
    out = open(run_dir.parent / f"{run_dir.name}.out", "wb")  # noqa: SIM115
    return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _kill_when(process: subprocess.Popen, ready) -> None:
    deadline = time.monotonic() + 120
    try:
        while not ready():
            assert process.poll() is None, "invar train ended before it could be killed"
            assert time.monotonic() < deadline, "invar train made no progress"
            time.sleep(0.005)
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the driver and its workers
        process.wait()


def _journal_text(run_dir: Path) -> str:
    path = run_dir / "journal.jsonl"
    return path.read_text() if path.exists() else ""


def _resume(rt, run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(rt.cli("train", "--resume", str(run_dir)), capture_output=True,
                          text=True, timeout=180)


def _assert_whole_run(run_dir: Path, done: subprocess.CompletedProcess, lives: int) -> None:
    assert done.returncode == 0, done.stderr
    with open(run_dir / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [int(r["update"]) for r in rows] == list(range(UPDATES))
    jsonl = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in jsonl if r["kind"] == "update"] == list(range(UPDATES))
    summary = json.loads((run_dir / "summary.json").read_text())
    events = _journal_text(run_dir).count('"seq":')
    assert summary["updates"] == UPDATES
    assert summary["events"] == events > summary["session_events"]
    assert summary["lives"] == lives  # lives that opened the metrics files
    assert summary["wall_seconds"] >= summary["session_wall_seconds"]
    assert f"done: {UPDATES} updates in" in done.stdout
    report = (run_dir / "report.md").read_text()
    assert f"| updates | {UPDATES} |" in report
    assert ("over 2 lives" in report) == (lives == 2)
    assert f"| events / no-ops / refused | {events} /" in report


def test_killed_before_the_first_row_then_resumed(tmp_path, rt):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    process = _start(rt, run_dir)
    _kill_when(process, lambda: _journal_text(run_dir).count("\n") >= 2)
    assert '"UpdateCommitted"' not in _journal_text(run_dir)
    # The first life wrote no row, but it ran: it opened the metrics files when the run was
    # accepted, which records a life.
    _assert_whole_run(run_dir, _resume(rt, run_dir), lives=2)
    assert (run_dir / "metrics.csv").read_text().startswith("update,reward,")


def test_killed_between_a_row_and_its_journal_line(tmp_path, rt):
    """The driver writes an update's metrics row, then its journal line: killed between the
    two, the files hold a row for an update the journal does not have."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    process = _start(rt, run_dir)
    _kill_when(process, lambda: _journal_text(run_dir).count('"UpdateCommitted"') >= 1)
    committed = _journal_text(run_dir).count('"UpdateCommitted"')
    assert committed < UPDATES
    # What the window leaves: the next update's row, in both files, and no journal line.
    row = {"update": committed, "reward": 0.5, "staleness": 0, "seconds": 0.1, "wall": 1.0,
           "refused": 0, "noops": 0}
    with open(run_dir / "metrics.jsonl", "a") as file:
        file.write(json.dumps({"kind": "update", **row}) + "\n")
    with open(run_dir / "metrics.csv", "a", newline="") as file:
        csv.writer(file).writerow([row.get(k, "") for k in (
            "update", "reward", "staleness", "loss", "clip_fraction", "mean_ratio",
            "mean_behavior_weight", "kl", "seconds", "wall", "refused", "noops")])
    _assert_whole_run(run_dir, _resume(rt, run_dir), lives=2)
