"""Mutation testing of the protocol core: how many small, plausible bugs does the gate catch?

    .venv/bin/python tools/mutation.py --list --summary
    .venv/bin/python tools/mutation.py --sample 60 --seed 0 --jobs 2 --timeout 400 \\
        --json reports/mutation/mutants.json --report reports/mutation/README.md
    .venv/bin/python tools/mutation.py --only ID [ID ...] \\
        -- .venv/bin/python -m pytest -q tests/model

A mutant changes one AST node inside a function body of a target file (`--files`, by default
invar/model/core.py and invar/model/schedule.py; docstrings, f-strings, annotations and
module-level code are never touched). Operators:

    cmp-op       < <=, > >=, == !=, in / not in, is / is not: each swapped with its partner
    bool-op      and <-> or
    drop-term    one operand of an `and`/`or` removed, the rest kept
    negate-cond  the test of an if / while / conditional expression negated
    drop-not     `not x` -> `x`
    bool-const   True <-> False
    int-inc      a small integer constant (0..16) plus one; covers off-by-one indices
    int-dec      the same, minus one
    arith-op     + <-> - (also += / -=), unless an operand is a string or sequence literal

Each mutant runs in a throwaway copy of the repository (invar/, checker/, spec/, tests/,
pyproject.toml; one copy per job) holding the mutated file, with PYTHONPATH pointing at the copy
so that its modules win over the editable install. First `import invar.model, checker` runs
there: a mutant that breaks it is *incompetent*. Then the gate command (everything after `--`;
default: the original checkout's `.venv/bin/python -m checker.cli --fail-fast`, i.e. the
`invar-check` gate suite of spec/gate/) runs with the copy as working directory: exit status 0
means the mutant *survived*, any other status that it was *killed*, and running past
`--timeout` counts as killed too (status "timeout"). A relative program path in the gate
command is taken relative to this checkout, since the copy has no virtual environment. The
unmutated copy must pass the gate first, or nothing is measured.

Score = killed (timeouts included) / (killed + survived), over the competent mutants not listed
as equivalent (`--equivalent FILE`: a TOML or JSON table mapping mutant id to the reason it
cannot change behaviour; those are not run). It is the fraction of injected bugs the gate
detects; each survivor is either a gap in the gate or an equivalent mutant to document.

Mutant ids read `<file>:<function>:<operator>:<n>`, n counting that operator's mutants within
that function in source order, so that edits elsewhere in the file leave an id (and an
equivalence list) valid.
"""

from __future__ import annotations

import argparse
import ast
import compileall
import json
import os
import queue
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

REPO = Path(__file__).resolve().parents[1]
DEFAULT_FILES = ("invar/model/core.py", "invar/model/schedule.py")
# tests/ travels too, so that a pytest gate (`-- python -m pytest tests/...`) finds its files.
COPIED_PATHS = ("invar", "checker", "spec", "tests", "pyproject.toml")
IMPORTED_MODULES = ("invar.model", "checker")
IMPORT_TIMEOUT_S = 120.0
OUTPUT_TAIL_LINES = 20
# Larger constants are sizes, seeds and digest lengths, where +-1 says little about the gate.
SMALL_INT = 16

OPERATORS = ("cmp-op", "bool-op", "drop-term", "negate-cond", "drop-not", "bool-const",
             "int-inc", "int-dec", "arith-op")
STATUSES = ("killed", "timeout", "survived", "incompetent", "equivalent")

_COMPARE_PARTNER: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
    ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}
_BOOL_PARTNER: dict[type[ast.boolop], type[ast.boolop]] = {ast.And: ast.Or, ast.Or: ast.And}
_ARITH_PARTNER: dict[type[ast.operator], type[ast.operator]] = {ast.Add: ast.Sub,
                                                                ast.Sub: ast.Add}
