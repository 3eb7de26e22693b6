"""`invar-check --inductive`: the invariants proved inductive on `step` over small universes,
and deliberately broken handlers refuted by a counterexample to induction (CTI)."""

from __future__ import annotations

import dataclasses
import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from checker import pinned
from checker.cli import main
from checker.inductive import (
    Builder,
    InductiveResult,
    Universe,
    alphabet,
    check,
    enumerate_states,
    load_universe,
    regression_test,
)
from checker.invar_model import Bounds, InvarModel
from invar.model import core, fast
from invar.model.config import RunConfig
from invar.model.errors import ConfigError
from invar.model.invariants import inductive_violations
from invar.model.messages import WorkerLost
from invar.model.state import initial_state

ROOT = Path(__file__).resolve().parents[2]

TINY = Universe(Bounds(group_size=1, total_updates=1), incarnations=1, loads=1, attempts=1,
                observations=1)
"""One worker, one update: a fraction of a second."""
TWO_WORKERS = Universe(Bounds(group_size=1, total_updates=1, workers=2), incarnations=2,
                       loads=1, attempts=1, observations=1)
INFLIGHT = Universe(Bounds(group_size=1, total_updates=3, max_staleness=2,
                           max_inflight_batches=1), incarnations=1, loads=1, attempts=1,
                    observations=1)
"""M < S + 1: a version is retained for batches not yet admitted."""
PAIRS = Universe(Bounds(group_size=2, total_updates=1), incarnations=1, loads=1, attempts=1,
                 observations=1)
"""A batch of two slots, which one frame can fill."""


@functools.cache
def checked(universe: Universe) -> InductiveResult:
    """`check` of the correct core (a test that patches the core calls `check` itself)."""
    return check(universe)


@pytest.mark.slow  # the gate proves it on every run (its `inductive` row)
def test_the_gate_universe_is_proved_and_init_is_in_indinv() -> None:
    result = check(load_universe(pinned.GATE_UNIVERSE))
    assert result.init_holds and not result.counterexamples, result.counterexamples[:1]
    assert result.states > 1000 and result.transitions > 50 * result.states


@pytest.mark.parametrize("universe", [TINY, TWO_WORKERS, INFLIGHT, PAIRS],
                         ids=["tiny", "two_workers", "inflight", "pairs"])
def test_small_universes_are_proved(universe: Universe) -> None:
    result = checked(universe)
    assert result.proved, [str(c) for c in result.counterexamples[:3]]


def test_every_enumerated_state_satisfies_indinv_and_every_reachable_state_is_enumerated() -> None:
    """The construction is sound (each state it keeps satisfies IndInv) and complete for the
    reachable states: every core state a bounded search with a drop and a duplicate reaches
    is among them."""
    universe = TINY
    found = enumerate_states(universe)
    assert all(not inductive_violations(state) for state in found.states)
    model = InvarModel(Bounds(group_size=1, total_updates=1, drops=1, duplicates=1))
    frontier = model.init_states()
    seen = {model.fingerprint_key(s) for s in frontier}
    cores = set()
    while frontier:
        state = frontier.pop()
        cores.add(state.world.core)
        for _, after in model.successors(state):
            key = model.fingerprint_key(after)
            if key not in seen:
                seen.add(key)
                frontier.append(after)
    assert len(cores) > 10
    assert not [core for core in cores if core not in found.states]


