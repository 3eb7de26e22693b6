"""The journal's format: what a line holds, and how a journal is read and replayed.

Line 1 is a header with the protocol configuration and what else the run is bound to
(`Binding`: the rest of its configuration, the digests of the model and task files it reads);
then one line per accepted event:
`{"seq": n, "before": digest, "after": digest, "event": <encoded event>, "chain": link}`, and
where a resumed run changed an operational setting, a line saying so:
`{"settings_changed": {dotted key: value}, "chain": link}`; a torn last line (a crash
mid-write) is not an entry.  Replaying the entries through `shell.deliver` reproduces the
driver's state exactly.

Every line, the header included, ends with its `chain` link: BLAKE2b-256 of the previous line's
link and of the line's own text without it, keyed when the run was started with a journal key
(`read_key`). The state digests cover what the model keeps; the chain covers every byte of
every line, so a field the model does not keep (PROTOCOL.md §9.1, "What the journal's digests
cover") cannot be edited unseen either, and with a key a rewritten journal cannot be
re-digested by whoever lacks the key.

An event's token and log-prob payloads are not in its line: the line refers to them by digest
in a segment file of `journal.d/` (`invar.journal_format.payloads`). A run that keeps only its
last updates' payloads (`output.journal_keep_updates`) also keeps a snapshot of the core's
state at the start of each kept update (`invar.journal_format.snapshots`): such a journal is
replayed from the oldest snapshot (validation) or the newest (resume), after its state is
checked against the digest the journal recorded there; the lines before it, whose payloads
are gone, keep their chain and their digests, which are checked without replaying them.

Why a package of its own, between `invar.model` and `invar.runtime`: two layers read journals,
the runtime (`invar.runtime.journal` writes them, and resumes a run from one) and the checker
(`invar-check --trace` validates a real run against the model); the checker must not depend
on the runtime's shell (drivers, transports, learners), and `invar.model` stays free of file
I/O.  Here is reading and checking only; when to write, flush and fsync is the runtime's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from invar.journal_format.errors import ChainError, JournalError, PayloadError, SnapshotError
from invar.journal_format.payloads import Segments, payload_dir, referenced
from invar.journal_format.snapshots import (
    LEDGER_FILE,
    FrameReference,
    ledger_record,
    snapshot_state,
    snapshot_update,
)
from invar.model.completions import Completions
from invar.model.config import RunConfig
from invar.model.errors import ConfigError
from invar.model.invariants import IncrementalInvariants, transition_violations
from invar.model.messages import (
    DecodeError,
    Event,
    RequestsCompleted,
    decode_with,
    packed_fields,
    parse_json,
)
from invar.model.objective import ObjectiveConfig
from invar.model.schedule import prompt_index
from invar.model.shell import Verdict, deliver
from invar.model.state import State, initial_state, state_digest

__all__ = ["CHAIN_START", "JOURNAL_FORMAT", "Binding", "ChainError", "Contents", "Departure",
           "Entry", "JournalError", "PayloadError", "Rescored", "Rescoring", "SnapshotError",
           "Start", "header_text", "leaves", "link", "linked", "payload_dir",
           "protocol_from_dict", "protocol_to_dict", "read", "read_contents", "read_key",
           "replay", "rescore", "settings_text", "unlinked"]

JOURNAL_FORMAT = 7
"""2: state digests hash a sample's slot and the ledger without reprs; 3: a state's histories
(commit digests, publications, evaluations, checkpoints) enter its digest as their length and
hash chain, so a digest's cost does not grow with the run (PROTOCOL.md §3); 4: sampling seeds
and plan keys are words of one SHAKE-128 stream per prompt group and per update (PROTOCOL.md
§2.2): a run journalled before would re-issue its requests with other seeds; 5: every line
ends with its `chain` link (module doc), and the header says whether the chain is keyed; the
objective's configuration has `aggregation` (sequence or token mean), in every state digest;
6: an event's packed fields (completions, log-prob matrices) are references to payloads in
segment files (`invar.journal_format.payloads`), and pruned runs keep snapshots; 7: the header
binds the run's whole configuration (`settings`) and the digests of the files it reads
(`files`: the model, its tokenizer and config), and a resume's operational changes are lines of
their own (`settings_changed`), so a run's history is judged by what its chain binds, not by
its config.json."""

CHAIN_START = ""
"""The link before the header's."""
_CHAIN_OPEN = ',"chain":"'
_CHAIN_TAIL = len(_CHAIN_OPEN) + 64 + len('"}')
"""Characters of a line after its text without the link: `,"chain":"<64 hex digits>"}`."""
KEY_MIN_BYTES = 16
"""A key file shorter than this is refused: too few bytes to be a secret."""


