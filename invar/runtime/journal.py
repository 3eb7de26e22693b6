"""The driver's journal: every accepted event, as JSON lines, with the state digest around it.

Line 1 is a header with the protocol configuration and what else the run is bound to (its
other settings, the digests of its model and task files: `invar.runtime.binding`); then one
line per accepted event:
`{"seq": n, "before": digest, "after": digest, "event": <encoded event>, "chain": link}` (the
link chains every line to the ones before it, keyed when the writer has a key:
`invar.journal_format`), and a line for each operational change a resume made
(`record_settings`). Lines are kept in
memory as they are appended and written out as text, with an fsync, by `sync`: when
`shell.deliver` says the delivery is durable (before a Commit, Publish or ReleaseVersion goes
out, and when a commit or a learner start is accepted) and at close. So after a crash the file
holds at least every event up to the last such point (the protocol re-sends whatever
followed), and appending costs the event path no system call, no encoding and no digest (a
line may be given the states themselves, digested when it is written); a torn last line is
ignored on reading. The driver runs `sync` in a thread while it appends further lines.

An event's token and log-prob payloads go, compressed, to the segment file of its update in
`journal.d/`, written and fsynced before the lines that refer to them
(`invar.journal_format.payloads`). With `keep_updates` (`output.journal_keep_updates`) K ≥ 1,
`write_snapshots`, after a sync that made update boundaries durable (lines that commit an
update), writes a snapshot of the state at each and the ledger's new records
(`invar.journal_format.snapshots`), then prunes: the snapshots before the one at the start of
the last K committed updates, and the segments that neither its replay nor its samples need.
The lines stay whole: the chain and the digests of what was pruned stay checkable. The driver
runs it once the commands the sync released are out, so snapshots are not on their path.

Replaying the journal through `shell.deliver` reproduces the driver's state exactly: that is
how the driver resumes, and how `invar-check --trace` validates a real run against the model.
Reading and replaying are `invar.journal_format`'s (the checker reads journals too, without
this shell); they are importable from here as well.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from invar.journal_format import (
    CHAIN_START,
    ChainError,
    Contents,
    Departure,
    Entry,
    JournalError,
    PayloadError,
    SnapshotError,
    header_text,
    linked,
    payload_dir,
    protocol_from_dict,
    protocol_to_dict,
    read,
    read_contents,
    read_key,
    replay,
    settings_text,
    unlinked,
)
from invar.journal_format.payloads import (
    payload_bytes,
    payload_digest,
    record_of,
    reference,
    scan,
    segment_files,
    segment_path,
)
from invar.journal_format.snapshots import (
    LEDGER_FILE,
    FrameReference,
    at_boundary,
    ledger_line,
    snapshot_document,
    snapshot_path,
    snapshot_update,
)
from invar.model.completions import Completions
from invar.model.config import RunConfig
from invar.model.messages import Event, encode, encode_with, json_text, packed_fields
from invar.model.shell import deliver
from invar.model.state import Consumption, State, initial_state, state_digest
from invar.runtime.files import atomic_write

__all__ = [
    "ChainError",
    "Contents",
    "Departure",
    "Entry",
    "Journal",
    "JournalError",
    "PayloadError",
    "SnapshotError",
    "payload_dir",
    "protocol_from_dict",
    "protocol_to_dict",
    "read",
    "read_contents",
    "read_key",
    "replay",
    "replayed",
    "restore",
    "write_events",
]


JOURNAL = "journal.jsonl"
"""The journal's name in a run directory."""


def refuse_existing_run(run_dir: Path, serial: bool = False) -> None:
    """FileExistsError saying how to go on when `run_dir` holds a run already (a journal with
    lines): a new run needs its own directory. `serial`: the run to start is a serial one,
    which cannot resume."""
    path = Path(run_dir) / JOURNAL
    if path.is_file() and path.stat().st_size:
        go_on = ("a serial run needs a new one" if serial
                 else f"continue it with `invar train --resume {run_dir}`, or start another")
        raise FileExistsError(f"{run_dir} holds a run already ({JOURNAL}): {go_on} with "
                              "--set output.run_dir=runs/NEW_NAME")