def test_neighbours_of_enumerated_states_that_satisfy_indinv_are_enumerated() -> None:
    """Completeness, field by field: a state one field away from an enumerated one (a worker's
    record, the timer, the publication awaited, the retained versions changed) is enumerated
    whenever it satisfies IndInv."""
    universe = TWO_WORKERS
    builder = Builder(universe)
    found = enumerate_states(universe, builder)
    records = {None, *(r for recipe in found.states.values() for r in recipe.workers)}
    learners = {(attempt, phase, step, observations) for (_, phase, step, _) in
                (recipe.learner for recipe in found.states.values())
                for attempt in range(universe.attempts)
                for observations in range(universe.observations + 1)}
    versions = range(universe.config.total_updates + 1)
    missing = []
    for recipe in list(found.states.values())[::7]:
        neighbours = [recipe._replace(timer_armed=not recipe.timer_armed),
                      *(recipe._replace(publishing=v) for v in (None, *versions)),
                      *(recipe._replace(retained=tuple(sorted({*recipe.retained} ^ {v})))
                        for v in versions),
                      *(recipe._replace(learner=learner) for learner in learners)]
        for index in range(len(recipe.workers)):
            for record in records:
                workers = list(recipe.workers)
                workers[index] = record
                neighbours.append(recipe._replace(workers=tuple(workers)))
        for neighbour in neighbours:
            try:
                state = builder.build(neighbour)
            except KeyError:  # an assignee the changed worker record no longer names
                continue
            if not inductive_violations(state) and state not in found.states:
                missing.append(neighbour)
    assert not missing, missing[:3]


def test_the_alphabet_has_every_event_kind() -> None:
    universe = Universe(Bounds(group_size=1, total_updates=1, kl_coef=0.1, eval_every=1,
                               checkpoint_every=1), incarnations=1, loads=1, attempts=1,
                        observations=1)
    found = enumerate_states(universe)
    kinds = {type(event).__name__ for state in found.states for event in alphabet(state, universe)}
    assert kinds == {t.__name__ for t in core._HANDLERS}


def test_symmetry_keeps_the_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    """One state per renaming of the workers: fewer states, the same verdict, and a broken
    core's counterexamples break the same conjuncts (`step` breaks ties between equally
    loaded workers by name, so the renamed successors are not checked: this is the check that
    they need not be)."""
    symmetric = dataclasses.replace(TWO_WORKERS, symmetry=True)
    plain, reduced = checked(TWO_WORKERS), checked(symmetric)
    assert plain.proved and reduced.proved and reduced.states < plain.states
    _worker_lost_without_incarnation_check(monkeypatch)
    assert ({c.conjunct for c in check(TWO_WORKERS).counterexamples}
            == {c.conjunct for c in check(symmetric).counterexamples} != set())


# ---------------------------------------------------------------------------------------------
# Deliberately broken handlers: each gives a counterexample to induction.


def _worker_lost_without_incarnation_check(mp: Any) -> None:
    original = core._HANDLERS[WorkerLost]

    def handler(state, event):  # noqa: ANN001, ANN202
        known = state.worker(event.worker)
        if known is not None and event.incarnation < known.incarnation:
            # The bug: a loss of a retired incarnation is taken for the current one's.
            event = WorkerLost(event.worker, known.incarnation)
        return original(state, event)

    mp.setitem(core._HANDLERS, WorkerLost, handler)


def _version_needed_without_admitted_clause(mp: Any) -> None:
    from invar.model import schedule

    def needed(state, version):  # noqa: ANN001, ANN202
        if version == state.published[-1]:
            return True
        for b in schedule.batches_of_version(state.config, version):
            held = state.batch(b)  # the bug: a batch not yet admitted does not count
            if held is not None and held.completed < len(held.slots):
                return True
        return any(w.phase.value == "loading" and w.version == version for w in state.workers)

    mp.setattr(core, "_version_needed", needed)


def _bulk_fill_trusts_the_first_slot(mp: Any) -> None:
    mp.setattr(fast, "BULK_FROM", 2)  # the bulk path for a frame of two
    # The bug: the slots a frame fills are read as if all were the first one's.
    mp.setattr(fast, "_slots_at", lambda slots, positions: (slots[positions[0]],) * len(positions))


BROKEN = [
    ("worker_lost_without_incarnation_check", _worker_lost_without_incarnation_check,
     TWO_WORKERS, "stale_event_changes_nothing"),
    ("version_needed_without_admitted_clause", _version_needed_without_admitted_clause,
     INFLIGHT, "needed_versions_retained"),
    ("bulk_fill_trusts_the_first_slot", _bulk_fill_trusts_the_first_slot, PAIRS,
     "batch_counters_consistent"),
]


