"""`invar-check`: model-check the Invar protocol or any model, validate a real run's journal, or
prove the schedule's arithmetic.

    invar-check [--jobs N]                  # the gate: every bound of spec/gate/, in parallel
    invar-check --list                      # the gate's bounds: where they are, what each covers
    invar-check SPEC.toml|DIR [--bfs|--dfs|--simulate N] [--processes N] [--max-states N]
                [--json FILE] [--dot FILE] [--regression FILE]
    invar-check --model MODULE:FACTORY [--arg NAME=VALUE ...] [--bfs|--dfs|--simulate N] ...
    invar-check --trace RUN_DIR[/journal.jsonl] [--key FILE] [--rescore | --no-rescore]
    invar-check --prove

--model checks any model (a `checker.Model`): FACTORY is a class or function of the importable
MODULE (the current folder is on the path) that returns one, called with the keyword arguments
given by --arg (repeated; VALUE is read as JSON when it parses -- 7, true, 1.5, "7", [1, 2] --
and is a string otherwise), e.g.

    invar-check --model checker.examples.two_phase_readable:TwoPhaseReadable --arg rms=7

It takes the search options, --json, --dot and --graphml as for the Invar model.

Exit status: 0 every property holds, 1 a violation (or a departure, or a failed lemma),
2 bad input (the message names the field or file); with --trace, 3 a journal that matches the
model but whose run is incomplete (it says where it ends), 4 a journal that matches the model
but whose rewards could not be re-scored (it says why).

--trace re-scores every journalled response with the task's verifier (built from the
configuration the journal binds, not from config.json) when the task is a built-in one, and
with --rescore for any task; --key checks the journal's keyed chain (a run started with
`invar train --journal-key`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from checker import pinned
from checker.invar_model import CORE, Bounds, Explored, InvarModel, load_bounds
from checker.report import ProgressPrinter, print_result
from checker.result import Verdict
from checker.search import Checker
from checker.trace import Trace, to_jsonable, trace_to_json
from invar import journal_format
from invar.journal_format import payload_dir
from invar.model.errors import ConfigError
from invar.model.messages import TimerFired, dumps

GATE = pinned.GATE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="invar-check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("spec", nargs="?", help="a bounded model configuration, or a folder "
                                                "of them (default: the gate, see --list)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="bounds checked at once when SPEC is a folder (default: CPUs, "
                             "at most 2)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--bfs", action="store_true", help="breadth-first (default): shortest "
                                                         "counterexamples")
    mode.add_argument("--dfs", action="store_true", help="depth-first")
    mode.add_argument("--simulate", type=int, metavar="N", help="N random walks")
    mode.add_argument("--trace", metavar="RUN_DIR|JOURNAL",
                      help="validate a run's journal.jsonl (a run directory: the one in it)")
    mode.add_argument("--prove", action="store_true", help="prove the schedule lemmas (z3)")
    mode.add_argument("--list", action="store_true",
                      help="list the gate's bounds (shipped with the package; spec/gate/ in the "
                           "source tree) with what each covers")
    parser.add_argument("--key", metavar="FILE",
                        help="with --trace: the journal key the run was started with "
                             "(invar train --journal-key FILE)")
    parser.add_argument("--rescore", action=argparse.BooleanOptionalAction, default=None,
                        help="with --trace: re-score every journalled response with the task's "
                             "verifier (default: for the built-in tasks)")
    parser.add_argument("--processes", type=int, default=None, help="BFS worker processes")
    parser.add_argument("--max-states", type=int, help="stop after this many distinct states")
    parser.add_argument("--max-depth", type=int, help="do not expand beyond this depth")
    parser.add_argument("--seed", type=int, default=0, help="simulation seed")
    parser.add_argument("--json", metavar="FILE", help="write the result (and traces) as JSON")
    parser.add_argument("--dot", metavar="FILE", help="write the explored graph as DOT")
    parser.add_argument("--graphml", metavar="FILE", help="write the explored graph as GraphML")
    parser.add_argument("--regression", metavar="FILE",
                        help="on a violation, write a pytest file replaying it through step")
    parser.add_argument("--no-symmetry", action="store_true", help="disable worker symmetry")
    parser.add_argument("--no-reduction", action="store_true",
                        help="disable partial-order reduction")
    parser.add_argument("--livelock", action="store_true",
                        help="check that a completed state stays reachable (records the graph)")
    parser.add_argument("--no-livelock", action="store_true",
                        help="skip the livelock check a spec's [check] asks for (a search "
                             "recording the graph runs in one process)")
    parser.add_argument("--checkpoint", metavar="FILE", help="write BFS checkpoints here")
    parser.add_argument("--resume", metavar="FILE", help="resume BFS from a checkpoint")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--fail-fast", action="store_true",
                        help="stop at the first violation (and, for a folder, the first "
                             "failing bound): for mutation testing")
    parser.add_argument("--drop-validity", action="store_true",
                        help="with --prove: drop the config rule P <= S+1 to see what fails")
    parser.add_argument("--model", metavar="MODULE:FACTORY",
                        help="check the model FACTORY(**args) returns instead of the Invar model")
    parser.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE",
                        help="a keyword argument of the --model factory (VALUE as JSON, else "
                             "a string); repeat for several")
    parser.add_argument("--queue-memory", type=float, default=None, metavar="MiB",
                        help="memory for the next BFS level (by the estimated size of its "
                             "first states; default 512): past it the level is spilled to "
                             "disk, under --work-dir, and read back in order (sequential BFS)")
    parser.add_argument("--work-dir", metavar="DIR",
                        help="where the sequential BFS keeps its states/ folder: the parent "
                             "pointers (16 B a state) and the spilled levels, removed at the "
                             "end (default: a temporary folder)")
    parser.add_argument("--fingerprints", choices=("auto", "fast", "stable"), default="auto",
                        help="auto (default): Python's hash for states that hash by value, "
                             "stable ones with checkpoints; stable: always SHA-1")
    args = parser.parse_args(argv)
    # Piped output is not wrapped at 80 columns (a line stays one line for grep and logs).
    piped = not sys.stdout.isatty()
    console = Console(stderr=False, width=160 if piped else None, soft_wrap=piped)
    if args.prove:
        return _prove(console, assume_valid=not args.drop_validity)
    if args.list:
        return _list_gate()
    if args.trace:
        return _trace(Path(args.trace), console, args.key, args.rescore)
    if args.key or args.rescore is not None:
        print("invar-check: --key and --rescore go with --trace", file=sys.stderr)
        return 2
    if args.model:
        return _any_model(args, console)
    if args.arg:
        print("invar-check: --arg goes with --model", file=sys.stderr)
        return 2
    spec = Path(args.spec) if args.spec else GATE
    if spec.is_dir():
        return _suite(spec, args.jobs or min(2, os.cpu_count() or 1), console, args.fail_fast,
                      _queue_flags(args))
    try:
        bounds, options = load_bounds(spec)
        options = _check_options(options, spec)
    except ConfigError as error:
        print(f"invar-check: {error}", file=sys.stderr)
        return 2
    model = InvarModel(bounds, symmetry=options["symmetry"] and not args.no_symmetry,
                       reduction=options["reduction"] and not args.no_reduction)
    livelock = (args.livelock or (options["livelock"] and not args.no_livelock)
                or bool(args.dot or args.graphml))
    checker: Checker[Any, Any] = Checker(
        model, max_states=args.max_states or options["max_states"], max_depth=args.max_depth,
        processes=args.processes or options["processes"], check_livelock=livelock,
        finish_when="any_failure" if args.fail_fast else "all_decided",
        progress=None if args.quiet else ProgressPrinter(console), progress_interval=2.0,
        checkpoint_path=args.checkpoint, checkpoint_interval=60.0 if args.checkpoint else None,
        resume_from=args.resume, fingerprints=args.fingerprints, **_queue_options(args))
    console.print(f"[bold]invar-check[/bold] {spec}: {_describe(bounds)}; symmetry "
                  f"{'on' if model.symmetry else 'off'}, reduction "
                  f"{'on' if model.reduction else 'off'}")
    result = _search(checker, args)
    print_result(result, model, console)
    if args.json:
        Path(args.json).write_text(json.dumps(_result_json(result, model, bounds), indent=2))
    _write_graphs(result, args)
    violated = [p for p in result.violations if p.trace is not None]
    if violated and args.regression:
        Path(args.regression).write_text(regression_test(bounds, violated[0].name,
                                                         violated[0].trace, model))
        console.print(f"regression test written to {args.regression}")
    return _exit_status(result, console)


def _queue_options(args: argparse.Namespace) -> dict[str, Any]:
    """`Checker`'s `queue_memory` (bytes) and `work_dir`, as far as given."""
    out: dict[str, Any] = {"work_dir": args.work_dir}
    if args.queue_memory is not None:
        out["queue_memory"] = int(args.queue_memory * (1 << 20))
    return out


