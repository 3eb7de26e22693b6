"""The journal writer: lines reach the file, in order, only through `sync` (or `close`), and
`synced_seq` never counts a line appended while a sync was running."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from invar.journal_format import unlinked
from invar.model.config import RunConfig
from invar.model.messages import TimerFired
from invar.runtime import journal


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _unlinked(line: str) -> str:
    """A line's text without its chain link."""
    parts = unlinked(line)
    assert parts is not None, line
    return parts[0]


def test_lines_are_written_by_sync_in_order_and_by_close(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    writer = journal.Journal(path, RunConfig())
    assert len(_lines(path)) == 1 and writer.synced_seq is None  # the header, synced
    for seq in range(3):
        writer.append(seq, TimerFired(), "b", "a", sync=False)
    assert len(_lines(path)) == 1  # nothing written yet: no system call per event
    writer.sync()
    assert [line.startswith(f'{{"seq":{seq},') for seq, line in enumerate(_lines(path)[1:])] \
        == [True] * 3
    assert writer.synced_seq == 2
    writer.append(3, TimerFired(), "b", "a", sync=True)
    assert len(_lines(path)) == 5 and writer.synced_seq == 3
    writer.append(4, TimerFired(), "b", "a", sync=False)
    writer.close()
    _, entries = journal.read(path)
    assert [entry.seq for entry in entries] == [0, 1, 2, 3, 4]


def test_a_line_appended_during_a_sync_waits_for_the_next(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "journal.jsonl"
    writer = journal.Journal(path, RunConfig())
    writer.append(0, TimerFired(), "b", "a", sync=False)
    in_fsync, release = threading.Event(), threading.Event()
    real_fsync = journal.os.fsync

    def slow_fsync(fd: int) -> None:
        in_fsync.set()
        release.wait(5)
        real_fsync(fd)

    monkeypatch.setattr(journal.os, "fsync", slow_fsync)
    syncing = threading.Thread(target=writer.sync)
    syncing.start()
    assert in_fsync.wait(5)
    writer.append(1, TimerFired(), "b", "a", sync=False)  # while line 0 is being synced
    release.set()
    syncing.join(5)
    assert writer.synced_seq == 0
    assert len(_lines(path)) == 2  # the header and line 0
    monkeypatch.setattr(journal.os, "fsync", real_fsync)
    writer.sync()
    assert writer.synced_seq == 1 and len(_lines(path)) == 3
    writer.close()


@pytest.mark.parametrize("before, after", [("0f3a9c", "77e1b2"), ('a "quoted" one', "é"),
                                           ("", "b")])
def test_a_line_of_an_encoded_event_is_what_json_would_write(tmp_path: Path, before: str,
                                                             after: str) -> None:
    """The head of a line with the event's text already encoded is spelled out for digests,
    and is byte for byte what json.dumps writes; other texts go through json.dumps."""
    import json

    from invar.model.messages import dumps

    path = tmp_path / "journal.jsonl"
    writer = journal.Journal(path, RunConfig())
    event = TimerFired()
    writer.append(7, event, before, after, sync=False, encoded=dumps(event))
    writer.close()
    expected = json.dumps({"seq": 7, "before": before, "after": after,
                           "event": json.loads(dumps(event))}, separators=(",", ":"))
    assert _unlinked(_lines(path)[1]) == expected


def test_the_event_path_appends_without_encoding(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An event that arrives without its text (a worker's completions come as bytes) is
    encoded when its line is written, in the thread that syncs, not when it is appended; the
    line is what encoding it at once would have written."""
    import json

    from invar.model.messages import WorkerConnected, dumps, encode

    encoded_in: list[str] = []

    def recording_encode(message: object) -> object:
        encoded_in.append(threading.current_thread().name)
        return encode(message)

    monkeypatch.setattr(journal, "encode", recording_encode)
    path = tmp_path / "journal.jsonl"
    writer = journal.Journal(path, RunConfig())
    event = WorkerConnected("worker-0", 2)
    writer.append(0, event, "b", "a", sync=False)
    assert encoded_in == []
    syncing = threading.Thread(target=writer.sync, name="syncing")
    syncing.start()
    syncing.join(5)
    assert encoded_in == ["syncing"]
    writer.close()
    assert _unlinked(_lines(path)[1]) == json.dumps({"seq": 0, "before": "b", "after": "a",
                                          "event": json.loads(dumps(event))},
                                         separators=(",", ":"))


def test_states_are_digested_when_their_line_is_written_each_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A line given the states around its event (the driver's) digests them when it is
    written, in the thread that syncs, not when it is appended; a state after that is the next
    line's state before is digested once; the lines read back as `write_events` writes them."""
    from invar.model.messages import WorkerConnected
    from invar.model.shell import deliver
    from invar.model.state import initial_state, state_digest

    digested_in: list[tuple[str, object]] = []

    def recording_digest(state: object) -> str:
        digested_in.append((threading.current_thread().name, state))
        return state_digest(state)  # type: ignore[arg-type]

    monkeypatch.setattr(journal, "state_digest", recording_digest)
    config = RunConfig()
    events = [WorkerConnected("worker-0", 0), WorkerConnected("worker-1", 0)]
    states = [initial_state(config)]
    for event in events:
        states.append(deliver(states[-1], event).state)
    path = tmp_path / "journal.jsonl"
    writer = journal.Journal(path, config)
    writer.append(0, events[0], states[0], states[1], sync=False)
    writer.append(1, events[1], states[1], states[2], sync=False)
    assert digested_in == []
    syncing = threading.Thread(target=writer.sync, name="syncing")
    syncing.start()
    syncing.join(5)
    assert digested_in == [("syncing", state) for state in states]
    writer.close()
    monkeypatch.setattr(journal, "state_digest", state_digest)
    expected = journal.write_events(tmp_path / "expected.jsonl", config, events)
    assert _lines(path) == _lines(expected)
