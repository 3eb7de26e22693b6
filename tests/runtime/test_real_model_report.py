"""benchmarks/real_model.py's report tabulates the runs of TRL's GRPOTrainer (the files
benchmarks/trl_peer.py writes) beside Invar's, and says which trainer made each row."""

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "real_model.py"


def _script():
    spec = importlib.util.spec_from_file_location("real_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_run(directory: Path, config: dict, rows: list[dict], peak: int) -> None:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "memory.json").write_text(json.dumps({"peak_tree_rss_bytes": peak}))
    (directory / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def _update(update: int, seconds: float, learner: float) -> dict:
    return {"kind": "update", "update": update, "reward": 0.5, "seconds": seconds,
            "wall": 10.0 * (update + 1), "learner_seconds": learner,
            "response_length_mean": 12.0, "response_truncated_share": 0.25}


def test_the_report_marks_trl_rows_beside_invars(tmp_path, monkeypatch):
    script = _script()
    monkeypatch.setattr(script, "REPORTS", tmp_path / "real_model")
    protocol = {"prompts_per_batch": 4, "group_size": 8, "seed": 0}
    _write_run(tmp_path / "real_model" / "S1-seed0", {"protocol": {**protocol,
                                                                   "max_staleness": 1}},
               [{"kind": "life", "life": 1, "wall": 0.0},
                {"kind": "evaluation", "version": 0, "heldout_reward": 0.25, "wall": 5.0},
                _update(0, 64.0, 32.0)], 2**31)
    # As trl_peer.py writes them: its evaluation rows time themselves, an "end" row closes.
    _write_run(tmp_path / "real_model" / "trl-seed0",
               {"peer": "trl", "trl_version": "1.16.0", "protocol": protocol},
               [{"kind": "evaluation", "version": 0, "heldout_reward": 0.5, "wall": 4.0,
                 "seconds": 2.0},
                _update(0, 32.0, 16.0),
                {"kind": "end", "wall": 40.0}], 2**30)

    text = script.report().read_text()

    assert ("| S1-seed0 | Invar S = 1 | 1 | 0.250 | 0.250 | 0.250 | 64.0 | 1.00 | 12.0 | "
            "0.25 | 2.0 GiB |") in text
    assert ("| trl-seed0 | TRL 1.16.0 GRPOTrainer | 1 | 0.500 | 0.500 | 0.500 | 32.0 | 0.50 | "
            "12.0 | 0.25 | 1.0 GiB |") in text


def _curve(accuracies: list[float], every: int = 3) -> list[dict]:
    return [{"kind": "evaluation", "version": every * i, "heldout_reward": accuracy,
             "wall": float(i)} for i, accuracy in enumerate(accuracies)]


def test_the_report_compares_updates_to_the_threshold_seed_by_seed(tmp_path, monkeypatch):
    """Per seed: the first version at the threshold for Invar S = 0 and for TRL, and the mean
    held-out accuracy over versions 1.., with the paired differences' mean and interval."""
    script = _script()
    monkeypatch.setattr(script, "REPORTS", tmp_path / "real_model")
    curves = {0: ([0.4, 0.5, 0.7], [0.4, 0.6, 0.8]), 1: ([0.4, 0.6, 0.6], [0.4, 0.4, 0.5])}
    for seed, (mine, theirs) in curves.items():
        protocol = {"prompts_per_batch": 4, "group_size": 8, "seed": seed}
        _write_run(tmp_path / "real_model" / f"S0-seed{seed}",
                   {"protocol": {**protocol, "max_staleness": 0}},
                   [*_curve(mine), _update(0, 30.0, 10.0)], 2**30)
        _write_run(tmp_path / "real_model" / f"trl-seed{seed}",
                   {"peer": "trl", "trl_version": "1.16.0", "protocol": protocol},
                   [*_curve(theirs), _update(0, 20.0, 10.0)], 2**30)

    text = script.report(threshold=0.6).read_text()

    assert "| 0 | 6 (192) | 3 (96) | 0.600 | 0.700 |" in text
    assert "| 1 | 3 (96) | - | 0.600 | 0.450 |" in text
    # Updates: one seed reached it in both (6 - 3); accuracy: (-0.1 + 0.15) / 2.
    assert "updates to 0.6: +3.000 (one seed: no interval) (of the 1 seed(s) where both" in text
    assert "mean held-out accuracy: +0.025 [" in text
