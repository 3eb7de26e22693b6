"""`invar train [CONFIG.toml] [--set key=value ...] [--backend NAME] [--resume RUN_DIR]
[--serial] [--journal-key FILE] [--print-config]`; `invar report RUN_DIR... [--out DIR]
[--threshold X]`;
`invar export RUN_DIR OUT_DIR [--version N]`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import signal
import sys
from pathlib import Path
from typing import Any

from invar.model.errors import ConfigError
from invar.model.messages import parse_json
from invar.model.schedule import report
from invar.runtime.allocator import limit_fragmentation
from invar.runtime.backend import LearnerBackend
from invar.runtime.config import (
    CONFIG_MAX_BYTES,
    KIND_KEYS,
    OPERATIONAL,
    ROUNDING,
    TrainConfig,
    changed_keys,
    check_nesting,
    describe_bad_byte,
    load_config,
    to_dict,
)
from invar.runtime.files import TooLarge, directory_lock, read_at_most
from invar.runtime.policy_config import SHAPE_FIELDS
from invar.runtime.registry import LEARNERS, resolve


def make_learner(config: TrainConfig) -> LearnerBackend:
    """The learner backend the configuration names (its module imported now)."""
    open_learner = resolve(LEARNERS[config.learner.backend].learner)
    return open_learner(config, Path(config.output.run_dir) / "commits")


def train(config: TrainConfig, resume: bool = False, serial: bool = False,
          restored: Any = None, journal_key: bytes | None = None,
          binding: Any = None) -> dict[str, Any]:
    """Run (or resume) training; returns the run's summary. `restored`: what
    `journal.restore` returned for the run's journal, when the caller checked it already,
    and `binding`, what the journal binds (`journal_format.Binding`);
    `journal_key`: the key of the journal's chain (`journal.read_key`), None: unkeyed."""
    from invar.runtime.driver import Driver, pin_current_process
    from invar.runtime.serial import run_serial
    pin_current_process(config.learner.cpus)
    learner = make_learner(config)
    if serial:
        run_serial(config, learner, journal_key=journal_key)
        return json.loads((Path(config.output.run_dir) / "summary.json").read_text())
    asyncio.run(Driver(config, learner, resume=resume, restored=restored, binding=binding,
                       journal_key=journal_key, stop_on_signals=True).run())
    return json.loads((Path(config.output.run_dir) / "summary.json").read_text())


def main(argv: list[str] | None = None) -> int:
    # The run directory's lock (`_hold_run_directory`) is held until the command ends.
    with contextlib.ExitStack() as held:
        return _main(argv, held)


