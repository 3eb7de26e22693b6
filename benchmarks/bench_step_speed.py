"""`step`'s throughput on a full-run trace, before and after: this tree against git revisions.

    .venv/bin/python benchmarks/bench_step_speed.py --baseline fc5b373 --baseline 77d59c3

The trace is `benchmarks/test_bench_step.py`'s: the canonical run of the default protocol shape
(64 prompts x 8 samples, K = 4, S = 1) for 10 updates, 5,120 samples, delivered as the runtime's
workers answer (`invar.testing.framed`: one event per reply frame) where the tree has batched
completions, one event per sample where it predates them. Each tree builds its own trace (the
event types differ across revisions) and replays it from the initial state in a fresh process:
`step` alone, and `step` plus the journal's `state_digest` after each event (what the driver
pays per event). Trees run interleaved, round by round, so a shared machine's load falls on all
alike; each figure is the best round of CPU time (`time.process_time`, less sensitive to other
jobs than wall time), in samples per second.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from git_trees import add_baselines, run_json, trees

# Runs inside each tree: prints {"events", "samples", "step_s", "step_digest_s"}.
REPLAY = r"""
import json, sys, time
from invar.model import RunConfig, initial_state, state_digest, step
from invar.model.messages import EVENT_TYPES
from invar.testing import canonical_run
try:
    from invar.testing import framed
except ImportError:  # before batched completions: one event per sample
    framed = None

config = RunConfig(prompts_per_batch=64, group_size=8, max_staleness=1, sync_period=1,
                   optimizer_steps=4, total_updates=10)
run = canonical_run(config)
events = framed(run.events) if framed else list(run.events)
samples = sum(len(getattr(e, "completions", ())) or
              (1 if type(e).__name__ == "RequestCompleted" else 0) for e in events)

def replay(digest):
    state = initial_state(config)
    for event in events:
        state, _ = step(state, event)
        if digest:
            state_digest(state)

best = {}
for _ in range(int(sys.argv[1])):
    for digest in (False, True):
        began = time.process_time()
        replay(digest)
        spent = time.process_time() - began
        best[digest] = min(best.get(digest, spent), spent)
print(json.dumps({"events": len(events), "samples": samples, "step_s": best[False],
                  "step_digest_s": best[True]}))
"""


def measure(tree: Path, repeats: int) -> dict[str, float]:
    return run_json(tree, REPLAY, str(repeats))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_baselines(parser)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--repeats", type=int, default=5, help="replays per round (best kept)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        compared = trees(args.baseline, Path(tmp))
        best: dict[str, dict[str, float]] = {}
        for _ in range(args.rounds):
            for label, tree in compared.items():
                run = measure(tree, args.repeats)
                kept = best.setdefault(label, run)
                for key in ("step_s", "step_digest_s"):
                    kept[key] = min(kept[key], run[key])
        now = best["this tree"]
        print(f"{'tree':<12}{'events':>8}{'samples':>9}{'step: samples/s':>18}"
              f"{'+ digest: samples/s':>22}{'vs this tree':>14}")
        for label, run in best.items():
            rate = run["samples"] / run["step_s"]
            with_digest = run["samples"] / run["step_digest_s"]
            ratio = (now["samples"] / now["step_s"]) / rate
            print(f"{label:<12}{run['events']:>8,}{run['samples']:>9,}{rate:>18,.0f}"
                  f"{with_digest:>22,.0f}{ratio:>13.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
