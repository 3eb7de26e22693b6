"""Journal validation is linear in the journal: twice the updates, about the same time per event.

    python benchmarks/bench_trace_linearity.py [--repeats 3]

Writes the canonical run's journal at 10 and at 40 updates (8 prompts x 8 samples), replays
each with every invariant checked, and prints the seconds per event of each (best of the
repeats) and their ratio; exits 1 when the longer journal costs 2x or more per event. A
timing, so a benchmark (this was a unit test, which a loaded machine could fail).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from invar.model.config import RunConfig  # noqa: E402
from invar.runtime import journal  # noqa: E402
from invar.testing import canonical_run  # noqa: E402


def per_event(directory: Path, updates: int, repeats: int) -> float:
    config = RunConfig(prompts_per_batch=8, group_size=8, max_staleness=1, sync_period=1,
                       optimizer_steps=2, total_updates=updates, max_inflight_batches=2,
                       seed=7, eval_every=2, checkpoint_every=2)
    path = journal.write_events(directory / f"j{updates}.jsonl", config,
                                canonical_run(config).events)
    config, entries = journal.read(path)
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        for _, _, after in journal.replay(config, entries, check_invariants=True):
            assert not isinstance(after, journal.Departure)
        best = min(best, (time.perf_counter() - began) / len(entries))
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        short, long = (per_event(Path(scratch), n, args.repeats) for n in (10, 40))
    print(f"seconds per event: 10 updates {short:.2e}, 40 updates {long:.2e}, "
          f"ratio {long / short:.2f} (linear: about 1; fails at 2)")
    return 0 if long < 2.0 * short else 1


if __name__ == "__main__":
    raise SystemExit(main())
