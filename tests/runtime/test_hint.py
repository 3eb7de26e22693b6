"""The R/T hint: the bound (R + T) / max(R, T), R and T from metrics rows, and the one line
`invar train` prints once after its first updates."""

from __future__ import annotations

import math
import subprocess

import pytest

from invar.runtime.hint import HINT_AFTER, PhaseTimes, async_gain, hint_line, measure


def test_the_gain_is_two_when_the_phases_balance_and_one_when_one_vanishes():
    assert async_gain(0.2, 0.2) == 2.0
    assert async_gain(0.1, 0.3) == pytest.approx(4 / 3)
    assert async_gain(0.3, 0.1) == pytest.approx(4 / 3)
    assert async_gain(0.0, 0.5) == 1.0


@pytest.mark.parametrize("rollout, learning", [(-0.1, 0.2), (math.nan, 0.2), (0.2, math.inf),
                                               (0.0, 0.0)])
def test_impossible_times_are_refused(rollout, learning):
    with pytest.raises(ValueError):
        async_gain(rollout, learning)


def row(learner: float, rollout: float, generated: int, replies: int | None = None
        ) -> dict[str, float]:
    return {"learner_seconds": learner, "rollout_seconds": rollout,
            "rollout_generated": generated,
            "rollout_replies": generated if replies is None else replies}


def test_R_is_per_batch_generated_and_T_per_update_after_the_skipped_first_row():
    # First row: start-up, wildly slow, must not count. Then 4 rows; 16 samples per batch;
    # samples of 3 batches generated over those rows (S >= 1 shifts them between rows).
    rows = [row(9.0, 9.0, 16), row(0.2, 0.3, 16), row(0.2, 0.0, 0), row(0.4, 0.3, 16),
            row(0.2, 0.3, 16)]
    times = measure(rows, samples_per_batch=16)
    assert times == PhaseTimes(rollout=pytest.approx(0.9 / 3), learning=pytest.approx(0.25),
                               updates=4)
    two_workers = measure(rows, samples_per_batch=16, workers=2)
    assert two_workers.rollout == pytest.approx(0.15)


def test_R_is_the_time_generation_took_whatever_re_sends_were_answered_from_the_cache():
    """The real model's example with a 20 s timer: ~120 s of generation per batch of 64,
    each request answered about five times (issue 40): R stays 120 s, not 24."""
    rows = [row(60.0, 120.0, 64, replies=64 * 5) for _ in range(6)]
    assert measure(rows, samples_per_batch=64).rollout == pytest.approx(120.0)


def test_rows_of_runs_before_the_generated_count_take_a_batch_each():
    rows = [{"learner_seconds": 0.2, "rollout_seconds": 0.3, "rollout_replies": 80}] * 3
    assert measure(rows, samples_per_batch=16).rollout == pytest.approx(0.3)


def test_rows_without_timing_give_no_measurement():
    assert measure([{"update": 0}, {"update": 1}], samples_per_batch=8) is None
    assert measure([row(0.1, 0.1, 8)], samples_per_batch=8) is None  # only the skipped row


def test_rows_without_generation_after_the_skipped_one_give_no_measurement():
    """Two updates, S = 1: both batches generated before the first row."""
    assert measure([row(260.0, 278.0, 128), row(111.0, 0.0, 0)], samples_per_batch=64) is None


def test_the_line_names_R_T_and_the_gain_and_says_when_it_was_measured_overlapped():
    times = PhaseTimes(rollout=0.12, learning=0.21, updates=5)
    sync = hint_line(times, staleness=0)
    assert sync.startswith("hint: rollout R 0.120 s/batch, learning T 0.210 s/update")
    assert "1.57x" in sync and "\n" not in sync
    overlapped = hint_line(times, staleness=1)
    assert "measured while overlapping (S = 1)" in overlapped and "1.57x" in overlapped


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_the_line_calls_the_gain_an_upper_bound_on_updates_per_second_before_staleness(
        staleness):
    # The first use-contract study measured S = 1's updates/s, not its time to a reward: the
    # line may promise neither a speed-up to quality nor a share of the bound.
    line = hint_line(PhaseTimes(rollout=0.12, learning=0.21, updates=5), staleness)
    assert "updates/s" in line and "upper bound" in line and "not a prediction" in line
    assert "cost of staleness in extra updates" in line
    assert "could speed" not in line and "0.76" not in line


def test_the_metrics_log_prints_the_hint_once(tmp_path, rt, capsys):
    from invar.runtime.metrics import MetricsLog
    log = MetricsLog(tmp_path, rt.tiny_config(tmp_path), tensorboard=False)
    samples = 4 * 4  # tiny: 4 prompts x 4 samples
    for update in range(HINT_AFTER + 3):
        log.update(update, 0.1, 0, {}, 0.5, 0, 0,
                   timing={"learner_seconds": 0.2, "rollout_seconds": 0.1,
                           "core_seconds": 0.01, "rollout_replies": samples * 3,
                           "rollout_generated": samples})
    log.close()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hint:")]
    assert len(lines) == 1
    assert "R 0.100 s/batch" in lines[0] and "T 0.200 s/update" in lines[0]
    assert "1.50x" in lines[0]


def test_invar_train_prints_the_hint_after_its_first_updates(tmp_path, rt):
    overrides = rt.tiny_overrides(tmp_path, f"protocol.total_updates={HINT_AFTER + 1}",
                                  "protocol.max_staleness=0", "protocol.max_inflight_batches=1")
    command = rt.cli("train", *(arg for item in overrides for arg in ("--set", item)))
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    hints = [line for line in done.stderr.splitlines() if line.startswith("hint:")]
    assert len(hints) == 1, done.stderr
    assert "can raise updates/s by at most (R+T)/max(R,T)" in hints[0]
    assert f"done: {HINT_AFTER + 1} updates in" in done.stdout
