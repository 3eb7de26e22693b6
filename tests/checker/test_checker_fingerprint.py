"""Fingerprints: stable across processes, equal for equal values however they were built."""

from __future__ import annotations

import enum
import json
import os
import pickle
import subprocess
import sys
from collections import namedtuple
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from checker import canonical, fingerprint
from checker.examples import TwoPhaseView
from checker.fingerprint import MASK64, encode_key, owner_of

KEYS = [
    0,
    12345,
    MASK64,
    -1,
    1 << 70,
    "text",
    b"bytes",
    (1, "a", (2, 3), None, True, 1.5),
    frozenset({"b", "a", "c"}),
    (frozenset({1, 9, 17}), {"k": (1, 2)}),
    TwoPhaseView(
        ("working", "aborted"), "init", frozenset({1}), frozenset({"Abort", "Prepared(1)"})
    ),
]

_CHILD = """
import json, sys
from checker import fingerprint
from checker.examples import TwoPhaseView
from checker.fingerprint import MASK64
KEYS = %s
print(json.dumps([str(fingerprint(k)) for k in KEYS]))
"""


def _keys_source() -> str:
    return (
        "[0, 12345, MASK64, -1, 1 << 70, 'text', b'bytes', (1, 'a', (2, 3), None, True, 1.5), "
        "frozenset({'b', 'a', 'c'}), (frozenset({1, 9, 17}), {'k': (1, 2)}), "
        "TwoPhaseView(('working', 'aborted'), 'init', frozenset({1}), "
        "frozenset({'Abort', 'Prepared(1)'}))]"
    )


def test_fingerprints_are_stable_across_processes_and_hash_seeds() -> None:
    here = [str(fingerprint(k)) for k in KEYS]
    for seed in ("1", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run(
            [sys.executable, "-c", _CHILD % _keys_source()],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert json.loads(out.stdout) == here


def test_small_non_negative_ints_are_their_own_fingerprint() -> None:
    assert fingerprint(0) == 0 and fingerprint(MASK64) == MASK64
    assert fingerprint(-1) != -1 and 0 <= fingerprint(-1) <= MASK64
    assert 0 <= fingerprint(1 << 70) <= MASK64


def test_types_are_distinguished() -> None:
    values = [1, True, 1.0, "1", b"1", (1,), frozenset({1}), [1], None, ("\x00set", (1,))]
    fps = [fingerprint(v) for v in values]
    assert len(set(fps)) == len(values)


def test_sharing_does_not_change_the_fingerprint() -> None:
    a = "".join(["ab", "cd"])
    b = "".join(["ab", "cd"])
    assert a is not b
    assert pickle.dumps((a, a)) != pickle.dumps((a, b))  # why pickle is not used directly
    assert fingerprint((a, a)) == fingerprint((a, b))
    t1 = (1, 2)
    assert fingerprint((t1, t1)) == fingerprint(((1, 2), tuple([1, 2])))


def test_set_iteration_order_does_not_matter() -> None:
    # 1, 9 and 17 collide in a small set table, so insertion order changes iteration order
    x = frozenset([1, 9, 17])
    y = frozenset([17, 9, 1])
    assert fingerprint(x) == fingerprint(y)
    assert fingerprint((x, "t")) == fingerprint((y, "t"))
    d1 = {"a": 1, "b": 2}
    d2 = {"b": 2, "a": 1}
    assert fingerprint(d1) == fingerprint(d2)
    assert encode_key(x) == encode_key(y)


class Color(enum.Enum):
    RED = 1
    BLUE = 2


@dataclass(frozen=True)
class Inner:
    xs: tuple[int, ...]
    tags: frozenset[str]


@dataclass(frozen=True)
class Outer:
    inner: Inner
    color: Color


Pt = namedtuple("Pt", "x y")


def test_structured_keys() -> None:
    a = Outer(Inner((1, 2), frozenset({"x", "y"})), Color.RED)
    b = Outer(Inner((1, 2), frozenset({"y", "x"})), Color.RED)
    c = Outer(Inner((1, 2), frozenset({"y", "x"})), Color.BLUE)
    assert fingerprint(a) == fingerprint(b) != fingerprint(c)
    assert fingerprint(Pt(1, 2)) != fingerprint((1, 2))
    assert canonical(a)[0] == "dc"


values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.text(max_size=5)
    | st.binary(max_size=5),
    lambda children: st.tuples(children, children)
    | st.lists(children, max_size=3).map(tuple)
    | st.frozensets(st.integers(-50, 50) | st.text(max_size=3), max_size=5),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(values)
def test_equal_values_have_equal_fingerprints(v: object) -> None:
    rebuilt = pickle.loads(pickle.dumps(v))  # same value, other objects and sharing
    assert fingerprint(rebuilt) == fingerprint(v)
    assert 0 <= fingerprint(v) <= MASK64


@settings(max_examples=100, deadline=None)
@given(values, values)
def test_different_values_have_different_fingerprints(a: object, b: object) -> None:
    if (a != b or type(a) is not type(b)) and canonical(a) != canonical(b):
        assert fingerprint(a) != fingerprint(b)


def test_owner_of_spreads_and_is_in_range() -> None:
    owners = [owner_of(i, 3) for i in range(3000)]
    assert set(owners) == {0, 1, 2}
    assert all(800 < owners.count(k) < 1200 for k in range(3))
    assert owner_of(123, 1) == 0
