"""The engine's choice of fingerprints: fast (Python's hash) only where it is valid."""

from __future__ import annotations

import enum
import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pytest

from checker import BaseModel, Checker, Property
from checker.examples import TwoPhaseCommit, TwoPhaseReadable
from checker.fingerprint import collision_probability, hashes_by_value

# -------------------------------------------------------------------- which states hash by value


class Phase(enum.Enum):
    IDLE = 1
    BUSY = 2


class Point(NamedTuple):
    x: int
    y: str


@dataclass(frozen=True)
class Envelope:
    """As `invar.model.world.Message`: equality (and the hash) on `key` only."""

    key: str
    body: object = field(compare=False)


@dataclass(frozen=True)
class Node:
    phase: Phase
    at: Point
    seen: frozenset[Envelope]


class ByIdentity:
    pass


class PartialHash:
    def __init__(self, a: int, b: int) -> None:
        self.a, self.b = a, b

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PartialHash) and (self.a, self.b) == (other.a, other.b)

    def __hash__(self) -> int:
        return hash(self.a)  # legal Python, but two unequal values share a hash by design


@dataclass(frozen=True, eq=False)
class NoEq:
    x: int


def test_ordinary_states_hash_by_value() -> None:
    node = Node(Phase.BUSY, Point(1, "a"), frozenset({Envelope("k", body=[1, 2])}))
    for key in (
        0, "s", b"b", 1.5, None, True, (1, ("a", None)), frozenset({1, 2}), Phase.IDLE, node
    ):
        assert hashes_by_value(key) is None, key


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ((1, ByIdentity()), "ByIdentity hashes by identity"),
        (frozenset({PartialHash(1, 2)}), "PartialHash has its own __hash__"),
        (Point(1, NoEq(3)), "NoEq hashes by identity"),  # type: ignore[arg-type]
        (("a", [1, 2]), "list is not hashable"),
    ],
)
def test_other_states_are_named_with_the_reason(key: object, reason: str) -> None:
    problem = hashes_by_value(key)
    assert problem is not None and reason in problem


@dataclass(unsafe_hash=True)
class Mutable:
    """Hashes by value (the generated __hash__), but its fields can still change."""

    x: object


def test_a_searchs_verified_parts_are_not_walked_again_unless_they_can_change() -> None:
    """`verified` keeps the parts of keys found to hash by value, only when every part of the
    key is immutable: a part that can still change is walked every time it is sampled."""
    verified: dict[int, object] = {}
    node = Node(Phase.BUSY, Point(1, "a"), frozenset({Envelope("k", body=[1, 2])}))
    assert hashes_by_value((node, 1), verified) is None
    assert verified.get(id(node)) is node and verified.get(id(node.at)) is node.at
    kept = dict(verified)
    assert hashes_by_value((node, 2), verified) is None  # node is not walked again
    assert set(verified) > set(kept)  # only the new tuple is added
    loose = Mutable(Point(2, "b"))
    before = dict(verified)
    assert hashes_by_value((loose,), verified) is None
    assert verified == before  # nothing of a key with a mutable part is kept
    loose.x = ByIdentity()
    problem = hashes_by_value((loose,), verified)
    assert problem is not None and "ByIdentity hashes by identity" in problem


def test_collision_probability_is_tlcs_optimistic_estimate() -> None:
    assert collision_probability(296_448, 2_744_706) == pytest.approx(296_448 * 2_448_258 / 2**64)
    assert collision_probability(10, 10) == 0.0


# --------------------------------------------------------------------------- the engine's choice


