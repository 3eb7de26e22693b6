"""Small hand-made models: one feature of the engine each."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass, replace

import pytest

from checker import BaseModel, Checker, Progress, Property, Trace, Verdict, diff_states
from checker.engine import ModelContext, PropertyTracker

# --------------------------------------------------------------------------- toy models


class Counter(BaseModel[int, str]):
    """0 -inc-> 1 -inc-> ... -> limit; nothing is enabled at `limit`."""

    def __init__(
        self, limit: int = 3, final_at_limit: bool = False, props: tuple[Property, ...] = ()
    ) -> None:
        self.limit = limit
        self.final_at_limit = final_at_limit
        self.props = props

    def __repr__(self) -> str:
        return f"Counter({self.limit}, {self.final_at_limit})"

    def init_states(self) -> list[int]:
        return [0]

    def actions(self, state: int) -> list[str]:
        return ["inc"] if state < self.limit else []

    def next_state(self, state: int, action: str) -> int:
        return state + 1

    def is_final(self, state: int) -> bool:
        return self.final_at_limit and state == self.limit

    def properties(self) -> tuple[Property, ...]:
        return self.props


class Clock(BaseModel[int, str]):
    """tick: s -> s+1 (mod 4); reset: 2 -> 0."""

    def init_states(self) -> list[int]:
        return [0]

    def actions(self, state: int) -> list[str]:
        return ["tick", "reset"]

    def next_state(self, state: int, action: str) -> int | None:
        if action == "tick":
            return (state + 1) % 4
        return 0 if state == 2 else None  # reset is only enabled in 2

    def properties(self) -> list[Property]:
        return [
            Property.transition(
                "monotone unless wrapping", lambda s, a, t: t >= s or (s == 3 and a == "tick")
            ),
            Property.always("below 4", lambda s: s < 4),
        ]


class Graph(BaseModel[str, str]):
    """A model given as an explicit graph {state: [(action, next), ...]}."""

    def __init__(
        self, edges: dict[str, list[tuple[str, str]]], finals: set[str], props: list[Property]
    ) -> None:
        self.edges = edges
        self.finals = finals
        self.props = props

    def init_states(self) -> list[str]:
        return ["s0"]

    def actions(self, state: str) -> list[str]:
        return [a for a, _ in self.edges.get(state, [])]

    def next_state(self, state: str, action: str) -> str | None:
        return dict(self.edges.get(state, [])).get(action)

    def is_final(self, state: str) -> bool:
        return state in self.finals

    def properties(self) -> list[Property]:
        return self.props


DONE = Property.eventually("done", lambda s: s == "done")


@dataclass(frozen=True)
class Proc:
    pc: str  # "idle" | "waiting" | "critical"


@dataclass(frozen=True)
class MutexState:
    procs: tuple[Proc, ...]
    lock: int | None
    entered: frozenset[int]


class Mutex(BaseModel[MutexState, tuple[str, int]]):
    """Two processes and a lock (or, when `broken`, no lock at all); dataclass states."""

    def __init__(self, broken: bool = False) -> None:
        self.broken = broken

    def init_states(self) -> list[MutexState]:
        return [MutexState((Proc("idle"), Proc("idle")), None, frozenset())]

    def actions(self, state: MutexState) -> list[tuple[str, int]]:
        return [(name, i) for i in range(2) for name in ("want", "enter", "leave")]

    def next_state(self, state: MutexState, action: tuple[str, int]) -> MutexState | None:
        name, i = action
        pc = state.procs[i].pc
        procs = list(state.procs)
        if name == "want" and pc == "idle":
            procs[i] = Proc("waiting")
            return replace(state, procs=tuple(procs))
        if name == "enter" and pc == "waiting" and (self.broken or state.lock is None):
            procs[i] = Proc("critical")
            return MutexState(tuple(procs), None if self.broken else i, state.entered | {i})
        if name == "leave" and pc == "critical":
            procs[i] = Proc("idle")
            return MutexState(tuple(procs), None, state.entered)
        return None

    def action_kind(self, action: tuple[str, int]) -> str:
        return action[0]

    def format_action(self, action: tuple[str, int]) -> str:
        return f"{action[0]}({action[1]})"

    def properties(self) -> list[Property]:
        return [
            Property.always(
                "mutual exclusion", lambda s: sum(p.pc == "critical" for p in s.procs) <= 1
            ),
            Property.sometimes("both entered", lambda s: s.entered == frozenset({0, 1})),
        ]


# --------------------------------------------------------------------------- deadlock


def test_deadlock_is_reported_with_a_shortest_trace() -> None:
    result = Checker(Counter(3)).bfs()
    assert result.verdict("deadlock") is Verdict.VIOLATED
    trace = result.counterexample("deadlock")
    assert trace.actions == ["inc", "inc", "inc"]
    assert trace.states == [0, 1, 2, 3]
    assert result.distinct_states == 4 and result.states_generated == 4


def test_final_states_are_not_deadlocks_and_deadlock_check_can_be_disabled() -> None:
    assert Checker(Counter(3, final_at_limit=True)).bfs().verdict("deadlock") is Verdict.HOLDS
    result = Checker(Counter(3), check_deadlock=False).bfs()
    assert "deadlock" not in result.properties and result.ok


# --------------------------------------------------------------------------- sometimes


def test_sometimes_never_reached_is_reported_as_failing() -> None:
    props = (
        Property.sometimes("reaches 10", lambda s: s == 10),
        Property.sometimes("reaches 2", lambda s: s == 2),
    )
    result = Checker(Counter(3, final_at_limit=True, props=props)).bfs()
    assert result.verdict("reaches 10") is Verdict.NOT_REACHED
    assert result.properties["reaches 10"].trace is None
    assert result.verdict("reaches 2") is Verdict.HOLDS
    assert result.witness("reaches 2").states == [0, 1, 2]
    assert not result.ok
    assert [p.name for p in result.violations] == ["reaches 10"]


# --------------------------------------------------------------------------- transition / final


def test_transition_property_violation() -> None:
    result = Checker(Clock()).bfs()
    assert result.verdict("below 4") is Verdict.HOLDS
    assert result.verdict("monotone unless wrapping") is Verdict.VIOLATED
    trace = result.counterexample("monotone unless wrapping")
    assert trace.steps == ((None, 0), ("tick", 1), ("tick", 2), ("reset", 0))
    assert result.coverage == {"str": result.states_generated - 1}
    # the violating transition leads into a visited state: found anyway, also by DFS
    assert Checker(Clock()).dfs().verdict("monotone unless wrapping") is Verdict.VIOLATED


def test_final_property_is_checked_on_final_states() -> None:
    even = (Property.final("ends even", lambda s: s % 2 == 0),)
    bad = Checker(Counter(3, final_at_limit=True, props=even)).bfs()
    assert bad.verdict("ends even") is Verdict.VIOLATED
    assert bad.counterexample("ends even").last_state == 3
    good = Checker(Counter(4, final_at_limit=True, props=even)).bfs()
    assert good.verdict("ends even") is Verdict.HOLDS and good.ok


# --------------------------------------------------------------------------- eventually / livelock

LOOPY = {
    "s0": [("a", "s1")],
    "s1": [("b", "s2"), ("finish", "done")],
    "s2": [("c", "s1")],
}


def test_eventually_violated_by_a_cycle_gives_a_lasso() -> None:
    result = Checker(Graph(LOOPY, {"done"}, [DONE])).bfs()
    p = result.properties["done"]
    assert p.verdict is Verdict.VIOLATED
    assert p.trace.is_lasso
    assert p.trace.states == ["s0", "s1", "s2", "s1"]
    assert p.trace.loop_start == 1
    assert p.trace.actions == ["a", "b", "c"]


def test_eventually_violated_by_a_deadlock_or_final_path() -> None:
    dead = {"s0": [("a", "s1"), ("b", "done")]}
    r = Checker(Graph(dead, {"done"}, [DONE]), check_deadlock=False).bfs()
    assert r.verdict("done") is Verdict.VIOLATED
    assert r.properties["done"].trace.states == ["s0", "s1"]
    assert not r.properties["done"].trace.is_lasso
    early_final = {"s0": [("a", "f")], "f": [("b", "done")]}
    r = Checker(Graph(early_final, {"f", "done"}, [DONE])).bfs()
    assert r.verdict("done") is Verdict.VIOLATED  # a final state ends the path
    assert r.properties["done"].trace.states == ["s0", "f"]


def test_eventually_holds_when_every_maximal_path_meets_it() -> None:
    dag = {"s0": [("a", "s1"), ("b", "s2")], "s1": [("c", "done")], "s2": [("d", "done")]}
    result = Checker(Graph(dag, {"done"}, [DONE])).bfs()
    assert result.verdict("done") is Verdict.HOLDS and result.ok
    initially = Property.eventually("start", lambda s: s == "s0")
    assert Checker(Graph(LOOPY, {"done"}, [initially])).bfs().verdict("start") is Verdict.HOLDS


@pytest.mark.parametrize("fingerprints", ["auto", "stable"])
@pytest.mark.parametrize("processes", [1, 2])
def test_livelock_check_lasso_into_a_trap(processes: int, fingerprints: str) -> None:
    """In one process or gathered from two workers' edges (signed fast fingerprints or
    unsigned stable ones), the same verdicts."""
    trap = dict(LOOPY)
    trap["s0"] = [("a", "s1"), ("trap", "t1")]
    trap["t1"] = [("x", "t2")]
    trap["t2"] = [("y", "t1")]
    result = Checker(Graph(trap, {"done"}, []), check_livelock=True, processes=processes,
                     fingerprints=fingerprints).bfs()
    assert result.processes == processes
    p = result.properties["livelock"]
    assert p.verdict is Verdict.VIOLATED
    assert p.trace.states == ["s0", "t1", "t2", "t1"]
    assert p.trace.loop_start == 1
    assert result.graph is not None  # check_livelock records the graph
    # without the trap a final state stays reachable from everywhere (the s1/s2 cycle is
    # not a livelock), though `eventually done` fails: no fairness is assumed
    ok = Checker(Graph(LOOPY, {"done"}, [DONE]), check_livelock=True, processes=processes,
                 fingerprints=fingerprints).bfs()
    assert ok.verdict("livelock") is Verdict.HOLDS
    assert ok.verdict("done") is Verdict.VIOLATED


@pytest.mark.parametrize("processes", [1, 2])
def test_livelock_reports_a_stuck_state(processes: int) -> None:
    stuck = {"s0": [("a", "s1"), ("b", "done")]}
    result = Checker(Graph(stuck, {"done"}, []), check_livelock=True, check_deadlock=False,
                     processes=processes).bfs()
    p = result.properties["livelock"]
    assert p.verdict is Verdict.VIOLATED and not p.trace.is_lasso
    assert p.trace.states == ["s0", "s1"]


def test_livelock_unknown_on_an_incomplete_search() -> None:
    result = Checker(Counter(10, final_at_limit=True), check_livelock=True, max_depth=3).bfs()
    assert result.verdict("livelock") is Verdict.UNKNOWN


def test_simulation_finds_an_eventually_lasso() -> None:
    result = Checker(Graph(LOOPY, {"done"}, [DONE])).simulate(runs=20, max_depth=30, seed=1)
    p = result.properties["done"]
    assert p.verdict is Verdict.VIOLATED and p.trace.is_lasso
    start = p.trace.loop_start
    assert p.trace.states[start] == p.trace.last_state
    assert "done" not in p.trace.states


# --------------------------------------------------------------------------- bounds and control


def test_max_depth_bounds_the_search() -> None:
    result = Checker(Counter(10)).bfs()
    assert result.complete and result.max_depth == 10
    bounded = Checker(Counter(10), max_depth=4).bfs()
    assert not bounded.complete and bounded.stop_reason == "max_depth"
    assert bounded.max_depth == 4 and bounded.distinct_states == 5
    assert bounded.verdict("deadlock") is Verdict.HOLDS  # the deadlock is beyond the bound
    dfs = Checker(Counter(10), max_depth=4).dfs()
    assert not dfs.complete and dfs.distinct_states == 5


def test_max_states_bounds_the_search() -> None:
    result = Checker(Counter(100_000, final_at_limit=True), max_states=1_000).bfs()
    assert not result.complete and result.stop_reason == "max_states"
    assert 1_000 <= result.distinct_states < 2_000


def test_progress_callback_and_request_stop() -> None:
    seen: list[Progress] = []
    checker = Checker(
        Counter(5_000, final_at_limit=True), progress=seen.append, progress_interval=0.0
    )
    result = checker.bfs()
    assert result.complete
    assert seen[-1].done and seen[-1].distinct == 5_001
    assert all(not p.done for p in seen[:-1]) and len(seen) > 1

    def stop_soon(p: Progress) -> None:
        if p.distinct > 100:
            checker2.request_stop()

    checker2 = Checker(
        Counter(100_000, final_at_limit=True), progress=stop_soon, progress_interval=0.0
    )
    stopped = checker2.bfs()
    assert not stopped.complete and stopped.stop_reason == "stop_requested"


def test_one_stop_rule_a_verdict_then_a_request_then_max_states() -> None:
    """Every search stops by `SearchOptions.stop_reason`, read from options fixed when it
    starts; a search with no work left is exhausted, whatever was asked."""
    model = Counter(10)
    checker = Checker(model, max_states=5)
    options = checker._options()
    with pytest.raises(FrozenInstanceError):
        options.max_states = 6  # type: ignore[misc]
    props = PropertyTracker(ModelContext(model, True), options.finish_when)
    assert options.stop_reason(props, 4, work_left=True) is None
    assert options.stop_reason(props, 5, work_left=True) == "max_states"
    checker.request_stop()
    assert options.stop_reason(props, 5, work_left=True) == "stop_requested"
    props.stop = True
    assert options.stop_reason(props, 5, work_left=True) == "all_decided"
    assert options.stop_reason(props, 5, work_left=False) is None


def test_invalid_configurations_are_refused() -> None:
    with pytest.raises(ValueError):
        Checker(Counter(), finish_when="never")
    twice = (Property.always("p", bool), Property.sometimes("p", bool))
    with pytest.raises(ValueError, match="duplicate"):
        Checker(Counter(props=twice)).bfs()
    with pytest.raises(ValueError, match="reserved"):
        Checker(Counter(props=(Property.always("deadlock", bool),))).bfs()


# --------------------------------------------------------------------------- model API


class DuckCounter:
    """A model that does not inherit BaseModel: the protocol's three required methods + props."""

    def init_states(self) -> list[int]:
        return [0, 0]  # duplicates are merged

    def actions(self, state: int) -> list[str]:
        return ["up", "noop"]

    def next_state(self, state: int, action: str) -> int | None:
        if action == "noop":
            return None
        return state + 1 if state < 2 else None

    def properties(self) -> list[Property]:
        return [Property.always("small", lambda s: s <= 2)]


