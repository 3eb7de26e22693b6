"""Crash recovery: `invar train` killed with SIGKILL and resumed equals an uninterrupted run.

The module runs one uninterrupted reference (in-process) and one `invar train` subprocess
killed, with its workers, once its journal holds two commits. Each test works on a copy of
the killed run directory. Last, runs killed exactly when the learner is handed the evaluation
or the checkpoint of a boundary commit must do them on resume.
"""

from __future__ import annotations

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
from invar.runtime.commits import list_commits, read_commit

UPDATES = 6
KILL_AFTER_COMMITS = 2


@pytest.fixture(scope="module")
def reference(tmp_path_factory, rt):
    run_dir = tmp_path_factory.mktemp("reference")
    state = rt.run_driver(rt.tiny_config(run_dir, f"protocol.total_updates={UPDATES}"))
    assert run_complete(state)
    return run_dir


def _commits_in(path: Path) -> int:
    if not path.exists():
        return 0
    return path.read_text().count('"type":"UpdateCommitted"')


@pytest.fixture(scope="module")
def killed(tmp_path_factory, rt):
    """A run directory whose driver and workers were killed with SIGKILL mid-run."""
    run_dir = tmp_path_factory.mktemp("killed")
    overrides = rt.tiny_overrides(run_dir, f"protocol.total_updates={UPDATES}")
    command = rt.cli("train", *(arg for item in overrides for arg in ("--set", item)))
    with open(run_dir.parent / "killed.out", "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    journal_path = run_dir / "journal.jsonl"
    deadline = time.monotonic() + 120
    try:
        while _commits_in(journal_path) < KILL_AFTER_COMMITS:
            assert process.poll() is None, "invar train ended before it could be killed"
            assert time.monotonic() < deadline, "invar train made no progress"
            time.sleep(0.01)
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the driver and its worker processes
        process.wait()
    assert process.returncode == -signal.SIGKILL
    assert KILL_AFTER_COMMITS <= _commits_in(journal_path) < UPDATES
    return run_dir


def _copy(run_dir: Path, target: Path) -> Path:
    shutil.copytree(run_dir, target)
    return target


def _resume(rt, run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(rt.cli("train", "--resume", str(run_dir)), capture_output=True,
                          text=True, timeout=180)


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())
            if p.is_file() and not p.name.endswith(".tmp")}


def test_resume_after_sigkill_equals_the_uninterrupted_run(killed, reference, tmp_path, rt):
    run_dir = _copy(killed, tmp_path / "run")
    committed_before = _commits_in(run_dir / "journal.jsonl")
    # What a crash can also leave: a torn journal line and a half-written commit.
    with open(run_dir / "journal.jsonl", "a") as file:
        file.write('{"seq":100000,"before":"0123')
    leftover = run_dir / "commits" / f".commit-{committed_before + 1:06d}.pt.x1y2z3.tmp"
    leftover.write_bytes(b"INVARCK2" + b"\0" * 32)

    done = _resume(rt, run_dir)
    assert done.returncode == 0, done.stderr

    _, state, _ = journal.restore(run_dir / "journal.jsonl")
    _, reference_state, _ = journal.restore(reference / "journal.jsonl")
    assert run_complete(state)
    assert logical_projection(state) == logical_projection(reference_state)
    assert state.published == reference_state.published
    assert state.commit_digests == reference_state.commit_digests
    rt.assert_same_weights(rt.final_weights(run_dir), rt.final_weights(reference))

    # The partial commit was discarded, not loaded; nothing temporary is left.
    assert not leftover.exists()
    assert not list((run_dir / "commits").glob("*.tmp"))
    # Each update is committed exactly once, in the journal and in the ledger.
    events = rt.journal_events(run_dir)
    commits = [e["update"] for e in events if e["type"] == "UpdateCommitted"]
    restarted = next(i for i, e in enumerate(events)
                     if e["type"] == "LearnerStarted" and e["incarnation"] == 1)
    assert sorted(commits) == list(range(UPDATES)) == [r.update for r in state.ledger]
    # The update in progress when the driver died is redone and committed after the restart
    # (unless its commit reached the disk first: then the restart itself accepts it).
    redone = [e["update"] for e in events[restarted:] if e["type"] == "UpdateCommitted"]
    assert redone == list(range(UPDATES - len(redone), UPDATES))
    assert len(redone) >= UPDATES - committed_before - 1
    published = [e["version"] for e in events if e["type"] == "VersionPublished"]
    assert published == [e["version"] for e in rt.journal_events(reference)
                         if e["type"] == "VersionPublished"]
    assert rt.summary(run_dir)["updates"] == UPDATES  # the report covers the whole run


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("damage, why", [(_flip_a_byte, "checksum"), (_truncate, "truncated")])
def test_damaged_newest_commit_refuses_resume(killed, tmp_path, rt, damage, why):
    run_dir = _copy(killed, tmp_path / "run")
    _, newest = list_commits(run_dir / "commits")[-1]
    damage(newest)
    commits = _files(run_dir / "commits")
    logs = sorted(p.name for p in (run_dir / "logs").iterdir())
    _, entries = journal.read(run_dir / "journal.jsonl")

    done = _resume(rt, run_dir)
    assert done.returncode == 1
    assert str(newest) in done.stderr and why in done.stderr
    assert "Traceback" not in done.stderr
    # Nothing was loaded, written, pruned or started.
    assert _files(run_dir / "commits") == commits
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == logs
    assert journal.read(run_dir / "journal.jsonl")[1] == entries


