"""Two-phase commit: pinned state counts, verdicts, shortest counterexample, symmetry."""

from __future__ import annotations

import itertools

import pytest

from checker import Checker, Verdict, check
from checker.examples import TwoPhaseCommit
from checker.examples.two_phase_commit import (
    RMChooseToAbort,
    RMRcvCommitMsg,
    TMCommit,
)
from checker.model import reachable_states

# --------------------------------------------------------------------------- brute force
# An independent, spec-shaped TwoPhase: dicts and frozensets of strings, no bit tricks.


def _spec_init(rms: int) -> tuple:
    return (("working",) * rms, "init", frozenset(), frozenset())


def _spec_next(state: tuple, rms: int, buggy: bool = False) -> list[tuple]:
    rm_state, tm_state, tm_prepared, msgs = state
    out = []

    def with_rm(r: int, value: str) -> tuple:
        return tuple(value if i == r else s for i, s in enumerate(rm_state))

    if tm_state == "init" and (buggy or tm_prepared == frozenset(range(rms))):
        out.append((rm_state, "committed", tm_prepared, msgs | {("Commit",)}))
    if tm_state == "init":
        out.append((rm_state, "aborted", tm_prepared, msgs | {("Abort",)}))
    for r in range(rms):
        if tm_state == "init" and ("Prepared", r) in msgs:
            out.append((rm_state, tm_state, tm_prepared | {r}, msgs))
        if rm_state[r] == "working":
            out.append((with_rm(r, "prepared"), tm_state, tm_prepared, msgs | {("Prepared", r)}))
            out.append((with_rm(r, "aborted"), tm_state, tm_prepared, msgs))
        if ("Commit",) in msgs:
            out.append((with_rm(r, "committed"), tm_state, tm_prepared, msgs))
        if ("Abort",) in msgs:
            out.append((with_rm(r, "aborted"), tm_state, tm_prepared, msgs))
    return out


def _brute_force(rms: int) -> tuple[set[tuple], int]:
    """Reachable states (spec form) and the number of generated states (TLC's count)."""
    init = _spec_init(rms)
    seen = {init}
    frontier = [init]
    generated = 1
    while frontier:
        nxt = []
        for s in frontier:
            for t in _spec_next(s, rms):
                generated += 1
                if t not in seen:
                    seen.add(t)
                    nxt.append(t)
        frontier = nxt
    return seen, generated


def _to_int(model: TwoPhaseCommit, spec_state: tuple) -> int:
    """Encode a spec state in the model's bit layout (to compare the two state sets)."""
    rm_state, tm_state, tm_prepared, msgs = spec_state
    r = model.rms
    code = {"working": 0, "prepared": 1, "committed": 2, "aborted": 3}
    out = 0
    for i, s in enumerate(rm_state):
        out |= code[s] << (2 * i)
    out |= {"init": 0, "committed": 1, "aborted": 2}[tm_state] << (2 * r)
    for i in tm_prepared:
        out |= 1 << (2 * r + 2 + i)
    for m in msgs:
        if m[0] == "Prepared":
            out |= 1 << (3 * r + 2 + m[1])
    if ("Commit",) in msgs:
        out |= 1 << (4 * r + 2)
    if ("Abort",) in msgs:
        out |= 1 << (4 * r + 3)
    return out


def _reachable_ints(model: TwoPhaseCommit) -> set[int]:
    return set(reachable_states(model))


# --------------------------------------------------------------------------- pinned counts


@pytest.mark.parametrize(
    ("rms", "distinct", "generated", "depth"),
    [
        (3, 288, 1_146, 10),
        (5, 8_832, 58_146, 16),
        (7, 296_448, 2_744_706, 22),  # TLC: 2,744,706 generated, 296,448 distinct, depth 23
    ],
)
def test_2pc_counts_are_pinned(rms: int, distinct: int, generated: int, depth: int) -> None:
    result = Checker(TwoPhaseCommit(rms)).bfs()
    assert result.complete and result.stop_reason == "exhausted"
    assert result.distinct_states == distinct
    assert result.states_generated == generated
    assert result.max_depth == depth  # TLC reports depth + 1
    assert sum(result.coverage.values()) == generated - 1  # every transition, once
    assert result.ok
    assert result.verdict("consistent") is Verdict.HOLDS
    assert result.verdict("commit agreement") is Verdict.HOLDS
    assert result.verdict("abort agreement") is Verdict.HOLDS
    assert result.verdict("deadlock") is Verdict.HOLDS