@pytest.mark.parametrize(("name", "apply", "universe", "conjunct"), BROKEN,
                         ids=[b[0] for b in BROKEN])
def test_a_broken_handler_gives_a_counterexample(monkeypatch: pytest.MonkeyPatch, name: str,
                                                 apply: Any, universe: Universe,
                                                 conjunct: str) -> None:
    apply(monkeypatch)
    result = check(universe)
    assert not result.proved
    assert conjunct in {c.conjunct for c in result.counterexamples}, \
        sorted({c.conjunct for c in result.counterexamples})


def test_the_regression_file_fails_while_the_bug_is_there(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    spec = tmp_path / "inflight.toml"
    spec.write_text("[model]\ngroup_size = 1\ntotal_updates = 3\nmax_staleness = 2\n"
                    "max_inflight_batches = 1\n[universe]\nincarnations = 1\nloads = 1\n"
                    "attempts = 1\nobservations = 1\n")
    with monkeypatch.context() as patched:
        _version_needed_without_admitted_clause(patched)
        result = check(load_universe(spec), stop_after=1)
        assert result.counterexamples
        test = tmp_path / "test_cti.py"
        test.write_text(regression_test(str(spec), result.counterexamples[0]))
        namespace: dict[str, Any] = {}
        exec(compile(test.read_text(), str(test), "exec"), namespace)  # noqa: S102
        name = next(n for n in namespace if n.startswith("test_"))
        with pytest.raises(AssertionError):
            namespace[name]()
    namespace[name]()  # the correct core: it passes


# ---------------------------------------------------------------------------------------------
# The command line.


def test_cli_proves_a_universe_and_refuses_a_bad_file(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "tiny.toml"
    spec.write_text("[model]\ngroup_size = 1\ntotal_updates = 1\n[universe]\nincarnations = 1\n"
                    "loads = 1\nattempts = 1\nobservations = 1\n")
    assert main(["--inductive", str(spec), "--json", str(tmp_path / "out.json")]) == 0
    assert "proved" in capsys.readouterr().out
    spec.write_text("[universe]\nloads = -1\n")
    assert main(["--inductive", str(spec)]) == 2
    assert "universe.loads" in capsys.readouterr().err


def test_cli_reports_counterexamples_and_writes_a_regression_file(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "inflight.toml"
    spec.write_text("[model]\ngroup_size = 1\ntotal_updates = 3\nmax_staleness = 2\n"
                    "max_inflight_batches = 1\n[universe]\nincarnations = 1\nloads = 1\n"
                    "attempts = 1\nobservations = 1\n")
    _version_needed_without_admitted_clause(monkeypatch)
    regression = tmp_path / "test_cti.py"
    assert main(["--inductive", str(spec), "--regression", str(regression)]) == 1
    out = capsys.readouterr().out
    assert "counterexample to induction needed_versions_retained" in out
    assert "not proved" in out and regression.is_file()


def test_load_universe_names_the_key_at_fault(tmp_path: Path) -> None:
    spec = tmp_path / "bad.toml"
    for text, key in (("[model]\ndrops = 1\n", "model.drops"),
                      ("[universe]\nsymmetry = 1\n", "universe.symmetry"),
                      ("[universe]\nattempts = 0\n", "universe.attempts"),
                      ("[model]\nsync_period = 3\n", "model.sync_period")):
        spec.write_text(text)
        with pytest.raises(ConfigError) as raised:
            load_universe(spec)
        assert key in str(raised.value)


def test_init_is_in_indinv_for_the_gate_config() -> None:
    assert not inductive_violations(initial_state(RunConfig(total_updates=3)))


def test_gate_lists_the_inductive_check() -> None:
    done = subprocess.run([sys.executable, "-m", "checker.cli", "--inductive", "--help"],
                          capture_output=True, text=True, cwd=ROOT)
    assert "--inductive" in done.stdout