# Operands that make + a concatenation: swapping it for - only raises a TypeError.
_NON_NUMERIC = (ast.JoinedStr, ast.Tuple, ast.List, ast.ListComp, ast.Dict, ast.Set)

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


# ---------------------------------------------------------------------------------------------
# Enumeration


@dataclass(frozen=True)
class Mutant:
    """One single-node change of a target file, as a splice of its UTF-8 text."""

    id: str
    file: str
    function: str
    operator: str
    line: int
    before: str  # the source lines holding the changed node, whitespace collapsed
    after: str  # the same lines in the mutant
    start: int  # byte offsets of the replaced span in the original file
    end: int
    replacement: str

    def apply(self, source: str) -> str:
        data = source.encode()
        return (data[:self.start] + self.replacement.encode() + data[self.end:]).decode()


def enumerate_mutants(source: str, file: str) -> list[Mutant]:
    """Every mutant of `source` (the text of `file`, a path relative to the repository), in
    source order. Deterministic; each one parses to the original tree with one node replaced."""
    tree = ast.parse(source)
    data = source.encode()
    line_starts = [0]
    for line in data.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    mutants: list[Mutant] = []
    for qualname, function in _functions(tree):
        counts: Counter[str] = Counter()
        for parent, field, index, node in _sites(function):
            for operator, replacement in _mutations(parent, field, node):
                mutant_id = f"{file}:{qualname}:{operator}:{counts[operator]}"
                counts[operator] += 1
                first, last = line_starts[node.lineno - 1], line_starts[node.end_lineno]
                start = first + node.col_offset
                end = line_starts[node.end_lineno - 1] + node.end_col_offset
                code = _render(function, (parent, field, index), replacement, data, start, end,
                               line_starts)
                if code is None:
                    continue
                mutants.append(Mutant(
                    id=mutant_id, file=file, function=qualname, operator=operator,
                    line=node.lineno, before=_one_line(data[first:last]),
                    after=_one_line(data[first:start] + code.encode() + data[end:last]),
                    start=start, end=end, replacement=code))
    return mutants


def _functions(tree: ast.Module) -> Iterator[tuple[str, FunctionNode]]:
    """(qualified name, node) of every function, nested ones included, in source order; a
    repeated name gets a `#2` suffix so that ids stay unique."""
    seen: Counter[str] = Counter()

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, FunctionNode]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                seen[name] += 1
                if seen[name] > 1:
                    name += f"#{seen[name]}"
                yield name, child
                yield from visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, prefix + child.name + ".")
            else:
                yield from visit(child, prefix)

    yield from visit(tree, "")


Site = tuple[ast.AST, str, int | None, ast.AST]  # parent, field, index in the field's list, node


def _sites(function: FunctionNode) -> Iterator[Site]:
    """The nodes of `function`'s body in source order, without its docstring, annotations,
    f-strings (message text, not behaviour) and nested definitions (enumerated on their own)."""

    def visit(parent: ast.AST, field: str, index: int | None, node: ast.AST) -> Iterator[Site]:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.JoinedStr)):
            return
        yield parent, field, index, node
        for name, value in ast.iter_fields(node):
            if name == "annotation":
                continue
            if isinstance(value, list):
                for i, child in enumerate(value):
                    if isinstance(child, ast.AST):
                        yield from visit(node, name, i, child)
            elif isinstance(value, ast.AST):
                yield from visit(node, name, None, value)

    for i, statement in enumerate(function.body):
        if i == 0 and ast.get_docstring(function, clean=False) is not None:
            continue
        yield from visit(function, "body", i, statement)


