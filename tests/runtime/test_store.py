"""The weights store: what a load reads is what publication wrote, from memory for the newest
publication and from disk for the others, and a release takes both away."""

from __future__ import annotations

from pathlib import Path

import pytest

from invar.runtime.store import WeightsStore


def _no_disk_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(self: Path, *args: object, **kwargs: object) -> None:
        raise AssertionError(f"read {self} from disk")
    monkeypatch.setattr(Path, "read_bytes", refused)
    monkeypatch.setattr(Path, "read_text", refused)


def test_the_newest_publication_is_read_from_memory(tmp_path, monkeypatch):
    store = WeightsStore(tmp_path)
    store.write(3, b"weights of 3", "digest-3")
    _no_disk_reads(monkeypatch)
    assert store.read(3) == (b"weights of 3", "digest-3")


def test_an_older_publication_is_read_from_its_files(tmp_path):
    store = WeightsStore(tmp_path)
    store.write(3, b"weights of 3", "digest-3")
    store.write(4, b"weights of 4", "digest-4")
    store.path(3).write_bytes(b"as on disk")  # the memory copy, if read, would differ
    assert store.read(3) == (b"as on disk", "digest-3")
    assert store.read(4) == (b"weights of 4", "digest-4")


def test_a_store_opened_again_reads_what_an_earlier_one_wrote(tmp_path):
    WeightsStore(tmp_path).write(5, b"weights of 5", "digest-5")
    assert WeightsStore(tmp_path).read(5) == (b"weights of 5", "digest-5")


def test_a_release_takes_the_newest_publication_out_of_memory_too(tmp_path):
    store = WeightsStore(tmp_path)
    store.write(3, b"weights of 3", "digest-3")
    store.delete(3)
    assert not store.path(3).exists()
    with pytest.raises(FileNotFoundError):
        store.read(3)


def test_a_release_of_another_version_keeps_the_newest(tmp_path, monkeypatch):
    store = WeightsStore(tmp_path)
    store.write(3, b"weights of 3", "digest-3")
    store.write(4, b"weights of 4", "digest-4")
    store.delete(3)
    _no_disk_reads(monkeypatch)
    assert store.read(4) == (b"weights of 4", "digest-4")


def test_a_failed_write_leaves_the_previous_newest(tmp_path, monkeypatch):
    store = WeightsStore(tmp_path)
    store.write(3, b"weights of 3", "digest-3")

    def full_disk(path: Path, data: bytes) -> None:
        raise OSError("no space left on device")
    monkeypatch.setattr("invar.runtime.store.atomic_write", full_disk)
    with pytest.raises(OSError):
        store.write(4, b"weights of 4", "digest-4")
    with pytest.raises(FileNotFoundError):
        store.read(4)  # never published: not served from memory either
    assert store.read(3) == (b"weights of 3", "digest-3")


class _Commits:
    """A learner's `published_weights`: what each kept commit gives; a pruned one refused."""

    def __init__(self, kept: dict[int, bytes]) -> None:
        self.kept = kept

    def published_weights(self, version: int) -> tuple[bytes, str, str]:
        from invar.runtime.commits import CommitError
        if version not in self.kept:
            raise CommitError(f"commit-{version:06d}.pt", "no such file (never written, or "
                                                          "pruned)")
        blob = self.kept[version]
        return blob, f"digest of {blob!r}", "state digest"


def test_heal_publishes_again_what_its_commit_gives_and_leaves_the_rest(tmp_path, monkeypatch):
    from invar.runtime.store import heal
    commits = _Commits({2: b"weights of 2", 3: b"weights of 3", 4: b"weights of 4"})
    store = WeightsStore(tmp_path)
    for version in (1, 2, 3, 4):
        blob = commits.kept.get(version, b"weights of 1")
        store.write(version, blob, f"digest of {blob!r}")
    store.path(1).write_bytes(b"damaged, its commit pruned")
    store.path(2).write_bytes(b"damaged")
    store.path(3).with_suffix(".digest").write_text("damaged")
    healed = heal(commits, store, (1, 2, 3, 4))  # type: ignore[arg-type]
    assert healed == [2, 3]
    for version in (2, 3, 4):
        blob = commits.kept[version]
        assert store.holds(version, blob, f"digest of {blob!r}")
    assert store.path(1).read_bytes() == b"damaged, its commit pruned"
    _no_disk_reads(monkeypatch)  # an older version published again is not the newest
    assert store.read(4) == (b"weights of 4", "digest of b'weights of 4'")


def test_temporaries_a_killed_publication_left_are_removed_on_start(tmp_path):
    """Issue 41: `.weights-NNNNNN.bin.*.tmp` left by a kill -9 (a whole copy of the weights)
    stayed for good."""
    WeightsStore(tmp_path).write(5, b"weights of 5", "digest-5")
    leftovers = [tmp_path / ".weights-000006.bin.k9x2.tmp",
                 tmp_path / ".weights-000006.digest.a1.tmp"]
    for leftover in leftovers:
        leftover.write_bytes(b"half a publication")
    (tmp_path / "notes.tmp").write_text("not the store's")
    store = WeightsStore(tmp_path)
    assert not any(leftover.exists() for leftover in leftovers)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "notes.tmp", "weights-000005.bin", "weights-000005.digest"]
    assert store.read(5) == (b"weights of 5", "digest-5")