def _queue_flags(args: argparse.Namespace) -> list[str]:
    """--queue-memory and --work-dir as given, for the bounds of a folder."""
    flags = [] if args.queue_memory is None else ["--queue-memory", str(args.queue_memory)]
    return flags + ([] if args.work_dir is None else ["--work-dir", args.work_dir])


def _search(checker: Checker[Any, Any], args: argparse.Namespace) -> Any:
    if args.simulate:
        return checker.simulate(runs=args.simulate, max_depth=args.max_depth or 400, seed=args.seed)
    if args.dfs:
        return checker.dfs()
    return checker.bfs()


def _write_graphs(result: Any, args: argparse.Namespace) -> None:
    if args.dot:
        result.write_dot(args.dot)
    if args.graphml:
        result.write_graphml(args.graphml)


class UsageError(Exception):
    """A --model or --arg that cannot be used (exit status 2, with this message)."""


def parse_model_args(pairs: list[str]) -> dict[str, Any]:
    """``["rms=7", "name=x"]`` -> ``{"rms": 7, "name": "x"}``: each VALUE as JSON when it
    parses, else as the string it is (raises UsageError naming a malformed pair)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name.isidentifier():
            raise UsageError(f"--arg {pair!r}: expected NAME=VALUE with NAME a Python identifier")
        if name in out:
            raise UsageError(f"--arg {name} given twice")
        try:
            out[name] = json.loads(text)
        except json.JSONDecodeError:
            out[name] = text
    return out


def load_model(spec: str, kwargs: dict[str, Any]) -> Any:
    """The model that ``FACTORY(**kwargs)`` returns for ``spec = "MODULE:FACTORY"`` (FACTORY
    may be dotted: ``module:Class.build``); raises UsageError saying what is wrong."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--model {spec!r}: expected MODULE:FACTORY, e.g. "
                         "checker.examples.two_phase_readable:TwoPhaseReadable")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m`: a user's model in the current folder
    try:
        factory: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(f"--model {spec!r}: cannot import {module_name!r} ({error})") from error
    for part in attr.split("."):
        try:
            factory = getattr(factory, part)
        except AttributeError:
            raise UsageError(f"--model {spec!r}: {module_name} has no {attr!r}") from None
    if not callable(factory):
        raise UsageError(f"--model {spec!r}: {attr!r} is not callable")
    try:
        model = factory(**kwargs)
    except TypeError as error:
        raise UsageError(f"--model {spec!r}: {attr}(**{kwargs!r}) failed: {error}") from error
    missing = [
        m for m in ("init_states", "actions", "next_state") if not callable(getattr(model, m, None))
    ]
    if missing:
        raise UsageError(f"--model {spec!r}: {attr}(...) returned {type(model).__name__}, "
                         f"not a model (no {', '.join(missing)})")
    return model


def _any_model(args: argparse.Namespace, console: Console) -> int:
    """`--model`: the same search options and outputs as for the Invar model, on any model."""
    invar_only = [flag for flag, given in (("SPEC", args.spec), ("--regression", args.regression),
                                           ("--no-symmetry", args.no_symmetry),
                                           ("--no-reduction", args.no_reduction),
                                           ("--no-livelock", args.no_livelock),
                                           ("--jobs", args.jobs is not None)) if given]
    if invar_only:
        print(f"invar-check: {', '.join(invar_only)} apply to the Invar model, not to --model",
              file=sys.stderr)
        return 2
    try:
        model = load_model(args.model, parse_model_args(args.arg))
    except UsageError as error:
        print(f"invar-check: {error}", file=sys.stderr)
        return 2
    # A graph export records the graph; unlike the Invar model's (whose runs complete), a
    # model need not have final states, so the livelock check stays the --livelock flag's.
    graph = args.livelock or bool(args.dot or args.graphml)
    try:
        checker: Checker[Any, Any] = Checker(
            model, max_states=args.max_states, max_depth=args.max_depth,
            processes=args.processes or 1, check_livelock=args.livelock,
            record_graph=graph,
            finish_when="any_failure" if args.fail_fast else "all_decided",
            progress=None if args.quiet else ProgressPrinter(console), progress_interval=2.0,
            checkpoint_path=args.checkpoint, checkpoint_interval=60.0 if args.checkpoint else None,
            resume_from=args.resume, fingerprints=args.fingerprints, **_queue_options(args))
    except ValueError as error:
        print(f"invar-check: {error}", file=sys.stderr)
        return 2
    console.print(f"[bold]invar-check[/bold] {args.model} {' '.join(args.arg)}".rstrip())
    result = _search(checker, args)
    print_result(result, model, console)
    if args.json:
        doc = dict(result.summary())
        doc["model"] = {"factory": args.model, "args": parse_model_args(args.arg)}
        fmt = getattr(model, "format_action", repr)
        view = getattr(model, "view_state", None)
        doc["counterexamples"] = {
            p.name: json.loads(trace_to_json(p.trace, encode_action=fmt, encode_state=(
                None if view is None else lambda s: to_jsonable(view(s)))))
            for p in result.violations if p.trace is not None}
        Path(args.json).write_text(json.dumps(doc, indent=2))
    _write_graphs(result, args)
    return _exit_status(result, console)


def _suite(folder: Path, jobs: int, console: Console, fail_fast: bool = False,
           flags: list[str] | None = None) -> int:
    """Check every bound of `folder`, `jobs` at a time (each in its own process, so a bound
    keeps its own options, livelock included); one table at the end, the output of any bound
    that fails in full. Exit 0 only when every bound holds. With `fail_fast`, bounds not yet
    started are skipped once one fails.

    The gate itself (`folder` is spec/gate/) also proves the schedule (`--prove`: its lemmas,
    the code against the proven definitions, its decisions against the pinned ones) and
    holds every bound to its pinned state counts (`checker.pinned`): the runs cannot see a
    wrong schedule (the canonical one they are compared with shares it), and a change to the
    state space is a change to review and regenerate (`spec/generate.py --measure`).  `flags`
    go to every bound's command."""
    specs = sorted(folder.glob("*.toml"))
    if not specs:
        print(f"invar-check: {folder}: no *.toml bounds", file=sys.stderr)
        return 2
    gate = folder.resolve() == GATE
    pinned_values = pinned.load() if gate else {}
    extra = (["--fail-fast"] if fail_fast else []) + (flags or [])
    checks: list[tuple[str, str, Path | None]] = [(spec.stem, _covers(spec), spec)
                                                  for spec in specs]
    if gate:
        checks.insert(0, ("schedule", "--prove: lemmas, code and pinned decisions", None))

    failures: list[str] = []

    def check(item: tuple[str, str, Path | None]) -> tuple[str, str, int, dict[str, Any], str,
                                                          float]:
        name, covers, spec = item
        if fail_fast and failures:
            return name, covers, -1, {}, "skipped: an earlier bound failed", 0.0
        out = Path(scratch) / f"{name}.json"
        began = time.perf_counter()
        command = (["--prove"] if spec is None
                   else [str(spec), "--quiet", "--json", str(out), *extra])
        done = subprocess.run([sys.executable, "-m", "checker.cli", *command],
                              capture_output=True, text=True)
        code, output = done.returncode, done.stdout + done.stderr
        doc = json.loads(out.read_text()) if out.exists() else {}
        if code == 0 and gate and spec is not None:
            differs = _unpinned_counts(name, doc, pinned_values)
            if differs:
                code, output = 1, differs
        if code != 0:
            failures.append(name)
        return name, covers, code, doc, output, time.perf_counter() - began

    console.print(f"[bold]invar-check[/bold] gate {folder}: {len(specs)} bounds"
                  f"{' and the schedule' if gate else ''}, {jobs} at a time")
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="invar-gate-") as scratch, \
            ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(check, checks))
    table = Table(title=f"gate: {time.perf_counter() - began:.0f} s wall")
    for column in ("bound", "covers", "distinct", "generated", "s", "verdict"):
        table.add_column(column, justify="right" if column in ("distinct", "generated", "s")
                         else "left")
    failed = 0
    for name, covers, code, doc, output, seconds in results:
        verdict = ("[green]holds[/green]" if code == 0 else "skipped" if code == -1
                   else f"[red]exit {code}[/red]")
        states = [f"{doc[key]:,}" if key in doc else "-"  # the schedule has no states
                  for key in ("distinct_states", "states_generated")]
        table.add_row(name, covers, *states, f"{seconds:.0f}", verdict)
        if code > 0:
            failed += 1
            console.print(f"[red bold]{name}[/red bold] failed:\n{output}")
    console.print(table)
    return 1 if failed else 0


def _covers(spec: Path) -> str:
    """What a gate bound covers, as its ``covers`` line says."""
    return str(tomllib.loads(spec.read_text()).get("covers", ""))


def _list_gate() -> int:
    """`--list`: the gate's folder, and each bound's name (its file there) and what it covers."""
    specs = sorted(GATE.glob("*.toml"))
    print(f"the gate, {GATE}: {len(specs)} bounds, each checked by `invar-check "
          f"{GATE}/NAME.toml`, and the schedule (`invar-check --prove`)")
    for spec in specs:
        print(f"  {spec.stem:<18} {_covers(spec)}")
    return 0