class Journal:
    """Append-only writer: `append` from one thread, `sync` from another (one at a time).

    `key`: the chain's key (`read_key`), None for an unkeyed chain. A journal that exists is
    appended to, its chain going on from its last whole line (its caller has read it with the
    same key: `restore`); a new one starts with an empty `journal.d/`. `keep_updates`: 0 keeps
    every payload; K >= 1 the last K committed updates' (module doc). `settings`, `files`:
    what a new journal's header binds besides the protocol (`journal_format.Binding`)."""

    def __init__(self, path: Path, config: RunConfig, key: bytes | None = None,
                 keep_updates: int = 0, settings: dict[str, Any] | None = None,
                 files: dict[str, Any] | None = None) -> None:
        self.path = path
        self._key = key
        self.synced_seq: int | None = None
        """The seq of the newest line an fsync covers (None: none appended by this writer)."""
        self._last_seq: int | None = None
        self._unwritten: list[str | _Line] = []
        """Lines appended since the last sync began, in order."""
        self.text_seconds = 0.0
        """CPU seconds `sync` spent making each appended line text (encoding the events that
        came without it, digesting the states given for digests): work its caller moved off
        its event path, and counts as its own."""
        self._digested: tuple[State | None, str] = (None, "")
        """The state whose digest `sync` computed last, and that digest: a line's state before
        is most often the previous line's state after, and is not digested twice."""
        self._taking = threading.Lock()  # appends against a sync taking the lines
        self._writing = threading.Lock()  # lines reach the file in order, one sync at a time
        self._chain = CHAIN_START
        """The link of the last line written."""
        self._update = 0
        """The update of the newest line appended with its states (the segment of a line
        appended with digests only)."""
        self._due: list[tuple[int, State]] = []
        """The update boundaries synced whose snapshots are not written yet."""
        if path.exists():
            self._chain = _drop_torn_tail(path)
        fresh = not path.exists() or path.stat().st_size == 0
        directory = payload_dir(path)
        if fresh:
            _clear(directory)  # what a journal no longer here left
        if not directory.is_dir():
            directory.mkdir()
            _fsync_directory(directory.parent)
        for leftover in directory.glob(".*.tmp"):  # a snapshot or ledger write cut by a crash
            leftover.unlink()
        self._segments = _Segments(directory)
        self._retention = _Retention(directory, keep_updates) if keep_updates else None
        # The append handle lives as long as the writer (closed by close()).
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115
        if fresh:
            self._unwritten.append(header_text(config, key is not None, settings, files))
            self.sync()

    def record_settings(self, changes: dict[str, Any]) -> None:
        """A line recording `changes` (dotted key: new value) to the settings the journal
        binds, made durable now (a resume's operational changes, before its config.json says
        them)."""
        if changes:
            with self._taking:
                self._unwritten.append(settings_text(changes))
            self.sync()

    def append(self, seq: int, event: Event, before: State | str, after: State | str,
               sync: bool, encoded: dict[str, Any] | str | None = None) -> None:
        """`before`, `after`: the states around the event (digested when the line is written:
        states are immutable values), or their digests.
        `encoded`: the event's encoding when the caller already has it as received, as a
        dict or as its compact JSON text (written as it is: encoding it again would cost
        more than the core). The line is kept as it is given and written out as text by
        `sync`, in the thread that syncs: the event path pays no encoding and no digest.
        `sync`: make this line durable before returning (and `write_snapshots`)."""
        update = before.committed if isinstance(before, State) else self._update
        if isinstance(after, State):
            self._update = after.committed
        with self._taking:
            self._unwritten.append(_Line(seq, event, before, after, encoded, update))
            self._last_seq = seq
        if sync:
            self.sync()
            self.write_snapshots()

    def sync(self) -> None:
        """Write every line appended so far and make it durable (lines appended while it
        runs, from another thread, wait for the next sync: `synced_seq` does not count
        them)."""
        with self._writing:
            with self._taking:
                lines, self._unwritten = self._unwritten, []
                covered = self._last_seq
            boundaries: list[_Line] = []
            if lines:
                # CPU time: this thread also waits for the GIL, which is no one's work.
                began = time.thread_time()
                texts: list[str] = []
                payloads: list[_Payload] = []
                for line in lines:
                    if isinstance(line, str):
                        text = line
                    else:
                        text = line.text(self._digest, payloads)
                        if self._retention is not None and line.boundary():
                            boundaries.append(line)
                    text, self._chain = linked(self._key, self._chain, text)
                    texts.append(text)
                self.text_seconds += time.thread_time() - began
                if payloads:  # durable before any line that refers to them
                    self._segments.append(payloads)
                    if self._retention is not None:
                        self._retention.written(payloads)
                self._file.write("".join(texts))
                self._file.flush()
            os.fsync(self._file.fileno())
            self.synced_seq = covered
            # Each state at a boundary, once its line is durable.
            self._due += [(line.seq, line.after) for line in boundaries
                          if isinstance(line.after, State)]

    @property
    def snapshots_due(self) -> bool:
        """Whether `write_snapshots` has snapshots to write."""
        return bool(self._due)

    def write_snapshots(self) -> None:
        """The snapshots of the update boundaries synced since the last call, and the pruning
        they allow (with `keep_updates`): apart from `sync`, so that its caller may first send
        the commands the sync made durable (the driver does). One at a time with `sync`."""
        with self._writing:
            due, self._due = self._due, []
            for seq, state in due:
                assert self._retention is not None
                self._retention.snapshot(seq, state)

    def close(self) -> None:
        self.sync()
        self.write_snapshots()
        self._file.close()
        self._segments.close()

    def _digest(self, state: State | str) -> str:
        """`state_digest(state)` (a digest given as such is itself), remembering the last one
        computed (called by `sync` only, under its lock)."""
        if isinstance(state, str):
            return state
        known, digest = self._digested
        if known is not state:
            digest = state_digest(state)
            self._digested = state, digest
        return digest


