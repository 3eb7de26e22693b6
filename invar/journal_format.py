"""The journal's format: what a line holds, and how a journal is read and replayed.

Line 1 is a header with the protocol configuration; then one line per accepted event:
`{"seq": n, "before": digest, "after": digest, "event": <encoded event>}`; a torn last line (a
crash mid-write) is not an entry.  Replaying the entries through `shell.deliver` reproduces the
driver's state exactly.

Why a module of its own, between `invar.model` and `invar.runtime`: two layers read journals,
the runtime (`invar.runtime.journal` writes them, and resumes a run from one) and the checker
(`invar-check --trace` validates a real run against the model); the checker must not depend
on the runtime's shell (drivers, transports, learners), and `invar.model` stays free of file
I/O.  Here is reading and checking only; when to write, flush and fsync is the runtime's.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from invar.model.config import RunConfig
from invar.model.errors import ConfigError
from invar.model.invariants import IncrementalInvariants, transition_violations
from invar.model.messages import DecodeError, Event, decode
from invar.model.objective import ObjectiveConfig
from invar.model.shell import Verdict, deliver
from invar.model.state import State, initial_state, state_digest

JOURNAL_FORMAT = 5
"""2: state digests hash a sample's slot and the ledger without reprs; 3: a state's histories
(commit digests, publications, evaluations, checkpoints) enter its digest as their length and
hash chain, so a digest's cost does not grow with the run (PROTOCOL.md §3); 4: sampling seeds
and plan keys are words of one SHAKE-128 stream per prompt group and per update (PROTOCOL.md
§2.2): a run journalled before would re-issue its requests with other seeds; 5: the
objective's configuration has `aggregation` (sequence or token mean), in every state digest."""


@dataclass(frozen=True)
class Entry:
    seq: int
    before: str
    after: str
    event: Event


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
