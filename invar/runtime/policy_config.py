"""The policy's configuration section, apart from the networks it shapes: the configuration
is read and validated without importing torch (`invar train --help` and a refused key cost
no framework import)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from invar.model.errors import ConfigError
from invar.runtime.task import VOCAB_SIZE

POLICY_KINDS = ("gpt", "transformers")
SHAPE_FIELDS = ("vocab_size", "layers", "width", "heads", "mlp_ratio", "max_len", "tie_head")
"""The fields of `PolicyConfig` that shape the built-in policy (and nothing else)."""


@dataclass(frozen=True)
class PolicyConfig:
    """Which policy network, and its shape.

    `kind = "gpt"` (the default) is the built-in `Policy`, shaped by the fields from
    `vocab_size` to `tie_head`. `kind = "transformers"` is any transformers causal LM
    (`invar.runtime.hf_policy`), from `path` or `config`; it takes its shape from there, so
    the built-in policy's shape fields must keep their defaults.
    """

    kind: str = "gpt"
    """"gpt" (the built-in policy) or "transformers" (needs `pip install -e '.[hf]'` in the Invar
    checkout)."""
    path: str = ""
    """For kind "transformers": a local Hugging Face model directory (config.json, weights as
    *.safetensors or pytorch_model.bin, and a tokenizer); never downloaded."""
    config: dict[str, Any] = field(default_factory=dict)
    """For kind "transformers", instead of `path`: the model's config with random weights,
    passed to `AutoConfig.for_model(model_type, **rest)`, e.g. {model_type = "llama",
    hidden_size = 64, intermediate_size = 256, num_hidden_layers = 2, num_attention_heads = 4,
    num_key_value_heads = 4, max_position_embeddings = 64}; vocab_size defaults to the task's."""
    vocab_size: int = VOCAB_SIZE
    """Token ids are 0..vocab_size-1 (the default is the digit tasks' vocabulary)."""
    layers: int = 2
    """Number of transformer blocks."""
    width: int = 64
    """Residual stream width (embedding size)."""
    heads: int = 4
    """Attention heads per block; must divide `width`."""
    mlp_ratio: int = 4
    """Hidden width of each block's MLP, as a multiple of `width`."""
    max_len: int = 64
    """Longest sequence (prompt + response) the learned positions cover."""
    tie_head: bool = False
    """Share the output projection with the token embedding."""

    def __post_init__(self) -> None:
        # ConfigError is a ValueError naming the field (the configuration prefixes its section).
        if self.kind not in POLICY_KINDS:
            raise ConfigError(("kind",), f"unknown policy kind {self.kind!r}; known: "
                                         f"{', '.join(POLICY_KINDS)}")
        if self.kind == "gpt" and (self.path or self.config):
            raise ConfigError(("kind", "path" if self.path else "config"),
                              "a model path or config needs kind = \"transformers\"")
        if self.kind == "transformers":
            if bool(self.path) == bool(self.config):
                raise ConfigError(("path", "config"), "a transformers policy needs exactly "
                                  "one of them: a model directory, or a config for random "
                                  "weights")
            shape = [f.name for f in fields(self)
                     if f.name in SHAPE_FIELDS and getattr(self, f.name) != f.default]
            if shape:
                raise ConfigError(tuple(shape), "shape the built-in policy only; a "
                                  "transformers policy takes its shape from path or config")
        for name in ("vocab_size", "layers", "width", "heads", "mlp_ratio", "max_len"):
            if getattr(self, name) < 1:
                raise ConfigError((name,), f"must be positive, got {getattr(self, name)}")
        if self.width % self.heads:
            raise ConfigError(("heads", "width"),
                              f"heads ({self.heads}) must divide width ({self.width})")