def _unpinned_counts(name: str, doc: dict[str, Any], values: dict[str, Any]) -> str:
    """Why gate bound `name`'s state counts in `doc` are not its pinned ones (empty: they
    are)."""
    counts = (doc.get("distinct_states"), doc.get("states_generated"))
    expected = pinned.bound_counts(values, name)
    if expected is None:
        return (f"{name}: no state counts pinned in {pinned.PINNED} (measured {counts[0]:,} / "
                f"{counts[1]:,}): run spec/generate.py --measure")
    if counts != expected:
        return (f"{name}: {counts[0]:,} distinct / {counts[1]:,} generated states, pinned "
                f"{expected[0]:,} / {expected[1]:,} in {pinned.PINNED}: the protocol's state "
                f"space changed (if intended, regenerate: spec/generate.py --measure)")
    return ""


def _exit_status(result: Any, console: Console) -> int:
    """0 when every property holds, 1 on a violation.

    A search cut short by --max-states/--max-depth proves nothing about the states it did not
    reach: a `sometimes` property it did not reach (a completed run, typically) is then
    inconclusive, not a violation. Such a run exits 0 only when nothing was violated, and
    says plainly that it was bounded.
    """
    if result.ok:
        return 0
    bounded = not result.complete and result.stop_reason in ("max_states", "max_depth")
    violated = [p.name for p in result.violations if p.verdict is not Verdict.NOT_REACHED]
    if bounded and not violated:
        unreached = ", ".join(p.name for p in result.violations)
        console.print(f"[yellow]incomplete search ({result.stop_reason}): no violation in "
                      f"{result.distinct_states:,} states; not reached within the bound "
                      f"(inconclusive): {unreached}[/yellow]")
        return 0
    return 1


