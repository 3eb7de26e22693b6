"""Progress outside a terminal: plain lines at a steady cadence, with updates/s and the time
left; the time left is measured from the session's first update."""

from __future__ import annotations

import math
import sys

from invar.runtime import metrics as metrics_module
from invar.runtime.metrics import PROGRESS_EVERY_SECONDS, MetricsLog, pace_text


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_piped_progress_prints_a_line_every_interval_and_the_last(tmp_path, capsys, monkeypatch,
                                                                  rt):
    clock = Clock()
    monkeypatch.setattr(metrics_module.time, "perf_counter", clock)
    log = MetricsLog(tmp_path, rt.tiny_config(tmp_path), tensorboard=False)
    total = 30
    with log.progress(total, enabled=True) as advance:
        clock.now += 20.0  # start-up: not counted in the rate
        for done in range(1, total + 1):
            log._session_updates = done
            advance(done, 0.5, 1)
            clock.now += PROGRESS_EVERY_SECONDS / 4
    lines = capsys.readouterr().out.splitlines()
    shown = [int(line.split()[1].split("/")[0]) for line in lines]
    assert shown == [1, 5, 9, 13, 17, 21, 25, 29, 30], lines
    # Under an update a second, the pace reads as seconds per update.
    assert lines[0] == ("update 1/30  reward 0.500  staleness 1  20.0 s/upd  elapsed 0:00:20  "
                        "ETA 0:09:40")
    # 0.4 updates/s since the first update: the 21 updates left take 52 s.
    assert lines[2].endswith("2.5 s/upd  elapsed 0:00:40  ETA 0:00:52"), lines[2]
    assert lines[-1].endswith("ETA 0:00:00")


def test_no_progress_when_it_is_off(tmp_path, capsys, rt):
    log = MetricsLog(tmp_path, rt.tiny_config(tmp_path), tensorboard=False)
    with log.progress(3, enabled=False) as advance:
        advance(1, 0.5, 1)
    assert capsys.readouterr().out == ""


def test_the_pace_reads_as_updates_per_second_or_seconds_per_update():
    assert [pace_text(rate) for rate in (0.0, math.nan, 1 / 64, 0.5, 1.0, 31.66)] == [
        "- upd/s", "- upd/s", "64.0 s/upd", "2.0 s/upd", "1.00 upd/s", "31.66 upd/s"]


class _Bar:
    """rich's Progress, recording what the bar is given."""

    def __init__(self, *columns: object) -> None:
        self.fields: dict = {}

    def __enter__(self) -> _Bar:
        bars.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def add_task(self, description: str, **fields: object) -> int:
        self.fields = dict(fields)
        return 0

    def update(self, task: int, **fields: object) -> None:
        self.fields.update(fields)


bars: list[_Bar] = []


def test_the_bar_shows_no_reward_before_an_update_and_a_resumed_run_s_earlier_updates(
        tmp_path, monkeypatch, rt):
    import rich.progress
    monkeypatch.setattr(rich.progress, "Progress", _Bar)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    log = MetricsLog(tmp_path, rt.tiny_config(tmp_path), tensorboard=False)
    log.updates = [{"update": u} for u in range(7)]  # a resumed run's: 7 done before
    with log.progress(30, enabled=True) as advance:
        bar = bars[-1]
        assert bar.fields["completed"] == 7 and bar.fields["total"] == 30
        assert (bar.fields["reward"], bar.fields["pace"], bar.fields["eta"]) == (
            "-", "- upd/s", "-")
        log._session_updates = 1
        advance(8, 0.25, 1)
        assert (bar.fields["completed"], bar.fields["reward"]) == (8, "0.250")
