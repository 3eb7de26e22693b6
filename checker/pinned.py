"""The gate and what it pins: its bounds (`GATE`, shipped with the package as checker/gate/,
which spec/gate links to), and each bound's state counts and a sample of the schedule's
decisions, as `checker/gate/pinned.json` holds them.

`spec/generate.py --measure` writes the file from the code (never by hand) and PROTOCOL.md's
figures are rendered from it; the gate compares the code with it (`invar-check` with no
argument: every bound's distinct and generated states; `invar-check --prove`: the schedule's
decisions), so a change to the protocol's state space or to its schedule fails the gate until
it is regenerated and reviewed. The schedule's own runs cannot see a change to its definitions
(a run and the canonical schedule it is compared with share them): these values can.
"""

from __future__ import annotations

import importlib.resources
import json
import time
from pathlib import Path
from typing import Any

from invar.model import schedule
from invar.model.config import RunConfig


def _gate_folder() -> Path:
    """The gate's folder as the installed package has it: a folder on disk (each bound is
    checked in a process of its own, which is given its path)."""
    folder = importlib.resources.files("checker") / "gate"
    if not isinstance(folder, Path):  # pragma: no cover - a package imported from a zip
        raise RuntimeError(f"invar-check: the gate's bounds ({folder}) are not files on disk: "
                           "install the package unzipped")
    return folder.resolve()


GATE = _gate_folder()
"""The gate: one bounded model per ``*.toml`` file, and `PINNED`."""
PINNED = GATE / "pinned.json"
GATE_UNIVERSE = GATE.parent / "universes" / "gate.toml"
"""The universe over which the gate proves the invariants inductive (`invar-check
--inductive`; spec/inductive links to its folder)."""

_SMALL = dict(prompts_per_batch=2, group_size=2, optimizer_steps=2)
"""Batches small enough to pin their every seed and plan (versions and boundaries do not depend
on B, G or K)."""

SCHEDULE_CONFIGS: dict[str, dict[str, Any]] = {
    # Seeds, plans and prompt indices (B, G, K and the seed); no boundary but the last.
    "plans": dict(prompts_per_batch=2, group_size=3, optimizer_steps=4, max_staleness=1,
                  sync_period=1, total_updates=4, seed=0),
    # Staleness 2 with publication every 3 (P > S + 1 is refused: 3 = S + 1), no boundaries.
    "sparse": dict(max_staleness=2, sync_period=3, total_updates=9, seed=7, **_SMALL),
    # Checkpoints every 5 without evaluations, and evaluations without checkpoints.
    "checkpoints": dict(max_staleness=3, sync_period=2, checkpoint_every=5, total_updates=12,
                        **_SMALL),
    "evaluations": dict(max_staleness=11, sync_period=12, eval_every=10, total_updates=30,
                        **_SMALL),
    "both": dict(max_staleness=2, sync_period=1, eval_every=3, checkpoint_every=4,
                 total_updates=9, prompts_per_batch=3, group_size=2, optimizer_steps=2, seed=1),
}


def schedule_values() -> dict[str, dict[str, Any]]:
    """The schedule's decisions for each of `SCHEDULE_CONFIGS`, as JSON values."""
    return {label: _decisions(RunConfig(**fields).validate())
            for label, fields in SCHEDULE_CONFIGS.items()}


def _decisions(config: RunConfig) -> dict[str, Any]:
    n = config.total_updates
    versions = range(n + 1)
    values = {
        "published": schedule.published_versions(config),
        "hard_boundaries": sorted(schedule.hard_boundaries(config)),
        "evaluated": [v for v in versions if schedule.is_eval_boundary(config, v)],
        "checkpointed": [v for v in versions if schedule.is_checkpoint_boundary(config, v)],
        "gen_version": [schedule.gen_version(config, b) for b in range(n)],
        "batches_of_version": {v: list(schedule.batches_of_version(config, v))
                               for v in versions},
        "seeds": {b: schedule.batch_seeds(config, b) for b in (0, n - 1)},
        "sampling_seeds": [schedule.sampling_seed(config, request)
                           for request in schedule.request_ids(config, n - 1)],
        "plan_keys": schedule.seed_words(config.seed, "plan", 0, count=4).tolist(),
        "derived_seed": schedule.derive_seed(config.seed, "pinned", 1),
        "prompt_indices": schedule.batch_prompt_indices(config, n - 1),
        "plans": {u: schedule.minibatch_plan(config, u) for u in (0, n - 1)},
        "report": [schedule.report(config).effective_staleness,
                   schedule.report(config).effective_sync_period],
    }
    return json.loads(json.dumps(values))  # tuples as lists, keys as text: as the file has them


def load() -> dict[str, Any]:
    """The pinned values (empty: no file, nothing pinned)."""
    return json.loads(PINNED.read_text()) if PINNED.exists() else {}


INDUCTIVE = "inductive"
"""The gate's inductive check: its row in the gate's table, its key in the file (the states of
IndInv in `GATE_UNIVERSE` and the events applied to them)."""


def bound_counts(pinned: dict[str, Any], name: str) -> tuple[int, int] | None:
    """The pinned (distinct, generated) states of gate bound `name`, or (states, transitions)
    of the inductive check for `INDUCTIVE` (None: not pinned)."""
    counts = (pinned.get(INDUCTIVE) if name == INDUCTIVE
              else pinned.get("bounds", {}).get(name))
    return None if counts is None else (counts["distinct_states"], counts["states_generated"])


def schedule_result() -> Any:
    """`checker.prove.LemmaResult` of comparing the schedule's decisions with the pinned ones:
    the first that differs, named by configuration and value."""
    from checker.prove import LemmaResult
    start = time.perf_counter()
    statement = (f"the schedule's decisions for {len(SCHEDULE_CONFIGS)} configurations "
                 f"(publications, boundaries, generating versions, seeds, plans) are the ones "
                 f"pinned in {PINNED.parent.parent.name}/{PINNED.parent.name}/{PINNED.name}")
    pinned = load().get("schedule")
    detail = ""
    if pinned is None:
        detail = f"{PINNED} pins no schedule (run spec/generate.py --measure)"
    else:
        try:
            now = schedule_values()
        except Exception as error:  # a schedule that cannot even say its decisions
            now, detail = {}, f"the schedule raised {type(error).__name__}: {error}"
        for label in SCHEDULE_CONFIGS:
            if detail:
                break
            for key, value in pinned.get(label, {}).items():
                if now[label].get(key) != value:
                    detail = (f"{label} ({SCHEDULE_CONFIGS[label]}): {key} is "
                              f"{_short(now[label].get(key))}, pinned {_short(value)}")
                    break
    return LemmaResult("schedule_is_pinned", statement, not detail, None,
                       time.perf_counter() - start, detail)


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "..."
