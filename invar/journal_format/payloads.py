"""Token and log-prob payloads, kept beside the journal's lines in per-update segment files.

An event's packed fields (`messages.packed_fields`: a reply frame's completions, a log-prob
matrix) are most of a run's journal, one value per generated token each. The journal keeps them
out of its lines: each goes to the segment file of the update its line belongs to,
`journal.d/segment-000012.bin` beside `journal.jsonl`, and the line holds a reference,
`{"segment": 12, "payload": "<BLAKE2b-256 of the payload's bytes>"}`. The line's chain link
covers the reference and its state digests are what they were, so the chain and the digests
stay checkable when a segment is gone (pruned: `output.journal_keep_updates`), and the digest
binds the reference to exactly one content.

A payload is little-endian 8-byte words: a frame as its row count and `completions_to_bytes`'
columns, a matrix as its row count, its row lengths and its float64 values. It is stored
compressed: its words' bytes grouped by position (every word's first byte, then every second
byte...: the sign and exponent bytes of log-probs and the high bytes of token ids are alike and
compress; a mantissa's low bytes do not), then zlib. A segment file is a sequence of records:
`RECORD_MAGIC`, the stored length, the payload's length and its digest (`RECORD_HEADER`), then
the stored bytes; records are written and fsynced before the lines that refer to them, and a
record cut short at the end of a file (a crash mid-write) is none.
"""

from __future__ import annotations

import hashlib
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from invar.journal_format.errors import PayloadError
from invar.model.completions import Completions
from invar.model.messages import DecodeError, completions_from_bytes, completions_to_bytes
from invar.model.ragged import FLOAT, Ragged

RECORD_MAGIC = b"IVP1"
RECORD_HEADER = struct.Struct("<4sQQ32s")
"""Magic, stored length, payload length, payload digest."""
COMPRESSION_LEVEL = 1
"""zlib's fastest: log-probs barely compress at any level (their mantissas are noise), and
the writer compresses in the thread that syncs the journal."""
_WORD = 8
_SEGMENT_NAME = re.compile(r"segment-(\d+)\.bin")


def payload_dir(journal: Path) -> Path:
    """The directory of a journal's payloads, snapshots and ledger: `journal.d` beside
    `journal.jsonl`."""
    return journal.with_name(f"{journal.stem}.d")


def segment_path(directory: Path, update: int) -> Path:
    """The segment file of the lines journalled during update `update` (while `committed`
    was `update`)."""
    return directory / f"segment-{update:06d}.bin"


def segment_update(path: Path) -> int | None:
    """The update whose segment `path` is (None: not a segment file's name)."""
    matched = _SEGMENT_NAME.fullmatch(path.name)
    return None if matched is None else int(matched.group(1))


def segment_files(directory: Path) -> dict[int, Path]:
    """The segment files in `directory`, by update."""
    found = {}
    if directory.is_dir():
        for path in directory.iterdir():
            update = segment_update(path)
            if update is not None:
                found[update] = path
    return found


def payload_bytes(value: Completions | Ragged) -> bytes:
    """A packed field's value as its payload's words."""
    if isinstance(value, Completions):
        return struct.pack("<q", len(value)) + completions_to_bytes(value)
    return b"".join((struct.pack("<q", len(value.lengths)),
                     np.asarray(value.lengths, dtype="<i8").tobytes(),
                     np.ascontiguousarray(value.values, dtype="<f8").tobytes()))


def payload_value(raw: bytes, completions: bool, where: str) -> Completions | Ragged:
    """`payload_bytes`' value back (a frame's completions, else a log-prob matrix), as arrays
    over `raw`; a DecodeError names `where`."""
    if len(raw) < _WORD or len(raw) % _WORD:
        raise DecodeError(f"{where}: a payload of {len(raw)} bytes, not a whole number of "
                          f"8-byte words")
    count = int.from_bytes(raw[:_WORD], "little", signed=True)
    if completions:
        return completions_from_bytes(memoryview(raw)[_WORD:], count, where)
    words = np.frombuffer(raw, dtype="<i8", offset=_WORD)
    if not 0 <= count <= len(words):
        raise DecodeError(f"{where}: {count} rows in a payload of {len(words)} words")
    lengths = words[:count].tolist()
    values = words[count:].view(FLOAT)
    if min(lengths, default=0) < 0 or sum(lengths) != len(values):
        raise DecodeError(f"{where}: row lengths that do not add up to its {len(values)} "
                          f"values")
    return Ragged(values, lengths)


