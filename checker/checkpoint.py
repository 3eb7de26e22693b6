"""Checkpoint files: the whole search state (visited set with parent pointers, unexpanded
frontier, counters, discoveries) pickled to one file, written atomically.

A checkpoint is written to ``<path>.tmp-<pid>``, flushed and fsync'ed, then renamed over
``<path>`` (and the directory fsync'ed), so a crash leaves either the old or the new file,
never a torn one.  The payload is a plain dict; ``format``/``version`` guard against reading
something else, ``model`` against resuming a different model.

The breadth-first searches, sequential and parallel, write and resume their checkpoints
through `save_levels` and `resume_levels`: one payload, whichever wrote it.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_VERSION",
    "CheckpointError",
    "Levels",
    "load_checkpoint",
    "model_signature",
    "resume_levels",
    "save_checkpoint",
    "save_levels",
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


@dataclass
class Levels:
    """A breadth-first search between two of its steps, as its checkpoint holds it: the visited
    set (fingerprint -> parent fingerprint), the level to expand (`current`, at `depth`) and
    the states of the next one already visited (`following`), the counters it goes on from,
    and the first discovery (`checker.engine.Found`) of each property found so far."""

    visited: dict[int, Any]
    depth: int
    current: list[tuple[Any, int]]
    following: list[tuple[Any, int]] = field(default_factory=list)
    generated: int = 0
    max_depth: int = 0
    elapsed_s: float = 0.0
    coverage: dict[str, int] = field(default_factory=dict)
    found: dict[str, Any] = field(default_factory=dict)
    unchecked: list[tuple[Any, int]] = field(default_factory=list)
    """The states of `current` not yet checked as newly visited (never written: the initial
    states of a fresh search, the pending states of a checkpoint that has some)."""


def model_signature(model: Any) -> str:
    """What a checkpoint records of its model, for a resumed search to be of the same one: the
    class, and the model's repr when its class defines one."""
    cls = type(model)
    signature = f"{cls.__module__}.{cls.__qualname__}"
    if cls.__repr__ is not object.__repr__:
        signature += f":{model!r}"
    return signature


def save_levels(path: str | os.PathLike[str], model: Any, levels: Levels) -> int:
    """Atomically write `levels`, a breadth-first search of `model`, as a checkpoint; returns
    the number of bytes written."""
    following = [(levels.depth + 1, levels.following)] if levels.following else []
    return save_checkpoint(path, {
        "model": model_signature(model),
        "strategy": "bfs",
        "visited": levels.visited,
        "levels": [(levels.depth, levels.current), *following],
        "depth": levels.depth,
        "pending": None,
        "generated": levels.generated,
        "max_depth": levels.max_depth,
        "elapsed_s": levels.elapsed_s,
        "coverage": levels.coverage,
        "found": dict(levels.found),
    })


def resume_levels(path: str | os.PathLike[str], model: Any) -> Levels:
    """The breadth-first search of `model` that the checkpoint at `path` holds, ready to go on
    (`CheckpointError` if it is not one of `model`): its pending states, if any, join the
    level to expand, visited and `unchecked`."""
    data = load_checkpoint(path, model_signature(model))
    levels = sorted(data["levels"], key=lambda level: level[0])
    depth = levels[0][0] if levels else data["depth"]
    resumed = Levels(
        visited=data["visited"],
        depth=depth,
        current=list(levels[0][1]) if levels else [],
        following=list(levels[1][1]) if len(levels) > 1 else [],
        generated=data["generated"],
        max_depth=data["max_depth"],
        elapsed_s=data["elapsed_s"],
        coverage=dict(data["coverage"]),
        found=data["found"],
    )
    for t, g, parent in _pending_states(data, depth):
        if g not in resumed.visited:
            resumed.visited[g] = parent
            resumed.current.append((t, g))
            resumed.unchecked.append((t, g))
    return resumed


def _pending_states(data: dict[str, Any], depth: int) -> list[tuple[Any, int, int]]:
    """A loaded checkpoint's states met but not yet visited, as ``(state, fingerprint,
    parent)``: they join the frontier, whose depth `depth` they must have."""
    pending = data.get("pending")
    if not pending:
        return []
    pending_depth, items = pending
    if pending_depth != depth:
        raise CheckpointError("checkpoint: pending states are not at the frontier depth")
    return list(items)
