"""The weights store workers load from, and the file layout it shares with checkpoints.

A stored file has its digest beside it (`NAME.digest`): the store's `weights-NNNNNN.bin` with
the parameters' digest, a checkpoint (`invar.runtime.learner_executor`) with the state
digest. Both are written atomically, the digest last, so a file counts as whole once its
digest is there.
"""

from __future__ import annotations

from pathlib import Path

from invar.runtime.backend import LearnerBackend
from invar.runtime.weights import atomic_write


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
    it. Publication writes both atomically; a release deletes both."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def path(self, version: int) -> Path:
        return self.directory / f"weights-{version:06d}.bin"

    def write(self, version: int, blob: bytes, params_digest: str) -> None:
        write_with_digest(self.path(version), blob, params_digest)

    def read(self, version: int) -> tuple[bytes, str]:
        path = self.path(version)
        return path.read_bytes(), digest_path(path).read_text()

    def delete(self, version: int) -> None:
        path = self.path(version)
        path.unlink(missing_ok=True)
        digest_path(path).unlink(missing_ok=True)


def publish(learner: LearnerBackend, store: WeightsStore, version: int) -> str:
    """Store committed `version`'s weights (read back from its commit file) for the workers;
    returns its state digest, which the core's `VersionPublished` carries."""
    blob, params_digest, digest = learner.published_weights(version)
    store.write(version, blob, params_digest)
    return digest
