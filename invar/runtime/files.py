"""Atomic file writes, bounded reads and the run directory's lock (no framework: the
journal, the metrics, the store and the command line use them)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Callable, Iterator
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


class TooLarge(ValueError):
    """A file longer than its reader's limit (`read_at_most`)."""


def read_at_most(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of `path`, reading at most `limit` + 1 of them: a longer file (or an endless
    one: /dev/zero) raises TooLarge instead of filling the memory."""
    with open(path, "rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"longer than {limit} bytes")
    return data


@contextlib.contextmanager
def directory_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive lock on the directory `path` for as long as the context lasts: `flock` on
    the directory itself, so taking it writes nothing there, and the kernel drops it when the
    process ends however it ends. Raises BlockingIOError while another process holds it."""
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(descriptor)