def payload_digest(raw: bytes) -> str:
    """The digest a reference names: BLAKE2b-256 of the payload's bytes, in hex."""
    return hashlib.blake2b(raw, digest_size=32, person=b"invar-payload").hexdigest()


def record_of(raw: bytes) -> tuple[str, bytes]:
    """The payload's digest and its segment record."""
    digest = payload_digest(raw)
    stored = zlib.compress(_grouped(raw), COMPRESSION_LEVEL)
    return digest, RECORD_HEADER.pack(RECORD_MAGIC, len(stored), len(raw),
                                      bytes.fromhex(digest)) + stored


def reference(segment: int, digest: str) -> dict[str, Any]:
    """What a line holds in place of a packed field."""
    return {"segment": segment, "payload": digest}


def referenced(value: Any, where: str) -> tuple[int, str]:
    """The (segment, digest) a line's reference names; a DecodeError names `where`."""
    if not (isinstance(value, dict) and set(value) == {"segment", "payload"}
            and type(value["segment"]) is int and value["segment"] >= 0
            and isinstance(value["payload"], str) and len(value["payload"]) == 64
            and all(c in "0123456789abcdef" for c in value["payload"])):
        raise DecodeError(f"{where}: expected a payload reference {{\"segment\": UPDATE, "
                          f"\"payload\": DIGEST}}, got {str(value)[:80]}")
    return value["segment"], value["payload"]


@dataclass(frozen=True)
class Record:
    """Where a payload lies in its segment file."""

    offset: int
    """Of its stored bytes."""
    stored: int
    size: int


def scan(path: Path) -> tuple[dict[str, Record], int]:
    """A segment file's records by digest, and the end of its last whole record (a record cut
    short at the end is not one); a PayloadError names the file at a record that is none."""
    records: dict[str, Record] = {}
    with open(path, "rb") as file:
        end = file.seek(0, 2)
        offset = 0
        while offset + RECORD_HEADER.size <= end:
            file.seek(offset)
            magic, stored, size, digest = RECORD_HEADER.unpack(file.read(RECORD_HEADER.size))
            if magic != RECORD_MAGIC:
                raise PayloadError(f"{path}: byte {offset}: not a payload record (the file is "
                                   f"damaged)")
            start = offset + RECORD_HEADER.size
            if start + stored > end:
                break
            records.setdefault(digest.hex(), Record(start, stored, size))
            offset = start + stored
    return records, offset


class Segments:
    """Reads payloads from a journal's segment files, each file's records scanned once."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._scanned: dict[int, dict[str, Record]] = {}
        self._present = segment_files(directory)

    def path(self, segment: int) -> Path:
        return segment_path(self.directory, segment)

    def exists(self, segment: int) -> bool:
        return segment in self._present

    def load(self, segment: int, digest: str, line: int, completions: bool
             ) -> Completions | Ragged:
        """The payload `digest` of segment `segment`, which journal line `line` refers to;
        a PayloadError names the file and the line when it is missing or not the payload the
        digest names."""
        path = self.path(segment)
        records = self._scanned.get(segment)
        if records is None:
            if not path.is_file():
                raise PayloadError(f"{path}: missing (journal line {line} refers to its "
                                   f"payload {digest[:16]})")
            records = self._scanned[segment] = scan(path)[0]
        record = records.get(digest)
        if record is None:
            raise PayloadError(f"{path}: holds no payload {digest[:16]} (journal line {line} "
                               f"refers to it): the file was replaced or cut short")
        with open(path, "rb") as file:
            file.seek(record.offset)
            stored = file.read(record.stored)
        try:
            raw = _ungrouped(zlib.decompress(stored))
        except zlib.error:
            raw = b""
        if len(raw) != record.size or payload_digest(raw) != digest:
            raise PayloadError(f"{path}: payload {digest[:16]} (journal line {line}) does not "
                               f"match its digest: the file changed after it was written")
        try:
            return payload_value(raw, completions, f"{path}: payload {digest[:16]}")
        except DecodeError as error:
            raise PayloadError(str(error)) from None


def _grouped(raw: bytes) -> bytes:
    """The words' bytes grouped by position: every first byte, then every second..."""
    return np.frombuffer(raw, dtype=np.uint8).reshape(-1, _WORD).T.tobytes()


def _ungrouped(grouped: bytes) -> bytes:
    if len(grouped) % _WORD:
        return b""
    return np.frombuffer(grouped, dtype=np.uint8).reshape(_WORD, -1).T.tobytes()
