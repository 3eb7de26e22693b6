"""The compact visited set (`checker.fpset.FingerprintSet`) behaves as the dict it replaces."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from checker.fpset import NO_PARENT, FingerprintSet

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
    table = FingerprintSet(signed)
    expected, news = _as_dict(batches)
    for batch, new in zip(batches, news):
        assert table.add_new([g for g, _f in batch], [f for _g, f in batch]) == new
    assert len(table) == len(expected)
    assert dict(table.items()) == expected
    for g, f in expected.items():
        assert g in table
        assert table[g] == f


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


def test_growth_keeps_every_fingerprint_and_roots() -> None:
    roots = [(g, NO_PARENT) for g in range(1, 4)] + [(0, NO_PARENT)]
    table = FingerprintSet.from_items(roots, signed=False)
    fps = list(range(100, 100 + 5000))
    assert table.add_new(fps, [1] * len(fps)) == list(range(len(fps)))
    assert table.add_new(fps, [2] * len(fps)) == []
    assert len(table) == 4 + len(fps)
    assert all(table[g] == NO_PARENT for g, _p in roots)
    assert table[4321] == 1
    assert 99 not in table
    assert table.nbytes <= 16 * 4 * len(table)  # at least a quarter full after growing
