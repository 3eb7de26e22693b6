"""The default task learned by the built-in policy, by GPT-2 through transformers with the
built-in's architecture, and by a Llama of the same width and depth (README's example config),
all random-weight: reward per update and held-out reward side by side, written to
reports/hf_learning.md.

    python benchmarks/hf_learning.py [--updates 120] [--out reports/hf_learning.md]

Each policy is trained by `invar train` (asynchronous, S = 1, the default configuration
otherwise) in a run directory under a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_hf_policy import provenance  # benchmarks/ is the script's folder

LLAMA = ("policy.kind=\"transformers\"",
         "policy.config={model_type = \"llama\", hidden_size = 64, intermediate_size = 256, "
         "num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 4, "
         "max_position_embeddings = 64}")
GPT2 = ("policy.kind=\"transformers\"",
        "policy.config={model_type = \"gpt2\", n_embd = 64, n_layer = 2, n_head = 4, "
        "n_inner = 256, n_positions = 64, activation_function = \"gelu\", "
        "tie_word_embeddings = false}")
POLICIES = {"built-in GPT": (), "transformers GPT-2 (the built-in's architecture)": GPT2,
            "transformers Llama (README's example)": LLAMA}


def train(overrides: tuple[str, ...], run_dir: Path, updates: int) -> list[dict]:
    """The metrics rows of an `invar train` run with `overrides`."""
    settings = (*overrides, f"protocol.total_updates={updates}", "output.progress=false",
                "output.tensorboard=false", f"output.run_dir={json.dumps(str(run_dir))}")
    command = [sys.executable, "-m", "invar.runtime.cli", "train",
               *(arg for item in settings for arg in ("--set", item))]
    subprocess.run(command, check=True)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=120)
    parser.add_argument("--out", type=Path, default=Path("reports/hf_learning.md"))
    args = parser.parse_args()
    load_at_start = os.getloadavg()[0]
    runs = {}
    with tempfile.TemporaryDirectory() as scratch:
        for index, (name, overrides) in enumerate(POLICIES.items()):
            runs[name] = train(overrides, Path(scratch) / f"run-{index}", args.updates)
    rewards = {name: [r["reward"] for r in rows if r["kind"] == "update"]
               for name, rows in runs.items()}
    heldout = {name: {r["version"]: r["heldout_reward"] for r in rows
                      if r["kind"] == "evaluation"} for name, rows in runs.items()}
    seconds = {name: sum(r["seconds"] for r in rows if r["kind"] == "update")
               for name, rows in runs.items()}
    names = list(POLICIES)
    lines = [
        "# The default task learned by the built-in policy and by transformers policies",
        "",
        f"`python benchmarks/hf_learning.py --updates {args.updates}`: `invar train` with the "
        "default configuration (reverse 8 digits, 64 prompts x 8 samples, 4 optimizer steps "
        "per update, S = 1, lr 1e-3, seed 0) with three random-weight policies: the built-in "
        "one (2 layers, width 64, 4 heads, MLP 256, learned positions), GPT-2 through "
        "transformers with exactly that architecture (`policy.kind = \"transformers\"`; its "
        "own initialisation), and README's example, a Llama of the same width, depth and heads "
        "(rotary positions, SwiGLU MLP, RMSNorm). " + provenance(load_at_start),
        "",
        "| | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
        "| seconds of updates | " + " | ".join(f"{seconds[n]:.1f}" for n in names) + " |",
        "",
        "Held-out greedy reward by version:",
        "",
        "| version | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
        *(f"| {version} | " + " | ".join(f"{heldout[n].get(version, float('nan')):.3f}"
                                         for n in names) + " |"
          for version in sorted(set().union(*heldout.values()))),
        "",
        "Sampled reward per update (mean over the batch's 512 samples):",
        "",
        "| update | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
        *(f"| {update} | " + " | ".join(f"{rewards[n][update]:.3f}" for n in names) + " |"
          for update in range(args.updates)),
    ]
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
