"""The driver's journal: every accepted event, as JSON lines, with the state digest around it.

Line 1 is a header with the protocol configuration; then one line per accepted event:
`{"seq": n, "before": digest, "after": digest, "event": <encoded event>}`. The file is
flushed on every line and fsynced when `shell.deliver` says the delivery is durable (before a
Commit, Publish or ReleaseVersion goes out, and when a commit or a learner start is accepted),
so after a crash it holds at least every event up to the last such point; a torn last line is
ignored on reading.

Replaying the journal through `shell.deliver` reproduces the driver's state exactly: that is
how the driver resumes, and how `invar-check --trace` validates a real run against the model.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from invar.model.config import RunConfig
from invar.model.errors import ConfigError
from invar.model.invariants import IncrementalInvariants, transition_violations
from invar.model.messages import DecodeError, Event, decode, encode
from invar.model.objective import ObjectiveConfig
from invar.model.shell import Verdict, deliver
from invar.model.state import State, initial_state, state_digest

JOURNAL_FORMAT = 1


@dataclass(frozen=True)
class Entry:
    seq: int
    before: str
    after: str
    event: Event


class Journal:
    """Append-only writer."""

    def __init__(self, path: Path, config: RunConfig) -> None:
        self.path = path
        self.synced_seq: int | None = None
        """The seq of the newest line an fsync covers (None: none appended by this writer)."""
        self._last_seq: int | None = None
        if path.exists():
            _drop_torn_tail(path)
        fresh = not path.exists() or path.stat().st_size == 0
        # The append handle lives as long as the writer (closed by close()).
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115
        if fresh:
            self._write({"journal": JOURNAL_FORMAT, "protocol": protocol_to_dict(config)})
            self.sync()

    def append(self, seq: int, event: Event, before: str, after: str, sync: bool,
               encoded: dict[str, Any] | str | None = None) -> None:
        """`encoded`: the event's encoding when the caller already has it as received, as a
        dict or as its compact JSON text (written as it is: a worker's frame of completions is
        most of a run's journal, and encoding it again would cost more than the core)."""
        if isinstance(encoded, str):
            record = {"seq": seq, "before": before, "after": after}
            head = json.dumps(record, separators=(",", ":"))
            self._file.write(f'{head[:-1]},"event":{encoded}}}\n')
            self._file.flush()
        else:
            self._write({"seq": seq, "before": before, "after": after,
                         "event": encoded if encoded is not None else encode(event)})
        self._last_seq = seq
        if sync:
            self.sync()

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()

    def sync(self) -> None:
        os.fsync(self._file.fileno())
        self.synced_seq = self._last_seq

    def close(self) -> None:
        self._file.close()


def write_events(path: Path, config: RunConfig, events: list[Event]) -> Path:
    """Journal `events` (all accepted, in order) as the driver would, digests included: how
    tests and benchmarks make a journal from a run played in-process (e.g. `canonical_run`)."""
    writer = Journal(path, config)
    state = initial_state(config)
    digest = state_digest(state)
    for seq, event in enumerate(events):
        delivery = deliver(state, event)
        after = state_digest(delivery.state)
        writer.append(seq, event, digest, after, sync=delivery.durable)
        state, digest = delivery.state, after
    writer.close()
    return path


def _drop_torn_tail(path: Path) -> None:
    """Cut a torn last line (a crash mid-write) so that appending starts a fresh line: glued
    to the torn text, the next event would make the journal unreadable."""
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


def protocol_to_dict(config: RunConfig) -> dict[str, Any]:
    data = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    data["objective"] = dataclasses.asdict(config.objective)
    return data


def protocol_from_dict(data: dict[str, Any]) -> RunConfig:
    try:
        objective = ObjectiveConfig(**data.get("objective", {}))
        fields = {k: v for k, v in data.items() if k != "objective"}
        return RunConfig(**fields, objective=objective).validate()
    except TypeError as error:
        raise ConfigError(("journal header",), str(error)) from None


class JournalError(ValueError):
    """A journal that cannot be read: names the line."""


@dataclass(frozen=True)
class Contents:
    """A journal as read: its configuration, its entries, and `torn`: the bytes after the last
    newline (a line cut by a crash mid-write; empty when the file ends with a whole line)."""

    config: RunConfig
    entries: list[Entry]
    torn: str = ""


def read(path: Path) -> tuple[RunConfig, list[Entry]]:
    """The configuration and entries; a torn final line (a crash mid-write) is dropped."""
    contents = read_contents(path)
    return contents.config, contents.entries


def read_contents(path: Path) -> Contents:
    """The whole journal; raises `JournalError` naming the file (and line) when it cannot be
    read: not UTF-8, empty, a header that is not one or of a format this version does not
    know, a line before the last that is not a whole entry."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise JournalError(f"{path}: not a journal (not UTF-8: byte {error.start})") from None
    lines = text.split("\n")
    # Every line is written with its newline: text after the last newline is a torn write.
    torn = lines.pop()
    if not lines:
        raise JournalError(f"{path}: empty journal")
    try:
        header = json.loads(lines[0])
        version = header["journal"]
        if version != JOURNAL_FORMAT:
            raise JournalError(f"{path}:1: journal format {version!r}; this version of invar "
                               f"reads format {JOURNAL_FORMAT}")
        config = protocol_from_dict(header["protocol"])
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        if isinstance(error, JournalError):
            raise
        raise JournalError(f"{path}:1: bad header: {error!r}") from None
    entries = []
    for number, line in enumerate(lines[1:], start=2):
        try:
            record = json.loads(line)
            entries.append(Entry(record["seq"], record["before"], record["after"],
                                 decode(record["event"])))
        except (ValueError, KeyError, TypeError, DecodeError) as error:
            raise JournalError(f"{path}:{number}: {error}") from None
    return Contents(config, entries, torn)


@dataclass(frozen=True)
class Departure:
    """Where a journal stops matching the model."""

    seq: int
    line: int
    reason: str


def replay(config: RunConfig, entries: list[Entry], check_invariants: bool = False
           ) -> Iterator[tuple[Entry, State, State | Departure]]:
    """Deliver entries with `shell.deliver`; yields (entry, before, after-or-departure), stops
    at the first departure: a sequence number out of order (entries are numbered 0, 1, 2...),
    a digest that differs, or an event the model refuses or counts a no-op (a driver journals
    accepted events only). With `check_invariants`, every state invariant (incrementally:
    `IncrementalInvariants`, exactly the same verdicts) and every transition invariant."""
    state = initial_state(config)
    digest = state_digest(state)  # the digest of `state`: the previous entry's after
    invariants = IncrementalInvariants() if check_invariants else None
    for line, entry in enumerate(entries, start=2):
        before = digest
        if entry.before != before:
            yield entry, state, Departure(entry.seq, line, f"state digest before is {before}, "
                                          f"journal says {entry.before}")
            return
        if entry.seq != line - 2:
            yield entry, state, Departure(entry.seq, line, f"sequence number {entry.seq} where "
                                          f"{line - 2} follows")
            return
        delivery = deliver(state, entry.event)
        if delivery.verdict is Verdict.REFUSED:
            yield entry, state, Departure(entry.seq, line,
                                          f"the model refuses the event: {delivery.error}")
            return
        if delivery.verdict is Verdict.NOOP:
            yield entry, state, Departure(entry.seq, line, "the model counts the event a no-op "
                                          "(a duplicate or late delivery), not an accepted one")
            return
        after = state_digest(delivery.state)
        if entry.after != after:
            yield entry, state, Departure(entry.seq, line, f"state digest after is {after}, "
                                          f"journal says {entry.after}")
            return
        if invariants is not None:
            broken = {**invariants.violations(delivery.state),
                      **transition_violations(state, delivery.commands, delivery.state)}
            if broken:
                name, why = next(iter(broken.items()))
                yield entry, state, Departure(entry.seq, line, f"invariant {name}: {why}")
                return
        yield entry, state, delivery.state
        state, digest = delivery.state, after


def restore(path: Path) -> tuple[RunConfig, State, int]:
    """The state a journal leads to and the next sequence number; raises on a departure."""
    config, entries = read(path)
    state = initial_state(config)
    for _entry, _, after in replay(config, entries):
        if isinstance(after, Departure):
            raise JournalError(f"{path}:{after.line}: {after.reason}")
        state = after
    return config, state, (entries[-1].seq + 1 if entries else 0)