def test_resume_of_a_finished_run_is_a_no_op(reference, tmp_path, rt):
    run_dir = _copy(reference, tmp_path / "run")
    before = {name: _files(run_dir / name) for name in (".", "commits", "logs")}
    done = _resume(rt, run_dir)
    assert done.returncode == 0, done.stderr
    assert f"done: {UPDATES} updates" in done.stdout
    after = {name: _files(run_dir / name) for name in (".", "commits", "logs")}
    # Journal, summary, report, metrics, commits: all untouched.
    changed = sorted(f"{d}/{f}" for d in before for f in {*before[d], *after[d]}
                     if before[d].get(f) != after[d].get(f))
    assert not changed, (changed, done.stderr)


def test_resume_accepts_a_commit_whose_journal_line_was_lost(reference, tmp_path, rt):
    """The crash window between a commit reaching the disk and its UpdateCommitted reaching
    the journal: the restarted learner reports the newer version and the core accepts it."""
    run_dir = _copy(reference, tmp_path / "run")
    path = run_dir / "journal.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    last = max(i for i, line in enumerate(lines) if '"type":"UpdateCommitted"' in line)
    path.write_text("".join(lines[:last]))
    assert list_commits(run_dir / "commits")[-1][0] == UPDATES  # on disk, not in the journal

    state = rt.run_driver(rt.tiny_config(run_dir, f"protocol.total_updates={UPDATES}"),
                          resume=True)
    _, reference_state, _ = journal.restore(reference / "journal.jsonl")
    assert run_complete(state)
    assert logical_projection(state) == logical_projection(reference_state)
    events = rt.journal_events(run_dir)
    assert [e["update"] for e in events if e["type"] == "UpdateCommitted"] == list(
        range(UPDATES - 1))  # the last commit is accepted by LearnerStarted, not re-done
    assert events[last - 1]["type"] == "LearnerStarted"
    assert events[last - 1]["committed_version"] == UPDATES
    rt.assert_same_weights(rt.final_weights(run_dir), rt.final_weights(reference))
    assert rt.summary(run_dir)["updates"] == UPDATES  # the last row is replaced, not doubled


def test_resume_refuses_a_different_protocol(reference, tmp_path, rt):
    from invar.runtime.driver import ResumeError
    run_dir = _copy(reference, tmp_path / "run")
    journal_before = (run_dir / "journal.jsonl").read_bytes()
    config = rt.tiny_config(run_dir, f"protocol.total_updates={UPDATES + 1}")
    with pytest.raises(ResumeError, match="cannot change its protocol"):
        rt.run_driver(config, resume=True)
    assert (run_dir / "journal.jsonl").read_bytes() == journal_before


# -- a kill right after an evaluation/checkpoint boundary commit (finding 4) -------------------

BOUNDARY_UPDATES = 3
BOUNDARIES = (f"protocol.total_updates={BOUNDARY_UPDATES}", "protocol.eval_every=2",
              "protocol.checkpoint_every=2")
"""Evaluations of versions 0, 2 and 3; checkpoints of 2 and 3."""

KILL_AT = """
import os, signal, sys
from invar.runtime import cli, driver
kind, version = sys.argv[1], int(sys.argv[2])
execute = driver.LearnerExecutor.execute

def execute_or_die(self, command, inputs):
    if type(command).__name__ == kind and command.version == version:
        os.kill(os.getpid(), signal.SIGKILL)  # the driver dies before the command is done
    return execute(self, command, inputs)

driver.LearnerExecutor.execute = execute_or_die
sys.exit(cli.main(sys.argv[3:]))
"""
"""`invar train` that SIGKILLs itself when the learner is handed `kind(version)`."""


@pytest.fixture(scope="module")
def boundary_reference(tmp_path_factory, rt):
    run_dir = tmp_path_factory.mktemp("boundary-reference")
    assert run_complete(rt.run_driver(rt.tiny_config(run_dir, *BOUNDARIES)))
    return run_dir


def _evaluated_versions(run_dir: Path) -> list[int]:
    """The held-out versions of the run's report table, in order."""
    return [int(line.split("|")[1]) for line in (run_dir / "report.md").read_text().splitlines()
            if line.startswith("| ") and line.split("|")[1].strip().isdigit()]


