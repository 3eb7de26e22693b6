"""Bad input to `invar train` and `invar-check --trace`: refused with the key or file named,
exit 2, one line, no traceback, nothing written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from invar.runtime import cli

BAD_SETTINGS = [
    ("policy.heads=0", "policy.heads"),
    ("optim.lr=-1", "optim.lr"),
    ("optim.lr=nan", "optim.lr"),
    ("optim.betas=[1.5,0.9]", "optim.betas[0]"),
    ("optim.eps=-1.0", "optim.eps"),
    ("learner.device=foo", "learner.device"),
    ("learner.cpus=[99]", "learner.cpus"),
    ("rollout.cpus=[99]", "rollout.cpus"),
    ("policy.vocab_size=5", "policy.vocab_size"),
    # Issue 41: values that passed and then hung or crashed the run.
    ("optim.lr=1e308", "optim.lr"),  # weights infinite at the first step, refused forever
    ("output.retry_seconds=1e-300", "output.retry_seconds"),  # re-sent without end
    ("task.verifier_timeout_s=1e-300", "task.verifier_timeout_s"),  # every call a timeout
    ("task.verifier_timeout_s=1e10", "task.verifier_timeout_s"),  # select() overflows
    ("protocol.seed=100000000000000000000000000", "protocol.seed"),  # torch's seed overflows
]


def _tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _refused(capsys, argv: list[str], named: str, what: str = "configuration refused") -> str:
    status = cli.main(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"invar: {what}: "), lines[0]
    assert named in lines[0], lines[0]
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("item, key", BAD_SETTINGS)
def test_bad_setting_is_refused_with_its_key(item, key, tmp_path, capsys):
    assert all(cpu != 99 for cpu in os.sched_getaffinity(0))
    run_dir = tmp_path / "run"
    line = _refused(capsys, ["train", "--set", f"output.run_dir={json.dumps(str(run_dir))}",
                             "--set", item], key)
    assert line.startswith(f"invar: configuration refused: {key}")
    assert not run_dir.exists()


def test_cuda_is_refused_where_there_is_none(tmp_path, capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    run_dir = tmp_path / "run"
    line = _refused(capsys, ["train", "--set", f"output.run_dir={json.dumps(str(run_dir))}",
                             "--set", "learner.device=cuda"], "learner.device")
    assert "CUDA is not available" in line
    assert not run_dir.exists()


def test_non_utf8_toml_is_refused_naming_the_file(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_bytes(b"[optim]\nlr = 0.001 # caf\xe9\n")
    line = _refused(capsys, ["train", str(path), "--set",
                             f"output.run_dir={json.dumps(str(tmp_path / 'run'))}"], str(path))
    assert "not UTF-8" in line and "line 2" in line
    assert not (tmp_path / "run").exists()


# -- --resume of a damaged run directory ---------------------------------------------------------

@pytest.fixture(scope="module")
def finished(tmp_path_factory, rt):
    """A complete tiny run, made with the real command line."""
    run_dir = tmp_path_factory.mktemp("cli-errors") / "run"
    overrides = rt.tiny_overrides(run_dir, "protocol.total_updates=2")
    done = subprocess.run(rt.cli("train", *(a for item in overrides for a in ("--set", item))),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return run_dir


def _missing_journal(run_dir: Path) -> None:
    (run_dir / "journal.jsonl").unlink()


def _non_utf8_journal(run_dir: Path) -> None:
    path = run_dir / "journal.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b'"', b'"\xff', 1)
    path.write_bytes(b"\n".join(lines))


def _garbage_config(run_dir: Path) -> None:
    (run_dir / "config.json").write_bytes(b"{\"protocol\": ]garbage")


def _list_config(run_dir: Path) -> None:
    (run_dir / "config.json").write_text("[1, 2, 3]")


def _non_utf8_config(run_dir: Path) -> None:
    (run_dir / "config.json").write_bytes(b"{\"x\": \"\xff\"}")


@pytest.mark.parametrize("damage, file, why", [
    (_missing_journal, "journal.jsonl", "not found"),
    (_non_utf8_journal, "journal.jsonl", "not UTF-8"),
    (_garbage_config, "config.json", "not valid JSON"),
    (_list_config, "config.json", "JSON object"),
    (_non_utf8_config, "config.json", "not UTF-8"),
])
def test_resume_of_a_damaged_run_directory_is_refused(finished, tmp_path, capsys, damage, file,
                                                      why):
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    damage(run_dir)
    before = _tree(run_dir)
    line = _refused(capsys, ["train", "--resume", str(run_dir)], str(run_dir / file),
                    "resume refused")
    assert why in line
    assert _tree(run_dir) == before


DEEP = "[" * 100_000 + "]" * 100_000
"""JSON nested past the parser's recursion limit (a RecursionError, not a ValueError)."""


