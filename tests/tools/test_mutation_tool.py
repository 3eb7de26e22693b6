"""The mutation tool (tools/mutation.py) on a small synthetic module: enumeration, ids,
single-node mutants, and the classification of gate runs. Never runs the real checker."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path

import pytest

_TOOL = Path(__file__).resolve().parents[2] / "tools" / "mutation.py"
_spec = importlib.util.spec_from_file_location("tools_mutation", _TOOL)
assert _spec is not None and _spec.loader is not None
mutation = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = mutation  # dataclasses look their module up while being built
_spec.loader.exec_module(mutation)

FILE = "pkg/mod.py"
SOURCE = '''\
"""Module docstring: a < b and x == 1 are not code."""

LIMIT = 1 + 2


def _table():
    return [100, 200][1]


TABLE = _table()


def clamp(x, low, high):
    """Docstring: if x < low then low."""
    if x < low:
        return low
    if not x <= high:
        return high
    return x


def first_even(values, strict=True):
    flag = False
    for v in values:
        if v % 2 == 0 and (v > 0 or not strict):
            return v
    label = f"{len(values) + 1} values"
    total = 0
    while total < 3:
        total += 1
    return None if flag else -1


class Box:
    def size(self, items):
        return len(items) - 0 if items else len("a" + "b")


def outer(n):
    def inner(k):
        return k + n
    return inner(1)
'''


def by_id(source: str) -> dict[str, tuple[str, str]]:
    return {m.id: (m.before, m.after) for m in mutation.enumerate_mutants(source, FILE)}


def differences(a: object, b: object, path: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Paths (field names and list indices) of the outermost places where two ASTs differ."""
    if type(a) is not type(b):
        return [path]
    if isinstance(a, ast.AST):
        return [d for field in a._fields
                for d in differences(getattr(a, field), getattr(b, field), (*path, field))]
    if isinstance(a, list):
        assert isinstance(b, list)
        if len(a) != len(b):
            return [path]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, (*path, i))]
    return [] if a == b else [path]


def changed_node(original: ast.AST, mutant: ast.AST) -> ast.AST:
    """The smallest positioned node of `original` holding every difference from `mutant`."""
    paths = differences(original, mutant)
    assert paths
    common = paths[0][:min(len(p) for p in paths)]
    while not all(p[:len(common)] == common for p in paths):
        common = common[:-1]
    node, positioned = original, original
    for step in common:
        node = node[step] if isinstance(step, int) else getattr(node, step)
        if hasattr(node, "end_col_offset"):
            positioned = node
    return positioned


def byte_span(source: str, node: ast.AST) -> tuple[int, int]:
    starts = [0]
    for line in source.encode().splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return (starts[node.lineno - 1] + node.col_offset,
            starts[node.end_lineno - 1] + node.end_col_offset)


def test_enumeration_is_deterministic_and_uses_every_operator():
    first = mutation.enumerate_mutants(SOURCE, FILE)
    assert first == mutation.enumerate_mutants(SOURCE, FILE)
    assert len({m.id for m in first}) == len(first)
    assert {m.operator for m in first} == set(mutation.OPERATORS)
    assert {f"{FILE}:clamp:cmp-op:0", f"{FILE}:Box.size:arith-op:0", f"{FILE}:outer:int-inc:0",
            f"{FILE}:outer.inner:arith-op:0"} <= {m.id for m in first}


def test_docstrings_fstrings_defaults_and_module_code_are_left_alone():
    mutants = mutation.enumerate_mutants(SOURCE, FILE)
    lines = SOURCE.splitlines()
    untouched = {i + 1 for i, line in enumerate(lines)
                 if '"""' in line or line.startswith(("LIMIT", "TABLE", "def first_even"))
                 or "label" in line}
    assert untouched.isdisjoint(m.line for m in mutants)
    assert not any('"a" - "b"' in m.after for m in mutants)  # a concatenation, not arithmetic
    assert {m.after for m in mutants if m.id.startswith(f"{FILE}:first_even:int-")} >= {
        "return None if flag else 0", "return None if flag else -2"}  # -1 is one literal


def test_every_mutant_compiles_and_changes_only_the_node_it_names():
    original = ast.parse(SOURCE)
    for m in mutation.enumerate_mutants(SOURCE, FILE):
        text = m.apply(SOURCE)
        compile(text, FILE, "exec")
        node = changed_node(original, ast.parse(text))
        assert isinstance(node, (ast.expr, ast.AugAssign)) and node.lineno == m.line, m.id
        start, end = byte_span(SOURCE, node)
        assert m.start <= start and end <= m.end, m.id  # inside the one replaced node
        assert text.count("\n") == SOURCE.count("\n"), m.id  # line numbers stay put


