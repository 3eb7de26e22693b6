"""`invar train --resume`: a refused resume writes nothing; only operational settings change.

One tiny run is killed with SIGKILL mid-run (its journal holds a commit, the run is not
complete) and each test works on a copy of it, through the real command line.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from invar.model.core import logical_projection, run_complete
from invar.runtime import journal

UPDATES = 5
WORKERS = 2


def _commits_in(path: Path) -> int:
    return path.read_text().count('"type":"UpdateCommitted"') if path.exists() else 0


@pytest.fixture(scope="module")
def killed(tmp_path_factory, rt):
    """A run of two workers killed with SIGKILL once its journal holds a commit."""
    run_dir = tmp_path_factory.mktemp("resume-config") / "run"
    overrides = rt.tiny_overrides(run_dir, f"protocol.total_updates={UPDATES}",
                                  f"rollout.workers={WORKERS}")
    command = rt.cli("train", *(arg for item in overrides for arg in ("--set", item)))
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    deadline = time.monotonic() + 120
    try:
        while _commits_in(run_dir / "journal.jsonl") < 1:
            assert process.poll() is None, "invar train ended before it could be killed"
            assert time.monotonic() < deadline, "invar train made no progress"
            time.sleep(0.01)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    _, state, _ = journal.restore(run_dir / "journal.jsonl")
    assert not run_complete(state)
    return run_dir


@pytest.fixture(scope="module")
def reference(tmp_path_factory, rt):
    run_dir = tmp_path_factory.mktemp("resume-reference")
    assert run_complete(rt.run_driver(rt.tiny_config(
        run_dir, f"protocol.total_updates={UPDATES}", f"rollout.workers={WORKERS}")))
    return run_dir


def _copy(run_dir: Path, target: Path) -> Path:
    shutil.copytree(run_dir, target)
    return target


def _tree(directory: Path) -> dict[str, bytes]:
    """Every file under `directory`, by relative path, with its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _resume(rt, run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(rt.cli("train", *args, "--resume", str(run_dir)),
                          capture_output=True, text=True, timeout=180)


def _assert_refused(done: subprocess.CompletedProcess, *keys: str) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("invar: resume refused: " + ", ".join(keys) + ":"), lines[0]
    assert "Traceback" not in done.stderr


# -- item 1: a refused resume writes nothing ---------------------------------------------------

def test_a_refused_resume_writes_nothing_and_a_plain_resume_still_works(
        killed, reference, tmp_path, rt):
    run_dir = _copy(killed, tmp_path / "run")
    before = _tree(run_dir)
    done = _resume(rt, run_dir, "--set", "policy.width=64")
    _assert_refused(done, "policy.width")
    assert _tree(run_dir) == before  # config.json untouched, nothing created
    assert json.loads((run_dir / "config.json").read_text())["policy"]["width"] == 32

    done = _resume(rt, run_dir)
    assert done.returncode == 0, done.stderr
    _, state, _ = journal.restore(run_dir / "journal.jsonl")
    _, reference_state, _ = journal.restore(reference / "journal.jsonl")
    assert run_complete(state)
    assert logical_projection(state) == logical_projection(reference_state)


# -- item 2: only operational settings may change ----------------------------------------------

def test_resume_refuses_every_non_operational_change_naming_all_keys(killed, tmp_path, rt):
    run_dir = _copy(killed, tmp_path / "run")
    before = _tree(run_dir)
    done = _resume(rt, run_dir, "--set", "optim.lr=0.5", "--set", "task.length=5",
                   "--set", "sampling.temperature=0.5", "--set", "rollout.threads=2")
    _assert_refused(done, "task.length", "optim.lr", "sampling.temperature")
    assert "optim.lr 0.001 -> 0.5" in done.stderr
    assert _tree(run_dir) == before


def test_resume_refuses_a_config_file_that_changes_the_run(killed, tmp_path, rt):
    run_dir = _copy(killed, tmp_path / "run")
    before = _tree(run_dir)
    other = tmp_path / "other.toml"
    other.write_text("[optim]\nlr = 0.5\n[rollout]\nthreads = 2\n")
    _assert_refused(_resume(rt, run_dir, str(other)), "optim.lr")
    assert _tree(run_dir) == before
    other.write_text("[output]\nrun_dir = \"somewhere/else\"\n")
    _assert_refused(_resume(rt, run_dir, str(other)), "output.run_dir")
    _assert_refused(_resume(rt, run_dir, "--backend", "mlx", "--set",
                            "protocol.max_staleness=0"),
                    "protocol.max_staleness", "learner.backend")
    assert _tree(run_dir) == before


def test_operational_settings_change_on_resume_and_are_recorded(
        killed, reference, tmp_path, rt):
    """One worker instead of two (the journal's second worker is declared lost and its
    requests go to the other) and another retry timer: the same logical run, bit for bit."""
    run_dir = _copy(killed, tmp_path / "run")
    settings = tmp_path / "operational.toml"
    settings.write_text("[output]\nretry_seconds = 5.0\n")
    done = _resume(rt, run_dir, str(settings), "--set", "rollout.workers=1")
    assert done.returncode == 0, done.stderr
    _, state, _ = journal.restore(run_dir / "journal.jsonl")
    _, reference_state, _ = journal.restore(reference / "journal.jsonl")
    assert run_complete(state)
    assert logical_projection(state) == logical_projection(reference_state)
    rt.assert_same_weights(rt.final_weights(run_dir), rt.final_weights(reference))
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["rollout"]["workers"] == 1 and saved["output"]["retry_seconds"] == 5.0
    # In the journal too, as the changes they are, under its chain (config.json is a copy).
    contents = journal.read_contents(run_dir / "journal.jsonl")
    assert [changes for _, changes in contents.binding.changes] == [
        {"rollout.workers": 1, "output.retry_seconds": 5.0}]
    checked = subprocess.run([sys.executable, "-m", "checker.cli", "--trace", str(run_dir)],
                             capture_output=True, text=True, timeout=180)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # A hand edit of an operational setting in config.json is no change a resume makes.
    saved["output"]["retry_seconds"] = 7.0
    (run_dir / "config.json").write_text(json.dumps(saved))
    _assert_refused(_resume(rt, run_dir), "output.retry_seconds")


def test_a_thread_count_change_is_accepted_with_a_note(killed, reference, tmp_path, rt):
    """Threads split reductions differently: the schedule is the same, digests may differ."""
    run_dir = _copy(killed, tmp_path / "run")
    done = _resume(rt, run_dir, "--set", "learner.threads=1")
    assert done.returncode == 0, done.stderr
    assert "note: learner.threads 2 -> 1: the logical schedule is unchanged" in done.stderr
    _, state, _ = journal.restore(run_dir / "journal.jsonl")
    _, reference_state, _ = journal.restore(reference / "journal.jsonl")
    assert run_complete(state)
    schedule = [(c.update, c.requests, c.sample_versions) for c in state.ledger]
    assert schedule == [(c.update, c.requests, c.sample_versions)
                        for c in reference_state.ledger]
    assert state.published == reference_state.published
    assert json.loads((run_dir / "config.json").read_text())["learner"]["threads"] == 1


def test_the_readme_lists_every_operational_key():
    from invar.runtime.config import OPERATIONAL
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split("### Resume", 1)[1].split("\n## ", 1)[0]
    for key in OPERATIONAL:
        assert f"`{key}`" in section, key
