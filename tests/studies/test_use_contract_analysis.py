"""The use-contract study's analysis (studies/use_contract.py) and what is said from it: the
committed RESULTS.md is what the code makes of runs.jsonl, and the README's figures are the
recorded runs'. Nothing here runs training."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_TOOL = ROOT / "studies" / "use_contract.py"
_spec = importlib.util.spec_from_file_location("studies_use_contract", _TOOL)
assert _spec is not None and _spec.loader is not None
uc = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = uc  # dataclasses look their module up while being built
_spec.loader.exec_module(uc)


@pytest.fixture(scope="module")
def study():
    records = uc.load_records()
    result = uc.analyse(records)
    return records, result, uc.reanalysis(records, result)


def _flat(text: str) -> str:
    return " ".join(text.split())


def _readme_section() -> str:
    readme = (ROOT / "README.md").read_text()
    return _flat(readme.split("## When to use asynchronous training", 1)[1].split("\n## ", 1)[0])


def test_the_readme_s_figures_are_the_recorded_runs(study):
    records, result, again = study
    section = _readme_section()
    comparisons = {(c["x"], c["y"]): c for c in result["comparisons"]}
    for pair in (("A-pin-S1", "A-pin-S0"), ("A-pin-S1", "A-col-S0"), ("B-pin-S1", "B-pin-S0")):
        c = comparisons[pair]
        assert (f"| {uc._ci(c['time_ratio'])} | {uc._ci(c['final_diff'], '+.2f')} | "
                f"{c['decision']} |") in section, pair
    p1 = comparisons[("A-pin-S1", "A-pin-S0")]
    speed, cpu, share, spanned = (again[key] for key in ("pinned_speedup", "pinned_cpu_ratio",
                                                         "share_of_ideal", "R_over_T"))
    for claim in (
        f"It ran {len(uc.SEEDS)} seeds per arm",
        f"other jobs used ~{result['other_cores_median']:.1f} of its cores",
        f"with {len(uc.SEEDS)} seeds the interval of the median is the range of the "
        f"{len(uc.SEEDS)} pairs",
        f"only {again['main_runs_reached']} of the {again['main_runs']} runs reached 0.8",
        f"compared at a common {uc.COMMON_WALL:.0f} s, the first row's "
        f"{p1['final_diff'][0]:+.2f} is {again['final_diff_at_common']:+.2f}",
        f"S = 1 made more updates/s than S = 0 in {again['pinned_faster']} of "
        f"{again['pinned_repeats']} repeats of the R/T sweep (speed-up median {speed[0]:.2f}, "
        f"range {speed[1]:.2f}–{speed[2]:.2f}), at unchanged CPU per update (S = 1 ÷ S = 0: "
        f"median {cpu[0]:.2f}, range {cpu[1]:.2f}–{cpu[2]:.2f})",
        f"pinned S = 1 reached {share[1]:.2f}–{share[2]:.2f} of it",
        f"(r = {again['share_other_work_r']:.2f}), over R/T {spanned[1]:.2f}–{spanned[2]:.2f}",
    ):
        assert claim in section, claim


def test_the_readme_drops_the_claims_the_study_did_not_support():
    section = _readme_section()
    for claim in ("never cost final reward", "0.76", "0.3 and 3", "0.3–3", "Expect about"):
        assert claim not in section, claim
    assert "S = 1 with rollout and learner unpinned" in section
    assert "did not test that configuration" in section
    # ... which is `invar train`'s default, not any arm of the study.
    from invar.runtime.config import load_config
    default = load_config()
    assert default.protocol.max_staleness == 1
    assert default.rollout.cpus == default.learner.cpus == ()
    assert "with one learner thread instead of the default two" in section
    assert (default.rollout.threads, default.learner.threads) == (1, 2)
    unpinned_async = [c for c in uc.CELLS if c.sets()["rollout.cpus"] == []
                      and c.sets()["protocol.max_staleness"] == 1]
    assert [(c.name, c.sets()["rollout.threads"], c.sets()["learner.threads"])
            for c in unpinned_async] == [("A-col-S1", 1, 1)]
    assert [y for _, x, y, _ in uc.COMPARISONS if x == "A-col-S1"] == ["A-col-S0"]


def _committed_utc(commit: str) -> str | None:
    done = subprocess.run(["git", "log", "-1", "--format=%cd", "--date=format-local:%Y-%m-%d "
                           "%H:%M:%S", commit], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "TZ": "UTC"})
    return done.stdout.strip() if done.returncode == 0 else None


@pytest.mark.parametrize("commit, utc, what", uc.STUDY_HISTORY,
                         ids=[commit for commit, _, _ in uc.STUDY_HISTORY])
def test_the_addendum_s_commit_times_are_the_history_s(commit, utc, what):
    found = _committed_utc(commit)
    if found is None:
        pytest.skip(f"{commit} is not in this checkout's history (a shallow clone)")
    assert found == utc


# ---------------------------------------------------------------------------------------------
# The analysis functions against hand-computed cases


def test_five_pairs_put_more_than_2_5_percent_of_the_bootstrap_on_each_extreme():
    # The median of 5 draws is the smallest value when at least 3 draws hit it (p = 1/5):
    # C(5,3)(1/5)^3(4/5)^2 + C(5,4)(1/5)^4(4/5) + (1/5)^5 = 0.0512 + 0.0064 + 0.00032.
    assert uc.median_at_extreme(5) == pytest.approx(0.05792)
    assert uc.median_at_extreme(15) < 0.025  # with 15 pairs the interval can be narrower


@pytest.mark.parametrize("values", [
    [0.51, 1.43, 1.0, 0.9, 1.2],
    [3.0, -1.0, 2.0, 0.0, 1.0],
    [0.5, 0.6, math.inf, math.inf, math.inf],
    [0.7, 0.7, 0.8, 0.9, 0.9],
    [1e-9, 1.0, 2.0, 5.0, 1e9],
])
def test_the_n5_percentile_bootstrap_interval_of_the_median_is_exactly_min_to_max(values):
    median, low, high = uc.bootstrap_median(values)
    assert (median, low, high) == (sorted(values)[2], min(values), max(values))


def test_the_bootstrap_s_resamples_hit_the_extremes_as_often_as_the_binomial_says():
    # bootstrap_median draws its resample indices from default_rng(0) whatever the values:
    # the share of resamples whose median is the smallest value is the same for every input.
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    indices = rng.integers(0, 5, size=(uc.BOOTSTRAP, 5))
    share = float(np.mean(np.sum(indices == 0, axis=1) >= 3))
    assert share == pytest.approx(uc.median_at_extreme(5), abs=0.01)
    assert share > 0.025


def test_fifteen_pairs_give_an_interval_inside_the_range():
    values = [float(v) for v in range(15)]
    median, low, high = uc.bootstrap_median(values)
    assert median == 7.0 and 0.0 < low < median < high < 14.0


def test_one_pair_where_neither_run_reached_the_threshold_rules_out_use_async():
    # Four pairs where async was twice as fast, one pair both censored (ratio 1): the interval
    # is [0.5, 1.0], whose upper end is not below 1.
    ratios = [0.5, 0.5, 0.5, 0.5, uc.time_ratio(None, None, budget=30.0)]
    interval = uc.bootstrap_median(ratios)
    assert interval == (0.5, 0.5, 1.0)
    assert uc.decide(interval, (0.1, 0.0, 0.2)) == "inconclusive"


@pytest.mark.parametrize("x, y, expected", [
    (10.0, 20.0, 0.5),        # both reached: the plain ratio
    (None, 20.0, math.inf),   # only the baseline reached it: async lost
    (15.0, None, 0.5),        # only async reached it: t_X / W, a bound favouring the baseline
    (None, None, 1.0),        # neither reached it
])
def test_censored_times_follow_the_registered_rule(x, y, expected):
    assert uc.time_ratio(x, y, budget=30.0) == expected


@pytest.mark.parametrize("ratio, diff, verdict", [
    ((0.8, 0.7, 0.99), (0.0, -0.05, 0.1), "use async"),
    ((0.8, 0.7, 0.99), (0.0, -0.0501, 0.1), "inconclusive"),   # may cost more than δ
    ((0.8, 0.7, 1.0), (0.0, 0.0, 0.1), "inconclusive"),        # upper end not below 1
    ((1.2, 1.01, 1.5), (0.0, 0.0, 0.1), "do not use"),         # slower in every resample
    ((0.8, 0.7, 0.9), (-0.1, -0.2, -0.06), "do not use"),      # faster, but costs reward
    ((1.0, 1.0, 1.2), (0.0, 0.0, 0.1), "inconclusive"),        # lower end not above 1
])
def test_the_decision_rule_s_boundaries(ratio, diff, verdict):
    assert uc.decide(ratio, diff) == verdict


def figures(time: float | None, final: float, updates_to: int | None = None,
            other: float = 0.1, ups: float = 1.0, cpu: float = 0.5) -> dict[str, object]:
    return {"time_to_threshold": time, "final_heldout": final,
            "updates_to_threshold": updates_to, "other_cores": other, "updates_per_second": ups,
            "samples_per_second": ups * 512, "cpu_per_update": cpu}


def test_comparisons_pair_runs_by_seed_and_leave_out_unpaired_seeds():
    figs = {
        ("X", 1): figures(10.0, 0.9, 20, ups=2.0), ("Y", 1): figures(20.0, 0.5, 20),
        ("X", 2): figures(None, 0.3), ("Y", 2): figures(12.0, 0.8, 15),
        ("X", 3): figures(6.0, 1.0, 10, cpu=1.0), ("Y", 3): figures(None, 0.2),
        ("X", 4): figures(8.0, 0.9),  # Y of seed 4 never ran: no pair
        ("X", 5): figures(None, 0.1), ("Y", 5): figures(None, 0.4),
    }
    got = uc.compare(figs, "X", "Y", budget=30.0)
    assert got["seeds"] == [1, 2, 3, 5]
    assert got["time_ratios"] == [0.5, math.inf, 0.2, 1.0]
    assert got["final_diffs"] == pytest.approx([0.4, -0.5, 0.8, -0.3])
    # 4 pairs: the median is the mean of the middle two.
    assert got["time_ratio"][0] == pytest.approx(0.75)
    assert got["final_diff"][0] == pytest.approx(0.05)
    assert got["updates_per_second_ratio"][0] == pytest.approx(1.0)
    assert got["cpu_per_update_ratio"][0] == pytest.approx(1.0)
    assert got["updates_pairs"] == 1 and got["updates_ratio"] == (1.0, 1.0, 1.0)


def test_the_sensitivity_analysis_drops_a_pair_when_either_run_was_disturbed():
    figs = {("X", 1): figures(10.0, 0.9, other=0.6), ("Y", 1): figures(20.0, 0.5),
            ("X", 2): figures(10.0, 0.9), ("Y", 2): figures(20.0, 0.5, other=0.51),
            ("X", 3): figures(10.0, 0.9, other=0.5), ("Y", 3): figures(40.0, 0.5, other=0.5)}
    assert uc.compare(figs, "X", "Y", 30.0, drop_disturbed=True)["seeds"] == [3]
    figs = {k: v for k, v in figs.items() if k[1] != 3}
    assert uc.compare(figs, "X", "Y", 30.0, drop_disturbed=True) is None


def main_record(evaluations: list[tuple[int, float, float]], walls: list[float],
                budget: float = 30.0) -> dict[str, object]:
    return {"budget": budget, "threshold": 0.8, "samples_per_batch": 512, "cpu_total": 12.0,
            "other_cores": 0.2, "load_after": [1.0, 1.0, 1.0],
            "evaluations": [{"version": v, "wall": w, "heldout_reward": r}
                            for v, w, r in evaluations],
            "updates": [{"update": i, "wall": w, "learner_seconds": 0.3, "rollout_seconds": 0.2,
                         "rollout_replies": 512} for i, w in enumerate(walls)]}


def test_a_run_s_figures_count_only_evaluations_within_its_budget():
    record = main_record([(0, 0.1, 0.1), (5, 10.0, 0.85), (10, 29.0, 0.7), (15, 31.0, 0.95)],
                         walls=[5.0, 15.0, 25.0, 30.5])
    got = uc.run_figures(record)
    assert (got["time_to_threshold"], got["updates_to_threshold"]) == (10.0, 5)
    assert got["final_heldout"] == 0.7  # the last evaluation at or before 30 s, not the best
    assert got["updates_per_second"] == pytest.approx(4 / 30.5)
    assert got["cpu_per_update"] == pytest.approx(3.0)
    assert (got["R"], got["T"]) == (pytest.approx(0.2), pytest.approx(0.3))
    late = main_record([(0, 0.1, 0.1), (5, 31.0, 0.95)], walls=[5.0, 31.0])
    assert uc.run_figures(late)["time_to_threshold"] is None  # reached only past the budget


def test_the_reward_known_at_a_wall_time_is_the_last_evaluation_by_then():
    record = main_record([(0, 0.1, 0.1), (5, 10.0, 0.85), (10, 29.0, 0.7)], walls=[30.0])
    assert uc.heldout_at(record, 0.05) is None
    assert uc.heldout_at(record, 10.0) == 0.85
    assert uc.heldout_at(record, 25.0) == 0.85
    assert uc.heldout_at(record, 30.0) == 0.7


def sweep_run(config: str, repeat: int, window: tuple[int, int], period: float,
              other: float = 0.1) -> dict[str, object]:
    return {"id": f"sweep-k1-{config}.r{repeat}", "kind": "sweep", "point": "k1",
            "config": config, "repeat": repeat, "other_cores": other,
            "steady": {"window": list(window), "period": period, "R": 0.2, "T": 0.4,
                       "ideal": 1.5, "cpu_per_update": 0.4}}


def test_a_sweep_run_stopped_before_its_steady_window_gives_no_speed_up():
    # Repeat 2's colocated run stopped by its budget at update 3: amendment 1's window (update
    # 5 to the last) is empty, and the figures the runner kept span start-up (updates 0-3).
    runs = [sweep_run("pin-S0", 1, (5, 24), 0.5), sweep_run("pin-S1", 1, (5, 24), 0.4),
            sweep_run("col-S0", 1, (5, 9), 2.0),
            sweep_run("pin-S0", 2, (5, 24), 0.6), sweep_run("pin-S1", 2, (5, 24), 0.4),
            sweep_run("col-S0", 2, (0, 3), 10.0, other=0.9)]
    records = {r["id"]: r for r in runs}
    assert uc.steady_window(records["sweep-k1-col-S0.r2"]) is None
    assert uc.steady_window(None) is None
    point = uc.sweep_analysis(records)["points"]["k1"]
    assert [r["speedup_pinned"] for r in point["repeats"]] == pytest.approx([1.25, 1.5])
    assert [r["speedup_colocated"] for r in point["repeats"]] == [pytest.approx(5.0), None]
    assert point["speedup_colocated"] == pytest.approx(5.0)
    assert point["range_colocated"] == (pytest.approx(5.0), pytest.approx(5.0))
    assert (len(point["repeats"]), point["repeats_colocated"]) == (2, 1)
    assert point["repeats"][1]["other_cores"] == 0.1  # the dropped run's load does not count
    assert point["share_of_ideal"] == pytest.approx((1.25 / 1.5 + 1.5 / 1.5) / 2)


def test_report_only_rewrites_the_committed_report_into_the_folder_given_and_runs_nothing(
        tmp_path):
    def run_dirs() -> list[str]:
        return sorted(p.name for p in uc.RUNS.iterdir()) if uc.RUNS.exists() else []
    recorded, runs = uc.RECORDS.read_bytes(), run_dirs()
    committed = uc.OUT / "RESULTS.md"
    before = committed.stat().st_mtime_ns
    done = subprocess.run([sys.executable, str(_TOOL), "--report-only", "--out",
                           str(tmp_path / "report")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    written = sorted(p.name for p in (tmp_path / "report").iterdir())
    assert written == ["RESULTS.md", "crossover.png", "results.json", "reward_vs_time.png",
                       "throughput_cost.png", "time_to_quality.png"]
    assert uc.RECORDS.read_bytes() == recorded and committed.stat().st_mtime_ns == before
    assert run_dirs() == runs
    # The committed report is what the analysis makes of the recorded runs; only its first
    # paragraph differs (the command, time and commit it was written with).
    made = (tmp_path / "report" / "RESULTS.md").read_text().splitlines()
    assert f"--report-only --out {tmp_path / 'report'}`" in made[2]
    kept = committed.read_text().splitlines()
    assert made[:2] + made[3:] == kept[:2] + kept[3:]