def _mutations(parent: ast.AST, field: str, node: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """(operator, replacement of `node`) pairs; replacements share `node`'s children."""
    if (field == "test" and isinstance(parent, (ast.If, ast.While, ast.IfExp))
            and not _is_not(node) and not _self_negating(node)):
        yield "negate-cond", ast.UnaryOp(ast.Not(), node)
    value = _int_value(node)
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            ops = [*node.ops[:i], _COMPARE_PARTNER[type(op)](), *node.ops[i + 1:]]
            yield "cmp-op", ast.Compare(node.left, ops, node.comparators)
    elif isinstance(node, ast.BoolOp):
        yield "bool-op", ast.BoolOp(_BOOL_PARTNER[type(node.op)](), node.values)
        for i in range(len(node.values)):
            rest = node.values[:i] + node.values[i + 1:]
            yield "drop-term", rest[0] if len(rest) == 1 else ast.BoolOp(node.op, rest)
    elif _is_not(node):
        yield "drop-not", node.operand
    elif isinstance(node, ast.BinOp) and type(node.op) in _ARITH_PARTNER:
        if not (_non_numeric(node.left) or _non_numeric(node.right)):
            yield "arith-op", ast.BinOp(node.left, _ARITH_PARTNER[type(node.op)](), node.right)
    elif isinstance(node, ast.AugAssign) and type(node.op) in _ARITH_PARTNER:
        if not _non_numeric(node.value):
            yield "arith-op", ast.AugAssign(node.target, _ARITH_PARTNER[type(node.op)](),
                                            node.value)
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        yield "bool-const", ast.Constant(not node.value)
    elif value is not None and abs(value) <= SMALL_INT and _int_value(parent) is None:
        yield "int-inc", _int_literal(value + 1)
        yield "int-dec", _int_literal(value - 1)


def _is_not(node: ast.AST) -> bool:
    return isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)


def _self_negating(node: ast.AST) -> bool:
    """A single ==, !=, is, is not, in or not in: negating it is already the cmp-op mutant."""
    return (isinstance(node, ast.Compare) and len(node.ops) == 1
            and isinstance(node.ops[0], (ast.Eq, ast.NotEq, ast.Is, ast.IsNot, ast.In,
                                         ast.NotIn)))