def _check_options(options: dict[str, Any], spec: Path) -> dict[str, Any]:
    known = {"symmetry": True, "reduction": True, "livelock": False, "max_states": None,
             "processes": 1}
    for key, value in options.items():
        if key not in known:
            raise ConfigError((f"check.{key}",), f"unknown key in {spec}")
        if key in ("symmetry", "reduction", "livelock") and not isinstance(value, bool):
            raise ConfigError((f"check.{key}",), "expected true or false")
        if key in ("max_states", "processes") and (isinstance(value, bool)
                                                   or not isinstance(value, int) or value < 1):
            raise ConfigError((f"check.{key}",), "expected a positive integer")
    return {**known, **options}


def _describe(b: Bounds) -> str:
    return (f"B={b.prompts_per_batch} G={b.group_size} S={b.max_staleness} P={b.sync_period} "
            f"K={b.optimizer_steps} N={b.total_updates} W={b.workers}; faults: drop {b.drops}, "
            f"duplicate {b.duplicates}, worker crash {b.worker_crashes}, learner crash "
            f"{b.learner_crashes}, driver restart {b.driver_restarts}, early timer "
            f"{b.early_timers}")


def core_events(trace: Trace, model: InvarModel) -> list[Any]:
    """The events the core saw along a trace, in order (what a regression test replays)."""
    events = []
    for index, (action, _state) in enumerate(trace.steps):
        if action is None:
            continue
        kind, arg = action
        if kind == "deliver" and arg.startswith(f"{CORE}|"):
            previous: Explored = trace.steps[index - 1][1]
            events.append(next(m.body for m in previous.world.network if m.key == arg))
        elif kind == "timer":
            events.append(TimerFired())
        elif kind == "restart_driver":
            events.append(("driver_restarted",))
    return events


