"""`invar-check --trace`: a torn, shortened or renumbered journal, an unknown format, edited
fields the model does not keep (the chain sees them), keyed chains, and the incremental
invariants the validation uses (the same verdicts as `violations`, linear time).

Exit statuses (checker/cli.py `_trace`): 0 complete and valid, 3 a valid prefix of an
incomplete run (says where it ends; a torn last line is such an end), 1 a departure (a
sequence number out of order, a chain link included), 2 not a journal this version reads, 4
valid but not re-scored. The canonical run's rewards are the fakes', not a task's: its
journals are checked with --no-rescore, unless a test binds a task.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from checker.cli import main as invar_check
from helpers.journals import settings, small_config, write_journal
from invar.model.config import RunConfig
from invar.model.invariants import violations
from invar.model.state import Assigned
from invar.runtime import journal
from invar.testing import (
    canonical_run,
    crash_learner,
    crash_worker,
    deliver_message,
    drop,
    duplicate,
    fire_timer,
    new_world,
    relinked,
    restart_driver,
    restart_learner,
    restart_worker,
)


@pytest.fixture
def complete(tmp_path: Path) -> Path:
    return write_journal(tmp_path / "journal.jsonl", small_config())


def check(path: Path, capsys, options: tuple[str, ...] = ("--no-rescore",)) -> tuple[int, str]:
    code = invar_check(["--trace", str(path), *options])
    captured = capsys.readouterr()
    return code, " ".join((captured.out + captured.err).split())


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def edit_first(lines: list[str], kind: str, field: str, value: object) -> int:
    """Set `field` of the first event of type `kind` to `value` (the line keeps its old link);
    returns the line's index."""
    index = next(i for i, line in enumerate(lines) if f'"type":"{kind}"' in line)
    record = json.loads(lines[index])
    assert record["event"][field] != value
    record["event"][field] = value
    lines[index] = json.dumps(record, separators=(",", ":")) + "\n"
    return index


def test_a_complete_run_passes(complete, capsys):
    code, out = check(complete, capsys)
    assert code == 0, out
    assert "complete run" in out


@pytest.mark.parametrize("cut", [1, 30])
def test_lines_missing_at_the_end_are_an_incomplete_run(complete, capsys, cut):
    lines = lines_of(complete)
    complete.write_text("".join(lines[:-cut]))
    code, out = check(complete, capsys)
    assert code == 3, out
    assert "valid prefix, run incomplete: ends at update" in out and "of 4" in out


