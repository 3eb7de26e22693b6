"""A git revision of this repository as a source tree, for benchmarks that run an older tree
side by side with this one (`bench_gate_speed`, `bench_step_speed`, `bench_driver_share`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def extract(revision: str, into: Path) -> Path:
    """`git archive revision` unpacked into `into` (created if missing); returns `into`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision], check=True,
                             capture_output=True).stdout
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into
