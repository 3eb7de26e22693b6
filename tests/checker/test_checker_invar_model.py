"""The Invar model under `invar-check`: pinned state counts, a pinned counterexample, the
validation of each reduction against the unreduced search, and the `invar-check` CLI.

Reductions: a reduction is kept only if, on bounds small enough to search
unreduced, the reduced search gives the same verdicts and the same set of completed-run
projections. Symmetry is held to more: the set of reachable states up to a renaming of the
workers (their orbits) must be exactly the set the symmetric search visits.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
import shutil
from dataclasses import fields
from pathlib import Path

import networkx as nx
import pytest

from checker import Checker, Property, Verdict, pinned
from checker.cli import main, regression_test
from checker.invar_model import Bounds, InvarModel, _rename_core, load_bounds
from helpers.seeded_bugs import BY_NAME
from invar.journal_format import payload_dir
from invar.model import LearnerPhase, logical_projection, transitions
from invar.model.messages import StepFinished
from invar.runtime.journal import write_events
from invar.testing import canonical_run, edit_completion, relinked

ROOT = Path(__file__).resolve().parents[2]
GATE = ROOT / "spec" / "gate"


def short(bounds: Bounds) -> str:
    """The fields that differ from the defaults (test ids, messages)."""
    default = Bounds()
    return ",".join(f"{f.name}={getattr(bounds, f.name)}" for f in fields(Bounds)
                    if getattr(bounds, f.name) != getattr(default, f.name)) or "default"


def spec_text(bounds: Bounds, check: str = "") -> str:
    model = "\n".join(f"{f.name} = {_toml(getattr(bounds, f.name))}" for f in fields(Bounds))
    return f"[model]\n{model}\n" + (f"\n[check]\n{check}\n" if check else "")


def _toml(value: object) -> str:
    return json.dumps(value) if isinstance(value, bool) else repr(value)


def write_spec(tmp_path: Path, bounds: Bounds, check: str = "", name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(spec_text(bounds, check))
    return path


# --------------------------------------------------------------------------- pinned counts

# (bounds, symmetry, reduction) -> (distinct states, states generated); computed once, and
# again when a change to the protocol changes them (one optimizer step and no KL term: no
# scoring phase, 247 -> 223 distinct for the default bounds; the partial-order reduction of
# launches, 3861 -> 2288 for the reduced one; loads, publications and the learner's command
# as ample sets too, 2288 / 6342 -> 1640 / 3475).
PINNED = [
    (Bounds(), False, False, 223, 522),
    (Bounds(drops=1), False, False, 795, 2119),
    (Bounds(workers=2), False, False, 2085, 6272),
    (Bounds(workers=2, drops=1), True, True, 1640, 3475),
]


@pytest.mark.parametrize("bounds, symmetry, reduction, distinct, generated", PINNED,
                         ids=[f"{short(p[0])}-sym{int(p[1])}-por{int(p[2])}" for p in PINNED])
def test_state_counts_are_pinned(bounds: Bounds, symmetry: bool, reduction: bool,
                                 distinct: int, generated: int) -> None:
    result = Checker(InvarModel(bounds, symmetry=symmetry, reduction=reduction),
                     processes=1).bfs()
    assert result.ok and result.complete
    assert (result.distinct_states, result.states_generated) == (distinct, generated)


@pytest.mark.parametrize("name", ["learner", "reload"])
def test_gate_bound_state_counts_are_pinned(name: str) -> None:
    """Two gate bounds as `invar-check` runs them (their [check]: symmetry, reduction and
    livelock on), against the counts `spec/generate.py --measure` pinned; the gate holds the
    others to theirs."""
    bounds, options = load_bounds(GATE / f"{name}.toml")
    model = InvarModel(bounds, symmetry=options["symmetry"], reduction=options["reduction"])
    result = Checker(model, processes=1, check_livelock=options["livelock"]).bfs()
    assert result.ok and result.complete
    assert (result.distinct_states, result.states_generated) == \
        pinned.bound_counts(pinned.load(), name)


# --------------------------------------------------------------------------- pinned trace

DUPLICATE_COMPLETION_PATH = [
    "deliver core|LearnerStarted(incarnation=0, committed_version=0, weights_digest='w0')",
    "deliver core|WorkerConnected(worker='wkr0', incarnation=0)",
    "deliver store|Publish(version=0, weights_digest='w0')",
    "deliver core|VersionPublished(version=0, weights_digest='w0')",
    "deliver wkr0|LoadWeights(worker='wkr0', incarnation=0, load=1, version=0, "
    "weights_digest='w0')",
    "deliver core|WeightsLoaded(worker='wkr0', incarnation=0, load=1, version=0)",
    "deliver wkr0|LaunchRequest(worker='wkr0', incarnation=0, request=RequestId(batch=0, "
    "prompt=0, sample=0), version=0, seed=5868321218909446902, prompt_index=0)",
    "duplicate core|RequestsCompleted(worker='wkr0', incarnation=0, completions=Completions.of(("
    "Completion(request=RequestId(batch=0, prompt=0, sample=0), version=0, tokens=(2, 1), "
    "behavior_logprobs=(-0.8980769230769231, 0.0), reward=0.0),)))",
    "deliver core|RequestsCompleted(worker='wkr0', incarnation=0, completions=Completions.of(("
    "Completion(request=RequestId(batch=0, prompt=0, sample=0), version=0, tokens=(2, 1), "
    "behavior_logprobs=(-0.8980769230769231, 0.0), reward=0.0),)))",
    "deliver core|RequestsCompleted(worker='wkr0', incarnation=0, completions=Completions.of(("
    "Completion(request=RequestId(batch=0, prompt=0, sample=0), version=0, tokens=(2, 1), "
    "behavior_logprobs=(-0.8980769230769231, 0.0), reward=0.0),)))",
]


def test_shortest_counterexample_is_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stateright style: the exact shortest path to the seeded duplicate-completion bug."""
    bug = BY_NAME["duplicate_completion_applied_twice"]
    bug.apply(monkeypatch)
    model = InvarModel(bug.bounds)
    result = Checker(model, processes=1, finish_when="any_failure").bfs()
    trace = result.counterexample("batch_counters_consistent")
    assert [model.format_action(a) for a in trace.actions] == DUPLICATE_COMPLETION_PATH


