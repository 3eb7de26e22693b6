"""What a run counts beside the core's state, in the driver and the serial execution alike:
events, refusals, time spent (`Stats`) and the requests whose verifier failed (`VerifierFailures`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from invar.runtime.verifier import FAILED, TIMEOUT


@dataclass
class Stats:
    events: int = 0
    refused: int = 0
    noops: int = 0
    malformed_frames: int = 0
    core_seconds: float = 0.0
    """Seconds of the core and the driver's own work: the event loop's, in wall seconds
    (decoding a worker's frames, `deliver`, journal appends, dispatch), and the journal's
    making of each line's text, the states' digests included, in CPU seconds of the thread
    that syncs (not the joining, writes and fsyncs, which were never the event path's)."""
    core_cpu_seconds: float = 0.0
    """The same as CPU time (the event loop's thread, and the syncing thread's whole sync,
    its writes and fsyncs included): without the waits for the GIL and for the disk."""
    worker_deaths: int = 0
    rollout_seconds: float = 0.0
    """Generation seconds the workers reported in their reply frames (measurement only)."""
    load_seconds: float = 0.0
    """Weight-loading seconds the workers reported (measurement only)."""
    rollout_replies: int = 0
    """Replies received in frames that reported generation seconds (measurement only): more
    than the samples when requests were re-sent or frames duplicated."""
    rollout_generated: int = 0
    """Samples the workers reported generating, not answering again from their reply cache
    (measurement only): `rollout_seconds` went into these, so re-sends do not change R."""
    started: float = field(default_factory=time.perf_counter)
    completed_by: dict[str, int] = field(default_factory=dict)
    """Requests each worker (any incarnation) reported completed."""

    @contextlib.contextmanager
    def core_time(self) -> Iterator[None]:
        """Count the block's wall and CPU seconds as the core's and the driver's own work
        (`core_seconds`, `core_cpu_seconds`). For the calling thread only: another thread
        returns its CPU seconds to the loop's to add (a shared float is not added to safely)."""
        # The CPU clock is read outside the wall-clock window: reading it is a system call
        # (often a reschedule point) that is the measurement's cost, not the driver's.
        began_cpu = time.thread_time()
        began = time.perf_counter()
        try:
            yield
        finally:
            self.core_seconds += time.perf_counter() - began
            self.core_cpu_seconds += time.thread_time() - began_cpu


class VerifierFailures:
    """The requests whose verifier failed or timed out, by batch, from the reply frames'
    headers (`RolloutWorker.verifier_failures`): a set per batch, so a frame delivered twice
    or a request answered by two workers counts once. `take(u)` gives batch u's counts for
    update u's metrics row."""

    def __init__(self) -> None:
        self.by_batch: dict[int, dict[str, set[tuple[int, ...]]]] = {}

    def add(self, header: dict[str, Any]) -> None:
        for status in (FAILED, TIMEOUT):
            for request in header.get(f"verifier_{status}", ()):
                request = tuple(int(part) for part in request)
                self.by_batch.setdefault(request[0], {}).setdefault(status, set()).add(request)

    def take(self, batch: int) -> dict[str, int]:
        found = self.by_batch.pop(batch, {})
        return {"verifier_failures": len(found.get(FAILED, ())),
                "verifier_timeouts": len(found.get(TIMEOUT, ()))}
