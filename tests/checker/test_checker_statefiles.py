"""The sequential BFS with its parents and its queue on disk (`checker.statefiles`): a queue
spilled to disk changes nothing a search reports (counts, discovery order, verdicts, traces),
a trace read back from the parents file is the one a dict of parents gives, checkpoints carry
both, and the files are gone when the search is over, or has failed."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import checker.statefiles as statefiles
from checker import BaseModel, Checker, CheckResult, Property
from checker.examples import TwoPhaseCommit
from checker.statefiles import estimate_pair_bytes


class Drawn(BaseModel[tuple[int, int], int]):
    """A graph drawn by hypothesis: state ``(0, i)`` has an edge to ``(0, j)`` for each ``j``
    in ``edges[i]``; `bad` violates an invariant, `final` ends runs (the others without
    successors deadlock).  Tuples: fast fingerprints, not int keys."""

    def __init__(self, edges: list[list[int]], bad: int, final: int) -> None:
        self.edges, self.bad, self.final = edges, bad, final

    def init_states(self) -> list[tuple[int, int]]:
        return [(0, 0)]

    def actions(self, state: tuple[int, int]) -> list[int]:
        return self.edges[state[1]]

    def next_state(self, state: tuple[int, int], action: int) -> tuple[int, int]:
        return (0, action)

    def is_final(self, state: tuple[int, int]) -> bool:
        return state[1] == self.final

    def properties(self) -> list[Property]:
        return [Property.always("not bad", lambda s: s[1] != self.bad),
                Property.sometimes("final", lambda s: s[1] == self.final)]


class Grid(BaseModel[tuple[int, int], str]):
    """Steps right (``x + 1``) or, to another row, up or down: `depth` x `rows` states, the
    one at the far end of row 0 bad (found deep, with many records written before it)."""

    def __init__(self, depth: int, rows: int) -> None:
        self.depth, self.rows = depth, rows

    def init_states(self) -> list[tuple[int, int]]:
        return [(0, self.rows // 2)]

    def actions(self, state: tuple[int, int]) -> list[str]:
        x, y = state
        return ([] if x == self.depth else ["right"]) + (["up"] if y + 1 < self.rows else []) \
            + (["down"] if y > 0 else [])

    def next_state(self, state: tuple[int, int], action: str) -> tuple[int, int]:
        x, y = state
        return {"right": (x + 1, y), "up": (x, y + 1), "down": (x, y - 1)}[action]

    def properties(self) -> list[Property]:
        return [Property.always("far corner", lambda s: s != (self.depth, 0))]


def _reference_path(model: Any, bad: Any) -> list[Any]:
    """The path to `bad` by a plain BFS keeping its parents in a dict (first discovery)."""
    start = model.init_states()[0]
    parents: dict[Any, Any] = {start: None}
    queue = deque([start])
    while queue:
        s = queue.popleft()
        for a in model.actions(s):
            t = model.next_state(s, a)
            if t is not None and t not in parents:
                parents[t] = s
                queue.append(t)
    path = [bad]
    while parents[path[-1]] is not None:
        path.append(parents[path[-1]])
    return path[::-1]


def _same(a: CheckResult, b: CheckResult) -> None:
    """Same counts, verdicts and traces (their states and actions)."""
    assert (a.distinct_states, a.states_generated, a.max_depth, a.complete, a.stop_reason) == (
        b.distinct_states, b.states_generated, b.max_depth, b.complete, b.stop_reason)
    assert a.coverage == b.coverage
    assert a.properties.keys() == b.properties.keys()
    for name, p in a.properties.items():
        q = b.properties[name]
        assert p.verdict is q.verdict
        assert (p.trace is None) == (q.trace is None)
        if p.trace is not None and q.trace is not None:
            assert p.trace.steps == q.trace.steps


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Spilled levels in blocks of 3 states (many blocks a level); the spills, counted."""
    monkeypatch.setattr(statefiles, "SPILL_BLOCK", 3)
    spills: list[int] = []
    spill = statefiles.LevelQueue._spill

    def counted(self: statefiles.LevelQueue) -> None:
        spills.append(len(self.items))
        spill(self)

    monkeypatch.setattr(statefiles.LevelQueue, "_spill", counted)
    return spills


GRAPHS = st.integers(2, 40).flatmap(lambda n: st.tuples(
    st.lists(st.lists(st.integers(0, n - 1), max_size=4), min_size=n, max_size=n),
    st.integers(0, n - 1), st.integers(0, n - 1)))


