"""`invar train [CONFIG.toml] [--set key=value ...] [--backend torch|mlx] [--resume RUN_DIR]
[--serial]`."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

from invar.model.errors import ConfigError
from invar.model.schedule import report
from invar.runtime.config import TrainConfig, load_config


def make_learner(config: TrainConfig) -> Any:
    """The learner backend the configuration names."""
    commit_dir = Path(config.output.run_dir) / "commits"
    if config.learner.backend == "mlx":
        from invar.runtime.mlx_learner import MLXLearner
        return MLXLearner(config.policy, config.optim, config.protocol.seed, commit_dir,
                          keep_commits=config.learner.keep_commits)
    import torch

    from invar.runtime.torch_learner import TorchLearner
    torch.set_num_threads(config.learner.threads)
    torch.use_deterministic_algorithms(True)
    return TorchLearner(config.policy, config.optim, config.protocol.seed, commit_dir,
                        device=config.learner.device, keep_commits=config.learner.keep_commits)


def train(config: TrainConfig, resume: bool = False, serial: bool = False) -> dict[str, Any]:
    """Run (or resume) training; returns the run's summary."""
    from invar.runtime.driver import Driver, pin_current_process, run_serial
    pin_current_process(config.learner.cpus)
    learner = make_learner(config)
    if serial:
        run_serial(config, learner)
        return {}
    asyncio.run(Driver(config, learner, resume=resume).run())
    return json.loads((Path(config.output.run_dir) / "summary.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="invar", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("train", help="train the default policy (or CONFIG.toml)")
    run.add_argument("config", nargs="?", help="TOML configuration (defaults if omitted)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a key, e.g. --set optim.lr=3e-4 (repeatable)")
    run.add_argument("--backend", choices=("torch", "mlx"),
                     help="learner and sampler backend: shorthand for --set learner.backend=... "
                          "(mlx runs synchronously: it needs protocol.max_staleness=0)")
    run.add_argument("--resume", metavar="RUN_DIR",
                     help="continue the run in RUN_DIR from its journal and last commit")
    run.add_argument("--serial", action="store_true",
                     help="execute the schedule one command at a time, in one process")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.backend:
        args.set.append(f"learner.backend={json.dumps(args.backend)}")
    try:
        if args.resume:
            saved = Path(args.resume) / "config.json"
            if not saved.exists():
                raise ConfigError(("--resume",), f"{saved} not found: not a run directory")
            # The run lives where it is now, whatever path it was started under.
            here = f"output.run_dir={json.dumps(str(args.resume))}"
            started = json.loads(saved.read_text())
            config = load_config(None, _flatten(started) + [here] + args.set)
            backend = started.get("learner", {}).get("backend", "torch")
            if config.learner.backend != backend:
                # Each backend's commits hold its own optimizer state.
                raise ConfigError(("learner.backend",),
                                  f"the run was started with the {backend} backend; a run "
                                  "cannot change its backend")
        else:
            config = load_config(args.config, args.set)
    except ConfigError as error:
        print(f"invar: configuration refused: {error}", file=sys.stderr)
        return 2
    schedule = report(config.protocol)
    for note in schedule.notes:
        print(f"note: {note}", file=sys.stderr)
    from invar.runtime.driver import ResumeError  # torch is imported from here on
    from invar.runtime.journal import JournalError
    from invar.runtime.torch_learner import CommitError
    try:
        summary = train(config, resume=bool(args.resume), serial=args.serial)
    except (CommitError, JournalError, ResumeError, FileExistsError) as error:
        # A run directory that cannot be (re)started as it is: say which file and why.
        print(f"invar: {'cannot resume' if args.resume else 'cannot start'}: {error}",
              file=sys.stderr)
        return 1
    if summary:
        run_dir = Path(config.output.run_dir)
        heldout = summary["final_heldout_reward"]
        print(f"done: {summary['updates']} updates in {summary['wall_seconds']:.1f} s, "
              f"held-out reward {'-' if heldout is None else f'{heldout:.3f}'}; "
              f"report: {run_dir / 'report.md'}")
    return 0


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
