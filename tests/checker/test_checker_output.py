"""Graph export (DOT, GraphML), state diffs, JSON traces, rich rendering."""

from __future__ import annotations

import io
import json
import re
from collections import namedtuple
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest
from rich.console import Console

from checker import (
    Checker,
    Progress,
    ProgressPrinter,
    Trace,
    diff_states,
    print_result,
    render_trace,
    summary_table,
    to_jsonable,
    trace_to_json,
)
from checker.examples import TwoPhaseCommit
from checker.report import format_progress

# --------------------------------------------------------------------------- graph export

_NODE = re.compile(r'^  "(\d+)" \[label="(?:[^"\\]|\\.)*"(?:, [a-z]+=[a-z]+)*\];$')
_EDGE = re.compile(r'^  "(\d+)" -> "(\d+)"(?: \[label="(?:[^"\\]|\\.)*"\])?;$')


def _parse_dot(text: str) -> tuple[set[str], set[tuple[str, str]]]:
    """A strict little parser for what `write_dot` emits (every line must match)."""
    lines = text.strip().splitlines()
    assert lines[0] == "digraph states {" and lines[-1] == "}"
    nodes: set[str] = set()
    edges: set[tuple[str, str]] = set()
    for line in lines[1:-1]:
        if line.startswith("  node "):
            continue
        m = _NODE.match(line)
        if m:
            nodes.add(m.group(1))
            continue
        m = _EDGE.match(line)
        assert m, f"unparsable DOT line: {line!r}"
        edges.add((m.group(1), m.group(2)))
    return nodes, edges


def test_recorded_graph_and_exports(tmp_path: Path) -> None:
    model = TwoPhaseCommit(2)
    result = Checker(model, record_graph=True).bfs()
    g = result.graph
    assert g.number_of_nodes() == result.distinct_states
    # one edge per (state, successor) pair: at most one per generated transition
    assert 0 < g.number_of_edges() <= result.states_generated - 1
    assert sum(1 for _, d in g.nodes(data=True) if d["init"]) == 1
    dot = tmp_path / "g.dot"
    result.write_dot(dot)
    nodes, edges = _parse_dot(dot.read_text())
    assert nodes == {str(n) for n in g.nodes}
    assert edges == {(str(u), str(v)) for u, v in g.edges}
    gml = tmp_path / "g.graphml"
    result.write_graphml(gml)
    back = nx.read_graphml(gml)
    assert back.number_of_nodes() == g.number_of_nodes()
    assert back.number_of_edges() == g.number_of_edges()
    assert "TMAbort" in {d["label"] for _, _, d in back.edges(data=True)}
    # the same graph from DFS
    assert Checker(model, record_graph=True).dfs().graph.number_of_edges() == g.number_of_edges()


def test_export_without_graph_is_refused(tmp_path: Path) -> None:
    result = Checker(TwoPhaseCommit(2)).bfs()
    with pytest.raises(ValueError, match="record_graph"):
        result.write_dot(tmp_path / "x.dot")


def test_record_graph_runs_in_one_process() -> None:
    result = Checker(TwoPhaseCommit(2), record_graph=True, processes=2).bfs()
    assert result.processes == 1 and result.graph is not None and result.notes


# --------------------------------------------------------------------------- diffs


@dataclass(frozen=True)
class Inner:
    a: int
    b: tuple[int, ...]


@dataclass(frozen=True)
class State:
    name: str
    inner: Inner
    tags: frozenset[str]
    table: dict[str, int]


Pair = namedtuple("Pair", "left right")