def _main(argv: list[str] | None, held: contextlib.ExitStack) -> int:
    limit_fragmentation()  # before the first tensor: the driver's threads each allocate
    parser = argparse.ArgumentParser(prog="invar", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "train", help="train the default policy (or CONFIG.toml)",
        epilog="Every configuration key, with its default and what it does, is documented in "
               "invar/runtime/config.py (the README's \"invar train\" section has the "
               "overview); `invar train --print-config` prints them all, resolved, as TOML.")
    run.add_argument("config", nargs="?", help="TOML configuration (defaults if omitted)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a key, e.g. --set optim.lr=3e-4 (repeatable)")
    synchronous = "".join(f" ({name} runs synchronously: it needs protocol.max_staleness=0)"
                          for name, entry in LEARNERS.items() if entry.synchronous)
    run.add_argument("--backend", choices=tuple(LEARNERS),
                     help="learner and sampler backend: shorthand for --set "
                          f"learner.backend=...{synchronous}")
    run.add_argument("--resume", metavar="RUN_DIR",
                     help="continue the run in RUN_DIR from its journal and last commit")
    run.add_argument("--serial", action="store_true",
                     help="execute the schedule one command at a time, in one process")
    run.add_argument("--journal-key", metavar="FILE",
                     help="key the journal's digest chain with the bytes of FILE (kept outside "
                          "the run directory; resume and `invar-check --trace --key` need it)")
    run.add_argument("--print-config", action="store_true",
                     help="print the resolved configuration (defaults, CONFIG.toml, --set, "
                          "--resume's saved one) as TOML and exit: save it, edit it, pass it "
                          "back as CONFIG.toml")
    shown = commands.add_parser("report", help="quality, throughput and resource cost of run "
                                             "directories (table + plots)")
    from invar.runtime.report import add_arguments
    add_arguments(shown)
    exported = commands.add_parser("export", help="a trained transformers policy as a Hugging "
                                                  "Face directory (save_pretrained layout)")
    from invar.runtime import export
    export.add_arguments(exported)
    args = parser.parse_args(argv)
    if args.command == "report":
        from invar.runtime.report import main as report_main
        return report_main(args)
    if args.command == "export":
        return export.main(args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.backend:
        args.set.append(f"learner.backend={json.dumps(args.backend)}")
    from invar.runtime.interrupts import Interrupted, Signalled, signals_raise
    restored = binding = None
    try:
        # Checking the configuration may take a while (a task module, a tokenizer to load).
        with signals_raise():
            if args.resume:
                if not args.print_config:
                    # Before the journal is read: a driver that holds the run may extend it.
                    _hold_run_directory(held, Path(args.resume))
                journal_key = _journal_key(args.journal_key, args.resume)
                config, restored, binding = resume_config(args.resume, args.config, args.set,
                                                          journal_key)
            else:
                config = load_config(args.config, args.set)
                journal_key = _journal_key(args.journal_key, config.output.run_dir)
                if not args.print_config:
                    _claim_new_run_directory(held, config.output.run_dir)
    except ConfigError as error:
        what = "resume refused" if args.resume else "configuration refused"
        print(f"invar: {what}: {error}", file=sys.stderr)
        return 2
    except (Signalled, KeyboardInterrupt) as error:
        print("invar: interrupted while checking the configuration; nothing was written",
              file=sys.stderr)
        return 128 + getattr(error, "signum", signal.SIGINT)
    if args.print_config:
        print(config_toml(read_keys(config)), end="")
        return 0
    if not args.resume:  # refused before the model loads, which may take a while
        from invar.runtime.journal import refuse_existing_run
        try:
            refuse_existing_run(Path(config.output.run_dir), serial=args.serial)
        except FileExistsError as error:
            print(f"invar: cannot start: {error}", file=sys.stderr)
            return 2
    schedule = report(config.protocol)
    for note in schedule.notes:
        print(f"note: {note}", file=sys.stderr)
    # The first import of torch (through the driver and the learner backends): parsing the
    # command line and checking the configuration did without it.
    from invar.runtime.commits import CommitError
    from invar.runtime.driver import ResumeError, RunStopped
    from invar.runtime.journal import JournalError
    from invar.runtime.transport import TransportRefused
    try:
        with signals_raise():
            summary = train(config, resume=bool(args.resume), serial=args.serial,
                            restored=restored, journal_key=journal_key, binding=binding)
    except Interrupted as stopped:  # workers ended, journal synced: resumable
        print(f"invar: {stopped.line()}", file=sys.stderr)
        return stopped.exit_code
    except (Signalled, KeyboardInterrupt) as error:  # while the run started, or closed
        journal = Path(config.output.run_dir) / "journal.jsonl"
        how = (f"resume with: invar train --resume {config.output.run_dir}"
               if journal.is_file() and journal.stat().st_size and not args.serial
               else "nothing was trained")
        print(f"invar: interrupted while the run started or closed; {how}", file=sys.stderr)
        return 128 + getattr(error, "signum", signal.SIGINT)
    except FileExistsError as error:  # a run started in the directory meanwhile
        print(f"invar: cannot start: {error}", file=sys.stderr)
        return 2
    except (CommitError, JournalError, ResumeError) as error:
        # A run directory that cannot be (re)started as it is: say which file and why.
        print(f"invar: {'cannot resume' if args.resume else 'cannot start'}: {error}",
              file=sys.stderr)
        return 1
    except TransportRefused as error:  # a worker host unreachable or refusing us, named
        print(f"invar: {'cannot resume' if args.resume else 'cannot start'}: {error}",
              file=sys.stderr)
        return 1
    except RunStopped as error:  # no worker can serve: the run stays resumable
        print(f"invar: run stopped: {error}", file=sys.stderr)
        return 1
    if summary:
        run_dir = Path(config.output.run_dir)
        heldout = summary["final_heldout_reward"]
        lives = summary.get("lives", 1)
        resumed = (f" over {lives} lives (this one: {summary['session_updates']} updates in "
                   f"{summary['session_wall_seconds']:.1f} s)" if lives > 1 else "")
        print(f"done: {summary['updates']} updates in {summary['wall_seconds']:.1f} s{resumed}, "
              f"held-out reward {'-' if heldout is None else f'{heldout:.3f}'}; "
              f"report: {run_dir / 'report.md'}")
    return 0


def read_keys(config: TrainConfig) -> dict[str, Any]:
    """The configuration (`to_dict`) without the keys it does not read: a transformers
    policy's shape is its model's (the built-in policy's shape keys left out), the built-in
    policy has no path or config, and a task kind's own keys are left out for another kind.
    Each left-out key holds its default (anything else is refused), so what is printed reads
    back to the same configuration."""
    data = to_dict(config)
    policy_unread = SHAPE_FIELDS if config.policy.kind == "transformers" else ("path", "config")
    data["policy"] = {k: v for k, v in data["policy"].items() if k not in policy_unread}
    task_read = KIND_KEYS.get(config.task.name, ())
    task_unread = {key for keys in KIND_KEYS.values() for key in keys if key not in task_read}
    data["task"] = {k: v for k, v in data["task"].items() if k not in task_unread}
    return data


def config_toml(data: dict[str, Any]) -> str:
    """A configuration (`to_dict`) as TOML that `load_config` reads back to the same
    configuration: a table per section, then its keys."""
    lines = ["# invar train configuration, resolved; every key is documented in "
             "invar/runtime/config.py"]

    def table(values: dict[str, Any], path: tuple[str, ...]) -> None:
        scalars = {k: v for k, v in values.items() if not isinstance(v, dict)}
        if path and (scalars or not values):  # an empty table is written, to stay a table
            lines.extend(["", f"[{'.'.join(_toml_key(part) for part in path)}]"])
        lines.extend(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in scalars.items())
        for key, value in values.items():
            if isinstance(value, dict):
                table(value, (*path, key))

    table(data, ())
    return "\n".join(lines) + "\n"


def _toml_key(key: str) -> str:
    return key if key and all(c.isascii() and (c.isalnum() or c in "-_") for c in key) \
        else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return ("nan" if math.isnan(value) else "inf" if value > 0 else "-inf") \
            if not math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON's escapes are TOML's (ASCII: no raw DEL)
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(_toml_value(item) for item in value)}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}"
                               for k, v in value.items()) + "}"
    raise ValueError(f"{value!r} has no TOML form")


