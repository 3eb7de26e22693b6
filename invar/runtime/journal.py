"""The driver's journal: every accepted event, as JSON lines, with the state digest around it.

Line 1 is a header with the protocol configuration; then one line per accepted event:
`{"seq": n, "before": digest, "after": digest, "event": <encoded event>, "chain": link}` (the
link chains every line to the ones before it, keyed when the writer has a key:
`invar.journal_format`). Lines are kept in
memory as they are appended and written out as text, with an fsync, by `sync`: when
`shell.deliver` says the delivery is durable (before a Commit, Publish or ReleaseVersion goes
out, and when a commit or a learner start is accepted) and at close. So after a crash the file
holds at least every event up to the last such point (the protocol re-sends whatever
followed), and appending costs the event path no system call, no encoding and no digest (a
line may be given the states themselves, digested when it is written); a torn last line is
ignored on reading. The driver runs `sync` in a thread while it appends further lines.

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
    header_text,
    linked,
    protocol_from_dict,
    protocol_to_dict,
    read,
    read_contents,
    read_key,
    replay,
    unlinked,
)
from invar.model.config import RunConfig
from invar.model.messages import Event, encode, json_text
from invar.model.shell import deliver
from invar.model.state import State, initial_state, state_digest

__all__ = [
    "ChainError",
    "Contents",
    "Departure",
    "Entry",
    "Journal",
    "JournalError",
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


class Journal:
    """Append-only writer: `append` from one thread, `sync` from another (one at a time).

    `key`: the chain's key (`read_key`), None for an unkeyed chain. A journal that exists is
    appended to, its chain going on from its last whole line (its caller has read it with the
    same key: `restore`)."""

    def __init__(self, path: Path, config: RunConfig, key: bytes | None = None) -> None:
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
        if path.exists():
            self._chain = _drop_torn_tail(path)
        fresh = not path.exists() or path.stat().st_size == 0
        # The append handle lives as long as the writer (closed by close()).
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115
        if fresh:
            self._unwritten.append(header_text(config, keyed=key is not None))
            self.sync()

    def append(self, seq: int, event: Event, before: State | str, after: State | str,
               sync: bool, encoded: dict[str, Any] | str | None = None) -> None:
        """`before`, `after`: the states around the event (digested when the line is written:
        states are immutable values), or their digests.
        `encoded`: the event's encoding when the caller already has it as received, as a
        dict or as its compact JSON text (written as it is: encoding it again would cost
        more than the core). The line is kept as it is given and written out as text by
        `sync`, in the thread that syncs: the event path pays no encoding and no digest.
        `sync`: make this line durable before returning."""
        with self._taking:
            self._unwritten.append(_Line(seq, event, before, after, encoded))
            self._last_seq = seq
        if sync:
            self.sync()

    def sync(self) -> None:
        """Write every line appended so far and make it durable (lines appended while it
        runs, from another thread, wait for the next sync: `synced_seq` does not count
        them)."""
        with self._writing:
            with self._taking:
                lines, self._unwritten = self._unwritten, []
                covered = self._last_seq
            if lines:
                # CPU time: this thread also waits for the GIL, which is no one's work.
                began = time.thread_time()
                texts = []
                for line in lines:
                    text, self._chain = linked(self._key, self._chain, line if isinstance(
                        line, str) else line.text(self._digest))
                    texts.append(text)
                self.text_seconds += time.thread_time() - began
                self._file.write("".join(texts))
                self._file.flush()
            os.fsync(self._file.fileno())
            self.synced_seq = covered

    def close(self) -> None:
        self.sync()
        self._file.close()

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

    def text(self, digest: Callable[[State | str], str]) -> str:
        """The line without its link and newline, its states digested by `digest`."""
        seq, encoded = self.seq, self.encoded
        before, after = digest(self.before), digest(self.after)
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


def _bare(text: str) -> bool:
    """Written in JSON as it is, between quotes (ASCII letters and digits: a digest)."""
    return text.isascii() and text.isalnum()


def write_events(path: Path, config: RunConfig, events: list[Event],
                 key: bytes | None = None) -> Path:
    """Journal `events` (all accepted, in order) as the driver would, digests included: how
    tests and benchmarks make a journal from a run played in-process (e.g. `canonical_run`)."""
    writer = Journal(path, config, key)
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
    """The state a journal leads to and the next sequence number; raises on a departure."""
    config, entries = read(path, key)
    return replayed(path, config, entries)


def replayed(path: Path, config: RunConfig, entries: list[Entry]
             ) -> tuple[RunConfig, State, int]:
    """`restore` of the journal `path` already read: `config` and `entries`."""
    state = initial_state(config)
    for _entry, _, after in replay(config, entries):
        if isinstance(after, Departure):
            raise JournalError(f"{path}:{after.line}: {after.reason}")
        state = after
    return config, state, (entries[-1].seq + 1 if entries else 0)