def test_a_phase_move_the_table_does_not_list_is_a_violation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The phase tables are authoritative: strike the last StepFinished's move to COMMITTING
    from the learner table (the handler still makes it, and `learner_accepts` still accepts
    the event) and `phase_moves_are_listed` finds the unlisted move."""
    table = dict(transitions.LEARNER)
    table[(LearnerPhase.APPLYING, StepFinished)] = (LearnerPhase.FORWARD,)
    monkeypatch.setattr(transitions, "LEARNER", table)
    model = InvarModel(Bounds())
    result = Checker(model, processes=1).bfs()
    assert result.properties["phase_moves_are_listed"].verdict is Verdict.VIOLATED
    assert [name for name, p in result.properties.items() if not p.ok] == ["phase_moves_are_listed"]
    (_, before), (action, after) = result.counterexample("phase_moves_are_listed").steps[-2:]
    assert model.format_action(action).startswith("deliver core|StepFinished(")
    assert (before.world.core.learner.phase, after.world.core.learner.phase) == (
        LearnerPhase.APPLYING, LearnerPhase.COMMITTING)


# --------------------------------------------------------------------------- per-search memos


def _refusing_commits(original):
    """A learner rule that refuses every Commit (and decides the rest as `original`)."""
    from invar.model.messages import Commit
    from invar.model.world import Decision

    def decide(self, command):
        return Decision.REFUSE if isinstance(command, Commit) else original(self, command)
    return decide


def test_component_answers_are_remembered_per_search_not_across_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The components' answers are remembered by value (`AnswersByValue`) for one model
    instance's search only: a model made after a test patches the learner's rules answers by
    the patched rules, although the learners and commands of both searches are equal values
    (a memo kept across models would hand the second search the first one's commits)."""
    from invar.model.world import LearnerRules

    honest = Checker(InvarModel(Bounds()), processes=1).bfs()
    assert honest.ok and (honest.distinct_states, honest.states_generated) == (223, 522)
    monkeypatch.setattr(LearnerRules, "decide", _refusing_commits(LearnerRules.decide))
    refusing = Checker(InvarModel(Bounds()), processes=1).bfs()
    assert refusing.verdict("run_completes") is Verdict.NOT_REACHED
    monkeypatch.undo()  # and back: nor do the refusals outlive their search
    again = Checker(InvarModel(Bounds()), processes=1).bfs()
    assert again.ok and (again.distinct_states, again.states_generated) == (223, 522)


