"""The protocol-level fault layer (`rollout.frame_faults`): its schedule, what it does to
frames over the in-memory transport, and a real run through it that still ends with the
serial execution's weights."""

from __future__ import annotations

import asyncio

import pytest

from invar.model.core import logical_projection, run_complete
from invar.runtime.config import FrameFaultConfig
from invar.runtime.faults import (
    DELAY,
    DROP,
    DUPLICATE,
    PASS,
    FaultyTransport,
    FrameSchedule,
    with_frame_faults,
)
from invar.runtime.transport import ConnectionLost, MemoryTransport

MIXED = FrameFaultConfig(drop=0.2, duplicate=0.2, delay=0.2, delay_seconds=0.05, seed=7)


def test_the_schedule_is_a_function_of_seed_worker_incarnation_and_direction():
    def fates(config: FrameFaultConfig, worker: str = "worker-0", incarnation: int = 0,
              direction: str = "to_worker") -> list[str]:
        schedule = FrameSchedule(config, worker, incarnation, direction)
        return [schedule.next()[0] for _ in range(200)]
    first = fates(MIXED)
    assert first == fates(MIXED)  # replayable
    assert {DROP, DUPLICATE, DELAY, PASS} <= set(first)
    assert 20 <= first.count(DROP) <= 60  # about 20 % of 200
    for other in (fates(FrameFaultConfig(**{**MIXED.__dict__, "seed": 8})),
                  fates(MIXED, worker="worker-1"), fates(MIXED, incarnation=1),
                  fates(MIXED, direction="to_driver")):
        assert other != first
    assert set(fates(FrameFaultConfig())) == {PASS}


def test_off_by_default_means_the_transport_itself():
    transport = MemoryTransport("worker-0")
    assert not FrameFaultConfig().enabled
    assert with_frame_faults(transport, FrameFaultConfig(), 0) is transport
    assert isinstance(with_frame_faults(transport, MIXED, 0), FaultyTransport)


def _frames(n: int) -> list[dict]:
    return [{"kind": "events", "n": i} for i in range(n)]


def test_frames_to_the_worker_are_dropped_duplicated_and_reordered_as_scheduled():
    async def go() -> tuple[list[int], FaultyTransport]:
        inner = MemoryTransport("worker-0")
        faulty = FaultyTransport(inner, MIXED, 0)
        await faulty.send({"kind": "hello", "name": "worker-0"})
        for frame in _frames(100):
            await faulty.send(frame)
        await asyncio.sleep(0.2)  # every delayed frame is out by now
        got = []
        while not inner.to_worker.empty():
            header, _ = inner.to_worker.get_nowait()
            got.append(header.get("n", -1))
        await faulty.close()
        return got, faulty
    got, faulty = asyncio.run(go())
    schedule = FrameSchedule(MIXED, "worker-0", 0, "to_worker")
    expected = [schedule.next()[0] for _ in range(100)]
    assert got[0] == -1  # the hello is never touched, and not counted
    body = got[1:]
    for n, fate in enumerate(expected):
        assert body.count(n) == {DROP: 0, DUPLICATE: 2, DELAY: 1, PASS: 1}[fate], (n, fate)
    assert body != sorted(body)  # delays reordered something
    assert faulty.counts["to_worker_dropped"] == expected.count(DROP)
    assert faulty.counts["to_worker_duplicated"] == expected.count(DUPLICATE)


def test_frames_from_the_worker_are_faulted_and_the_end_is_still_reported():
    async def go() -> tuple[list[int], list[str]]:
        inner = MemoryTransport("worker-0")
        counted: list[str] = []
        faulty = FaultyTransport(inner, MIXED, 2, counted.append)
        for frame in _frames(60):
            inner.to_driver.put_nowait((frame, b""))
        got = []
        received = asyncio.ensure_future(_drain(faulty, got))
        await asyncio.sleep(0.2)
        inner.to_driver.put_nowait(None)  # the worker is gone
        with pytest.raises(ConnectionLost):
            await asyncio.wait_for(received, 5)
        with pytest.raises(ConnectionLost):  # and stays gone
            await faulty.receive()
        await faulty.close()
        return got, counted
    got, counted = asyncio.run(go())
    schedule = FrameSchedule(MIXED, "worker-0", 2, "to_driver")
    expected = [schedule.next()[0] for _ in range(60)]
    assert len(got) == 60 - expected.count(DROP) + expected.count(DUPLICATE)
    assert counted.count("frames_dropped") == expected.count(DROP)
    assert counted.count("frames_delayed") == expected.count(DELAY)


async def _drain(transport: FaultyTransport, into: list[int]) -> None:
    while True:
        header, _ = await transport.receive()
        into.append(header["n"])


def test_a_run_through_dropped_duplicated_and_delayed_frames_equals_the_serial_one(tmp_path,
                                                                                    rt):
    faults = ("rollout.frame_faults.drop=0.2", "rollout.frame_faults.duplicate=0.2",
              "rollout.frame_faults.delay=0.2", "rollout.frame_faults.delay_seconds=0.2",
              "rollout.frame_faults.seed=1", "output.retry_seconds=0.5")
    config = rt.tiny_config(tmp_path / "faulty", "rollout.workers=2", *faults)
    state = rt.run_driver(config)
    counters = rt.summary(tmp_path / "faulty")["counters"]
    assert counters.get("frames_dropped", 0) >= 1 and counters.get("frames_duplicated", 0) >= 1
    serial = rt.run_serial(rt.tiny_config(tmp_path / "serial", "rollout.workers=2"))
    assert run_complete(state)
    assert logical_projection(serial) == logical_projection(state)
    rt.assert_same_weights(rt.final_weights(tmp_path / "serial"),
                           rt.final_weights(tmp_path / "faulty"))
