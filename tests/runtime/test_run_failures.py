"""Runs that cannot go on stop with a clear error instead of hanging: a worker that keeps
dying is restarted a bounded number of times (with backoff) and the error shows its last log
lines; with respawn off, losing the last worker stops the run; either way the run resumes."""

from __future__ import annotations

import subprocess
import time

import pytest

from invar.runtime import driver as driver_module
from invar.runtime.transport import LocalProcessTransport
from invar.runtime.worker_args import worker_args


def test_losing_the_only_worker_without_respawn_stops_and_resumes(tmp_path, rt):
    overrides = rt.tiny_overrides(tmp_path, "protocol.total_updates=4", "rollout.respawn=false",
                                  'rollout.faults=["exit_after:10"]')
    command = rt.cli("train", *(arg for item in overrides for arg in ("--set", item)))
    began = time.monotonic()
    stopped = subprocess.run(command, capture_output=True, text=True, timeout=90)
    assert stopped.returncode == 1, stopped.stderr
    assert time.monotonic() - began < 60
    assert "Traceback" not in stopped.stderr
    error = [line for line in stopped.stderr.splitlines() if line.startswith("invar: ")]
    assert len(error) == 1, stopped.stderr
    assert "run stopped: no rollout worker can serve" in error[0]
    assert "rollout.respawn is false" in error[0] and "--resume" in error[0]
    assert "of 4" in error[0]
    # The run stays resumable (a resumed worker is a new incarnation: no fault).
    resumed = subprocess.run(rt.cli("train", "--resume", str(tmp_path)), capture_output=True,
                             text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert rt.summary(tmp_path)["updates"] == 4


async def _broken_worker(driver, name, incarnation):
    """A real worker process whose policy does not match the learner's (every incarnation):
    it dies loading the first weights it is sent."""
    args = worker_args(driver.config, name, incarnation)
    args["policy"] = {**args["policy"], "vocab_size": 5}
    logs = driver.run_dir / "logs"
    logs.mkdir(exist_ok=True)
    return await LocalProcessTransport.spawn(name, args, logs / f"{name}.{incarnation}.log")


def test_a_worker_that_keeps_dying_is_respawned_a_bounded_number_of_times(
        tmp_path, rt, monkeypatch):
    from invar.runtime.driver import RunStopped
    monkeypatch.setattr(driver_module, "RESPAWN_BACKOFF", 0.05, raising=False)
    config = rt.tiny_config(tmp_path, "rollout.respawn=true")
    with pytest.raises(RunStopped) as stopped:
        rt.run_driver(config, spawn=_broken_worker)
    message = str(stopped.value)
    assert "died 6 times in a row without completing a request" in message
    assert "worker-0.5.log" in message and "Error" in message  # its last log lines
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert len(logs) == driver_module.MAX_RESPAWNS + 1
