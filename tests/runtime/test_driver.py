"""The asynchronous driver end to end, with real worker processes.

One baseline run (2 workers, S = 1) is shared by the module: its outputs, its journal replayed
through the model (trace validation), tampered copies of that journal, and the serial
reference execution it must equal bit for bit. Fault-injected runs must complete, count what
went wrong, and still reach the baseline's logical result and weights.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from invar.model import schedule
from invar.model.core import logical_projection, run_complete, step
from invar.model.messages import LaunchRequest, RequestsCompleted, one_per_request
from invar.model.schedule import RequestId
from invar.model.state import state_digest
from invar.runtime import journal
from invar.testing import edit_completion, relinked


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, rt):
    run_dir = tmp_path_factory.mktemp("baseline")
    config = rt.tiny_config(run_dir, "rollout.workers=2")
    state = rt.run_driver(config)
    return config, state, run_dir


# -- a plain run -------------------------------------------------------------------------------


def test_run_completes_and_writes_its_outputs(baseline, rt):
    config, state, run_dir = baseline
    assert run_complete(state)
    for name in ("summary.json", "report.md", "reward_curve.png", "metrics.csv",
                 "journal.jsonl", "config.json"):
        assert (run_dir / name).stat().st_size > 0, name
    summary = rt.summary(run_dir)
    assert summary["updates"] == config.protocol.total_updates
    assert summary["refused"] == summary["malformed_frames"] == summary["worker_deaths"] == 0
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + config.protocol.total_updates
    assert [r.update for r in state.ledger] == list(range(config.protocol.total_updates))


def test_journal_replays_through_the_model_with_invariants(baseline):
    config, state, run_dir = baseline
    protocol, entries = journal.read(run_dir / "journal.jsonl")
    assert protocol == config.protocol
    last = None
    for _entry, _, after in journal.replay(protocol, entries, check_invariants=True):
        assert not isinstance(after, journal.Departure), after
        last = after
    assert state_digest(last) == state_digest(state)
    assert logical_projection(last) == logical_projection(state)


def _lines(run_dir: Path) -> list[str]:
    return (run_dir / "journal.jsonl").read_text().splitlines(keepends=True)


def _completion_lines(lines: list[str]) -> list[int]:
    """1-based line numbers of RequestsCompleted events followed by another event."""
    return [i + 1 for i in range(1, len(lines) - 1)
            if json.loads(lines[i])["event"]["type"] == "RequestsCompleted"]


def _change_reward(path: Path, lines: list[str], number: int) -> None:
    record = json.loads(lines[number - 1])
    _, entries = journal.read(path)
    reward = entries[number - 2].event.completions[0].reward
    record["event"] = edit_completion(path, record["event"], 0, reward=reward + 0.25)
    lines[number - 1] = json.dumps(record, separators=(",", ":")) + "\n"


def _delete(path: Path, lines: list[str], number: int) -> None:
    del lines[number - 1]


def _swap(path: Path, lines: list[str], number: int) -> None:
    lines[number - 1], lines[number] = lines[number], lines[number - 1]


def _copy_journal(run_dir: Path, path: Path) -> None:
    """The run's journal, its payloads with it, as `path`."""
    shutil.copyfile(run_dir / "journal.jsonl", path)
    shutil.copytree(journal.payload_dir(run_dir / "journal.jsonl"), journal.payload_dir(path))


@pytest.mark.parametrize("tamper, why", [
    (_change_reward, "state digest after"),
    (_delete, "state digest before"),
    (_swap, "state digest before"),
])
def test_tampered_journal_departs_at_the_tampered_line(baseline, tmp_path, tamper, why):
    _, _, run_dir = baseline
    lines = _lines(run_dir)
    number = _completion_lines(lines)[-1]
    path = tmp_path / "journal.jsonl"
    _copy_journal(run_dir, path)
    tamper(path, lines, number)
    path.write_text("".join(lines))
    # The chain sees the edit first; linked again, the model does.
    with pytest.raises(journal.ChainError, match=f"journal.jsonl:{number}:"):
        journal.restore(path)
    path.write_text(relinked(lines))
    protocol, entries = journal.read(path)
    outcomes = [after for _, _, after in journal.replay(protocol, entries, check_invariants=True)]
    departure = outcomes[-1]
    assert isinstance(departure, journal.Departure)
    assert not any(isinstance(o, journal.Departure) for o in outcomes[:-1])
    assert departure.line == number and why in departure.reason
    with pytest.raises(journal.JournalError, match=f"journal.jsonl:{number}:"):
        journal.restore(path)


def test_torn_last_line_is_dropped_and_not_glued_to_the_next(baseline, tmp_path):
    config, state, run_dir = baseline
    path = tmp_path / "journal.jsonl"
    _copy_journal(run_dir, path)
    with open(path, "a") as file:
        file.write('{"seq": 999, "before": "ab')  # a crash mid-write
    _, restored, seq = journal.restore(path)
    assert state_digest(restored) == state_digest(state)
    writer = journal.Journal(path, config.protocol)  # as a resumed driver opens it
    writer.close()
    assert path.read_bytes() == (run_dir / "journal.jsonl").read_bytes()


# -- determinism: asynchronous == serial -------------------------------------------------------


