"""The weights store workers load from, and the file layout it shares with checkpoints.

A stored file has its digest beside it (`NAME.digest`): the store's `weights-NNNNNN.bin` with
the parameters' digest, a checkpoint (`invar.runtime.learner_executor`) with the state
digest. Both are written atomically, the digest last, so a file counts as whole once its
digest is there.

A store file that no longer matches its digest (a flipped bit, a file lost) would be refused
by every worker sent it, forever: `heal` compares it with what its verified commit gives and
publishes it again, on resume and after a worker dies without serving.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from invar.runtime.backend import LearnerBackend
from invar.runtime.commits import CommitError
from invar.runtime.files import atomic_write, atomic_write_leftovers

log = logging.getLogger("invar.store")


def digest_path(path: Path) -> Path:
    """Where the digest of the stored file `path` is kept."""
    return Path(path).with_suffix(".digest")


def write_with_digest(path: Path, data: bytes, digest: str) -> None:
    """`path`, then its digest beside it, each atomically: a crash leaves the old file or the
    new, never a truncated one, and a file without its digest is not yet kept."""
    atomic_write(path, data)
    atomic_write(digest_path(path), digest.encode())


def read_digest(path: Path) -> str | None:
    """The digest of the stored file `path`, or None if it is not (yet) kept."""
    digest = digest_path(path)
    return digest.read_text() if digest.exists() else None


class WeightsStore:
    """The weights workers load: one file per published version, its parameter digest beside
    it. Publication writes both atomically; a release deletes both.

    The newest publication is also kept in memory as written: nearly every load is of it, and
    reading it back from disk for each worker was the driver's event path's largest piece of
    I/O. Only that one copy is kept (a model's weights once more in the driver's memory), and
    a release of its version drops it with the files."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        for leftover in atomic_write_leftovers(self.directory, STORED_PREFIX):
            # A publication a crash interrupted (a whole copy of the weights): the file it was
            # to replace is intact, or published again.
            leftover.unlink()
        # (version, blob, params digest); replaced whole, so a reader on another thread sees
        # the old entry or the new, never a mix.
        self._newest: tuple[int, bytes, str] | None = None

    def path(self, version: int) -> Path:
        return self.directory / f"{STORED_PREFIX}{version:06d}.bin"

    def write(self, version: int, blob: bytes, params_digest: str) -> None:
        write_with_digest(self.path(version), blob, params_digest)
        newest = self._newest
        if newest is None or version >= newest[0]:  # a version published again may be older
            self._newest = (version, blob, params_digest)  # once the files are whole

    def holds(self, version: int, blob: bytes, params_digest: str) -> bool:
        """Whether the files of `version` on disk hold `blob` and `params_digest`."""
        path = self.path(version)
        try:
            return read_digest(path) == params_digest and path.read_bytes() == blob
        except FileNotFoundError:
            return False

    def read(self, version: int) -> tuple[bytes, str]:
        newest = self._newest
        if newest is not None and newest[0] == version:
            return newest[1], newest[2]
        path = self.path(version)
        return path.read_bytes(), digest_path(path).read_text()

    def delete(self, version: int) -> None:
        newest = self._newest
        if newest is not None and newest[0] == version:
            self._newest = None
        path = self.path(version)
        path.unlink(missing_ok=True)
        digest_path(path).unlink(missing_ok=True)


STORED_PREFIX = "weights-"
"""The names of the store's files (with their digests beside them)."""


def not_a_file(directory: Path) -> Path | None:
    """A path of the store in `directory` that is not a regular file (a directory, a link, a
    FIFO where a weights file or its digest belongs): neither readable nor replaceable."""
    return next((path for path in sorted(Path(directory).glob(f"{STORED_PREFIX}*"))
                 if path.is_symlink() or not path.is_file()), None)


def publish(learner: LearnerBackend, store: WeightsStore, version: int) -> str:
    """Store committed `version`'s weights (read back from its commit file) for the workers;
    returns its state digest, which the core's `VersionPublished` carries."""
    blob, params_digest, digest = learner.published_weights(version)
    store.write(version, blob, params_digest)
    return digest


def heal(learner: LearnerBackend, store: WeightsStore, versions: Iterable[int]) -> list[int]:
    """Publish again each of `versions` (the ones the store keeps) whose files on disk are not
    what its verified commit gives; returns those healed. A version whose commit is gone
    (pruned: `learner.keep_commits`) can be neither checked nor healed, and is left."""
    healed = []
    for version in versions:
        try:
            blob, params_digest, _ = learner.published_weights(version)
        except CommitError:
            continue
        if store.holds(version, blob, params_digest):
            continue
        store.write(version, blob, params_digest)
        log.warning("store file of version %d failed its digest: published again from its "
                    "commit", version)
        healed.append(version)
    return healed
