"""When the driver delivers the core's `TimerFired`: once something the core awaits has shown no
sign of life for the timeout, not once the run has been quiet for it.

The core re-sends every outstanding command when its timer fires (PROTOCOL.md §5.2). A fixed
inactivity timer shorter than one generation call (a real model's takes minutes on a CPU) made
a healthy worker answer every request several times. Here each command the core awaits
(`outstanding_commands`) has a last sign of life:

- a launch of request r to worker w#i: its latest send, or the latest `working` frame from w#i
  naming r (a worker names every request it has received and not yet answered, every
  `heartbeat_seconds(retry_seconds)`, while it generates: `invar.runtime.worker.serve`);
- a load to w#i: likewise, named by its load serial;
- a learner or store command: now while the learner or the store (both in the driver's
  process, where nothing is lost) has work, else when it last finished or, if later, when
  the last event was accepted (a command issued then may still wait for a journal sync).

The timer fires when one is older than the timeout: `output.retry_seconds`, doubled each time
it fires (at most `MAX_BACKOFF` doublings) and back to `retry_seconds` when an event other
than `TimerFired` is accepted. So a slow but healthy worker is never asked twice, while a
dropped launch, load or reply (its request is not named, or no longer named) is re-sent after
`retry_seconds`, and a worker that neither answers nor says it is working (hung host, cut
link) is asked again at longer and longer intervals until `WorkerLost` moves its requests.
Whenever the timer fires, the core's semantics are the model's: the checker's early timers
cover a timer that fires at any time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from invar.model.core import outstanding_commands
from invar.model.messages import Command, LaunchRequests, LoadWeights
from invar.model.state import State

MAX_BACKOFF = 6
"""Doublings of the timeout at most while the timer keeps firing without progress."""
HEARTBEATS_PER_TIMEOUT = 4
"""A worker says what it is working on this many times per `retry_seconds`: a sign of life
is lost only if every one of them is."""

Key = tuple[Any, ...]


def heartbeat_seconds(retry_seconds: float) -> float:
    """How often a worker names what it is working on."""
    return retry_seconds / HEARTBEATS_PER_TIMEOUT


def worker_keys(command: Command) -> list[Key]:
    """The keys by which a worker-bound command is sent and named (none for another)."""
    if isinstance(command, LaunchRequests):
        return [launch_key(command.worker, command.incarnation, tuple(request))
                for request in command.requests]
    if isinstance(command, LoadWeights):
        return [load_key(command.worker, command.incarnation, command.load)]
    return []


def launch_key(worker: str, incarnation: int, request: tuple[int, ...]) -> Key:
    return ("launch", worker, incarnation, request)


def load_key(worker: str, incarnation: int, load: int) -> Key:
    return ("load", worker, incarnation, load)


class RetryTimer:
    """The bookkeeping behind `TimerFired` (module doc); times are the caller's clock."""

    def __init__(self, retry_seconds: float, now: float) -> None:
        self.retry_seconds = retry_seconds
        self.backoff = 0
        self._alive: dict[Key, float] = {}
        """The latest sign of life of each worker-bound command sent or named."""
        self._in_process_pending = 0
        self._in_process_idle_since = now
        self._progress_at = now

    @property
    def timeout(self) -> float:
        return self.retry_seconds * 2 ** self.backoff

    def sent(self, commands: Iterable[Command], now: float) -> None:
        """`commands` were dispatched (sent or, to a worker not connected, not): each
        worker-bound one's sign of life is now."""
        for command in commands:
            for key in worker_keys(command):
                self._alive[key] = now

    def heard(self, keys: Iterable[Key], now: float) -> None:
        """A worker's `working` frame named these: still in hand, as of now. Keys of
        commands not sent (or no longer awaited) are not kept."""
        for key in keys:
            if key in self._alive:
                self._alive[key] = now

    def in_process_started(self) -> None:
        """A command went to the learner or the store."""
        self._in_process_pending += 1

    def in_process_finished(self, now: float) -> None:
        self._in_process_pending -= 1
        if not self._in_process_pending:
            self._in_process_idle_since = now

    def progress(self, now: float) -> None:
        """An event other than `TimerFired` was accepted: the timeout is `retry_seconds` again."""
        self.backoff = 0
        self._progress_at = now

    def fired(self) -> None:
        self.backoff = min(self.backoff + 1, MAX_BACKOFF)

    def due(self, state: State, now: float) -> bool:
        """Whether a command the core awaits in `state` has shown no sign of life for the
        timeout. Forgets the commands no longer awaited; one awaited but never seen sent (a
        resumed run's) counts from now."""
        alive: dict[Key, float] = {}
        oldest = now
        for command in outstanding_commands(state):
            keys = worker_keys(command)
            for key in keys:
                alive[key] = self._alive.get(key, now)
                oldest = min(oldest, alive[key])
            if not keys and not self._in_process_pending:
                oldest = min(oldest, max(self._in_process_idle_since, self._progress_at))
        self._alive = alive
        return now - oldest >= self.timeout