@pytest.mark.parametrize("rms", [3, 4])
def test_2pc_matches_an_independent_brute_force(rms: int) -> None:
    spec_states, spec_generated = _brute_force(rms)
    model = TwoPhaseCommit(rms)
    result = Checker(model).bfs()
    assert result.distinct_states == len(spec_states)
    assert result.states_generated == spec_generated
    assert {_to_int(model, s) for s in spec_states} == _reachable_ints(model)
    # the properties agree with the spec form too
    committed_and_aborted = [
        s for s in spec_states if "committed" in s[0] and "aborted" in s[0]
    ]
    assert committed_and_aborted == []
    if rms == 3:
        assert len(spec_states) == 288


def test_2pc_coverage_per_action_kind_r3() -> None:
    result = Checker(TwoPhaseCommit(3)).bfs()
    assert result.coverage == {
        "TMCommit": 1,
        "TMAbort": 64,
        "TMRcvPrepared": 96,
        "RMPrepare": 156,
        "RMChooseToAbort": 156,
        "RMRcvCommitMsg": 24,
        "RMRcvAbortMsg": 648,
    }


def test_2pc_fused_successors_agree_with_actions_and_next_state() -> None:
    for buggy in (False, True):
        model = TwoPhaseCommit(3, buggy=buggy)
        for s in _reachable_ints(model):
            assert model.check_successors(s)
            # disabled actions are None
            enabled = set(model.actions(s))
            for a in [TMCommit(), RMChooseToAbort(0), RMRcvCommitMsg(1)]:
                assert (model.next_state(s, a) is None) == (a not in enabled)


# --------------------------------------------------------------------------- the buggy TM


def test_buggy_2pc_shortest_counterexample_is_pinned() -> None:
    model = TwoPhaseCommit(3, buggy=True)
    result = Checker(model).bfs()
    assert result.verdict("consistent") is Verdict.VIOLATED
    trace = result.counterexample("consistent")
    assert trace is not None
    assert trace.actions == [TMCommit(), RMChooseToAbort(0), RMRcvCommitMsg(1)]
    assert [model.format_action(a) for a in trace.actions] == [
        "TMCommit",
        "RMChooseToAbort(0)",
        "RMRcvCommitMsg(1)",
    ]
    assert trace.initial_state == 0
    view = model.view_state(trace.last_state)
    assert view.rm_state == ("aborted", "committed", "working")
    assert not model.consistent(trace.last_state)
    assert all(model.consistent(s) for s in trace.states[:-1])
    assert not result.ok
    assert [p.name for p in result.violations] == ["consistent"]


def _assert_valid_trace(model: TwoPhaseCommit, trace) -> None:  # noqa: ANN001
    assert trace.steps[0] == (None, 0)
    for (_, before), (action, after) in zip(trace.steps, trace.steps[1:]):
        assert model.next_state(before, action) == after


def test_buggy_2pc_found_by_dfs_with_a_valid_trace() -> None:
    model = TwoPhaseCommit(3, buggy=True)
    result = Checker(model).dfs()
    assert result.strategy == "dfs"
    assert result.verdict("consistent") is Verdict.VIOLATED
    trace = result.counterexample("consistent")
    _assert_valid_trace(model, trace)
    assert not model.consistent(trace.last_state)


def test_buggy_2pc_found_by_simulation() -> None:
    model = TwoPhaseCommit(5, buggy=True)
    result = Checker(model).simulate(runs=300, max_depth=40, seed=7)
    assert result.strategy == "simulate" and not result.complete
    assert result.verdict("consistent") is Verdict.VIOLATED
    trace = result.counterexample("consistent")
    _assert_valid_trace(model, trace)
    assert not model.consistent(trace.last_state)
    # the same seed gives the same walk
    again = Checker(model).simulate(runs=300, max_depth=40, seed=7)
    assert again.counterexample("consistent") == trace


def test_finish_when_any_failure_stops_early() -> None:
    model = TwoPhaseCommit(5, buggy=True)
    full = Checker(model, finish_when="exhausted").bfs()
    early = Checker(model, finish_when="any_failure").bfs()
    assert early.verdict("consistent") is Verdict.VIOLATED
    assert not early.complete and early.stop_reason == "violation"
    assert early.distinct_states < full.distinct_states
    assert len(early.counterexample("consistent")) == len(full.counterexample("consistent")) == 3


