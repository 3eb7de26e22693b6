"""The task's verifier, built from a run's config.json, for `invar-check --trace --rescore`.

A reward in the journal is whatever the worker reported: the digests and the chain prove that
the journal is the one written, not that a reward is the verifier's verdict on its tokens.
Re-scoring runs the verifier again on every journalled response (`journal_format.rescore`).

Why this module: the verifier is the task's, a plug-in that the runtime builds from the `task`
section; the checker, which imports no runtime shell, imports this module only. It imports the
configuration, the tasks and the verifier runner: no driver, transport, learner or framework.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from invar.model.errors import ConfigError
from invar.runtime.config import load_config, task_section
from invar.runtime.tasks import build_task
from invar.runtime.verifier import Job, verify

BUILT_IN = ("reverse", "jsonl")
"""Tasks whose verifier is the package's own, microseconds a response: re-scored by default.
A "module" task's verifier is user code of unknown cost (it may run tests, call a solver):
re-scored when asked (`--rescore`)."""


def scorer(run_dir: Path, any_task: bool = True
           ) -> tuple[Callable[[int, tuple[int, ...]], float] | None, str]:
    """The verifier of the run in `run_dir` as its config.json configures it, as
    `score(prompt_index, tokens) -> reward` on train prompts (an exception or a non-number is
    `task.failure_reward`, as in a worker; no time limit), and the task's kind; None for the
    verifier when the task is not a BUILT_IN one and not `any_task` (it is not even built).
    Raises ConfigError naming the file when there is no configuration to build it from."""
    path = Path(run_dir) / "config.json"
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        config = load_config(None, base=saved)
    except (OSError, ValueError) as error:
        raise ConfigError((str(path),), f"cannot build the task's verifier from it: "
                                        f"{error}") from None
    section = task_section(config)
    if not any_task and section["name"] not in BUILT_IN:
        return None, str(section["name"])
    task = build_task(section)
    failure_reward = float(section["failure_reward"])

    def score(index: int, tokens: tuple[int, ...]) -> float:
        return verify(task, Job("train", index, tokens), failure_reward).reward

    return score, str(section["name"])
