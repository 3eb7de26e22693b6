"""Checkpoint / resume: an interrupted then resumed search equals an uninterrupted one."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from checker import (
    Checker,
    CheckpointError,
    CheckResult,
    Progress,
    load_checkpoint,
    save_checkpoint,
)
from checker.examples import TwoPhaseCommit


def _same(a: CheckResult, b: CheckResult) -> None:
    assert a.complete and b.complete
    assert (a.distinct_states, a.states_generated, a.max_depth) == (
        b.distinct_states,
        b.states_generated,
        b.max_depth,
    )
    assert a.coverage == b.coverage
    assert {n: p.verdict for n, p in a.properties.items()} == {
        n: p.verdict for n, p in b.properties.items()
    }
    for name, p in a.properties.items():
        q = b.properties[name]
        assert (p.trace is None) == (q.trace is None)
        if p.trace is not None:
            assert len(p.trace) == len(q.trace)


@pytest.fixture(scope="module")
def reference() -> CheckResult:
    return Checker(TwoPhaseCommit(5)).bfs()


@pytest.mark.parametrize(("first", "second"), [(1, 1), (1, 2), (2, 1), (2, 2)])
def test_interrupt_then_resume_equals_uninterrupted(
    tmp_path: Path, reference: CheckResult, first: int, second: int
) -> None:
    model = TwoPhaseCommit(5)
    path = tmp_path / "run.ckpt"
    checker = Checker(model, max_states=2_500, checkpoint_path=path, processes=first)
    part = checker.bfs()
    assert not part.complete and part.stop_reason == "max_states"
    assert checker.checkpoints_written == 1 and path.exists()
    assert part.distinct_states < reference.distinct_states
    resumed = Checker(model, resume_from=path, processes=second).bfs()
    _same(resumed, reference)
    assert [p.name for p in tmp_path.iterdir()] == ["run.ckpt"]  # no temp file left behind


def test_chained_resumes(tmp_path: Path, reference: CheckResult) -> None:
    model = TwoPhaseCommit(5)
    path = tmp_path / "run.ckpt"
    Checker(model, max_states=1_000, checkpoint_path=path).bfs()
    mid = Checker(model, max_states=5_000, checkpoint_path=path, resume_from=path).bfs()
    assert not mid.complete and mid.distinct_states >= 5_000
    _same(Checker(model, resume_from=path).bfs(), reference)


def test_checkpoint_on_request_mid_run(tmp_path: Path, reference: CheckResult) -> None:
    model = TwoPhaseCommit(5)
    path = tmp_path / "run.ckpt"

    def ask(p: Progress) -> None:
        if not p.done and p.distinct > 3_000 and not asked:
            asked.append(p.distinct)
            checker.request_checkpoint()

    asked: list[int] = []
    checker = Checker(model, checkpoint_path=path, progress=ask, progress_interval=0.0)
    full = checker.bfs()
    _same(full, reference)
    assert checker.checkpoints_written == 1
    data = load_checkpoint(path)
    assert asked and len(data["visited"]) >= asked[0]
    assert len(data["visited"]) < reference.distinct_states
    _same(Checker(model, resume_from=path).bfs(), reference)


def test_periodic_checkpoints(tmp_path: Path, reference: CheckResult) -> None:
    model = TwoPhaseCommit(5)
    path = tmp_path / "run.ckpt"
    checker = Checker(model, checkpoint_path=path, checkpoint_interval=0.0)
    _same(checker.bfs(), reference)
    assert checker.checkpoints_written > 1
    par = Checker(
        model, checkpoint_path=tmp_path / "par.ckpt", checkpoint_interval=0.0, processes=2
    )
    _same(par.bfs(), reference)
    assert par.checkpoints_written > 1
    _same(Checker(model, resume_from=tmp_path / "par.ckpt").bfs(), reference)


def test_a_violation_found_before_the_interruption_survives(tmp_path: Path) -> None:
    model = TwoPhaseCommit(4, buggy=True)
    whole = Checker(model, finish_when="exhausted").bfs()
    path = tmp_path / "bug.ckpt"
    part = Checker(model, max_states=300, checkpoint_path=path, finish_when="exhausted").bfs()
    assert part.counterexample("consistent") is not None  # found at depth 3
    resumed = Checker(model, resume_from=path, finish_when="exhausted").bfs()
    _same(resumed, whole)
    assert (
        resumed.counterexample("consistent").actions
        == whole.counterexample("consistent").actions
    )


def test_resume_refuses_another_model_or_garbage(tmp_path: Path) -> None:
    path = tmp_path / "run.ckpt"
    Checker(TwoPhaseCommit(3), max_states=50, checkpoint_path=path).bfs()
    with pytest.raises(CheckpointError, match="model"):
        Checker(TwoPhaseCommit(4), resume_from=path).bfs()
    junk = tmp_path / "junk"
    junk.write_bytes(b"not a pickle")
    with pytest.raises(CheckpointError):
        Checker(TwoPhaseCommit(3), resume_from=junk).bfs()
    other = tmp_path / "other"
    other.write_bytes(pickle.dumps({"format": "something else"}))
    with pytest.raises(CheckpointError):
        load_checkpoint(other)
    with pytest.raises(CheckpointError):
        Checker(TwoPhaseCommit(3), resume_from=path).dfs()


def test_save_checkpoint_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / "c.ckpt"
    save_checkpoint(path, {"model": "m", "x": 1})
    first = path.read_bytes()
    save_checkpoint(path, {"model": "m", "x": 2})
    assert load_checkpoint(path, "m")["x"] == 2
    assert first != path.read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["c.ckpt"]


@pytest.mark.parametrize("processes", [1, 2])
def test_pending_states_of_a_checkpoint_join_the_frontier(
    tmp_path: Path, reference: CheckResult, processes: int
) -> None:
    """A checkpoint may hold states met but not yet visited (``pending``, with their parents):
    both searches resume them through `resume_levels`, as visited states of the frontier."""
    model = TwoPhaseCommit(5)
    path = tmp_path / "run.ckpt"
    Checker(model, max_states=2_500, checkpoint_path=path).bfs()
    data = load_checkpoint(path)
    (depth, level), *rest = sorted(data["levels"], key=lambda lv: lv[0])
    kept, moved = level[: len(level) // 2], level[len(level) // 2 :]
    assert moved
    data["levels"] = [(depth, kept), *rest]
    data["pending"] = (depth, [(t, g, data["visited"].pop(g)) for t, g in moved])
    save_checkpoint(path, data)
    _same(Checker(model, resume_from=path, processes=processes).bfs(), reference)
