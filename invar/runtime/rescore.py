"""The task's verifier, built from a run's config.json, for `invar-check --trace --rescore`.

A reward in the journal is whatever the worker reported: the digests and the chain prove that
the journal is the one written, not that a reward is the verifier's verdict on its tokens.
Re-scoring runs the verifier again on every journalled response (`journal_format.rescore`);
a resume re-scores those of the batches not yet trained on (`invar.runtime.cli`).

Why this module: the verifier is the task's, a plug-in that the runtime builds from the `task`
section; the checker, which imports no runtime shell, imports this module only. It imports the
configuration, the tasks and the verifier runner: no driver, transport, learner or framework.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from invar.model.errors import ConfigError
from invar.model.messages import parse_json
from invar.runtime.config import TrainConfig, load_config, task_section
from invar.runtime.tasks import build_task
from invar.runtime.verifier import Job, verify

BUILT_IN = ("reverse", "jsonl", "arithmetic")
"""Tasks whose verifier is the package's own, at most about a millisecond a response (math-verify
for "arithmetic"): re-scored by default.
A "module" task's verifier is user code of unknown cost (it may run tests, call a solver):
re-scored when asked (`--rescore`)."""


Score = Callable[[int, tuple[int, ...]], float]
"""`score(prompt_index, tokens) -> reward` on a train prompt."""


class Verifier(NamedTuple):
    score: Score | None
    """None: not built (`task_verifier`'s `any_task`)."""
    task: str
    """The task's kind (`task.name`)."""
    failure_reward: float


def verifier(run_dir: Path, any_task: bool = True) -> Verifier:
    """`task_verifier` of the run in `run_dir` as its config.json configures it. Raises
    ConfigError naming the file when there is no configuration to build it from."""
    path = Path(run_dir) / "config.json"
    try:
        saved = parse_json(path.read_text(encoding="utf-8"))
        config = load_config(None, base=saved)
    except (OSError, ValueError) as error:
        raise ConfigError((str(path),), f"cannot build the task's verifier from it: "
                                        f"{error}") from None
    return task_verifier(config, any_task)


def task_verifier(config: TrainConfig, any_task: bool = True) -> Verifier:
    """The task's verifier as `config` configures it (an exception or a non-number is
    `task.failure_reward`, as in a worker; no time limit); not built (None) when the task is
    not a BUILT_IN one and not `any_task`."""
    section = task_section(config)
    kind, failure_reward = str(section["name"]), float(section["failure_reward"])
    if not any_task and kind not in BUILT_IN:
        return Verifier(None, kind, failure_reward)
    task = build_task(section)

    def score(index: int, tokens: tuple[int, ...]) -> float:
        return verify(task, Job("train", index, tokens), failure_reward).reward

    return Verifier(score, kind, failure_reward)
