"""What a real run's journal proves: a reward changed and every digest
computed again by replaying the model passes the model, but not re-scoring
(`invar-check --trace --rescore`, the default for the built-in tasks) and not a keyed chain
(`invar train --journal-key`, `invar-check --trace --key`)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from checker.cli import main as invar_check
from helpers.journals import rewrite
from invar.model.completions import Completions
from invar.model.errors import ConfigError
from invar.model.messages import Event, RequestsCompleted
from invar.runtime import journal


@pytest.fixture(scope="module")
def run(tmp_path_factory, rt) -> Path:
    """A real run of the default task (digit reversal), complete."""
    run_dir = tmp_path_factory.mktemp("run") / "run"
    rt.run_driver(rt.tiny_config(run_dir))
    return run_dir


@pytest.fixture(scope="module")
def key_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "journal.key"
    path.write_bytes(bytes(range(100, 132)))
    path.chmod(0o600)  # a key others can read is refused
    return path


def check(capsys, *args: str) -> tuple[int, str]:
    code = invar_check(["--trace", *args])
    captured = capsys.readouterr()
    return code, " ".join((captured.out + captured.err).split())


def with_reward(events: list[Event], index: int, row: int, reward: float) -> list[Event]:
    """The events with the reward of completion `row` of frame `events[index]` changed."""
    frame = events[index]
    assert isinstance(frame, RequestsCompleted)
    columns = frame.completions
    rewards = np.array(columns.rewards)
    rewards[row] = reward
    changed = Completions(columns.requests, columns.versions, columns.tokens,
                          columns.behavior_logprobs, rewards)
    return [*events[:index], dataclasses.replace(frame, completions=changed), *events[index + 1:]]


def forged(events: list[Event]) -> tuple[list[Event], tuple[int, int, int]]:
    """The events with the reward of the first completion of the last frame raised by 1 (e.g.
    0.25 -> 1.25), and that completion's request."""
    last = max(i for i, event in enumerate(events) if isinstance(event, RequestsCompleted))
    frame = events[last]
    assert isinstance(frame, RequestsCompleted)
    batch, prompt, sample = frame.completions.requests[0].tolist()
    return (with_reward(events, last, 0, float(frame.completions.rewards[0]) + 1.0),
            (batch, prompt, sample))


def copy_of(run: Path, target: Path) -> Path:
    shutil.copytree(run, target)
    return target


def test_a_real_run_is_rescored_by_default(run, capsys):
    code, out = check(capsys, str(run))
    assert code == 0, out
    assert "complete run" in out and "journalled rewards are the task verifier's" in out
    code, out = check(capsys, str(run / "journal.jsonl"), "--no-rescore")
    assert code == 0 and "rewards not re-scored (--no-rescore)" in out, out


def test_a_reward_rewritten_and_digested_again_fails_rescoring(run, tmp_path, capsys):
    """The forgery passes the model (every digest and link computed again), so only the
    verifier can tell: re-scored, the changed reward is named with its sample."""
    run_dir = copy_of(run, tmp_path / "run")
    config, entries = journal.read(run_dir / "journal.jsonl")
    events, (batch, prompt, sample) = forged([entry.event for entry in entries])
    rewrite(run_dir / "journal.jsonl", config, events)
    code, out = check(capsys, str(run_dir), "--no-rescore")
    assert code == 0, out  # what `--trace` said of it before re-scoring
    for asked in ("--rescore", None):
        code, out = check(capsys, *filter(None, (str(run_dir), asked)))
        assert code == 1, out
        assert f"the reward of sample (batch {batch}, prompt {prompt}, sample {sample}) is " \
               in out and "by the task's verifier" in out, out


@pytest.mark.parametrize("rewrite_key", [None, bytes(32)])
def test_a_keyed_journal_rewritten_without_its_key_fails(run, tmp_path, key_file, capsys,
                                                          rewrite_key):
    """The same forgery of a keyed journal, its digests computed again unkeyed or with a
    guessed key: with the run's key it is a departure at its first line."""
    run_dir = copy_of(run, tmp_path / "run")
    path = run_dir / "journal.jsonl"
    config, entries = journal.read(path)
    key = journal.read_key(key_file, run_dir)
    rewrite(path, config, [entry.event for entry in entries], key=key)
    assert check(capsys, str(run_dir), "--key", str(key_file))[0] == 0  # the run's, keyed
    rewrite(path, config, forged([entry.event for entry in entries])[0], key=rewrite_key)
    code, out = check(capsys, str(run_dir), "--key", str(key_file))
    assert code == 1 and f"departure at {path}:1:" in out, out


