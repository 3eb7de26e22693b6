"""Commits: the learner state on disk, and the lifecycle every learner backend shares.

A commit file is a header (magic, payload length, XXH3-128 of the payload), then a
`torch.save`d dict of tensors and plain values (both backends write this format; an MLX
commit stores its arrays as torch tensors under the torch policy's names). Commits are written
atomically and pruned to the newest `keep`; a file that fails any check raises `CommitError`
and is never loaded.

`CommittedLearner` holds what does not depend on the framework: `start` restores the newest
commit (or writes commit 0), refusing one of another version, policy, seed or shape before
anything is loaded; `commit` writes the state the backend hands it; `published_weights` gives
a committed version's weights for workers (made at commit time, or read back from its
verified file).
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import struct
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from invar.runtime.backend import Binding, checked_cotangent
from invar.runtime.config import OptimConfig
from invar.runtime.files import atomic_write_leftovers, atomic_write_with
from invar.runtime.policy_config import PolicyConfig
from invar.runtime.weights import (
    content_digest,
    content_hasher,
    state_dict_to_bytes,
    weights_digest,
)

COMMIT_PREFIX = "commit-"
_COMMIT_NAME = re.compile(rf"{COMMIT_PREFIX}(\d{{6,}})\.pt")
COMMIT_MAGIC = b"INVARCK2"
_OLDER_MAGIC = {b"INVARCKP": "format 1 (a BLAKE2b checksum and digests)"}
# A commit file is this header (magic, payload length, `content_digest` of the payload) +
# payload.
_COMMIT_HEADER = struct.Struct("<8sQ16s")
COMMIT_FIELDS = (
    "version",
    "model",
    "optimizer",
    "torch_rng",
    "counters",
    "policy_config",
    "seed",
    "state_digest",
)


class CommitError(RuntimeError):
    """A commit file that must not be loaded; `path` names it and `reason` says why."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"commit {self.path} refused: {reason}")


def commit_path(commit_dir: str | Path, version: int) -> Path:
    """Where the commit of `version` lives."""
    return Path(commit_dir) / f"{COMMIT_PREFIX}{version:06d}.pt"