class _Line(NamedTuple):
    """An appended event, as `Journal.append` was given it (its line's text, once written)."""

    seq: int
    event: Event
    before: State | str
    after: State | str
    encoded: dict[str, Any] | str | None
    update: int
    """The segment of its payloads."""

    def text(self, digest: Callable[[State | str], str], payloads: list[_Payload]) -> str:
        """The line without its link and newline, its states digested by `digest`; its
        event's payloads are appended to `payloads` and referred to."""
        seq, encoded = self.seq, self.encoded
        before, after = digest(self.before), digest(self.after)
        if packed_fields(type(self.event)):
            return json_text({"seq": seq, "before": before, "after": after,
                              "event": encode_with(self.event, self._referred(payloads))})
        if isinstance(encoded, str):
            if _bare(before) and _bare(after):
                # What json.dumps gives for the head, spelled out (a digest has nothing to
                # escape): a JSONEncoder per line cost more than the rest of the line.
                head = f'{{"seq":{seq:d},"before":"{before}","after":"{after}"'
            else:
                head = json.dumps({"seq": seq, "before": before, "after": after},
                                  separators=(",", ":"))[:-1]
            return f'{head},"event":{encoded}}}'
        return json_text({"seq": seq, "before": before, "after": after,
                          "event": encoded if encoded is not None else encode(self.event)})


    def _referred(self, payloads: list[_Payload]) -> Callable[[str, Any], Any]:
        def refer(name: str, value: Completions | Any) -> dict[str, Any]:
            digest, record = record_of(payload_bytes(value))
            payloads.append(_Payload(self.update, digest, record, value))
            return reference(self.update, digest)
        return refer

    def boundary(self) -> bool:
        """Whether the line commits an update (given its states: the driver's)."""
        return (isinstance(self.before, State) and isinstance(self.after, State)
                and self.after.committed > self.before.committed)


class _Payload(NamedTuple):
    segment: int
    digest: str
    record: bytes
    value: Any
    """The packed field's value (a reply frame: what a snapshot's samples refer to)."""


def _bare(text: str) -> bool:
    """Written in JSON as it is, between quotes (ASCII letters and digits: a digest)."""
    return text.isascii() and text.isalnum()


