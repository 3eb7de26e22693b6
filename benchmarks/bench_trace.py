"""Benchmark of trace validation (`invar-check --trace`): events per second, and the ratio
against the run that wrote the journal.

    python benchmarks/bench_trace.py RUN_DIR [--json reports/trace_speed.json]
                                                    # a real run: its journal and summary.json
    python benchmarks/bench_trace.py                # a default-sized journal written from the
                                                    # canonical run (120 updates x 512
                                                    # samples, replies framed)

Validation replays every event through `shell.deliver`, compares both digests and checks
every state and transition invariant (incrementally: `IncrementalInvariants`); it must be
linear in the journal and at least 10x faster than the run. The run's time is summary.json's
`wall_seconds` (every life of the run); without a run directory there is none to compare.
With a run directory, re-scoring every journalled reward with the task's verifier
(`--rescore`, the default for the built-in tasks) is timed too, building the verifier included.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def canonical_journal(path: Path, overrides: list[str]) -> Path:
    """The journal a driver writes for the canonical run of the default protocol (replies in
    frames, as the runtime's workers send them)."""
    from invar.runtime import journal
    from invar.runtime.config import load_config
    from invar.testing import canonical_run, framed
    config = load_config(None, overrides).protocol
    journal.write_events(path, config, framed(canonical_run(config).events))
    return path


def validate(path: Path) -> tuple[int, float, float]:
    """(events, seconds reading, seconds replaying with every invariant)."""
    from invar.runtime import journal
    began = time.perf_counter()
    contents = journal.read_contents(path)
    read = time.perf_counter() - began
    began = time.perf_counter()
    events = 0
    for _, _, after in journal.replay(contents.config, contents.entries, check_invariants=True):
        if isinstance(after, journal.Departure):
            raise SystemExit(f"departure at line {after.line}: {after.reason}")
        events += 1
    return events, read, time.perf_counter() - began


def rescore(path: Path) -> tuple[int, float] | None:
    """(rewards re-scored, seconds: building the verifier the journal binds, then scoring);
    None: the journal binds no task (a canonical one)."""
    from invar import journal_format
    from invar.runtime.rescore import verifier
    contents = journal_format.read_contents(path)
    if contents.binding.settings is None:
        return None
    began = time.perf_counter()
    built = verifier(contents, path.parent)
    assert built.score is not None
    found = journal_format.rescore(contents.config, contents.entries, built.score,
                                   built.failure_reward, start=contents.start)
    if found.mismatch is not None:
        raise SystemExit(f"line {found.mismatch.line}: {found.mismatch}")
    return found.scored, time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", nargs="?", help="a run directory (default: a canonical "
                                                   "journal of the default protocol)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="protocol overrides for the canonical journal")
    parser.add_argument("--json", type=Path,
                        help="also write the figures here (reports/trace_speed.json is the "
                             "default run's, which the README quotes)")
    args = parser.parse_args()
    run_seconds = None
    if args.run_dir:
        path = Path(args.run_dir) / "journal.jsonl"
        summary = Path(args.run_dir) / "summary.json"
        if summary.exists():
            run_seconds = json.loads(summary.read_text())["wall_seconds"]
    else:
        path = Path(tempfile.mkdtemp()) / "journal.jsonl"
        began = time.perf_counter()
        canonical_journal(path, args.set)
        print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB) in "
              f"{time.perf_counter() - began:.1f} s")
    events, read, replay = validate(path)
    total = read + replay
    print(f"{events} events: read {read:.2f} s, replay with invariants {replay:.2f} s, "
          f"total {total:.2f} s, {events / total:,.0f} events/s")
    if run_seconds is not None:
        print(f"the run took {run_seconds:.1f} s: validation is {run_seconds / total:.1f}x "
              f"faster than the run")
    figures = {"events": events, "read_seconds": read, "replay_seconds": replay,
               "run_seconds": run_seconds}
    rescored = rescore(path)
    if rescored is not None:
        scored, seconds = rescored
        figures.update(rescored=scored, rescore_seconds=seconds)
        print(f"re-scoring {scored} rewards: {seconds:.2f} s, {seconds / total:.1f}x the "
              f"validation")
        if run_seconds is not None:
            print(f"validation with re-scoring is {run_seconds / (total + seconds):.1f}x faster "
                  f"than the run")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
