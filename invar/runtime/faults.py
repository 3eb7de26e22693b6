"""Protocol-level fault injection: a `Transport` wrapper that drops, duplicates and delays
frames on a seeded schedule (`rollout.frame_faults`, off by default).

TCP, pipes and SSH deliver every byte once and in order, so a real run never meets the
faults the core is built to survive (and the model checker explores): a lost launch or
reply, a duplicated load, a reply overtaken by a later one. This layer makes them happen
between the driver and a worker, whatever transport is underneath, and without looking into
frames beyond their `kind`: a worker's `hello` (the transport's handshake) passes untouched;
everything else is a protocol message and fair game.

Each frame's fate is drawn from a generator seeded by (seed, worker, incarnation, direction),
in frame order: the same run meets the same faults frame for frame. A delayed frame is held
for a uniform draw in [0, delay_seconds] while later frames go on (so it is reordered).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from invar.runtime.config import FrameFaultConfig
from invar.runtime.transport import ConnectionLost, FrameError, Transport

log = logging.getLogger("invar.faults")

DROP, DUPLICATE, DELAY, PASS = "dropped", "duplicated", "delayed", "passed"


class FrameSchedule:
    """The fate of each frame in one direction of one worker incarnation."""

    def __init__(self, config: FrameFaultConfig, worker: str, incarnation: int,
                 direction: str) -> None:
        self.config = config
        # A string seed is hashed with SHA-512 by `random`: stable across runs and processes.
        self._random = random.Random(f"{config.seed}/{worker}/{incarnation}/{direction}")

    def next(self) -> tuple[str, float]:
        """(fate, seconds held) of the next frame."""
        c = self.config
        draw, hold = self._random.random(), self._random.random() * c.delay_seconds
        if draw < c.drop:
            return DROP, 0.0
        if draw < c.drop + c.duplicate:
            return DUPLICATE, 0.0
        if draw < c.drop + c.duplicate + c.delay:
            return DELAY, hold
        return PASS, 0.0


class FaultyTransport:
    """`inner` with frames dropped, duplicated and delayed in both directions."""

    def __init__(self, inner: Transport, config: FrameFaultConfig, incarnation: int,
                 count: Callable[[str], None] | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.incarnation = incarnation
        self._to_worker = FrameSchedule(config, inner.name, incarnation, "to_worker")
        self._to_driver = FrameSchedule(config, inner.name, incarnation, "to_driver")
        self.counts: Counter[str] = Counter()
        self._count = count
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()
        self._pump: asyncio.Task[None] | None = None
        self._held: set[asyncio.Task[None]] = set()
        self._closed = False

    def _fate(self, schedule: FrameSchedule, direction: str, header: dict[str, Any]
              ) -> tuple[str, float]:
        if header.get("kind") == "hello":
            return PASS, 0.0
        fate, hold = schedule.next()
        if fate != PASS:
            self.counts[f"{direction}_{fate}"] += 1
            if self._count is not None:
                self._count(f"frames_{fate}")
            log.debug("%s#%d: %s frame %s %s", self.name, self.incarnation, direction,
                      header.get("kind"), fate)
        return fate, hold

    async def send(self, header: dict[str, Any], blob: bytes = b"") -> None:
        fate, hold = self._fate(self._to_worker, "to_worker", header)
        if fate == DROP:
            return
        if fate == DELAY:
            self._hold(hold, self._send_late, header, blob)
            return
        await self.inner.send(header, blob)
        if fate == DUPLICATE:
            await self.inner.send(header, blob)

    async def _send_late(self, header: dict[str, Any], blob: bytes) -> None:
        try:
            await self.inner.send(header, blob)
        except ConnectionLost:
            pass  # the worker died meanwhile: the frame is lost with it, as on a real link

    async def receive(self) -> tuple[dict[str, Any], bytes]:
        if self._pump is None:
            self._pump = asyncio.ensure_future(self._pump_frames())
        item = await self._inbox.get()
        if isinstance(item, BaseException):
            if isinstance(item, ConnectionLost):
                self._inbox.put_nowait(item)  # every later receive says the same
            raise item
        frame: tuple[dict[str, Any], bytes] = item
        return frame

    async def _pump_frames(self) -> None:
        """Reads the worker's frames ahead, deciding each one's fate as it arrives."""
        while True:
            try:
                frame = await self.inner.receive()
            except ConnectionLost as error:
                self._inbox.put_nowait(error)
                return
            except FrameError as error:  # a malformed frame: the caller counts it, goes on
                self._inbox.put_nowait(error)
                continue
            fate, hold = self._fate(self._to_driver, "to_driver", frame[0])
            if fate == DROP:
                continue
            if fate == DELAY:
                self._hold(hold, self._deliver_late, frame)
                continue
            self._inbox.put_nowait(frame)
            if fate == DUPLICATE:
                self._inbox.put_nowait(frame)

    async def _deliver_late(self, frame: tuple[dict[str, Any], bytes]) -> None:
        self._inbox.put_nowait(frame)

    def _hold(self, seconds: float, then: Callable[..., Awaitable[None]], *args: Any) -> None:
        async def later() -> None:
            await asyncio.sleep(seconds)
            await then(*args)
        task = asyncio.ensure_future(later())
        self._held.add(task)
        task.add_done_callback(self._held.discard)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in [*self._held, *([self._pump] if self._pump else [])]:
            task.cancel()
        await asyncio.gather(*self._held, *([self._pump] if self._pump else []),
                             return_exceptions=True)
        if any(self.counts.values()):
            log.info("frame faults on %s#%d: %s", self.name, self.incarnation,
                     ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items())))
        await self.inner.close()


def with_frame_faults(transport: Transport, config: FrameFaultConfig, incarnation: int,
                      count: Callable[[str], None] | None = None) -> Transport:
    """`transport` itself when no fault is configured, else wrapped."""
    if not config.enabled:
        return transport
    return FaultyTransport(transport, config, incarnation, count)
