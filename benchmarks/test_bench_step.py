"""Throughput of `step` on a full-run trace (pytest-benchmark).

    .venv/bin/python -m pytest benchmarks/test_bench_step.py --benchmark-enable

The trace is the canonical run of the default protocol shape (64 prompts × 8 samples, K = 4,
S = 1) for 10 updates: 5,242 events, most of them completions, replayed from the initial
state each round. Reported as events per second in `extra_info`.
"""

import pytest

from invar.model import RunConfig, initial_state, state_digest, step
from invar.testing import canonical_run

CONFIG = RunConfig(prompts_per_batch=64, group_size=8, max_staleness=1, sync_period=1,
                   optimizer_steps=4, total_updates=10)


@pytest.fixture(scope="module")
def trace():
    return canonical_run(CONFIG).events


def replay(events, digest=False):
    state = initial_state(CONFIG)
    for event in events:
        state, _ = step(state, event)
        if digest:
            state_digest(state)
    return state


def test_step_throughput(benchmark, trace):
    benchmark.pedantic(replay, args=(trace,), rounds=5, iterations=1)
    benchmark.extra_info["events"] = len(trace)
    benchmark.extra_info["events_per_second"] = len(trace) / benchmark.stats["mean"]


def test_step_and_digest_throughput(benchmark, trace):
    """What the driver pays per event: step plus the journal's state digest."""
    benchmark.pedantic(replay, args=(trace, True), rounds=5, iterations=1)
    benchmark.extra_info["events"] = len(trace)
    benchmark.extra_info["events_per_second"] = len(trace) / benchmark.stats["mean"]