def _deep_config(run_dir: Path) -> None:
    (run_dir / "config.json").write_text(DEEP)


def _deep_options(run_dir: Path) -> None:
    """Nested little enough to parse, too deep to copy and rebuild as a configuration."""
    config = json.loads((run_dir / "config.json").read_text())
    config["task"]["options"] = json.loads('{"a": ' * 600 + "1" + "}" * 600)
    (run_dir / "config.json").write_text(json.dumps(config))


def _deep_journal_line(run_dir: Path) -> None:
    path = run_dir / "journal.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = DEEP + "\n"
    path.write_text("".join(lines))


@pytest.mark.parametrize("damage, file, why", [
    (_deep_config, "config.json", "nested too deeply"),
    (_deep_options, "config.json", "nested more than 32 deep"),
    (_deep_journal_line, "journal.jsonl:4", "nested too deeply"),
], ids=["config", "config_options", "journal_line"])
def test_resume_of_deeply_nested_files_is_refused_in_one_line(finished, tmp_path, capsys,
                                                              damage, file, why):
    """Issue 41: a RecursionError's traceback, exit 1."""
    test_resume_of_a_damaged_run_directory_is_refused(finished, tmp_path, capsys, damage, file,
                                                      why)


@pytest.fixture(scope="module")
def pruned(tmp_path_factory, rt):
    """A complete tiny run that keeps one update's payloads: a ledger and snapshots."""
    run_dir = tmp_path_factory.mktemp("cli-errors-pruned") / "run"
    overrides = rt.tiny_overrides(run_dir, "protocol.total_updates=3",
                                  "output.journal_keep_updates=1")
    done = subprocess.run(rt.cli("train", *(a for item in overrides for a in ("--set", item))),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return run_dir


def _deep_ledger_record(run_dir: Path) -> Path:
    path = run_dir / "journal.d" / "ledger.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[0] = DEEP + "\n"
    path.write_text("".join(lines))
    return Path("journal.d", "ledger.jsonl:1")


def _deep_snapshot(run_dir: Path) -> Path:
    newest = sorted((run_dir / "journal.d").glob("snapshot-*.json"))[-1]
    newest.write_text(DEEP)
    return newest.relative_to(run_dir)


@pytest.mark.parametrize("damage", [_deep_ledger_record, _deep_snapshot],
                         ids=["ledger", "snapshot"])
def test_resume_of_a_deeply_nested_ledger_or_snapshot_is_refused(pruned, tmp_path, capsys,
                                                                 damage):
    run_dir = tmp_path / "run"
    shutil.copytree(pruned, run_dir)
    file = damage(run_dir)
    before = _tree(run_dir)
    line = _refused(capsys, ["train", "--resume", str(run_dir)], str(run_dir / file),
                    "resume refused")
    assert "nested too deeply" in line
    assert _tree(run_dir) == before


@pytest.mark.parametrize("text", ["x = " + "[" * 100_000 + "]" * 100_000,
                                  "[task]\noptions = " + "{a=" * 40 + "1" + "}" * 40],
                         ids=["parser", "options"])
def test_a_deeply_nested_config_file_is_refused_in_one_line(tmp_path, capsys, text):
    path = tmp_path / "deep.toml"
    path.write_text(text)
    run_dir = tmp_path / "run"
    line = _refused(capsys, ["train", str(path), "--set",
                             f"output.run_dir={json.dumps(str(run_dir))}"], str(path))
    assert "nested" in line
    assert not run_dir.exists()


def test_a_deeply_nested_override_is_refused_in_one_line(tmp_path, capsys):
    run_dir = tmp_path / "run"
    line = _refused(capsys, ["train", "--set", "task.options.a=" + "[" * 100_000 + "]" * 100_000,
                             "--set", f"output.run_dir={json.dumps(str(run_dir))}"],
                    "task.options.a")
    assert "nested" in line
    assert not run_dir.exists()


def test_resume_of_a_missing_directory_is_refused(tmp_path, capsys):
    _refused(capsys, ["train", "--resume", str(tmp_path / "nothing")], "--resume",
             "resume refused")
    assert not (tmp_path / "nothing").exists()


# -- invar-check --trace ---------------------------------------------------------------------

def test_trace_of_a_non_utf8_file_is_bad_input(finished, tmp_path):
    path = tmp_path / "journal.jsonl"
    lines = (finished / "journal.jsonl").read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b'"', b'"\xff', 1)
    path.write_bytes(b"\n".join(lines))
    done = subprocess.run([sys.executable, "-m", "checker.cli", "--trace", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert str(path) in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_trace_of_a_deeply_nested_journal_line_is_bad_input_not_a_departure(finished,
                                                                            tmp_path):
    """Issue 41: a RecursionError exited 1, the code of a departure."""
    path = tmp_path / "journal.jsonl"
    lines = (finished / "journal.jsonl").read_text().splitlines(keepends=True)
    lines[2] = DEEP + "\n"
    path.write_text("".join(lines))
    done = subprocess.run([sys.executable, "-m", "checker.cli", "--trace", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr[-2000:])
    assert (done.stdout + done.stderr).strip() == \
        f"invar-check: {path}:3: nested too deeply to be read"


def test_trace_of_a_path_that_is_not_there_says_so_in_one_line(tmp_path):
    missing = tmp_path / "nonexistent"
    done = subprocess.run([sys.executable, "-m", "checker.cli", "--trace", str(missing)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    assert done.stderr == (f"invar-check: {missing}: no such run directory or journal "
                           "(--trace takes a run directory of `invar train` or its "
                           "journal.jsonl)\n")


def test_trace_of_a_run_directory_validates_its_journal(finished, tmp_path):
    done = subprocess.run([sys.executable, "-m", "checker.cli", "--trace", str(finished)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert f"{finished / 'journal.jsonl'}: complete run" in " ".join(done.stdout.split())
    empty = tmp_path / "empty"
    empty.mkdir()
    done = subprocess.run([sys.executable, "-m", "checker.cli", "--trace", str(empty)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.strip() == (f"invar-check: {empty}: a directory without a journal.jsonl: "
                                   "not a run directory of `invar train`")


def test_a_missing_model_directory_is_refused_against_policy_path(tmp_path, capsys):
    """A JSONL task reads policy.path's tokenizer (task.tokenizer = "auto"): the key at
    fault is policy.path, which the user set, not task.tokenizer, which they did not."""
    line = _refused(capsys, ["train", "--set", "policy.kind=transformers",
                             "--set", f"policy.path={json.dumps(str(tmp_path / 'absent'))}",
                             "--set", "task.name=jsonl", "--set", "task.verifier=numeric",
                             "--set", "task.path=invar/runtime/data/addition.jsonl"],
                    "policy.path")
    assert line == (f"invar: configuration refused: policy.path: "
                    f"{str(tmp_path / 'absent')!r} is neither a model directory nor a .gguf "
                    "file")


def test_starting_a_run_where_one_is_says_how_to_go_on(finished, capsys, rt):
    before = _tree(finished)
    with rt.torch_globals_kept():
        status = cli.main(["train", *(a for item in rt.tiny_overrides(finished)
                                      for a in ("--set", item))])
    err = capsys.readouterr().err.strip()
    assert status == 2, err
    assert err == (f"invar: cannot start: {finished} holds a run already (journal.jsonl): "
                   f"continue it with `invar train --resume {finished}`, or start another "
                   "with --set output.run_dir=runs/NEW_NAME")
    assert cli.main(["train", "--serial", "--set", f"output.run_dir={str(finished)!r}"]) == 2
    assert capsys.readouterr().err == (f"invar: cannot start: {finished} holds a run already "
                                       "(journal.jsonl): a serial run needs a new one with "
                                       "--set output.run_dir=runs/NEW_NAME\n")
    assert _tree(finished) == before


# -- issue 41: what was accepted without a word ------------------------------------------------

@pytest.mark.parametrize("run_dir", ["", ".", ".."])
def test_a_new_run_in_the_current_directory_is_refused(tmp_path, capsys, monkeypatch, run_dir):
    """`output.run_dir = ""` wrote the run into the current directory, among its files."""
    here = tmp_path / "project"
    here.mkdir()
    (here / "notes.txt").write_text("mine")
    monkeypatch.chdir(here)
    line = _refused(capsys, ["train", "--set", f"output.run_dir={json.dumps(run_dir)}"],
                    "output.run_dir")
    assert "a directory of its own" in line
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["notes.txt", "project"]


def test_an_endless_config_file_is_refused_after_its_limit(tmp_path, rt):
    """/dev/zero was read until memory ran out (14-20 GB): run in a process that may map 3 GB,
    so that a reader without a bound fails there instead of taking the machine's memory."""
    import resource

    def three_gigabytes() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    done = subprocess.run(rt.cli("train", "/dev/zero", "--set",
                                 f"output.run_dir={json.dumps(str(tmp_path / 'run'))}"),
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=three_gigabytes)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0] == ("invar: configuration refused: /dev/zero: cannot read config: longer "
                        "than 1048576 bytes")
    assert not (tmp_path / "run").exists()


def _store_file_a_directory(run_dir: Path) -> Path:
    (stored,) = sorted((run_dir / "store").glob("weights-*.bin"))
    stored.unlink()
    stored.mkdir()
    return stored


def test_a_store_file_that_is_a_directory_is_refused(finished, tmp_path, capsys):
    """A traceback (IsADirectoryError in `store.heal`) before."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    stored = _store_file_a_directory(run_dir)
    before = _tree(run_dir)
    line = _refused(capsys, ["train", "--resume", str(run_dir)], str(stored), "resume refused")
    assert "is not a file" in line
    assert _tree(run_dir) == before and stored.is_dir()


def test_a_run_directory_is_driven_by_one_driver_at_a_time(finished, tmp_path, capsys):
    """No lock before: two drivers could append to one journal. While one holds the run
    directory (`files.directory_lock`, as a driver does), a resume and a new run there are
    refused before anything is read or written; once it lets go, the resume goes on."""
    from invar.runtime.files import directory_lock
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    before = _tree(run_dir)
    with directory_lock(run_dir):
        line = _refused(capsys, ["train", "--resume", str(run_dir)], str(run_dir),
                        "resume refused")
        assert "another invar driver holds this run directory" in line
        _refused(capsys, ["train", "--set", f"output.run_dir={json.dumps(str(run_dir))}"],
                 str(run_dir))
    assert _tree(run_dir) == before
    assert cli.main(["train", "--resume", str(run_dir)]) == 0  # complete: nothing to do