def _int_value(node: ast.AST) -> int | None:
    """The value of an integer literal, `-1` (a negated constant) included, else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int_value(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _non_numeric(node: ast.AST) -> bool:
    return isinstance(node, _NON_NUMERIC) or (
        isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)))


def _int_literal(value: int) -> ast.expr:
    # `-1` parses as a negation of 1: build it that way so the text and the tree agree.
    if value < 0:
        return ast.UnaryOp(ast.USub(), ast.Constant(-value))
    return ast.Constant(value)


def _render(function: FunctionNode, where: tuple[ast.AST, str, int | None],
            replacement: ast.AST, data: bytes, start: int, end: int,
            line_starts: list[int]) -> str | None:
    """The text to put in place of bytes [start, end) of the file, `replacement` unparsed, or
    None when no rendering parses back to the intended tree. Line numbers are kept (a shorter
    multi-line span is padded inside parentheses) so that the gate's tracebacks point at real
    lines."""
    code = ast.unparse(replacement)
    lines = data[start:end].count(b"\n")
    candidates = [code] if lines == 0 else []
    candidates.append("(" + code + "\n" * lines + ")")  # for precedence, or to pad lines
    expected = _dump_replaced(function, where, replacement)
    first = min([function.lineno] + [d.lineno for d in function.decorator_list])
    # An indented definition parses on its own inside a block.
    prefix = b"if 1:\n" if function.col_offset else b""
    for candidate in candidates:
        code_bytes = candidate.encode()
        text = data[:start] + code_bytes + data[end:]
        # Only the function can differ, and its lines are where they were.
        shift = len(code_bytes) - (end - start)
        chunk = text[line_starts[first - 1]:line_starts[function.end_lineno] + shift]
        try:
            parsed = ast.parse(prefix + chunk).body
        except SyntaxError:
            continue
        if function.col_offset:
            parsed = cast(ast.If, parsed[0]).body
        if len(parsed) == 1 and ast.dump(parsed[0]) == expected:
            return candidate
    return None


def _dump_replaced(function: FunctionNode, where: tuple[ast.AST, str, int | None],
                   replacement: ast.AST) -> str:
    parent, field, index = where
    original = getattr(parent, field)
    if index is None:
        setattr(parent, field, replacement)
    else:
        setattr(parent, field, [*original[:index], replacement, *original[index + 1:]])
    try:
        return ast.dump(function)
    finally:
        setattr(parent, field, original)


def _one_line(text: bytes) -> str:
    return " ".join(text.decode().split())


# ---------------------------------------------------------------------------------------------
# Running


@dataclass(frozen=True)
class Outcome:
    status: str
    seconds: float
    verdict: str = ""  # for a failed gate: the line saying why (which property, which test)
    output_tail: str = ""


class Sandbox:
    """Throwaway copies of the repository, one per job, each holding the targets as `sources`.

    Use as a context manager: leaving it stops any gate still running and deletes the copies.
    """

    def __init__(self, repo: Path, sources: Mapping[str, str], jobs: int,
                 copy_paths: Sequence[str] = COPIED_PATHS,
                 import_modules: Sequence[str] = IMPORTED_MODULES) -> None:
        self.jobs = jobs
        self._sources = dict(sources)
        self._import_modules = tuple(import_modules)
        self._python = _repo_python(repo)
        self._repo = repo
        self._root = Path(tempfile.mkdtemp(prefix="mutation-"))
        self._running: set[subprocess.Popen[bytes]] = set()
        self._stopped = False
        self._lock = threading.Lock()
        base = self._root / "slot0"
        for name in copy_paths:
            source = repo / name
            if source.is_dir():
                shutil.copytree(source, base / name,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            elif source.exists():
                (base / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, base / name)
        for file, text in self._sources.items():
            (base / file).write_bytes(text.encode())
        # Byte-compile the untouched modules once; the targets get no .pyc (and runs write
        # none), so a mutant is always compiled from its text, never from a stale cache.
        compileall.compile_dir(base, quiet=2)
        for file in self._sources:
            for cached in (base / file).parent.glob(f"__pycache__/{Path(file).stem}.*.pyc"):
                cached.unlink()
        self._slots: queue.Queue[Path] = queue.Queue()
        self._slots.put(base)
        for i in range(1, jobs):
            self._slots.put(Path(shutil.copytree(base, self._root / f"slot{i}")))

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()
        shutil.rmtree(self._root, ignore_errors=True)

    def _stop(self) -> None:
        """Kill the gates running now and refuse to start more."""
        with self._lock:
            self._stopped = True
            for process in self._running:
                _kill_group(process)

    def baseline(self, gate: Sequence[str], timeout: float) -> Outcome:
        """The gate on the unmutated copy: it must pass for the mutants to mean anything."""
        slot = self._slots.get()
        try:
            return self._gate(slot, gate, timeout, time.perf_counter())
        finally:
            self._slots.put(slot)

    def run(self, mutants: Sequence[Mutant], gate: Sequence[str], timeout: float,
            on_result: Callable[[Mutant, Outcome], None] | None = None) -> dict[str, Outcome]:
        """Each mutant's outcome by id, running `self.jobs` of them at a time."""
        outcomes: dict[str, Outcome] = {}
        with ThreadPoolExecutor(self.jobs) as pool:
            futures = {pool.submit(self._run_one, m, gate, timeout): m for m in mutants}
            try:
                for future in as_completed(futures):
                    mutant = futures[future]
                    outcomes[mutant.id] = future.result()
                    if on_result is not None:
                        on_result(mutant, outcomes[mutant.id])
            except BaseException:  # Ctrl-C: do not wait out the gates already running
                for future in futures:
                    future.cancel()
                self._stop()
                raise
        return outcomes

    def _run_one(self, mutant: Mutant, gate: Sequence[str], timeout: float) -> Outcome:
        slot = self._slots.get()
        target = slot / mutant.file
        original = self._sources[mutant.file]
        try:
            target.write_bytes(mutant.apply(original).encode())
            started = time.perf_counter()
            imports = "import " + ", ".join(self._import_modules)
            code, output = self._execute([self._python, "-c", imports], slot, IMPORT_TIMEOUT_S)
            if code != 0:
                return Outcome("incompetent", time.perf_counter() - started, _verdict(output),
                               _tail(output))
            return self._gate(slot, gate, timeout, started)
        finally:
            target.write_bytes(original.encode())
            self._slots.put(slot)

    def _gate(self, slot: Path, gate: Sequence[str], timeout: float, started: float) -> Outcome:
        code, output = self._execute(_resolve(gate, self._repo), slot, timeout)
        seconds = time.perf_counter() - started
        if code is None:
            return Outcome("timeout", seconds, f"no verdict within {timeout:g} s", _tail(output))
        if code == 0:
            return Outcome("survived", seconds)
        return Outcome("killed", seconds, _verdict(output), _tail(output))

    def _execute(self, command: Sequence[str], slot: Path,
                 timeout: float) -> tuple[int | None, str]:
        """Exit status (None past `timeout`) and output of `command` run in `slot`."""
        pythonpath = os.pathsep.join(filter(None, [str(slot), os.environ.get("PYTHONPATH")]))
        # rich cuts tables to 80 columns off a terminal; the verdict needs whole property names.
        env = dict(os.environ, PYTHONPATH=pythonpath, PYTHONDONTWRITEBYTECODE="1", COLUMNS="200")
        with self._lock:
            if self._stopped:
                raise RuntimeError("the sandbox is stopped")
            # A session of its own, so that a timeout also ends the gate's worker processes.
            process = subprocess.Popen(command, cwd=slot, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, start_new_session=True)
            self._running.add(process)
        try:
            output, _ = process.communicate(timeout=timeout)
            return process.returncode, output.decode(errors="replace")
        except subprocess.TimeoutExpired:
            _kill_group(process)
            output, _ = process.communicate()
            return None, output.decode(errors="replace")
        finally:
            if process.poll() is None:  # left early (Ctrl-C): take the gate down with us
                _kill_group(process)
            with self._lock:
                self._running.discard(process)