def test_a_keyed_run_is_resumed_with_its_key_only(tmp_path, key_file, rt):
    """`invar train --journal-key`: the journal is keyed; a resume without the key, or with
    another, is refused before anything is written; with it, the run goes on and its chain
    holds."""
    run_dir = tmp_path / "run"
    overrides = [arg for item in rt.tiny_overrides(run_dir) for arg in ("--set", item)]
    done = subprocess.run(rt.cli("train", *overrides, "--journal-key", str(key_file)),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    path = run_dir / "journal.jsonl"
    _cut_before_the_last_commit(path)  # resumable work
    cut = path.read_bytes()
    other = key_file.parent / "other.key"
    other.write_bytes(bytes(32))
    other.chmod(0o600)
    for key in ((), ("--journal-key", str(other))):
        refused = subprocess.run(rt.cli("train", "--resume", str(run_dir), *key),
                                 capture_output=True, text=True, timeout=180)
        assert refused.returncode == 2, refused.stderr
        assert "resume refused" in refused.stderr and str(path) in refused.stderr
        assert path.read_bytes() == cut
    # config.json edited by hand (the journal untouched): refused, naming the keys.
    saved = (run_dir / "config.json").read_text()
    edited = json.loads(saved)
    edited["optim"]["lr"], edited["sampling"]["temperature"] = 0.5, 3.0
    (run_dir / "config.json").write_text(json.dumps(edited))
    refused = subprocess.run(rt.cli("train", "--resume", str(run_dir), "--journal-key",
                                    str(key_file)), capture_output=True, text=True, timeout=180)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("invar: resume refused: optim.lr, sampling.temperature: "
                                     f"{run_dir / 'config.json'} says other values than the "
                                     "configuration the journal binds"), refused.stderr
    assert path.read_bytes() == cut
    (run_dir / "config.json").write_text(saved)
    resumed = subprocess.run(rt.cli("train", "--resume", str(run_dir), "--journal-key",
                                    str(key_file)), capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    checked = subprocess.run([sys.executable, "-m", "checker.cli", "--trace", str(run_dir),
                              "--key", str(key_file)], capture_output=True, text=True,
                             timeout=180)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "its keyed chain holds" in checked.stdout


def test_a_serial_run_keys_its_journal(tmp_path, key_file, rt, capsys):
    from invar.runtime.cli import make_learner
    from invar.runtime.serial import run_serial
    run_dir = tmp_path / "serial"
    config = rt.tiny_config(run_dir)
    with rt.torch_globals_kept():
        run_serial(config, make_learner(config), journal_key=journal.read_key(key_file, run_dir))
    code, out = check(capsys, str(run_dir), "--key", str(key_file))
    assert code == 0 and "its keyed chain holds" in out, out


def _cut_before_the_last_commit(path: Path) -> None:
    """The journal as a kill before its last UpdateCommitted leaves it (the commit on disk)."""
    lines = path.read_text().splitlines(keepends=True)
    last = max(i for i, line in enumerate(lines) if '"type":"UpdateCommitted"' in line)
    path.write_text("".join(lines[:last]))


def test_a_resume_refuses_a_rewritten_reward_not_yet_trained_on(run, tmp_path, rt):
    """A reward of a batch not yet trained on, changed and
    re-digested; `invar train --resume` would train on it. The resume re-scores the batches
    not yet trained on (cheap: the in-flight ones) and refuses, naming the sample."""
    run_dir = copy_of(run, tmp_path / "run")
    path = run_dir / "journal.jsonl"
    _cut_before_the_last_commit(path)
    config, entries = journal.read(path)
    _, state, _ = journal.restore(path)
    events, (batch, prompt, sample) = forged([entry.event for entry in entries])
    assert batch >= state.committed  # not yet trained on
    rewrite(path, config, events)
    forgery = path.read_bytes()
    done = subprocess.run(rt.cli("train", "--resume", str(run_dir)), capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 2, done.stderr
    assert f"the reward of sample (batch {batch}, prompt {prompt}, sample {sample})" in \
        done.stderr and "a batch not yet trained on" in done.stderr, done.stderr
    assert path.read_bytes() == forgery


def test_a_reward_of_the_failure_value_is_counted_apart(run, tmp_path, capsys):
    """A verifier call that failed or timed out in the run journals task.failure_reward; the
    verifier, run again, gives another: counted and said, not a departure."""
    run_dir = copy_of(run, tmp_path / "run")
    path = run_dir / "journal.jsonl"
    config, entries = journal.read(path)
    events = [entry.event for entry in entries]
    index, row = next((i, int(np.flatnonzero(event.completions.rewards)[0]))
                      for i, event in enumerate(events) if isinstance(event, RequestsCompleted)
                      and event.completions.rewards.any())
    events = with_reward(events, index, row, 0.0)  # task.failure_reward's default
    rewrite(path, config, events)
    code, out = check(capsys, str(run_dir))
    assert code == 0 and "1 task.failure_reward = 0.0 where it now gives another" in out, out


@pytest.mark.parametrize("make, why", [
    (lambda key, run_dir: key.parent / "missing.key", "cannot read the journal key"),
    (lambda key, run_dir: _written(key.parent / "short.key", b"secret"), "at least 16 bytes"),
    (lambda key, run_dir: _written(run_dir / "journal.key", bytes(32)), "inside the run "
                                                                        "directory"),
    # Issue 41: accepted without a word.
    (lambda key, run_dir: _written(key.parent / "open.key", bytes(32), 0o644),
     "others than its owner can read or write the journal key (mode 0644): chmod 600"),
    (lambda key, run_dir: _written(key.parent / "group.key", bytes(32), 0o640),
     "(mode 0640)"),
    (lambda key, run_dir: _linked(key, run_dir / "notes" / "kept.bin"),
     "inside the run directory"),
    (lambda key, run_dir: _fifo(key.parent / "fifo.key"), "a journal key is a regular file"),
], ids=["missing", "short", "inside", "world_readable", "group_readable", "hard_link", "fifo"])
@pytest.mark.timeout(60)  # a FIFO key waited for a writer forever
def test_a_bad_journal_key_is_refused_before_anything_starts(tmp_path, key_file, capsys, make,
                                                              why):
    from invar.runtime.cli import main as invar
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    key = make(key_file, run_dir)
    code = invar(["train", "--set", f"output.run_dir={json.dumps(str(run_dir))}",
                  "--journal-key", str(key)])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and f"configuration refused: --journal-key, {key}: " in err and why in err
    # Nothing written: the run directory holds what the test put there, if anything.
    assert sorted(p.name for p in run_dir.iterdir()) in ([], [key.name], ["notes"])


def _written(path: Path, data: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


def _linked(key: Path, inside: Path) -> Path:
    """A key outside the run directory that a hard link inside it shares."""
    outside = _written(key.parent / "linked.key", bytes(range(32)))
    inside.parent.mkdir()
    os.link(outside, inside)
    return outside


def _fifo(path: Path) -> Path:
    os.mkfifo(path, 0o600)
    return path


def test_the_failure_reward_and_the_task_are_the_journal_s_not_config_json_s(run, tmp_path,
                                                                            capsys):
    """A reward forged to 5.0 with `task.failure_reward = 5.0` written into config.json, or
    with config.json gone: re-scoring reads the task and the failure reward the journal
    binds, and names the forgery either way."""
    run_dir = copy_of(run, tmp_path / "run")
    path = run_dir / "journal.jsonl"
    config, entries = journal.read(path)
    events = [entry.event for entry in entries]
    index = next(i for i, event in enumerate(events) if isinstance(event, RequestsCompleted))
    batch, prompt, sample = events[index].completions.requests[0].tolist()
    rewrite(path, config, with_reward(events, index, 0, 5.0))
    saved = json.loads((run_dir / "config.json").read_text())
    saved["task"]["failure_reward"] = 5.0
    (run_dir / "config.json").write_text(json.dumps(saved))
    forgery = f"the reward of sample (batch {batch}, prompt {prompt}, sample {sample}) is 5.0"
    code, out = check(capsys, str(run_dir))
    assert code == 1 and forgery in out, out
    (run_dir / "config.json").unlink()
    code, out = check(capsys, str(run_dir))
    assert code == 1 and forgery in out, out


def test_a_journal_that_binds_no_task_is_not_said_rescored(run, tmp_path, capsys):
    """A journal rewritten without what it bound (its header's settings dropped): nothing to
    re-score by, which `--trace` says with exit 4, not 0; and no resume."""
    from invar.runtime.cli import resume_config
    run_dir = copy_of(run, tmp_path / "run")
    path = run_dir / "journal.jsonl"
    config, entries = journal.read(path)
    path.unlink()
    journal.write_events(path, config, [entry.event for entry in entries])
    code, out = check(capsys, str(run_dir))
    assert code == 4 and "rewards NOT re-scored" in out and "binds no configuration" in out, out
    with pytest.raises(ConfigError, match="binds no configuration"):
        resume_config(str(run_dir), None, [])