# --------------------------------------------------------------------------- reductions


class Recording(InvarModel):
    """InvarModel plus side channels: the logical projection and the core (up to a renaming
    of the workers) of every completed state, and every state's orbit under worker
    renaming (the symmetric fingerprint key)."""

    def __init__(self, bounds: Bounds, symmetry: bool, reduction: bool, orbits: bool) -> None:
        super().__init__(bounds, symmetry=symmetry, reduction=reduction)
        self.projections: set = set()
        self.final_cores: set[str] = set()
        self.orbits: set[str] = set()
        self._record_orbits = orbits
        self._canon = InvarModel(bounds, symmetry=True)

    def _final_core(self, core) -> str:
        names = self.worker_names
        return min(repr(_rename_core(core, dict(zip(names, perm))))
                   for perm in itertools.permutations(names))

    def properties(self) -> list[Property]:
        def record_final(state) -> bool:
            self.projections.add(logical_projection(state.world.core))
            self.final_cores.add(self._final_core(state.world.core))
            return True

        def record_orbit(state) -> bool:
            self.orbits.add(self._canon.fingerprint_key(state))
            return True

        extra = [Property.final("zz_record_final", record_final)]
        if self._record_orbits:
            extra.append(Property.always("zz_record_orbit", record_orbit))
        return [*super().properties(), *extra]


def _explore(bounds: Bounds, symmetry: bool, reduction: bool, orbits: bool):
    model = Recording(bounds, symmetry, reduction, orbits)
    result = Checker(model, processes=1, finish_when="exhausted").bfs()
    assert result.complete
    verdicts = {n: p.verdict for n, p in result.properties.items() if not n.startswith("zz_")}
    return model, result, verdicts


VALIDATION_BOUNDS = [
    Bounds(workers=2, drops=1),
    Bounds(workers=2, worker_crashes=1, total_updates=1),
    Bounds(workers=2, learner_crashes=1, max_inflight_batches=1),
]


@pytest.mark.parametrize("bounds", VALIDATION_BOUNDS, ids=short)
def test_reductions_preserve_verdicts_and_completed_runs(bounds: Bounds) -> None:
    base, base_result, base_verdicts = _explore(bounds, False, False, orbits=True)
    assert base_result.ok, {p.name: p.verdict.value for p in base_result.violations}
    assert base.projections == {base.canonical_projection}
    rows = [("none", base_result.distinct_states, base_result.states_generated,
             base_result.duration_s)]
    for symmetry, reduction, label in [(True, False, "symmetry"), (False, True, "por"),
                                       (True, True, "both")]:
        model, result, verdicts = _explore(bounds, symmetry, reduction, orbits=symmetry)
        rows.append((label, result.distinct_states, result.states_generated,
                     result.duration_s))
        assert verdicts == base_verdicts, label
        assert model.projections == base.projections, label
        assert model.final_cores == base.final_cores, label
        if symmetry and not reduction:
            # Exact: the symmetric search visits one state per reachable orbit, all of them.
            assert model.orbits == base.orbits
            assert result.distinct_states == len(base.orbits) < base_result.distinct_states
        if symmetry and reduction:
            assert model.orbits <= base.orbits
        assert result.distinct_states <= base_result.distinct_states
        assert result.states_generated <= base_result.states_generated
    print(f"\n{short(bounds)}: " + "; ".join(
        f"{label}: {d} distinct / {g} generated ({s:.1f} s)" for label, d, g, s in rows))


# --------------------------------------------------------------------------- the CLI