def _repo_python(repo: Path) -> str:
    python = repo / ".venv" / "bin" / "python"
    return str(python) if python.exists() else sys.executable


def default_gate(repo: Path = REPO) -> list[str]:
    """`invar-check --fail-fast` (the gate suite, spec/gate/) as a module, so the copy on
    PYTHONPATH is what it loads; a killed mutant stops the gate at its first violation."""
    return [_repo_python(repo), "-m", "checker.cli", "--fail-fast"]


def _resolve(gate: Sequence[str], repo: Path) -> list[str]:
    # The copy has no .venv: a relative program path means this checkout's.
    program = gate[0]
    if "/" in program and not Path(program).is_absolute():
        program = str(repo / program)
    return [program, *gate[1:]]


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# Where a failing gate says why: a row of invar-check's property table, pytest's summary line,
# the exception ending a traceback.
_PROPERTY_ROW = re.compile(r"^│([^│]*)│([^│]*)│\s*(violated|not reached|unknown)\s*│",
                           re.MULTILINE)
_PYTEST_FAILED = re.compile(r"^FAILED (.*)", re.MULTILINE)
_EXCEPTION = re.compile(r"^\w+(?:Error|Exception)\b.*", re.MULTILINE)


def _verdict(output: str) -> str:
    """One line saying why the gate failed: which properties, which tests, or what raised."""
    failures = [f"{name.strip()} ({kind.strip()}) {verdict}"
                for name, kind, verdict in _PROPERTY_ROW.findall(output)]
    failures = failures or _PYTEST_FAILED.findall(output)
    if not failures:
        failures = _EXCEPTION.findall(output)[-1:] or [
            line for line in output.splitlines() if line.strip()][-1:]
    return "; ".join(" ".join(f.split()) for f in failures)[:300]


