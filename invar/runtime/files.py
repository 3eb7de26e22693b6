"""Atomic file writes (no framework: the journal, the metrics and the store use them)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace `path` with `data` so that a crash at any point leaves the old file or the new
    (see `atomic_write_with`)."""
    atomic_write_with(path, lambda file: file.write(data))


def atomic_write_with(path: str | os.PathLike[str], write: Callable[[BinaryIO], Any]) -> None:
    """Replace `path` with what `write(file)` writes into an open binary file (streamed: a
    large file is never a whole `bytes` in memory), so that a crash at any point leaves the
    old file or the new.

    Writes a temporary file in the same directory (rename is only atomic within a file
    system), fsyncs it, renames it over `path`, then fsyncs the directory so the rename
    itself survives a power loss. On failure the temporary file is removed.
    """
    target = Path(path)
    # Named ".<name>.<random>.tmp" (see atomic_write_leftovers).
    descriptor, temporary = tempfile.mkstemp(
        dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(descriptor, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def atomic_write_leftovers(directory: str | os.PathLike[str], name_prefix: str) -> list[Path]:
    """Temporary files that interrupted `atomic_write`s of `name_prefix*` files left behind."""
    return sorted(Path(directory).glob(f".{name_prefix}*.tmp"))
