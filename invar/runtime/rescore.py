"""The task's verifier, built from what a run's journal binds, for `invar-check --trace`.

A reward in the journal is whatever the worker reported: the digests and the chain prove that
the journal is the one written, not that a reward is the verifier's verdict on its tokens.
Re-scoring runs the verifier again on every journalled response (`journal_format.rescore`);
a resume re-scores those of the batches not yet trained on (`invar.runtime.cli`).

Why this module: the verifier is the task's, a plug-in that the runtime builds from the `task`
section; the checker, which imports no runtime shell, imports this module only. It imports the
configuration, the tasks and the verifier runner: no driver, transport, learner or framework.
The task's settings and the failure reward are those the journal's header binds
(`invar.runtime.binding`), never config.json's: a file beside the journal that whoever
rewrites it can edit as well.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from invar.journal_format import Contents
from invar.runtime.binding import bound_config, check_files, pruning_problem
from invar.runtime.config import TrainConfig, task_section
from invar.runtime.tasks import build_task
from invar.runtime.verifier import Job, verify

__all__ = ["BUILT_IN", "Score", "Verifier", "pruning_problem", "task_verifier", "verifier"]

BUILT_IN = ("reverse", "jsonl", "arithmetic")
"""Tasks whose verifier is the package's own, at most about a millisecond a response (the stated
answer's regular expressions for "arithmetic"): re-scored by default.
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


def verifier(contents: Contents, run_dir: Path, any_task: bool = True) -> Verifier:
    """`task_verifier` of the run in `run_dir` as its journal, read as `contents`, binds it,
    the files it reads the ones the journal binds. Raises ConfigError naming what is missing:
    a journal that binds no configuration, a file the run read that is gone or other."""
    config = bound_config(contents, run_dir)
    check_files(contents.binding, config)
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