def _tail(output: str) -> str:
    lines = [line[:300] for line in output.rstrip().splitlines()]
    return "\n".join(lines[-OUTPUT_TAIL_LINES:])


# ---------------------------------------------------------------------------------------------
# Reports


@dataclass(frozen=True)
class RunSummary:
    command: str
    gate: list[str]
    files: list[str]
    enumerated: int
    timeout: float
    baseline_seconds: float
    results: list[tuple[Mutant, Outcome]]
    equivalent: dict[str, str]
    stale_equivalent: list[str]

    def counts(self, operator: str | None = None) -> Counter[str]:
        return Counter(o.status for m, o in self.results
                       if operator is None or m.operator == operator)

    def score(self, operator: str | None = None) -> float | None:
        counts = self.counts(operator)
        killed = counts["killed"] + counts["timeout"]
        competent = killed + counts["survived"]
        return killed / competent if competent else None


def write_json(path: Path, run: RunSummary) -> None:
    mutants = []
    for mutant, outcome in run.results:
        entry: dict[str, object] = {
            "id": mutant.id, "file": mutant.file, "function": mutant.function,
            "line": mutant.line, "operator": mutant.operator, "before": mutant.before,
            "after": mutant.after, "status": outcome.status,
            "seconds": round(outcome.seconds, 2)}
        if outcome.verdict:
            entry["verdict"] = outcome.verdict
        if outcome.output_tail:
            entry["output_tail"] = outcome.output_tail
        if outcome.status == "equivalent":
            entry["reason"] = run.equivalent[mutant.id]
        mutants.append(entry)
    document = {
        "command": run.command, "gate": run.gate, "files": run.files,
        "enumerated": run.enumerated, "selected": len(run.results), "timeout_s": run.timeout,
        "baseline_seconds": round(run.baseline_seconds, 2),
        "counts": {status: run.counts()[status] for status in STATUSES},
        "score": run.score(), "stale_equivalent_ids": run.stale_equivalent, "mutants": mutants}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")


def write_report(path: Path, run: RunSummary) -> None:
    counts = run.counts()
    lines = [
        "# Mutation testing of the invariant gate", "",
        f"Reproduce: `{run.command}`", "",
        f"Gate: `{shlex.join(run.gate)}` (exit status 0: the mutant survived); "
        f"{len(run.results)} of the {run.enumerated} mutants of "
        f"{', '.join(f'`{f}`' for f in run.files)}; timeout {run.timeout:g} s; "
        f"the unmutated gate ran in {run.baseline_seconds:.1f} s.", "",
        f"**Score: {_score_text(run.score(), counts)}**: killed (timeouts included) over "
        "killed + survived, among competent mutants not judged equivalent.", "",
        "| status | mutants |", "|---|---:|",
        *(f"| {status} | {counts[status]} |" for status in STATUSES), "",
        "## By operator", "",
        "| operator | killed | timeout | survived | score |", "|---|---:|---:|---:|---:|"]
    for operator in OPERATORS:
        by_operator = run.counts(operator)
        if sum(by_operator[s] for s in ("killed", "timeout", "survived")):
            lines.append(f"| {operator} | {by_operator['killed']} | {by_operator['timeout']} | "
                         f"{by_operator['survived']} | "
                         f"{_score_text(run.score(operator), by_operator)} |")
    survivors = [m for m, o in run.results if o.status == "survived"]
    lines += ["", f"## Survivors ({len(survivors)})", "",
              "Each is a gap in the gate or an equivalent mutant to list with its reason.", "",
              "| id | line | before | after |", "|---|---:|---|---|",
              *(f"| `{m.id}` | {m.line} | {_code(m.before)} | {_code(m.after)} |"
                for m in survivors)]
    equivalent = [m for m, o in run.results if o.status == "equivalent"]
    if equivalent:
        lines += ["", f"## Judged equivalent ({len(equivalent)}), not run", "",
                  "| id | after | reason |", "|---|---|---|",
                  *(f"| `{m.id}` | {_code(m.after)} | {_cell(run.equivalent[m.id])} |"
                    for m in equivalent)]
    if run.stale_equivalent:
        lines += ["", "Listed as equivalent but no longer enumerated (stale ids): "
                  + ", ".join(f"`{i}`" for i in run.stale_equivalent)]
    caught = [(m, o) for m, o in run.results if o.status in ("killed", "timeout", "incompetent")]
    if caught:
        lines += ["", f"## Killed, timed out or incompetent ({len(caught)})", "",
                  "| id | status | s | why |", "|---|---|---:|---|",
                  *(f"| `{m.id}` | {o.status} | {o.seconds:.1f} | {_code(o.verdict)} |"
                    for m, o in caught)]
    lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


