"""The policy of `invar.runtime.policy`, written in MLX, and weight conversion both ways.

The same GPT-style decoder (pre-LN blocks, hand-written causal attention, learned positions,
exact-erf GELU, LayerNorm eps 1e-5, no dropout) with the same parameter names and shapes as
the torch `Policy`, so a torch state dict converts to MLX parameters and back without any
renaming, bit for bit:

    torch name                          MLX parameter path (tree_flatten of parameters())
    token_embedding.weight              token_embedding.weight
    blocks.0.attention.qkv.weight       blocks.0.attention.qkv.weight
    blocks.0.mlp.0.weight               blocks.0.mlp.0.weight      (mlp is a list: 0, 1=GELU, 2)
    head.weight                         head.weight                (absent when tie_head)

Initialisation goes through the torch policy (`MLXPolicy.initial(config, seed)` converts
`Policy(config, seed)`), so both backends start from identical weights.

Two kernels are MLX-specific, for speed on CPUs (`fast=False` uses MLX's stock layers; see
benchmarks/bench_mlx.py for the measurements). MLX's Linux CPU build multiplies matrices with
the reference BLAS, where `x @ w.T` (the stock `nn.Linear`) runs at about half the speed of
`x @ w'` with `w'` a contiguous transpose, and its `erf` costs some 40 times an addition:

* `Linear` computes the same `x @ w.T + b` through a contiguous transpose of the (small)
  weight, with a hand-written VJP whose two products (`g @ w`, `g.T @ x`) also take the fast
  layouts.
* `GELU` is the exact (erf) GELU of torch's `nn.GELU()`, with erf evaluated as a rational
  function (the float32 approximation Eigen and XLA use; max abs error 4.4e-7 against
  float64 erf, against 5.3e-7 for MLX's own `mx.erf`) and a hand-written VJP
  Phi(x) + x phi(x).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from invar.runtime.policy import PolicyConfig

# Eigen's / XLA's float32 erf: an odd rational function on [-4, 4] (erf is +-1 beyond).
_ERF_NUMERATOR = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
                  -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
                  -1.60960333262415e-02)
_ERF_DENOMINATOR = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                    -7.37332916720468e-03, -1.42647390514189e-02)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def fast_erf(x: mx.array) -> mx.array:
    """erf(x) in float32 from multiplies, adds and one divide (no transcendental call)."""
    x = mx.clip(x, -4.0, 4.0)
    x2 = x * x
    p = x2 * _ERF_NUMERATOR[0] + _ERF_NUMERATOR[1]
    for coefficient in _ERF_NUMERATOR[2:]:
        p = x2 * p + coefficient
    q = x2 * _ERF_DENOMINATOR[0] + _ERF_DENOMINATOR[1]
    for coefficient in _ERF_DENOMINATOR[2:]:
        q = x2 * q + coefficient
    return x * p / q


@mx.custom_function
def gelu(x: mx.array) -> mx.array:
    """Exact GELU, x Phi(x) with Phi(x) = (1 + erf(x / sqrt 2)) / 2 (torch's default)."""
    return x * (0.5 + 0.5 * fast_erf(x * _INV_SQRT_2))


@gelu.vjp
def _gelu_vjp(primal: mx.array, cotangent: mx.array, output: mx.array) -> mx.array:
    x = primal  # a function of one array gets its VJP called with that array, not a list
    cdf = 0.5 + 0.5 * fast_erf(x * _INV_SQRT_2)
    pdf = mx.exp(-0.5 * x * x) * _INV_SQRT_2PI
    return cotangent * (cdf + x * pdf)


@mx.custom_function
def linear(x: mx.array, weight: mx.array, bias: mx.array) -> mx.array:
    """x @ weight.T + bias, with the weight transposed into a contiguous copy first."""
    return mx.addmm(bias, x, mx.contiguous(weight.T))


@linear.vjp
def _linear_vjp(primals: list[mx.array], cotangent: mx.array, output: mx.array
                ) -> tuple[mx.array, mx.array, mx.array]:
    x, weight, _ = primals
    rows = cotangent.reshape(-1, cotangent.shape[-1])
    # g @ W and g.T @ x: both run in the reference BLAS's fast layouts, no transposed copy.
    return (cotangent @ weight, rows.T @ x.reshape(-1, x.shape[-1]), rows.sum(axis=0))


@mx.custom_function
def linear_no_bias(x: mx.array, weight: mx.array) -> mx.array:
    """x @ weight.T (the head)."""
    return x @ mx.contiguous(weight.T)


@linear_no_bias.vjp
def _linear_no_bias_vjp(primals: list[mx.array], cotangent: mx.array, output: mx.array
                        ) -> tuple[mx.array, mx.array]:
    x, weight = primals
    rows = cotangent.reshape(-1, cotangent.shape[-1])
    return cotangent @ weight, rows.T @ x.reshape(-1, x.shape[-1])


class Linear(nn.Linear):
    """`nn.Linear` (the same parameters) computed by `linear` / `linear_no_bias`."""

    def __call__(self, x: mx.array) -> mx.array:
        if "bias" in self:
            return linear(x, self.weight, self.bias)
        return linear_no_bias(x, self.weight)


class GELU(nn.Module):
    def __call__(self, x: mx.array) -> mx.array:
        return gelu(x)


@dataclass(frozen=True)
class MLXKVCache:
    """Keys and values of every layer for the positions decoded so far, each [B, H, T, D]."""

    keys: tuple[mx.array, ...]
    values: tuple[mx.array, ...]

    @property
    def length(self) -> int:
        """Number of positions already in the cache."""
        return self.keys[0].shape[2]


class CausalSelfAttention(nn.Module):
    def __init__(self, config: PolicyConfig, fast: bool) -> None:
        super().__init__()
        linear_layer = Linear if fast else nn.Linear
        self.heads = config.heads
        self.qkv = linear_layer(config.width, 3 * config.width)
        self.proj = linear_layer(config.width, config.width)

    def __call__(
        self, x: mx.array, past: tuple[mx.array, mx.array] | None
    ) -> tuple[mx.array, tuple[mx.array, mx.array]]:
        batch, new, width = x.shape
        head_dim = width // self.heads
        q, k, v = mx.split(self.qkv(x), 3, axis=2)
        q, k, v = (t.reshape(batch, new, self.heads, head_dim).transpose(0, 2, 1, 3)
                   for t in (q, k, v))
        if past is not None:
            k = mx.concatenate([past[0], k], axis=2)
            v = mx.concatenate([past[1], v], axis=2)
        total = k.shape[2]
        scores = (q @ k.transpose(0, 1, 3, 2)) / math.sqrt(head_dim)
        # The new queries sit at positions total-new..total-1; each sees itself and the past.
        visible = mx.tril(mx.ones((new, total), dtype=mx.bool_), k=total - new)
        scores = mx.where(visible, scores, mx.array(-math.inf, dtype=scores.dtype))
        attention = mx.softmax(scores, axis=-1)
        y = (attention @ v).transpose(0, 2, 1, 3).reshape(batch, new, width)
        return self.proj(y), (k, v)


class Block(nn.Module):
    def __init__(self, config: PolicyConfig, fast: bool) -> None:
        super().__init__()
        hidden = config.mlp_ratio * config.width
        linear_layer = Linear if fast else nn.Linear
        self.attention_norm = nn.LayerNorm(config.width, eps=1e-5)
        self.attention = CausalSelfAttention(config, fast)
        self.mlp_norm = nn.LayerNorm(config.width, eps=1e-5)
        # A list, so the parameter paths are mlp.0.* and mlp.2.* like torch's nn.Sequential.
        self.mlp = [linear_layer(config.width, hidden), GELU() if fast else nn.GELU(),
                    linear_layer(hidden, config.width)]

    def __call__(
        self, x: mx.array, past: tuple[mx.array, mx.array] | None
    ) -> tuple[mx.array, tuple[mx.array, mx.array]]:
        attended, present = self.attention(self.attention_norm(x), past)
        x = x + attended
        hidden = self.mlp_norm(x)
        for layer in self.mlp:
            hidden = layer(hidden)
        return x + hidden, present


class MLXPolicy(nn.Module):
    """Decoder-only transformer mapping tokens [B, T] to next-token logits [B, T, V].

    `fast=False` builds it from MLX's stock `nn.Linear` and `nn.GELU` instead of the faster
    `Linear` and `GELU` above (the same function and parameters; for comparison).
    """

    def __init__(self, config: PolicyConfig, fast: bool = True) -> None:
        super().__init__()
        self.config = config
        self.fast = fast
        self.token_embedding = nn.Embedding(config.vocab_size, config.width)
        self.position_embedding = nn.Embedding(config.max_len, config.width)
        self.blocks = [Block(config, fast) for _ in range(config.layers)]
        self.final_norm = nn.LayerNorm(config.width, eps=1e-5)
        if not config.tie_head:
            self.head = (Linear if fast else nn.Linear)(config.width, config.vocab_size,
                                                        bias=False)

    @classmethod
    def initial(cls, config: PolicyConfig, seed: int, fast: bool = True) -> MLXPolicy:
        """The policy with the weights of the torch `Policy(config, seed)`, converted."""
        from invar.runtime.policy import Policy

        policy = cls(config, fast)
        policy.load_torch_state_dict(Policy(config, seed).state_dict())
        return policy

    def __call__(self, tokens: mx.array) -> mx.array:
        """Logits [B, T, V] for every position of `tokens` [B, T]."""
        logits, _ = self.forward_with_cache(tokens, None)
        return logits

    def forward_with_cache(
        self, tokens: mx.array, cache: MLXKVCache | None
    ) -> tuple[mx.array, MLXKVCache]:
        """Logits [B, T_new, V] for `tokens` [B, T_new] that follow the cached positions."""
        start = 0 if cache is None else cache.length
        end = start + tokens.shape[1]
        if end > self.config.max_len:
            raise ValueError(f"sequence of {end} tokens exceeds max_len {self.config.max_len}")
        x = self.token_embedding(tokens) + self.position_embedding(mx.arange(start, end))
        keys, values = [], []
        for layer, block in enumerate(self.blocks):
            past = None if cache is None else (cache.keys[layer], cache.values[layer])
            x, (k, v) = block(x, past)
            keys.append(k)
            values.append(v)
        x = self.final_norm(x)
        if self.config.tie_head:
            weight = self.token_embedding.weight
            logits = linear_no_bias(x, weight) if self.fast else x @ weight.T
        else:
            logits = self.head(x)
        return logits, MLXKVCache(tuple(keys), tuple(values))

    # -- conversion --------------------------------------------------------------------------

    def numpy_parameters(self) -> dict[str, np.ndarray]:
        """Parameters by torch state-dict name, as numpy arrays (copies)."""
        return parameters_to_numpy(self.parameters(), self.config)

    def load_torch_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load a torch `Policy` state dict (torch tensors or numpy arrays), checking names and
        shapes strictly."""
        self.update(numpy_to_parameters(
            {name: _as_numpy(value) for name, value in state.items()}, self))


def _as_numpy(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, mx.array):
        return np.array(value)
    return value.detach().cpu().numpy()  # a torch tensor


def parameters_to_numpy(parameters: Mapping[str, Any], config: PolicyConfig
                        ) -> dict[str, np.ndarray]:
    """An MLX parameter tree as {torch state-dict name: numpy array}.

    With a tied head, the torch state dict holds the embedding under both names.
    """
    flat = {name: np.array(value) for name, value in tree_flatten(parameters)}
    if config.tie_head:
        flat["head.weight"] = flat["token_embedding.weight"].copy()
    return flat


def numpy_to_parameters(state: Mapping[str, np.ndarray], like: nn.Module) -> dict[str, Any]:
    """{torch state-dict name: array} as an MLX parameter tree shaped like `like`'s.

    Refuses missing, unexpected or mis-shaped entries (and, with a tied head, a head that is
    not the embedding), naming them.
    """
    expected = dict(tree_flatten(like.parameters()))
    given = dict(state)
    if getattr(like, "config", None) is not None and like.config.tie_head:
        head = given.pop("head.weight", None)
        embedding = given.get("token_embedding.weight")
        if head is not None and (embedding is None or not np.array_equal(head, embedding)):
            raise ValueError("tied head: head.weight differs from token_embedding.weight")
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    if missing or unexpected:
        raise ValueError(f"state dict does not match the policy: missing {missing}, "
                         f"unexpected {unexpected}")
    items = []
    for name, reference in expected.items():
        value = np.asarray(given[name])
        if tuple(value.shape) != tuple(reference.shape):
            raise ValueError(f"{name}: shape {tuple(value.shape)}, the policy has "
                             f"{tuple(reference.shape)}")
        items.append((name, mx.array(value.astype(np.float32, copy=False))))
    return tree_unflatten(items)


def to_torch_state_dict(policy: MLXPolicy) -> dict[str, Any]:
    """The policy's weights as a torch state dict (float32 CPU tensors, torch names)."""
    import torch

    return {name: torch.from_numpy(value)
            for name, value in policy.numpy_parameters().items()}


def float64_stream() -> contextlib.AbstractContextManager[Any]:
    """A context for float64 work: the current stream when it is a CPU stream (so work split
    over several CPU streams stays on its own), else the CPU's default stream."""
    if mx.default_device() == mx.cpu:
        return contextlib.nullcontext()
    return mx.stream(mx.cpu)


def sequence_logprobs(logits: mx.array, tokens: mx.array) -> mx.array:
    """Float64 log-probability of each token under the matching logits row.

    `logits` [..., V] and `tokens` [...]. Computed on the CPU stream, which is where MLX
    supports float64 (on Apple silicon the rest of the network may run on the GPU).
    """
    with float64_stream():
        wide = logits.astype(mx.float64)
        logprobs = wide - mx.logsumexp(wide, axis=-1, keepdims=True)
        return mx.take_along_axis(logprobs, tokens[..., None], axis=-1)[..., 0]
