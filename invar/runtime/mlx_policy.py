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
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from invar.runtime.policy import PolicyConfig


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
    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.proj = nn.Linear(config.width, config.width)

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
    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        hidden = config.mlp_ratio * config.width
        self.attention_norm = nn.LayerNorm(config.width, eps=1e-5)
        self.attention = CausalSelfAttention(config)
        self.mlp_norm = nn.LayerNorm(config.width, eps=1e-5)
        # A list, so the parameter paths are mlp.0.* and mlp.2.* like torch's nn.Sequential.
        self.mlp = [nn.Linear(config.width, hidden), nn.GELU(), nn.Linear(hidden, config.width)]

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
    """Decoder-only transformer mapping tokens [B, T] to next-token logits [B, T, V]."""

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.width)
        self.position_embedding = nn.Embedding(config.max_len, config.width)
        self.blocks = [Block(config) for _ in range(config.layers)]
        self.final_norm = nn.LayerNorm(config.width, eps=1e-5)
        if not config.tie_head:
            self.head = nn.Linear(config.width, config.vocab_size, bias=False)

    @classmethod
    def initial(cls, config: PolicyConfig, seed: int) -> MLXPolicy:
        """The policy with the weights of the torch `Policy(config, seed)`, converted."""
        from invar.runtime.policy import Policy

        policy = cls(config)
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
            logits = self.token_embedding.as_linear(x)
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


def parameters_to_numpy(parameters: Mapping[str, Any], config: PolicyConfig) -> dict[str, np.ndarray]:
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
        if head is not None and not np.array_equal(head, given.get("token_embedding.weight")):
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


def sequence_logprobs(logits: mx.array, tokens: mx.array) -> mx.array:
    """Float64 log-probability of each token under the matching logits row.

    `logits` [..., V] and `tokens` [...]. Computed on the CPU stream, which is where MLX
    supports float64 (on Apple silicon the rest of the network may run on the GPU).
    """
    with mx.stream(mx.cpu):
        wide = logits.astype(mx.float64)
        logprobs = wide - mx.logsumexp(wide, axis=-1, keepdims=True)
        return mx.take_along_axis(logprobs, tokens[..., None], axis=-1)[..., 0]
