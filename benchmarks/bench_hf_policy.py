"""Time per update of a transformers policy against the built-in policy of the same size.

Three policies side by side, in one process, repetitions interleaved so that background load
hits them alike: the built-in GPT (2 layers, width 64, 4 heads, MLP 4x), GPT-2 through
transformers with exactly that architecture and parameter count (the cost of going through
transformers alone), and a Llama of the same width, depth and heads (SwiGLU MLP, RMSNorm,
rotary positions: what a user would bring). One update is what the run does per batch of the
default task: the rollout of 64 prompts x 8 samples (KV cache, fixed shape) and the learner's
4 minibatches of forward + cotangent backward + AdamW through `TorchLearner`.

    python benchmarks/bench_hf_policy.py [--repeats N] [--threads N] [--out reports/hf_benchmark.md]
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from bench_rollout_update import batch_arguments, learner_update, timed  # benchmarks/: on sys.path

from invar.runtime.policy import PolicyConfig
from invar.runtime.sampler import generate
from invar.runtime.task import DigitReversal
from invar.runtime.torch_learner import OptimConfig, TorchLearner

WIDTH, LAYERS, HEADS, MLP = 64, 2, 4, 256
POLICIES = {
    "built-in GPT": PolicyConfig(),
    "transformers GPT-2 (same architecture)": PolicyConfig(kind="transformers", config={
        "model_type": "gpt2", "n_embd": WIDTH, "n_layer": LAYERS, "n_head": HEADS,
        "n_inner": MLP, "n_positions": 64, "activation_function": "gelu",
        "tie_word_embeddings": False}),
    "transformers Llama (same width, depth, heads)": PolicyConfig(kind="transformers", config={
        "model_type": "llama", "hidden_size": WIDTH, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "intermediate_size": MLP,
        "max_position_embeddings": 64}),
}


def update_runner(config: PolicyConfig, task: DigitReversal, prompts: int, samples: int,
                  minibatches: int) -> tuple[Callable[[], None], Callable[[], None], int]:
    """(rollout, learner update, parameter count) of one batch for the policy `config`."""
    learner = TorchLearner(config, OptimConfig(), seed=0, commit_dir=tempfile.mkdtemp())
    learner.start()
    rows = prompts * samples
    prompt_rows = np.repeat(task.prompts("train", range(prompts)), samples, axis=0)
    prompt_tokens = torch.as_tensor(prompt_rows)
    seeds = list(range(rows))

    def rollout() -> torch.Tensor:
        tokens, _ = generate(learner.model, prompt_tokens, task.response_length, seeds)
        return tokens

    sequences = np.concatenate([prompt_rows, rollout().numpy()], axis=1)
    update = learner_update(learner, sequences, np.array_split(np.arange(rows), minibatches),
                            task.prompt_length)
    return rollout, update, sum(p.numel() for p in learner.model.parameters())


def provenance(load_at_start: float) -> str:
    """When, on which commit and under what load a report was written (reports/README.md)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False, cwd=Path(__file__).parent
                          ).stdout.strip() or "unknown"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return (f"Written {when} on commit {head}; 1-minute load average {load_at_start:.2f} at "
            f"the start, {os.getloadavg()[0]:.2f} at the end (2-core machine, shared).")


def main() -> None:
    load_at_start = os.getloadavg()[0]
    parser = batch_arguments(__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("reports/hf_benchmark.md"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)  # as `invar train` runs the learner
    task = DigitReversal(args.digits)

    runners = {name: update_runner(config, task, args.prompts, args.samples, args.minibatches)
               for name, config in POLICIES.items()}
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeats + 1):  # the first round is a warm-up, not recorded
        for name, (rollout, update, _) in runners.items():
            for part, run in (("rollout", rollout), ("update", update)):
                times.setdefault((name, part), []).append(timed(run))

    def median_ms(name: str, part: str) -> float:
        return 1e3 * statistics.median(times[(name, part)][1:])

    builtin = next(iter(POLICIES))
    reference = median_ms(builtin, "rollout") + median_ms(builtin, "update")
    lines = [
        "# A transformers policy against the built-in policy, time per update",
        "",
        f"`python benchmarks/bench_hf_policy.py --repeats {args.repeats} --threads "
        f"{args.threads}` on {platform.machine()} CPU ({torch.get_num_threads()} torch "
        f"thread(s), torch {torch.__version__}, transformers "
        f"{__import__('transformers').__version__}), medians of {args.repeats} interleaved "
        f"repetitions after a warm-up. {provenance(load_at_start)}",
        "",
        f"One update of the default task: rollout of {args.prompts} prompts x {args.samples} "
        f"samples ({task.prompt_length} prompt + {task.response_length} new tokens, KV cache, "
        f"fixed shape), then {args.minibatches} minibatches of forward + cotangent backward + "
        f"AdamW through `TorchLearner` (state digests included).",
        "",
        "| policy | parameters | rollout ms | learner update ms | total ms | total / built-in |",
        "|---|---|---|---|---|---|",
    ]
    for name, (_, _, parameters) in runners.items():
        rollout, update = median_ms(name, "rollout"), median_ms(name, "update")
        lines.append(f"| {name} | {parameters:,} | {rollout:.0f} | {update:.0f} | "
                     f"{rollout + update:.0f} | {(rollout + update) / reference:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
