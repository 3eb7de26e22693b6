"""What a run leaves and prints: no stale weights in store/, byte-identical commits for
identical runs, `--serial` like any run, a reward plot whose legend covers no curve, and
messages that are not wrapped at 80 columns when piped."""

from __future__ import annotations

import json
import subprocess
import sys

from invar.model.core import run_complete


def test_identical_learners_write_byte_identical_commits(tmp_path, rt):
    import torch

    from invar.runtime.cli import make_learner
    files = []
    for name, noise in (("a", 1), ("b", 7)):
        config = rt.tiny_config(tmp_path / name)
        torch.rand(noise)  # whatever the process drew before, the commits do not change
        with rt.torch_globals_kept():
            learner = make_learner(config)
            learner.start()
        files.append((tmp_path / name / "commits").glob("commit-*").__next__().read_bytes())
    assert files[0] == files[1]


def test_serial_runs_like_any_run(tmp_path, rt):
    overrides = rt.tiny_overrides(tmp_path)
    command = rt.cli("train", "--serial", *(arg for item in overrides for arg in ("--set", item)))
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "done: 3 updates in" in done.stdout
    for name in ("journal.jsonl", "summary.json", "report.md", "metrics.csv", "config.json"):
        assert (tmp_path / name).exists(), name
    from invar.runtime import journal
    _, state, _ = journal.restore(tmp_path / "journal.jsonl")
    assert run_complete(state)
    assert rt.summary(tmp_path)["updates"] == 3
    # The reversal task has no end token: no response-length figures (constant, all "cut").
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    updates = [row for row in rows if row["kind"] == "update"]
    assert len(updates) == 3 and "loss" in updates[0]
    assert not [row for row in updates if "response_truncated_share" in row
                or "response_length_mean" in row]
    checked = subprocess.run([sys.executable, "-m", "checker.cli", "--trace",
                              str(tmp_path / "journal.jsonl")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_store_keeps_only_what_is_retained(tmp_path, rt):
    rt.run_driver(rt.tiny_config(tmp_path, "protocol.total_updates=4"))
    left = sorted(p.name for p in (tmp_path / "store").iterdir())
    assert left == ["weights-000004.bin", "weights-000004.digest"]


def test_the_legend_covers_no_curve():
    from invar.runtime.plots import Curves, reward_figure
    updates = [{"update": u, "reward": 0.05 + 0.001 * u, "wall": 0.5 * u} for u in range(40)]
    evaluations = [{"version": v, "heldout_reward": 0.1, "wall": 0.5 * v} for v in (0, 20, 40)]
    for against in ("update", "wall"):
        figure, axis = reward_figure([Curves("run", updates, evaluations, [7.0])], against, 0.8)
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        legend = figure.legends[0].get_window_extent(renderer)
        assert not legend.overlaps(axis.get_window_extent(renderer))
        assert len(figure.legends[0].get_texts()) == 4  # train, held-out, resumed, threshold


def test_piped_messages_are_not_wrapped(tmp_path):
    from helpers.journals import small_config, write_journal
    path = write_journal(tmp_path / ("a-long-directory-name-" * 3) / "journal.jsonl"
                         if (tmp_path / ("a-long-directory-name-" * 3)).mkdir() is None
                         else tmp_path, small_config())
    checked = subprocess.run([sys.executable, "-m", "checker.cli", "--trace", str(path),
                              "--no-rescore"], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout
    lines = checked.stdout.splitlines()
    assert len(lines) == 1 and "every recorded digest agrees" in lines[0], lines


def test_a_run_shows_the_responses_behind_its_rewards(tmp_path, rt):
    """report.md holds, per evaluated version, the greedy responses to the same held-out
    prompts, and per update sampled training responses with their rewards, each reward the
    task's score of the response shown (what a reader checks before trusting a curve)."""
    import json

    from invar.runtime.responses import SHOWN_HELDOUT, SHOWN_TRAINING
    from invar.runtime.tasks import build_task
    config = rt.tiny_config(tmp_path, "protocol.eval_every=1")
    rt.run_driver(config)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    shown = [row for row in rows if row["kind"] == "responses"]
    heldout = {row["step"]: row["rows"] for row in shown if row["split"] == "heldout"}
    training = {row["step"]: row["rows"] for row in shown if row["split"] == "train"}
    updates = config.protocol.total_updates
    assert sorted(heldout) == list(range(updates + 1))
    assert sorted(training) == list(range(updates))
    task = build_task(config.task)
    prompts = [row["prompt"] for row in heldout[0]]
    assert len(prompts) == SHOWN_HELDOUT
    for version, table in heldout.items():
        assert [row["prompt"] for row in table] == prompts  # the same questions every version
        for index, row in enumerate(table):
            assert row["answer"] == task.answer_text("heldout", index)
            response = [int(t) for t in row["response"].split()]
            assert row["reward"] == task.score("heldout", index, response), (version, row)
    assert all(len(table) == SHOWN_TRAINING for table in training.values())
    report = (tmp_path / "report.md").read_text()
    assert "## Responses" in report and f"Held-out, version {updates}:" in report
    assert f"`{heldout[updates][0]['response']}`" in report