def test_duck_typed_models_work() -> None:
    result = Checker(DuckCounter()).bfs()
    assert result.distinct_states == 3 and result.states_generated == 3
    assert result.verdict("small") is Verdict.HOLDS
    assert result.verdict("deadlock") is Verdict.VIOLATED  # no is_final: 2 is a deadlock


def test_dataclass_states_mutex() -> None:
    good = Checker(Mutex()).bfs()
    assert good.verdict("mutual exclusion") is Verdict.HOLDS
    assert good.verdict("both entered") is Verdict.HOLDS
    assert set(good.coverage) == {"want", "enter", "leave"}
    bad = Checker(Mutex(broken=True)).bfs()
    trace = bad.counterexample("mutual exclusion")
    assert [Mutex().format_action(a) for a in trace.actions] == [
        "want(0)",
        "enter(0)",
        "want(1)",
        "enter(1)",
    ]
    assert diff_states(trace.states[-2], trace.states[-1]) == [
        "procs[1].pc: 'waiting' -> 'critical'",
        "entered: +1",
    ]
    assert Checker(Mutex(broken=True), processes=2).bfs().distinct_states == bad.distinct_states
    assert Checker(Mutex(broken=True)).dfs().verdict("mutual exclusion") is Verdict.VIOLATED


def test_trace_invariants() -> None:
    with pytest.raises(ValueError):
        Trace(())
    with pytest.raises(ValueError):
        Trace((("a", 1),))
    t = Trace(((None, 0), ("inc", 1)))
    assert len(t) == 1 and t.initial_state == 0 and t.last_state == 1 and not t.is_lasso


