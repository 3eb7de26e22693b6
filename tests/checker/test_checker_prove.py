"""checker.prove: the schedule's lemmas for all parameter values (z3), and the z3 encoding
cross-validated against invar.model.schedule on concrete configurations."""

from __future__ import annotations

import pytest
import z3
from rich.console import Console
from rich.text import Text

from checker import prove
from checker.prove import (
    LEMMAS,
    LemmaResult,
    agreement_cases,
    check_lemmas,
    format_results,
    gen_version_z3,
    published_z3,
)
from invar.model import schedule
from invar.model.config import RunConfig
from invar.model.errors import ConfigError

NAMES = {
    "staleness_within_budget", "generating_version_published", "gen_version_monotone",
    "sync_period_is_P", "admission_never_starves_learner", "boundary_clamp",
}
CONFIG_FIELDS = ("max_staleness", "sync_period", "eval_every", "checkpoint_every",
                 "total_updates", "max_inflight_batches")


@pytest.fixture(scope="module")
def valid() -> list[LemmaResult]:
    return check_lemmas(assume_valid=True)


@pytest.fixture(scope="module")
def invalid() -> list[LemmaResult]:
    return check_lemmas(assume_valid=False)


def _by_name(results: list[LemmaResult]) -> dict[str, LemmaResult]:
    return {r.name: r for r in results}


def _config(example: dict[str, int]) -> RunConfig:
    return RunConfig(**{k: v for k, v in example.items() if k in CONFIG_FIELDS})


# --------------------------------------------------------------------------- the lemmas


def test_every_lemma_holds_under_the_valid_preconditions(valid: list[LemmaResult]) -> None:
    by_name = _by_name(valid)
    assert set(by_name) >= NAMES
    assert len(valid) == len(LEMMAS)
    for r in valid:
        assert r.holds, f"{r.name}: {r.detail}"
        assert r.counterexample is None
        assert r.statement and r.seconds >= 0
    assert sum(r.seconds for r in valid) < 20


@pytest.mark.parametrize("name", ["staleness_within_budget", "generating_version_published",
                                  "admission_never_starves_learner"])
def test_dropping_p_le_s_plus_1_gives_a_real_counterexample(
        invalid: list[LemmaResult], name: str) -> None:
    r = _by_name(invalid)[name]
    assert not r.holds
    example = r.counterexample
    assert example is not None, r.detail
    assert example["sync_period"] > example["max_staleness"] + 1
    # Stated in the configuration's own terms, with what goes wrong.
    assert "max_staleness=" in r.detail and "sync_period=" in r.detail and "→" in r.detail
    assert "DISAGREES" not in r.detail
    # The Python schedule refuses it, naming sync_period ...
    config = _config(example)
    with pytest.raises(ConfigError) as raised:
        config.validate()
    assert "sync_period" in raised.value.fields
    # ... and does exhibit the failure the prover found.
    batch = example.get("batch", example.get("committed"))
    assert schedule.gen_version(config, batch) > batch
    assert schedule.staleness(config, batch) < 0


def test_the_minimal_counterexample_is_the_textbook_one(invalid: list[LemmaResult]) -> None:
    r = _by_name(invalid)["staleness_within_budget"]
    assert r.counterexample == {"max_staleness": 0, "sync_period": 2, "eval_every": 0,
                                "checkpoint_every": 0, "total_updates": 2, "batch": 1}
    assert "max_staleness=0, sync_period=2" in r.detail
    assert "batch=1 → no published version in [1, 1]" in r.detail


def test_lemmas_not_needing_the_precondition_still_hold(invalid: list[LemmaResult]) -> None:
    by_name = _by_name(invalid)
    for name in ("multiplication_facts", "encoding_is_the_definition", "gen_version_monotone",
                 "boundary_clamp"):
        assert by_name[name].holds, by_name[name].detail


def test_a_false_claim_is_refuted_with_a_genuine_counterexample() -> None:
    """The prover is not vacuous: staleness <= E - 2 is false, and z3 says where."""
    enc, cfg, (b,), hyps = prove._setup(True, "b")
    gv = enc.gen_version(cfg, b)
    shown = prove._shown(cfg, batch=b)
    result = prove._discharge(prove._Obligation(
        "too_tight", "staleness <= E - 2", enc, hyps + [cfg.E >= 1], b - gv.value <= cfg.E - 2,
        shown, lambda model: ""))
    assert not result.holds
    example = result.counterexample
    assert example is not None
    config = _config(example).validate()
    assert schedule.staleness(config, example["batch"]) > example["eval_every"] - 2


def test_preconditions_are_satisfiable() -> None:
    """The lemmas are not proved from contradictory hypotheses."""
    enc, cfg, (b,), hyps = prove._setup(True, "b")
    gv = enc.gen_version(cfg, b)
    solver = z3.Solver()
    solver.add(*hyps, *enc.side, *enc.facts(), *enc.real_products(), cfg.E >= 1, cfg.C >= 1,
               b - gv.value == cfg.S, cfg.S >= 3)
    assert solver.check() == z3.sat


# --------------------------------------------------------------------------- cross-validation


def test_z3_gen_version_agrees_with_the_python_schedule() -> None:
    cases = agreement_cases()
    assert len(cases) >= 200
    for s, p, e, c, n, b in cases:
        config = RunConfig(max_staleness=s, sync_period=p, eval_every=e, checkpoint_every=c,
                           total_updates=n)
        assert gen_version_z3(s, p, e, c, n, b) == schedule.gen_version(config, b), \
            (s, p, e, c, n, b)


def test_z3_published_set_agrees_with_the_python_schedule() -> None:
    for s, p, e, c, n in [(2, 3, 0, 0, 10), (3, 2, 5, 0, 12), (4, 5, 3, 7, 22), (0, 1, 0, 0, 3)]:
        config = RunConfig(max_staleness=s, sync_period=p, eval_every=e, checkpoint_every=c,
                           total_updates=n)
        for v in range(-1, n + 3):
            assert published_z3(s, p, e, c, n, v) == schedule.is_published(config, v), (
                s, p, e, c, n, v)


def test_python_schedule_is_independent_of_optimizer_steps() -> None:
    base = RunConfig(max_staleness=3, sync_period=2, eval_every=5, total_updates=17,
                     prompts_per_batch=4, group_size=2)
    for k in (1, 2, 8):
        other = RunConfig(max_staleness=3, sync_period=2, eval_every=5, total_updates=17,
                          prompts_per_batch=4, group_size=2, optimizer_steps=k)
        assert schedule.published_versions(other) == schedule.published_versions(base)
        assert [schedule.gen_version(other, b) for b in range(17)] == \
            [schedule.gen_version(base, b) for b in range(17)]


# --------------------------------------------------------------------------- rendering


def test_format_results_is_a_table_safe_for_rich(valid: list[LemmaResult],
                                                 invalid: list[LemmaResult]) -> None:
    for results in (valid, invalid):
        text = format_results(results)
        for r in results:
            assert r.name in text
        # console.print(text) must not eat anything as markup.
        assert Text.from_markup(text).plain == text
        console = Console(record=True, width=300)
        console.print(text)
        assert "no published version" in console.export_text() or results is valid
    assert f"{len(LEMMAS)}/{len(LEMMAS)} lemmas hold" in format_results(valid)
    assert "FAILS" in format_results(invalid)
    assert "no published version in [1, 1]" in " ".join(format_results(invalid).split())
