"""`invar report`: figures of run directories as `invar train` leaves them, the files it writes,
and one-line refusals (exit 2) naming the argument at fault."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from invar.runtime.report import report


def make_run(directory: Path, rt, *, staleness: int = 0, evaluations=((0, 0.1, 0.5),
             (5, 0.5, 5.0), (10, 0.85, 10.0), (15, 0.7, 15.0)), updates: int = 16,
             period: float = 1.0, finished: bool = True, pinned: bool = False,
             replies_per_sample: int = 1) -> Path:
    """A run directory with the files `invar train` writes: config.json, metrics.jsonl (one
    update row per `period` seconds with the driver's timing, evaluations (version, reward,
    wall)) and, when finished, summary.json. 4 prompts x 4 samples per batch (tiny), each
    answered `replies_per_sample` times (re-sent requests answered again from the cache)."""
    from invar.runtime.config import to_dict
    extra = [f"protocol.max_staleness={staleness}",
             f"protocol.max_inflight_batches={staleness + 1}"]
    if pinned:
        extra += ["rollout.cpus=[0]", "learner.cpus=[0]"]
    config = rt.tiny_config(directory, *extra)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(to_dict(config)))
    rows = [{"kind": "update", "update": u, "reward": 0.1, "staleness": 0,
             "wall": period * (u + 1), "learner_seconds": 0.3, "rollout_seconds": 0.2,
             "core_seconds": 0.05, "rollout_replies": 16 * replies_per_sample,
             "rollout_generated": 16} for u in range(updates)]
    rows += [{"kind": "evaluation", "version": v, "heldout_reward": r, "wall": w}
             for v, r, w in evaluations]
    rows.sort(key=lambda r: r["wall"])
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        (directory / "summary.json").write_text(json.dumps(
            {"updates": updates, "wall_seconds": period * updates + 0.5,
             "core_and_driver_share": 0.04}))
    return directory


def test_quality_throughput_and_cost_come_from_the_rows(tmp_path, rt):
    run = make_run(tmp_path / "a", rt)
    stopped = make_run(tmp_path / "b", rt, staleness=1, period=0.5, finished=False, pinned=True,
                       evaluations=((0, 0.1, 0.3), (5, 0.6, 2.6)))
    a, b = report([str(run), str(stopped)], tmp_path / "out", threshold=0.8)
    assert (a.threshold_seconds, a.threshold_updates) == (10.0, 10)
    assert a.final_heldout == 0.7 and a.best_heldout == 0.85
    assert a.finished and a.wall_seconds == 16.5  # the summary's wall, not the last row's
    assert a.updates_per_second == pytest.approx(16 / 16.5)
    assert a.samples_per_second == pytest.approx(16 * 16 / 16.5)
    assert a.rollout_seconds == pytest.approx(0.2) and a.learning_seconds == pytest.approx(0.3)
    assert a.overlap_bound == pytest.approx(0.5 / 0.3)
    assert a.busy_seconds_per_update == pytest.approx(0.55)
    assert a.core_and_driver_share == 0.04 and a.placement == "unpinned"
    assert b.threshold_seconds is None and b.threshold_updates is None
    assert not b.finished and b.wall_seconds == 8.0 and b.staleness == 1
    assert b.placement == "pinned"
    assert b.core_and_driver_share == pytest.approx(16 * 0.05 / 8.0)  # from the rows
    text = (tmp_path / "out" / "report.md").read_text()
    assert ("| a | reverse 4 digits | 0 | decoupled_ppo | unpinned | 16 | 0.700 | 0.850 | "
            "10.0 | 10 |" in text)
    assert "| b | reverse 4 digits | 1 | decoupled_ppo | pinned | 16 (stopped) |" in text
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [r["label"] for r in saved["runs"]] == ["a", "b"]
    for plot in ("reward_vs_updates.png", "reward_vs_time.png", "throughput.png",
                 "throughput_cost.png"):
        assert (tmp_path / "out" / plot).read_bytes().startswith(b"\x89PNG")


def test_R_is_the_time_generation_took_when_requests_were_answered_several_times(tmp_path, rt):
    (run,) = report([str(make_run(tmp_path / "a", rt, replies_per_sample=5))], tmp_path / "out",
                    threshold=0.8)
    assert run.rollout_seconds == pytest.approx(0.2)
    assert run.overlap_bound == pytest.approx(0.5 / 0.3)


def test_a_lower_threshold_is_reached_sooner(tmp_path, rt):
    (run,) = report([str(make_run(tmp_path / "a", rt))], tmp_path / "out", threshold=0.5)
    assert (run.threshold_seconds, run.threshold_updates) == (5.0, 5)


def test_runs_of_the_same_name_are_labelled_by_their_path(tmp_path, rt):
    one = make_run(tmp_path / "x" / "run", rt)
    two = make_run(tmp_path / "y" / "run", rt)
    runs = report([str(one), str(two)], tmp_path / "out", threshold=0.8)
    assert [r.label for r in runs] == [str(one), str(two)]


def test_a_torn_last_line_is_skipped_like_a_resumed_run_skips_it(tmp_path, rt):
    run = make_run(tmp_path / "a", rt)
    with open(run / "metrics.jsonl", "a") as stream:
        stream.write('{"kind": "update", "update": 16, "rew')
    (figures,) = report([str(run)], tmp_path / "out", threshold=0.8)
    assert figures.updates == 16


def refusal(tmp_path: Path, rt, *args: str) -> str:
    done = subprocess.run(rt.cli("report", *args), capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_bad_input_is_refused_in_one_line_naming_the_argument(tmp_path, rt):
    good = make_run(tmp_path / "good", rt)
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("x")
    broken = make_run(tmp_path / "broken", rt)
    (broken / "config.json").write_text("{not json")
    no_rows = make_run(tmp_path / "no-rows", rt)
    (no_rows / "metrics.jsonl").write_text("")
    cases = [
        ((str(tmp_path / "missing"),), "RUN_DIR", "does not exist"),
        ((str(tmp_path / "a-file"),), "RUN_DIR", "is not a directory"),
        ((str(tmp_path / "empty"),), "RUN_DIR", "has no metrics.jsonl"),
        ((str(broken),), "RUN_DIR", "config.json is not a configuration"),
        ((str(no_rows),), "RUN_DIR", "holds no update row"),
        ((str(good), "--threshold", "1.5"), "--threshold", "must be a reward in (0, 1]"),
        ((str(good), "--threshold", "nan"), "--threshold", "must be a reward in (0, 1]"),
        ((str(good), "--out", str(tmp_path / "a-file")), "--out", "is not a directory"),
        ((str(good), str(good)), "RUN_DIR", "given twice"),
    ]
    for args, argument, why in cases:
        line = refusal(tmp_path, rt, *args)
        assert line.startswith(f"invar: report refused: {argument}"), line
        assert why in line, line
    assert not list(tmp_path.glob("*report*"))  # nothing written on a refusal


def test_the_report_goes_next_to_the_runs_unless_told(tmp_path, rt):
    one = make_run(tmp_path / "runs" / "a", rt)
    two = make_run(tmp_path / "runs" / "b", rt)
    for args, where in (((str(one),), tmp_path / "runs" / "a-report"),
                        ((str(one), str(two)), tmp_path / "runs" / "report-a-vs-b")):
        done = subprocess.run(rt.cli("report", *args), capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().splitlines()[-1].startswith(
            f"report: {where}/report.md (+ report.json, reward_vs_time.png, ")
        text = (where / "report.md").read_text()
        for name in ("reward_vs_updates.png", "reward_vs_time.png", "throughput.png",
                     "throughput_cost.png"):
            assert f"]({name})" in text and (where / name).read_bytes().startswith(b"\x89PNG")


def test_invar_report_on_a_real_run(tmp_path, rt):
    rt.run_driver(rt.tiny_config(tmp_path / "run", "protocol.eval_every=1",
                                 "protocol.total_updates=3"))
    done = subprocess.run(rt.cli("report", str(tmp_path / "run"), "--out",
                                 str(tmp_path / "out"), "--threshold", "0.01"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| run | reverse 4 digits | 1 | decoupled_ppo | unpinned | 3 |" in done.stdout
    saved = json.loads((tmp_path / "out" / "report.json").read_text())["runs"][0]
    summary = rt.summary(tmp_path / "run")
    assert saved["finished"] and saved["updates"] == summary["updates"] == 3
    assert saved["wall_seconds"] == summary["wall_seconds"]
    assert saved["threshold_updates"] == 0  # version 0 already scores >= 0.01
    assert saved["learning_seconds"] > 0 and saved["rollout_seconds"] > 0


def test_the_throughput_cost_legend_hides_no_bar(tmp_path, rt):
    from invar.runtime.report import throughput_cost_figure
    runs = report([str(make_run(tmp_path / name, rt)) for name in ("a", "b", "c")],
                  tmp_path / "out", threshold=0.8)
    figure = throughput_cost_figure(runs)
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    legend = figure.legends[0].get_window_extent(renderer)
    bars = [patch for axis in figure.axes for patch in axis.patches]
    assert len(bars) == 9
    assert not [bar for bar in bars if legend.overlaps(bar.get_window_extent(renderer))]
