"""R, T and the most overlapping them can buy in updates/s: an upper bound, not a prediction.

A synchronous update takes about R + T (rollout R: generating a batch; learning T: scoring and
the optimizer steps); when the two overlap (protocol.max_staleness >= 1, on separate cores or
devices) an update takes about max(R, T). So overlap can buy at most (R + T) / max(R, T) in
updates/s: 2x when R = T, next to nothing when one phase dominates. That is an upper bound for
R and T as measured, not a prediction: it leaves out what staleness costs in extra updates to
reach the same reward, and what overlapped phases cost each other on shared hardware (README,
"When to use asynchronous training"; reports/use-contract/RESULTS.md).

`invar train` measures R and T on the run's own first updates (the per-update timing the
driver writes into metrics.jsonl) and prints `hint_line` once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

HINT_AFTER = 6
"""Updates after which `invar train` prints the hint: the first update carries the workers'
start-up and is skipped, the next five are measured."""
SKIP = 1


@dataclass(frozen=True)
class PhaseTimes:
    """Measured seconds of the two phases, per update."""

    rollout: float
    """R: worker generation seconds per rollout batch, divided by the number of workers (they
    generate a batch's chunks in parallel)."""
    learning: float
    """T: learner busy seconds per update (scoring + optimizer steps + commit)."""
    updates: int
    """Updates the figures are averaged over."""

    @property
    def gain(self) -> float:
        """(R + T) / max(R, T): the speed-up of a perfect overlap over the synchronous loop."""
        return async_gain(self.rollout, self.learning)


def async_gain(rollout: float, learning: float) -> float:
    """(R + T) / max(R, T), between 1 and 2; ValueError for a negative, non-finite or all-zero
    pair (no phase measured: nothing to predict)."""
    for name, value in (("rollout", rollout), ("learning", learning)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} seconds must be finite and >= 0, got {value!r}")
    if max(rollout, learning) == 0:
        raise ValueError("rollout and learning seconds are both 0: nothing was measured")
    return (rollout + learning) / max(rollout, learning)


def measure(rows: Sequence[Mapping[str, Any]], samples_per_batch: int, workers: int = 1,
            skip: int = SKIP) -> PhaseTimes | None:
    """R and T from metrics rows (each with the `learner_seconds`, `rollout_seconds` and
    `rollout_generated` the driver adds since the previous row), the first `skip` rows left
    out. None when the rows after `skip` carry no timing, or no generation (a run of two
    updates with S >= 1 generates both batches before its first row: R is not 0 but unknown).

    R is the generation seconds per batch the workers generated: not per row (with S >= 1 a
    later batch's samples can land in an earlier update's row), nor per batch of replies (a
    re-sent request, or a duplicated frame, is answered again from the worker's cache at no
    generation cost: counted as replies, it made R look several times shorter than
    generation took). Rows without `rollout_generated` (older runs) count a batch each."""
    if samples_per_batch < 1 or workers < 1:
        raise ValueError("samples_per_batch and workers must be >= 1")
    used = [row for row in rows[skip:] if "learner_seconds" in row and "rollout_seconds" in row]
    if not used:
        return None
    batches = (sum(float(row["rollout_generated"]) for row in used) / samples_per_batch
               if all("rollout_generated" in row for row in used) else len(used))
    if not batches:
        return None
    rollout = sum(float(row["rollout_seconds"]) for row in used) / batches / workers
    learning = sum(float(row["learner_seconds"]) for row in used) / len(used)
    if max(rollout, learning) <= 0:
        return None
    return PhaseTimes(rollout, learning, len(used))


def hint_line(times: PhaseTimes, staleness: int) -> str:
    """The one line `invar train` prints: measured R, T and the upper bound on what overlap
    can buy in updates/s (not a prediction of time to a reward)."""
    measured = f"rollout R {times.rollout:.3f} s/batch, learning T {times.learning:.3f} s/update"
    if staleness == 0:
        bound = ("overlapping them (protocol.max_staleness >= 1, rollout and learner on "
                 "separate cores) can raise updates/s")
    else:
        # Overlapped phases slow each other on shared hardware: these are not the sync R and T.
        bound = (f"measured while overlapping (S = {staleness}): over the synchronous loop, "
                 "overlap can raise updates/s")
    return (f"hint: {measured} over {times.updates} updates; {bound} by at most "
            f"(R+T)/max(R,T) = {times.gain:.2f}x, an upper bound and not a prediction: it "
            "leaves out the cost of staleness in extra updates to the same reward (README, "
            "'When to use asynchronous training')")
