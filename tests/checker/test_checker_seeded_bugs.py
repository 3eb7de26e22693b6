"""The checker can fail: every seeded bug (tests/helpers/seeded_bugs.py) is caught.

For each mutant of the core: the shortest counterexample violates the property the bug is
about, the trace is non-empty, and its core events (what `checker.cli.core_events` extracts,
what a generated regression test replays) reproduce the violation when stepped through the
mutated core, and do not on the correct one. The same bounds on the correct core raise no
alarm, so each catch is the bug's and not the bounds'.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from checker import Checker, Verdict
from checker.cli import core_events
from checker.invar_model import InvarModel
from helpers.seeded_bugs import BY_NAME, SEEDED_BUGS, SeededBug, replay


def _catch(bug: SeededBug, symmetry: bool = False, reduction: bool = False):
    model = InvarModel(bug.bounds, symmetry=symmetry, reduction=reduction)
    result = Checker(model, processes=1, finish_when=bug.finish_when).bfs()
    return model, result


@pytest.mark.parametrize("bug", SEEDED_BUGS, ids=lambda b: b.name)
def test_seeded_bug_is_caught_with_a_replayable_counterexample(
        bug: SeededBug, monkeypatch: pytest.MonkeyPatch) -> None:
    bug.apply(monkeypatch)
    start = time.perf_counter()
    model, result = _catch(bug)
    assert time.perf_counter() - start < 10
    assert not result.ok
    assert result.verdict(bug.prop) is Verdict.VIOLATED, (
        bug.name, {p.name: p.verdict.value for p in result.violations})
    trace = result.counterexample(bug.prop)
    assert trace is not None and len(trace) > 0
    events = core_events(trace, model)
    assert events, "the counterexample never reaches the core"
    broken = replay(events, model)
    assert bug.prop in broken, (bug.name, broken)
    assert bug.detail in broken[bug.prop], broken[bug.prop]
    # The same events through the correct core: the violation is the mutant's.
    monkeypatch.undo()
    assert bug.prop not in replay(events, InvarModel(bug.bounds))


@pytest.mark.parametrize("bug", SEEDED_BUGS, ids=lambda b: b.name)
def test_seeded_bug_is_caught_under_the_default_reductions(
        bug: SeededBug, monkeypatch: pytest.MonkeyPatch) -> None:
    """Symmetry and partial-order reduction (on in the shipped specs) hide no seeded bug."""
    bug.apply(monkeypatch)
    _, reduced = _catch(bug, symmetry=True, reduction=True)
    assert reduced.verdict(bug.prop) is Verdict.VIOLATED
    assert len(reduced.counterexample(bug.prop)) > 0


@pytest.mark.parametrize("bounds", sorted({b.bounds for b in SEEDED_BUGS}, key=repr), ids=repr)
def test_correct_core_passes_the_seeded_bugs_bounds(bounds) -> None:
    """No false alarm: the unmutated core satisfies every property on the same bounds."""
    result = Checker(InvarModel(bounds), processes=1).bfs()
    assert result.complete
    assert result.ok, {p.name: p.verdict.value for p in result.violations}


def test_every_seeded_bug_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The summary: the whole list, each with the property that caught it."""
    caught: dict[str, tuple[str, int]] = {}
    for bug in SEEDED_BUGS:
        with monkeypatch.context() as mp:
            bug.apply(mp)
            _, result = _catch(bug)
            trace = result.counterexample(bug.prop)
            if trace is not None:
                caught[bug.name] = (bug.prop, len(trace))
    print("\nseeded bugs caught (property, trace length):")
    for name, (prop, length) in caught.items():
        print(f"  {name:40} {prop:42} {length:3} steps")
    assert set(caught) == set(BY_NAME), f"missed: {sorted(set(BY_NAME) - set(caught))}"
    assert len(SEEDED_BUGS) >= 8


def test_a_repeated_connection_bug_needs_a_world_that_repeats_connections(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 6: with connection-level events never repeated (the world before `repeats`),
    a core that resets a worker on a repeat of its connection passes; with one repeat, the
    checker catches it."""
    bug = BY_NAME["repeated_connection_resets_the_worker"]
    bug.apply(monkeypatch)
    never_repeated = Checker(InvarModel(dataclasses.replace(bug.bounds, repeats=0)),
                             processes=1).bfs()
    assert never_repeated.ok and never_repeated.complete
    _, caught = _catch(bug)
    assert caught.verdict(bug.prop) is Verdict.VIOLATED
