"""The journal of a small canonical run with evaluation and checkpoint boundaries, as a driver
writes it: what trace validation (`invar-check --trace`) is tested on."""

from __future__ import annotations

from pathlib import Path

from invar.model.config import RunConfig
from invar.runtime import journal
from invar.testing import canonical_run


def small_config(**overrides) -> RunConfig:
    base = dict(prompts_per_batch=2, group_size=2, max_staleness=1, sync_period=1,
                optimizer_steps=2, total_updates=4, max_inflight_batches=2, seed=7,
                eval_every=2, checkpoint_every=2)
    base.update(overrides)
    return RunConfig(**base)


def write_journal(path: Path, config: RunConfig) -> Path:
    """The journal a driver writes for the canonical run of `config`."""
    return journal.write_events(path, config, canonical_run(config).events)
