"""The journal of a small canonical run with evaluation and checkpoint boundaries, as a driver
writes it: what trace validation (`invar-check --trace`) is tested on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from invar.model.config import RunConfig
from invar.runtime import journal
from invar.testing import canonical_run


def small_config(**overrides) -> RunConfig:
    base = dict(prompts_per_batch=2, group_size=2, max_staleness=1, sync_period=1,
                optimizer_steps=2, total_updates=4, max_inflight_batches=2, seed=7,
                eval_every=2, checkpoint_every=2)
    base.update(overrides)
    return RunConfig(**base)


def settings(*overrides: str) -> dict[str, Any]:
    """What a journal's header binds besides the protocol for the training configuration of
    `overrides` (--set items; not validated: a test may bind what cannot be built)."""
    from invar.runtime.binding import bound_settings
    from invar.runtime.config import load_config
    return bound_settings(load_config(None, overrides, validate=False))


def write_journal(path: Path, config: RunConfig, bound: dict[str, Any] | None = None) -> Path:
    """The journal a driver writes for the canonical run of `config`, its header binding
    `bound` (`settings`; None: nothing, so that its rewards, the fakes', are not re-scored)."""
    return journal.write_events(path, config, canonical_run(config).events, settings=bound)


def rewrite(path: Path, config: RunConfig, events: list, key: bytes | None = None) -> Path:
    """The journal `path` written anew with `events` (and `key`), its header binding what it
    bound: what a forger who can write the run directory does."""
    header = json.loads(path.read_text().split("\n", 1)[0])
    bound = {name: header[name] for name in ("settings", "files") if name in header}
    path.unlink()
    return journal.write_events(path, config, events, key=key, **bound)
