"""A git revision of this repository as a source tree, for benchmarks that run an older tree
side by side with this one (`bench_gate_speed`, `bench_step_speed`, `bench_driver_share`,
`bench_long_run`)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def extract(revision: str, into: Path) -> Path:
    """`git archive revision` unpacked into `into` (created if missing); returns `into`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision], check=True,
                             capture_output=True).stdout
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def add_baselines(parser: argparse.ArgumentParser) -> None:
    """`--baseline REV` (repeatable): the git revisions run beside this tree."""
    parser.add_argument("--baseline", action="append", default=[],
                        help="git revision to compare against (repeatable)")


def trees(revisions: list[str], scratch: Path) -> dict[str, Path]:
    """Each revision extracted under `scratch`, then this tree (labelled "this tree")."""
    extracted = {rev: extract(rev, scratch / rev) for rev in revisions}
    return {**extracted, "this tree": ROOT}


def run_json(tree: Path, code: str, *args: str) -> dict[str, float]:
    """`python -c code args` in `tree` (a fresh process importing that tree's invar): the JSON
    object it prints."""
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=tree,
                         env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                         check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out)
    return result