@pytest.mark.parametrize(
    "model",
    [
        Clock(),
        Counter(3),
        Counter(3, final_at_limit=True, props=(Property.final("ends even", lambda s: s % 2 == 0),)),
        Graph(LOOPY, {"done"}, [DONE]),
        Mutex(broken=True),
    ],
    ids=["transition", "deadlock", "final", "eventually", "dataclass-states"],
)
def test_parallel_bfs_agrees_on_every_property_kind(model: BaseModel) -> None:
    seq = Checker(model).bfs()
    par = Checker(model, processes=2).bfs()
    assert (par.distinct_states, par.states_generated, par.coverage) == (
        seq.distinct_states,
        seq.states_generated,
        seq.coverage,
    )
    for name, p in seq.properties.items():
        q = par.properties[name]
        assert q.verdict is p.verdict
        assert (q.trace is None) == (p.trace is None)
        if p.trace is not None:  # equally short; possibly another path of that length
            assert len(q.trace) == len(p.trace)
            assert q.trace.is_lasso == p.trace.is_lasso


def _can_finish(n: int, edges: list[tuple[int, int]], finals: set[int]) -> set[int]:
    """The states from which a final one is reachable, by networkx (an independent oracle)."""
    import networkx as nx

    graph = nx.DiGraph(edges)
    graph.add_nodes_from(range(n))
    return set(finals).union(*(nx.ancestors(graph, f) for f in finals))