def link(key: bytes | None, previous: str, text: str) -> str:
    """The chain link of a line whose text without its link is `text` (a JSON object), after
    the line whose link is `previous`: BLAKE2b-256, keyed with `key` when there is one."""
    digest = hashlib.blake2b(previous.encode(), digest_size=32, key=key or b"",
                             person=b"invar-journal")
    digest.update(text.encode())
    return digest.hexdigest()


def linked(key: bytes | None, previous: str, text: str) -> tuple[str, str]:
    """The line (its newline included) that `text`, a JSON object without its link, becomes
    after the line whose link is `previous`; and its link."""
    chain = link(key, previous, text)
    return f'{text[:-1]}{_CHAIN_OPEN}{chain}"}}\n', chain


def unlinked(line: str) -> tuple[str, str] | None:
    """A line's text without its link, and the link (None: the line has none)."""
    if len(line) <= _CHAIN_TAIL or not line.endswith('"}'):
        return None
    head, tail = line[:-_CHAIN_TAIL], line[-_CHAIN_TAIL:]
    if not tail.startswith(_CHAIN_OPEN):
        return None
    return head + "}", tail[len(_CHAIN_OPEN):-2]


def read_key(path: Path, run_dir: Path) -> bytes:
    """The chain key that key file `path` holds (a hash of its bytes: any file of at least
    KEY_MIN_BYTES random bytes is a key). Refused, naming the file, if it cannot be read, is
    not a regular file, is too short, can be read by others than its owner, or lies inside
    the run directory `run_dir` by its path, a symbolic link or a hard link (a key beside the
    journal protects nothing: whoever can rewrite the journal can read it)."""
    inside = f"{path}: the journal key lies inside the run directory {run_dir}"
    if Path(path).resolve().is_relative_to(Path(run_dir).resolve()):
        raise JournalError(f"{inside}; keep it where whoever can write the run cannot read it")
    try:
        # Non-blocking: opening a FIFO would wait for a writer (a file's reads never block).
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as file:
            status = os.fstat(file.fileno())
            if not stat.S_ISREG(status.st_mode):
                raise JournalError(f"{path}: a journal key is a regular file")
            if status.st_mode & 0o077:
                raise JournalError(f"{path}: others than its owner can read or write the "
                                   f"journal key (mode {stat.S_IMODE(status.st_mode):04o}): "
                                   f"chmod 600 {path}")
            if status.st_nlink > 1 and _linked_inside(status, Path(run_dir)):
                raise JournalError(f"{inside} (a hard link to it); keep it where whoever can "
                                   "write the run cannot read it")
            material = file.read()
    except OSError as error:
        raise JournalError(f"{path}: cannot read the journal key: "
                           f"{error.strerror or error}") from None
    if len(material) < KEY_MIN_BYTES:
        raise JournalError(f"{path}: a journal key holds at least {KEY_MIN_BYTES} bytes, this "
                           f"file {len(material)} (make one with `head -c 32 /dev/urandom`)")
    return hashlib.blake2b(material, digest_size=32, person=b"invar-journalkey").digest()


def _linked_inside(status: os.stat_result, run_dir: Path) -> bool:
    """Whether a file in `run_dir` (symbolic links not followed) is the file `status` is of."""
    for folder, _, names in os.walk(run_dir):
        for name in names:
            try:
                other = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:  # removed since it was listed
                continue
            if (other.st_dev, other.st_ino) == (status.st_dev, status.st_ino):
                return True
    return False


