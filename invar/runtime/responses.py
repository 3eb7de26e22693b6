"""Responses a reader can read: decoded samples of what a run generated, beside their rewards.

A reward curve alone hid a reward hack (issue 40: the checker scored a restated question as
the sum, and every curve measured that). So a run shows what earned its rewards: for each
evaluated version, the greedy responses to the first `SHOWN_HELDOUT` held-out prompts (the
same prompts every version, so a reader sees them change), and for each update, one sample of
each of the batch's first `SHOWN_TRAINING` prompts (TRL's `log_completions` shows the same).

Each shown row is {"prompt", "answer", "response", "reward"}: the prompt as the task shows it
(its `question_text(split, index)` when it has one, else the decoded prompt's end), the
expected answer when the task can say it (`answer_text(split, index)`), the response decoded up to
its end, and its reward. They go to metrics.jsonl (rows of kind "responses"), report.md,
`invar report` and the trackers (a W&B table, TensorBoard and MLflow text).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

SHOWN_HELDOUT = 6
"""Held-out prompts shown for each evaluated version (the first ones of the split)."""

SHOWN_TRAINING = 4
"""Training responses shown for each update: sample 0 of each of the batch's first prompts."""

SHOWN_CHARACTERS = 160
"""A shown prompt or response is cut to this many characters (the end of a prompt, whose chat
template's boilerplate comes first; the start of a response)."""

COLUMNS = ("prompt", "answer", "response", "reward")


def decoded(task: Any, tokens: Sequence[int]) -> str:
    """`tokens` as text: the task's tokenizer's decoding, else the ids themselves (a built-in
    task of digit tokens)."""
    tokenizer = getattr(task, "tokenizer", None)
    ids = [int(t) for t in tokens]
    if tokenizer is not None and hasattr(tokenizer, "decode"):
        return str(tokenizer.decode(ids))
    return " ".join(map(str, ids))


def shown_row(task: Any, split: str, index: int, response: Sequence[int],
              reward: float) -> dict[str, Any]:
    """One shown row: prompt `index` of `split`, its response (already cut at its end)."""
    question = getattr(task, "question_text", None)
    prompt = (question(split, index) if question is not None
              else decoded(task, task.prompt(index, split)).strip()[-SHOWN_CHARACTERS:])
    answer = getattr(task, "answer_text", None)
    return {"prompt": prompt, "answer": None if answer is None else str(answer(split, index)),
            "response": decoded(task, response)[:SHOWN_CHARACTERS], "reward": float(reward)}


def heldout_rows(task: Any, responses: Sequence[Sequence[int]],
                 rewards: Sequence[float]) -> list[dict[str, Any]]:
    """The shown rows of a held-out evaluation: row i is held-out prompt i's greedy response."""
    return [shown_row(task, "heldout", index, response, reward)
            for index, (response, reward) in enumerate(zip(responses[:SHOWN_HELDOUT],
                                                            rewards[:SHOWN_HELDOUT]))]


def training_rows(task: Any, completions: Any, prompt_indices: Sequence[int],
                  group_size: int) -> list[dict[str, Any]]:
    """The shown rows of a consumed batch (`completions` in request-id order, each row's task
    prompt in `prompt_indices`): sample 0 of each of its first `SHOWN_TRAINING` prompts."""
    rows = range(0, min(len(prompt_indices), SHOWN_TRAINING * group_size), group_size)
    rewards = np.asarray(completions.rewards)
    return [shown_row(task, "train", int(prompt_indices[row]), completions.tokens.row(row),
                      float(rewards[row])) for row in rows]


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3g}"
    text = " ".join(str(value).split()) or "(empty)"
    return "`" + text.replace("`", "'").replace("|", "\\|") + "`"


def markdown_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """`rows` as a Markdown table (responses in code spans: what the model wrote, verbatim)."""
    columns = [c for c in COLUMNS if any(row.get(c) is not None for row in rows)]
    return [f"| {' | '.join(columns)} |", f"|{'---|' * len(columns)}",
            *(f"| {' | '.join(_cell(row.get(c)) for c in columns)} |" for row in rows)]


def _tables(shown: dict[str, dict[int, list[dict[str, Any]]]], versions: list[int],
            updates: list[int], prefix: str = "") -> list[str]:
    """The held-out tables of `versions` and the training tables of `updates`, each under a
    line naming it (`prefix` first: a run's label)."""
    heldout, training = shown.get("heldout", {}), shown.get("train", {})

    def named(what: str) -> str:
        return prefix + what if prefix else what.capitalize()

    return [*(line for version in versions for line in (
                named(f"held-out, version {version}:"), "", *markdown_table(heldout[version]),
                "")),
            *(line for update in updates for line in (
                named(f"training, update {update}:"), "", *markdown_table(training[update]),
                ""))]


def latest_lines(label: str, shown: dict[str, dict[int, list[dict[str, Any]]]]) -> list[str]:
    """`invar report`'s responses of one run: the held-out table of its first and last
    evaluated versions and the training samples of its last update."""
    versions = sorted(shown.get("heldout", {}))
    updates = sorted(shown.get("train", {}))
    lines = _tables(shown, sorted({*versions[:1], *versions[-1:]}), updates[-1:], f"{label}, ")
    return [f"## Responses of {label}", "", *lines] if lines else []


def report_lines(shown: dict[str, dict[int, list[dict[str, Any]]]],
                 last_updates: int = 3) -> list[str]:
    """report.md's section of responses: every evaluated version's held-out table, then the
    first update's and the last `last_updates` updates' training samples."""
    versions = sorted(shown.get("heldout", {}))
    updates = sorted(shown.get("train", {}))
    if not versions and not updates:
        return []
    return ["## Responses", "",
            f"Greedy responses to the first {SHOWN_HELDOUT} held-out prompts at each "
            "evaluated version, then sampled training responses with their rewards "
            "(`invar.runtime.responses`): read them before trusting a reward.", "",
            *_tables(shown, versions, sorted({*updates[:1], *updates[-last_updates:]}))]