@pytest.mark.parametrize("seed", range(40))
def test_every_state_can_finish_from_the_recorded_lists(seed: int) -> None:
    """`GraphRecorder.every_state_can_finish` (reverse passes over the edge list, then an
    index) agrees with networkx's ancestors, on random graphs and on a chain recorded
    deepest first, which needs a pass per state and so takes the index."""
    import random

    from checker.engine import GraphRecorder

    rng = random.Random(seed)
    n = rng.randint(1, 30)
    edges = [(rng.randrange(n), rng.randrange(n)) for _ in range(rng.randint(0, 3 * n))]
    if seed % 4 == 0:
        edges = [(i, i + 1) for i in reversed(range(n - 1))]  # the last state is final
    finals = {n - 1} if seed % 4 == 0 else {rng.randrange(n) for _ in range(rng.randint(0, 2))}
    recorder = GraphRecorder(None, labelled=False)  # type: ignore[arg-type]
    for g in range(n):
        recorder.node(None, g, init=g == 0)
    append = recorder.pairs_append
    assert append is not None
    for edge in edges:
        append(edge)
    for f in finals:
        recorder.mark_final(f)
    expected = len(_can_finish(n, edges, finals)) == n
    assert recorder.every_state_can_finish() is expected


_ACTION_TYPES = [type(f"Act{i}", (), {"__slots__": ()}) for i in range(300)]