def regression_test(bounds: Bounds, prop: str, trace: Trace, model: InvarModel) -> str:
    """A ready-to-run pytest file replaying the counterexample's core events through `step`."""
    events = core_events(trace, model)
    # Python literals (not JSON: a driver restart is None, which JSON would spell `null`).
    encoded = "".join(f"    {None if isinstance(e, tuple) else dumps(e)!r},\n" for e in events)
    fields = ", ".join(f"{k}={v!r}" for k, v in vars(bounds).items())
    return f'''"""Regression test generated by invar-check: counterexample for {prop!r}.

Replays the core's events of the shortest counterexample through `step`; it fails while the
bug is there. A `None` entry is a driver restart: the core returns to its last journal fsync.
A run that completes must also match the canonical synchronous schedule's projection.
"""

from invar.model import loads, violations, transition_violations
from invar.model import logical_projection, run_complete
from invar.model.shell import Verdict, deliver
from invar.testing import canonical_run
from checker.invar_model import Bounds

BOUNDS = Bounds({fields})
WORKERS = {model.worker_names!r}
EVENTS = [
{encoded}]


def test_counterexample_{prop}_is_fixed():
    from invar.model import initial_state
    state = durable = initial_state(BOUNDS.protocol())
    for index, text in enumerate(EVENTS):
        if text is None:
            state = durable
            continue
        delivery = deliver(state, loads(text))
        assert delivery.verdict is not Verdict.REFUSED, f"step {{index}}: {{delivery.error}}"
        after = delivery.state
        assert not violations(after), f"step {{index}}: {{violations(after)}}"
        assert not transition_violations(state, delivery.commands, after), f"step {{index}}"
        if delivery.durable:
            durable = after
        state = after
    if run_complete(state):
        canonical = canonical_run(BOUNDS.protocol(), WORKERS).state
        assert logical_projection(state) == logical_projection(canonical), "completed run " \
            "departs from the canonical schedule's projection"
'''


