"""`invar-check --trace`: a torn, shortened or renumbered journal, an unknown format, and the
incremental invariants the validation uses (the same verdicts as `violations`, linear time).

Exit statuses (checker/cli.py `_trace`): 0 complete and valid, 3 a valid prefix of an
incomplete run (says where it ends; a torn last line is such an end), 1 a departure (a
sequence number out of order included), 2 not a journal this version reads.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from checker.cli import main as invar_check
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
    restart_driver,
    restart_learner,
    restart_worker,
)


def small_config(**overrides) -> RunConfig:
    base = dict(prompts_per_batch=2, group_size=2, max_staleness=1, sync_period=1,
                optimizer_steps=2, total_updates=4, max_inflight_batches=2, seed=7,
                eval_every=2, checkpoint_every=2)
    base.update(overrides)
    return RunConfig(**base)


def write_journal(path: Path, config: RunConfig) -> Path:
    """The journal a driver writes for the canonical run of `config`."""
    return journal.write_events(path, config, canonical_run(config).events)


@pytest.fixture
def complete(tmp_path: Path) -> Path:
    return write_journal(tmp_path / "journal.jsonl", small_config())


def check(path: Path, capsys) -> tuple[int, str]:
    code = invar_check(["--trace", str(path)])
    captured = capsys.readouterr()
    return code, " ".join((captured.out + captured.err).split())


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


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
    complete.write_text("".join(lines))
    code, out = check(complete, capsys)
    assert code == 1, out
    assert "departure" in out and "sequence number" in out


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


def test_validation_is_linear_in_the_journal(tmp_path):
    """Twice the updates take about twice the time per event, not four times."""
    import time

    def per_event(updates: int) -> float:
        path = write_journal(tmp_path / f"j{updates}.jsonl", small_config(
            total_updates=updates, prompts_per_batch=8, group_size=8))
        config, entries = journal.read(path)
        began = time.perf_counter()
        for _, _, after in journal.replay(config, entries, check_invariants=True):
            assert not isinstance(after, journal.Departure)
        return (time.perf_counter() - began) / len(entries)

    short, long = per_event(10), per_event(40)
    assert long < 2.0 * short, (short, long)