def test_diff_states_shows_only_changed_leaves() -> None:
    s1 = State("x", Inner(1, (1, 2, 3)), frozenset({"a", "b"}), {"k": 1, "gone": 0})
    s2 = State("x", Inner(2, (1, 5, 3)), frozenset({"b", "c"}), {"k": 2, "new": 7})
    assert diff_states(s1, s1) == []
    assert diff_states(s1, s2) == [
        "inner.a: 1 -> 2",
        "inner.b[1]: 2 -> 5",
        "tags: +'c' -'a'",
        "table['k']: 1 -> 2",
        "table['gone']: removed (was 0)",
        "table['new']: added 7",
    ]
    assert diff_states((1, 2), (1, 2, 3)) == ["state: (1, 2) -> (1, 2, 3)"]
    assert diff_states(3, 4) == ["state: 3 -> 4"]
    assert diff_states(Pair(1, (2, 3)), Pair(1, (2, 4))) == ["right[1]: 3 -> 4"]
    assert diff_states(Inner(1, ()), State("y", Inner(1, ()), frozenset(), {}))[0].startswith(
        "state: Inner("
    )


# --------------------------------------------------------------------------- JSON


def test_trace_to_json_default_and_custom_encoders() -> None:
    model = TwoPhaseCommit(3, buggy=True)
    trace = Checker(model).bfs().counterexample("consistent")
    doc = json.loads(
        trace_to_json(trace, model.format_action, lambda s: to_jsonable(model.view_state(s)))
    )
    assert doc["length"] == 3 and doc["loop_start"] is None
    assert [s["action"] for s in doc["steps"]] == [
        None,
        "TMCommit",
        "RMChooseToAbort(0)",
        "RMRcvCommitMsg(1)",
    ]
    last = doc["steps"][-1]["state"]
    assert last["_type"] == "TwoPhaseView"
    assert last["rm_state"] == ["aborted", "committed", "working"]
    assert last["msgs"] == ["Commit"]
    plain = json.loads(trace_to_json(trace, extra={"property": "consistent"}))
    assert plain["property"] == "consistent"
    assert plain["steps"][1]["action"] == {"_type": "TMCommit"}
    assert plain["steps"][2]["action"] == {"_type": "RMChooseToAbort", "rm": 0}


def test_to_jsonable_covers_common_shapes() -> None:
    s = State("x", Inner(1, (2,)), frozenset({"b", "a"}), {"k": 1})
    assert to_jsonable(s) == {
        "_type": "State",
        "name": "x",
        "inner": {"_type": "Inner", "a": 1, "b": [2]},
        "tags": ["a", "b"],
        "table": {"k": 1},
    }
    assert to_jsonable(Pair(1, 2)) == {"_type": "Pair", "left": 1, "right": 2}
    assert to_jsonable(object).startswith("<class")


# --------------------------------------------------------------------------- rich rendering


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=140, color_system=None), buf


def test_print_result_shows_verdicts_coverage_and_the_counterexample() -> None:
    model = TwoPhaseCommit(3, buggy=True)
    result = Checker(model).bfs()
    console, buf = _console()
    print_result(result, model, console)
    out = buf.getvalue()
    assert "623 distinct" in out
    assert "consistent" in out and "violated" in out and "commit agreement" in out
    assert "RMRcvAbortMsg" in out  # coverage table
    assert "counterexample for 'consistent'" in out
    assert "2. RMChooseToAbort(0)" in out
    assert "rm_state[0]: 'working' -> 'aborted'" in out
    console2, _ = _console()
    console2.print(summary_table(result))


def test_render_trace_marks_a_lasso() -> None:
    trace = Trace(((None, 0), ("a", 1), ("b", 2), ("c", 1)), loop_start=1)
    console, buf = _console()
    console.print(render_trace(trace, title="lasso"))
    out = buf.getvalue()
    assert "lasso" in out and "back to state 1" in out and "state: 2 -> 1" in out


def test_progress_printer_lines() -> None:
    console, buf = _console()
    Checker(TwoPhaseCommit(4), progress=ProgressPrinter(console), progress_interval=0.0).bfs()
    lines = buf.getvalue().strip().splitlines()
    assert lines[-1].startswith("[bfs done] generated 8,258  distinct 1,568  queue 0  depth 13")
    assert len(lines) > 1 and all("distinct" in line and "states/s" in line for line in lines)
    line = format_progress(Progress("dfs", 10, 5, 2, 1, 0.5))
    assert line == "[dfs progress] generated 10  distinct 5  queue 2  depth 1  10 states/s  (0.5 s)"
