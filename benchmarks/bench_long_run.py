"""What a long run costs the control plane per update, before and after: this tree against git
revisions, at several run lengths.

    .venv/bin/python benchmarks/bench_long_run.py --baseline cf8582c

A run's history grows by one update at a time: commit digests, publications and the ledger. A
per-update cost that walks the history makes a long run quadratic. Each tree replays the canonical
run (a small shape, 4 prompts x 2 samples, K = 4, S = 1, so that 2,000 updates replay in
seconds; per-update costs that grow with the history grow the same at every shape) in a fresh
process and prints, per run length:

* `step` in ms per update, and `step` plus the journal's `state_digest` after each event (what
  the driver pays per event);
* the ledger's size per update in KiB (the record the core keeps of every committed update, for
  the whole run) and the objects it holds that the garbage collector tracks, at the default
  shape (64 x 8 samples, 20 updates: what one record costs, independent of the run's length).

Trees run interleaved, length by length; the best of `--repeats` CPU times
(`time.process_time`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from git_trees import add_baselines, run_json, trees

# Runs inside each tree: prints {"step_ms", "step_digest_ms"} per update for `updates`.
REPLAY = r"""
import dataclasses, json, sys, time
from invar.model import RunConfig, initial_state, state_digest, step
from invar.testing import canonical_run, framed

updates, repeats = int(sys.argv[1]), int(sys.argv[2])
config = RunConfig(prompts_per_batch=4, group_size=2, max_staleness=1, sync_period=1,
                   optimizer_steps=4, total_updates=updates)
events = framed(canonical_run(config).events)
best = {}
for _ in range(repeats):
    for digest in (False, True):
        state = initial_state(config)
        began = time.process_time()
        for event in events:
            state, _ = step(state, event)
            if digest:
                state_digest(state)
        spent = time.process_time() - began
        best[digest] = min(best.get(digest, spent), spent)
print(json.dumps({"step_ms": 1e3 * best[False] / updates,
                  "step_digest_ms": 1e3 * best[True] / updates}))
"""

# Runs inside each tree: prints {"kib", "tracked"} per ledger record at the default shape.
LEDGER = r"""
import gc, json, sys
from invar.model import RunConfig
from invar.testing import canonical_run

config = RunConfig(prompts_per_batch=64, group_size=8, max_staleness=1, sync_period=1,
                   optimizer_steps=4, total_updates=20)
ledger = canonical_run(config).state.ledger
seen, size, tracked = set(), 0, 0
todo = [ledger]
while todo:
    obj = todo.pop()
    if id(obj) in seen or isinstance(obj, type) or type(obj).__name__ in ("module", "function"):
        continue
    seen.add(id(obj))
    size += sys.getsizeof(obj)
    tracked += gc.is_tracked(obj)
    todo.extend(gc.get_referents(obj))
print(json.dumps({"kib": size / len(ledger) / 1024, "tracked": tracked / len(ledger)}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_baselines(parser)
    parser.add_argument("--lengths", type=int, nargs="+", default=[40, 400, 2000],
                        help="run lengths in updates")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        compared = trees(args.baseline, Path(scratch))
        print(f"{'tree':<12}{'updates':>9}{'step ms/upd':>13}{'+ digest ms/upd':>17}")
        for length in args.lengths:
            for name, tree in compared.items():
                r = run_json(tree, REPLAY, str(length), str(args.repeats))
                print(f"{name:<12}{length:>9,}{r['step_ms']:>13.3f}{r['step_digest_ms']:>17.3f}",
                      flush=True)
        print(f"\n{'tree':<12}{'ledger KiB/update':>19}{'GC-tracked objects/update':>27}")
        for name, tree in compared.items():
            r = run_json(tree, LEDGER)
            print(f"{name:<12}{r['kib']:>19.1f}{r['tracked']:>27.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
