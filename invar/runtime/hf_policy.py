"""`policy.kind = "transformers"`: any `transformers` causal LM as the policy.

The model comes from a local directory (`policy.path`: its config.json, weights and tokenizer;
nothing is ever downloaded) or is built with random weights from a config table
(`policy.config`, e.g. `{model_type = "llama", hidden_size = 64, ...}`). `HFPolicy` wraps it
behind the interface of the built-in `Policy` (`forward`, `forward_with_cache`, `vocab_size`,
`max_len`), so the sampler and the learner run it unchanged: the same fixed-shape sampling with
per-row Gumbel noise, the same exact behaviour log-probs, proximal and reference scoring,
cotangents, commits and publication. Its `state_dict` is the wrapped model's, so commits and
published weights carry the Hugging Face parameter names and `invar export` writes them back
as a `save_pretrained` directory.

The digit tasks speak in their own token ids (0-9 the digits, 10 BOS, 11 SEP). A model built
from a config gets a vocabulary of exactly those ids and a tokenizer over their texts built
here with the `tokenizers` library. A pretrained model's tokenizer maps each task token to its
own id (the digit's text, its BOS token, "=" for SEP): tokens go in through that map and the
logits come out restricted to those ids, so the policy samples from, and scores, the model's
distribution over the task's tokens.

Any other task (JSONL, plug-in) speaks the model's own ids (a JSONL task through the model
directory's tokenizer, `tasks.HuggingFaceTokenizer`): no map, and the policy samples from the
model's full vocabulary.

Determinism: eager attention (no fused kernels), float32, and the wrapped model kept in eval
mode (no dropout, whatever its config says), so the same weights and tokens give the same
logits in the learner, in every worker and in the serial reference.
"""

from __future__ import annotations

import copy
import inspect
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from invar.model.errors import ConfigError
from invar.runtime.gguf import is_gguf, load_state_dict, prepared
from invar.runtime.task import BOS, SEP, VOCAB_SIZE

SYMBOL_TEXTS = (*(str(digit) for digit in range(10)), "<bos>", "=")
"""The text of each digit-task token, indexed by its task id (BOS is "<bos>" only in the
tokenizer built here; a pretrained tokenizer's own BOS token stands for it)."""
assert len(SYMBOL_TEXTS) == VOCAB_SIZE and SYMBOL_TEXTS[BOS] == "<bos>" and SYMBOL_TEXTS[SEP] == "="

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
"""Files that hold a Hugging Face model's weights (single or sharded)."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""Files of which a Hugging Face tokenizer has at least one."""

ATTENTION = "eager"
"""The attention implementation: plain matmul and softmax, the same kernels on every call."""

INSTALL_HINT = "pip install -e '.[hf]' in the Invar checkout"


def import_transformers() -> Any:
    """The transformers module, or a ConfigError saying how to install it (imported only when
    a transformers policy is asked for, so `invar train --help` does not pay for it)."""
    try:
        import tokenizers  # noqa: F401
        import transformers
    except ImportError:
        raise ConfigError(("policy.kind",), "\"transformers\" needs the transformers and "
                                            f"tokenizers packages: {INSTALL_HINT}") from None
    transformers.logging.set_verbosity_error()  # no advice on stderr for each model built
    transformers.logging.disable_progress_bar()  # nor a bar for each directory written
    return transformers


@dataclass(frozen=True)
class ModelSpec:
    """A transformers policy resolved: everything needed to build it, as plain data.

    Travels to the workers in their arguments, so a worker host needs no copy of
    `policy.path`: it builds the architecture from `config` and receives the weights by
    publication, like any worker.
    """

    config: dict[str, Any]
    """The model's full `PretrainedConfig.to_dict()`, `model_type` included."""
    symbol_ids: tuple[int, ...]
    """The model's token id of each digit-task token, by task id; empty when the task speaks
    the model's own ids (its whole vocabulary)."""
    weights_dir: str = ""
    """Where the initial weights are (`policy.path`: a model directory or a GGUF file); empty:
    random from the seed."""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "symbol_ids": list(self.symbol_ids)}


