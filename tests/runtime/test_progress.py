"""Progress outside a terminal: plain lines at a steady cadence, with updates/s and the time
left; the time left is measured from the session's first update."""

from __future__ import annotations

from invar.runtime import metrics as metrics_module
from invar.runtime.metrics import PROGRESS_EVERY_SECONDS, MetricsLog


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
    assert lines[0] == ("update 1/30  reward 0.500  staleness 1  0.05 upd/s  elapsed 0:00:20  "
                        "ETA 0:09:40")
    # 0.4 updates/s since the first update: the 21 updates left take 52 s.
    assert lines[2].endswith("0.40 upd/s  elapsed 0:00:40  ETA 0:00:52"), lines[2]
    assert lines[-1].endswith("ETA 0:00:00")


def test_no_progress_when_it_is_off(tmp_path, capsys, rt):
    log = MetricsLog(tmp_path, rt.tiny_config(tmp_path), tensorboard=False)
    with log.progress(3, enabled=False) as advance:
        advance(1, 0.5, 1)
    assert capsys.readouterr().out == ""