# --------------------------------------------------------------------------- parallel


@pytest.mark.parametrize("rms", [3, 5, 7])
def test_parallel_bfs_gives_the_same_counts(rms: int) -> None:
    model = TwoPhaseCommit(rms)
    seq = Checker(model).bfs()
    par = Checker(model, processes=2).bfs()
    assert par.processes == 2
    assert (par.distinct_states, par.states_generated, par.max_depth) == (
        seq.distinct_states,
        seq.states_generated,
        seq.max_depth,
    )
    assert par.coverage == seq.coverage
    assert {n: p.verdict for n, p in par.properties.items()} == {
        n: p.verdict for n, p in seq.properties.items()
    }
    # sometimes-witnesses are shortest in both
    for name in ("commit agreement", "abort agreement"):
        assert len(par.witness(name)) == len(seq.witness(name))


def test_parallel_bfs_three_workers_and_shortest_counterexample() -> None:
    model = TwoPhaseCommit(4, buggy=True)
    seq = Checker(model, finish_when="exhausted").bfs()
    par = Checker(model, processes=3, finish_when="exhausted").bfs()
    assert par.distinct_states == seq.distinct_states
    assert par.states_generated == seq.states_generated
    trace = par.counterexample("consistent")
    assert len(trace) == 3
    _assert_valid_trace(model, trace)


# --------------------------------------------------------------------------- symmetry


def _orbit_count(model: TwoPhaseCommit) -> int:
    """Distinct states up to RM permutations, by brute-force permutation of every state."""
    r = model.rms
    canon = set()
    for s in _reachable_ints(model):
        triples = model.rm_triples(s)
        best = None
        for perm in itertools.permutations(range(r)):
            cand = tuple(triples[p] for p in perm)
            if best is None or cand < best:
                best = cand
        canon.add((s & model._global_mask, best))
    return len(canon)


@pytest.mark.parametrize(("rms", "reduced"), [(3, 80), (5, 314), (7, 920)])
def test_symmetry_reduction_agrees_with_the_unreduced_search(rms: int, reduced: int) -> None:
    sym = Checker(TwoPhaseCommit(rms, symmetry=True)).bfs()
    assert sym.distinct_states == reduced
    if rms <= 5:
        plain = Checker(TwoPhaseCommit(rms)).bfs()
        assert sym.distinct_states < plain.distinct_states
        assert {n: p.verdict for n, p in sym.properties.items()} == {
            n: p.verdict for n, p in plain.properties.items()
        }
        assert reduced == _orbit_count(TwoPhaseCommit(rms))
        assert sym.max_depth == plain.max_depth


def test_symmetry_keeps_the_bug_and_a_shortest_counterexample() -> None:
    model = TwoPhaseCommit(4, buggy=True, symmetry=True)
    result = Checker(model).bfs()
    assert result.verdict("consistent") is Verdict.VIOLATED
    trace = result.counterexample("consistent")
    assert len(trace) == 3
    _assert_valid_trace(model, trace)  # concrete states, replayed through the real model
    assert not model.consistent(trace.last_state)


def test_model_protocol_and_defaults() -> None:
    from checker import BaseModel, Model

    model = TwoPhaseCommit(2)
    assert isinstance(model, Model)
    assert model.is_final(0) is False
    assert model.view_state(0).tm_state == "init"
    assert BaseModel.fingerprint_key(model, 5) == 5
    assert BaseModel.format_action(model, TMCommit()) == "TMCommit()"
    assert model.action_kind(RMRcvCommitMsg(1)) == "RMRcvCommitMsg"
    assert TwoPhaseCommit(2, symmetry=True).fingerprint_key(0) == 0


def test_check_convenience_function() -> None:
    assert check(TwoPhaseCommit(3)).distinct_states == 288
    assert check(TwoPhaseCommit(3), "dfs").distinct_states == 288
    sim = check(TwoPhaseCommit(3), "simulate", runs=5, sim_depth=10, seed=3)
    assert sim.strategy == "simulate"
    with pytest.raises(ValueError):
        check(TwoPhaseCommit(3), "astar")
