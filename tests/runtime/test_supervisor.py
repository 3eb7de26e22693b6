"""The worker supervisor's policy (`invar.runtime.supervisor`), against fake workers and a fake
clock: a worker that dies without serving is started again after 0, 0.5, 1, 2... seconds and
given up after `max_respawns`; a death after work is started again at once and starts the count
anew; an unreachable host is tried again, backing off, for `reconnect_seconds`, and is not a
death; a refused one, or any death with respawn off, gives the worker up; when the last worker
is given up the run is told, with the tail of its log."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

from invar.runtime.supervisor import LogTail, RespawnPolicy, WorkerHandle, WorkerSupervisor
from invar.runtime.transport import (
    ConnectionLost,
    MemoryTransport,
    TransportRefused,
    worker_log,
)

UNREACHABLE = "unreachable"
REFUSED = "refused"
SERVED = "served"
"""An incarnation connects and completes a request, then dies."""
IDLE = "idle"
"""It connects and dies without completing a request."""
SILENT = "silent"
"""It dies before its hello."""


class FakeWorker(MemoryTransport):
    """An incarnation's connection, and how its life goes."""

    def __init__(self, name: str, life: str) -> None:
        super().__init__(name)
        self.life = life


class Clock:
    """`time.monotonic` and `asyncio.sleep` without the waiting: sleeping moves it on."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class Workers:
    """Fake workers whose incarnations go as `lives` says, one after another per worker (the
    last one repeated); records what the supervisor does with them."""

    def __init__(self, tmp_path: Path, lives: dict[str, Iterable[str]], respawn: bool = True,
                 max_respawns: int = 5, reconnect_seconds: float = 30.0,
                 on_death: str | None = None) -> None:
        self.lives = {name: list(script) for name, script in lives.items()}
        self.run_dir = tmp_path
        self.logs = tmp_path / "logs"
        self.clock = Clock()
        self.spawned: list[tuple[str, int]] = []
        self.died: list[tuple[str, int, bool]] = []
        self.repaired = 0
        self.none_left: list[tuple[str, str, LogTail | None]] = []
        self.transports: list[FakeWorker] = []
        self.supervisor = WorkerSupervisor(
            tuple(lives), self.spawn, serve=self.serve, died=self.on_died,
            before_respawn=self.repair, none_left=self.on_none_left, run_dir=self.run_dir,
            policy=RespawnPolicy(respawn=respawn, max_respawns=max_respawns, backoff=0.5,
                                 reconnect_backoff_max=2.0,
                                 reconnect_seconds=reconnect_seconds),
            clock=self.clock, sleep=self.clock.sleep)
        self.on_death = on_death
        """`stop`: the run ends when a worker first dies."""

    def life(self, name: str) -> str:
        script = self.lives[name]
        return script.pop(0) if len(script) > 1 else script[0]

    async def spawn(self, name: str, incarnation: int) -> FakeWorker:
        self.spawned.append((name, incarnation))
        worker_log(self.run_dir, name, incarnation).write_text(f"incarnation {incarnation}\n\n")
        life = self.life(name)
        if life == UNREACHABLE:
            raise ConnectionLost(f"{name}: host unreachable")
        if life == REFUSED:
            raise TransportRefused(f"{name}: host key does not verify")
        self.transports.append(FakeWorker(name, life))
        return self.transports[-1]

    async def serve(self, handle: WorkerHandle) -> bool:
        assert isinstance(handle.transport, FakeWorker)
        life = handle.transport.life
        handle.connected = life != SILENT
        if self.on_death == "stop":
            self.supervisor.stop()
        return life == SERVED

    def on_died(self, name: str, incarnation: int, connected: bool) -> None:
        self.died.append((name, incarnation, connected))

    async def repair(self) -> None:
        self.repaired += 1

    def on_none_left(self, name: str, why: str, tail: LogTail | None) -> None:
        self.none_left.append((name, why, tail))

    def supervise(self, **incarnations: int) -> None:
        """Every worker supervised from its incarnation (0 unless given) until it stops."""
        async def every_worker() -> None:
            await asyncio.gather(*(self.supervisor.supervise(name, incarnations.get(name, 0))
                                   for name in self.lives))
        asyncio.run(asyncio.wait_for(every_worker(), 10))


def test_a_worker_that_never_serves_backs_off_then_is_given_up_with_its_log_tail(tmp_path):
    workers = Workers(tmp_path, {"w": [IDLE]})
    workers.supervise(w=3)
    assert workers.spawned == [("w", n) for n in range(3, 9)]
    assert workers.died == [("w", n, True) for n in range(3, 9)]
    assert workers.clock.slept == [0, 0.5, 1.0, 2.0, 4.0]
    assert workers.repaired == 5  # before each respawn after a death that served nothing
    assert all(t.closed for t in workers.transports)
    assert workers.supervisor.given_up == {
        "w": "it died 6 times in a row without completing a request"}
    [(name, why, tail)] = workers.none_left
    assert name == "w" and why == workers.supervisor.given_up["w"]
    assert tail == LogTail(workers.logs / "w.8.log", "  incarnation 8")


def test_a_death_after_work_respawns_at_once_and_starts_the_count_anew(tmp_path):
    workers = Workers(tmp_path, {"w": [IDLE, IDLE, SERVED, IDLE, SERVED, IDLE]},
                      max_respawns=2)
    workers.supervise()
    assert workers.clock.slept == [0, 0.5, 0, 0, 0, 0, 0.5]
    assert workers.repaired == 5
    assert [d[1] for d in workers.died] == list(range(8))
    assert workers.supervisor.given_up["w"] == \
        "it died 3 times in a row without completing a request"


def test_only_a_connected_incarnation_is_reported_connected_when_it_dies(tmp_path):
    workers = Workers(tmp_path, {"w": [SILENT, IDLE]}, max_respawns=1)
    workers.supervise()
    assert workers.died == [("w", 0, False), ("w", 1, True)]


def test_an_unreachable_host_is_tried_again_backing_off_and_is_not_a_death(tmp_path):
    workers = Workers(tmp_path, {"w": [UNREACHABLE] * 5 + [SERVED, IDLE]}, max_respawns=0)
    workers.supervise()
    assert [n for _, n in workers.spawned] == list(range(7))  # each attempt an incarnation
    assert workers.clock.slept == [0.5, 1.0, 2.0, 2.0, 2.0, 0]
    assert workers.died == [("w", 5, True), ("w", 6, True)]
    assert workers.supervisor.given_up["w"] == \
        "it died 1 times in a row without completing a request"


def test_a_host_unreachable_for_longer_than_reconnect_seconds_is_given_up(tmp_path):
    workers = Workers(tmp_path, {"w": [UNREACHABLE]}, reconnect_seconds=5.0)
    workers.supervise()
    assert workers.clock.slept == [0.5, 1.0, 2.0, 2.0]  # waited 0, 0.5, 1.5, 3.5, then 5.5 s
    assert workers.died == []
    assert workers.supervisor.given_up["w"] == \
        "its host stayed unreachable for 6 s (rollout.ssh.reconnect_seconds = 5)"
    assert workers.none_left[0][2] == LogTail(workers.logs / "w.4.log", "  incarnation 4")


def test_a_refused_host_is_given_up_at_once_and_the_run_told_when_none_is_left(tmp_path):
    workers = Workers(tmp_path, {"a": [REFUSED], "b": [IDLE, REFUSED]})
    workers.supervise()
    assert workers.clock.slept == [0]
    assert workers.supervisor.given_up == {"a": "a: host key does not verify",
                                           "b": "b: host key does not verify"}
    assert [name for name, _, _ in workers.none_left] == ["b"]  # told once, by the last


def test_with_respawn_off_the_first_death_gives_up(tmp_path):
    workers = Workers(tmp_path, {"w": [SERVED]}, respawn=False)
    workers.supervise()
    assert workers.died == [("w", 0, True)] and workers.clock.slept == []
    assert workers.supervisor.given_up["w"] == "rollout.respawn is false"


def test_with_respawn_off_an_unreachable_host_counts_as_a_death(tmp_path):
    workers = Workers(tmp_path, {"w": [UNREACHABLE]}, respawn=False)
    workers.supervise()
    assert workers.died == [("w", 0, False)] and workers.clock.slept == []
    assert workers.supervisor.given_up["w"] == "rollout.respawn is false"


def test_a_run_that_stops_starts_no_worker_again_and_gives_none_up(tmp_path):
    workers = Workers(tmp_path, {"w": [IDLE]}, on_death="stop")
    workers.supervise()
    assert workers.spawned == [("w", 0)] and workers.died == []
    assert workers.supervisor.given_up == {} and workers.none_left == []


def test_the_current_handle_is_the_newest_incarnation_s(tmp_path):
    workers = Workers(tmp_path, {"w": [IDLE]}, max_respawns=1)
    workers.supervise(w=4)
    assert workers.supervisor.current("w", 4) is None
    handle = workers.supervisor.current("w", 5)
    assert handle is not None and handle.transport is workers.transports[-1]
    assert workers.supervisor.current("x", 0) is None