def write_events(path: Path, config: RunConfig, events: list[Event],
                 key: bytes | None = None, keep_updates: int = 0,
                 settings: dict[str, Any] | None = None,
                 files: dict[str, Any] | None = None) -> Path:
    """Journal `events` (all accepted, in order) as the driver would, digests included: how
    tests and benchmarks make a journal from a run played in-process (e.g. `canonical_run`).
    `settings`, `files`: what its header binds besides the protocol (`Binding`; None: nothing,
    so no reward can be re-scored from it)."""
    writer = Journal(path, config, key, keep_updates, settings, files)
    state = initial_state(config)
    for seq, event in enumerate(events):
        delivery = deliver(state, event)
        writer.append(seq, event, state, delivery.state, sync=delivery.durable)
        state = delivery.state
    writer.close()
    return path


def _drop_torn_tail(path: Path) -> str:
    """Cut a torn last line (a crash mid-write) so that appending starts a fresh line: glued
    to the torn text, the next event would make the journal unreadable. Returns the link of
    the last whole line (CHAIN_START if there is none, or it has none: a reader refuses
    such a journal anyway)."""
    with open(path, "rb+") as file:
        end = file.seek(0, os.SEEK_END)
        keep = end
        while keep > 0:
            start = max(keep - 65536, 0)
            file.seek(start)
            newline = file.read(keep - start).rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            keep = start
        if keep < end:
            file.truncate(keep)
            os.fsync(file.fileno())
        return _last_link(file, keep)


def _last_link(file: BinaryIO, end: int) -> str:
    """The link of the whole line that ends at byte `end` of `file` (a link is ASCII, in the
    line's last bytes)."""
    start = max(end - 128, 0)
    file.seek(start)
    parts = unlinked(file.read(end - start).decode("ascii", "replace").removesuffix("\n"))
    return CHAIN_START if parts is None else parts[1]


def restore(path: Path, key: bytes | None = None) -> tuple[RunConfig, State, int]:
    """The state a journal leads to and the next sequence number, replayed from its newest
    snapshot (if it has any); raises on a departure."""
    return replayed(path, read_contents(path, key, start="last"))


def replayed(path: Path, contents: Contents) -> tuple[RunConfig, State, int]:
    """`restore` of the journal `path` already read."""
    config, entries = contents.config, contents.entries
    state = initial_state(config) if contents.start is None else contents.start.state
    for _entry, _, after in replay(config, entries, start=contents.start):
        if isinstance(after, Departure):
            raise JournalError(f"{path}:{after.line}: {after.reason}")
        state = after
    return config, state, (entries[-1].seq + 1 if entries else 0)


