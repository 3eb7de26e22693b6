"""Rollout (with and without the KV cache) and learner update times, measured side by side.

Default shape: 2 layers, width 64, 64 prompts x 8 samples, 8-digit reversal; the update is
4 minibatches of forward + cotangent backward + AdamW through `TorchLearner` (state digests
included, as in a real run). Repetitions are interleaved so that background load hits all
three measurements alike.

    python benchmarks/bench_rollout_update.py [--threads N] [--repeats N] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
import torch

from invar.runtime.policy import PolicyConfig
from invar.runtime.sampler import generate
from invar.runtime.task import DigitReversal
from invar.runtime.torch_learner import OptimConfig, TorchLearner, state_digest_of


def timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def learner_update(learner: TorchLearner, sequences: np.ndarray, minibatches: list[np.ndarray],
                   response_start: int) -> Callable[[], None]:
    """One update per call: forward, a constant cotangent's backward and AdamW per minibatch
    (the numbers do not matter to the time, the work does)."""
    updates = 0

    def update() -> None:
        nonlocal updates
        for step, rows_of_step in enumerate(minibatches):
            digest, logprobs = learner.forward(updates, step, step, sequences[rows_of_step],
                                               response_start)
            cotangent = np.full_like(logprobs, -1.0 / len(sequences))
            learner.apply_cotangent(updates, step, step, digest, cotangent)
        updates += 1

    return update


def batch_arguments(description: str) -> argparse.ArgumentParser:
    """A parser with the batch's shape (the default task's), repetitions and threads."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt")
    parser.add_argument("--digits", type=int, default=8)
    parser.add_argument("--minibatches", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    return parser


def main() -> None:
    parser = batch_arguments(__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    task = DigitReversal(args.digits)
    config = PolicyConfig()
    learner = TorchLearner(config, OptimConfig(), seed=0, commit_dir=tempfile.mkdtemp(),
                           device=args.device)
    learner.start()
    rows = args.prompts * args.samples
    prompts = np.repeat(task.prompts("train", range(args.prompts)), args.samples, axis=0)
    prompt_tokens = torch.as_tensor(prompts, device=learner.device)
    seeds = list(range(rows))

    def rollout(use_cache: bool) -> torch.Tensor:
        tokens, _ = generate(learner.model, prompt_tokens, task.response_length, seeds,
                             use_cache=use_cache)
        return tokens

    sequences = np.concatenate([prompts, rollout(True).cpu().numpy()], axis=1)
    minibatches = np.array_split(np.arange(rows), args.minibatches)
    update = learner_update(learner, sequences, minibatches, task.prompt_length)

    def digest() -> None:
        state_digest_of(learner.model.state_dict(), learner.optimizer.state_dict())

    measurements = {
        "rollout, KV cache": lambda: rollout(True),
        "rollout, no cache": lambda: rollout(False),
        f"update ({args.minibatches} minibatches)": update,
        "  of which state digests": lambda: [digest() for _ in minibatches],
    }
    for run in measurements.values():  # warm-up: first calls pay for lazy initialisation
        run()
    times = {name: [] for name in measurements}
    for _ in range(args.repeats):
        for name, run in measurements.items():
            times[name].append(timed(run))

    parameters = sum(p.numel() for p in learner.model.parameters())
    print(f"policy: {config.layers} layers, width {config.width}, {parameters:,} parameters; "
          f"device {args.device}, {args.threads} torch threads")
    print(f"batch: {args.prompts} prompts x {args.samples} samples = {rows} rows, "
          f"{task.prompt_length} prompt + {task.response_length} new tokens")
    print(f"{'':28s} {'median ms':>10s} {'min ms':>10s}")
    for name, samples in times.items():
        print(f"{name:28s} {1e3 * statistics.median(samples):10.1f} {1e3 * min(samples):10.1f}")


if __name__ == "__main__":
    main()
