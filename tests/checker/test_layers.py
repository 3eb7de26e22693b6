"""The layers written down in `checker/__init__.py` and `invar/__init__.py` are the real ones:
the import graph of `checker` and `invar` has no cycle, and each checker module imports only
the layers below its own.  Imports are read with `ast` from every module, imports inside
functions and under ``if TYPE_CHECKING:`` included: deferring an import does not remove the
dependency, it only hides a cycle from Python."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("checker", "invar")

CHECKER_LAYERS: list[set[str]] = [
    {"checker.model"},
    {"checker.fingerprint", "checker.fpset", "checker.trace"},
    {"checker.result", "checker.checkpoint", "checker.statefiles"},
    {"checker._expand"},
    {"checker.engine"},
    {"checker.bfs", "checker.dfs", "checker.simulate", "checker.parallel", "checker.liveness"},
    {"checker.search"},
    {"checker.report"},
    {"checker"},
    {"checker.examples.two_phase_commit", "checker.invar_model", "checker.prove"},
    {"checker.examples.two_phase_readable", "checker.pinned"},
    {"checker.examples"},
    {"checker.cli"},
]
"""Bottom to top: a module may import modules of the layers before its own, never of its own
or a later one (`checker/__init__.py` lists them)."""

ENGINE = set().union(*CHECKER_LAYERS[:CHECKER_LAYERS.index({"checker"})])
"""The general checker: it knows nothing of Invar."""

CHECKER_MAY_IMPORT_FROM_INVAR = ("invar.model", "invar.journal_format", "invar.testing")
"""What the Invar model and trace validation build on; never the runtime's shell."""

RESCORING = ("checker.cli", "invar.runtime.rescore")
"""The one import of the runtime by the checker: `invar-check --trace` re-scores rewards with
the task's verifier, a plug-in the runtime builds from what a run's journal binds (the module
imports the configuration, the tasks and the verifier runner: no shell, no framework)."""
RUNTIME_SHELL = ("invar.runtime.driver", "invar.runtime.supervisor", "invar.runtime.run",
                 "invar.runtime.serial", "invar.runtime.transport", "invar.runtime.ssh",
                 "invar.runtime.worker", "invar.runtime.learner_executor",
                 "invar.runtime.torch_learner", "invar.runtime.mlx_learner",
                 "invar.runtime.commits", "invar.runtime.store")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {
        module_name(p): p
        for package in PACKAGES
        for p in sorted((ROOT / package).rglob("*.py"))
    }


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of `known` that `path` imports (``from a import b`` counts as ``a.b`` when
    that is a module); relative imports resolved against `name`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> nx.DiGraph:
    found = modules()
    known = set(found)
    graph = nx.DiGraph()
    graph.add_nodes_from(known)
    for name, path in found.items():
        graph.add_edges_from((name, target) for target in imports_of(path, name, known))
    return graph


GRAPH = import_graph()


def test_the_import_graph_has_no_cycle() -> None:
    cycles = list(nx.simple_cycles(GRAPH))
    assert nx.is_directed_acyclic_graph(GRAPH), f"import cycles: {cycles[:5]}"


def test_every_checker_module_has_a_layer() -> None:
    layered = set().union(*CHECKER_LAYERS)
    checker_modules = {m for m in GRAPH if m.split(".")[0] == "checker"}
    assert checker_modules == layered, (
        "add the new module to CHECKER_LAYERS (and checker/__init__.py)"
    )


@pytest.mark.parametrize("level", range(len(CHECKER_LAYERS)))
def test_checker_modules_import_only_the_layers_below(level: int) -> None:
    below = set().union(*CHECKER_LAYERS[:level])
    for name in sorted(CHECKER_LAYERS[level]):
        wrong = sorted(
            t
            for t in GRAPH.successors(name)
            if t.split(".")[0] == "checker" and t not in below
        )
        assert not wrong, f"{name} (layer {level}) imports {wrong}, not below it"


def test_the_engine_knows_nothing_of_invar() -> None:
    for name in sorted(ENGINE):
        assert not [t for t in GRAPH.successors(name) if t.split(".")[0] == "invar"], name


def test_the_checker_never_imports_the_runtime() -> None:
    for name in sorted(m for m in GRAPH if m.split(".")[0] == "checker"):
        for target in GRAPH.successors(name):
            if target.split(".")[0] == "invar" and (name, target) != RESCORING:
                assert target == "invar" or target.startswith(CHECKER_MAY_IMPORT_FROM_INVAR), (
                    name,
                    target,
                )
                assert not target.startswith("invar.testing.runtime"), (name, target)


def test_rescoring_imports_no_runtime_shell() -> None:
    reached = nx.descendants(GRAPH, RESCORING[1])
    assert not reached.intersection(RUNTIME_SHELL), sorted(reached)


def test_the_journal_format_builds_on_the_model_alone() -> None:
    """The package's modules import the model and one another, nothing else of Invar."""
    package = [m for m in GRAPH if m == "invar.journal_format"
               or m.startswith("invar.journal_format.")]
    assert len(package) > 1
    for name in package:
        assert all(t.startswith(("invar.model", "invar.journal_format"))
                   for t in GRAPH.successors(name)), (name, sorted(GRAPH.successors(name)))
