"""`invar export RUN_DIR OUT_DIR [--version N]`: a trained transformers policy as a Hugging
Face directory (`save_pretrained` layout: config.json, model.safetensors, the tokenizer), which
`AutoModelForCausalLM.from_pretrained(OUT_DIR)` and `AutoTokenizer.from_pretrained(OUT_DIR)`
load as they are.

The weights are read from a verified commit or checkpoint file of the run (the newest commit
unless `--version` names one); the architecture and tokenizer come from the run's
configuration: the tokenizer built for the digit tasks for a policy built from `policy.config`,
the tokenizer of `policy.path` for one loaded from a directory (which must still be there).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from invar.model.errors import ConfigError


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
    from invar.runtime.config import load_config
    from invar.runtime.hf_policy import HFPolicy, resolve, task_tokenizer
    from invar.runtime.torch_learner import CommitError, read_commit

    run, out = Path(run_dir), Path(out_dir)
    saved = run / "config.json"
    try:
        config = load_config(None, base=json.loads(saved.read_text()), validate=False)
    except (OSError, ValueError) as error:
        raise ExportError("RUN_DIR", f"{saved} is not a run's configuration: {error}") from None
    if config.policy.kind != "transformers":
        raise ExportError("RUN_DIR", f"the run's policy.kind is {config.policy.kind!r}: export "
                                     "writes transformers policies (policy.kind = "
                                     "\"transformers\")")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError("OUT_DIR", f"{out} exists and is not an empty directory")
    commits, checkpoints = _kept(run / "commits"), _kept(run / "checkpoints")
    if version is None:
        if not commits:
            raise ExportError("RUN_DIR", f"{run / 'commits'} holds no commit")
        version = max(commits)
    path = commits.get(version) or checkpoints.get(version)
    if path is None:
        raise ExportError("--version", f"no commit or checkpoint of version {version} in {run} "
                                       f"(kept: {sorted({*commits, *checkpoints}) or 'none'})")
    try:
        content = read_commit(path)
        spec = resolve(config.policy.path, config.policy.config)
    except CommitError as error:
        raise ExportError("--version" if version is not None else "RUN_DIR", str(error)) from None
    except ConfigError as error:
        raise ExportError("RUN_DIR", f"the run's policy cannot be rebuilt: {error}") from None
    policy = HFPolicy(spec, seed=0, pretrained=False)
    policy.load_state_dict(content["model"])
    if spec.weights_dir:
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(spec.weights_dir, local_files_only=True)
    else:
        tokenizer = task_tokenizer()
    out.mkdir(parents=True, exist_ok=True)
    policy.model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return version


def _kept(directory: Path) -> dict[int, Path]:
    """The commit-format files of `directory` by version (none when it does not exist)."""
    from invar.runtime.torch_learner import list_commits
    return dict(list_commits(directory)) if directory.is_dir() else {}


def main(args: argparse.Namespace) -> int:
    try:
        version = export(args.run_dir, args.out_dir, args.version)
    except ExportError as error:
        print(f"invar: export refused: {error}", file=sys.stderr)
        return 2
    print(f"exported version {version} of {args.run_dir} to {args.out_dir}")
    return 0