def _score_text(score: float | None, counts: Counter[str]) -> str:
    if score is None:
        return "n/a"
    killed = counts["killed"] + counts["timeout"]
    return f"{killed}/{killed + counts['survived']} = {100 * score:.1f} %"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return f"`{_cell(text)}`" if text else ""


# ---------------------------------------------------------------------------------------------
# Command line


def load_equivalent(path: Path) -> dict[str, str]:
    """Mutant id -> reason, from a TOML or JSON table of strings."""
    text = path.read_text()
    table = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
        raise ValueError(f"{path}: expected a table mapping mutant ids to reasons")
    return table


def _print_summary(mutants: Sequence[Mutant], files: Sequence[str]) -> None:
    counts = Counter((m.operator, m.file) for m in mutants)
    names = [Path(f).name for f in files]
    width = max(len(n) for n in [*names, "total"]) + 2

    def print_row(label: str, row: list[int]) -> None:
        print(label.ljust(12) + "".join(str(n).rjust(width) for n in [*row, sum(row)]))

    print("operator".ljust(12) + "".join(n.rjust(width) for n in [*names, "total"]))
    for operator in OPERATORS:
        print_row(operator, [counts[operator, file] for file in files])
    print_row("total", [sum(counts[o, file] for o in OPERATORS) for file in files])