def list_commits(commit_dir: str | Path) -> list[tuple[int, Path]]:
    """(version, path) of every commit file in `commit_dir`, oldest first."""
    found = []
    for path in Path(commit_dir).iterdir():
        match = _COMMIT_NAME.fullmatch(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def encode_commit(content: Mapping[str, Any]) -> bytes:
    """Commit file bytes: the header (with the payload's length and checksum), then payload."""
    buffer = io.BytesIO()
    write_commit_file(buffer, content)
    return buffer.getvalue()


def write_commit_file(file: BinaryIO, content: Mapping[str, Any]) -> None:
    """Write the commit file of `content` into `file` (seekable, at offset 0): a header left
    blank, the payload streamed through its checksum, then the header. A learner's state is
    gigabytes for a real model: never held as bytes (let alone copied to prepend a header)."""
    file.write(bytes(_COMMIT_HEADER.size))
    hashed = _HashingWriter(file)
    torch.save(dict(content), hashed)  # type: ignore[arg-type]  # write and flush suffice
    file.seek(0)
    file.write(_COMMIT_HEADER.pack(COMMIT_MAGIC, hashed.length, hashed.checksum.digest()))
    file.seek(0, io.SEEK_END)


class _HashingWriter:
    """A write-only stream that passes bytes on to `file`, digesting and counting them."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.checksum = content_hasher()
        self.length = 0

    def write(self, data: bytes) -> int:
        self.checksum.update(data)
        self.length += len(data)
        self.file.write(data)
        return len(data)

    def flush(self) -> None:
        self.file.flush()


def read_commit(path: str | Path) -> dict[str, Any]:
    """The verified content of a commit file; raises `CommitError` rather than return junk."""
    try:
        file = open(path, "rb")  # noqa: SIM115  # closed below, before the payload is parsed
    except FileNotFoundError:
        raise CommitError(path, "no such file (never written, or pruned)") from None
    with file:
        size = os.fstat(file.fileno()).st_size
        head = file.read(_COMMIT_HEADER.size)
        if len(head) < _COMMIT_HEADER.size:
            raise CommitError(
                path, f"truncated: {len(head)} bytes, the header alone needs {_COMMIT_HEADER.size}"
            )
        magic, length, checksum = _COMMIT_HEADER.unpack(head)
        if magic in _OLDER_MAGIC:
            raise CommitError(path, f"a commit of an older Invar, {_OLDER_MAGIC[magic]}: this "
                                    f"version cannot verify it (start a new run)")
        if magic != COMMIT_MAGIC:
            raise CommitError(path, f"not a commit file (magic {magic!r})")
        found = size - _COMMIT_HEADER.size
        if found < length:
            raise CommitError(path, f"truncated: payload has {found} of {length} bytes")
        if found > length:
            raise CommitError(path, f"{found - length} unexpected bytes after the payload")
        # Read once into its own bytes (BytesIO shares them): a slice would copy gigabytes.
        payload = file.read(length)
    if content_digest(payload) != checksum:
        raise CommitError(path, "checksum mismatch: the payload is not what was written")
    # weights_only: a commit holds tensors and plain values, never code to run.
    content = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    if not isinstance(content, dict):
        raise CommitError(path, f"payload is a {type(content).__name__}, not a dict")
    missing = [field for field in COMMIT_FIELDS if field not in content]
    if missing:
        raise CommitError(path, f"missing field(s): {', '.join(missing)}")
    return content


def write_commit(commit_dir: Path, version: int, content: Mapping[str, Any], keep: int) -> None:
    """Write commit `version` atomically, then prune all but the newest `keep` commits."""
    atomic_write_with(commit_path(commit_dir, version),
                      lambda file: write_commit_file(file, content))
    for _, old in list_commits(commit_dir)[:-keep]:
        old.unlink()


class CommittedLearner(ABC):
    """Policy configuration, seed, commits and the state digest: a backend's lifecycle.

    A subclass holds the framework's model and optimizer and supplies `_compute_digest` (of
    its current state), `_parameter_shapes` (name -> shape, the torch policy's names),
    `_commit_state` (the commit's "model" and "optimizer" fields) and `_load_commit` (its own
    checks of a commit, then loading it, all checks first). `_pending` is the pending
    forward: its binding, the shape of its log-probs and what the backend keeps for the
    step (`_bound_cotangent` hands that back), or None.
    """

    commit_backend: str | None = None
    """The "backend" field this learner's commits carry and a restore requires; None: no such
    field (the torch backend's commits, the format's first)."""

    def __init__(self, policy_config: PolicyConfig, optim_config: OptimConfig, seed: int,
                 commit_dir: str | Path, keep_commits: int) -> None:
        if keep_commits < 1:
            raise ValueError(f"keep_commits must be at least 1, got {keep_commits}")
        self.policy_config = policy_config
        self.optim_config = optim_config
        self.seed = seed
        self.commit_dir = Path(commit_dir)
        self.keep_commits = keep_commits
        self.committed_version: int | None = None
        self.applied_steps = 0
        self._digest: str | None = None  # of the current state; set by start, each step
        self._pending: tuple[Binding, tuple[int, ...], Any] | None = None
        self._publishing = threading.Lock()  # commit (learner thread) against publish
        self._publication: tuple[int, tuple[bytes, str, str]] | None = None
        """The newest commit's version and publication, until it is published."""

    @abstractmethod
    def _compute_digest(self) -> str:
        """The digest of the current parameters and optimizer state."""

    @abstractmethod
    def _parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape of every parameter, by torch `Policy` name."""

    @abstractmethod
    def _commit_state(self) -> dict[str, Any]:
        """The commit's "model" and "optimizer" fields, as torch tensors and plain values."""

    @abstractmethod
    def _load_commit(self, path: Path, content: dict[str, Any]) -> None:
        """Check what the shared checks do not, then load the commit's model and optimizer
        (raising `CommitError` before anything is loaded)."""

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> tuple[int, str]:
        """Restore the newest commit, or initialise and write commit 0 if there is none.

        Returns `(committed_version, state_digest)`. If the newest commit fails verification
        it raises `CommitError` and loads nothing: falling back to an older commit silently
        would hide data loss from the core, which holds the newest version as committed.
        """
        self.commit_dir.mkdir(parents=True, exist_ok=True)
        for leftover in atomic_write_leftovers(self.commit_dir, COMMIT_PREFIX):
            # A commit interrupted by a crash; the file it was to replace is intact.
            leftover.unlink()
        self._pending = None
        commits = list_commits(self.commit_dir)
        if commits:
            version, path = commits[-1]
            self._restore(version, path)
        else:
            self._digest = self._compute_digest()
            self.commit(0)
        assert self.committed_version is not None and self._digest is not None
        return self.committed_version, self._digest

    def _restore(self, version: int, path: Path) -> None:
        content = read_commit(path)
        # Every check comes before the first tensor is copied, so a refusal loads nothing.
        if self.commit_backend is not None and content.get("backend") != self.commit_backend:
            raise CommitError(path, f"written by the {content.get('backend', 'torch')} "
                                    f"backend, not {self.commit_backend}")
        if content["version"] != version:
            raise CommitError(path, f"holds version {content['version']}, its name says {version}")
        if content["policy_config"] != dataclasses.asdict(self.policy_config):
            raise CommitError(path, f"written for policy {content['policy_config']}")
        if content["seed"] != self.seed:
            raise CommitError(path, f"written for seed {content['seed']}, not {self.seed}")
        found_shapes = {name: tuple(t.shape) for name, t in content["model"].items()}
        if found_shapes != self._parameter_shapes():
            raise CommitError(path, "model tensors do not match the policy's names and shapes")
        self._load_commit(path, content)
        torch.set_rng_state(content["torch_rng"])
        self.applied_steps = content["counters"]["applied_steps"]
        self.committed_version = version
        self._digest = self._compute_digest()
        if self._digest != content["state_digest"]:
            raise CommitError(path, "restored state differs from the committed state")

    def commit(self, version: int) -> str:
        """Write `commit-{version:06d}.pt` atomically, prune old commits, return the digest."""
        digest = self.state_digest()
        if self.committed_version is not None and version <= self.committed_version:
            raise ValueError(f"commit {version} is not newer than commit {self.committed_version}")
        backend = {} if self.commit_backend is None else {"backend": self.commit_backend}
        content = {
            "version": version,
            **backend,
            **self._commit_state(),
            "torch_rng": torch.get_rng_state(),
            "counters": {"applied_steps": self.applied_steps},
            "policy_config": dataclasses.asdict(self.policy_config),
            "seed": self.seed,
            "state_digest": digest,
        }
        write_commit(self.commit_dir, version, content, self.keep_commits)
        self.committed_version = version
        # The publication of this version, made now from the very tensors just written (the
        # next step changes them in place): reading it back from the file would load the
        # whole state, optimizer moments included, to keep a third of it.
        model = content["model"]
        with self._publishing:
            self._publication = (version, (state_dict_to_bytes(model), weights_digest(model),
                                           digest))
        return digest

    def state_digest(self) -> str:
        """Digest of parameters and optimizer state (only start and a step change it)."""
        if self._digest is None:
            raise RuntimeError("the learner has no state yet: call start() first")
        return self._digest

    def _bound_cotangent(self, update: int, step: int, observation: int, pre_step_digest: str,
                         cotangent: np.ndarray) -> tuple[np.ndarray, Any]:
        """The cotangent (float64) and what the pending forward kept for its step, if the
        cotangent is bound to that forward (see `checked_cotangent`); the forward stays
        pending either way."""
        pending, shape, kept = self._pending or (None, (), None)
        offered = Binding(update, step, observation, pre_step_digest)
        return checked_cotangent(pending, offered, self.state_digest(), cotangent, shape), kept

    # -- weights for workers -----------------------------------------------------------------

    def commit_file(self, version: int) -> Path | None:
        """The commit file of `version`, if it is still kept."""
        path = commit_path(self.commit_dir, version)
        return path if path.exists() else None

    def published_weights(self, version: int) -> tuple[bytes, str, str]:
        """Weights of committed `version` for workers: (blob, weights digest, state digest).

        Never the live weights (the learner may already be stepping the next update when a
        version is published): those this learner made when it wrote the commit, the first
        time they are asked for, and otherwise read back from the verified commit file
        (`published_from_commit_file`, which they equal). The blob holds tensors by torch
        `Policy` name, which the torch and the MLX worker both load.
        """
        with self._publishing:
            made = self._publication
            if made is not None and made[0] == version:
                self._publication = None
                return made[1]
        return self.published_from_commit_file(version)

    def published_from_commit_file(self, version: int) -> tuple[bytes, str, str]:
        """`published_weights(version)` read back from the verified commit file."""
        content = read_commit(commit_path(self.commit_dir, version))
        model = content["model"]
        return state_dict_to_bytes(model), weights_digest(model), content["state_digest"]
