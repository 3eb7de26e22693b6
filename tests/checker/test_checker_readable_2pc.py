"""The readable two-phase commit: the same state space, counts and traces as the packed model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from checker import Checker, Verdict
from checker.examples import TwoPhaseCommit, TwoPhaseReadable
from checker.examples.two_phase_readable import COMMIT, Message, TwoPhaseState
from checker.fingerprint import collision_probability, owner_of
from checker.model import reachable_states
from checker.parallel import _judge


def _reachable(model: TwoPhaseReadable) -> set[TwoPhaseState]:
    return set(reachable_states(model))


def _as_view(state: TwoPhaseState) -> tuple:
    """A readable state in the shape of the packed model's `view_state`."""
    msgs = {f"Prepared({m.rm})" if m.type == "Prepared" else m.type for m in state.msgs}
    return state.rm_state, state.tm_state, state.tm_prepared, frozenset(msgs)


@pytest.mark.parametrize("buggy", [False, True])
def test_the_state_space_is_the_packed_models(buggy: bool) -> None:
    readable = TwoPhaseReadable(3, buggy=buggy)
    packed = TwoPhaseCommit(3, buggy=buggy)
    views = {
        (v.rm_state, v.tm_state, v.tm_prepared, v.msgs)
        for v in map(packed.view_state, reachable_states(packed))
    }
    assert {_as_view(s) for s in _reachable(readable)} == views


@pytest.mark.parametrize(
    ("rms", "distinct", "generated", "depth"),
    [
        (3, 288, 1_146, 10),
        (5, 8_832, 58_146, 16),
    ],
)
def test_counts_coverage_and_verdicts_equal_the_packed_models(
    rms: int, distinct: int, generated: int, depth: int
) -> None:
    readable = Checker(TwoPhaseReadable(rms)).bfs()
    packed = Checker(TwoPhaseCommit(rms)).bfs()
    assert (readable.distinct_states, readable.states_generated, readable.max_depth) == (
        distinct,
        generated,
        depth,
    )
    assert readable.coverage == packed.coverage
    assert {n: p.verdict for n, p in readable.properties.items()} == {
        n: p.verdict for n, p in packed.properties.items()
    }
    assert readable.ok
    # witnesses: as short as the packed model's, through the same actions
    for name in ("commit agreement", "abort agreement"):
        assert readable.witness(name).actions == packed.witness(name).actions


@pytest.mark.slow
def test_seven_resource_managers_as_tlc_counts_them() -> None:
    result = Checker(TwoPhaseReadable(7)).bfs()
    assert (result.distinct_states, result.states_generated, result.max_depth) == (
        296_448,
        2_744_706,
        22,
    )
    assert result.fingerprints == "fast"
    assert result.collision_probability == collision_probability(296_448, 2_744_706)


def test_fused_successors_agree_with_actions_and_next_state() -> None:
    for buggy in (False, True):
        model = TwoPhaseReadable(3, buggy=buggy)
        states = _reachable(model)
        assert len(states) == (288 if not buggy else 623)
        assert all(model.check_successors(s) for s in states)


def test_the_buggy_tm_gives_the_packed_models_counterexample() -> None:
    model = TwoPhaseReadable(3, buggy=True)
    result = Checker(model).bfs()
    trace = result.counterexample("consistent")
    packed = Checker(TwoPhaseCommit(3, buggy=True)).bfs().counterexample("consistent")
    assert trace.actions == packed.actions
    assert [model.format_action(a) for a in trace.actions] == [
        "TMCommit",
        "RMChooseToAbort(0)",
        "RMRcvCommitMsg(1)",
    ]
    assert trace.last_state == TwoPhaseState(
        ("aborted", "committed", "working"), "committed", frozenset(), frozenset({COMMIT})
    )


def test_stable_fast_and_parallel_searches_agree() -> None:
    model = TwoPhaseReadable(4)
    fast = Checker(model).bfs()
    stable = Checker(model, fingerprints="stable").bfs()
    parallel = Checker(model, processes=2).bfs()
    assert fast.fingerprints == parallel.fingerprints == "fast" and stable.fingerprints == "stable"
    for other in (stable, parallel):
        assert (other.distinct_states, other.states_generated, other.coverage) == (
            fast.distinct_states, fast.states_generated, fast.coverage)
    # One process explores in the same order whatever the fingerprints: the same traces.  The
    # workers' interleaving picks another of the shortest ones.
    assert {n: p.trace for n, p in stable.properties.items()} == {
        n: p.trace for n, p in fast.properties.items()
    }
    assert {n: p.trace and len(p.trace) for n, p in parallel.properties.items()} == {
        n: p.trace and len(p.trace) for n, p in fast.properties.items()}


def test_messages_read_as_the_specs_records() -> None:
    assert Message("Prepared", 2) == ("Prepared", 2) and Message("Commit").rm is None
    with pytest.raises(ValueError):
        TwoPhaseReadable(0)


@pytest.mark.parametrize(("first", "second"), [(1, 2), (2, 1)])
def test_a_checkpoint_resumes_under_another_process_count(
    tmp_path: Path, first: int, second: int
) -> None:
    model = TwoPhaseReadable(4)
    path = tmp_path / "run.ckpt"
    part = Checker(model, max_states=700, checkpoint_path=path, processes=first).bfs()
    assert part.stop_reason == "max_states" and part.fingerprints == "stable"
    resumed = Checker(model, resume_from=path, processes=second).bfs()
    whole = Checker(model).bfs()
    assert resumed.complete and resumed.fingerprints == "stable"
    assert (resumed.distinct_states, resumed.states_generated, resumed.coverage) == (
        whole.distinct_states, whole.states_generated, whole.coverage)


def test_parallel_workers_keep_their_states_and_the_coordinator_judges_fingerprints() -> None:
    # two workers propose 5 and 7; 5 was visited; 7 (and 9) are new: 7 goes to its owner
    visited = {5: 0}
    owner7 = owner_of(7, 2)
    verdicts, new = _judge([[5, 7, 9], [7]], visited, 2)
    assert new == 2 and visited[7] == owner7 and visited[9] == 0
    assert verdicts[0] == bytes([0, owner7 == 0, 1]) and verdicts[1] == bytes([owner7 == 1])
    # stopped by max_states in parallel, every visited state has been checked (none is lost)
    model = TwoPhaseReadable(4, buggy=True)
    bounded = Checker(model, processes=2, max_states=300, finish_when="exhausted").bfs()
    assert bounded.stop_reason == "max_states" and bounded.distinct_states >= 300
    assert bounded.verdict("consistent") is Verdict.VIOLATED
    assert len(bounded.counterexample("consistent")) == 3


def test_parallel_workers_share_the_levels() -> None:
    # The initial state is one worker's, and a worker wins the states it alone met: without
    # rebalancing, that worker would expand every state and the other none.
    result = Checker(TwoPhaseReadable(5), processes=2).bfs()
    note = next(n for n in result.notes if n.startswith("states expanded per worker"))
    shares = [int(x.replace(",", "")) for x in re.findall(r"[\d,]+", note.split(";")[0])]
    assert sum(shares) == result.distinct_states == 8_832
    assert min(shares) > 0.35 * result.distinct_states
