"""The compact visited set (`checker.fpset.FingerprintSet`, with its parents on disk:
`checker.statefiles.VisitedStates`) behaves as the dict ``fingerprint -> parent`` it replaces."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checker.fpset import NO_PARENT, FingerprintSet
from checker.statefiles import VisitedStates

SIGNED = st.integers(-(1 << 63), (1 << 63) - 1)
UNSIGNED = st.integers(0, (1 << 64) - 1)
# few distinct values, so that batches repeat fingerprints and probes collide; 0 included
CLUSTERED = st.sampled_from([0, 1, 2, 3, 1 << 10, (1 << 10) + 1, (1 << 63) - 1, 5, 7, 11])


def _as_dict(batches: list[list[tuple[int, int]]]) -> tuple[dict[int, int], list[list[int]]]:
    """What the dict visited set held, and which indices were new in each batch."""
    seen: dict[int, int] = {}
    news = []
    for batch in batches:
        new = []
        for i, (g, f) in enumerate(batch):
            if g not in seen:
                seen[g] = NO_PARENT if f == g else f  # a state given as its own parent: a root
                new.append(i)
        news.append(new)
    return seen, news


def _check(batches: list[list[tuple[int, int]]], signed: bool) -> None:
    expected, news = _as_dict(batches)
    table = FingerprintSet(signed)
    for batch, new in zip(batches, news):
        assert table.add_new([g for g, _f in batch]) == new
    assert sorted(table) == sorted(expected)
    with tempfile.TemporaryDirectory() as folder:
        visited = VisitedStates(signed, Path(folder))
        for batch, new in zip(batches, news):
            assert visited.add_new([g for g, _f in batch], [f for _g, f in batch]) == new
        assert len(visited) == len(expected)
        # the parents file holds them in discovery order
        assert list(visited.parents.items()) == list(expected.items())
        for g, f in expected.items():
            assert g in visited
            assert visited.parents.parent_of(g) == f
        visited.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(SIGNED, SIGNED), max_size=40), max_size=8))
def test_signed_fingerprints_as_a_dict(batches: list[list[tuple[int, int]]]) -> None:
    _check(batches, signed=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(UNSIGNED, UNSIGNED), max_size=40), max_size=8))
def test_unsigned_fingerprints_as_a_dict(batches: list[list[tuple[int, int]]]) -> None:
    _check(batches, signed=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(CLUSTERED, CLUSTERED), max_size=30), max_size=6))
def test_repeated_and_zero_fingerprints(batches: list[list[tuple[int, int]]]) -> None:
    _check(batches, signed=True)


def test_growth_keeps_every_fingerprint_and_roots(tmp_path: Path) -> None:
    roots = [(g, NO_PARENT) for g in range(1, 4)] + [(0, NO_PARENT)]
    visited = VisitedStates.from_items(roots, signed=False, directory=tmp_path)
    fps = list(range(100, 100 + 5000))
    assert visited.add_new(fps, [1] * len(fps)) == list(range(len(fps)))
    assert visited.add_new(fps, [2] * len(fps)) == []
    assert len(visited) == 4 + len(fps)
    assert all(visited.parents.parent_of(g) == NO_PARENT for g, _p in roots)
    assert visited.parents.parent_of(4321) == 1
    assert 99 not in visited
    assert visited.table.nbytes <= 8 * 4 * len(visited)  # at least a quarter full after growing
    visited.close()


def test_a_chain_is_followed_back_through_many_blocks_of_records(tmp_path: Path) -> None:
    """A path 0 -> 1 -> ... -> n, its records written past the buffer and read back in blocks
    (the lookup of each parent starts at its child's record), with unrelated records between."""
    visited = VisitedStates.from_items([(1, NO_PARENT)], signed=True, directory=tmp_path)
    n = 300
    noise = 1 << 40
    for g in range(2, n + 1):
        others = list(range(noise, noise + 1000))
        noise += 1000
        visited.add_new([*others, g], [g - 1] * 1001)
    chain = [n]
    while (parent := visited.parents.parent_of(chain[-1])) != NO_PARENT:
        chain.append(parent)
    assert chain == list(range(n, 0, -1))
    assert visited.parents.disk_bytes == 16 * len(visited)
    with pytest.raises(KeyError):
        visited.parents.parent_of(-5)  # never visited
    visited.close()
