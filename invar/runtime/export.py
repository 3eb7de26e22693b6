"""`invar export RUN_DIR OUT_DIR [--version N]`: a trained transformers policy as a Hugging
Face directory (`save_pretrained` layout: config.json, model.safetensors, the tokenizer), which
`AutoModelForCausalLM.from_pretrained(OUT_DIR)` and `AutoTokenizer.from_pretrained(OUT_DIR)`
load as they are.

The weights are read from a verified commit or checkpoint file of the run (the newest commit
unless `--version` names one); the architecture and tokenizer come from the run's
configuration: the tokenizer the run's text was encoded with — a JSONL or arithmetic task's
`task.tokenizer` (a Hugging Face directory or a .gguf file, "auto" being `policy.path`'s),
else the tokenizer of `policy.path` (a directory or a .gguf file, which must still be there),
else the one built for the digit tasks. A run whose tokens are a plug-in's or the byte
tokenizer's has no Hugging Face tokenizer: its model is written alone. The
built-in policy (`policy.kind = "gpt"`) is written as the GPT-2 it is equivalent to.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from invar.model.errors import ConfigError

if TYPE_CHECKING:  # torch is imported when an export runs, not for `invar --help`
    from torch import Tensor

    from invar.runtime.config import TrainConfig
    from invar.runtime.policy import PolicyConfig


class ExportError(ValueError):
    """An export that cannot be made; `argument` names what is at fault."""

    def __init__(self, argument: str, reason: str) -> None:
        self.argument = argument
        self.reason = reason
        super().__init__(f"{argument}: {reason}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory of `invar train`")
    parser.add_argument("out_dir", metavar="OUT_DIR",
                        help="where the Hugging Face directory is written (new or empty)")
    parser.add_argument("--version", type=int, metavar="N",
                        help="the committed version to export (default: the newest commit); "
                             "older versions are found among the run's checkpoints")


def export(run_dir: str | Path, out_dir: str | Path, version: int | None = None) -> int:
    """Write the policy of `version` (default: the newest commit) of `run_dir` into `out_dir`
    with `save_pretrained`; returns the version written. Raises ExportError naming the
    argument before anything is written when the run, its policy or the version will not do."""
    from invar.runtime.commits import CommitError, read_commit
    from invar.runtime.config import load_config

    run, out = Path(run_dir), Path(out_dir)
    saved = run / "config.json"
    try:
        config = load_config(None, base=json.loads(saved.read_text()), validate=False)
    except (OSError, ValueError) as error:
        raise ExportError("RUN_DIR", f"{saved} is not a run's configuration: {error}") from None
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError("OUT_DIR", f"{out} exists and is not an empty directory")
    commits, checkpoints = _kept(run / "commits"), _kept(run / "checkpoints")
    asked = "--version" if version is not None else "RUN_DIR"
    if version is None:
        if not commits:
            raise ExportError("RUN_DIR", f"{run / 'commits'} holds no commit")
        version = max(commits)
    path = commits.get(version) or checkpoints.get(version)
    if path is None:
        raise ExportError("--version", f"no commit or checkpoint of version {version} in {run} "
                                       f"(kept: {sorted({*commits, *checkpoints}) or 'none'})")
    try:
        weights = read_commit(path)["model"]
        model, tokenizer = _hugging_face(config, weights)
    except CommitError as error:
        raise ExportError(asked, str(error)) from None
    except ConfigError as error:
        raise ExportError("RUN_DIR", f"the run's policy cannot be rebuilt: {error}") from None
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return version


def _hugging_face(config: TrainConfig, weights: dict[str, Tensor]) -> tuple[Any, Any]:
    """The transformers model holding `weights` of a run's policy, and its tokenizer (None
    when the run's tokens are no Hugging Face tokenizer's)."""
    from invar.runtime.config import KIND_KEYS, task_section, task_vocabulary
    from invar.runtime.gguf import is_gguf, prepared
    from invar.runtime.hf_policy import HFPolicy, import_transformers, resolve, task_tokenizer
    from invar.runtime.tasks import TOKENIZERS
    transformers = import_transformers()
    policy = config.policy
    # The tokenizer the run's text was encoded with: the task's own where it reads text
    # ("auto" resolves to policy.path), else the policy's.
    field, tokenizer_source = "policy.path", policy.path
    if "tokenizer" in KIND_KEYS.get(config.task.name, ()):
        field, tokenizer_source = "task.tokenizer", task_section(config)["tokenizer"]
        tokenizer_source = "" if tokenizer_source in TOKENIZERS else tokenizer_source
    if tokenizer_source:
        # A .gguf file's tokenizer is read once into a directory beside its config (cached).
        directory = prepared(tokenizer_source) if is_gguf(tokenizer_source) else tokenizer_source
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(directory,
                                                                   local_files_only=True)
        except (OSError, ValueError) as error:
            raise ConfigError((field,), f"no tokenizer can be loaded from "
                                        f"{tokenizer_source!r}: "
                                        f"{str(error).strip().splitlines()[0]}") from None
    else:
        tokenizer = task_tokenizer() if config.task.name == "reverse" else None
    if policy.kind != "transformers":
        return builtin_as_gpt2(policy, weights), tokenizer
    model = HFPolicy(resolve(policy.path, policy.config, task_vocabulary(config)), seed=0,
                     pretrained=False)
    model.load_state_dict(weights)
    return model.model, tokenizer


def builtin_as_gpt2(policy: PolicyConfig, weights: dict[str, Tensor]) -> Any:
    """The built-in policy as the transformers GPT-2 it is: pre-LN blocks, learned positions,
    exact GELU, LayerNorm eps 1e-5, 1/sqrt(d) attention, a bias-free head. Only the names and
    the layout of the projections (GPT-2's Conv1D stores [in, out]) differ."""
    from invar.runtime.hf_policy import import_transformers
    from invar.runtime.task import BOS
    transformers = import_transformers()
    config = transformers.GPT2Config(
        vocab_size=policy.vocab_size, n_positions=policy.max_len, n_embd=policy.width,
        n_layer=policy.layers, n_head=policy.heads, n_inner=policy.mlp_ratio * policy.width,
        activation_function="gelu", layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, tie_word_embeddings=policy.tie_head, bos_token_id=BOS,
        eos_token_id=None, pad_token_id=None)
    state = {
        "transformer.wte.weight": weights["token_embedding.weight"],
        "transformer.wpe.weight": weights["position_embedding.weight"],
        "transformer.ln_f.weight": weights["final_norm.weight"],
        "transformer.ln_f.bias": weights["final_norm.bias"],
        "lm_head.weight": weights["head.weight"],
    }
    for layer in range(policy.layers):
        ours, theirs = f"blocks.{layer}.", f"transformer.h.{layer}."
        for norm, renamed in (("attention_norm", "ln_1"), ("mlp_norm", "ln_2")):
            for part in ("weight", "bias"):
                state[f"{theirs}{renamed}.{part}"] = weights[f"{ours}{norm}.{part}"]
        for linear, renamed in (("attention.qkv", "attn.c_attn"), ("attention.proj", "attn.c_proj"),
                                ("mlp.0", "mlp.c_fc"), ("mlp.2", "mlp.c_proj")):
            state[f"{theirs}{renamed}.weight"] = weights[f"{ours}{linear}.weight"].t()
            state[f"{theirs}{renamed}.bias"] = weights[f"{ours}{linear}.bias"]
    model = transformers.GPT2LMHeadModel(config)
    model.load_state_dict(state)
    return model.eval()


def _kept(directory: Path) -> dict[int, Path]:
    """The commit-format files of `directory` by version (none when it does not exist)."""
    from invar.runtime.commits import list_commits
    return dict(list_commits(directory)) if directory.is_dir() else {}


def main(args: argparse.Namespace) -> int:
    try:
        version = export(args.run_dir, args.out_dir, args.version)
    except ExportError as error:
        print(f"invar: export refused: {error}", file=sys.stderr)
        return 2
    print(f"exported version {version} of {args.run_dir} to {args.out_dir}")
    return 0
