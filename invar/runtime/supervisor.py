"""Rollout workers kept running: each worker's incarnations one after another, started, served
until their connection ends, started again with backoff, or given up on.

    spawn(name, n) -> serve(handle) until lost -> died -> (backoff) -> spawn(name, n + 1)
                   -> unreachable for now -> (backoff, for a while) -> spawn(name, n + 1)
                   -> refused | too many deaths | respawn off -> given up (its log's tail)

The supervisor decides only whether and when a worker is started again. How a worker is
started is a parameter (`SpawnWorker`: a local process, a process on a host over SSH, a fake),
and what a worker's frames and its death mean to the run is its caller's (`serve`, `died`):
it knows no transport and no protocol message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from invar.runtime.transport import ConnectionLost, Transport, TransportRefused, worker_log

log = logging.getLogger("invar.driver")  # the run's log: its workers' lives are the driver's news

SpawnWorker = Callable[[str, int], Awaitable[Transport]]
"""Starts incarnation N of worker `name` and returns its connection. Raises `ConnectionLost`
when its host cannot be reached for now (tried again), `TransportRefused` when retrying cannot
help (given up)."""


@dataclass
class WorkerHandle:
    name: str
    incarnation: int
    transport: Transport
    connected: bool = False
    """Its hello was received (set by `serve`): only a connected incarnation can be lost."""


@dataclass(frozen=True)
class RespawnPolicy:
    respawn: bool
    """Start a worker again after it dies (rollout.respawn); off, its first death gives it up."""
    max_respawns: int
    """A worker that dies this many times in a row, each incarnation without completing a
    request, is not started again."""
    backoff: float
    """Seconds before the second start in a row of such a worker, doubled for each next one;
    and before the second attempt to reach an unreachable host, doubled likewise."""
    reconnect_backoff_max: float
    """The longest wait between two attempts to reach a worker's host."""
    reconnect_seconds: float
    """How long a worker's host may stay unreachable before the worker is given up."""


class LogTail(NamedTuple):
    path: Path
    lines: str
    """Its last non-blank lines, each indented."""


def log_tail(path: Path, lines: int = 10) -> LogTail | None:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    tail = [line for line in text.splitlines() if line.strip()][-lines:]
    return LogTail(path, "\n".join("  " + line for line in tail)) if tail else None


class WorkerSupervisor:
    """The workers `names` of one run.

    `spawn`: starts an incarnation; `serve(handle)`: serves its connection until it ends, True
    if it completed a request; `died(name, incarnation, connected)`: an incarnation ended (or
    could not be started, with respawn off); `before_respawn()`: runs before an incarnation
    that follows one that completed nothing (it may have refused what it was sent);
    `none_left(name, why, tail)`: the last worker was given up, `tail` the end of its log
    (`transport.worker_log` in `run_dir`). `clock` and `sleep` are `time.monotonic` and
    `asyncio.sleep` but in tests.
    """

    def __init__(self, names: Sequence[str], spawn: SpawnWorker,
                 serve: Callable[[WorkerHandle], Awaitable[bool]],
                 died: Callable[[str, int, bool], None],
                 before_respawn: Callable[[], Awaitable[None]],
                 none_left: Callable[[str, str, LogTail | None], None],
                 policy: RespawnPolicy, run_dir: Path,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.names = tuple(names)
        self.policy = policy
        self.run_dir = run_dir
        self.workers: dict[str, WorkerHandle] = {}
        """The newest incarnation of each worker started."""
        self.given_up: dict[str, str] = {}
        """Why each worker given up was."""
        self._spawn, self._serve, self._died = spawn, serve, died
        self._before_respawn, self._none_left = before_respawn, none_left
        self._clock, self._sleep = clock, sleep
        self._stopping = False

    def current(self, name: str, incarnation: int) -> WorkerHandle | None:
        """`name`'s handle, if `incarnation` is its newest one."""
        handle = self.workers.get(name)
        return handle if handle is not None and handle.incarnation == incarnation else None

    def stop(self) -> None:
        """The run is ending: no worker is started again."""
        self._stopping = True

    async def close(self) -> None:
        """Close every worker's connection (its `serve` ends)."""
        for handle in list(self.workers.values()):
            await handle.transport.close()

    async def supervise(self, name: str, incarnation: int) -> None:
        """Keep `name` running from `incarnation` on, until the run stops or it is given up."""
        failures = 0  # deaths in a row without a completed request: a worker that cannot serve
        # Since when its host has been unreachable, and the attempts made since (0: reachable).
        unreachable_since, attempts = 0.0, 0
        while True:
            handle: WorkerHandle | None = None
            try:
                handle = await self._start(name, incarnation)
                served = None if handle is None else await self._serve_until_lost(handle)
            except TransportRefused as error:  # host key or client key: retrying cannot help
                if not self._stopping:
                    self._give_up(name, incarnation, str(error))
                return
            if self._stopping:
                return
            if served is None and self.policy.respawn:
                # Not started: its host is unreachable (for now). Not a death: tried again,
                # backing off, for reconnect_seconds in all, so a restarting sshd or a
                # rebooting host is waited for.
                now = self._clock()
                if attempts == 0:
                    unreachable_since = now
                waited = now - unreachable_since
                limit = self.policy.reconnect_seconds
                if waited <= limit:
                    await self._sleep(min(self.policy.reconnect_backoff_max,
                                          self.policy.backoff * 2 ** attempts))
                    attempts += 1
                    incarnation += 1
                    continue
                self._give_up(name, incarnation, f"its host stayed unreachable for {waited:.0f} s "
                              f"(rollout.ssh.reconnect_seconds = {limit:g})")
                return
            attempts = 0
            self._died(name, incarnation, handle is not None and handle.connected)
            failures = 0 if served else failures + 1
            if not self.policy.respawn:
                why = "rollout.respawn is false"
            elif failures > self.policy.max_respawns:
                why = f"it died {failures} times in a row without completing a request"
            else:
                if not served:
                    await self._before_respawn()
                # At once after a death that followed work, then backoff, twice that...
                await self._sleep(0 if failures <= 1 else self.policy.backoff * 2 ** (failures - 2))
                incarnation += 1
                continue
            self._give_up(name, incarnation, why)
            return

    async def _start(self, name: str, incarnation: int) -> WorkerHandle | None:
        """A new incarnation, or None if its host cannot be reached for now."""
        try:
            transport = await self._spawn(name, incarnation)
        except ConnectionLost as error:
            log.warning("worker %s#%d not started: %s", name, incarnation, error)
            return None
        handle = WorkerHandle(name, incarnation, transport)
        self.workers[name] = handle
        return handle

    async def _serve_until_lost(self, handle: WorkerHandle) -> bool:
        try:
            return await self._serve(handle)
        finally:
            await handle.transport.close()

    def _give_up(self, name: str, incarnation: int, why: str) -> None:
        self.given_up[name] = why
        tail = log_tail(worker_log(self.run_dir, name, incarnation))
        log.error("worker %s is not restarted: %s%s", name, why,
                  f"; its last log lines ({tail.path}):\n{tail.lines}" if tail else "")
        if len(self.given_up) == len(self.names):
            self._none_left(name, why, tail)
