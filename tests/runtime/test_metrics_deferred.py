"""A deferred metrics log (the driver's) keeps its rows until `write_out`, then writes them in
the order they were recorded; `close` and `finish` write whatever is left."""

from __future__ import annotations

import json
from pathlib import Path

from invar.runtime.metrics import MetricsLog


def _kinds(run_dir: Path) -> list[tuple[str, int]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["kind"], r.get("update", r.get("version"))) for r in rows if r["kind"] != "life"]


def _row(log: MetricsLog, update: int) -> None:
    log.update(update=update, reward=0.5, staleness=0, terms={}, seconds=0.1, refused=0,
               noops=0)


def test_rows_wait_for_write_out_and_keep_their_order(tmp_path: Path, rt) -> None:
    log = MetricsLog(tmp_path, rt.tiny_config(tmp_path), tensorboard=False)
    log.deferred = True
    _row(log, 0)
    log.evaluation(1, 0.75)
    assert _kinds(tmp_path) == []  # recorded in memory only: no write on the event path
    assert [u["update"] for u in log.updates] == [0] and log.evaluations[0]["version"] == 1
    log.write_out()
    assert _kinds(tmp_path) == [("update", 0), ("evaluation", 1)]
    assert len((tmp_path / "metrics.csv").read_text().splitlines()) == 2  # header + a row
    _row(log, 1)
    log.close()
    assert _kinds(tmp_path) == [("update", 0), ("evaluation", 1), ("update", 1)]


def test_an_immediate_log_writes_each_row_at_once(tmp_path: Path, rt) -> None:
    log = MetricsLog(tmp_path, rt.tiny_config(tmp_path), tensorboard=False)
    _row(log, 0)
    assert _kinds(tmp_path) == [("update", 0)]
    log.close()
