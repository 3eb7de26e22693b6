"""A journal that keeps only its last updates' payloads (`output.journal_keep_updates`).

`invar train` is killed with SIGKILL once its oldest segments are pruned, and resumed: it ends
as an uninterrupted run does. `invar-check --trace` validates what is kept and says what was
pruned; a kept segment changed or missing, or a snapshot changed, is refused with one line
naming the file, by `--trace` and by a resume (which then writes nothing).
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

import numpy as np
import pytest

from checker.cli import main as invar_check
from invar.journal_format import JOURNAL_FORMAT
from invar.journal_format.payloads import Segments, payload_bytes, record_of, scan, segment_files
from invar.model.completions import Completion, Completions
from invar.model.config import RunConfig
from invar.model.core import logical_projection, run_complete
from invar.model.errors import ConfigError
from invar.model.ragged import Ragged
from invar.model.schedule import RequestId
from invar.runtime import journal
from invar.testing import canonical_run, relinked

UPDATES = 6
KEEP = 1
RETENTION = f"output.journal_keep_updates={KEEP}"
KILL_AFTER_COMMITS = 4


def _payloads(run_dir: Path) -> Path:
    return journal.payload_dir(run_dir / "journal.jsonl")


def _segments(run_dir: Path) -> list[int]:
    return sorted(segment_files(_payloads(run_dir)))


def _snapshots(run_dir: Path) -> list[Path]:
    return sorted(_payloads(run_dir).glob("snapshot-*.json"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, rt):
    """An uninterrupted run that keeps every payload."""
    run_dir = tmp_path_factory.mktemp("reference")
    assert run_complete(rt.run_driver(rt.tiny_config(run_dir,
                                                     f"protocol.total_updates={UPDATES}")))
    return run_dir


@pytest.fixture(scope="module")
def killed(tmp_path_factory, rt):
    """`invar train` keeping the last update's payloads, killed with SIGKILL (the driver and
    its workers) once its first segments are pruned."""
    run_dir = tmp_path_factory.mktemp("killed") / "run"
    overrides = rt.tiny_overrides(run_dir, f"protocol.total_updates={UPDATES}", RETENTION)
    command = rt.cli("train", *(arg for item in overrides for arg in ("--set", item)))
    with open(run_dir.parent / "killed.out", "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    deadline = time.monotonic() + 120
    try:
        while True:
            assert process.poll() is None, "invar train ended before it could be killed"
            assert time.monotonic() < deadline, "invar train made no progress"
            if rt.commits_in(run_dir) >= KILL_AFTER_COMMITS and 0 not in _segments(run_dir):
                # Stopped, it is looked at as it will be killed: with a kept payload that a
                # resume and a validation both need (the tests below damage one).
                os.killpg(process.pid, signal.SIGSTOP)
                if _needed_payload(run_dir) is not None:
                    break
                os.killpg(process.pid, signal.SIGCONT)
            time.sleep(0.01)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL
    assert rt.commits_in(run_dir) < UPDATES
    assert _snapshots(run_dir) and 0 not in _segments(run_dir)
    return run_dir


def _copy(run_dir: Path, target: Path) -> Path:
    shutil.copytree(run_dir, target)
    return target


def _resume(rt, run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(rt.cli("train", "--resume", str(run_dir)), capture_output=True,
                          text=True, timeout=180)


def _trace(run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "checker.cli", "--trace", str(run_dir)],
                          capture_output=True, text=True, timeout=180,
                          env={**os.environ, "COLUMNS": "1000"})


def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def test_a_pruned_run_killed_and_resumed_equals_the_uninterrupted_run(killed, reference,
                                                                       tmp_path, rt):
    run_dir = _copy(killed, tmp_path / "run")
    pruned = [update for update in range(max(_segments(run_dir))) if update not in
              _segments(run_dir)]
    assert pruned  # the resume starts past segments that are gone
    done = _resume(rt, run_dir)
    assert done.returncode == 0, done.stderr

    _, state, _ = journal.restore(run_dir / "journal.jsonl")
    _, reference_state, _ = journal.restore(reference / "journal.jsonl")
    assert run_complete(state)
    assert logical_projection(state) == logical_projection(reference_state)
    assert state.published == reference_state.published
    assert state.commit_digests == reference_state.commit_digests
    rt.assert_same_weights(rt.final_weights(run_dir), rt.final_weights(reference))
    assert rt.summary(run_dir)["updates"] == UPDATES
    # Bounded: the payloads of the last update and what its snapshot's samples need; the
    # snapshots at the start of the kept update and after.
    assert _segments(run_dir) and min(_segments(run_dir)) >= UPDATES - KEEP - 2
    assert [path.name for path in _snapshots(run_dir)] == [
        f"snapshot-{update:06d}.json" for update in range(UPDATES - KEEP, UPDATES + 1)]

    checked = _trace(run_dir)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    out = " ".join(checked.stdout.split())
    assert "complete run: the last " in out and \
        f"replayed from snapshot-{UPDATES - KEEP:06d}.json" in out, out
    assert "events before it are checked by their chain links, sequence numbers and state " \
        "digests only, not replayed (their payloads pruned" in out, out
    assert "kept journalled rewards are the task verifier's" in out, out


def test_trace_of_a_pruned_run_cut_short_is_a_valid_prefix(killed, capsys):
    checked = _trace(killed)
    assert checked.returncode == 3, checked.stdout + checked.stderr
    out = " ".join(checked.stdout.split())
    assert "valid prefix, run incomplete" in out and "not replayed (their payloads pruned" \
        in out, out


def _needed_payload(run_dir: Path) -> tuple[Path, int] | None:
    """The segment file of a payload that a resume (from the newest snapshot) and a validation
    (from the oldest) both read: a frame the newest snapshot's samples are rows of, else one a
    line after it refers to; and the offset of its stored bytes. None: there is none yet."""
    snapshots = _snapshots(run_dir)
    if not snapshots:
        return None
    newest = json.loads(snapshots[-1].read_bytes())
    references = [tuple(frame) for frame in newest["frames"]]
    for line in (run_dir / "journal.jsonl").read_text().splitlines()[newest["seq"] + 2:]:
        try:
            event = json.loads(line)["event"]
        except ValueError:  # a line cut by the stop: not one
            continue
        references += [(value["segment"], value["payload"]) for value in event.values()
                       if isinstance(value, dict) and "payload" in value]
    if not references:
        return None
    segment, digest = references[0]
    path = segment_files(_payloads(run_dir))[segment]
    return path, scan(path)[0][digest].offset


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset + 8] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, why", [
    (lambda path, offset: _flip(path, offset), "does not match its digest"),
    (lambda path, offset: path.unlink(), "missing"),
])
def test_a_changed_or_missing_kept_segment_is_refused_naming_it(killed, tmp_path, rt, damage,
                                                                 why):
    run_dir = _copy(killed, tmp_path / "run")
    needed = _needed_payload(run_dir)
    assert needed is not None
    path, offset = needed
    damage(path, offset)
    before = (run_dir / "journal.jsonl").read_bytes()

    checked = _trace(run_dir)
    assert checked.returncode == 1
    line = _one_line(checked.stdout + checked.stderr)
    assert line.startswith(f"departure at {path}: ") and why in line, line

    done = _resume(rt, run_dir)
    assert done.returncode == 2
    line = _one_line(done.stderr)
    assert line.startswith("invar: resume refused: ") and str(path) in line and why in line
    assert (run_dir / "journal.jsonl").read_bytes() == before


def _changed_admission(document: dict) -> None:
    document["admitted"] += 1


def _unknown_phase(document: dict) -> None:
    document["learner"]["phase"] = "__import__('os')"


@pytest.mark.parametrize("tamper, why", [
    (_changed_admission, "holds a state of digest"),
    (_unknown_phase, "learner: phase"),
])
def test_a_changed_snapshot_is_refused_naming_it(killed, tmp_path, rt, tamper, why):
    run_dir = _copy(killed, tmp_path / "run")
    newest, oldest = _snapshots(run_dir)[-1], _snapshots(run_dir)[0]
    for path in {newest, oldest}:  # a resume replays from the newest, a validation the oldest
        document = json.loads(path.read_bytes())
        tamper(document)
        path.write_text(json.dumps(document))
    before = (run_dir / "journal.jsonl").read_bytes()

    checked = _trace(run_dir)
    assert checked.returncode == 1
    line = _one_line(checked.stdout + checked.stderr)
    assert line.startswith(f"departure at {oldest}: ") and why in line, line

    done = _resume(rt, run_dir)  # both check every snapshot kept, the oldest first
    assert done.returncode == 2
    line = _one_line(done.stderr)
    assert line.startswith("invar: resume refused: ") and str(oldest) in line and why in line
    assert (run_dir / "journal.jsonl").read_bytes() == before


# -- in process: a journal written from the canonical run of a small protocol -------------------


def _small_config() -> RunConfig:
    return RunConfig(prompts_per_batch=2, group_size=2, max_staleness=1, sync_period=1,
                     optimizer_steps=2, total_updates=6, max_inflight_batches=2, seed=7,
                     eval_every=2, checkpoint_every=2)


def _samples(slots: list) -> list[int]:
    return [i for i, slot in enumerate(slots) if isinstance(slot, list)
            and isinstance(slot[0], int)]


def test_payloads_are_kept_bit_for_bit(tmp_path):
    """A segment gives back exactly the words it was given: signed zeros, NaNs, infinities,
    empty rows, the largest token ids."""
    frame = Completions.of([
        Completion(RequestId(0, 0, 0), 3, (1, 2 ** 63 - 1), (-0.0, float("nan")), -1.5),
        Completion(RequestId(0, 0, 1), 3, (), (), 0.0)])
    matrix = Ragged(np.array([-0.0, np.nan, -np.inf]), [2, 0, 1])
    for value, completions in ((frame, True), (matrix, False)):
        raw = payload_bytes(value)
        digest, record = record_of(raw)
        with open(tmp_path / "segment-000000.bin", "ab") as file:
            file.write(record)
        loaded = Segments(tmp_path).load(0, digest, line=2, completions=completions)
        assert payload_bytes(loaded) == raw and loaded == value


def test_retention_keeps_the_last_updates_and_replays_as_the_whole_journal(tmp_path):
    config = _small_config()
    run = canonical_run(config)
    path = journal.write_events(tmp_path / "journal.jsonl", config, run.events, keep_updates=2)
    _, state, _ = journal.restore(path)
    assert state == run.state and logical_projection(state) == logical_projection(run.state)
    assert [p.name for p in _snapshots(tmp_path)] == [
        f"snapshot-{update:06d}.json" for update in (4, 5, 6)]
    assert min(_segments(tmp_path)) <= 4 and 0 not in _segments(tmp_path)
    contents = journal.read_contents(path)
    assert contents.start is not None and contents.start.state.committed == 4
    assert all(entry.event is None for entry in contents.entries[:contents.start.seq + 1])
    replayed = list(journal.replay(config, contents.entries, check_invariants=True,
                                   start=contents.start))
    assert not any(isinstance(after, journal.Departure) for _, _, after in replayed)
    assert len(replayed) == len(contents.entries) - contents.start.seq - 1


def test_a_line_before_the_snapshot_edited_and_linked_again_is_a_departure(tmp_path):
    """The lines before the replay's start keep their state digests, checked as a chain (each
    line's `before` the previous line's `after`): one changed there, its link computed again,
    is a departure at the next line."""
    config = _small_config()
    path = journal.write_events(tmp_path / "journal.jsonl", config, canonical_run(config).events,
                                keep_updates=1)
    lines = path.read_text().splitlines(keepends=True)
    record = json.loads(lines[3])
    record["after"] = "0" * 32
    lines[3] = json.dumps(record, separators=(",", ":")) + "\n"
    path.write_text(relinked(lines))
    contents = journal.read_contents(path)
    assert contents.start is not None and contents.start.seq > 3
    outcomes = [after for _, _, after in journal.replay(config, contents.entries,
                                                        start=contents.start)]
    assert len(outcomes) == 1 and isinstance(outcomes[0], journal.Departure)
    assert outcomes[0].line == 5 and "state digest before" in outcomes[0].reason


@pytest.mark.parametrize("which", [0, -1])
@pytest.mark.parametrize("damage", [
    lambda path: path.write_bytes(path.read_bytes()[:40]),
    lambda path: path.write_text(path.read_text().replace('"admitted":', '"admitted":1+', 1)),
])
def test_a_damaged_snapshot_is_refused_by_a_resume_and_a_validation_alike(tmp_path, capsys,
                                                                        damage, which):
    """A resume replays from the newest snapshot, a validation from the oldest, but a resume's
    writer prunes by the older ones: a snapshot damaged, the oldest or the newest, is refused
    by both when they read the journal, naming the same file (not accepted by a resume, to
    crash the run at its next update boundary; not passed by a validation as a valid prefix
    where a resume refuses)."""
    config = _small_config()
    path = journal.write_events(tmp_path / "journal.jsonl", config, canonical_run(config).events,
                                keep_updates=2)
    assert len(_snapshots(tmp_path)) > 1
    damaged = _snapshots(tmp_path)[which]
    damage(damaged)
    with pytest.raises(journal.SnapshotError, match=f"^{damaged}: "):
        journal.restore(path)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))  # an incomplete run, as a resume finds it
    assert invar_check(["--trace", str(path), "--no-rescore"]) == 1
    captured = capsys.readouterr()
    assert _one_line(captured.out + captured.err).startswith(f"departure at {damaged}: ")


def test_a_pruned_journal_whose_settings_never_pruned_is_refused(tmp_path, capsys):
    """A journal read from a snapshot although the settings it binds kept every payload
    (`output.journal_keep_updates = 0`): its early payloads removed and a snapshot put in
    their place (a forger's way past re-scoring them) is a departure, and no resume."""
    from helpers.journals import settings
    from invar.runtime.cli import resume_config
    config = _small_config()
    path = journal.write_events(tmp_path / "journal.jsonl", config, canonical_run(config).events,
                                keep_updates=2, settings=settings())
    assert invar_check(["--trace", str(path), "--no-rescore"]) == 1
    captured = capsys.readouterr()
    line = _one_line(captured.out + captured.err)
    assert line.startswith(f"departure at {_snapshots(tmp_path)[0]}: ") and \
        "settings never let it prune payloads" in line, line
    (tmp_path / "config.json").write_text(json.dumps(
        {**settings(), "protocol": journal.protocol_to_dict(config)}))
    with pytest.raises(ConfigError, match="settings never let it prune payloads"):
        resume_config(str(tmp_path), None, [])


def test_a_sample_moved_within_a_snapshot_is_refused(tmp_path):
    """Each sample must be its frame row's completion of its own request: two swapped (each
    digest still a real completion's) are refused, naming the snapshot and the slot."""
    config = _small_config()
    path = journal.write_events(tmp_path / "journal.jsonl", config, canonical_run(config).events,
                                keep_updates=2)
    chosen = next(snapshot for snapshot in _snapshots(tmp_path)
                  if any(len(_samples(batch["slots"])) > 1
                         for batch in json.loads(snapshot.read_bytes())["batches"]))
    for snapshot in _snapshots(tmp_path):
        if snapshot != chosen:
            snapshot.unlink()
    journal.restore(path)  # as it was written
    document = json.loads(chosen.read_bytes())
    slots = next(batch["slots"] for batch in document["batches"]
                 if len(_samples(batch["slots"])) > 1)
    first, second = _samples(slots)[:2]
    slots[first], slots[second] = slots[second], slots[first]
    chosen.write_text(json.dumps(document))
    with pytest.raises(journal.SnapshotError, match=f"{chosen}: batches.*completes request"):
        journal.restore(path)


def test_a_journal_of_the_format_before_is_refused_in_one_line(tmp_path, capsys):
    config = _small_config()
    path = journal.write_events(tmp_path / "journal.jsonl", config, canonical_run(config).events)
    lines = path.read_text().splitlines(keepends=True)
    lines[0] = lines[0].replace(f'"journal":{JOURNAL_FORMAT},', f'"journal":{JOURNAL_FORMAT - 1},')
    path.write_text(relinked(lines))
    assert invar_check(["--trace", str(path)]) == 2
    captured = capsys.readouterr()
    line = _one_line(captured.out + captured.err)
    assert f"journal format {JOURNAL_FORMAT - 1}; this version of invar reads format " \
           f"{JOURNAL_FORMAT} only" in line, line
