"""Two workers holding large batches (128 slots, at least `fast.BULK_FROM`), and their
replies: the starting points of the bulk slot paths' tests (tests/model/test_bulk_slots.py,
tests/model/test_reference_rules.py)."""

from __future__ import annotations

from invar.model import RunConfig, initial_state, step
from invar.model.errors import ProtocolError
from invar.model.messages import LaunchRequests, LearnerStarted, WorkerConnected, WorkerLost
from invar.testing import reply, version_digest, worker_reply

CONFIG = RunConfig(prompts_per_batch=16, group_size=8, max_staleness=1, total_updates=3)
"""Batches of 128 slots (at least BULK_FROM: a frame may fill one in bulk); two in flight."""


def settled(state, events):
    """`state` after `events` and every reply they lead to, but for launches (returned, in
    order) and the learner's commands (the batches stay unconsumed)."""
    launches, queue = [], list(events)
    while queue:
        outcome = step(state, queue.pop(0))
        assert not isinstance(outcome, ProtocolError), outcome
        state, commands = outcome
        for command in commands:
            if isinstance(command, LaunchRequests):
                launches.append(command)
            elif type(command).__name__ in ("LoadWeights", "Publish"):
                queue.append(reply(command, CONFIG.optimizer_steps))
    return state, launches


def started(lose_b: bool):
    """Two workers hold batches 0 and 1; with `lose_b`, b's first incarnation is lost and a
    second one relaunched (its first's replies then name slots others hold)."""
    state, launches = settled(initial_state(CONFIG), [
        LearnerStarted(0, 0, version_digest(0)), WorkerConnected("a", 0), WorkerConnected("b", 0)])
    if lose_b:
        state, more = settled(state, [WorkerLost("b", 0), WorkerConnected("b", 1)])
        launches += more
    return state, launches


def rows_of(launches):
    return [c for launch in launches for c in worker_reply(launch).completions]