def resume_config(run_dir: str, config_path: str | None, overrides: list[str],
                  journal_key: bytes | None = None) -> tuple[TrainConfig, Any, Any]:
    """The configuration to resume `run_dir` with, its journal restored, and what the journal
    binds (`journal_format.Binding`).

    Everything a resume needs is read and checked here, before anything is written: the
    journal (readable, replaying through the model) and what it binds (`invar.runtime.
    binding`): the configuration, which the run resumes with, config.json a copy of it; the
    changes asked for (a CONFIG file's keys and --set items, on top of it: only OPERATIONAL
    keys may differ); the files the run reads, the same bytes. Raises ConfigError naming the
    keys or file.
    """
    from invar.runtime.binding import bound_config, check_files, check_saved
    directory = Path(run_dir)
    if not directory.is_dir():
        raise ConfigError(("--resume",), f"{directory} is not a run directory")
    saved_path = directory / "config.json"
    started = _read_json_table(saved_path)
    journal_path = directory / "journal.jsonl"
    contents = _read_journal(journal_path, journal_key)
    check_saved(started, contents, saved_path)
    from invar.runtime.store import not_a_file
    stray = not_a_file(directory / "store")
    if stray is not None:
        raise ConfigError((str(stray),), "is not a file: the weights store holds files only "
                                         "(remove it: the store is published again from the "
                                         "commits)")
    try:
        bound = bound_config(contents, run_dir)
    except ConfigError as error:
        raise ConfigError((str(journal_path),), f"cannot be resumed from: {error}") from None
    config = load_config(config_path, overrides, base=to_dict(bound))
    if Path(config.output.run_dir).resolve() != directory.resolve():
        raise ConfigError(("output.run_dir",), f"{config.output.run_dir!r}, but the run "
                                               f"resumed is {str(run_dir)!r}")
    config = dataclasses.replace(
        config, output=dataclasses.replace(config.output, run_dir=str(run_dir)))
    refused = [(key, old, new) for key, old, new in changed_keys(bound, config)
               if key not in OPERATIONAL]
    if refused:
        changes = ", ".join(f"{key} {json.dumps(old)} -> {json.dumps(new)}"
                            for key, old, new in refused)
        raise ConfigError(tuple(key for key, _, _ in refused),
                          f"the run was started with other values ({changes}); a resumed run "
                          "may change only operational settings (README, \"Resume\")")
    check_files(contents.binding, config)
    restored = _restore_journal(journal_path, contents, config)
    for key, old, new in changed_keys(bound, config):
        if key in ROUNDING:
            print(f"note: {key} {json.dumps(old)} -> {json.dumps(new)}: the logical schedule is "
                  "unchanged, but floating-point results (samples, weights) may differ from an "
                  "uninterrupted run's", file=sys.stderr)
    return config, restored, contents.binding


def _hold_run_directory(held: contextlib.ExitStack, run_dir: Path) -> None:
    """Lock `run_dir` for this command (`files.directory_lock`): one driver per run. Refused,
    naming the directory, while another holds it; a directory that is not there is left to
    the checks that name it. A file system that cannot lock a directory (NFS's emulation of
    flock wants a file open for writing) gets a note, and the run goes on unlocked."""
    if not run_dir.is_dir():
        return
    try:
        held.enter_context(directory_lock(run_dir))
    except BlockingIOError:
        raise ConfigError((str(run_dir),), "another invar driver holds this run directory: one "
                                           "run, one driver (let it end, or stop it first)"
                          ) from None
    except OSError as error:
        print(f"note: {run_dir} cannot be locked ({error.strerror or error}): make sure no "
              "other invar driver runs in it", file=sys.stderr)


