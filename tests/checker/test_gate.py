"""The gate (`invar-check` with no argument) sees the protocol, not a slice of it (finding 7).

Each aspect the protocol must survive is exercised by at least one bound of spec/gate/, every
bound names what it covers and checks livelock, and the `sometimes` witnesses of each bound are
reachable (so no bound is vacuous). The bounds themselves run as the gate (`.ci/run`).
"""

from __future__ import annotations

import struct
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from checker import pinned
from checker.cli import _unpinned_counts, main
from checker.fingerprint import canonical, hashes_by_value
from checker.invar_model import Bounds, InvarModel, load_bounds
from checker.model import PropertyKind
from invar.model import RunConfig, fast, initial_state, schedule
from invar.model.fast import BULK_FROM
from invar.model.shell import deliver
from invar.model.state import Sample
from invar.model.world import run_fifo
from invar.testing import canonical_run

GATE = Path(__file__).resolve().parents[2] / "spec" / "gate"
BOUNDS = {path.stem: load_bounds(path) for path in sorted(GATE.glob("*.toml"))}

ASPECTS = {
    "two workers": lambda b: b.workers >= 2,
    "a batch spread over two workers": lambda b: b.workers >= 2 and b.prompts_per_batch >= 2,
    "several optimizer steps per update": lambda b: b.optimizer_steps >= 2,
    "reloads, retention and release (S = 2, P = 2)":
        lambda b: b.max_staleness >= 2 and b.sync_period >= 2
        and b.total_updates > b.max_staleness + 1,
    "evaluation boundaries": lambda b: b.eval_every > 0,
    "checkpoint boundaries": lambda b: 0 < b.checkpoint_every < b.total_updates,
    "worker crash and reconnection": lambda b: b.worker_crashes > 0 and b.worker_restarts,
    "a worker lost for good": lambda b: b.worker_crashes > 0 and not b.worker_restarts,
    "learner crash with several steps": lambda b: b.learner_crashes > 0
        and b.optimizer_steps >= 2,
    "driver restart from the journal after a release":
        lambda b: b.driver_restarts > 0 and b.total_updates >= 3,
    "drops": lambda b: b.drops > 0,
    "a connection-level event repeated, around a worker's loss":
        lambda b: b.repeats > 0 and b.worker_crashes > 0,
    "duplicates": lambda b: b.duplicates > 0,
    "early timers": lambda b: b.early_timers > 0,
    "non-reproducible forwards": lambda b: not b.reproducible_forwards,
    "forged (out-of-protocol) events": lambda b: b.forgeries,
    "reply frames large enough for the core's bulk paths":
        lambda b: b.launch_frames and b.prompts_per_batch * b.group_size >= BULK_FROM,
    "forged scores with a KL term (a reference matrix)": lambda b: b.forgeries and b.kl_coef > 0,
}


def test_the_gate_has_one_copy_shipped_with_the_package() -> None:
    """The bounds and their pinned values live in checker/gate/, package data found through
    importlib.resources (so an installed `invar-check` has them: test_checker_package.py);
    spec/gate is a link to that folder, not a second copy to keep in step."""
    assert GATE.is_symlink() and GATE.resolve() == pinned.GATE
    assert pinned.PINNED == pinned.GATE / "pinned.json" and pinned.PINNED.is_file()


