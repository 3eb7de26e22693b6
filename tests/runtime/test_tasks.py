"""Tasks as a plug-in: the interface, the JSONL task (with the shipped 50-line file), plug-in
modules, and verifiers that raise, return nonsense or hang, run with a time limit."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from invar.model.errors import ConfigError
from invar.runtime.config import load_config, reverse_task, to_dict
from invar.runtime.padding import PAD
from invar.runtime.task import DigitReversal
from invar.runtime.tasks import (
    ByteTokenizer,
    JsonlTask,
    Task,
    build_task,
    last_number,
    prompt_rows,
)
from invar.runtime.verifier import FAILED, OK, TIMEOUT, InlineVerifier, Job, VerifierPool

ADDITION = Path(__file__).parents[2] / "invar" / "runtime" / "data" / "addition.jsonl"
PLUGINS = Path(__file__).parent / "plugin_tasks.py"
EXAMPLE = Path(__file__).parents[2] / "examples" / "parity_task.py"
JSONL = ("task.name=jsonl", f"task.path={json.dumps(str(ADDITION))}", "task.prompt_length=8",
         "task.response_length=4", "task.verifier=numeric", "policy.vocab_size=258")


def refused(*overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_config(None, list(overrides))
    return caught.value


def encode(text: str) -> tuple[int, ...]:
    return tuple(ByteTokenizer().encode(text))


# -- the JSONL task --------------------------------------------------------------------------


def test_the_shipped_file_gives_prompts_of_both_splits_that_the_runtime_left_pads():
    task = JsonlTask(ADDITION, prompt_length=8, response_length=4, verifier="numeric")
    assert isinstance(task, Task)
    assert (task.split_size("train"), task.split_size("heldout")) == (40, 10)
    assert task.prompt(2) == [*encode("3+4=")]  # line 3, as it is
    assert task.eos_token == 257
    prompts = prompt_rows(task, "train", [2, 0])
    assert prompts.tokens[0].tolist() == [PAD] * 4 + [*encode("3+4=")]
    assert prompts.lengths[0] == 4 and prompts.padded
    assert task.prompt(42) == task.prompt(2)  # indices wrap around the split
    assert task.prompt(0, "heldout") != task.prompt(0)
    assert task.vocab_size == 258


def test_numeric_and_exact_verifiers_read_the_response_up_to_eos():
    numeric = JsonlTask(ADDITION, 8, 4, "numeric")
    eos, pad = ByteTokenizer.eos_token_id, ByteTokenizer.pad_token_id
    assert numeric.score("train", 2, (*encode("7"), eos, *encode("99"))) == 1.0
    assert numeric.score("train", 2, (*encode("7.0"), pad)) == 1.0
    assert numeric.score("train", 2, encode("17  ")) == 0.0
    assert numeric.score("train", 2, (eos, eos, eos, eos)) == 0.0
    exact = JsonlTask(ADDITION, 8, 4, "exact")
    assert exact.score("train", 2, (*encode(" 7 "), eos)) == 1.0
    assert exact.score("train", 2, encode("7.0")) == 0.0
    assert last_number("so 1,234.5 it is") == 1234.5


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "task.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


GOOD = '{"prompt": "1+1=", "answer": "2", "split": "train"}'
HELD = '{"prompt": "2+2=", "answer": 4, "split": "heldout"}'


@pytest.mark.parametrize("bad, words", [
    ('{"prompt": "1+1=", "answer": "2"', "not JSON"),
    ('["1+1=", "2"]', "expected an object"),
    ('{"prompt": "1+1="}', '"answer" must be'),
    ('{"prompt": "", "answer": "2"}', '"prompt" must be a non-empty string'),
    ('{"prompt": "1+1=", "answer": "2", "id": 7}', "unknown field(s) 'id'"),
    ('{"prompt": "1+1=", "answer": "two"}', "holds no number"),
    ('{"prompt": "1+1=", "answer": "2", "split": "test"}', '"split" must be one of'),
    ('{"prompt": "' + "1" * 40 + '", "answer": "2"}', "40 tokens, longer than task.prompt_length"),
    ("", "empty line"),
])
def test_a_bad_line_is_refused_with_its_number(tmp_path, bad, words):
    path = write(tmp_path, GOOD, HELD, bad, GOOD)
    error = refused(*JSONL, f"task.path={json.dumps(str(path))}")
    assert error.fields == ("task.path",)
    assert "line 3: " in str(error) and words in str(error)


def test_a_file_without_held_out_lines_or_not_there_is_refused(tmp_path):
    error = refused(*JSONL, f"task.path={json.dumps(str(write(tmp_path, GOOD, GOOD)))}")
    assert "no heldout line" in str(error)
    error = refused(*JSONL, f"task.path={json.dumps(str(tmp_path / 'missing.jsonl'))}")
    assert error.fields == ("task.path",) and "cannot read" in str(error)
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + '{"prompt": "é", "answer": 1}'.encode("latin-1"))
    assert "line 2: not UTF-8" in str(refused(*JSONL, f"task.path={json.dumps(str(path))}"))


def test_a_jsonl_task_needs_a_policy_that_holds_its_tokens():
    error = refused(*JSONL[:-1])
    assert error.fields == ("policy.vocab_size",) and "must be >= 258" in str(error)
    error = refused(*JSONL, "policy.max_len=10")
    assert error.fields == ("policy.max_len",) and "8 + 4 = 12 tokens" in str(error)


class TemplatedTokenizer(ByteTokenizer):
    """A tokenizer with a chat template, as a Hugging Face one may have."""

    chat_template = "<user>{content}<assistant>"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert messages[-1]["role"] == "user" and add_generation_prompt and not tokenize
        return f"<u>{messages[-1]['content']}<a>"


def test_the_chat_template_wraps_the_prompt_when_the_tokenizer_has_one():
    task = JsonlTask(ADDITION, 12, 4, "numeric", TemplatedTokenizer())
    assert task.prompt(2)[-10:] == list(encode("<u>3+4=<a>"))


# -- plug-in modules -------------------------------------------------------------------------


def test_a_plugin_is_loaded_by_file_path_or_module_path(monkeypatch):
    config = load_config(None, ["task.name=module", f"task.module={EXAMPLE}:make_task",
                                "task.options.bits=5"])
    task = build_task(config.task)
    assert (task.name, task.prompt_length, task.bits) == ("parity", 6, 5)
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    by_name = build_task(load_config(None, ["task.name=module",
                                            "task.module=parity_task:make_task"]).task)
    assert by_name.prompt(3) == build_task(
        load_config(None, ["task.name=module", f"task.module={EXAMPLE}:make_task"]).task
    ).prompt(3)


@pytest.mark.parametrize("module, options, words", [
    ("no_such_module_here:make", "", "cannot import 'no_such_module_here'"),
    ("{plugins}:nothing_here", "", "has no callable 'nothing_here'"),
    ("{plugins}", "", "write \"package.module:factory\""),
    ("{plugins}:not_a_task", "", "lacks name, prompt_length"),
    ("{example}:make_task", "task.options.bits=0", "ValueError: bits must be >= 1"),
    ("{example}:make_task", "task.options.colour=1", "TypeError"),
])
def test_a_plugin_that_cannot_run_is_refused_before_anything_runs(module, options, words):
    module = module.format(plugins=PLUGINS, example=EXAMPLE)
    error = refused("task.name=module", f"task.module={json.dumps(module)}",
                    *([options] if options else []))
    assert "task.module" in error.fields and words in str(error)


def test_a_setting_of_another_kind_of_task_is_refused_not_ignored():
    error = refused(f"task.path={json.dumps(str(ADDITION))}", "task.prompt_length=8")
    assert error.fields == ("task.path", "task.prompt_length")
    assert "apply to task.name = \"jsonl\", but task.name is 'reverse'" in str(error)
    error = refused(*JSONL, "task.options.bits=3")
    assert error.fields == ("task.options",) and "task.name is 'jsonl'" in str(error)


def test_an_unknown_task_kind_is_refused():
    error = refused("task.name=sudoku")
    assert error.fields == ("task.name",)
    assert "known: reverse, arithmetic, jsonl, module" in str(error)


# -- verifiers: failures and time limits -----------------------------------------------------


def plugin_config(processes=1, timeout=0.5, failure_reward=0.0, **options) -> dict:
    return to_dict(load_config(None, [
        "task.name=module", f"task.module={PLUGINS}:misbehaving",
        *(f"task.options.{k}={v}" for k, v in options.items()),
        f"task.verifier_processes={processes}", f"task.verifier_timeout_s={timeout}",
        f"task.failure_reward={failure_reward}"]).task)


def jobs(task, count):
    return [Job("train", index, (sum(task.prompt(index)[:-1]) % 2,)) for index in range(count)]


def test_a_raising_or_nonsense_verifier_is_a_recorded_failure_inline_and_in_the_pool():
    config = plugin_config(processes=2, timeout=5.0, failure_reward=-1.0, raise_at=1,
                           nonsense_at=3)
    task = build_task(config)
    inline = InlineVerifier(task, -1.0).submit(jobs(task, 10)).outcomes()
    pool = VerifierPool(config)
    try:
        pooled = pool.submit(jobs(task, 10)).outcomes()
    finally:
        pool.close()
    assert pooled == inline
    statuses = [o.status for o in inline]
    assert statuses == [OK, FAILED, OK, FAILED, OK] * 2
    assert [o.reward for o in inline if o.status == FAILED] == [-1.0] * 4
    assert all(o.reward == 1.0 for o in inline if o.status == OK)
    assert "ZeroDivisionError: a verifier bug" in inline[1].detail
    assert "returned 'yes', not a number" in inline[3].detail


def test_a_hung_verifier_times_out_and_the_calls_after_it_still_count():
    config = plugin_config(hang_at=2)
    task = build_task(config)
    pool = VerifierPool(config)
    try:
        began = time.monotonic()
        outcomes = pool.submit(jobs(task, 10)).outcomes()
        took = time.monotonic() - began
    finally:
        pool.close()
    assert [o.status for o in outcomes] == [OK, OK, TIMEOUT, OK, OK] * 2
    assert all(o.reward == 1.0 for o in outcomes if o.status == OK)
    assert "task.verifier_timeout_s = 0.5 s" in outcomes[2].detail
    assert took < 10  # two time limits and two restarts, not an hour


def test_pooled_rewards_equal_inline_ones_on_the_reversal_task():
    task = DigitReversal(4)
    rng = np.random.default_rng(0)
    work = [Job("train", i, tuple(rng.integers(0, 10, 4).tolist())) for i in range(200)]
    pool = VerifierPool(reverse_task(4, verifier_processes=2))
    try:
        assert pool.submit(work).outcomes() == InlineVerifier(task, 0.0).submit(work).outcomes()
    finally:
        pool.close()


# -- runs --------------------------------------------------------------------------------------


def update_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row["kind"] == "update"]


def test_a_run_learns_from_the_jsonl_file_serial_equal_to_async(tmp_path, rt):
    extra = (*JSONL, "protocol.eval_every=3")
    serial = rt.tiny_config(tmp_path / "serial", *extra)
    rt.run_serial(serial)
    asynchronous = rt.tiny_config(tmp_path / "async", *extra)
    rt.run_driver(asynchronous)
    for name in ("serial", "async"):
        rows = update_rows(tmp_path / name)
        assert [r["update"] for r in rows] == [0, 1, 2]
        assert all(r["verifier_failures"] == r["verifier_timeouts"] == 0 for r in rows)
        assert rt.summary(tmp_path / name)["final_heldout_reward"] is not None
    assert [r["reward"] for r in update_rows(tmp_path / "serial")] == \
        [r["reward"] for r in update_rows(tmp_path / "async")]
    rt.assert_same_weights(rt.final_weights(tmp_path / "serial"),
                           rt.final_weights(tmp_path / "async"))


def test_a_run_whose_verifier_raises_and_hangs_completes_with_the_failures_counted(tmp_path,
                                                                                    rt):
    config = rt.tiny_config(tmp_path, "task.name=module",
                            f"task.module={json.dumps(str(PLUGINS) + ':misbehaving')}",
                            "task.options.every=7", "task.options.raise_at=1",
                            "task.options.hang_at=4", "task.verifier_timeout_s=0.3",
                            "task.failure_reward=-1.0", "policy.max_len=8")
    rt.run_driver(config)
    rows = update_rows(tmp_path)
    assert [r["update"] for r in rows] == [0, 1, 2]
    # Each batch holds prompts 4u..4u+3 (4 samples each): which fail is fixed by the index.
    for row in rows:
        indices = range(4 * row["update"], 4 * row["update"] + 4)
        assert row["verifier_failures"] == 4 * sum(i % 7 == 1 for i in indices)
        assert row["verifier_timeouts"] == 4 * sum(i % 7 == 4 for i in indices)
    assert sum(r["verifier_timeouts"] for r in rows) > 0
    assert sum(r["verifier_failures"] for r in rows) > 0
