"""Checkpoint files: the whole search state (visited set with parent pointers, unexpanded
frontier, counters, discoveries) pickled to one file, written atomically.

A checkpoint is written to ``<path>.tmp-<pid>``, flushed and fsync'ed, then renamed over
``<path>`` (and the directory fsync'ed), so a crash leaves either the old or the new file,
never a torn one.  The payload is a plain dict; ``format``/``version`` guard against reading
something else, ``model`` against resuming a different model.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_VERSION",
    "CheckpointError",
    "load_checkpoint",
    "pending_states",
    "save_checkpoint",
]

CHECKPOINT_FORMAT = "invar-check/checkpoint"
CHECKPOINT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed (not one, another version, another model)."""


def save_checkpoint(path: str | os.PathLike[str], payload: dict[str, Any]) -> int:
    """Atomically write `payload` to `path`; returns the number of bytes written."""
    path = os.fspath(path)
    data = dict(payload)
    data["format"] = CHECKPOINT_FORMAT
    data["version"] = CHECKPOINT_VERSION
    blob = pickle.dumps(data, protocol=5)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(blob)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return len(blob)
    try:
        os.fsync(dir_fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(dir_fd)
    return len(blob)


def load_checkpoint(
    path: str | os.PathLike[str], model_signature: str | None = None
) -> dict[str, Any]:
    """Read a checkpoint written by `save_checkpoint` (checking format, version, model)."""
    with open(path, "rb") as fh:
        try:
            data = pickle.load(fh)
        except Exception as exc:  # noqa: BLE001 - any unpickling failure means "not a checkpoint"
            raise CheckpointError(f"{path}: not a readable checkpoint ({exc})") from exc
    if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: not an invar-check checkpoint")
    if data.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint version {data.get('version')}, expected {CHECKPOINT_VERSION}"
        )
    if model_signature is not None and data.get("model") != model_signature:
        raise CheckpointError(
            f"{path}: checkpoint of model {data.get('model')!r}, not of {model_signature!r}"
        )
    return data


def pending_states(data: dict[str, Any], depth: int) -> list[tuple[Any, int, int]]:
    """A loaded checkpoint's states met but not yet visited, as ``(state, fingerprint,
    parent)``: they join the frontier, whose depth `depth` they must have."""
    pending = data.get("pending")
    if not pending:
        return []
    pending_depth, items = pending
    if pending_depth != depth:
        raise CheckpointError("checkpoint: pending states are not at the frontier depth")
    return list(items)