def test_list_names_every_gate_bound_and_where_the_gate_is(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list"]) == 0
    first, *rows = capsys.readouterr().out.splitlines()
    assert str(pinned.GATE) in first and f"{len(BOUNDS)} bounds" in first
    assert [row.split()[0] for row in rows] == list(BOUNDS)


@pytest.mark.parametrize("aspect", list(ASPECTS))
def test_every_aspect_is_in_some_gate_bound(aspect: str) -> None:
    covering = [name for name, (bounds, _) in BOUNDS.items() if ASPECTS[aspect](bounds)]
    assert covering, f"no bound of {GATE} exercises {aspect}"


@pytest.mark.parametrize("name", list(BOUNDS))
def test_every_gate_bound_says_what_it_covers_and_checks_livelock(name: str) -> None:
    data = tomllib.loads((GATE / f"{name}.toml").read_text())
    assert data.get("covers") and data.get("description")
    options = BOUNDS[name][1]
    assert options.get("livelock") is True
    assert options.get("symmetry", True) and options.get("reduction", True)


@pytest.mark.parametrize("name", list(BOUNDS))
def test_gate_bounds_have_witnesses_for_what_they_exercise(name: str) -> None:
    """Vacuity guards: a bound with a fault budget or a feature also asks the checker to
    reach a state where it happened (a `sometimes` property), which fails when unreached."""
    bounds: Bounds = BOUNDS[name][0]
    names = {p.name for p in InvarModel(bounds).properties() if p.kind is PropertyKind.SOMETIMES}
    assert "run_completes" in names
    expected = {
        "a_message_is_dropped": bounds.drops > 0,
        "learner_restart_redoes_an_update": bounds.learner_crashes > 0,
        "worker_reconnects": bounds.worker_crashes > 0 and bounds.worker_restarts,
        "a_lost_worker_stays_lost_and_the_run_completes":
            bounds.worker_crashes > 0 and not bounds.worker_restarts,
        "driver_restarts": bounds.driver_restarts > 0,
        "a_connection_level_event_is_repeated": bounds.repeats > 0,
        "an_update_takes_several_steps": bounds.optimizer_steps > 1,
    }
    assert {n for n, wanted in expected.items() if wanted} <= names


@pytest.mark.parametrize("name", list(BOUNDS))
def test_gate_states_hash_by_value_so_the_search_uses_fast_fingerprints(name: str) -> None:
    """A record that hashes with its own __hash__ anywhere in a state (a history, a ledger
    record) sends the engine back to stable fingerprints, 10-20x slower, with every verdict
    unchanged: only this catches it. Checked on the world at the end of the bound's run, where
    every history and the ledger hold records."""
    model = InvarModel(BOUNDS[name][0])
    start = model.init_states()[0]
    finished = start._replace(world=run_fifo(start.world))
    assert finished.world.core.ledger and finished.world.core.published
    assert hashes_by_value(model.fingerprint_key(finished)) is None


def test_a_core_holding_samples_hashes_by_value_and_fingerprints_by_digest() -> None:
    """A sample (a named tuple under a frozen dataclass: made in bulk in C) hashes, compares and
    is fingerprinted as the dataclass says, by its digest alone: the finished worlds above hold
    no sample (every batch consumed), so a core in the middle of a run is checked here."""
    config = RunConfig(prompts_per_batch=2, group_size=2, total_updates=2)
    state = initial_state(config)
    for event in canonical_run(config).events:
        state = deliver(state, event).state
        if any(type(slot) is Sample for batch in state.batches for slot in batch.slots):
            break
    sample = next(s for b in state.batches for s in b.slots if type(s) is Sample)
    assert hashes_by_value(state) is None
    moved = replace(sample, version=sample.version + 1, row=sample.row + 1)
    assert (moved == sample, moved != sample, hash(moved)) == (True, False, hash(sample))
    assert canonical(moved) == canonical(sample) == ("dc", "invar.model.state.Sample",
                                                     sample.digest)
    forged = replace(sample, digest="0" * 24)
    assert (forged == sample, forged != sample) == (False, True)


def test_the_large_frames_bound_fills_batches_in_bulk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its frames reach `fast.filled_in_bulk` (and so the column paths before it) and fill there:
    a mutant of the bulk paths changes what that bound's runs hold."""
    filled = []
    original = fast.filled_in_bulk

    def counted(state, frame, *rest):
        outcome = original(state, frame, *rest)
        filled.append((len(frame), outcome is not None))
        return outcome

    monkeypatch.setattr(fast, "filled_in_bulk", counted)
    model = InvarModel(BOUNDS["large_frames"][0])
    world = run_fifo(model.init_states()[0].world)
    assert world.core.committed == model.config.total_updates
    assert filled and all(size >= BULK_FROM and bulk for size, bulk in filled), filled


def test_every_gate_bound_has_pinned_state_counts() -> None:
    """`spec/generate.py --measure` pinned every bound (PROTOCOL.md's table is rendered from
    them; `--check` fails otherwise)."""
    values = pinned.load()
    assert all(pinned.bound_counts(values, name) for name in BOUNDS), sorted(BOUNDS)


def test_the_gate_s_inductive_check_is_pinned_and_its_universe_shipped() -> None:
    values = pinned.load()
    assert pinned.bound_counts(values, pinned.INDUCTIVE)
    assert pinned.GATE_UNIVERSE.is_file() and (GATE.parent / "inductive").resolve() == \
        pinned.GATE_UNIVERSE.parent


def test_the_gate_fails_a_bound_whose_state_counts_are_not_the_pinned_ones() -> None:
    values = {"bounds": {"wire": {"distinct_states": 10, "states_generated": 20}}}
    assert _unpinned_counts("wire", {"distinct_states": 10, "states_generated": 20}, values) == ""
    assert "pinned 10 / 20" in _unpinned_counts(
        "wire", {"distinct_states": 10, "states_generated": 21}, values)
    assert "no state counts pinned" in _unpinned_counts(
        "other", {"distinct_states": 1, "states_generated": 1}, values)


def test_the_schedule_is_held_to_its_pinned_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    """A schedule mutant that every run shares (so no bound can see it) fails `--prove`."""
    assert pinned.schedule_result().holds
    monkeypatch.setattr(schedule, "derive_seed", lambda root, *path: 0)
    failed = pinned.schedule_result()
    assert not failed.holds and "derived_seed" in failed.detail


def _without_if_every(config: RunConfig) -> frozenset[int]:
    """`schedule.hard_boundaries` with `if every:` dropped (finding 7's schedule mutant)."""
    n = config.total_updates
    points = {0, n}
    for every in (config.eval_every, config.checkpoint_every):
        points.update(range(0, n + 1, every))
    return frozenset(points)


def _seeds_of_62_bits(root: int, *path: object, count: int) -> list[int]:
    """`schedule.seed_stream` with the words shifted right by 2 (the seed's bit width)."""
    words = struct.unpack(f">{count}Q", schedule._stream_bytes(root, path, count))
    return [word >> 2 for word in words]


@pytest.fixture
def fresh_schedule():
    """The schedule's memos forgotten before and after: a patched definition is then what
    every decision is made from."""
    def forget() -> None:
        for value in vars(schedule).values():
            getattr(value, "cache_clear", lambda: None)()
    forget()
    yield
    forget()


@pytest.mark.parametrize("name, mutant", [("hard_boundaries", _without_if_every),
                                          ("seed_stream", _seeds_of_62_bits),
                                          ("group_seeds", lambda config, batch, prompt: (0,))])
def test_schedule_mutants_that_every_run_shares_fail_prove(
        name, mutant, fresh_schedule, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs and the canonical schedule they are compared with share these definitions, so
    no bound can see them: `--prove` (the gate's first check) does."""
    from checker.prove import python_schedule_is_the_definition
    monkeypatch.setattr(schedule, name, mutant)
    results = [pinned.schedule_result(), python_schedule_is_the_definition()]
    assert not all(result.holds for result in results), results
