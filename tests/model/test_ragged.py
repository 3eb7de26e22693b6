"""`Ragged`: a value that reads as the tuple of tuples it stands for."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from invar.model.ragged import INT, Ragged

floats = st.floats(allow_nan=True, allow_infinity=True, width=64)
float_rows = st.lists(st.lists(floats, max_size=6).map(tuple), max_size=6).map(tuple)
int_rows = st.lists(st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=6).map(tuple),
                    max_size=6).map(tuple)


def _bits(rows: tuple[tuple[float, ...], ...]) -> tuple[tuple[bytes, ...], ...]:
    return tuple(tuple(np.float64(x).tobytes() for x in row) for row in rows)


@given(float_rows)
def test_float_rows_round_trip_bit_for_bit(rows: tuple[tuple[float, ...], ...]) -> None:
    ragged = Ragged.of(rows)
    assert _bits(ragged.rows()) == _bits(rows)
    assert len(ragged) == len(rows)
    assert [len(row) for row in ragged] == [len(row) for row in rows]
    for i, row in enumerate(rows):
        assert _bits((ragged[i],)) == _bits((row,))
        assert _bits((tuple(ragged.row(i).tolist()),)) == _bits((row,))


@given(int_rows)
def test_int_rows_round_trip(rows: tuple[tuple[int, ...], ...]) -> None:
    ragged = Ragged.of(rows, INT)
    assert ragged.rows() == rows
    assert ragged.values.dtype == INT


@given(float_rows, float_rows)
def test_equal_exactly_when_the_bits_are_and_hash_agrees(a: tuple[tuple[float, ...], ...],
                                                         b: tuple[tuple[float, ...], ...]) -> None:
    x, y = Ragged.of(a), Ragged.of(b)
    assert (x == y) == (_bits(a) == _bits(b))
    if x == y:
        assert hash(x) == hash(y)
    assert x == Ragged.of(a) and hash(x) == hash(Ragged.of(a))


def test_equality_is_bitwise_and_typed() -> None:
    assert Ragged.of(((0.0,),)) != Ragged.of(((-0.0,),))
    assert Ragged.of(((math.nan,),)) == Ragged.of(((math.nan,),))
    assert Ragged.of(((1.0,),)) != Ragged.of(((1,),), INT)
    assert Ragged.of(((1.0, 2.0),)) != Ragged.of(((1.0,), (2.0,)))  # same values, other rows
    assert Ragged.of(((1.0,),)) != ((1.0,),)


@given(float_rows)
def test_padded_and_back(rows: tuple[tuple[float, ...], ...]) -> None:
    ragged = Ragged.of(rows)
    values, mask = ragged.padded()
    width = max(map(len, rows), default=0)
    assert values.shape == mask.shape == (len(rows), width)
    for i, row in enumerate(rows):
        assert mask[i].tolist() == [True] * len(row) + [False] * (width - len(row))
        assert _bits((tuple(values[i, :len(row)].tolist()),)) == _bits((row,))
        assert not values[i, len(row):].any()
    assert Ragged.from_padded(values, mask) == ragged


@given(float_rows, st.data())
def test_take_selects_rows_in_order(rows: tuple[tuple[float, ...], ...],
                                    data: st.DataObject) -> None:
    picked = data.draw(st.lists(st.integers(0, max(len(rows) - 1, 0)), max_size=5)
                       if rows else st.just([]))
    assert Ragged.of(rows).take(picked) == Ragged.of(tuple(rows[i] for i in picked))


def test_pickles_as_a_value() -> None:
    ragged = Ragged.of(((-0.5, -1.0), (-0.25,)))
    hash(ragged)
    copy = pickle.loads(pickle.dumps(ragged))
    assert copy == ragged and hash(copy) == hash(ragged)


def test_immutable_even_through_the_array_it_was_built_from() -> None:
    source = np.array([-0.5, -1.0, -0.25])
    ragged = Ragged(source, (2, 1))
    source[0] = 0.0
    assert ragged.rows() == ((-0.5, -1.0), (-0.25,))
    with pytest.raises(ValueError):
        ragged.values[0] = 0.0
    with pytest.raises(AttributeError):
        ragged.lengths = (3,)
    shared = np.frombuffer(np.array([1.0, 2.0]).tobytes(), dtype="<f8")
    assert Ragged(shared, (2,)).values is shared  # immutable memory: shared, not copied


@pytest.mark.parametrize(("rows", "dtype", "message"), [
    ([(1.5,)], INT, r"rows\[0\]: not a flat sequence of integers"),
    ([(1,), "ab"], None, r"rows\[1\]: not a flat sequence of numbers"),
    ([(1.0,), 3], None, r"rows\[1\]: not a flat sequence of numbers"),
    ([(True,)], None, r"rows\[0\]: not a flat sequence of numbers"),
    ([(1 << 64,)], INT, r"rows: an integer outside int64"),
])
def test_bad_rows_are_refused_by_index(rows: list, dtype: np.dtype | None,
                                       message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Ragged.of(rows) if dtype is None else Ragged.of(rows, dtype)


def test_bad_arrays_are_refused() -> None:
    with pytest.raises(ValueError, match="lengths"):
        Ragged(np.zeros(3), (1, 1))
    with pytest.raises(ValueError, match="1-D"):
        Ragged(np.zeros((2, 2)), (2, 2))
    with pytest.raises(ValueError, match="float64 or int64"):
        Ragged(np.zeros(2, dtype=np.float32), (2,))
    for lengths in ((-1, 1), (True,), (1.0,)):
        with pytest.raises(ValueError, match="non-negative integers"):
            Ragged(np.zeros(1), lengths)  # type: ignore[arg-type]


def test_repr_rebuilds_the_value() -> None:
    for ragged in (Ragged.of(((-0.5,), ())), Ragged.of(((1, 2),), INT)):
        assert eval(repr(ragged), {"Ragged": Ragged, "INT": INT}) == ragged


def test_from_table_shares_frozen_rows_and_copies_writable_ones() -> None:
    table = np.array([[0, 1], [2, 3], [4, 5]], dtype=np.int64)
    ragged = Ragged.from_table(table)
    assert ragged == Ragged.of(((0, 1), (2, 3), (4, 5)), INT)
    table[0, 0] = 9  # the caller's writable array was copied
    assert ragged[0] == (0, 1)
    table.flags.writeable = False
    assert np.shares_memory(Ragged.from_table(table).values, table)
    with pytest.raises(ValueError, match=r"table: expected an \(n, T\) array"):
        Ragged.from_table(np.zeros(3))


@given(float_rows)
def test_unpadded_is_from_padded_with_the_rows_mask(rows: tuple[tuple[float, ...], ...]) -> None:
    ragged = Ragged.of(rows)
    values, mask = ragged.padded()
    computed = -values  # something computed per token, padding included
    unpadded = ragged.unpadded(computed)
    assert unpadded == Ragged.from_padded(computed, mask)
    assert unpadded.lengths == ragged.lengths and not unpadded.values.flags.writeable
    computed[...] = 7.0  # the rows are a copy: the array they came from may change
    assert unpadded == Ragged.from_padded(-values, mask)


@given(float_rows.filter(lambda rows: rows and min(map(len, rows)) > 0))
def test_with_the_mask_given_padding_and_unpadding_give_the_same_bits(
        rows: tuple[tuple[float, ...], ...]) -> None:
    """`padded_values` and `unpadded` handed `padded()`'s mask (None when every row has one
    length, as the core's minibatch inputs hold it) give what they give computing it."""
    ragged = Ragged.of(rows)
    values, mask = ragged.padded()
    given_mask = None if ragged.uniform() else mask
    table = ragged.padded_values(given_mask)
    assert table.shape == values.shape and table.tobytes() == values.tobytes()
    computed = -values
    assert ragged.unpadded(computed, given_mask) == ragged.unpadded(computed)


def test_unpadded_refuses_an_array_of_another_shape() -> None:
    ragged = Ragged.of(((1.0, 2.0), (3.0,)))
    with pytest.raises(ValueError, match=r"^values: expected shape \(2, 2\)"):
        ragged.unpadded(np.zeros((2, 3)))