def _reporter(total: int) -> tuple[Callable[[Mutant, Outcome], None], AbstractContextManager]:
    """A line per mutant, under a progress bar when stdout is a terminal; the context manager
    shows the bar while it is open."""
    done = Counter[str]()

    def line(mutant: Mutant, outcome: Outcome) -> str:
        done[outcome.status] += 1
        return (f"[{sum(done.values())}/{total}] {outcome.status:<11} "
                f"{outcome.seconds:6.1f}s {mutant.id}")

    if not sys.stdout.isatty():
        return lambda mutant, outcome: print(line(mutant, outcome), flush=True), nullcontext()
    progress = Progress(TextColumn("mutants"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.description}"), TimeElapsedColumn())
    task = progress.add_task("", total=total)

    def report(mutant: Mutant, outcome: Outcome) -> None:
        progress.console.print(line(mutant, outcome), highlight=False, markup=False)
        progress.update(task, advance=1, description=", ".join(
            f"{n} {status}" for status, n in sorted(done.items())))

    return report, progress


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    options, gate = given, []
    if "--" in given:
        split = given.index("--")
        options, gate = given[:split], given[split + 1:]
    parser = argparse.ArgumentParser(
        prog="mutation.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="After `--`: the gate command (default: "
               f"{shlex.join(default_gate())}).")
    parser.add_argument("--files", nargs="+", default=list(DEFAULT_FILES),
                        help="target files, relative to the repository root")
    parser.add_argument("--list", action="store_true",
                        help="print the selected mutants instead of running them")
    parser.add_argument("--summary", action="store_true",
                        help="print mutant counts per operator and file instead of running")
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument("--only", nargs="+", metavar="ID", help="run just these mutants")
    choice.add_argument("--sample", type=int, metavar="N",
                        help="run N mutants drawn uniformly at random (see --seed)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run in parallel")
    parser.add_argument("--timeout", type=float, default=400.0,
                        help="seconds before a gate run counts as a kill (default 400)")
    parser.add_argument("--equivalent", type=Path, metavar="FILE",
                        help="TOML or JSON table: mutant id -> why it is equivalent")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    parser.add_argument("--report", type=Path, metavar="FILE",
                        help="write a Markdown report")
    args = parser.parse_args(options)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")

    files = []
    for name in args.files:
        path = (REPO / name).resolve()
        if not path.is_file() or not path.is_relative_to(REPO):
            parser.error(f"--files: {name} is not a file of this repository")
        files.append(path.relative_to(REPO).as_posix())
    sources = {file: (REPO / file).read_bytes().decode() for file in files}
    mutants = [m for file in files for m in enumerate_mutants(sources[file], file)]
    selected = mutants
    if args.only:
        by_id = {m.id: m for m in mutants}
        unknown = [i for i in args.only if i not in by_id]
        if unknown:
            parser.error("no such mutant: " + ", ".join(unknown))
        selected = [by_id[i] for i in args.only]
    elif args.sample is not None and args.sample < len(mutants):
        # Drawn from the full enumeration, kept in source order.
        chosen = set(random.Random(args.seed).sample(range(len(mutants)), args.sample))
        selected = [m for i, m in enumerate(mutants) if i in chosen]
    if args.list:
        for m in selected:
            print(f"{m.id}\t{m.file}:{m.line}\t{m.operator}\t{m.before} → {m.after}")
    if args.summary:
        _print_summary(selected, files)
    if args.list or args.summary:
        return 0

    try:
        equivalent = load_equivalent(args.equivalent) if args.equivalent else {}
    except (OSError, ValueError, tomllib.TOMLDecodeError) as error:
        parser.error(f"--equivalent: {error}")
    known = {m.id for m in mutants}
    stale = sorted(i for i in equivalent if i not in known)
    if stale:
        print("equivalence list names mutants that no longer exist: " + ", ".join(stale),
              file=sys.stderr)
    gate = gate or default_gate()
    command = shlex.join([".venv/bin/python", "tools/mutation.py", *given])
    to_run = [m for m in selected if m.id not in equivalent]
    print(f"{len(selected)} of {len(mutants)} mutants ({len(selected) - len(to_run)} judged "
          f"equivalent); gate: {shlex.join(gate)}", flush=True)
    with Sandbox(REPO, sources, args.jobs) as sandbox:
        baseline = sandbox.baseline(gate, args.timeout)
        if baseline.status != "survived":
            print(f"{baseline.output_tail}\nthe unmutated copy fails the gate ({baseline.status}: "
                  f"{baseline.verdict}); nothing to measure", file=sys.stderr)
            return 1
        print(f"baseline: the gate passes on the unmutated copy in {baseline.seconds:.1f} s",
              flush=True)
        on_result, display = _reporter(len(to_run))
        with display:
            outcomes = sandbox.run(to_run, gate, args.timeout, on_result)
    for m in selected:
        outcomes.setdefault(m.id, Outcome("equivalent", 0.0))
    run = RunSummary(command=command, gate=gate, files=files, enumerated=len(mutants),
                     timeout=args.timeout, baseline_seconds=baseline.seconds,
                     results=[(m, outcomes[m.id]) for m in selected], equivalent=equivalent,
                     stale_equivalent=stale)
    counts = run.counts()
    print(", ".join(f"{counts[s]} {s}" for s in STATUSES)
          + f"; score {_score_text(run.score(), counts)}")
    if args.json:
        write_json(args.json, run)
    if args.report:
        write_report(args.report, run)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `--list | head` ends quietly
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the sandbox has already stopped its gates
        sys.exit(130)