def _claim_new_run_directory(held: contextlib.ExitStack, run_dir: str) -> None:
    """The directory of a new run, made and locked before anything is written in it; refused
    when it is the current directory or one above it (the run's files among others)."""
    here = Path.cwd().resolve()
    where = Path(run_dir).resolve()
    if where == here or where in here.parents:
        raise ConfigError(("output.run_dir",), f"{run_dir!r} is the current directory or one "
                                               "above it: a run needs a directory of its own, "
                                               "e.g. runs/NAME")
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(("output.run_dir",), f"cannot make {run_dir!r}: "
                                               f"{error.strerror or error}") from None
    _hold_run_directory(held, where)


def _read_json_table(path: Path) -> dict[str, Any]:
    try:
        raw = read_at_most(path, CONFIG_MAX_BYTES)
    except TooLarge as error:
        raise ConfigError((str(path),), f"not a configuration: {error}") from None
    except FileNotFoundError:
        raise ConfigError((str(path),), "not found: not a run directory") from None
    except OSError as error:
        raise ConfigError((str(path),), f"cannot read: {error.strerror or error}") from None
    try:
        data = parse_json(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ConfigError((str(path),), f"not UTF-8 text: {describe_bad_byte(raw, error)}"
                          ) from None
    except ValueError as error:
        raise ConfigError((str(path),), f"not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError((str(path),), f"must hold a JSON object (a configuration), not a "
                                        f"{type(data).__name__}")
    check_nesting(data, str(path))
    return data


def _journal_key(path: str | None, run_dir: str) -> bytes | None:
    """`journal.read_key` of the key file `path` (None: no key) for the run in `run_dir`, a
    refusal a ConfigError naming the file."""
    from invar.journal_format import JournalError, read_key
    if path is None:
        return None
    try:
        return read_key(Path(path), Path(run_dir))
    except JournalError as error:
        where, _, why = str(error).partition(": ")
        raise ConfigError(("--journal-key", where), why) from None


def _read_journal(path: Path, journal_key: bytes | None) -> Any:
    """`journal.read_contents(path, journal_key, start="last")`, every failure a ConfigError
    naming the file."""
    from invar.runtime import journal
    if not path.is_file():
        raise ConfigError((str(path),), "not found: the run has no journal to resume from")
    try:
        raw = path.read_bytes()
        raw.decode("utf-8")
    except OSError as error:
        raise ConfigError((str(path),), f"cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise ConfigError((str(path),), f"not UTF-8 text: {describe_bad_byte(raw, error)}"
                          ) from None
    del raw
    try:
        return journal.read_contents(path, journal_key, start="last")
    except journal.JournalError as error:
        where, _, why = str(error).partition(": ")  # "PATH:LINE: why"
        raise ConfigError((where,), f"cannot be resumed from: {why}") from None


def _restore_journal(path: Path, contents: Any, config: TrainConfig) -> Any:
    """`journal.replayed` of the journal `path` read as `contents`, every failure a
    ConfigError naming the file; a journal pruned although its settings never let it prune
    refused; the rewards of the batches not yet trained on re-scored, when the task is a
    built-in one (a reward that is not the verifier's verdict would be trained on)."""
    from invar.journal_format import rescore
    from invar.runtime import journal
    from invar.runtime.binding import pruning_problem
    from invar.runtime.rescore import task_verifier
    problem = pruning_problem(contents)
    if problem:
        raise ConfigError((str(path),), f"cannot be resumed from: {problem}")
    try:
        restored = journal.replayed(path, contents)
    except journal.JournalError as error:
        where, _, why = str(error).partition(": ")  # "PATH:LINE: why"
        raise ConfigError((where,), f"cannot be resumed from: {why}") from None
    verifier = task_verifier(config, any_task=False)
    if verifier.score is not None:
        mismatch = rescore(contents.config, contents.entries, verifier.score,
                           verifier.failure_reward, from_batch=restored[1].committed,
                           start=contents.start).mismatch
        if mismatch is not None:
            raise ConfigError((f"{path}:{mismatch.line}",), f"cannot be resumed from: "
                              f"{mismatch} (a batch not yet trained on)")
    return restored


def _flatten(data: dict[str, Any], prefix: str = "") -> list[str]:
    """A saved configuration as --set overrides (so a resumed run has the same config)."""
    out = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.extend(_flatten(value, dotted + "."))
        else:
            out.append(f"{dotted}={json.dumps(value)}")
    return out


if __name__ == "__main__":
    sys.exit(main())