def test_asynchronous_run_equals_the_serial_reference_bitwise(baseline, tmp_path, rt):
    config, state, run_dir = baseline
    serial_config = rt.tiny_config(tmp_path / "serial", "rollout.workers=2")
    assert serial_config.protocol == config.protocol
    serial_state = rt.run_serial(serial_config)
    assert run_complete(serial_state)
    assert logical_projection(serial_state) == logical_projection(state)
    assert serial_state.ledger_digest == state.ledger_digest
    assert serial_state.commit_digests == state.commit_digests
    rt.assert_same_weights(rt.final_weights(tmp_path / "serial"), rt.final_weights(run_dir))


# -- bad input and dying workers ---------------------------------------------------------------


def _assert_same_result(rt, baseline, state, run_dir):
    """Faults may change timing and counters, never what the run consumed or learned."""
    _, base_state, base_dir = baseline
    assert run_complete(state)
    assert logical_projection(state) == logical_projection(base_state)
    rt.assert_same_weights(rt.final_weights(run_dir), rt.final_weights(base_dir))


def _completions(run_dir: Path, rt) -> list[SimpleNamespace]:
    """Every completion journalled, with the worker and incarnation of its frame."""
    frames = [entry.event for entry in journal.read(run_dir / "journal.jsonl")[1]
              if isinstance(entry.event, RequestsCompleted)]
    return [SimpleNamespace(worker=f.worker, incarnation=f.incarnation, **vars(c))
            for f in frames for c in f.completions]


def test_wrong_version_reply_is_refused_counted_and_not_used(baseline, tmp_path, rt):
    config = rt.tiny_config(tmp_path, 'rollout.faults=["wrong_version_once"]',
                            "output.retry_seconds=1.0")
    state = rt.run_driver(config)
    summary = rt.summary(tmp_path)
    assert summary["refused"] >= 1
    assert summary["counters"]["refused_wrong_version"] >= 1
    for event in _completions(tmp_path, rt):
        assert event.version == schedule.gen_version(config.protocol, event.request.batch)
    _assert_same_result(rt, baseline, state, tmp_path)


def test_garbage_frame_is_counted_and_dropped(baseline, tmp_path, rt):
    config = rt.tiny_config(tmp_path, 'rollout.faults=["garbage_frame_once"]')
    state = rt.run_driver(config)
    summary = rt.summary(tmp_path)
    assert summary["malformed_frames"] >= 1
    assert summary["counters"]["malformed_frames"] == summary["malformed_frames"]
    _assert_same_result(rt, baseline, state, tmp_path)


def _launches(config, run_dir: Path) -> dict[RequestId, list[LaunchRequest]]:
    """Every LaunchRequest the core issued during the run, from its journal, by request."""
    protocol, entries = journal.read(run_dir / "journal.jsonl")
    launched: dict[RequestId, list[LaunchRequest]] = {}
    for entry, before, after in journal.replay(protocol, entries):
        assert not isinstance(after, journal.Departure), after
        _, commands = step(before, entry.event)
        for command in one_per_request(commands):
            if isinstance(command, LaunchRequest):
                launched.setdefault(command.request, []).append(command)
    return launched


def test_dead_worker_is_respawned_and_its_requests_reissued(baseline, tmp_path, rt):
    config = rt.tiny_config(tmp_path, 'rollout.faults=["exit_after:10"]', "rollout.respawn=true")
    state = rt.run_driver(config)
    summary = rt.summary(tmp_path)
    assert summary["worker_deaths"] == 1  # faults hit the first incarnation only
    assert (tmp_path / "logs" / "worker-0.1.log").exists()
    launched = _launches(config, tmp_path)
    completed = {e.request: e for e in _completions(tmp_path, rt)}
    lost = [r for r, sent in launched.items() if sent[0].incarnation == 0
            and completed[r].incarnation > 0]
    assert lost, "the crash lost no request: the test did not test re-issue"
    for request in lost:
        version = schedule.gen_version(config.protocol, request.batch)
        seed = schedule.sampling_seed(config.protocol, request)
        assert {(c.version, c.seed) for c in launched[request]} == {(version, seed)}
        assert completed[request].version == version
    assert sum(1 for e in completed.values() if e.incarnation == 0) == 10
    _assert_same_result(rt, baseline, state, tmp_path)


async def _worker_1_first(driver, name, incarnation):
    """Start worker-0 only once worker-1 is connected, so that worker-1 gets work to die on."""
    if name == "worker-0":
        while driver.state.worker("worker-1") is None:
            await asyncio.sleep(0.02)
    return await driver.launcher.spawn(name, incarnation)


def test_run_continues_on_the_remaining_worker(baseline, tmp_path, rt):
    config = rt.tiny_config(tmp_path, "rollout.workers=2", "rollout.respawn=false",
                            'rollout.faults=["worker-1:exit_after:5"]')
    state = rt.run_driver(config, spawn=_worker_1_first)
    summary = rt.summary(tmp_path)
    assert summary["worker_deaths"] == 1
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [
        "worker-0.0.log", "worker-1.0.log"]
    events = rt.journal_events(tmp_path)
    lost_at = next(i for i, e in enumerate(events) if e["type"] == "WorkerLost")
    assert events[lost_at]["worker"] == "worker-1"
    later = [e for e in events[lost_at:] if e["type"] == "RequestsCompleted"]
    assert later and all(e["worker"] == "worker-0" for e in later)
    assert sum(1 for e in _completions(tmp_path, rt) if e.worker == "worker-1") == 5
    _assert_same_result(rt, baseline, state, tmp_path)
