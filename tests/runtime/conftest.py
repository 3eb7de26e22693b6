"""Helpers of the runtime's integration tests: tiny configurations and run inspection."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

TINY = (
    "protocol.prompts_per_batch=4",
    "protocol.group_size=4",
    "protocol.optimizer_steps=2",
    "protocol.total_updates=3",
    "protocol.eval_every=0",
    "protocol.checkpoint_every=0",
    "protocol.max_staleness=1",
    "protocol.sync_period=1",
    "protocol.max_inflight_batches=2",
    "task.length=4",
    "task.heldout_prompts=8",
    "policy.width=32",
    "policy.layers=1",
    "output.progress=false",
    "output.tensorboard=false",
    "rollout.chunk_prompts=2",
)
"""A run of a few seconds: 3 updates of 4 prompts x 4 samples, a one-layer policy."""


def tiny_overrides(run_dir: Path | str, *extra: str) -> list[str]:
    return [*TINY, f"output.run_dir={json.dumps(str(run_dir))}", *extra]


def tiny_config(run_dir: Path | str, *extra: str) -> Any:
    from invar.runtime.config import load_config
    return load_config(None, tiny_overrides(run_dir, *extra))


@contextlib.contextmanager
def torch_globals_kept() -> Iterator[None]:
    """make_learner sets torch's thread count and deterministic mode process-wide."""
    import torch
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


@pytest.fixture
def few_threads() -> Iterator[None]:
    """One torch thread for the test: the networks are tiny, a second thread barely helps,
    and thrashes on a busy machine."""
    import torch
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


RUN_TIMEOUT = 120.0
"""A tiny run takes seconds; one that hangs fails instead of stalling the suite."""


def run_driver(config: Any, resume: bool = False, spawn: Any = None) -> Any:
    """An asynchronous run with real worker processes; returns the final core state.

    `spawn(driver, name, incarnation)`, if given, starts each worker instead of the driver
    (it may delay one, then call `driver.launcher.spawn`).
    """
    from invar.runtime.cli import make_learner
    from invar.runtime.driver import Driver
    with torch_globals_kept():
        driver = Driver(config, make_learner(config), resume=resume)
        if spawn is not None:
            driver.spawn_worker = lambda name, incarnation: spawn(driver, name, incarnation)
        return asyncio.run(asyncio.wait_for(driver.run(), RUN_TIMEOUT))


def run_serial(config: Any) -> Any:
    """The in-process reference execution, one command at a time."""
    from invar.runtime import serial
    from invar.runtime.cli import make_learner
    with torch_globals_kept():
        return serial.run_serial(config, make_learner(config))


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def journal_events(run_dir: Path) -> list[dict[str, Any]]:
    """The encoded events of a run's journal, in order (the header left out)."""
    lines = (Path(run_dir) / "journal.jsonl").read_text().splitlines()[1:]
    return [json.loads(line)["event"] for line in lines]


def final_weights(run_dir: Path) -> dict[str, Any]:
    """Model tensors of the newest commit file (verified by read_commit)."""
    from invar.runtime.commits import list_commits, read_commit
    version, path = list_commits(Path(run_dir) / "commits")[-1]
    content = read_commit(path)
    return {"version": version, "model": content["model"]}


def assert_same_weights(a: dict[str, Any], b: dict[str, Any]) -> None:
    import torch
    assert a["version"] == b["version"]
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), f"{name} differs"


def commits_in(run_dir: Path) -> int:
    """UpdateCommitted lines in a run's journal so far (0 before it exists)."""
    path = Path(run_dir) / "journal.jsonl"
    return path.read_text().count('"type":"UpdateCommitted"') if path.exists() else 0


def wait_for_commits(run_dir: Path, count: int, running: Callable[[], bool]) -> None:
    """Until a running `invar train`'s journal holds `count` commits (to stop it then)."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while commits_in(run_dir) < count:
        assert running(), "invar train ended before it could be stopped"
        assert time.monotonic() < deadline, "invar train made no progress"
        time.sleep(0.01)


def cli(*args: str) -> list[str]:
    """The command line of `invar ...`: the installed script, else the module."""
    script = Path(sys.executable).parent / "invar"
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-m", "invar.runtime.cli", *args]


@pytest.fixture(scope="session")
def rt() -> SimpleNamespace:
    """The helpers above, for test modules (importing conftest by name is fragile)."""
    return SimpleNamespace(
        TINY=TINY, tiny_overrides=tiny_overrides, tiny_config=tiny_config,
        run_driver=run_driver, run_serial=run_serial, summary=summary,
        journal_events=journal_events, final_weights=final_weights,
        assert_same_weights=assert_same_weights, cli=cli, torch_globals_kept=torch_globals_kept,
        commits_in=commits_in, wait_for_commits=wait_for_commits)