class Hidden(BaseModel[tuple, str]):
    """A counter whose states from `at` on carry a new `payload()` (None before)."""

    def __init__(
        self, payload: Callable[[], object] | None, at: int = 300, limit: int = 600
    ) -> None:
        self.payload, self.at, self.limit = payload, at, limit

    def init_states(self) -> list[tuple]:
        return [(0, self.payload() if self.payload is not None and self.at == 0 else None)]

    def actions(self, state: tuple) -> list[str]:
        return ["inc", "noop"] if state[0] < self.limit else []

    def next_state(self, state: tuple, action: str) -> tuple:
        n = state[0] + (action == "inc")
        if self.payload is not None and n >= self.at:
            return n, self.payload()
        return n, None

    def is_final(self, state: tuple) -> bool:
        return state[0] == self.limit

    def properties(self) -> list[Property]:
        return [Property.sometimes("half way", lambda s: s[0] == self.limit // 2)]


def test_a_state_that_does_not_hash_by_value_restarts_the_search_with_stable_fingerprints() -> None:
    # fast fingerprints would never see two ByIdentity objects as equal: every "noop" would
    # make a new state and the search would not end; the restart finds the 601 states
    result = Checker(Hidden(ByIdentity)).bfs()
    assert result.fingerprints == "stable"
    assert result.distinct_states == 601 and result.states_generated == 1201
    assert any("ByIdentity hashes by identity" in note for note in result.notes)
    assert result.witness("half way") is not None and len(result.witness("half way")) == 300


def test_an_unhashable_state_restarts_too_and_other_type_errors_are_the_models() -> None:
    result = Checker(Hidden(list)).bfs()
    assert result.fingerprints == "stable" and result.distinct_states == 601
    assert any("unhashable type: 'list'" in note for note in result.notes)

    class Broken(Hidden):
        def next_state(self, state: tuple, action: str) -> tuple:
            raise TypeError("the model's own bug")

    with pytest.raises(TypeError, match="the model's own bug"):
        Checker(Broken(None)).bfs()


def test_parallel_workers_report_states_that_do_not_hash_by_value() -> None:
    result = Checker(Hidden(ByIdentity), processes=2).bfs()
    assert result.processes == 2 and result.fingerprints == "stable"
    assert result.distinct_states == 601
    assert any("ByIdentity" in note for note in result.notes)


def test_dfs_and_simulation_sample_states_too() -> None:
    assert Checker(Hidden(ByIdentity)).dfs().fingerprints == "stable"
    walks = Checker(Hidden(ByIdentity, at=5, limit=20)).simulate(runs=5, max_depth=50, seed=1)
    assert walks.fingerprints == "stable"


def test_states_that_hash_by_value_get_fast_fingerprints_ints_exact_ones() -> None:
    assert Checker(Hidden(None)).bfs().fingerprints == "fast"
    hidden = Hidden(lambda: Node(Phase.BUSY, Point(1, "a"), frozenset()))
    assert Checker(hidden).bfs().fingerprints == "fast"
    packed = Checker(TwoPhaseCommit(3)).bfs()
    assert packed.fingerprints == "exact" and packed.collision_probability == 0.0
    readable = Checker(TwoPhaseReadable(3)).bfs()
    assert readable.fingerprints == "fast"
    assert readable.collision_probability == collision_probability(288, 1146) > 0


def test_an_initial_state_that_does_not_hash_by_value_means_stable_from_the_start() -> None:
    result = Checker(Hidden(ByIdentity, at=0)).bfs()
    assert result.fingerprints == "stable" and result.notes == []


def test_fingerprints_leaving_the_process_are_stable(tmp_path: Path) -> None:
    model = TwoPhaseReadable(3)
    checkpointed = Checker(model, checkpoint_path=tmp_path / "c", max_states=50)
    assert checkpointed.bfs().fingerprints == "stable"
    for options in ({"checkpoint_path": tmp_path / "c"}, {"resume_from": tmp_path / "c"}):
        with pytest.raises(ValueError, match="stable"):
            Checker(model, fingerprints="fast", **options)  # type: ignore[arg-type]


def test_a_recorded_graph_is_built_in_one_process_with_fast_fingerprints() -> None:
    """The livelock check's graph never leaves the process: the fast kind labels it, and the
    verdicts and counts are those of the stable kind."""
    model = TwoPhaseReadable(3)
    fast = Checker(model, check_livelock=True).bfs()
    stable = Checker(model, check_livelock=True, fingerprints="stable").bfs()
    assert fast.fingerprints == "fast" and stable.fingerprints == "stable"
    assert fast.graph.number_of_nodes() == stable.graph.number_of_nodes() == fast.distinct_states
    assert fast.graph.number_of_edges() == stable.graph.number_of_edges()
    assert {n: p.verdict for n, p in fast.properties.items()} == \
        {n: p.verdict for n, p in stable.properties.items()}
    with pytest.raises(ValueError, match="fingerprints must be"):
        Checker(model, fingerprints="sha1")


class Signed(BaseModel[tuple, str]):
    """(x,) for x from 0 down to -3: -1 and -2 share Python's hash (-1 is C's error code)."""

    def init_states(self) -> list[tuple]:
        return [(0,)]

    def actions(self, state: tuple) -> list[str]:
        return ["dec"] if state[0] > -3 else []

    def next_state(self, state: tuple, action: str) -> tuple:
        return (state[0] - 1,)

    def is_final(self, state: tuple) -> bool:
        return state[0] == -3


def test_the_documented_structural_collision_and_its_remedy() -> None:
    # What `checker.fingerprint` warns of: under fast fingerprints (-1,) and (-2,) are one state.
    assert hash((-1,)) == hash((-2,))
    assert Checker(Signed(), fingerprints="fast").bfs().distinct_states == 2
    assert Checker(Signed(), fingerprints="stable").bfs().distinct_states == 4


def test_the_collector_settings_come_back_after_a_search() -> None:
    before = gc.get_threshold()
    Checker(TwoPhaseReadable(3)).bfs()
    assert gc.get_threshold() == before

    class Failing(Hidden):
        def next_state(self, state: tuple, action: str) -> tuple:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        Checker(Failing(None)).bfs()
    assert gc.get_threshold() == before