def header_text(config: RunConfig, keyed: bool, settings: dict[str, Any] | None = None,
                files: dict[str, Any] | None = None) -> str:
    """The header line's text without its link (`Binding` says what `settings` and `files`
    are)."""
    return json.dumps({"journal": JOURNAL_FORMAT, "protocol": protocol_to_dict(config),
                       "settings": settings, "files": files or {}, "keyed": keyed},
                      separators=(",", ":"))


def settings_text(changes: dict[str, Any]) -> str:
    """The text without its link of the line that records a resume's `changes` (dotted key:
    new value) to the settings the journal binds."""
    return json.dumps({SETTINGS_CHANGED: changes}, separators=(",", ":"))


SETTINGS_CHANGED = "settings_changed"


@dataclass(frozen=True)
class Binding:
    """What a journal binds besides its protocol, as its header and lines say (the runtime
    gives them their meaning: `invar.runtime.binding`)."""

    settings: dict[str, Any] | None
    """The run's configuration apart from its protocol, as nested tables (None: a journal
    written without one, e.g. by `write_events` in tests: nothing can be re-scored from it)."""
    files: dict[str, Any]
    """The digests of the files the configuration names, by dotted key."""
    changes: tuple[tuple[int, dict[str, Any]], ...] = ()
    """Each `settings_changed` line: its number, and the changes it records."""

    def history(self) -> list[dict[str, Any]]:
        """The settings, by dotted key, as the header binds them and after each change."""
        if self.settings is None:
            return []
        current = leaves(self.settings)
        history = [current]
        for _, changes in self.changes:
            current = {**current, **changes}
            history.append(current)
        return history


