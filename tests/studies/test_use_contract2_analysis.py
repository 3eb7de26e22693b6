"""The second use-contract study's analysis (studies/use_contract2.py) against hand-computed
cases: Kaplan-Meier and its restricted mean, the time to threshold of a curve, the pairing, the
paired bootstrap, the registered rule, the power calculation and the re-run rule. Nothing here
runs training; the offline evaluation is checked against the learner's own."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("studies_use_contract2",
                                               ROOT / "studies" / "use_contract2.py")
assert _spec is not None and _spec.loader is not None
uc2 = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = uc2
_spec.loader.exec_module(uc2)


# -- Kaplan-Meier ------------------------------------------------------------------------------


def test_km_steps_by_hand():
    # t=1: 5 at risk, 1 event -> 4/5; t=2: 4 at risk (the run censored at 2 counts), 1 event
    # -> 0.8 * 3/4 = 0.6; t=3: 2 at risk, 1 event -> 0.3.
    steps = uc2.km_survival([1, 2, 2, 3, 4], [True, True, False, True, False])
    assert [t for t, _ in steps] == [1, 2, 3]
    assert [s for _, s in steps] == pytest.approx([0.8, 0.6, 0.3])


def test_km_restricted_mean_by_hand():
    times, events = [1, 2, 2, 3, 4], [True, True, False, True, False]
    # Area: 1 x 1 + 0.8 x 1 + 0.6 x 1 + 0.3 x 2 (from 3 to the horizon 5).
    assert uc2.km_restricted_mean(times, events, 5) == pytest.approx(3.0)
    # Cut inside a step: 1 + 0.8 + 0.6 x 0.5.
    assert uc2.km_restricted_mean(times, events, 2.5) == pytest.approx(2.1)


def test_km_restricted_mean_is_the_mean_of_truncated_times_when_censored_at_the_horizon():
    times = [3.0, 7.5, 10.0, 10.0, 4.0]
    events = [True, True, False, False, True]
    assert uc2.km_restricted_mean(times, events, 10.0) == pytest.approx(
        sum(times) / len(times))


def test_km_restricted_mean_edges():
    assert uc2.km_restricted_mean([5.0], [True], 5.0) == 5.0
    assert uc2.km_restricted_mean([2.0, 2.0], [True, True], 5.0) == 2.0
    assert uc2.km_restricted_mean([9.0], [False], 5.0) == 5.0
    with pytest.raises(ValueError):
        uc2.km_restricted_mean([], [], 5.0)
    with pytest.raises(ValueError):
        uc2.km_survival([1.0], [True, False])


# -- a run's curve -----------------------------------------------------------------------------

CURVE = [[0, 0.0, 0.1], [1, 1.5, 0.5], [2, 3.0, 0.85], [3, 4.2, 0.9]]


def test_time_to_threshold():
    assert uc2.time_to_threshold(CURVE, 0.8, 10.0, 4.2) == (3.0, True)
    # The horizon falls before the version that reached it: censored at the horizon.
    assert uc2.time_to_threshold(CURVE, 0.8, 2.9, 4.2) == (2.9, False)
    # Never reached: censored where the run's follow-up ended.
    assert uc2.time_to_threshold(CURVE, 0.95, 10.0, 4.2) == (4.2, False)
    assert uc2.time_to_threshold(CURVE, 0.1, 10.0, 4.2) == (0.0, True)


def test_reward_at():
    assert uc2.reward_at(CURVE, 2.0) == 0.5
    assert uc2.reward_at(CURVE, 3.0) == 0.85
    assert uc2.reward_at(CURVE, -1.0) is None
    assert uc2.reward_at(CURVE, 2, index=0) == 0.85


def test_steady_rate():
    rows = [{"update": u, "wall": w} for u, w in enumerate([1.0, 1.5, 2.0, 3.0, 3.5, 4.0])]
    assert uc2.steady_rate(rows, 3) == pytest.approx(2 / 1.0)
    assert uc2.steady_rate(rows[:4], 3) is None


# -- pairing, bootstrap, rule, power ---------------------------------------------------------


def test_pairs_of_keeps_seeds_both_arms_have_in_seed_order():
    runs = {("async", 1): "a1", ("sync", 1): "s1", ("async", 2): "a2", ("sync", 3): "s3",
            ("async", 4): "a4", ("sync", 4): "s4"}
    assert uc2.pairs_of(runs, "async", "sync", [4, 3, 2, 1]) == [(4, "a4", "s4"),
                                                                   (1, "a1", "s1")]


def test_paired_bootstrap_by_hand():
    import numpy as np
    values = np.array([0.0, 1.0])
    # Resamples of two pairs: mean 0 (1/4), 0.5 (1/2), 1 (1/4): the 95 % interval is [0, 1].
    assert uc2.paired_bootstrap(2, lambda i: float(values[i].mean())) == (0.5, 0.0, 1.0)
    same = np.full(15, 0.7)
    assert uc2.paired_bootstrap(15, lambda i: float(same[i].mean())) == pytest.approx(
        (0.7, 0.7, 0.7))


@pytest.mark.parametrize(("ratio", "diff", "verdict"), [
    ((0.6, 0.5, 0.8), (0.0, -0.02, 0.03), "use async"),
    ((0.6, 0.5, 0.8), (-0.1, -0.2, 0.0), "inconclusive"),  # faster, but may lose reward
    ((1.3, 1.1, 1.5), (0.0, -0.01, 0.01), "do not use"),
    ((0.8, 0.6, 1.2), (-0.1, -0.15, -0.06), "do not use"),  # loses reward
    ((1.0, 0.95, 1.05), (0.0, -0.02, 0.02), "no material difference"),
    ((1.0, 0.85, 1.05), (0.0, -0.02, 0.02), "inconclusive"),
    ((0.97, 0.93, 0.99), (0.0, -0.02, 0.02), "use async"),  # small, but shown
])
def test_decide(ratio, diff, verdict):
    assert uc2.decide(ratio, diff) == verdict


def test_t_quantile_against_tables():
    assert uc2.t_quantile(0.975, 14) == pytest.approx(2.1448, abs=2e-3)
    assert uc2.t_quantile(0.8, 14) == pytest.approx(0.8681, abs=2e-3)
    assert uc2.t_quantile(0.975, 5) == pytest.approx(2.5706, abs=1e-2)


def test_detectable_difference_by_hand():
    # (t_0.975,14 + t_0.8,14) x sd / sqrt(15) = (2.1448 + 0.8681) x 1 / 3.873.
    assert uc2.detectable_difference(1.0, 15) == pytest.approx(0.7779, abs=1e-3)
    assert uc2.detectable_difference(2.0, 15) == pytest.approx(2 * 0.7779, abs=2e-3)


def _attempt(other: float, failed: bool = False) -> dict:
    return {"other_cores": other, **({"failed": True} if failed else {})}


def test_the_rerun_rule():
    assert uc2.needs_attempt([])
    assert uc2.needs_attempt([_attempt(0.4)])
    first = [_attempt(0.1)]
    assert uc2.chosen_attempt(first) is first[0] and not uc2.needs_attempt(first)
    second = [_attempt(0.4), _attempt(0.1)]
    assert uc2.chosen_attempt(second) is second[1] and not uc2.needs_attempt(second)
    # Three disturbed attempts: no more; the least disturbed is used (and flagged).
    three = [_attempt(0.4), _attempt(0.3), _attempt(0.5)]
    assert uc2.chosen_attempt(three) is three[1] and not uc2.needs_attempt(three)
    failed = [_attempt(0.0, failed=True)]
    assert uc2.chosen_attempt(failed) is None and uc2.needs_attempt(failed)


# -- the whole analysis on made-up records --------------------------------------------------


def _run(arm: str, seed: int, reach: float | None, rate: float, other: float = 0.0,
         attempt: int = 1) -> dict:
    """A main-study record: updates at `rate`/s to the budget, held-out reward rising to 0.9
    at wall `reach` (never, for None)."""
    walls = [(u + 1) / rate for u in range(int(uc2.BUDGET * rate) + 1)]
    curve = [[0, 0.0, 0.1]] + [[u + 1, w, 0.9 if reach is not None and w >= reach else 0.3]
                               for u, w in enumerate(walls)]
    return {"id": f"{arm}.seed{seed}", "kind": "main", "arm": arm, "seed": seed,
            "attempt": attempt, "other_cores": other, "process_wall": uc2.BUDGET + 3,
            "started_utc": "2026-12-02 15:30:00", "load_before": [1.0], "load_after": [1.0],
            "commit": "abc", "dirty": False, "curve": curve, "R": 0.2, "T": 0.3,
            "updates": [{"update": u, "wall": w} for u, w in enumerate(walls)],
            "steady_updates_per_second": rate}


def test_analysis_of_made_up_runs(tmp_path):
    attempts = {}
    for seed in uc2.SEEDS:
        attempts[f"async.seed{seed}"] = [_run("async", seed, 10.0 + seed % 3, 3.0)]
        attempts[f"sync.seed{seed}"] = [_run("sync", seed, 20.0 + seed % 3, 2.0)]
    # One disturbed sync run, re-run once undisturbed: the re-run is the one used.
    attempts["sync.seed1"] = [_run("sync", 1, 5.0, 2.0, other=0.9),
                              _run("sync", 1, None, 2.0, attempt=2)]
    result = uc2.analyse(attempts)
    c = result["comparison"]
    assert c["pairs"] == len(uc2.SEEDS)
    # The times the curves reach 0.9: the first update wall at or past `reach`.
    def at(reach, rate):
        return math.ceil(reach * rate) / rate
    sync = [uc2.BUDGET] + [at(20.0 + s % 3, 2.0) for s in uc2.SEEDS[1:]]
    fast = [at(10.0 + s % 3, 3.0) for s in uc2.SEEDS]
    assert c["rmst"] == pytest.approx((sum(fast) / 15, sum(sync) / 15))
    assert c["rmst_ratio"][2] < 1 and c["decision"] == "use async"
    assert c["throughput_ratio"][0] == pytest.approx(1.5)
    assert result["reruns"] == ["sync.seed1"]
    assert c["undisturbed"] is None
    assert result["arms"]["sync"]["reached"] == 14
    e = c["efficiency"]
    assert e["horizon_updates"] == int(uc2.BUDGET * 2.0)
    uc2.write_results(attempts, tmp_path, _Quiet())
    text = (tmp_path / "RESULTS-2.md").read_text()
    assert "**use async**" in text and "Partial study" in text  # the sweep did not run


class _Quiet:
    def print(self, *args, **kwargs):
        pass


# -- the offline evaluation is the learner's -------------------------------------------------


def test_offline_evaluation_matches_the_learner(tmp_path):
    import torch

    from invar.runtime.policy_config import PolicyConfig
    from invar.runtime.task import DigitReversal
    from invar.runtime.torch_learner import OptimConfig, TorchLearner
    torch.set_num_threads(1)
    learner = TorchLearner(PolicyConfig(), OptimConfig(), 3, tmp_path / "commits")
    learner.start()  # writes commit 0
    task = DigitReversal(8)
    expected = learner.evaluate_greedy(task, task.prompts("heldout", range(uc2.HELDOUT)))
    curve = uc2.offline_curve(tmp_path, {"task.length": 8}, [])
    assert curve == [[0, 0.0, pytest.approx(expected, abs=1e-5)]]


def test_the_plan_pairs_every_seed_and_alternates_who_runs_first():
    main = [e for e in uc2.plan() if e["kind"] == "main"]
    assert len(main) == 2 * len(uc2.SEEDS) and len(uc2.SEEDS) >= 15
    for k, seed in enumerate(uc2.SEEDS):
        first, second = main[2 * k], main[2 * k + 1]
        assert {first["arm"], second["arm"]} == {"async", "sync"}
        assert first["seed"] == second["seed"] == seed
        assert first["sets"]["protocol.seed"] == seed
        assert first["arm"] == ("sync" if seed % 2 else "async")
        assert first["sets"]["protocol.eval_every"] == 0  # evaluated offline only
    assert not set(uc2.PILOT_SEEDS) & set(uc2.SEEDS)
    assert all(e["sets"]["learner.keep_commits"] >= 1000 for e in main)


def test_every_planned_setting_is_a_valid_configuration(monkeypatch):
    import json

    from invar.runtime.config import load_config
    monkeypatch.setattr(uc2, "tuned", lambda summary: {"sync": "colocated-2", "async": "pinned"})
    stages = [uc2.pilot_plan(s) for s in ("tune", "levers", "sizing")]
    for entry in uc2.plan() + [e for stage in stages for e in stage]:
        overrides = [f"{k}={json.dumps(v)}" for k, v in entry["sets"].items()]
        load_config(None, overrides)  # refuses an unknown key or impossible combination


def test_size_budget_by_hand():
    sizing = [{"time": t, "reached": e} for t, e in ((10.0, True), (14.0, True), (16.0, True),
                                                      (60.0, False))]
    got = uc2.size_budget(sizing)
    # Median 15 s (the censored run counts as longest) -> 3 x 15 = 45 s.
    assert got["budget"] == 45 and got["reached_within"] == 3
    restricted = [10.0, 14.0, 16.0, 45.0]
    assert got["restricted_mean"] == pytest.approx(sum(restricted) / 4)
    import statistics
    sd = statistics.stdev(restricted) * math.sqrt(2)
    assert got["sd_difference"] == pytest.approx(sd)
    assert got["detectable_difference"] == pytest.approx(uc2.detectable_difference(sd, 15))


def _fake_result(spec, root, updates, other_cpu=0.0):
    return uc2.async_runs.Result(spec, -2, 10.0, {}, updates, [], 5.0, None, None, other_cpu,
                                 (1.0, 1.0, 1.0), (1.1, 1.0, 1.0), True, 512)


def test_execute_records_a_run_with_its_offline_curve(tmp_path, monkeypatch):
    """The runner's record, the process replaced: commits 0..2 on disk (no training: commit
    writes the weights as they are), three update rows, one row past the commits."""
    import torch

    from invar.runtime.policy_config import PolicyConfig
    from invar.runtime.torch_learner import OptimConfig, TorchLearner
    torch.set_num_threads(1)
    rows = [{"update": u, "wall": 1.0 + u, "reward": 0.1, "learner_seconds": 0.2,
             "rollout_seconds": 0.1, "rollout_replies": 512, "extra": 1} for u in range(6)]

    def fake_run(spec, root, base, total, window_start):
        learner = TorchLearner(PolicyConfig(), OptimConfig(), 3, root / spec.name / "commits",
                               keep_commits=spec.sets["learner.keep_commits"])
        learner.start()
        for version in (1, 2, 3, 4, 5, 6, 7):  # version 7: after the last row recorded
            learner.commit(version)
        return _fake_result(spec, root, rows, other_cpu=2.0)

    monkeypatch.setattr(uc2.async_runs, "run", fake_run)
    entry = {**next(e for e in uc2.plan() if e["id"] == "sync.seed1"), "attempt": 1}
    record = uc2.execute(entry, tmp_path)
    assert [p[0] for p in record["curve"]] == list(range(7))
    assert [p[1] for p in record["curve"]] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert len({p[2] for p in record["curve"]}) == 1  # the same weights throughout
    assert record["other_cores"] == pytest.approx(0.2)
    assert record["steady_updates_per_second"] == pytest.approx(1.0)
    assert record["R"] == pytest.approx(0.1) and record["T"] == pytest.approx(0.2)
    assert record["commit"] and "dirty" in record and "extra" not in record["updates"][0]
    assert not (tmp_path / "sync.seed1.a1" / "commits").exists()


def test_run_plan_reruns_disturbed_and_failed_attempts(tmp_path, monkeypatch):
    others = iter([0.9, 0.1, 0.8, 0.7, 0.6, 0.5, 0.4, 0.0])
    made = []

    def fake_execute(entry, root):
        made.append(entry["id"])
        if entry["id"] == "b" and entry["attempt"] == 1:
            return {"id": "b", "attempt": 1, "failed": True, "error": "boom"}
        return {"id": entry["id"], "attempt": entry["attempt"], "other_cores": next(others),
                "process_wall": 1.0, "updates": [{"update": 0, "wall": 1.0}],
                "load_after": [1.0]}

    monkeypatch.setattr(uc2, "execute", fake_execute)
    monkeypatch.setattr(uc2, "wait_for_quiet", lambda console, deadline: (0.0, 0.0))
    path = tmp_path / "runs.jsonl"
    entries = [{"id": "a", "budget": 5.0}, {"id": "b", "budget": 5.0},
               {"id": "c", "budget": 5.0}]
    uc2.run_plan(entries, path, "", True, _Quiet())
    # a: disturbed, then clean; b: failed, then disturbed twice (3 attempts: no more);
    # c: disturbed three times (0.6, 0.5, 0.4): the least disturbed is used.
    assert made == ["a", "a", "b", "b", "b", "c", "c", "c"]
    recorded = uc2.load_attempts(path)
    assert [r["attempt"] for r in recorded["a"]] == [1, 2]
    assert len(recorded["b"]) == 3 and recorded["b"][0]["failed"]
    assert uc2.chosen_attempt(recorded["b"])["other_cores"] == 0.7
    assert uc2.chosen_attempt(recorded["c"])["other_cores"] == 0.4


def test_tuning_picks_each_arm_s_fastest_candidate():
    summary = {"tune": {"pinned S=0": {"median": 2.0}, "colocated-2 S=0": {"median": 2.4},
                        "colocated-1 S=0": {"median": 1.0}, "pinned S=1": {"median": 3.0},
                        "colocated-1 S=1": {"median": 2.9}}}
    assert uc2.tuned(summary) == {"sync": "colocated-2", "async": "pinned"}
    with pytest.raises(ValueError):
        uc2.tuned({"tune": {}})


def test_the_pilot_summary_of_made_up_pilot_runs():
    attempts = {}
    for entry in uc2.pilot_plan("tune") + uc2.pilot_plan("levers"):
        attempts[entry["id"]] = [{**entry, "other_cores": 0.1, "R": 0.1, "T": 0.2,
                                  "steady_updates_per_second": 2.0 + entry["budget"] / 100}]
    for seed, reach in zip(uc2.PILOT_SEEDS, (10.0, 14.0, 16.0, None)):
        run = _run("sync", seed, reach, 2.0)
        attempts[f"pilot-sizing.seed{seed}"] = [{**run, "stage": "sizing", "budget": 60.0,
                                                 "kind": "pilot"}]
    summary = uc2.pilot_summary(attempts)
    assert summary["budget"]["budget"] == 45 and summary["budget"]["reached_within"] == 3
    text = uc2.pilot_markdown(summary)
    assert "| pinned S=0 | 2.12 |" in text and "| k128 |" in text


# -- what the README says from the study -------------------------------------------------------


def _readme_section() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## When to use asynchronous training", 1)[1].split("\n## ", 1)[0]
    return " ".join(section.split())


def test_the_readme_s_verdict_is_the_recorded_study():
    import json
    result = json.loads((ROOT / "reports" / "use-contract" / "results-2.json").read_text())
    c = result["comparison"]
    section = _readme_section()
    assert result["recorded"] == result["planned"] and not result["missing"]
    rmst, ratio, diff, speed = (c[k] for k in ("rmst", "rmst_ratio", "reward_difference",
                                               "throughput_ratio"))
    efficiency = c["efficiency"]
    sweep = sorted(result["sweep"].values(), key=lambda p: p["R_over_T"])
    shares = [p["speedup"] / p["ideal"] for p in sweep]
    for claim in (
        f"{len(c['seeds'])} seeds per arm, a {uc2.BUDGET:.0f} s budget",
        f"| S = 1 vs S = 0, both pinned | {c['pairs']} | {rmst[0]:.1f} s, {rmst[1]:.1f} s | "
        f"{uc2._ci(tuple(ratio))} | {uc2._ci(tuple(diff), '+.3f').replace('+-', '-')} | "
        f"{uc2._ci(tuple(speed))} | {c['decision']} |",
        f"sooner in {c['async_sooner']} of {c['pairs']} seed pairs",
        f"S = 1 made {speed[0]:.2f}× the updates per second",
        f"(restricted means {efficiency['async']['restricted_mean_updates']:.1f} against "
        f"{efficiency['sync']['restricted_mean_updates']:.1f})",
        f"went from {sweep[0]['speedup']:.2f} at R/T {sweep[0]['R_over_T']:.2f} to "
        f"{sweep[-1]['speedup']:.2f} at R/T {sweep[-1]['R_over_T']:.2f}",
        f"reached {min(shares):.2f}–{max(shares):.2f} of it over R/T "
        f"{sweep[0]['R_over_T']:.2f}–{sweep[-1]['R_over_T']:.2f}",
    ):
        assert claim in section, claim
    # Said only of what the study covered: the default placement was no arm.
    assert "was not an arm of either study" in section