@settings(max_examples=60, deadline=None)
@given(GRAPHS, st.sampled_from(["all_decided", "exhausted"]))
def test_a_spilled_queue_changes_nothing_a_search_reports(
    graph: tuple[list[list[int]], int, int], finish_when: str
) -> None:
    edges, bad, final = graph
    model = Drawn(edges, bad, final)
    in_memory = Checker(model, queue_memory=None, record_graph=True,
                        finish_when=finish_when).bfs()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(statefiles, "SPILL_BLOCK", 2)  # levels of several blocks
        spilled = Checker(model, queue_memory=1, record_graph=True,
                          finish_when=finish_when).bfs()
    _same(spilled, in_memory)
    # discovery order: the order the recorded graph met the states in
    assert list(spilled.recorded.graph.nodes) == list(in_memory.recorded.graph.nodes)


def test_two_phase_commit_spilled_in_many_blocks(tmp_path: Path, small_blocks: list[int]) -> None:
    model = TwoPhaseCommit(5)
    reference = Checker(model, queue_memory=None).bfs()
    spilled = Checker(model, queue_memory=1, work_dir=tmp_path).bfs()
    assert len(small_blocks) > 10 and max(small_blocks) > 3  # levels of several blocks
    _same(spilled, reference)
    assert list(tmp_path.iterdir()) == []  # states/ and its files removed


@pytest.mark.parametrize("queue_memory", [None, 1])
def test_a_deep_counterexample_read_back_from_the_parents_file(queue_memory: int | None) -> None:
    """Past the records kept in memory (16,384) and a read's block (65,536): the chain is
    read back from the file."""
    model = Grid(depth=700, rows=120)
    result = Checker(model, queue_memory=queue_memory).bfs()
    assert result.distinct_states > 70_000
    trace = result.counterexample("far corner")
    assert trace.states == _reference_path(model, (700, 0))
    assert len(trace) == 700 + 60


def test_a_parallel_search_reads_its_workers_parents_files(tmp_path: Path) -> None:
    """Each worker's parents on disk: a shortest counterexample (perhaps another one than the
    sequential search's), and the files gone at the end."""
    model = Grid(depth=200, rows=40)
    result = Checker(model, processes=2, work_dir=tmp_path, finish_when="exhausted").bfs()
    assert result.processes == 2 and result.distinct_states == 201 * 40
    trace = result.counterexample("far corner")
    assert trace.states[-1] == (200, 0) and len(trace) == 200 + 20
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_and_resume_with_the_queue_on_disk(tmp_path: Path,
                                                      small_blocks: list[int]) -> None:
    model = TwoPhaseCommit(5)
    path = tmp_path / "run.ckpt"
    part = Checker(model, max_states=2_500, checkpoint_path=path, queue_memory=1).bfs()
    assert not part.complete and small_blocks
    resumed = Checker(model, resume_from=path, queue_memory=1).bfs()
    _same(resumed, Checker(model).bfs())


class Failing(Grid):
    """A grid whose model fails once the search is deep enough to have spilled."""

    def next_state(self, state: tuple[int, int], action: str) -> tuple[int, int]:
        if state[0] == 30:
            raise RuntimeError("the model failed")
        return super().next_state(state, action)


def test_the_files_are_removed_when_the_search_fails(tmp_path: Path,
                                                     small_blocks: list[int]) -> None:
    with pytest.raises(RuntimeError, match="the model failed"):
        Checker(Failing(depth=100, rows=50), queue_memory=1, work_dir=tmp_path).bfs()
    assert small_blocks
    assert list(tmp_path.iterdir()) == []


def test_another_searchs_states_folder_is_left_alone(tmp_path: Path) -> None:
    other = tmp_path / "states" / "another-run"
    other.mkdir(parents=True)
    Checker(TwoPhaseCommit(3), work_dir=tmp_path).bfs()
    assert [p.name for p in (tmp_path / "states").iterdir()] == ["another-run"]


def test_a_queued_pair_is_estimated_with_what_it_reaches() -> None:
    shared = tuple(range(100, 120))
    pairs = [((i, shared), i) for i in range(1000, 1010)]
    bytes_each = estimate_pair_bytes(pairs)
    # its tuples, int, and list slot, and a tenth of the shared tuple and its ints
    assert 56 + 56 + 28 + 8 < bytes_each < 56 + 56 + 2 * 28 + 8 + (200 + 20 * 28) // 10 + 40