def test_a_torn_last_line_is_an_incomplete_run(complete, capsys):
    text = complete.read_text()
    complete.write_text(text[:len(text) - len(lines_of(complete)[-1]) // 2])
    code, out = check(complete, capsys)
    assert code == 3, out
    assert "torn" in out and "run incomplete" in out


def test_a_changed_seq_is_a_departure(complete, capsys):
    lines = lines_of(complete)
    record = json.loads(lines[10])
    record["seq"] += 1
    lines[10] = json.dumps(record, separators=(",", ":")) + "\n"
    complete.write_text(relinked(lines))
    code, out = check(complete, capsys)
    assert code == 1, out
    assert "departure" in out and "sequence number" in out


# -- fields no state digest covers: the chain does ------------------------------------------


@pytest.mark.parametrize("kind, field, value", [("VersionEvaluated", "reward", 0.999),
                                                ("RequestsCompleted", "incarnation", 7)])
def test_an_edited_field_the_model_does_not_keep_is_a_departure(complete, capsys, kind, field,
                                                                  value):
    """The model does not keep a held-out reward or a frame's incarnation, so the state
    digests cannot see them changed; the line's chain link does, and so does a resume."""
    lines = lines_of(complete)
    index = edit_first(lines, kind, field, value)
    complete.write_text("".join(lines))
    code, out = check(complete, capsys)
    assert code == 1, out
    assert f"departure at {complete}:{index + 1}: the line has a chain link that does not " \
           f"match" in out
    with pytest.raises(journal.JournalError, match=f":{index + 1}: the line has a chain link"):
        journal.restore(complete)


# -- keyed chains ---------------------------------------------------------------------------


@pytest.fixture
def key_file(tmp_path_factory) -> Path:
    """A key outside every run directory of the test."""
    path = tmp_path_factory.mktemp("keys") / "journal.key"
    path.write_bytes(bytes(range(32)))
    path.chmod(0o600)  # a key others can read is refused
    return path


def keyed_journal(tmp_path: Path, key_file: Path) -> Path:
    config = small_config()
    path = tmp_path / "run" / "journal.jsonl"
    path.parent.mkdir()
    return journal.write_events(path, config, canonical_run(config).events,
                                key=journal.read_key(key_file, path.parent))


def test_a_keyed_journal_passes_with_its_key_only(tmp_path, key_file, capsys):
    path = keyed_journal(tmp_path, key_file)
    code, out = check_keyed(path, key_file, capsys)
    assert code == 0 and "its keyed chain holds" in out, out
    code, out = check(path, capsys)
    assert code == 2 and "keyed" in out and "key" in out, out
    other = key_file.parent / "other.key"
    other.write_bytes(bytes(range(1, 33)))
    other.chmod(0o600)
    code, out = check_keyed(path, other, capsys)
    assert code == 1 and f"departure at {path}:1:" in out and "another key" in out, out


def check_keyed(path: Path, key_file: Path, capsys) -> tuple[int, str]:
    code = invar_check(["--trace", str(path), "--key", str(key_file), "--no-rescore"])
    captured = capsys.readouterr()
    return code, " ".join((captured.out + captured.err).split())


def test_a_key_inside_the_run_directory_is_refused(tmp_path, key_file, capsys):
    path = keyed_journal(tmp_path, key_file)
    inside = path.parent / "journal.key"
    inside.write_bytes(key_file.read_bytes())
    code, out = check_keyed(path, inside, capsys)
    assert code == 2 and "inside the run directory" in out, out


def test_a_short_key_is_refused(tmp_path, key_file, capsys):
    path = keyed_journal(tmp_path, key_file)
    key_file.write_bytes(b"secret\n")
    code, out = check_keyed(path, key_file, capsys)
    assert code == 2 and "at least 16 bytes" in out, out


def test_a_key_for_an_unkeyed_journal_is_a_departure(complete, key_file, capsys):
    """Whoever rewrites a keyed journal cannot key it, but may write it unkeyed: with the key,
    that is a departure, not a journal that merely has nothing to check."""
    code, out = check_keyed(complete, key_file, capsys)
    assert code == 1 and "not keyed" in out, out


def test_an_unknown_format_is_refused(complete, capsys):
    lines = lines_of(complete)
    header = json.loads(lines[0])
    header["journal"] = 99
    lines[0] = json.dumps(header) + "\n"
    complete.write_text("".join(lines))
    code, out = check(complete, capsys)
    assert code == 2, out
    assert "format 99" in out


def test_a_bad_line_in_the_middle_is_bad_input(complete, capsys):
    lines = lines_of(complete)
    lines[5] = lines[5][:20] + "\n"
    complete.write_text("".join(lines))
    code, out = check(complete, capsys)
    assert code == 2, out
    assert ":6:" in out


def test_a_journal_that_is_not_utf8_is_bad_input(complete, capsys):
    complete.write_bytes(complete.read_bytes() + b"\xff\xfe\n")
    code, out = check(complete, capsys)
    assert code == 2, out
    assert "UTF-8" in out


# -- the incremental invariants ------------------------------------------------------------


def _walk(config: RunConfig, seed: int, steps: int = 400):
    """Core states of a random run with faults (drops, duplicates, crashes, restarts)."""
    rng = random.Random(seed)
    world = new_world(config, ("w0", "w1"))
    for _ in range(steps):
        roll = rng.random()
        if world.network and roll < 0.8:
            key = rng.choice(world.network).key
            world = (drop(world, key) if roll < 0.03 else duplicate(world, key) if roll < 0.06
                     else deliver_message(world, key))
        elif roll < 0.84:
            name = rng.choice(("w0", "w1"))
            worker = world.worker(name)
            world = crash_worker(world, name) if worker.alive else restart_worker(world, name)
        elif roll < 0.86:
            world = crash_learner(world) if world.learner.alive else restart_learner(world)
        elif roll < 0.87:
            world = restart_driver(world)
        elif world.core.timer_armed:
            world = fire_timer(world)
        elif not world.learner.alive:
            world = restart_learner(world)
        yield world.core


def _tampered(state, rng: random.Random):
    """The state with one thing wrong that some invariant must catch (or nothing, if it
    cannot be tampered with that way)."""
    choice = rng.randrange(5)
    if choice == 0 and state.batches:
        batch = state.batches[0]
        bad = dataclasses.replace(batch, pending=batch.pending + 1)
        return dataclasses.replace(state, batches=(bad, *state.batches[1:]))
    if choice == 1 and state.ledger:
        return dataclasses.replace(state, ledger=state.ledger + (state.ledger[-1],))
    if choice == 2 and state.batches:
        batch = state.batches[-1]
        return dataclasses.replace(state, batches=(*state.batches[:-1], batch.with_slots(
            {0: Assigned("w9", 3)})))
    if choice == 3 and state.ledger:
        record = dataclasses.replace(state.ledger[0], requests=tuple(
            reversed(state.ledger[0].requests)))
        return dataclasses.replace(state, ledger=(record, *state.ledger[1:]))
    if choice == 4 and state.published:
        return dataclasses.replace(state, published=state.published + (state.published[-1],))
    return state


@pytest.mark.parametrize("seed", range(6))
def test_incremental_invariants_give_the_same_verdicts(seed):
    from invar.model.invariants import IncrementalInvariants
    config = small_config(max_inflight_batches=3 if seed % 2 else 2)
    rng = random.Random(seed)
    incremental = IncrementalInvariants()
    tampered = IncrementalInvariants()
    caught = 0
    for state in _walk(config, seed):
        assert incremental.violations(state) == violations(state)
        bad = _tampered(state, rng)
        expected = violations(bad)
        assert tampered.violations(bad) == expected
        caught += bool(expected)
        # The real state again after a tampered one: nothing stale is remembered.
        assert tampered.violations(state) == violations(state)
    assert caught > 10


def _edited(value: object) -> object:
    """Another value of a plain JSON field's type (None: not a plain field)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 0.5
    if isinstance(value, str):
        return value[:-1] + ("0" if value[-1:] != "0" else "1")
    return None


def test_protocol_lists_exactly_the_fields_the_state_digests_do_not_cover(complete, capsys):
    """Every plain field of the first event of each type of a canonical run, edited and the
    chain linked again: the edits that still replay through the model with every digest
    agreeing are the informational fields PROTOCOL.md §9.1 lists (the chain alone covers
    them)."""
    import re

    lines = lines_of(complete)
    first: dict[str, int] = {}
    for index, line in enumerate(lines[1:], start=1):
        first.setdefault(json.loads(line)["event"]["type"], index)
    uncovered = set()
    for kind, index in first.items():
        event = json.loads(lines[index])["event"]
        for field, value in event.items():
            new = _edited(value)
            if field in ("type", "v") or new is None:
                continue
            edited = list(lines)
            edit_first(edited, kind, field, new)
            complete.write_text(relinked(edited))
            config, entries = journal.read(complete)
            if not any(isinstance(after, journal.Departure)
                       for _, _, after in journal.replay(config, entries)):
                uncovered.add(f"{kind}.{field}")
    protocol = (Path(__file__).resolve().parents[2] / "spec" / "PROTOCOL.md").read_text()
    section = protocol[protocol.index("*What the journal's digests cover.*"):]
    section = section[:section.index("\n\n", section.index("| Field |"))]
    listed = set(re.findall(r"^\| `(\w+\.\w+)` \|", section, re.MULTILINE))
    assert uncovered == listed


def test_a_verifier_that_cannot_be_built_is_said_and_refused_when_asked_for(tmp_path, capsys):
    """By default a task whose verifier cannot be built here (its file elsewhere) leaves the
    rewards unchecked, says so and exits 4; --rescore insists: bad input."""
    path = write_journal(tmp_path / "journal.jsonl", small_config(), settings(
        'task.name="jsonl"', f"task.path={json.dumps(str(tmp_path / 'elsewhere.jsonl'))}"))
    code, out = check(path, capsys, options=())
    assert code == 4 and "rewards NOT re-scored: the task's verifier cannot be built" in out, out
    code = invar_check(["--trace", str(path), "--rescore"])
    out = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "--rescore:" in out and "elsewhere.jsonl" in out, out


def test_a_plug_in_task_is_rescored_when_asked_for(tmp_path, capsys):
    """A "module" task's verifier is user code of unknown cost: re-scored with --rescore only,
    and without it the rewards are said unchecked, exit 4 (the canonical run's rewards are
    the fakes', not parity's: the first differs)."""
    example = Path(__file__).resolve().parents[2] / "examples" / "parity_task.py"
    path = write_journal(tmp_path / "journal.jsonl", small_config(), settings(
        'task.name="module"', f"task.module={json.dumps(f'{example}:make_task')}"))
    code, out = check(path, capsys, options=())
    assert code == 4 and "rewards NOT re-scored (task 'module'" in out, out
    code = invar_check(["--trace", str(path), "--rescore"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 1 and "the reward of sample (batch 0," in out, out
