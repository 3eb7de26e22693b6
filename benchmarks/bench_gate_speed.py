"""The Invar model's speed per gate bound, before and after: this tree against a git revision.

    .venv/bin/python benchmarks/bench_gate_speed.py --baseline 77d59c3
    .venv/bin/python benchmarks/bench_gate_speed.py --baseline 77d59c3 --only wire --rounds 3

For every bound of `spec/gate/` that the baseline also has, `invar-check BOUND` (its own
`[check]` options, one process) runs in the baseline's tree (extracted with `git archive`) and
in this one, interleaved round by round so that the load of a shared machine falls on both
alike. Printed side by side (the best round of each): distinct states, the search's seconds
and distinct states per second (as `invar-check` reports them: the search alone, without the
process's start), the CPU seconds of the whole process, and the speed-up in states per second.
Equal state counts show that both explore the same model; a bound whose counts differ is
marked.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from git_trees import ROOT, extract


def check(tree: Path, bound: Path, out: Path) -> tuple[int, float, float]:
    """(distinct states, search seconds, process CPU seconds) of one `invar-check` run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "checker.cli", str(bound), "--quiet", "--json",
                    str(out)], cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                   check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result = json.loads(out.read_text())
    return result["distinct_states"], result["duration_s"], cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="git revision to compare against")
    parser.add_argument("--only", action="append", default=[], help="bound name (repeatable)")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds (best kept)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "base").mkdir()
        base = extract(args.baseline, Path(tmp) / "base")
        names = sorted(p.stem for p in (ROOT / "spec" / "gate").glob("*.toml")
                       if (base / "spec" / "gate" / p.name).exists())
        names = [n for n in names if not args.only or n in args.only]
        print(f"{'bound':<18}{'distinct':>10}{'search s':>16}{'states/s':>18}"
              f"{'process CPU s':>16}{'speed-up':>10}")
        print(f"{'':<18}{'':>10}{'base':>8}{'now':>8}{'base':>9}{'now':>9}{'base':>8}{'now':>8}")
        for name in names:
            best: dict[str, tuple[int, float, float]] = {}
            for _ in range(args.rounds):
                for label, tree in (("base", base), ("now", ROOT)):
                    run = check(tree, tree / "spec" / "gate" / f"{name}.toml",
                                Path(tmp) / f"{label}.json")
                    if label not in best or run[1] < best[label][1]:
                        best[label] = run
            (nb, sb, cb), (nn, sn, cn) = best["base"], best["now"]
            same = "" if nb == nn else f"  (counts differ: {nb} vs {nn})"
            print(f"{name:<18}{nn:>10,}{sb:>8.1f}{sn:>8.1f}{nb / sb:>9,.0f}{nn / sn:>9,.0f}"
                  f"{cb:>8.1f}{cn:>8.1f}{(nn / sn) / (nb / sb):>9.1f}x{same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