def test_a_kill_at_a_boundary_commit_is_evaluated_and_checkpointed_on_resume(
        boundary_reference, tmp_path, rt):
    """Killed when the learner is handed Evaluate(2), right after the boundary commit of
    version 2 is journalled: the resumed run evaluates and checkpoints version 2 (the old
    fire-and-forget commands were lost with the driver). The in-process driver tests cover
    the kill at the checkpoint too."""
    run_dir = tmp_path / "run"
    overrides = rt.tiny_overrides(run_dir, *BOUNDARIES)
    command = [sys.executable, "-c", KILL_AT, "Evaluate", "2", "train",
               *(arg for item in overrides for arg in ("--set", item))]
    killed = subprocess.run(command, capture_output=True, timeout=180, start_new_session=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    _, state, _ = journal.restore(run_dir / "journal.jsonl")
    assert state.committed == 2 and 2 not in state.checkpointed
    assert not (run_dir / "checkpoints" / "commit-000002.pt").exists()

    done = _resume(rt, run_dir)
    assert done.returncode == 0, done.stderr

    _, state, _ = journal.restore(run_dir / "journal.jsonl")
    _, reference_state, _ = journal.restore(boundary_reference / "journal.jsonl")
    assert run_complete(state)
    assert logical_projection(state) == logical_projection(reference_state)
    assert state.evaluated == (0, 2, 3) and state.checkpointed == (2, 3)
    for version in state.checkpointed:
        kept = read_commit(run_dir / "checkpoints" / f"commit-{version:06d}.pt")
        assert kept["state_digest"] == state.commit_digests[version]
    assert not list((run_dir / "checkpoints").glob(".*.tmp"))
    assert _evaluated_versions(run_dir) == [0, 2, 3] == _evaluated_versions(boundary_reference)
    rt.assert_same_weights(rt.final_weights(run_dir), rt.final_weights(boundary_reference))


# -- a damaged store file ----------------------------------------------------------------------

KILL_AT_LOAD = """
import os, signal, sys
from invar.runtime import cli, driver
version = int(sys.argv[1])
send_load = driver.Driver._send_load

def send_load_or_die(self, command):
    if command.version == version:
        self.journal.sync()  # VersionPublished(version) is in the journal, durably
        os.kill(os.getpid(), signal.SIGKILL)  # before any worker has loaded the version
    return send_load(self, command)

driver.Driver._send_load = send_load_or_die
sys.exit(cli.main(sys.argv[2:]))
"""
"""`invar train` that SIGKILLs itself when it first sends a worker the weights of `version`:
resumed, the run loads them from the store's file, not from the copy a live driver keeps."""
LOAD_KILLED_AT = 2


@pytest.fixture(scope="module")
def killed_at_load(tmp_path_factory, rt):
    run_dir = tmp_path_factory.mktemp("killed-at-load") / "run"
    overrides = rt.tiny_overrides(run_dir, f"protocol.total_updates={UPDATES}")
    command = [sys.executable, "-c", KILL_AT_LOAD, str(LOAD_KILLED_AT), "train",
               *(arg for item in overrides for arg in ("--set", item))]
    killed = subprocess.run(command, capture_output=True, timeout=180, start_new_session=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    _, state, _ = journal.restore(run_dir / "journal.jsonl")
    assert LOAD_KILLED_AT in state.retained
    return run_dir


def _damage_the_store(run_dir: Path) -> list[int]:
    """Flip a byte of every weights file in the run's store; returns their versions."""
    stored = sorted((run_dir / "store").glob("weights-*.bin"))
    for path in stored:
        _flip_a_byte(path)
    return [int(path.stem.split("-")[1]) for path in stored]


def _assert_finished_as_the_reference(run_dir: Path, reference: Path, rt) -> None:
    _, state, _ = journal.restore(run_dir / "journal.jsonl")
    _, reference_state, _ = journal.restore(reference / "journal.jsonl")
    assert run_complete(state)
    assert logical_projection(state) == logical_projection(reference_state)
    rt.assert_same_weights(rt.final_weights(run_dir), rt.final_weights(reference))


def test_a_damaged_store_file_is_published_again_on_resume(killed_at_load, reference, tmp_path,
                                                           rt):
    """A flipped byte in a store file would make every worker sent it refuse it, and the run
    stop, on every resume; the resume publishes it again from its commit."""
    run_dir = _copy(killed_at_load, tmp_path / "run")
    assert LOAD_KILLED_AT in _damage_the_store(run_dir)
    done = _resume(rt, run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"store file of version {LOAD_KILLED_AT} failed its digest: published again from " \
           f"its commit" in done.stderr
    _assert_finished_as_the_reference(run_dir, reference, rt)


def test_a_store_file_a_worker_refuses_is_published_again(killed_at_load, reference, tmp_path,
                                                          rt):
    """A store file damaged after the resume checked the store: the worker sent it refuses
    it and dies; the driver publishes it again from its commit before the next incarnation."""
    run_dir = _copy(killed_at_load, tmp_path / "run")
    damaged: list[int] = []

    async def damage_then_spawn(driver, name, incarnation):
        if not damaged:
            damaged.extend(_damage_the_store(run_dir))
        return await driver.launcher.spawn(name, incarnation)

    state = rt.run_driver(rt.tiny_config(run_dir, f"protocol.total_updates={UPDATES}"),
                          resume=True, spawn=damage_then_spawn)
    assert LOAD_KILLED_AT in damaged and run_complete(state)
    _assert_finished_as_the_reference(run_dir, reference, rt)
