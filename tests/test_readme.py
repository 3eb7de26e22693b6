"""The README's figures are the reports' and the repository's, and its examples can be pasted
in order: each training example writes its own run directory, and `make train` starts a new
one each time."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _default_run() -> dict:
    """The default `invar train` run of reports/async_benchmark.json (section 4)."""
    return json.loads((ROOT / "reports" / "async_benchmark.json").read_text())["runs"]["default"]


def test_the_gate_size_is_the_number_of_bounds():
    bounds = len(list((ROOT / "spec" / "gate").glob("*.toml")))
    assert f"is a suite of {bounds} small bounds" in README


def test_the_default_run_s_done_line_is_the_report_s():
    summary = _default_run()["summary"]
    line = (f"done: {summary['updates']} updates in {summary['wall_seconds']:.1f} s, held-out "
            f"reward {summary['final_heldout_reward']:.3f}; report: runs/default/report.md")
    assert f"    {line}\n" in README


def test_the_held_out_curve_is_the_report_s():
    evaluations = json.loads((ROOT / "reports" / "default_run_curve.json").read_text()
                             )["evaluations"]
    # Versions from the last change on are said once: "1.000 (60 and after)".
    last = len(evaluations) - 1
    while last and round(evaluations[last - 1]["heldout_reward"], 3) == \
            round(evaluations[last]["heldout_reward"], 3):
        last -= 1
    points = [f"{e['heldout_reward']:.3f} ({e['version']})" for e in evaluations[:last]]
    points.append(f"{evaluations[last]['heldout_reward']:.3f} ({evaluations[last]['version']} "
                  f"and after)")
    points[0] = points[0].replace("(0)", "(version 0)")
    said = " ".join(README.split())
    assert f"Held-out greedy reward goes {' → '.join(points)} (" in said, points


def test_the_journal_sizes_are_the_report_s():
    measured = json.loads((ROOT / "reports" / "journal_size.json").read_text())
    updates, tokens = measured["updates"], measured["tokens"]
    every, kept = measured["runs"]["every"], measured["runs"]["kept"]
    said = " ".join(README.split())
    assert (f"The default run's journal takes {every['total'] / 1e6:.1f} MB, "
            f"{every['total'] / tokens:.1f} bytes per generated token "
            f"({measured['before'] / tokens:.1f} before the payloads left the lines") in said
    assert (f"{(kept['lines'] + kept['ledger']) / updates:,.0f} bytes per update on the default "
            f"run with K = {measured['keep']}.") in said


def test_the_trace_validation_figures_are_the_report_s():
    measured = json.loads((ROOT / "reports" / "trace_speed.json").read_text())
    validation = measured["read_seconds"] + measured["replay_seconds"]
    run, rescore = measured["run_seconds"], measured["rescore_seconds"]
    said = " ".join(README.split())
    assert (f"on the default run it took {validation:.2f} s against the run's {run:.1f} s, "
            f"{run / validation:.0f}x faster, and re-scoring its {measured['rescored']:,} "
            f"rewards {rescore:.2f} s more, {run / (validation + rescore):.0f}x faster with "
            "both") in said


def _shell_examples() -> list[tuple[str, str]]:
    """Each `$ ...` command in the README's indented blocks (continuation lines joined), with
    the line that follows it."""
    lines = README.splitlines()
    found = []
    index = 0
    while index < len(lines):
        line = lines[index].strip()
        index += 1
        if not line.startswith("$ "):
            continue
        command = line[2:]
        while command.endswith("\\") and index < len(lines):
            command = command[:-1] + " " + lines[index].strip()
            index += 1
        after = lines[index].strip() if index < len(lines) else ""
        found.append((command.split(" # ")[0].strip(), after))
    return found


def test_every_training_example_writes_its_own_run_directory():
    run_dirs = []
    for command, after in _shell_examples():
        words = shlex.split(command.replace("...", ""))
        if "train" not in words or not any(w.endswith("invar") for w in words):
            continue
        if after.startswith("invar: ") or {"--resume", "--print-config"} & set(words):
            continue  # a refusal shown, a resume, or no run
        given = [w.split("=", 1)[1] for w in words if w.startswith("output.run_dir=")]
        run_dirs.append(given[-1] if given else "runs/default")
    assert len(run_dirs) >= 5, run_dirs
    assert len(set(run_dirs)) == len(run_dirs), run_dirs


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_train_starts_a_new_run_directory_each_time():
    def planned(*args: str) -> str:
        # Under an outer make (CI runs the tests from `make test`) MAKEFLAGS and MAKELEVEL
        # make the inner one print "Leaving directory" lines; plan as a user's shell would.
        env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MAKELEVEL", "MFLAGS"}}
        done = subprocess.run(["make", "--no-print-directory", "-n", "train", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]

    assert re.search(r"invar train --set output\.run_dir='\"runs/train-\d{8}-\d{6}\"'$",
                     planned()), planned()
    assert planned("RUN=runs/mine").endswith("--set output.run_dir='\"runs/mine\"'")


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_train_into_a_run_s_directory_is_refused_naming_run(tmp_path):
    """Refused before invar starts (a stand-in environment: nothing is installed or run),
    saying how to go on in make's terms."""
    venv, run_dir = tmp_path / "venv", tmp_path / "run"
    venv.mkdir()
    (venv / ".installed").touch()  # newer than pyproject.toml: the setup is not redone
    run_dir.mkdir()
    (run_dir / "journal.jsonl").write_text("{}\n")
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MAKELEVEL", "MFLAGS"}}
    done = subprocess.run(["make", "--no-print-directory", "train", f"RUN={run_dir}",
                           f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.splitlines()[0] == (
        f"make train: {run_dir} holds a run already: continue it with `{venv}/bin/invar train "
        f"--resume {run_dir}`, or start another with make train RUN=runs/NEW_NAME")


def test_the_task_kinds_and_the_task_interface_are_the_code_s():
    from invar.runtime.tasks import TASK_KINDS, Task
    count = {3: "three", 4: "four", 5: "five", 6: "six"}[len(TASK_KINDS)]
    assert f"`task.name` picks one of {count} kinds:" in README
    assert all(f'\n- `"{kind}"`' in README for kind in TASK_KINDS)
    block = README.split("class Task(Protocol):")[1].split("```")[0]
    members = [name for name in vars(Task) if not name.startswith("_")]
    # eos_token is optional, so not part of the Protocol's check: read with tasks.end_token.
    for name in [*members, "eos_token"]:
        assert re.search(rf"^    (?:def )?{name}\b", block, re.MULTILINE), name


def test_the_two_process_figures_are_the_report_s_and_the_bound_s_size_the_pinned_one():
    speed = (ROOT / "reports" / "checker" / "invar_model_speed.md").read_text()
    row = re.search(r"^\| driver \(([\d,]+) states\) \| ([\d.]+) \([\d.]+\), ([\d.]+) "
                    r"\([\d.]+\) \| ([\d.]+) \([\d.]+\), ([\d.]+) \([\d.]+\) \|", speed,
                    re.MULTILINE)
    assert row, "the driver row of the two-process table"
    one = (float(row[2]) + float(row[3])) / 2
    two = (float(row[4]) + float(row[5])) / 2
    pinned = json.loads((ROOT / "checker" / "gate" / "pinned.json").read_text())
    said = " ".join(README.split())
    assert (f"two processes took the `driver` bound as it was on 2026-12-02 ({row[1]} states) "
            f"from {one:.1f} to {two:.1f} s of wall time, the mean of two rounds") in said
    assert (f"the bound has {pinned['bounds']['driver']['distinct_states']:,} states "
            "since") in said


def real_model_sentence(run: str) -> str:
    """What README says to expect of the real-model example, from the recorded run `run` of
    reports/real_model/ (its metrics.jsonl as `invar train` wrote it)."""
    path = ROOT / "reports" / "real_model" / run / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    updates = [row for row in rows if row["kind"] == "update"]
    evaluations = [row for row in rows if row["kind"] == "evaluation"]
    best = max(evaluations, key=lambda e: (e["heldout_reward"], -e["version"]))
    first, last = evaluations[0], evaluations[-1]
    return (f"{len(updates)} updates in {updates[-1]['wall'] / 60:.0f} minutes; held-out "
            f"greedy accuracy {first['heldout_reward']:.3f} at version 0, "
            f"{best['heldout_reward']:.3f} at version {best['version']} (its best), "
            f"{last['heldout_reward']:.3f} at version {last['version']}; the base model's "
            f"sampled answers in the first update's batch were right "
            f"{updates[0]['reward']:.0%} of the time.")


def test_the_real_model_example_s_figures_are_its_report_s():
    said = " ".join(README.split())
    run = re.search(r"What to expect, from its run `([\w-]+)`", said)
    assert run is not None, "README names the recorded run its figures come from"
    assert real_model_sentence(run.group(1)) in said