def test_cli_tiny_spec_passes_and_writes_json_dot_graphml(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, Bounds())
    out = {k: tmp_path / f"out.{k}" for k in ("json", "dot", "graphml")}
    code = main([str(spec), "--quiet", "--json", str(out["json"]), "--dot", str(out["dot"]),
                 "--graphml", str(out["graphml"])])
    assert code == 0
    doc = json.loads(out["json"].read_text())
    assert doc["complete"] is True and doc["counterexamples"] == {}
    assert doc["bounds"]["workers"] == 1
    assert set(doc["properties"].values()) == {"holds"}
    assert doc["properties"]["livelock"] == "holds"  # a graph export records the graph
    distinct = doc["distinct_states"]
    # DOT: every line is a node or an edge of the recorded graph.
    lines = out["dot"].read_text().strip().splitlines()
    assert lines[0] == "digraph states {" and lines[-1] == "}"
    node = re.compile(r'^  "(-?\d+)" \[label="(?:[^"\\]|\\.)*"(?:, [a-z]+=[a-z]+)*\];$')
    edge = re.compile(r'^  "(-?\d+)" -> "(-?\d+)"(?: \[label="(?:[^"\\]|\\.)*"\])?;$')
    nodes = {m.group(1) for line in lines if (m := node.match(line))}
    edges = [line for line in lines if edge.match(line)]
    assert all(node.match(x) or edge.match(x) or x.startswith("  node ") for x in lines[1:-1])
    assert len(nodes) == distinct and edges
    graph = nx.read_graphml(out["graphml"])
    assert graph.number_of_nodes() == distinct
    assert graph.number_of_edges() == len(edges)
    assert any(d.get("final") for _, d in graph.nodes(data=True))


