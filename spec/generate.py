"""Regenerate the computed parts of spec/PROTOCOL.md from the code (nothing here is hand-typed).

    .venv/bin/python spec/generate.py            # print the worked tables and the phase table
    .venv/bin/python spec/generate.py --write    # also rewrite spec/phases.dot (and .svg if `dot`)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from invar.model import schedule, transitions  # noqa: E402
from invar.model.config import RunConfig  # noqa: E402

CONFIGS = (
    dict(max_staleness=1, sync_period=1, total_updates=6),
    dict(max_staleness=2, sync_period=3, total_updates=9),
    dict(max_staleness=3, sync_period=2, checkpoint_every=5, total_updates=12),
    dict(max_staleness=11, sync_period=12, eval_every=10, total_updates=30),
)


def worked_table(**declared: int) -> str:
    config = RunConfig(prompts_per_batch=1, group_size=2, optimizer_steps=1, **declared).validate()
    pub = schedule.published_versions(config)
    report = schedule.report(config)
    used = sorted({schedule.gen_version(config, b) for b in range(config.total_updates)})
    lines = [
        "Declared: " + ", ".join(f"{k}={v}" for k, v in declared.items())
        + f" (max_inflight_batches={config.max_inflight_batches})",
        "",
        f"Pub = {{{', '.join(map(str, pub))}}}; hard boundaries = "
        f"{{{', '.join(map(str, sorted(schedule.hard_boundaries(config))))}}}; "
        f"versions that generate a batch = {{{', '.join(map(str, used))}}}",
        "",
        "| b | b−S | min{v∈Pub : v ≥ b−S} | last boundary ≤ b | gen_version(b) | staleness(b) |",
        "|---|---|---|---|---|---|",
    ]
    for b in range(config.total_updates):
        lowest = max(0, b - config.max_staleness)
        oldest = next(v for v in pub if v >= lowest)
        lines.append(f"| {b} | {b - config.max_staleness} | {oldest} | "
                     f"{schedule.last_boundary(config, b)} | {schedule.gen_version(config, b)} | "
                     f"{schedule.staleness(config, b)} |")
    lines += ["", f"report: effective_staleness={report.effective_staleness}, "
              f"effective_sync_period={report.effective_sync_period}"]
    lines += [f"- note: {note}" for note in report.notes]
    return "\n".join(lines) + "\n"


def main() -> None:
    for declared in CONFIGS:
        print(worked_table(**declared))
    plan_config = RunConfig(prompts_per_batch=2, group_size=3, optimizer_steps=4, seed=0)
    for u in (0, 1):
        print(f"minibatch_plan(B=2,G=3,K=4,seed=0, u={u}) = "
              f"{schedule.minibatch_plan(plan_config, u)}")
    for request in (schedule.RequestId(0, 0, 0), schedule.RequestId(0, 0, 1),
                    schedule.RequestId(1, 0, 0)):
        print(f"sampling_seed(seed=0, {tuple(request)}) = "
              f"{schedule.sampling_seed(plan_config, request)}")
    print()
    print(transitions.to_markdown())
    if "--write" in sys.argv:
        here = Path(__file__).resolve().parent
        (here / "phases.dot").write_text(transitions.to_dot())
        if shutil.which("dot"):
            subprocess.run(["dot", "-Tsvg", str(here / "phases.dot"), "-o",
                            str(here / "phases.svg")], check=True)


if __name__ == "__main__":
    main()
