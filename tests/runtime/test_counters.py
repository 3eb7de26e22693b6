"""A run's counts are of the whole run, across its lives: a run killed with SIGKILL and
resumed, with a worker death in each life, reports both deaths (summary.json and report.md),
and this life's alone under `session_*`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

from invar.runtime.transport import LocalProcessTransport
from invar.runtime.worker_args import worker_args

UPDATES = 8
KILL_AFTER_COMMITS = 3


def test_counts_survive_a_kill_and_sum_over_the_lives(tmp_path, rt):
    # Life 1: its worker's first incarnation dies (exit_after), then the driver is killed.
    overrides = rt.tiny_overrides(tmp_path, f"protocol.total_updates={UPDATES}",
                                  'rollout.faults=["exit_after:6"]')
    command = rt.cli("train", *(arg for item in overrides for arg in ("--set", item)))
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        rt.wait_for_commits(tmp_path, KILL_AFTER_COMMITS, lambda: process.poll() is None)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert (tmp_path / "logs" / "worker-0.1.log").exists()  # the death happened

    # Life 2: the first worker this life starts dies too.
    faulty: list[int] = []

    async def dies_once(driver, name, incarnation):  # noqa: ANN001, ANN202
        args = worker_args(driver.config, name, incarnation)
        if not faulty:
            faulty.append(incarnation)
            args["faults"] = ["exit_after:6"]
        return await LocalProcessTransport.spawn(
            name, args, driver.run_dir / "logs" / f"{name}.{incarnation}.log")

    rt.run_driver(rt.tiny_config(tmp_path, f"protocol.total_updates={UPDATES}",
                                 'rollout.faults=["exit_after:6"]'),
                  resume=True, spawn=dies_once)
    events = rt.journal_events(tmp_path)
    assert sum(e["type"] == "WorkerLost" for e in events) == 2
    summary = rt.summary(tmp_path)
    assert summary["lives"] == 2 and summary["updates"] == UPDATES
    assert summary["worker_deaths"] == 2 and summary["session_worker_deaths"] == 1
    assert summary["counters"]["worker_deaths"] == 2
    assert summary["session_counters"]["worker_deaths"] == 1
    for key in ("refused", "noops", "malformed_frames"):
        assert summary[key] >= summary[f"session_{key}"]
    report = (tmp_path / "report.md").read_text()
    assert "| malformed frames / worker deaths | 0 / 2 |" in report
    # The resume is marked: said in the report, at the update the first life had committed.
    resumed = re.search(r"Resumed 1 time \(dashed lines in the plots\): at update (\d+) ", report)
    assert resumed and KILL_AFTER_COMMITS <= int(resumed.group(1)) < UPDATES, report
    for name in ("reward_curve.png", "reward_vs_time.png", "throughput.png", "learner.png"):
        assert f"]({name})" in report and (tmp_path / name).read_bytes().startswith(b"\x89PNG")
    # The update rows' refusals and no-ops are the whole run's so far: they never go down.
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    noops = [row["noops"] for row in rows if row["kind"] == "update"]
    assert noops == sorted(noops) and noops[-1] <= summary["noops"]