def test_cli_livelock_check_runs_on_two_processes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A spec asking for the livelock check runs on `--processes 2` (the graph gathered from
    the workers' edges); `--no-livelock` leaves the livelock property out."""
    spec = write_spec(tmp_path, Bounds(drops=1), check="livelock = true")
    doc_path = tmp_path / "r.json"
    assert main([str(spec), "--quiet", "--processes", "2", "--json", str(doc_path)]) == 0
    assert "one process" not in capsys.readouterr().out
    doc = json.loads(doc_path.read_text())
    assert doc["processes"] == 2 and doc["properties"]["livelock"] == "holds"
    assert doc["distinct_states"] == 422  # partial-order reduction on, as [check] defaults
    assert main([str(spec), "--quiet", "--processes", "2", "--no-livelock",
                 "--json", str(doc_path)]) == 0
    assert "one process" not in capsys.readouterr().out
    doc = json.loads(doc_path.read_text())
    assert doc["processes"] == 2 and "livelock" not in doc["properties"]
    assert doc["distinct_states"] == 422


def test_cli_bounded_search_is_inconclusive_not_a_violation(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--max-states cuts the search short: `run_completes` is then not reached, which is
    inconclusive (exit 0 with a warning), not a violation; a violation found within the
    bound still exits 1."""
    monkeypatch.setenv("COLUMNS", "1000")
    doc_path = tmp_path / "bounded.json"
    spec = write_spec(tmp_path, Bounds(drops=1))
    assert main([str(spec), "--quiet", "--max-states", "50", "--json", str(doc_path)]) == 0
    out = capsys.readouterr().out
    assert "incomplete search (max_states)" in out and "run_completes" in out
    doc = json.loads(doc_path.read_text())
    assert doc["complete"] is False and doc["stop_reason"] == "max_states"
    assert doc["properties"]["run_completes"] == "not reached"
    bug = BY_NAME["version_released_too_early"]
    bug.apply(monkeypatch)
    assert main([str(write_spec(tmp_path, bug.bounds)), "--quiet", "--max-states", "400"]) == 1


@pytest.mark.parametrize("model, check, field_name", [
    ("workerz = 2", "", "model.workerz"),
    ("workers = \"two\"", "", "model.workers"),
    ("drops = 1.5", "", "model.drops"),
    ("drops = -1", "", "model.drops"),
    ("workers = 0", "", "model.workers"),
    ("sync_period = 3\nmax_staleness = 1", "", "model.sync_period"),
    ("", "symmetry = 1", "check.symmetry"),
    ("", "threads = 2", "check.threads"),
])
def test_cli_bad_spec_exits_2_naming_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        model: str, check: str, field_name: str) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text(f"[model]\n{model}\n" + (f"[check]\n{check}\n" if check else ""))
    assert main([str(spec), "--quiet"]) == 2
    assert field_name in capsys.readouterr().err


def test_cli_unreadable_spec_exits_2_naming_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.toml"
    assert main([str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err
    broken = tmp_path / "broken.toml"
    broken.write_text("[model\nworkers = 1\n")
    assert main([str(broken)]) == 2
    assert str(broken) in capsys.readouterr().err


def _load_test_function(path: Path):
    spec = importlib.util.spec_from_file_location(f"generated_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tests = [getattr(module, n) for n in dir(module) if n.startswith("test_")]
    assert len(tests) == 1
    return tests[0]


@pytest.mark.parametrize("bug_name", ["batch_filled_in_completion_order",
                                      "reissued_request_new_seed"])
def test_cli_regression_file_fails_under_the_bug_and_passes_when_fixed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bug_name: str) -> None:
    bug = BY_NAME[bug_name]
    spec = write_spec(tmp_path, bug.bounds)
    regression = tmp_path / f"test_regression_{bug_name}.py"
    doc_path = tmp_path / "violation.json"
    with monkeypatch.context() as mp:
        bug.apply(mp)
        code = main([str(spec), "--quiet", "--regression", str(regression),
                     "--json", str(doc_path)])
        assert code == 1
        doc = json.loads(doc_path.read_text())
        assert doc["properties"][bug.prop] == "violated"
        assert doc["counterexamples"][bug.prop]["core_events"]
        test = _load_test_function(regression)
        with pytest.raises(AssertionError):
            test()
    # The correct core: the same file passes.
    _load_test_function(regression)()


def test_regression_file_replays_a_driver_restart(tmp_path: Path) -> None:
    """A trace through a driver restart: the restart is a Python `None` in the file."""
    bounds = Bounds(driver_restarts=1, total_updates=1)
    model = InvarModel(bounds)
    result = Checker(model, processes=1, max_states=500).bfs()
    witness = result.witness("driver_restarts")
    # Extend the witness until the restarted core has seen an event.
    state = witness.last_state
    steps = list(witness.steps)
    for _ in range(6):
        action, state = next(iter(model.successors(state)))
        steps.append((action, state))
    extended = type(witness)(tuple(steps))
    path = tmp_path / "test_restart.py"
    path.write_text(regression_test(bounds, "driver_restarts", extended, model))
    assert "    None,\n" in path.read_text()
    _load_test_function(path)()


# --------------------------------------------------------------------------- --trace


def _journal(tmp_path: Path) -> Path:
    config = Bounds().protocol()
    return write_events(tmp_path / "journal.jsonl", config,
                        canonical_run(config, ("wkr0",)).events)


def test_cli_trace_accepts_a_real_journal_and_reports_a_tampered_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # rich: no wrapping inside the paths
    path = _journal(tmp_path)
    assert main(["--trace", str(path), "--no-rescore"]) == 0  # the fakes' rewards
    assert "all 18 events match the model" in capsys.readouterr().out
    lines = path.read_text().splitlines()
    number = next(i for i, line in enumerate(lines)
                  if '"RequestsCompleted"' in line)  # 0-based index; file line number + 1
    record = json.loads(lines[number])
    original = record["event"]
    tampered = tmp_path / "tampered.jsonl"
    shutil.copytree(payload_dir(path), payload_dir(tampered))  # its payloads, to tamper with
    record["event"] = edit_completion(tampered, original, 0, reward=1.0)
    lines[number] = json.dumps(record, separators=(",", ":"))
    tampered.write_text("\n".join(lines) + "\n")
    assert main(["--trace", str(tampered)]) == 1
    out = capsys.readouterr().out
    assert "departure" in out and f"{tampered}:{number + 1}: the line has a chain link" in out
    tampered.write_text(relinked([line + "\n" for line in lines]))  # past the chain
    assert main(["--trace", str(tampered)]) == 1
    out = capsys.readouterr().out
    assert "departure" in out and f"{tampered}:{number + 1}" in out
    assert "state digest after" in out
    # An event the model refuses (a completion claiming another version).
    record["event"] = edit_completion(tampered, original, 0, version=1)
    lines[number] = json.dumps(record, separators=(",", ":"))
    tampered.write_text(relinked([line + "\n" for line in lines]))
    assert main(["--trace", str(tampered)]) == 1
    assert "the model refuses the event" in capsys.readouterr().out
    assert main(["--trace", str(tmp_path / "missing.jsonl")]) == 2
