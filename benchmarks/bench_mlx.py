"""MLX against torch on this CPU: learner update, rollout, and where MLX's time goes.

Default shape: the default policy (2 layers, width 64) and task (8-digit reversal: 18-token
sequences, 17 positions through the network, 8 response tokens), 512 samples (64 prompts x
8). Printed side by side in one run:

1. One learner step on all 512 samples (forward, then the cotangent's backward + clipping +
   AdamW + state digest, through the learner API as in a run): torch, and MLX with its stock
   layers or Invar's `Linear`/`GELU` (`fast`), with and without `mx.compile`, on one or two
   CPU streams.
2. One update as the default run does it: score 512 samples, then 4 minibatches of 128.
3. Rollout of 512 samples with the KV cache, in the workers' chunks of 128 rows.
4. Where MLX's time goes: the phases of one MLX step, and each kind of operation at the
   model's shapes, timed in MLX and torch.
5. Batch shapes (time per sample against minibatch rows) and threads (torch's thread count;
   MLX's CPU backend has no thread setting, but evaluates each CPU stream on a thread of its
   own: `MLXLearner(streams=2)` splits each batch over two streams).

Repetitions of the compared variants are interleaved so that background load hits them
alike; medians are printed.

    python benchmarks/bench_mlx.py [--repeats N] [--rows N] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import torch

from invar.runtime import mlx_policy
from invar.runtime import sampler as torch_sampler
from invar.runtime.mlx_learner import MLXLearner, clip_grad_norm, response_logprobs
from invar.runtime.mlx_policy import MLXPolicy
from invar.runtime.mlx_sampler import generate as mlx_generate
from invar.runtime.policy import Policy, PolicyConfig
from invar.runtime.task import DigitReversal
from invar.runtime.torch_learner import OptimConfig, TorchLearner


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def interleaved(cases: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each case; one warm-up call each, then rounds over all cases."""
    for run in cases.values():
        run()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, run in cases.items():
            samples[name].append(timed(run))
    return {name: statistics.median(values) for name, values in samples.items()}


