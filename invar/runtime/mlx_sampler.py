"""Autoregressive sampling in MLX, with the guarantees of `invar.runtime.sampler`:

* The log-prob recorded for a sampled token is taken from the very distribution the token was
  drawn from (after temperature, top-k and top-p renormalisation, in float64).
* Row i's randomness is a function of `seeds[i]` alone: the Gumbel noise is
  `invar.runtime.sampler.gumbel_noise` itself (drawn on the CPU by torch, converted), so the
  MLX and torch samplers meet the same noise and, given equal weights, draw the same tokens
  (up to float rounding of the logits, which the two frameworks compute in different orders).

Float64 work runs on the CPU stream, the one MLX device with float64 (on Apple silicon the
network itself runs on the default device, the GPU).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from invar.runtime.mlx_policy import MLXKVCache, MLXPolicy, float64_stream
from invar.runtime.padding import Prompts
from invar.runtime.policy_config import PolicyConfig

if TYPE_CHECKING:
    from invar.runtime.worker import WorkerArgs


def sampling_logprobs(
    logits: mx.array, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> mx.array:
    """Float64 log-probs [n, V] of the distribution sampled from; -inf outside its support.

    The same order and tie rules as the torch `sampling_logprobs`: temperature, then top-k
    (ties with the k-th logit kept), then top-p (the smallest set of most likely tokens whose
    mass reaches `top_p`, ties with the last one kept), renormalising after each cut.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be non-negative (0 disables it), got {top_k}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    with float64_stream():
        minus_inf = mx.array(-math.inf, dtype=mx.float64)
        logprobs = _log_softmax(logits.astype(mx.float64) / temperature)
        vocab = logprobs.shape[-1]
        if 0 < top_k < vocab:
            kth_best = mx.sort(logprobs, axis=-1)[..., vocab - top_k : vocab - top_k + 1]
            logprobs = _log_softmax(mx.where(logprobs < kth_best, minus_inf, logprobs))
        if top_p < 1:
            ranked = -mx.sort(-logprobs, axis=-1)  # descending
            ranked_probs = mx.exp(ranked)
            mass_before = mx.cumsum(ranked_probs, axis=-1) - ranked_probs
            kept = mass_before < top_p  # the best token always is
            least_kept = mx.min(mx.where(kept, ranked, mx.array(math.inf, dtype=mx.float64)),
                                axis=-1, keepdims=True)
            logprobs = _log_softmax(mx.where(logprobs < least_kept, minus_inf, logprobs))
        return logprobs


def _log_softmax(x: mx.array) -> mx.array:
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def gumbel_noise(seeds: Sequence[int], new_tokens: int, vocab_size: int) -> np.ndarray:
    """Float64 Gumbel noise [n, new_tokens, V]: exactly the torch sampler's, as numpy."""
    from invar.runtime.sampler import gumbel_noise as torch_gumbel_noise

    return torch_gumbel_noise(seeds, new_tokens, vocab_size).numpy()


def generate(
    policy: MLXPolicy,
    prompts: np.ndarray | mx.array,
    new_tokens: int,
    seeds: Sequence[int] | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    greedy: bool = False,
    use_cache: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Continue each prompt row [n, P] by `new_tokens` tokens.

    Returns `(tokens [n, new_tokens] int64, behavior_logprobs [n, new_tokens] float64)` as
    numpy arrays. Sampling draws `argmax(logprobs + gumbel)`, an exact sample of
    `sampling_logprobs`; greedy decoding takes the argmax of the raw logits and records
    log-prob 0. `use_cache=False` recomputes the whole prefix at every step (the reference
    the KV cache is checked against).
    """
    prompts = mx.array(np.asarray(prompts, dtype=np.int32)) if not isinstance(
        prompts, mx.array) else prompts.astype(mx.int32)
    rows = prompts.shape[0]
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be positive, got {new_tokens}")
    if prompts.shape[1] + new_tokens > policy.config.max_len:
        raise ValueError(
            f"{prompts.shape[1]} prompt + {new_tokens} new tokens exceed max_len "
            f"{policy.config.max_len}"
        )
    noise = None
    if not greedy:
        if seeds is None or len(seeds) != rows:
            given = "none" if seeds is None else len(seeds)
            raise ValueError(f"need one seed per prompt row ({rows}), got {given}")
        noise = mx.array(gumbel_noise(seeds, new_tokens, policy.config.vocab_size))

    sequences = prompts
    cache: MLXKVCache | None = None
    step_input = prompts  # with the cache, only tokens not yet seen go through the network
    chosen_tokens, chosen_logprobs = [], []
    for position in range(new_tokens):
        if use_cache:
            logits, cache = policy.forward_with_cache(step_input, cache)
        else:
            logits = policy(sequences)
        last = logits[:, -1]
        if noise is None:
            token = mx.argmax(last, axis=-1).astype(mx.int32)
            logprob = mx.zeros((rows,), dtype=mx.float64, stream=mx.cpu)
        else:
            logprobs = sampling_logprobs(last, temperature, top_k, top_p)
            with float64_stream():
                token = mx.argmax(logprobs + noise[:, position], axis=-1).astype(mx.int32)
                logprob = mx.take_along_axis(logprobs, token[:, None], axis=-1)[:, 0]
        step_input = token[:, None]
        sequences = mx.concatenate([sequences, step_input], axis=1)
        # Evaluate step by step: the next step's input depends on this token anyway, and the
        # cache's graph would otherwise grow with every position.
        mx.eval(step_input, logprob, *(() if cache is None else cache.keys + cache.values))
        chosen_tokens.append(token)
        chosen_logprobs.append(logprob)
    tokens = np.array(mx.stack(chosen_tokens, axis=1)).astype(np.int64)
    return tokens, np.array(mx.stack(chosen_logprobs, axis=1))


class MLXSampler:
    """`learner.backend = "mlx"`'s rollout sampler (`invar.runtime.registry.LEARNERS`): the
    built-in policy in MLX, loading the torch weights every backend publishes, converted."""

    def __init__(self, args: WorkerArgs) -> None:
        self.policy = MLXPolicy(PolicyConfig(**args.policy))
        self.args = args

    def load(self, state: Mapping[str, Any]) -> None:
        self.policy.load_torch_state_dict(state)  # the same names and shapes, converted

    def generate(self, prompts: Prompts, response_length: int, seeds: Sequence[int],
                 eos: int | None) -> tuple[np.ndarray, np.ndarray]:
        if prompts.padded:
            raise ValueError("the MLX sampler does not mask padded prompts: give every "
                             "prompt task.prompt_length tokens (or use the torch backend)")
        # No early stop at `eos`: the worker cuts each response at its first EOS.
        return generate(self.policy, prompts.tokens, response_length, seeds,
                        temperature=self.args.temperature, top_k=self.args.top_k,
                        top_p=self.args.top_p)