class _Segments:
    """Appends payload records to segment files: each file opened once, its torn tail (a
    crash mid-write) cut first, and a new one's directory entry made durable."""

    OPEN = 2
    """Files kept open: the update in progress's, and the one before (a sync may cover the
    last lines of an update and the first of the next)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._open: dict[int, BinaryIO] = {}

    def append(self, payloads: list[_Payload]) -> None:
        touched: dict[int, BinaryIO] = {}
        for payload in payloads:
            file = touched.get(payload.segment) or self._file(payload.segment)
            touched[payload.segment] = file
            file.write(payload.record)
        for file in touched.values():
            file.flush()
            os.fsync(file.fileno())

    def _file(self, segment: int) -> BinaryIO:
        file = self._open.get(segment)
        if file is None:
            path = segment_path(self.directory, segment)
            existed = path.exists()
            if existed:
                with open(path, "rb+") as damaged:
                    end = scan(path)[1]
                    if damaged.seek(0, os.SEEK_END) > end:
                        damaged.truncate(end)
            file = self._open[segment] = open(path, "ab")  # noqa: SIM115 -- closed by close()
            if not existed:
                _fsync_directory(self.directory)
            for older in sorted(self._open)[:-self.OPEN]:
                self._open.pop(older).close()
        return file

    def close(self) -> None:
        for file in self._open.values():
            file.close()
        self._open.clear()


class _Retention:
    """Snapshots at update boundaries and pruning, keeping the last `keep` committed updates'
    payloads (`Journal`'s module doc)."""

    def __init__(self, directory: Path, keep: int) -> None:
        self.directory, self.keep = directory, keep
        self._where: dict[str, int] = {}
        """The segment of each payload in the segments kept (a snapshot names its frames')."""
        for update, path in sorted(segment_files(directory).items()):
            for digest in scan(path)[0]:
                self._where.setdefault(digest, update)
        self._frames: dict[int, tuple[Completions, str]] = {}
        """The digest of each reply frame written or named since the last snapshot, by id
        (the frame kept beside it, so the id stays its own)."""
        self._ledger: int | None = None
        """Records in the ledger file as this writer left it (None: not written yet)."""
        self._needs: dict[int, int] = {}
        """The first segment each snapshot this writer wrote needs, by its update."""

    def written(self, payloads: list[_Payload]) -> None:
        for payload in payloads:
            self._where.setdefault(payload.digest, payload.segment)
            if isinstance(payload.value, Completions):
                self._frames[id(payload.value)] = (payload.value, payload.digest)

    def snapshot(self, seq: int, state: State) -> None:
        """The snapshot of `state`, after entry `seq`, a boundary: its ledger records durable
        first, then the snapshot itself, atomically; then the pruning it allows."""
        if not at_boundary(state):
            return
        self._write_ledger(state.ledger)
        named: dict[int, tuple[Completions, str]] = {}

        def frame_reference(frame: Completions) -> FrameReference:
            known = self._frames.get(id(frame))
            digest = known[1] if known is not None and known[0] is frame else \
                payload_digest(payload_bytes(frame))
            named[id(frame)] = (frame, digest)
            return self._where[digest], digest

        document = snapshot_document(state, seq, frame_reference)
        self._frames = named
        atomic_write(snapshot_path(self.directory, state.committed),
                     json.dumps(document, separators=(",", ":")).encode())
        self._needs[state.committed] = min([state.committed, *(
            segment for segment, _ in document["frames"])])
        self._prune(state.committed)

    def _write_ledger(self, ledger: tuple[Consumption, ...]) -> None:
        """The ledger file holds every record of `ledger`: written whole (atomically) by a
        writer's first snapshot, whatever an earlier life left, then appended."""
        path = self.directory / LEDGER_FILE
        if self._ledger is None:
            atomic_write(path, "".join(ledger_line(r) + "\n" for r in ledger).encode())
        elif len(ledger) > self._ledger:
            with open(path, "a", encoding="utf-8") as file:
                file.write("".join(ledger_line(r) + "\n" for r in ledger[self._ledger:]))
                file.flush()
                os.fsync(file.fileno())
        self._ledger = len(ledger)

    def _prune(self, committed: int) -> None:
        """Keep the newest snapshot at or before the start of the last `keep` committed updates
        (the oldest a replay may start from) and those after it; the segments from the first
        one its replay or its samples need. Snapshots go first, oldest first: a crash midway
        leaves segments no snapshot needs, never a snapshot without its segments."""
        kept = sorted(update for path in self.directory.glob("snapshot-*.json")
                      if (update := snapshot_update(path)) is not None)
        starts = [update for update in kept if update <= committed - self.keep]
        if not starts:
            return
        oldest = starts[-1]
        for update in kept:
            if update < oldest:
                snapshot_path(self.directory, update).unlink()
                self._needs.pop(update, None)
        needed = self._needs.get(oldest)
        if needed is None:  # written by an earlier life of the run
            frames = json.loads(snapshot_path(self.directory, oldest).read_bytes())["frames"]
            needed = min([oldest, *(segment for segment, _ in frames)])
        for update, path in segment_files(self.directory).items():
            if update < needed:
                path.unlink()
        self._where = {d: s for d, s in self._where.items() if s >= needed}


def _clear(directory: Path) -> None:
    """Remove the segments, snapshots and ledger in `directory` (of a journal that is gone)."""
    if not directory.is_dir():
        return
    for path in directory.iterdir():
        if (path.name == LEDGER_FILE or snapshot_update(path) is not None
                or path in segment_files(directory).values() or path.name.endswith(".tmp")):
            path.unlink()


def _fsync_directory(directory: Path) -> None:
    """Make the entries of `directory` (a file or folder just created) durable."""
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
