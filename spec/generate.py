"""Regenerate the computed parts of spec/PROTOCOL.md from the code and the gate's bounds
(spec/gate/*.toml); nothing there is hand-typed.

    .venv/bin/python spec/generate.py            # print every generated block
    .venv/bin/python spec/generate.py --write    # rewrite the blocks in PROTOCOL.md, and
                                                 # phases.dot (and phases.svg if `dot` exists)
    .venv/bin/python spec/generate.py --check    # exit 1 if PROTOCOL.md or phases.dot is stale,
                                                 # or spec/gate/pinned.json is not the code's
    .venv/bin/python spec/generate.py --measure  # run every gate bound and pin its state
                                                 # counts and the schedule's decisions in
                                                 # spec/gate/pinned.json, then --write

The gate's state counts come from `spec/gate/pinned.json` (`checker.pinned`), which only
--measure writes: the gate fails a bound whose counts differ from the pinned ones, and --check
fails when the file's schedule or its bounds are not the code's and the gate's.

A block sits between `<!-- BEGIN generated: NAME -->` and `<!-- END generated: NAME -->`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from checker import pinned  # noqa: E402
from checker.invar_model import load_bounds  # noqa: E402
from invar.model import schedule, transitions  # noqa: E402
from invar.model.config import RunConfig  # noqa: E402

HERE = Path(__file__).resolve().parent
GATE = pinned.GATE  # checker/gate/, shipped with the package: spec/gate links to it

TABLES = (  # (label, declared fields); B, G, K do not enter the schedule's versions
    ("a", dict(max_staleness=1, sync_period=1, total_updates=6)),
    ("b", dict(max_staleness=2, sync_period=3, total_updates=9)),
    ("c", dict(max_staleness=3, sync_period=2, checkpoint_every=5, total_updates=12)),
    ("d", dict(max_staleness=11, sync_period=12, eval_every=10, total_updates=30)),
)
SHORT = {"max_staleness": "S", "sync_period": "P", "eval_every": "E", "checkpoint_every": "C",
         "total_updates": "N", "max_inflight_batches": "M"}
WIDE = 12
"""Tables with more batches than this are printed with one row per run of equal columns."""


def _set(values) -> str:
    return "{" + ", ".join(map(str, values)) + "}"


def worked_table(label: str, declared: dict[str, int]) -> str:
    config = RunConfig(prompts_per_batch=1, group_size=2, optimizer_steps=1, **declared).validate()
    n = config.total_updates
    pub = schedule.published_versions(config)
    hard = sorted(schedule.hard_boundaries(config))
    generating = sorted({schedule.gen_version(config, b) for b in range(n)})
    dead = [v for v in pub if v not in generating and v not in hard]
    report = schedule.report(config)
    shown = {**declared, "max_inflight_batches": config.max_inflight_batches}
    head = ", ".join(f"{SHORT[k]}={v}" for k, v in shown.items())
    notes = "; ".join(note.split(": ", 1)[0] for note in report.notes) or "none"
    lines = [f"({label}) {head}. Pub = {_set(pub)}; Hard = {_set(hard)}; generating versions = "
             f"{_set(generating)}; published, not hard, generating nothing = {_set(dead)}. "
             f"`report`: effective_staleness = {report.effective_staleness}, "
             f"effective_sync_period = {report.effective_sync_period}; notes: {notes}.", ""]
    columns = []
    for b in range(n):
        notes_value = next(v for v in pub if v >= max(0, b - config.max_staleness))
        gen = schedule.gen_version(config, b)
        columns.append((notes_value, schedule.last_boundary(config, b), gen,
                        schedule.staleness(config, b)))

    def gen_cell(notes_value: int, gen: int) -> str:
        return str(gen) if gen == notes_value else f"**{gen}** (notes: {notes_value})"

    if n <= WIDE:
        lines += ["| b | " + " | ".join(map(str, range(n))) + " |",
                  "|---|" + "---|" * n]
        rows = (("min{v∈Pub : v ≥ b−S}", lambda c: str(c[0])),
                ("last_boundary(b)", lambda c: str(c[1])),
                ("gen_version(b)", lambda c: gen_cell(c[0], c[2])),
                ("staleness(b)", lambda c: str(c[3])))
        for name, cell in rows:
            lines.append(f"| {name} | " + " | ".join(cell(c) for c in columns) + " |")
    else:
        lines += ["| b | min{v∈Pub : v ≥ b−S} | last_boundary(b) | gen_version(b) | staleness(b) |",
                  "|---|---|---|---|---|"]
        start = 0
        for b in range(1, n + 1):
            if b < n and columns[b][:3] == columns[start][:3]:
                continue
            first, last = columns[start], columns[b - 1]
            span = str(start) if b - 1 == start else f"{start}–{b - 1}"
            stale = str(first[3]) if b - 1 == start else f"{first[3]}–{last[3]}"
            lines.append(f"| {span} | {first[0]} | {first[1]} | {gen_cell(first[0], first[2])} "
                         f"| {stale} |")
            start = b
    return "\n".join(lines)


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


FAULTS = (("drops", "drop", "drops"), ("duplicates", "duplicate", "duplicates"),
          ("worker_crashes", "worker crash", "worker crashes"),
          ("learner_crashes", "learner crash", "learner crashes"),
          ("driver_restarts", "driver restart", "driver restarts"),
          ("early_timers", "early timer", "early timers"),
          ("repeats", "repeated connection-level event", "repeated connection-level events"))


def gate_bounds() -> list:
    return [(spec, *load_bounds(spec)) for spec in sorted(GATE.glob("*.toml"))]


def gate_table() -> str:
    """One row per bound of the gate (spec/gate/*.toml), as `load_bounds` reads it, with its
    pinned state counts."""
    values = pinned.load()
    lines = ["| bound | covers | protocol | faults | options | states (distinct / generated) |",
             "|---|---|---|---|---|---|"]
    for spec, bounds, options in gate_bounds():
        data = tomllib.loads(spec.read_text())
        description = " ".join(data.get("description", "").split())
        covers = f"**{data.get('covers', '')}**" + (f": {description}" if description else "")
        b = bounds
        sizes = [f"B={b.prompts_per_batch}", f"G={b.group_size}", f"S={b.max_staleness}",
                 f"P={b.sync_period}", f"K={b.optimizer_steps}", f"N={b.total_updates}",
                 f"M={b.max_inflight_batches}"]
        sizes += [f"{name}={value}" for name, value in (("E", b.eval_every),
                                                         ("C", b.checkpoint_every)) if value]
        sizes.append(_count(b.workers, "worker", "workers"))
        if b.kl_coef:
            sizes.append(f"β={b.kl_coef}")
        if not b.reproducible_forwards:
            sizes.append("non-reproducible forwards")
        faults = [_count(getattr(b, field), one, many) for field, one, many in FAULTS
                  if getattr(b, field)]
        if b.worker_crashes and not b.worker_restarts:
            faults.append("no worker restart")
        flags = [name for name, on in (
            ("livelock", options.get("livelock", False)),
            ("symmetry", options.get("symmetry", True) and b.workers > 1),
            ("reduction", options.get("reduction", True))) if on]
        counts = pinned.bound_counts(values, spec.stem)
        states = "not pinned" if counts is None else f"{counts[0]:,} / {counts[1]:,}"
        lines.append(f"| `{spec.name}` | {covers} | {', '.join(sizes)} | "
                     f"{', '.join(faults) or 'none'} | {', '.join(flags) or 'none'} | "
                     f"{states} |")
    return "\n".join(lines)


def gate_coverage() -> str:
    """What the gate's bounds exercise together, and what none of them does."""
    rows = gate_bounds()
    if not rows:
        return "The gate has no bounds."
    every = [b for _, b, _ in rows]
    top = {name: max(getattr(b, field) for b in every) for name, field in (
        ("B", "prompts_per_batch"), ("G", "group_size"), ("S", "max_staleness"),
        ("P", "sync_period"), ("K", "optimizer_steps"), ("N", "total_updates"),
        ("M", "max_inflight_batches"), ("workers", "workers"))}
    faults, missing = [], []
    for field, one, _ in FAULTS:
        where = [spec.stem for spec, b, _ in rows if getattr(b, field)]
        (faults if where else missing).append(f"{one} ({', '.join(where)})" if where else one)
    most = max(getattr(b, field) for b in every for field, _, _ in FAULTS)
    boundaries = [spec.stem for spec, b, _ in rows if b.eval_every or b.checkpoint_every]
    reloads = [spec.stem for spec, b, _ in rows
               if len({schedule.gen_version(b.protocol(), u)
                       for u in range(b.total_updates)}) > 1]
    text = [f"Largest sizes across the gate: {', '.join(f'{k} = {v}' for k, v in top.items())}. "
            f"Faults exercised (at most {most} of a kind per bound): "
            f"{'; '.join(faults) or 'none'}"
            + (f"; in no bound: {', '.join(missing)}" if missing else "")
            + f". Evaluation/checkpoint boundaries before N: {', '.join(boundaries) or 'no bound'}"
            f"; a worker re-loading a newer version: {', '.join(reloads) or 'no bound'}."]
    gaps = []
    if top["B"] == 1:
        gaps.append("B = 1 in every bound: a batch is one prompt group, so it never spreads "
                    "over two workers")
    if top["workers"] == 1:
        gaps.append("one worker in every bound: symmetry, load balancing and requests moving "
                    "to another worker are not exercised")
    several = {spec.stem for spec, b, _ in rows if b.workers > 1}
    if several and not several & set(reloads):
        gaps.append("two workers and a version reload in one bound")
    if not any(b.kl_coef for b in every):
        gaps.append("no KL term")
    if all(b.reproducible_forwards for b in every):
        gaps.append("forwards reproducible in every bound")
    if gaps:
        text.append("Not in the gate: " + "; ".join(gaps) + ".")
    return " ".join(text)


def blocks() -> dict[str, str]:
    plan_config = RunConfig(prompts_per_batch=2, group_size=3, optimizer_steps=4, seed=0)
    seeds = ", ".join(
        f"`sampling_seed({tuple(r)}) = {schedule.sampling_seed(plan_config, r)}`"
        for r in (schedule.RequestId(0, 0, 0), schedule.RequestId(0, 0, 1),
                  schedule.RequestId(1, 0, 0)))
    plans = ", ".join(f"`minibatch_plan({u}) = {schedule.minibatch_plan(plan_config, u)}`"
                      for u in (0, 1))
    n, k = plan_config.samples_per_batch, plan_config.optimizer_steps
    cuts = ", ".join(str(round(j * n / k)) for j in range(k + 1))
    return {
        "seeds": f"Example (seed = 0): {seeds}.",
        "plan": f"Example (B=2, G=3, K=4, seed=0; cuts {cuts}): {plans}.",
        "tables": "\n\n".join(worked_table(label, declared) for label, declared in TABLES),
        "phases": transitions.to_markdown().rstrip("\n"),
        "gate": gate_table(),
        "gate-coverage": gate_coverage(),
    }


def measure() -> dict[str, dict[str, int]]:
    """Every gate bound's state counts, each checked as `invar-check` checks it (its own
    process and options), and the inductive check's, two at a time."""
    specs = [spec for spec, _, _ in gate_bounds()]

    def counts(spec: Path | None) -> tuple[str, dict[str, int]]:
        if spec is None:
            return pinned.INDUCTIVE, _inductive_counts(scratch)
        out = Path(scratch) / f"{spec.stem}.json"
        done = subprocess.run([sys.executable, "-m", "checker.cli", str(spec), "--quiet",
                               "--json", str(out)], capture_output=True, text=True,
                              cwd=HERE.parent)
        if done.returncode != 0:
            raise SystemExit(f"{spec}: the bound fails, nothing pinned:\n{done.stdout}"
                             f"{done.stderr}")
        doc = json.loads(out.read_text())
        return spec.stem, {key: doc[key] for key in ("distinct_states", "states_generated")}

    with tempfile.TemporaryDirectory(prefix="invar-pin-") as scratch, \
            ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(counts, [*specs, None]))


def _inductive_counts(scratch: str) -> dict[str, int]:
    """The states and transitions of the gate's inductive check (`invar-check --inductive`)."""
    out = Path(scratch) / "inductive.json"
    done = subprocess.run([sys.executable, "-m", "checker.cli", "--inductive",
                           str(pinned.GATE_UNIVERSE), "--json", str(out)], capture_output=True,
                          text=True, cwd=HERE.parent)
    if done.returncode != 0:
        raise SystemExit(f"the inductive check fails, nothing pinned:\n{done.stdout}"
                         f"{done.stderr}")
    doc = json.loads(out.read_text())
    return {key: doc[key] for key in ("distinct_states", "states_generated")}


def pinned_text(counts: dict[str, dict[str, int]]) -> str:
    """The file's text for `counts` (every bound's, and the inductive check's under
    `pinned.INDUCTIVE`)."""
    bounds = {name: value for name, value in counts.items() if name != pinned.INDUCTIVE}
    return json.dumps({"bounds": bounds, pinned.INDUCTIVE: counts.get(pinned.INDUCTIVE),
                       "schedule": pinned.schedule_values()}, indent=1, sort_keys=True) + "\n"


def pinned_problem() -> str:
    """Why spec/gate/pinned.json is not the code's and the gate's (empty: it is)."""
    if not pinned.PINNED.exists():
        return f"{pinned.PINNED} is missing (run spec/generate.py --measure)"
    values = pinned.load()
    bounds = values.get("bounds", {})
    names = sorted(spec.stem for spec, _, _ in gate_bounds())
    if sorted(bounds) != names:
        return (f"{pinned.PINNED} pins the bounds {sorted(bounds)}, the gate has {names} (run "
                f"spec/generate.py --measure)")
    if values.get(pinned.INDUCTIVE) is None:
        return f"{pinned.PINNED} pins no inductive check (run spec/generate.py --measure)"
    if pinned.PINNED.read_text() != pinned_text({**bounds,
                                                 pinned.INDUCTIVE: values[pinned.INDUCTIVE]}):
        return (f"{pinned.PINNED} is not the schedule's decisions as generated (run "
                f"spec/generate.py --measure)")
    return ""


def render(text: str, generated: dict[str, str]) -> str:
    for name, body in generated.items():
        pattern = re.compile(rf"(<!-- BEGIN generated: {name} -->\n)(?:.*?\n)?"
                             rf"(<!-- END generated: {name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"PROTOCOL.md has no generated block {name!r}")
        text = pattern.sub(lambda m, body=body: m.group(1) + body + "\n" + m.group(2), text)
    return text


def main() -> int:
    if "--measure" in sys.argv:
        pinned.PINNED.write_text(pinned_text(measure()))
        sys.argv.append("--write")
    generated = blocks()
    if "--check" not in sys.argv and "--write" not in sys.argv:
        for name, body in generated.items():
            print(f"<!-- {name} -->\n{body}\n")
        return 0
    spec = HERE / "PROTOCOL.md"
    current = spec.read_text()
    wanted = render(current, generated)
    dot = transitions.to_dot()
    if "--check" in sys.argv:
        dot_path = HERE / "phases.dot"
        stale = [p.name for p, ok in ((spec, wanted == current),
                                      (dot_path, dot_path.read_text() == dot))
                 if not ok]
        if stale:
            print(f"out of date: {', '.join(stale)} (run spec/generate.py --write)")
            return 1
        problem = pinned_problem()
        if problem:
            print(problem)
            return 1
        return 0
    spec.write_text(wanted)
    (HERE / "phases.dot").write_text(dot)
    if shutil.which("dot"):
        subprocess.run(["dot", "-Tsvg", str(HERE / "phases.dot"), "-o",
                        str(HERE / "phases.svg")], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