class ManyActionTypes(BaseModel[int, object]):
    """A line of 400 states, three transitions each, of 300 action types (coverage by type
    gives each type a code: past 256 of them the flush counts otherwise)."""

    def init_states(self) -> list[int]:
        return [0]

    def successors(self, state: int):  # type: ignore[no-untyped-def]
        if state < 400:
            for k in range(3):
                yield _ACTION_TYPES[(7 * state + k) % 300](), state + 1 + k


class ManyActionKinds(ManyActionTypes):
    def action_kind(self, action: object) -> str:
        return type(action).__name__[:4]


@pytest.mark.parametrize("model", [ManyActionTypes(), ManyActionKinds()])
@pytest.mark.parametrize("processes", [1, 2])
def test_coverage_counts_every_transition_by_kind(model: BaseModel, processes: int) -> None:
    expected: dict[str, int] = {}
    for state in range(400):
        for k in range(3):
            name = _ACTION_TYPES[(7 * state + k) % 300].__name__
            kind = name[:4] if isinstance(model, ManyActionKinds) else name
            expected[kind] = expected.get(kind, 0) + 1
    options = {"check_deadlock": False, "finish_when": "exhausted"}
    for result in (
        Checker(model, processes=processes, **options).bfs(),  # type: ignore[arg-type]
        Checker(model, **options).dfs(),  # type: ignore[arg-type]
    ):
        assert result.coverage == expected
        assert result.states_generated == 1 + 3 * 400
