"""A small GPT-style decoder-only transformer: the policy that samples and learns.

Pre-LN blocks, causal self-attention written out by hand (no fused kernels, so it runs under
`torch.use_deterministic_algorithms(True)` on CPU and CUDA alike), learned positions, and
no dropout: the same weights and tokens always give the same logits. Incremental decoding
goes through `forward_with_cache`, whose result matches `forward` on the full sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from invar.runtime.policy_config import PolicyConfig


def build_policy(config: PolicyConfig, seed: int, task_vocabulary: int | None = None
                 ) -> nn.Module:
    """The policy `config` names, its weights drawn from `seed` (a transformers policy from a
    directory: that directory's weights). `task_vocabulary`: for a transformers policy, None
    for the digit tasks, else the size of the vocabulary the task speaks in the model's own
    ids (`hf_policy.resolve`)."""
    if config.kind == "transformers":
        from invar.runtime.hf_policy import HFPolicy, resolve
        return HFPolicy(resolve(config.path, config.config, task_vocabulary), seed)
    return Policy(config, seed)


@dataclass(frozen=True)
class KVCache:
    """Keys and values of every layer for the positions decoded so far, each [B, H, T, D]."""

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]

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

    def forward(
        self, x: Tensor, past: tuple[Tensor, Tensor] | None, keys_seen: Tensor | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """`keys_seen` [B, total] bool: False at keys no query may see (a prompt's padding);
        None: every key is real."""
        batch, new, width = x.shape
        head_dim = width // self.heads
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, new, self.heads, head_dim).transpose(1, 2) for t in (q, k, v))
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        total = k.shape[2]
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)
        # The new queries sit at positions total-new..total-1; each sees itself and the past.
        visible = torch.ones(new, total, dtype=torch.bool, device=x.device).tril(total - new)
        if keys_seen is not None:
            # Padding is hidden from every query; a padding query still sees itself, so its
            # softmax is finite (a NaN there would reach real rows through 0 * NaN).
            itself = torch.zeros(new, total, dtype=torch.bool, device=x.device)
            itself[torch.arange(new), torch.arange(total - new, total)] = True
            visible = visible & (keys_seen[:, None, None, :] | itself)
        attention = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
        y = (attention @ v).transpose(1, 2).reshape(batch, new, width)
        return self.proj(y), (k, v)


class Block(nn.Module):
    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        hidden = config.mlp_ratio * config.width
        self.attention_norm = nn.LayerNorm(config.width)
        self.attention = CausalSelfAttention(config)
        self.mlp_norm = nn.LayerNorm(config.width)
        self.mlp = nn.Sequential(
            nn.Linear(config.width, hidden), nn.GELU(), nn.Linear(hidden, config.width)
        )

    def forward(
        self, x: Tensor, past: tuple[Tensor, Tensor] | None, keys_seen: Tensor | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        attended, present = self.attention(self.attention_norm(x), past, keys_seen)
        x = x + attended
        x = x + self.mlp(self.mlp_norm(x))
        return x, present


class Policy(nn.Module):
    """Decoder-only transformer mapping tokens [B, T] to next-token logits [B, T, V].

    Weights are initialised on the CPU from `seed` alone, so two policies built with the same
    config and seed are bitwise equal wherever they are later moved.
    """

    def __init__(self, config: PolicyConfig, seed: int) -> None:
        super().__init__()
        self.config = config
        # torch's default initialisers draw from the global RNG; fork it so that building a
        # policy leaves the caller's stream as it was (_initialise overwrites every value).
        with torch.random.fork_rng(devices=[]):
            self.token_embedding = nn.Embedding(config.vocab_size, config.width)
            self.position_embedding = nn.Embedding(config.max_len, config.width)
            self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
            self.final_norm = nn.LayerNorm(config.width)
            self.head = nn.Linear(config.width, config.vocab_size, bias=False)
        if config.tie_head:
            self.head.weight = self.token_embedding.weight
        self._initialise(seed)

    @property
    def vocab_size(self) -> int:
        """Token ids the logits cover (what the sampler draws noise for)."""
        return self.config.vocab_size

    @property
    def max_len(self) -> int:
        """Longest sequence the policy can read."""
        return self.config.max_len

    @torch.no_grad()
    def _initialise(self, seed: int) -> None:
        # GPT-2 initialisation, drawn from a private generator so the global RNG is untouched.
        generator = torch.Generator().manual_seed(seed)
        # Projections that write into the residual stream are scaled down with depth.
        residual_std = 0.02 / math.sqrt(2 * self.config.layers)
        for name, parameter in self.named_parameters():
            if name.endswith("bias"):
                parameter.zero_()
            elif "norm" in name:
                parameter.fill_(1.0)
            elif name.endswith(("attention.proj.weight", "mlp.2.weight")):
                parameter.normal_(0.0, residual_std, generator=generator)
            else:
                parameter.normal_(0.0, 0.02, generator=generator)

    def forward(self, tokens: Tensor, attention_mask: Tensor | None = None,
                positions: Tensor | None = None) -> Tensor:
        """Logits [B, T, V] for every position of `tokens` [B, T]; `attention_mask` and
        `positions` as `forward_with_cache` takes them."""
        logits, _ = self.forward_with_cache(tokens, None, attention_mask, positions)
        return logits

    def forward_with_cache(
        self, tokens: Tensor, cache: KVCache | None, attention_mask: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> tuple[Tensor, KVCache]:
        """Logits [B, T_new, V] for `tokens` [B, T_new] that follow the cached positions.

        For left-padded rows: `attention_mask` [B, cached + T_new] bool, False at the padding
        (no query sees it), and `positions` [B, T_new], each token's position counted from
        its row's first real token, so a padded row computes what it computes alone. None:
        every token is real and positions follow the cache.
        Returns a new cache that also holds `tokens`; the given cache is left unchanged.
        """
        start = 0 if cache is None else cache.length
        end = start + tokens.shape[1]
        if end > self.config.max_len:
            raise ValueError(f"sequence of {end} tokens exceeds max_len {self.config.max_len}")
        if positions is None:
            positions = torch.arange(start, end, device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        keys, values = [], []
        for layer, block in enumerate(self.blocks):
            past = None if cache is None else (cache.keys[layer], cache.values[layer])
            x, (k, v) = block(x, past, attention_mask)
            keys.append(k)
            values.append(v)
        logits = self.head(self.final_norm(x))
        return logits, KVCache(tuple(keys), tuple(values))


def sequence_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """Float64 log-probability of each token under the matching logits row.

    `logits` [..., V] and `tokens` [...]. The rule is a one-hot product (`picked_by_one_hot`),
    since `gather`'s CUDA backward is not deterministic; on the CPU, where it is, `gather`
    picks the same values and gradients, bit for bit, without a [..., V] float64 one-hot (with
    a 49k vocabulary, hundreds of MB per batch).
    """
    logprobs = torch.log_softmax(logits.double(), dim=-1)
    if logprobs.device.type == "cpu":
        return logprobs.gather(-1, tokens[..., None])[..., 0]
    return picked_by_one_hot(logprobs, tokens)


def picked_by_one_hot(logprobs: Tensor, tokens: Tensor) -> Tensor:
    """`logprobs[..., tokens]` as a one-hot product: deterministic on every device."""
    chosen = F.one_hot(tokens, logprobs.shape[-1]).to(logprobs.dtype)
    return (logprobs * chosen).sum(dim=-1)