def _result_json(result: Any, model: InvarModel, bounds: Bounds) -> dict[str, Any]:
    doc = dict(result.summary())
    doc["bounds"] = vars(bounds)
    traces = {}
    for p in result.violations:
        if p.trace is not None:
            traces[p.name] = json.loads(trace_to_json(
                p.trace, encode_action=model.format_action,
                encode_state=lambda s: {"core": repr(s.world.core),
                                        "network": [m.key for m in s.world.network],
                                        "refused": s.world.refused, "broken": s.world.broken}))
            traces[p.name]["core_events"] = [e if isinstance(e, tuple) else json.loads(dumps(e))
                                             for e in core_events(p.trace, model)]
    doc["counterexamples"] = traces
    return doc


def _trace(path: Path, console: Console, key_file: str | None = None,
           rescore: bool | None = None) -> int:
    """Trace validation: replay a real journal through `step` with every invariant, its chain
    checked (keyed with `key_file`), its rewards re-scored (`rescore`; None: when the task the
    journal binds is a built-in one).

    Exit 0: the journal is a complete run and every event matches the model; 3: every event
    matches but the run is incomplete (it ends before the run's last event: a crash, a run
    still going, or lines lost at the end; a torn last line, a write cut by a crash, counts
    as such an end); 4: every event matches, but the rewards could not be re-scored (the
    journal binds no configuration, the task cannot be built here, a file it reads is not
    the one the run read, a plug-in task without --rescore); 1: a departure (an event,
    digest, chain link, invariant, sequence number or reward the model or the verifier does
    not accept, or a journal pruned although its settings never let it prune); 2: not a
    journal this version can read (the message names the file and line: unreadable, not
    UTF-8, a bad line before the last, an unknown format), or a key or configuration that
    cannot be read, or a verifier --rescore asked for that cannot be built."""
    from invar.model.core import run_complete
    if not path.exists():
        print(f"invar-check: {path}: no such run directory or journal (--trace takes a run "
              "directory of `invar train` or its journal.jsonl)", file=sys.stderr)
        return 2
    if path.is_dir():  # a run directory: its journal
        if not (path / "journal.jsonl").is_file():
            print(f"invar-check: {path}: a directory without a journal.jsonl: not a run "
                  "directory of `invar train`", file=sys.stderr)
            return 2
        path = path / "journal.jsonl"
    try:
        key = None if key_file is None else journal_format.read_key(Path(key_file), path.parent)
        contents = journal_format.read_contents(path, key)
    except (journal_format.ChainError, journal_format.PayloadError,
            journal_format.SnapshotError) as error:
        where, _, why = str(error).partition(": ")
        console.print(f"[red bold]departure[/red bold] at {where}: {why}")
        return 1
    except (OSError, journal_format.JournalError, ConfigError) as error:
        print(f"invar-check: {error}", file=sys.stderr)
        return 2
    config, entries, start = contents.config, contents.entries, contents.start
    from invar.runtime.rescore import pruning_problem  # what the journal's settings mean
    pruned = pruning_problem(contents)
    if pruned:
        console.print(f"[red bold]departure[/red bold] at {payload_dir(path) / pruned}")
        return 1
    checked = 0
    state = None if start is None else start.state
    for entry, _, after in journal_format.replay(config, entries, check_invariants=True,
                                                 start=start):
        if isinstance(after, journal_format.Departure):
            kind = "pruned" if entry.event is None else type(entry.event).__name__
            console.print(f"[red bold]departure[/red bold] at {path}:{after.line} "
                          f"(event {after.seq}, {kind}): {after.reason}")
            console.print(f"the first {checked} events replayed match the model")
            return 1
        checked += 1
        state = after
    try:
        outcome = _rescore(path, contents, rescore)
    except (OSError, ValueError, ConfigError) as error:
        print(f"invar-check: --rescore: {error}", file=sys.stderr)
        return 2
    if isinstance(outcome, journal_format.Rescored):
        console.print(f"[red bold]departure[/red bold] at {path}:{outcome.line}: {outcome}")
        return 1
    rescored, unchecked = outcome
    keyed = "; its keyed chain holds" if key is not None else ""
    replayed = (f"all {checked} events match the model" if start is None else
                f"the last {checked} of {len(entries)} events match the model, replayed from "
                f"{start.path.name} (the state at the start of update "
                f"{start.state.committed}, its digest the one line {start.seq + 2} records); "
                f"the {start.seq + 1} events before it are checked by their chain links, "
                f"sequence numbers and state digests only, not replayed (their payloads "
                f"pruned: output.journal_keep_updates)")
    if state is not None and run_complete(state) and not contents.torn:
        console.print(f"[{'yellow' if unchecked else 'green'}]{path}: complete run: "
                      f"{replayed}[/]; every invariant holds and every recorded digest "
                      f"agrees{keyed}; {rescored}")
        return 4 if unchecked else 0
    committed = 0 if state is None else state.committed
    torn = (f"; its last line is torn ({len(contents.torn)} "
            f"characters after the last newline, ignored)" if contents.torn else "")
    console.print(f"[yellow]{path}: valid prefix, run incomplete: ends at update {committed} "
                  f"of {config.total_updates}[/yellow]: {replayed}{keyed}; {rescored}{torn}")
    return 4 if unchecked else 3


