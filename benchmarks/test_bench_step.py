"""Throughput of `step` on a full-run trace (pytest-benchmark), in samples per second.

    .venv/bin/python -m pytest benchmarks/test_bench_step.py --benchmark-enable

The trace is the canonical run of the default protocol shape (64 prompts × 8 samples, K = 4,
S = 1) for 10 updates (5,120 samples), replayed from the initial state each round, in two
forms side by side: `per_sample`, one reply frame per launch (what `canonical_run` delivers:
5,244 events), and `framed`, the replies a worker was sent together in one frame, as the
runtime's workers answer (`invar.testing.framed`: 133 events). `extra_info` holds the events
and samples per second.
"""

import pytest

from invar.model import RunConfig, initial_state, logical_projection, state_digest, step
from invar.model.messages import RequestsCompleted
from invar.testing import canonical_run, framed

CONFIG = RunConfig(prompts_per_batch=64, group_size=8, max_staleness=1, sync_period=1,
                   optimizer_steps=4, total_updates=10)


@pytest.fixture(scope="module")
def traces():
    run = canonical_run(CONFIG)
    out = {"per_sample": run.events, "framed": framed(run.events)}
    for events in out.values():
        assert logical_projection(replay(events)) == logical_projection(run.state)
    return out


def replay(events, digest=False):
    state = initial_state(CONFIG)
    for event in events:
        state, _ = step(state, event)
        if digest:
            state_digest(state)
    return state


def _record(benchmark, events):
    samples = sum(len(e.completions) for e in events if isinstance(e, RequestsCompleted))
    benchmark.extra_info["events"] = len(events)
    benchmark.extra_info["samples"] = samples
    benchmark.extra_info["events_per_second"] = len(events) / benchmark.stats["mean"]
    benchmark.extra_info["samples_per_second"] = samples / benchmark.stats["mean"]


@pytest.mark.parametrize("form", ["per_sample", "framed"])
def test_step_throughput(benchmark, traces, form):
    benchmark.pedantic(replay, args=(traces[form],), rounds=5, iterations=1)
    _record(benchmark, traces[form])


@pytest.mark.parametrize("form", ["per_sample", "framed"])
def test_step_and_digest_throughput(benchmark, traces, form):
    """What the driver pays per event: step plus the journal's state digest."""
    benchmark.pedantic(replay, args=(traces[form], True), rounds=5, iterations=1)
    _record(benchmark, traces[form])