def test_ids_survive_edits_elsewhere_in_the_file():
    above = "def helper(a, b):\n    if a < b and not a:\n        return a + 1\n    return b\n\n\n"
    below = "\n\ndef later(x):\n    return x == 0 or x > 2\n"
    edited = by_id(above + SOURCE + below)
    original = by_id(SOURCE)
    assert all(edited[i] == original[i] for i in original)
    assert len(edited) > len(original)


def test_a_multi_line_span_keeps_the_line_count():
    source = "def f(a, b, c):\n    return (a and\n            b and c)\n"
    mutants = mutation.enumerate_mutants(source, FILE)
    dropped = {m.after for m in mutants if m.operator == "drop-term"}
    assert dropped == {"return ((b and c ))", "return ((a and c ))", "return ((a and b ))"}
    for m in mutants:
        assert m.apply(source).count("\n") == source.count("\n")


def make_repo(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_gate_runs_classify_killed_survived_incompetent_and_timeout(tmp_path):
    repo = make_repo(tmp_path, {"pkg/__init__.py": "", FILE: SOURCE})
    gate = [sys.executable, "-c", "import sys, pkg.mod as m\n"
            "sys.exit(m.clamp(5, 0, 3) != 3 or m.first_even([1, 3]) != -1)"]
    mutants = {m.id: m for m in mutation.enumerate_mutants(SOURCE, FILE)}
    expected = {
        f"{FILE}:clamp:drop-not:0": "killed",  # clamp(5, 0, 3) returns 5
        f"{FILE}:Box.size:negate-cond:0": "survived",  # the gate never calls it
        f"{FILE}:_table:int-inc:0": "incompetent",  # [100, 200][2] raises at import
        f"{FILE}:first_even:arith-op:0": "timeout",  # total -= 1 never reaches 3
    }
    with mutation.Sandbox(repo, {FILE: SOURCE}, jobs=2, copy_paths=("pkg",),
                          import_modules=("pkg.mod",)) as sandbox:
        outcomes = sandbox.run([mutants[i] for i in expected], gate, timeout=1.5)
        assert {i: o.status for i, o in outcomes.items()} == expected
        assert "IndexError" in outcomes[f"{FILE}:_table:int-inc:0"].verdict
        assert sandbox.baseline(gate, timeout=10).status == "survived"  # files restored
    assert (repo / FILE).read_text() == SOURCE  # the checkout itself is never touched


def test_the_copy_shadows_the_installed_package(tmp_path):
    # `invar` is installed in editable mode from the real checkout: the copy must still win.
    marked = '"""A stand-in."""\nMARK = "copy"\n'
    repo = make_repo(tmp_path, {"invar/__init__.py": marked})
    gate = [sys.executable, "-c",
            "import sys, invar; sys.exit(getattr(invar, 'MARK', '') != 'copy')"]
    with mutation.Sandbox(repo, {"invar/__init__.py": marked}, jobs=1, copy_paths=("invar",),
                          import_modules=("invar",)) as sandbox:
        assert sandbox.baseline(gate, timeout=30).status == "survived"


def test_reports_score_survivors_and_equivalent_mutants(tmp_path):
    mutants = mutation.enumerate_mutants(SOURCE, FILE)[:5]
    statuses = ["killed", "timeout", "survived", "incompetent", "equivalent"]
    equivalent_file = tmp_path / "equivalent.toml"
    equivalent_file.write_text(f'"{mutants[4].id}" = "only changes a | message"\n')
    equivalent = mutation.load_equivalent(equivalent_file)
    run = mutation.RunSummary(
        command="tools/mutation.py --sample 5", gate=["gate"], files=[FILE],
        enumerated=40, timeout=9.0, baseline_seconds=1.0,
        results=[(m, mutation.Outcome(s, 1.0, "why" if s != "survived" else ""))
                 for m, s in zip(mutants, statuses)],
        equivalent=equivalent, stale_equivalent=["pkg/mod.py:gone:cmp-op:0"])
    assert run.score() == pytest.approx(2 / 3)
    mutation.write_report(tmp_path / "README.md", run)
    mutation.write_json(tmp_path / "mutants.json", run)
    report = (tmp_path / "README.md").read_text()
    assert "**Score: 2/3 = 66.7 %**" in report
    assert f"| `{mutants[2].id}` |" in report.split("## Survivors")[1].split("##")[0]
    assert "only changes a \\| message" in report and "pkg/mod.py:gone:cmp-op:0" in report
    document = json.loads((tmp_path / "mutants.json").read_text())
    assert document["counts"] == dict.fromkeys(statuses, 1)
    assert [m["status"] for m in document["mutants"]] == statuses
    assert document["mutants"][4]["reason"] == "only changes a | message"