def _rescore(path: Path, contents: journal_format.Contents,
             asked: bool | None) -> journal_format.Rescored | tuple[str, bool]:
    """The first journalled reward the task's verifier does not give, or what was done and
    whether rewards were left unchecked that were not asked to be (the rewards of the
    completions kept: those a replay from `contents.start` reads). The verifier is the one the
    journal binds (`invar.runtime.rescore.verifier`)."""
    if asked is False:
        return "rewards not re-scored (--no-rescore)", False
    from invar.runtime.rescore import verifier  # the task's verifier is a plug-in
    try:
        built = verifier(contents, path.parent, any_task=bool(asked))
    except (OSError, ValueError, ConfigError) as error:
        if asked:
            raise
        return (f"rewards NOT re-scored: the task's verifier cannot be built here from what "
                f"the journal binds: {error}"), True
    if built.score is None:
        return (f"rewards NOT re-scored (task {built.task!r}: its verifier's cost is unknown; "
                f"--rescore re-scores them, --no-rescore accepts them unchecked)"), True
    found = journal_format.rescore(contents.config, contents.entries, built.score,
                                   built.failure_reward, start=contents.start)
    if found.mismatch is not None:
        return found.mismatch
    kept = "" if contents.start is None else " kept"
    if not found.failures:
        return f"all {found.scored}{kept} journalled rewards are the task verifier's", False
    return (f"{found.scored - found.failures} of {found.scored}{kept} journalled rewards are the "
            f"task verifier's, {found.failures} task.failure_reward = {built.failure_reward!r} "
            f"where it now gives another (their call failed or timed out in the run)"), False


def _prove(console: Console, assume_valid: bool) -> int:
    """The lemmas for all parameter values; with them (not with `--drop-validity`, which
    asks what fails without a rule), the code against the proven definitions and the
    schedule's decisions against the pinned ones."""
    from checker.prove import check_lemmas, format_results, python_schedule_is_the_definition
    results = check_lemmas(assume_valid=assume_valid)
    if assume_valid:
        results += [python_schedule_is_the_definition(), pinned.schedule_result()]
    console.print(format_results(results))
    return 0 if all(r.holds for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