def leaves(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every leaf of nested tables, by dotted key."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@dataclass(frozen=True)
class Entry:
    seq: int
    before: str
    after: str
    event: Event | None
    """None: an event at or before the replay's start (`Contents.start`), not read: its line's
    chain and digests are checked, its payloads may be gone (pruned)."""
    line: int = 0
    """Its line's number in the file (the header is line 1)."""


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


@dataclass(frozen=True)
class Start:
    """Where a replay starts when it does not start from the initial state: a snapshot, its
    state checked against the digest the journal recorded after entry `seq`."""

    seq: int
    state: State
    path: Path
    """The snapshot's file."""
    frames: tuple[tuple[int, Completions], ...]
    """The reply frames its samples are rows of, each with the journal line that brought it
    (what re-scoring reads beside the entries it replays)."""


@dataclass(frozen=True)
class Contents:
    """A journal as read: its configuration, its entries, `torn`: the bytes after the last
    newline (a line cut by a crash mid-write; empty when the file ends with a whole line), and
    `start`: the snapshot a replay starts from (None: the initial state; then every event was
    read)."""

    config: RunConfig
    entries: list[Entry]
    torn: str = ""
    start: Start | None = None
    binding: Binding = Binding(None, {})


StartAt = Literal["first", "last"]
"""Where `read_contents` starts the replay: "first", the initial state when every payload is
kept, else the oldest snapshot (what validation replays: all that is kept); "last", the newest
snapshot (what a resume replays: the least)."""


def read(path: Path, key: bytes | None = None) -> tuple[RunConfig, list[Entry]]:
    """The configuration and entries; a torn final line (a crash mid-write) is dropped."""
    contents = read_contents(path, key)
    return contents.config, contents.entries


def read_contents(path: Path, key: bytes | None = None, start: StartAt = "first") -> Contents:
    """The whole journal; raises `JournalError` naming the file (and line) when it cannot be
    read: not UTF-8, empty, a header that is not one or of a format this version does not
    know, a line before the last that is not a whole entry; `ChainError` at the first line
    whose link does not match (`key`: the journal's key, from `read_key`; a keyed journal
    cannot be read without it, nor an unkeyed one with one); `PayloadError` naming a segment
    file that a line replayed needs and is missing, or holds other bytes than the line's
    digest names; `SnapshotError` naming a snapshot that does not hold the state the journal
    recorded at its line. `start`: `StartAt`."""
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
        header = parse_json(lines[0])
        version = header["journal"]
        if version != JOURNAL_FORMAT:
            raise JournalError(f"{path}:1: journal format {version!r}; this version of invar "
                               f"reads format {JOURNAL_FORMAT} only (validate or resume it with "
                               f"the version that wrote it)")
        config = protocol_from_dict(header["protocol"])
        keyed = header["keyed"]
        settings, files = header["settings"], header["files"]
        if not (settings is None or isinstance(settings, dict)) or not isinstance(files, dict):
            raise TypeError("settings: expected an object or null, files: an object")
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        if isinstance(error, JournalError):
            raise
        raise JournalError(f"{path}:1: bad header: {error!r}") from None
    if keyed is True and key is None:
        raise JournalError(f"{path}:1: the journal is keyed (its run was started with "
                           f"--journal-key): it is read with its key")
    if keyed is not True and key is not None:
        raise ChainError(f"{path}:1: the journal is not keyed, but a key was given: it was "
                         f"written without one, or rewritten without the key")
    chain = _follow(path, 1, key, CHAIN_START, lines[0])
    read_lines = []
    changes: list[tuple[int, dict[str, Any]]] = []
    for number, line in enumerate(lines[1:], start=2):
        try:
            record = parse_json(line)
            if SETTINGS_CHANGED in record:
                changed = record[SETTINGS_CHANGED]
                if not isinstance(changed, dict) or not changed or settings is None:
                    raise TypeError(f"{SETTINGS_CHANGED}: expected changes to the settings "
                                    f"the header binds")
                changes.append((number, changed))
            else:
                # Payloads stay references until the start of the replay is known.
                event = decode_with(record["event"], _reference)
                read_lines.append(Entry(record["seq"], record["before"], record["after"],
                                        event, number))
        except (ValueError, KeyError, TypeError, DecodeError) as error:
            raise JournalError(f"{path}:{number}: {error}") from None
        chain = _follow(path, number, key, chain, line)
    segments = Segments(payload_dir(path))
    begin = _start(path, config, read_lines, segments, start)
    first = 0 if begin is None else begin.seq + 1
    missing = next(((segment, entry.line) for entry in read_lines[first:]
                    for segment, _ in _payloads(entry) if not segments.exists(segment)), None)
    if missing is not None:
        pruned = "" if begin is None else f"; the replay starts at {begin.path.name}"
        raise PayloadError(f"{segments.path(missing[0])}: missing (journal line {missing[1]} "
                           f"refers to it{pruned})")
    entries = [dataclasses.replace(entry, event=None if index < first else
                                   _resolved(entry.event, segments, entry.line))
               for index, entry in enumerate(read_lines)]
    return Contents(config, entries, torn, begin, Binding(settings, files, tuple(changes)))


def _reference(name: str, value: Any, where: str) -> FrameReference:
    """A packed field as a line holds it: its payload's reference, not yet read."""
    return referenced(value, where)


def _payloads(entry: Entry) -> list[FrameReference]:
    """The payload references of a line read with `_reference`."""
    event = entry.event
    return [getattr(event, name) for name in packed_fields(type(event))
            if getattr(event, name) is not None]


def _resolved(event: Any, segments: Segments, line: int) -> Any:
    """`event` (read with `_reference`) with its payloads read from their segments."""
    fields = packed_fields(type(event))
    if not fields:
        return event
    loaded = {}
    for name in fields:
        if getattr(event, name) is not None:
            segment, digest = getattr(event, name)
            loaded[name] = segments.load(segment, digest, line,
                                         completions=type(event) is RequestsCompleted)
    return dataclasses.replace(event, **loaded)


def _start(path: Path, config: RunConfig, entries: list[Entry], segments: Segments,
           start: StartAt) -> Start | None:
    """The snapshot the replay starts from (`StartAt`); None: the initial state. Every
    snapshot kept is read and checked, whichever one the replay starts from: a resume relies
    on the older ones too (its writer prunes by them), and a resume and a validation read the
    same files and agree. A snapshot for a line beyond the journal's end (its lines cut since)
    is not one."""
    snapshots = sorted((update, item) for item in segments.directory.glob("snapshot-*.json")
                       if (update := snapshot_update(item)) is not None)
    ledger = _Ledger(segments.directory / LEDGER_FILE)
    checked = []
    for _, candidate in snapshots:
        try:
            document = parse_json(candidate.read_bytes())
        except (OSError, ValueError) as error:
            raise SnapshotError(f"{candidate}: cannot be read as a snapshot: {error}") from None
        seq = document.get("seq") if isinstance(document, dict) else None
        if type(seq) is not int or seq < 0:
            raise SnapshotError(f"{candidate}: seq: expected an entry's number")
        if seq < len(entries):
            checked.append(_snapshot(candidate, document, seq, config, entries, segments,
                                     ledger))
    if start == "first" and all(segments.exists(segment) for entry in entries
                                for segment, _ in _payloads(entry)):
        return None
    if not checked:
        return None
    return checked[0] if start == "first" else checked[-1]


def _snapshot(path: Path, document: dict[str, Any], seq: int, config: RunConfig,
              entries: list[Entry], segments: Segments, ledger: _Ledger) -> Start:
    """The snapshot in `path` (read as `document`), at entry `seq`: its frames must be reply
    frames of the journal's lines up to there, and its state the one the journal recorded."""
    brought: dict[FrameReference, int] = {}
    for entry in entries[:seq + 1]:
        if isinstance(entry.event, RequestsCompleted):
            brought.setdefault(entry.event.completions, entry.line)  # type: ignore[arg-type]
    frames: list[tuple[int, Completions]] = []

    def frame(reference: FrameReference) -> Completions:
        line = brought.get(reference)
        if line is None:
            raise SnapshotError(f"{path}: names frame {reference[1][:16]} of segment "
                                f"{reference[0]}, which no line up to its own brings")
        loaded = segments.load(*reference, line, completions=True)
        assert isinstance(loaded, Completions)
        frames.append((line, loaded))
        return loaded

    held = document.get("ledger")
    state = snapshot_state(document, config, ledger.records(held if type(held) is int else 0),
                           frame, str(path))
    recorded, digest = entries[seq].after, state_digest(state)
    if entries[seq].seq != seq or digest != recorded:
        raise SnapshotError(f"{path}: holds a state of digest {digest}, the journal recorded "
                            f"{recorded} after entry {seq} (line {entries[seq].line}): the "
                            f"snapshot or "
                            f"the ledger changed after they were written, or belong to another "
                            f"journal")
    return Start(seq, state, path, tuple(frames))


class _Ledger:
    """The ledger file, read once for every snapshot checked against it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._records: list[Any] = []
        self._lines: list[str] | None = None

    def records(self, count: int) -> list[Any]:
        """Its first `count` records (a torn last line is not one)."""
        if count == 0:
            return []
        if self._lines is None:
            try:
                self._lines = self.path.read_text(encoding="utf-8").split("\n")[:-1]
            except (OSError, UnicodeDecodeError) as error:
                raise SnapshotError(f"{self.path}: cannot be read: {error}") from None
        if len(self._lines) < count:
            raise SnapshotError(f"{self.path}: holds {len(self._lines)} ledger records, a "
                                f"snapshot needs {count}")
        self._records += [ledger_record(line, f"{self.path}:{number}") for number, line in
                          enumerate(self._lines[len(self._records):count],
                                    start=len(self._records) + 1)]
        return self._records[:count]


def _follow(path: Path, number: int, key: bytes | None, previous: str, line: str) -> str:
    """The link of line `number` (its text `line`) after the link `previous`, checked."""
    parts = unlinked(line)
    if parts is not None and link(key, previous, parts[0]) == parts[1]:
        return parts[1]
    what = "has no chain link" if parts is None else \
        "has a chain link that does not match its text and the lines before it"
    raise ChainError(f"{path}:{number}: the line {what}: edited after it was written"
                     f"{', or written with another key' if key else ''}")


@dataclass(frozen=True)
class Departure:
    """Where a journal stops matching the model."""

    seq: int
    line: int
    reason: str


def replay(config: RunConfig, entries: list[Entry], check_invariants: bool = False,
           start: Start | None = None) -> Iterator[tuple[Entry, State, State | Departure]]:
    """Deliver entries with `shell.deliver`; yields (entry, before, after-or-departure), stops
    at the first departure: a sequence number out of order (entries are numbered 0, 1, 2...),
    a digest that differs, or an event the model refuses or counts a no-op (a driver journals
    accepted events only). With `check_invariants`, every state invariant (incrementally:
    `IncrementalInvariants`, exactly the same verdicts) and every transition invariant.

    From `start` (a snapshot: `Contents.start`), the entries up to its own are not delivered
    (nor yielded): their numbers are checked, and that each one's digest before is the one
    before's after, the first's the initial state's, the last's after the snapshot's."""
    state = initial_state(config) if start is None else start.state
    digest = state_digest(state)  # the digest of `state`: the previous entry's after
    invariants = IncrementalInvariants() if check_invariants else None
    first = 0 if start is None else start.seq + 1
    previous = digest if start is None else state_digest(initial_state(config))
    for index, entry in enumerate(entries[:first]):
        line = entry.line
        reason = (f"sequence number {entry.seq} where {index} follows"
                  if entry.seq != index else
                  f"state digest before is {previous}, journal says {entry.before}"
                  if entry.before != previous else
                  f"the snapshot's state digest is {digest}, journal says {entry.after}"
                  if index == first - 1 and entry.after != digest else "")
        if reason:
            yield entry, state, Departure(entry.seq, line, reason)
            return
        previous = entry.after
    for index, entry in enumerate(entries[first:], start=first):
        line, before = entry.line, digest
        if entry.before != before:
            yield entry, state, Departure(entry.seq, line, f"state digest before is {before}, "
                                          f"journal says {entry.before}")
            return
        if entry.seq != index:
            yield entry, state, Departure(entry.seq, line, f"sequence number {entry.seq} where "
                                          f"{index} follows")
            return
        if entry.event is None:
            yield entry, state, Departure(entry.seq, line, "its event was not read (it lies "
                                          "before the snapshot the journal was read from)")
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


@dataclass(frozen=True)
class Rescored:
    """A journalled reward that is not the verifier's verdict on the journalled tokens."""

    line: int
    request: tuple[int, int, int]
    """(batch, prompt, sample)."""
    journalled: float
    rescored: float

    def __str__(self) -> str:
        batch, prompt, sample = self.request
        return (f"the reward of sample (batch {batch}, prompt {prompt}, sample {sample}) is "
                f"{self.journalled!r} in the journal, {self.rescored!r} by the task's verifier")


@dataclass(frozen=True)
class Rescoring:
    """What re-scoring found."""

    scored: int
    failures: int
    """Rewards journalled as the task's failure reward where the verifier now gives another: a
    call that failed or timed out in the run gets the failure reward (`verifier.verify`), and
    cannot be told from one that would fail again."""
    mismatch: Rescored | None
    """The first other difference (None: none)."""


def rescore(config: RunConfig, entries: list[Entry],
            score: Callable[[int, tuple[int, ...]], float], failure_reward: float,
            from_batch: int = 0, start: Start | None = None) -> Rescoring:
    """Score every journalled completion of batch `from_batch` or later again,
    `score(prompt_index, tokens)` being the task's verifier on a train prompt, and compare it
    with the journalled reward, bit for bit (the same function of the same arguments); a
    journalled `failure_reward` is counted apart (`Rescoring.failures`). The entries read
    (`Entry.event`), and the frames of the snapshot a replay starts from (`start`)."""
    scored = failures = 0
    frames = [*(start.frames if start is not None else ()),
              *((entry.line, entry.event.completions) for entry in entries
                if isinstance(entry.event, RequestsCompleted))]
    for line, completions in frames:
        for row, (batch, prompt, sample) in enumerate(completions.requests.tolist()):
            if batch < from_batch:
                continue
            tokens = tuple(completions.tokens.row(row).tolist())
            verdict = float(score(prompt_index(config, batch, prompt), tokens))
            journalled = float(completions.rewards[row])
            scored += 1
            if verdict == journalled:
                continue
            if journalled == failure_reward:
                failures += 1
                continue
            return Rescoring(scored, failures,
                             Rescored(line, (batch, prompt, sample), journalled, verdict))
    return Rescoring(scored, failures, None)