def table(title: str, rows: list[tuple[str, ...]], header: tuple[str, ...]) -> None:
    print(f"\n{title}")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  " + "  ".join(str(c).rjust(w) if i else str(c).ljust(w)
                               for i, (c, w) in enumerate(zip(row, widths))))


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=512, help="samples per update")
    parser.add_argument("--digits", type=int, default=8)
    parser.add_argument("--minibatches", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and variants")
    args = parser.parse_args()
    repeats = 2 if args.quick else args.repeats
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    task = DigitReversal(args.digits)
    config = PolicyConfig()
    start = task.prompt_length
    rows = args.rows
    prompts = np.repeat(task.prompts("train", range(rows // 8 + 1)), 8, axis=0)[:rows]
    seeds = list(range(rows))
    responses = torch_sampler.generate(Policy(config, 0), torch.as_tensor(prompts),
                                       task.response_length, seeds)[0].numpy()
    sequences = np.concatenate([prompts, responses], axis=1)
    rng = np.random.default_rng(0)
    cotangent = rng.normal(size=(rows, task.response_length)) / rows
    print(f"shape: {rows} samples x {sequences.shape[1]} tokens ({start} prompt + "
          f"{task.response_length} response), policy {config.layers} layers x width "
          f"{config.width}; torch {torch.__version__} ({torch.get_num_threads()} thread), "
          f"mlx {mx.__version__} on {mx.default_device()}; {os.cpu_count()} CPUs, load "
          f"average {os.getloadavg()[0]:.1f}")

    def learner_step(learner, rows_of_step, counter=[0]):  # noqa: B006 - a step counter
        def run():
            counter[0] += 1
            u = counter[0]
            digest, _ = learner.forward(u, 0, u, sequences[rows_of_step], start)
            learner.apply_cotangent(u, 0, u, digest, cotangent[rows_of_step])
        return run

    all_rows = np.arange(rows)
    learners: dict[str, object] = {"torch": TorchLearner(config, OptimConfig(), 0,
                                                         tempfile.mkdtemp())}
    # (fast layers, mx.compile, CPU streams)
    variants = [(False, False, 1), (True, False, 1), (True, True, 1), (True, False, 2)]
    if not args.quick:
        variants.insert(1, (False, True, 1))
    first_call = {}
    for fast, compiled, streams in variants:
        name = (f"mlx {'fast' if fast else 'stock'}{' + compile' if compiled else ''}"
                f"{f' + {streams} streams' if streams > 1 else ''}")
        learners[name] = MLXLearner(config, OptimConfig(), 0, tempfile.mkdtemp(),
                                    compile=compiled, fast=fast, streams=streams)
    for name, learner in learners.items():
        learner.start()
        first_call[name] = timed(learner_step(learner, all_rows))  # includes any compiling

    # 1. One step on every sample.
    steps = interleaved(
        {n: learner_step(learner, all_rows) for n, learner in learners.items()}, repeats
    )
    base = steps["torch"]
    table(f"1. one learner step on {rows} samples (forward + backward + clip + AdamW + digest)",
          [(n, ms(t), f"{t / base:.1f}x", ms(first_call[n])) for n, t in steps.items()],
          ("backend", "median", "vs torch", "first call"))
    # The default MLX learner (fast layers, no compile, one stream) for the comparisons below.
    best = "mlx fast"

    # 2. One update of the default run: score, then K minibatches.
    minibatches = np.array_split(all_rows, args.minibatches)

    def update(learner):
        def run():
            learner.score(sequences, start, need_reference=False)
            for part in minibatches:
                learner_step(learner, part)()
        return run

    updates = interleaved({"torch": update(learners["torch"]), best: update(learners[best])},
                          max(2, repeats // 2))
    table(f"2. one update as in the default run (score {rows}, then {args.minibatches} "
          f"minibatches of {rows // args.minibatches})",
          [(n, ms(t), f"{t / updates['torch']:.1f}x") for n, t in updates.items()],
          ("backend", "median", "vs torch"))

    # 3. Rollout with the KV cache, in worker-sized chunks.
    torch_policy = learners["torch"].model
    mlx_fast = MLXPolicy.initial(config, 0, fast=True)
    mlx_stock = MLXPolicy.initial(config, 0, fast=False)
    chunks = [slice(i, i + 128) for i in range(0, rows, 128)]

    def torch_rollout():
        for c in chunks:
            torch_sampler.generate(torch_policy, torch.as_tensor(prompts[c]),
                                   task.response_length, seeds[c])

    def mlx_rollout(policy):
        return lambda: [mlx_generate(policy, prompts[c], task.response_length, seeds[c])
                        for c in chunks]

    rollouts = interleaved({"torch": torch_rollout, "mlx stock": mlx_rollout(mlx_stock),
                            "mlx fast": mlx_rollout(mlx_fast)}, repeats)
    table(f"3. rollout of {rows} samples x {task.response_length} tokens, KV cache, "
          f"chunks of 128",
          [(n, ms(t), f"{t / rollouts['torch']:.1f}x") for n, t in rollouts.items()],
          ("sampler", "median", "vs torch"))

    # 4a. Phases of one MLX step (uncompiled, so each phase can be evaluated on its own).
    for fast in (False, True):
        profile_phases(config, sequences, cotangent, start, fast, repeats)
    # 4b. Operations at the model's shapes.
    profile_operations(config, rows, sequences.shape[1] - 1, repeats)

    # 5. Batch shapes and threads.
    shapes = []
    for part in (64, 128, 256, 512):
        if part > rows:
            continue
        subset = np.arange(part)
        times = interleaved({n: learner_step(learners[n], subset) for n in ("torch", best)},
                            max(2, repeats // 2))
        shapes.append((str(part), f"{times['torch'] / part * 1e6:.0f} us",
                       f"{times[best] / part * 1e6:.0f} us",
                       f"{times[best] / times['torch']:.1f}x"))
    table("5a. batch shape: step time per sample", shapes,
          ("rows", "torch", best, "ratio"))
    threads = []
    for count in sorted({1, 2, os.cpu_count() or 1}):
        torch.set_num_threads(count)
        threads.append((f"torch, {count} thread(s)",
                        ms(interleaved({"t": learner_step(learners["torch"], all_rows)},
                                       max(2, repeats // 2))["t"])))
    torch.set_num_threads(1)
    for streams in (1, 2):
        name = "mlx fast" + (f" + {streams} streams" if streams > 1 else "")
        threads.append((f"mlx fast, {streams} CPU stream(s), one thread each",
                        ms(interleaved({"m": learner_step(learners[name], all_rows)},
                                       max(2, repeats // 2))["m"])))
    table("5b. threads (one step on all samples)", threads, ("configuration", "median"))


def profile_phases(config, sequences, cotangent, start, fast, repeats) -> None:
    learner = MLXLearner(config, OptimConfig(), 0, tempfile.mkdtemp(), compile=False, fast=fast)
    learner.start()
    model = learner.model
    tokens = mx.array(sequences.astype(np.int32))
    cot = mx.array(cotangent, dtype=mx.float64)
    gradient_fn = nn.value_and_grad(
        model, lambda: (response_logprobs(model, tokens, start) * cot).sum())
    gradients = gradient_fn()[1]
    mx.eval(gradients)
    phases = {
        "forward (log-probs, float64 head)": lambda: mx.eval(
            response_logprobs(model, tokens, start)),
        "forward + backward (value_and_grad)": lambda: mx.eval(gradient_fn()),
        "clip gradient norm": lambda: mx.eval(clip_grad_norm(gradients, 1.0)),
        "AdamW update": lambda: learner._apply_gradients(gradients),
        "state digest (to numpy + blake2b)": learner._compute_digest,
    }
    results = interleaved(phases, repeats)
    total = results["forward (log-probs, float64 head)"] + sum(
        t for n, t in results.items() if not n.startswith("forward (log"))
    table(f"4a. phases of one MLX step, {'fast' if fast else 'stock'} layers, uncompiled "
          f"(a step = forward, then forward + backward again under vjp, clip, AdamW, digest)",
          [(n, ms(t), f"{t / total:.0%}") for n, t in results.items()],
          ("phase", "median", "share"))


def profile_operations(config, rows, positions, repeats) -> None:
    """Each kind of operation at the model's shapes, MLX against torch (1 thread)."""
    rng = np.random.default_rng(0)
    n = rows * positions
    width, hidden, heads = config.width, config.mlp_ratio * config.width, config.heads

    def pair(shape):
        array = rng.normal(size=shape).astype(np.float32)
        return mx.array(array), torch.from_numpy(array)

    x_m, x_t = pair((n, width))
    w_m, w_t = pair((hidden, width))
    g_m, g_t = pair((n, hidden))
    h_m, h_t = pair((n, hidden))
    s_m, s_t = pair((rows, heads, positions, positions))
    logits_m = mx.array(rng.normal(size=(rows, 8, config.vocab_size)), dtype=mx.float64)
    ln = nn.LayerNorm(width)
    ln_t = torch.nn.LayerNorm(width)
    idx = rng.integers(0, config.vocab_size, size=(rows, positions))
    emb = nn.Embedding(config.vocab_size, width)
    emb_t = torch.nn.Embedding(config.vocab_size, width)
    idx_m, idx_t = mx.array(idx.astype(np.int32)), torch.as_tensor(idx)
    emb_grad = mx.grad(lambda w: (mx.take(w, idx_m, axis=0) * 1.0).sum())

    def torch_grad(f, t):
        t = t.detach().requires_grad_(True)
        f(t).sum().backward()
        return t.grad

    operations = [
        (f"linear fwd x@W.T [{n}x{width}]x[{width}x{hidden}], stock (NT)",
         lambda: mx.eval(x_m @ w_m.T), lambda: x_t @ w_t.T),
        ("linear fwd, contiguous W.T (fast Linear)",
         lambda: mx.eval(x_m @ mx.contiguous(w_m.T)), None),
        ("linear bwd dx = g @ W", lambda: mx.eval(g_m @ w_m), lambda: g_t @ w_t),
        ("linear bwd dW = g.T @ x", lambda: mx.eval(g_m.T @ x_m), lambda: g_t.T @ x_t),
        (f"GELU fwd [{n}x{hidden}], stock (mx.erf)", lambda: mx.eval(nn.gelu(h_m)),
         lambda: torch.nn.functional.gelu(h_t)),
        ("GELU fwd, fast (rational erf)", lambda: mx.eval(mlx_policy.gelu(h_m)), None),
        ("GELU fwd + bwd, stock", lambda: mx.eval(mx.grad(lambda a: nn.gelu(a).sum())(h_m)),
         lambda: torch_grad(torch.nn.functional.gelu, h_t)),
        ("GELU fwd + bwd, fast",
         lambda: mx.eval(mx.grad(lambda a: mlx_policy.gelu(a).sum())(h_m)), None),
        ("erf alone", lambda: mx.eval(mx.erf(h_m)), lambda: torch.erf(h_t)),
        ("exp alone", lambda: mx.eval(mx.exp(h_m)), lambda: torch.exp(h_t)),
        ("add alone", lambda: mx.eval(h_m + 1.0), lambda: h_t + 1.0),
        (f"attention softmax [{rows}x{heads}x{positions}x{positions}]",
         lambda: mx.eval(mx.softmax(s_m, axis=-1)), lambda: s_t.softmax(-1)),
        (f"LayerNorm [{n}x{width}]", lambda: mx.eval(ln(x_m)), lambda: ln_t(x_t)),
        ("embedding bwd (scatter-add)", lambda: mx.eval(emb_grad(emb.weight)),
         lambda: torch_grad(lambda w: w[idx_t], emb_t.weight)),
        (f"float64 log-softmax [{rows}x8x{config.vocab_size}]",
         lambda: mx.eval(logits_m - mx.logsumexp(logits_m, axis=-1, keepdims=True)),
         lambda: torch.log_softmax(torch.zeros(rows, 8, config.vocab_size,
                                               dtype=torch.float64), -1)),
    ]
    cases = {}
    for name, mlx_run, torch_run in operations:
        cases[("mlx", name)] = mlx_run
        if torch_run is not None:
            cases[("torch", name)] = torch_run
    results = interleaved(cases, repeats)
    rows_out = []
    for name, _, _torch_run in operations:
        mlx_time = results[("mlx", name)]
        torch_time = results.get(("torch", name))
        rows_out.append((name, ms(mlx_time), "" if torch_time is None else ms(torch_time),
                         "" if torch_time is None else f"{mlx_time / torch_time:.0f}x"))
    table("4b. operations at the model's shapes (one call; a step runs each several times)",
          rows_out, ("operation", "mlx", "torch", "ratio"))


if __name__ == "__main__":
    main()
