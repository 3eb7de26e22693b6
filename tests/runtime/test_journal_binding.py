"""What a journal binds besides its events (`invar.runtime.binding`), as a resume holds a run
to it: the configuration (config.json is its copy) and the files the run reads.

The journal is the canonical run of a small protocol, written as a driver writes it, for a
JSONL task of the package's addition file: a resume of it is checked whole (`resume_config`)
without training anything.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers.journals import small_config
from invar.model.errors import ConfigError
from invar.runtime import journal
from invar.runtime.binding import bound_files, bound_settings
from invar.runtime.cli import resume_config
from invar.runtime.config import load_config, to_dict
from invar.testing import canonical_run

ADDITION = Path(__file__).parents[2] / "invar" / "runtime" / "data" / "addition.jsonl"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run of a JSONL task whose file lies beside it, as `invar train` leaves it."""
    task_file = shutil.copy(ADDITION, tmp_path / "addition.jsonl")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = load_config(None, ['task.name="jsonl"', f"task.path={json.dumps(str(task_file))}",
                                "policy.vocab_size=258", "policy.max_len=80",
                                f"output.run_dir={json.dumps(str(run_dir))}"])
    protocol = small_config()
    config = load_config(None, base={**to_dict(config), "protocol": to_dict(protocol)})
    journal.write_events(run_dir / "journal.jsonl", protocol, canonical_run(protocol).events,
                         settings=bound_settings(config), files=bound_files(config))
    (run_dir / "config.json").write_text(json.dumps(to_dict(config)))
    return run_dir


def test_a_task_file_changed_since_the_run_is_refused_naming_it(run_dir):
    resume_config(str(run_dir), None, [])  # as it was written: nothing to say
    task_file = run_dir.parent / "addition.jsonl"
    task_file.write_text(task_file.read_text().replace('"answer": 29', '"answer": 30', 1))
    with pytest.raises(ConfigError) as refused:
        resume_config(str(run_dir), None, [])
    assert refused.value.fields == ("task.path",)
    assert "is not the file the run was started with" in refused.value.reason


def test_config_json_edited_by_hand_is_refused_naming_the_keys(run_dir):
    saved = json.loads((run_dir / "config.json").read_text())
    saved["optim"]["lr"] = 0.5
    saved["output"]["retry_seconds"] = 1.0  # operational, but not changed by a resume
    (run_dir / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ConfigError) as refused:
        resume_config(str(run_dir), None, [])
    assert refused.value.fields == ("optim.lr", "output.retry_seconds")
    assert "optim.lr 0.001 -> 0.5" in refused.value.reason


def test_a_resume_s_change_is_a_line_of_the_journal_and_config_json_may_lag_it(run_dir):
    """The driver journals a resume's operational change, then writes config.json: one that
    died between the two leaves config.json as the journal bound it before the change, which
    the next resume accepts; it resumes with the journal's values."""
    config, _, binding = resume_config(str(run_dir), None, ["output.retry_seconds=5.0"])
    writer = journal.Journal(run_dir / "journal.jsonl", config.protocol)
    writer.record_settings({"output.retry_seconds": 5.0})
    writer.close()
    config, _, binding = resume_config(str(run_dir), None, [])  # config.json says 20.0
    assert config.output.retry_seconds == 5.0
    assert [changes for _, changes in binding.changes] == [{"output.retry_seconds": 5.0}]
    lines = (run_dir / "journal.jsonl").read_text().splitlines()
    assert lines[-1].startswith('{"settings_changed":{"output.retry_seconds":5.0},"chain":')
