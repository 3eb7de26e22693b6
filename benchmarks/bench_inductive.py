"""The inductive check's size, time and memory per universe, beside the BFS's speed.

    .venv/bin/python benchmarks/bench_inductive.py                 # everything
    .venv/bin/python benchmarks/bench_inductive.py spec/inductive/gate.toml   # one universe
    .venv/bin/python benchmarks/bench_inductive.py seeded_bugs     # one section

Each universe runs as ``invar-check --inductive UNIVERSE --json FILE`` in a process of its own
(its peak resident memory is that process's); then the gate bound `learner.toml` runs as a BFS
on the same machine, for its distinct states per second. Writes
``reports/checker/inductive.json`` and ``.md``.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BFS_BOUND = "spec/gate/learner.toml"


def _child(args: list[str], out: Path) -> tuple[dict[str, Any], float, float, int, int]:
    """The JSON the command wrote, its wall and CPU seconds (user and system: what a shared
    machine's load does not inflate), exit status and peak RSS (KiB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "checker.cli", *args, "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if not out.exists():
        raise RuntimeError(done.stdout + done.stderr)
    return json.loads(out.read_text()), wall, cpu, done.returncode, after.ru_maxrss


def measure(universes: list[str]) -> dict[str, Any]:
    """Each universe's check in a process of its own, and the BFS beside it."""
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for index, universe in enumerate(universes):
            doc, wall, cpu, code, peak = _child(["--inductive", universe],
                                                Path(scratch) / f"u{index}.json")
            rows.append({"universe": universe, "exit": code, "wall_s": round(wall, 1),
                         "cpu_s": round(cpu, 1),
                         "peak_rss_mib": round(peak / 1024), **{
                             k: doc[k] for k in ("universe", "proved", "init_in_indinv",
                                                 "states", "candidates", "naive_product",
                                                 "transitions", "accepted", "outside_universe",
                                                 "counterexamples", "enumerate_s", "check_s",
                                                 "states_per_s")}})
            rows[-1]["description"] = rows[-1].pop("universe")
            rows[-1]["universe"] = universe
        bfs, _, _, _, _ = _child([BFS_BOUND, "--quiet", "--no-livelock"],
                                 Path(scratch) / "b.json")
    return {"universes": rows, "bfs": {
        "bound": BFS_BOUND, "distinct": bfs["distinct_states"],
        "generated": bfs["states_generated"], "search_s": bfs["duration_s"],
        "distinct_per_s": round(bfs["distinct_states"] / bfs["duration_s"])}}


RELAXED_UNIVERSES = {
    "one update": dict(group_size=1, total_updates=1),
    "M < S + 1, three updates": dict(group_size=1, total_updates=3, max_staleness=2,
                                     max_inflight_batches=1),
    "scored (KL term)": dict(group_size=1, total_updates=1, kl_coef=0.1),
}
"""Small universes (one worker; incarnations, loads, attempts and forwards 0..1) where each
conjunct is left out in turn."""


def relaxed() -> list[dict[str, Any]]:
    """Each relaxable conjunct left out of IndInv in each of `RELAXED_UNIVERSES`: the states
    then, beside the states with it, and the counterexamples to induction that follow."""
    from checker.inductive import RELAXABLE, Universe, check
    from checker.invar_model import Bounds
    rows = []
    for label, fields in RELAXED_UNIVERSES.items():
        universe = Universe(Bounds(**fields), incarnations=1, loads=1, attempts=1,
                            observations=1)
        full = check(universe)
        for conjunct in RELAXABLE:
            result = check(Universe(universe.bounds, 1, 1, 1, 1,
                                    relaxed=frozenset({conjunct})))
            rows.append({"universe": label, "conjunct": conjunct, "states_with": full.states,
                         "states_without": result.states,
                         "ctis_without": len(result.counterexamples),
                         "broken": sorted({c.conjunct for c in result.counterexamples})})
    return rows


def seeded_bugs() -> list[dict[str, Any]]:
    """Each seeded bug of tests/helpers/seeded_bugs.py under the inductive check, over the
    universe of its bounds' protocol (counters: incarnations and attempts 0..1, loads 0..1,
    forwards 0..2): whether a counterexample to induction refutes it, and which conjuncts."""
    import pytest

    from checker.inductive import PROTOCOL_KEYS, Builder, Universe, check
    from checker.invar_model import Bounds
    sys.path.insert(0, str(ROOT))
    from tests.helpers.seeded_bugs import SEEDED_BUGS
    rows = []
    for bug in SEEDED_BUGS:
        fields = {k: getattr(bug.bounds, k) for k in PROTOCOL_KEYS}
        universe = Universe(Bounds(**fields), incarnations=2, loads=1, attempts=2,
                            observations=2)
        builder = Builder(universe)  # the correct components' payloads, before the bug
        with pytest.MonkeyPatch.context() as patched:
            bug.apply(patched)
            result = check(universe, builder=builder)
        rows.append({"bug": bug.name, "universe": universe.describe(),
                     "ctis": len(result.counterexamples),
                     "broken": sorted({c.conjunct for c in result.counterexamples}),
                     "bfs_property": bug.prop})
    return rows


BROKEN_SIZES = {
    "worker_lost_without_incarnation_check": dict(group_size=1, total_updates=1, workers=2),
    "version_needed_without_admitted_clause": dict(group_size=1, total_updates=3,
                                                   max_staleness=2, max_inflight_batches=1),
    "bulk_fill_trusts_the_first_slot": dict(group_size=2, total_updates=1),
}
"""The broken handlers of tests/checker/test_inductive.py and the smallest universe of each."""


def small_model() -> list[dict[str, Any]]:
    """Each broken handler's counterexamples in its smallest universe, with one worker more
    and with one update more: the conjuncts they break (the same, up to renaming, if the
    small universe speaks for the larger ones)."""
    import pytest

    from checker.inductive import Builder, Universe, check
    from checker.invar_model import Bounds
    sys.path.insert(0, str(ROOT))
    from tests.checker import test_inductive
    broken = {name: apply for name, apply, _, _ in test_inductive.BROKEN}
    rows = []
    for name, fields in BROKEN_SIZES.items():
        for label, more in (("smallest", {}), ("one worker more",
                                               {"workers": fields.get("workers", 1) + 1}),
                            ("one update more",
                             {"total_updates": fields["total_updates"] + 1})):
            bounds = Bounds(**{**fields, **more})
            universe = Universe(bounds, incarnations=2, loads=1, attempts=1, observations=1,
                                symmetry=bounds.workers > 1)
            builder = Builder(universe)
            with pytest.MonkeyPatch.context() as patched:
                broken[name](patched)
                result = check(universe, builder=builder)
            rows.append({"handler": name, "size": label, "universe": universe.describe(),
                         "states": result.states, "ctis": len(result.counterexamples),
                         "broken": sorted({c.conjunct for c in result.counterexamples})})
    return rows


SECTIONS = {"relaxed": relaxed, "seeded_bugs": seeded_bugs, "small_model": small_model}


def render(doc: dict[str, Any]) -> str:
    lines = [
        "# The inductive check: size, time and memory per universe",
        "",
        "Generated by `benchmarks/bench_inductive.py` (`invar-check --inductive UNIVERSE`, one "
        "process per universe; peak RSS is the largest of the processes so far). States: the "
        "states of IndInv in the universe, built field by field from candidates (the plain "
        "product of the fields' ranges beside them); transitions: events applied to them "
        "(accepted or no-op, the rest refused); outside: accepted steps to a state past a "
        "counter's range, checked on their own. The machine is a shared 2-core one: the wall "
        "seconds (and the enumerate and check seconds, wall too) grow with its load, the CPU "
        "seconds (the process's user and system time) do not.",
        "",
        "| universe | proved | states | candidates | plain product | transitions | accepted "
        "| outside | CTIs | enumerate s | check s | states/s | wall s | CPU s | peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["universes"]:
        lines.append(
            f"| `{r['universe']}` | {'yes' if r['proved'] else 'no'} | {r['states']:,} | "
            f"{r['candidates']:,} | {r['naive_product']:.2e} | {r['transitions']:,} | "
            f"{r['accepted']:,} | {r['outside_universe']:,} | {r['counterexamples']} | "
            f"{r['enumerate_s']} | {r['check_s']} | {r['states_per_s']:,} | {r['wall_s']} | "
            f"{r.get('cpu_s', '-')} | {r['peak_rss_mib']} |")
    lines += ["", "Universes:", ""]
    lines += [f"- `{r['universe']}`: {r['description']}" for r in doc["universes"]]
    lines += ["", "## Broken handlers, one worker and one update more", "",
              "The deliberately broken handlers of `tests/checker/test_inductive.py` (a loss of "
              "a retired incarnation taken for the current one's; a release that forgets "
              "batches not yet admitted; a bulk fill that reads every slot as the first one), "
              "each in its smallest universe (incarnations 0..1, loads 0..1, one attempt, "
              "forwards 0..1; symmetry with two workers or more), with one worker more and "
              "with one update more: the conjuncts their counterexamples break.", "",
              "| handler | universe | states | CTIs | conjuncts the CTIs break |",
              "|---|---|---|---|---|"]
    lines += [f"| `{r['handler']}` | {r['size']}: {r['universe']} | {r['states']:,} | "
              f"{r['ctis']:,} | {', '.join(r['broken']) or '-'} |"
              for r in doc.get("small_model", [])]
    lines += ["", "## Each conjunct left out", "",
              "Each relaxable conjunct of the strengthening (PROTOCOL.md §8.1) left out of "
              "IndInv in turn (`Universe.relaxed`: the fields it constrains then drawn from "
              "their whole ranges), in small universes of one worker with counters 0..1: the "
              "states of IndInv with it and without it, and the counterexamples to induction "
              "without it (with it, none).", "",
              "| universe | conjunct left out | states with it | states without it | CTIs "
              "without it | conjuncts the CTIs break |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['universe']} | `{r['conjunct']}` | {r['states_with']:,} | "
              f"{r['states_without']:,} | {r['ctis_without']:,} | "
              f"{', '.join(r['broken']) or '-'} |" for r in doc.get("relaxed", [])]
    lines += ["", "## The seeded bugs", "",
              "Each bug of `tests/helpers/seeded_bugs.py` (all refuted by the gate's BFS, "
              "`tests/checker/test_checker_seeded_bugs.py`) under the inductive check, over the "
              "universe of its bounds' protocol with incarnations and attempts 0..1, loads "
              "0..1 and forwards 0..2: the counterexamples to induction and the conjuncts they "
              "break. A bug only the world sees (a forgery accepted, a completed run that "
              "departs from the canonical one) leaves IndInv inductive: the bounded searches "
              "refute it.", "",
              "| bug | property the BFS refutes it by | CTIs | conjuncts the CTIs break |",
              "|---|---|---|---|"]
    lines += [f"| `{r['bug']}` | {r['bfs_property']} | {r['ctis']:,} | "
              f"{', '.join(r['broken']) or '-'} |" for r in doc.get("seeded_bugs", [])]
    b = doc["bfs"]
    alphabet = sum(r["transitions"] for r in doc["universes"]) / sum(
        r["states"] for r in doc["universes"])
    lines += ["", f"The BFS on the same machine, `invar-check {b['bound']} --no-livelock`: "
              f"{b['distinct']:,} distinct states ({b['generated']:,} generated) in "
              f"{b['search_s']:.2f} s, {b['distinct_per_s']:,} distinct states/s. An inductive "
              f"state costs its whole alphabet ({alphabet:.0f} events on average here, each a "
              f"`step` and the invariants on what it leads to); a BFS state costs its few "
              f"enabled actions.", ""]
    return "\n".join(lines)


def main() -> int:
    """With no argument: every universe of spec/inductive/ and every section; with universe
    paths, those; with section names (`relaxed`, `seeded_bugs`, `small_model`), those. What is
    not measured again is kept from the report's JSON."""
    args = sys.argv[1:]
    sections = [a for a in args if a in SECTIONS] or (list(SECTIONS) if not args else [])
    universes = [a for a in args if a not in SECTIONS]
    out = ROOT / "reports" / "checker"
    known = out / "inductive.json"
    doc: dict[str, Any] = json.loads(known.read_text()) if known.exists() else {}
    if universes or not args:
        measured = measure(universes or sorted(
            str(p.relative_to(ROOT)) for p in (ROOT / "spec" / "inductive").glob("*.toml")))
        rows = {r["universe"]: r for r in doc.get("universes", [])}
        rows.update({r["universe"]: r for r in measured["universes"]})
        doc.update(measured, universes=sorted(rows.values(), key=lambda r: r["universe"]))
    for name in sections:
        doc[name] = SECTIONS[name]()
    known.write_text(json.dumps(doc, indent=2) + "\n")
    (out / "inductive.md").write_text(render(doc))
    print(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
