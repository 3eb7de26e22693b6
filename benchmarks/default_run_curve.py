"""The default run's held-out curve: `invar train` with every default, its greedy held-out
reward at each evaluated version, as README.md states it ("Held-out greedy reward goes ...").

    python benchmarks/default_run_curve.py       # writes reports/default_run_curve.json

The curve is what the code computes, not how fast: on a CPU a run and the serial execution of
its schedule end with identical weights, so any machine and load give the same curve (the
wall time is recorded, not used). Rerun it when a change alters what the default run computes.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "reports" / "default_run_curve.json"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="invar-default-run-") as scratch:
        run_dir = Path(scratch) / "default"
        sets = [f"output.run_dir={json.dumps(str(run_dir))}", "output.progress=false",
                "output.tensorboard=false"]
        began = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "invar.runtime.cli", "train",
                               *(arg for item in sets for arg in ("--set", item))],
                              cwd=ROOT, capture_output=True, text=True, timeout=3600)
        if done.returncode:
            raise SystemExit(f"invar train failed ({done.returncode}):\n{done.stderr[-3000:]}")
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        wall = time.perf_counter() - began
    import torch
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    report = {
        "command": "python benchmarks/default_run_curve.py",
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__, "commit": commit,
                    "load_after": list(os.getloadavg())},
        "wall_seconds": wall,
        "evaluations": [{"version": row["version"], "heldout_reward": row["heldout_reward"]}
                        for row in rows if row["kind"] == "evaluation"],
    }
    REPORT.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {REPORT}: " + ", ".join(f"{e['heldout_reward']:.3f} ({e['version']})"
                                          for e in report["evaluations"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