def task_tokenizer() -> Any:
    """A fast tokenizer over the digit tasks' tokens, ids equal to the task ids: "<bos>" the
    BOS token (special), one character per token otherwise ("<bos>3141=" -> 10 3 1 4 1 11)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    transformers = import_transformers()
    vocabulary = {text: token for token, text in enumerate(SYMBOL_TEXTS)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocabulary, unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.add_special_tokens([SYMBOL_TEXTS[BOS]])
    tokenizer.decoder = decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer,
                                                bos_token=SYMBOL_TEXTS[BOS])


def symbol_ids(tokenizer: Any, where: str) -> tuple[int, ...]:
    """The tokenizer's id of each task token; a ConfigError naming `where` when a digit or "="
    is not exactly one token, there is no BOS (nor EOS) token, or two task tokens share an id."""
    ids = []
    for token, text in enumerate(SYMBOL_TEXTS):
        if token == BOS:
            bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None \
                else tokenizer.eos_token_id
            if bos is None:
                raise ConfigError((where,), "the tokenizer has neither a BOS nor an EOS token to "
                                            "begin the digit tasks' prompts with")
            ids.append(int(bos))
            continue
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) != 1:
            raise ConfigError((where,), f"the tokenizer encodes {text!r} as {len(encoded)} "
                                        "tokens; the digit tasks need one token for each digit "
                                        "and for \"=\"")
        ids.append(int(encoded[0]))
    if len(set(ids)) != len(ids):
        raise ConfigError((where,), f"the tokenizer gives two digit-task tokens the same id "
                                    f"({dict(zip(SYMBOL_TEXTS, ids))})")
    return tuple(ids)


def resolve(path: str, config: dict[str, Any], task_vocabulary: int | None = None
            ) -> ModelSpec:
    """The model `policy.path` or `policy.config` describes, checked before anything runs:
    ConfigError naming the field when the directory lacks weights, config or tokenizer, the
    config is not a causal LM transformers knows, or its vocabulary cannot hold the task's
    tokens. `task_vocabulary`: None for the digit tasks (their tokens mapped onto the
    model's); else the task speaks the model's own ids 0..task_vocabulary-1, and a config's
    vocab_size defaults to it."""
    transformers = import_transformers()
    if path and is_gguf(path):
        spec = _resolve_directory(transformers, prepared(path), task_vocabulary,
                                  weights=str(Path(path).expanduser()))
        field = "policy.path"
    elif path:
        spec = _resolve_directory(transformers, Path(path).expanduser(), task_vocabulary)
        field = "policy.path"
    else:
        spec = _resolve_config(transformers, config, task_vocabulary)
        field = "policy.config.vocab_size" if "vocab_size" in config else "policy.config"
    vocabulary = model_config(spec).vocab_size
    if task_vocabulary is not None and task_vocabulary > vocabulary:
        raise ConfigError((field,), f"vocab_size {vocabulary} cannot hold the task's token "
                                    f"ids 0..{task_vocabulary - 1}")
    if spec.symbol_ids and max(spec.symbol_ids) >= vocabulary:
        raise ConfigError((field,), f"vocab_size {vocabulary} cannot hold the digit tasks' "
                                    f"token ids {list(spec.symbol_ids)}")
    return spec


def _resolve_directory(transformers: Any, directory: Path, task_vocabulary: int | None,
                       weights: str = "") -> ModelSpec:
    """The spec of a model directory; `weights`: a GGUF file that holds the weights instead
    (the directory, `gguf.prepared`, then has only the config and tokenizer)."""
    if not directory.is_dir():
        raise ConfigError(("policy.path",), f"{str(directory)!r} is neither a model directory "
                                            "nor a .gguf file")
    if not weights and not any(any(directory.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        raise ConfigError(("policy.path",), f"no model weights (*.safetensors or "
                                            f"pytorch_model.bin) in {directory}")
    try:
        config = transformers.AutoConfig.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError) as error:
        raise ConfigError(("policy.path",), f"no model config in {directory}: {error}") from None
    _check_causal_lm(transformers, config, "policy.path")
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(("policy.path",), f"no tokenizer in {directory} (none of "
                                            f"{', '.join(TOKENIZER_FILES)})")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, TypeError) as error:
        first_line = str(error).strip().splitlines()[0]
        raise ConfigError(("policy.path",), f"the tokenizer in {directory} cannot be loaded: "
                                            f"{first_line}") from None
    symbols = symbol_ids(tokenizer, "policy.path") if task_vocabulary is None else ()
    return ModelSpec(_plain(config), symbols, weights or str(directory))


def _resolve_config(transformers: Any, given: dict[str, Any], task_vocabulary: int | None
                    ) -> ModelSpec:
    if "model_type" not in given:
        raise ConfigError(("policy.config.model_type",),
                          "missing: name the architecture, e.g. \"llama\", \"qwen2\", \"gpt2\"")
    options = dict(given)
    model_type = options.pop("model_type")
    # The task's own vocabulary (the digit tasks': BOS their begin token); the config may
    # widen it.
    options.setdefault("vocab_size", VOCAB_SIZE if task_vocabulary is None else task_vocabulary)
    options.setdefault("bos_token_id", BOS if task_vocabulary is None else None)
    options.setdefault("eos_token_id", None)
    options.setdefault("pad_token_id", None)
    if model_type not in transformers.CONFIG_MAPPING:
        raise ConfigError(("policy.config.model_type",), f"unknown model_type {model_type!r} "
                          f"(transformers {transformers.__version__})")
    try:
        config = transformers.AutoConfig.for_model(model_type, **options)
    except Exception as error:  # the config classes validate with errors of their own
        cause = error.__cause__ or error
        raise ConfigError(("policy.config",), f"transformers refuses this {model_type} config: "
                                              f"{cause}") from None
    _check_causal_lm(transformers, config, "policy.config.model_type")
    # A config keeps any keyword it does not know as a loose attribute: a misspelt key would
    # be silently ignored. Keys it consumes (e.g. llama's rope_theta) do not stay loose.
    kind = type(config)
    known = {*kind().to_dict(), *kind.attribute_map}
    loose = [key for key in given if key not in known and key in config.to_dict()]
    if loose:
        raise ConfigError(tuple(f"policy.config.{key}" for key in loose),
                          f"not a setting of {kind.__name__}")
    return ModelSpec(_plain(config), tuple(range(VOCAB_SIZE)) if task_vocabulary is None else ())


def _check_causal_lm(transformers: Any, config: Any, where: str) -> None:
    if type(config) not in transformers.MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ConfigError((where,), f"model_type {config.model_type!r} is not a causal "
                                    "language model transformers knows")


def _plain(config: Any) -> dict[str, Any]:
    """The config as JSON data (it travels in worker arguments and is kept in commits)."""
    return json.loads(config.to_json_string(use_diff=False))


def model_config(spec: ModelSpec) -> Any:
    """The `PretrainedConfig` of `spec`."""
    transformers = import_transformers()
    options = copy.deepcopy(spec.config)
    return transformers.AutoConfig.for_model(options.pop("model_type"), **options)


def max_positions(config: Any) -> int:
    """The longest sequence the model's positions cover (`n_positions` and the like map to
    `max_position_embeddings`); a model without a limit (none declared) is not limited here."""
    return getattr(config, "max_position_embeddings", None) or 2**31 - 1


class HFPolicy(nn.Module):
    """A transformers causal LM behind the built-in `Policy`'s interface, over task tokens.

    `HFPolicy(spec, seed)` builds the model: the weights of `spec.weights_dir` when there is
    one and `pretrained`, else random ones drawn from `seed` alone (the caller's torch RNG is
    left as it was). A worker builds with `pretrained=False`: its weights come by publication.
    """

    def __init__(self, spec: ModelSpec, seed: int, pretrained: bool = True) -> None:
        super().__init__()
        transformers = import_transformers()
        config = model_config(spec)
        options = {"attn_implementation": ATTENTION, "dtype": torch.float32}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if pretrained and spec.weights_dir and not is_gguf(spec.weights_dir):
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    spec.weights_dir, config=config, local_files_only=True, **options)
            else:
                model = transformers.AutoModelForCausalLM.from_config(config, **options)
        if pretrained and is_gguf(spec.weights_dir):
            model.load_state_dict(load_state_dict(spec.weights_dir))
        self.model = model.eval()
        self.vocab_size = len(spec.symbol_ids) or config.vocab_size
        self.max_len = max_positions(config)
        # The model's ids are the task's exactly (a task of the model's own ids, or a model
        # built from a config for the digit tasks): no mapping.
        self._mapped = bool(spec.symbol_ids) and \
            spec.symbol_ids != tuple(range(config.vocab_size))
        self.symbol_ids: Tensor
        self.register_buffer("symbol_ids", torch.tensor(spec.symbol_ids), persistent=False)
        # transformers 5 calls the cache argument `cache`; earlier releases `past_key_values`.
        parameters = inspect.signature(model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"

    def train(self, mode: bool = True) -> HFPolicy:
        """Dropout would make the same weights and tokens give different log-probs from call
        to call: the wrapped model stays in eval mode whatever is asked (gradients still flow)."""
        super().train(mode)
        self.model.eval()
        return self

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped model's state under its Hugging Face names (the same arguments as
        `nn.Module.state_dict`, passed through)."""
        return self.model.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        return self.model.load_state_dict(state_dict, strict=strict, assign=assign)

    keeps_last_logits = True
    """`forward(..., last=k)` and `forward_with_cache(..., last=k)` compute the output layer
    for the last k positions alone."""

    def forward(self, tokens: Tensor, attention_mask: Tensor | None = None,
                positions: Tensor | None = None, last: int = 0) -> Tensor:
        """Logits [B, T, V] over the task's tokens for every position of `tokens` [B, T] (for
        the last `last` positions only, when it is > 0); `attention_mask` [B, T] and
        `positions` [B, T] for left-padded rows (the built-in `Policy.forward_with_cache` says
        what they are)."""
        return self._task_logits(self.model(input_ids=self._model_ids(tokens), use_cache=False,
                                            logits_to_keep=last,
                                            **_padding(attention_mask, positions)))

    def forward_with_cache(self, tokens: Tensor, cache: Any, attention_mask: Tensor | None = None,
                           positions: Tensor | None = None, last: int = 0) -> tuple[Tensor, Any]:
        """Logits [B, T_new, V] for `tokens` [B, T_new] that follow the cached positions (for
        the last `last` of them only, when it is > 0), and the cache holding them too
        (transformers' cache object, extended in place); `attention_mask` [B, cached + T_new]
        and `positions` [B, T_new] for left-padded rows."""
        output = self.model(input_ids=self._model_ids(tokens), use_cache=True,
                            logits_to_keep=last, **{self._cache_argument: cache},
                            **_padding(attention_mask, positions))
        return self._task_logits(output), getattr(output, self._cache_argument)

    def _model_ids(self, tokens: Tensor) -> Tensor:
        return self.symbol_ids[tokens] if self._mapped else tokens

    def _task_logits(self, output: Any) -> Tensor:
        logits = output.logits
        return logits.index_select(-1, self.symbol_ids) if self._mapped else logits


def _padding(attention_mask: Tensor | None, positions: Tensor | None) -> dict[str, Tensor]:
    """The keyword arguments that tell a transformers model about left padding (none when the
    rows are whole: the model's own causal mask and positions are then exactly right)."""
    if attention_mask is None or positions is None:
        return {}
    return {"attention_mask": attention_mask.long(), "position_ids": positions}
