"""How big a deep bound that cannot complete is: estimated from the fault kinds' own factors.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_deep_estimate.py
    PYTHONPATH=. .venv/bin/python benchmarks/bench_deep_estimate.py spec/deep/all_faults.toml \
        --max-states 4000000 --pairs drops+duplicates worker_crashes+learner_crashes

Growth per BFS level cannot be extrapolated to the end of a deep search (it falls once the
fault budgets are spent), so this runs to completion the bound's smaller relatives instead:
the fault-free base (every fault budget 0), each fault kind alone at the bound's budget, and a
few pairs of kinds; each with the bound's `[check]` symmetry and reduction, breadth-first
over `--processes`, but with the livelock check off (no graph: the state count is the same,
the memory and time are the search's own). Each run is capped by `--max-states` and
`--rss-limit-mib` (a shared machine); a capped run's count is a lower bound, and so is every
estimate made from it. Each run is its own process, so that its peak memory is its own.

The estimate: each kind k multiplies the base N0 by r_k = N_k / N0; if the kinds were
independent, N = N0 * prod_k r_k. A pair's interaction I_ab = N_ab / (N0 r_a r_b) measures
how far two kinds are from independent (above 1: together they reach more than the product).
Taking log N as the base plus the kinds' terms plus one term per pair of kinds (triples and
more left out), and every unmeasured pair's term as the measured pairs' mean log I (the
geometric mean I_g): N_est = N0 * prod_k r_k * I_g ** P, P = the number of pairs of kinds in
the bound. The range uses the smallest and largest measured I (each floored, resp. capped, at
1: the plain product) for every pair. Time: the states per second of the largest complete run;
memory: its peak resident bytes per distinct state (no livelock graph).
Writes ``reports/checker/deep_estimate_<bound>.json`` and ``.md`` (every figure from the run).
Exits 1 if a run found a property violated (a capped run's counterexample is real too).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench_deep_growth import ROOT, rss_mib  # benchmarks/: on sys.path

from checker.invar_model import Bounds, InvarModel, load_bounds
from checker.result import Progress, Verdict
from checker.search import Checker

FAULT_KINDS = ("drops", "duplicates", "worker_crashes", "learner_crashes", "driver_restarts",
               "early_timers")
DEFAULT_PAIRS = ("drops+duplicates", "worker_crashes+learner_crashes", "early_timers+drops",
                 "driver_restarts+worker_crashes")


def search(name: str, bounds: Bounds, options: dict[str, Any], processes: int,
           max_states: int, rss_limit_mib: float, reply: Connection) -> None:
    """One variant's complete (or capped) search; its figures go back through `reply`."""
    model = InvarModel(bounds, symmetry=options.get("symmetry", True),
                       reduction=options.get("reduction", True))
    peak = [rss_mib()]
    checker: Checker[Any, Any]

    def progress(p: Progress) -> None:
        rss = rss_mib()
        peak[0] = max(peak[0], rss)
        print(json.dumps({"variant": name, "depth": p.depth, "distinct": p.distinct,
                          "elapsed_s": round(p.elapsed_s, 1), "rss_mib": round(rss)}),
              flush=True)
        if peak[0] > rss_limit_mib:
            checker.request_stop()

    # finish_when="exhausted": the count of the whole space, even once every verdict is known.
    checker = Checker(model, processes=processes, check_livelock=False, finish_when="exhausted",
                      max_states=max_states, progress=progress, progress_interval=0.0)
    began = time.perf_counter()
    result = checker.bfs()
    wall = time.perf_counter() - began
    stop = result.stop_reason
    if stop == "stop_requested" and peak[0] > rss_limit_mib:
        stop = f"memory above {rss_limit_mib:.0f} MiB"
    reply.send({
        "distinct_states": result.distinct_states,
        "states_generated": result.states_generated,
        "max_depth": result.max_depth,
        "duration_s": wall,
        "complete": result.complete,
        "stop_reason": stop,
        "peak_rss_mib": peak[0],
        "violated": sorted(name for name, p in result.properties.items()
                           if p.verdict is Verdict.VIOLATED),
    })


def run_variant(name: str, bounds: Bounds, options: dict[str, Any],
                args: argparse.Namespace) -> dict[str, Any]:
    receive, send = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("spawn").Process(
        target=search, args=(name, bounds, options, args.processes, args.max_states,
                             args.rss_limit_mib, send))
    child.start()
    send.close()  # the child's end only: its death then ends `recv` instead of hanging it
    try:
        figures = receive.recv()
    except EOFError:
        child.join()
        raise RuntimeError(f"{name}: the search's process died (exit {child.exitcode})") from None
    child.join()
    row = {"variant": name, **figures}
    print(json.dumps(row), flush=True)
    return row


def only(bounds: Bounds, kinds: tuple[str, ...]) -> Bounds:
    """The bound with every fault budget 0 except `kinds`' (at the bound's budgets)."""
    budgets: dict[str, Any] = {kind: getattr(bounds, kind) if kind in kinds else 0
                               for kind in FAULT_KINDS}
    return dataclasses.replace(bounds, **budgets)


def estimate(rows: dict[str, dict[str, Any]], kinds: tuple[str, ...],
             pairs: list[tuple[str, str]]) -> dict[str, Any]:
    base = rows["base"]["distinct_states"]
    factor = {kind: rows[kind]["distinct_states"] / base for kind in kinds}
    product = base * math.prod(factor.values())
    checks = []
    for a, b in pairs:
        row = rows[f"{a}+{b}"]
        expected = base * factor[a] * factor[b]
        checks.append({"pair": f"{a}+{b}", "measured": row["distinct_states"],
                       "product": expected, "interaction": row["distinct_states"] / expected,
                       "complete": row["complete"]})
    # A capped pair's interaction is only a lower bound: the mean uses complete pairs only.
    measured = [check["interaction"] for check in checks if check["complete"]]
    pair_count = math.comb(len(kinds), 2)
    if measured:
        mean = math.exp(sum(map(math.log, measured)) / len(measured))
        low = product * min(1.0, min(measured)) ** pair_count
        central = product * mean ** pair_count
        high = product * max(1.0, max(measured)) ** pair_count
    else:
        mean, low, central, high = float("nan"), product, product, product
    inputs = ["base", *kinds, *(check["pair"] for check in checks)]
    return {
        "factors": factor,
        "pair_checks": checks,
        "pairs_in_bound": pair_count,
        "interaction_geometric_mean": mean,
        "product": product,
        "low": low,
        "central": central,
        "high": high,
        "lower_bound_only": not all(rows[name]["complete"] for name in inputs),
    }


def render(doc: dict[str, Any]) -> str:
    est = doc["estimate"]
    cost = doc["cost"]
    lines = [
        f"# Deep bound `{doc['bound']}`: estimated size",
        "",
        "Generated by `benchmarks/bench_deep_estimate.py` (do not edit).",
        "",
        f"Command: `{doc['command']}`",
        "",
        f"Every run: the bound's symmetry ({doc['symmetry']}) and reduction "
        f"({doc['reduction']}), breadth-first on {doc['processes']} processes, livelock check "
        f"off (no graph: same states, the search's own memory and time), at most "
        f"{doc['max_states']:,} states and {doc['rss_limit_mib']:.0f} MiB; a capped run's "
        "count is a lower bound.",
        "",
        "| variant | distinct | generated | depth | s | peak RSS MiB | complete | violated |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in doc["variants"]:
        done = "yes" if row["complete"] else f"no ({row['stop_reason']})"
        lines.append(f"| {row['variant']} | {row['distinct_states']:,} | "
                     f"{row['states_generated']:,} | {row['max_depth']} | "
                     f"{row['duration_s']:.0f} | {row['peak_rss_mib']:.0f} | {done} | "
                     f"{', '.join(row['violated']) or 'none'} |")
    lines += ["", "Factor of each kind alone, r_k = N_k / N0:", ""]
    lines += [f"- {kind}: {factor:.2f}" for kind, factor in est["factors"].items()]
    lines += [
        "",
        "Pairs against independence (product N0 r_a r_b; interaction = measured / product):",
        "",
        "| pair | measured | product | interaction | complete |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {c['pair']} | {c['measured']:,} | {c['product']:,.0f} | "
              f"{c['interaction']:.3f} | {'yes' if c['complete'] else 'no'} |"
              for c in est["pair_checks"]]
    bound_note = (" Some input run was capped: every figure below is a lower bound."
                  if est["lower_bound_only"] else "")
    lines += [
        "",
        f"Estimate of the full bound: N_est = N0 * prod_k r_k * I_g ** {est['pairs_in_bound']} "
        f"(I_g = {est['interaction_geometric_mean']:.3f}, the geometric mean of the complete "
        f"pairs' interactions, stands for each of the {est['pairs_in_bound']} pairs of kinds; "
        "interactions of three or more kinds are left out)." + bound_note,
        "",
        f"- plain product: {est['product']:,.0f}",
        f"- low (smallest measured interaction, at most 1, for every pair): {est['low']:,.0f}",
        f"- central: {est['central']:,.0f}",
        f"- high (largest measured interaction, at least 1, for every pair): {est['high']:,.0f}",
        "",
        f"Cost, from the largest complete run (`{cost['reference']}`): "
        f"{cost['states_per_s']:,.0f} distinct states/s on {doc['processes']} processes, "
        f"{cost['bytes_per_state']:,.0f} bytes per state at peak (resident, no livelock graph).",
        "",
        "| estimate | states | hours | GiB |",
        "|---|---|---|---|",
    ]
    lines += [f"| {which} | {est[which]:,.0f} | {cost['hours'][which]:,.1f} | "
              f"{cost['gib'][which]:,.1f} |" for which in ("low", "central", "high")]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bound", nargs="?", default="spec/deep/all_faults.toml",
                        help="a bound's TOML")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--max-states", type=int, default=4_000_000)
    parser.add_argument("--rss-limit-mib", type=float, default=4000.0)
    parser.add_argument("--pairs", nargs="*", default=list(DEFAULT_PAIRS),
                        help="pairs of fault kinds to check independence on, as a+b")
    args = parser.parse_args()
    bounds, options = load_bounds(args.bound)
    kinds = tuple(kind for kind in FAULT_KINDS if getattr(bounds, kind))
    pairs = [tuple(pair.split("+")) for pair in args.pairs]
    for pair in pairs:
        if len(pair) != 2 or not set(pair) <= set(kinds):
            parser.error(f"--pairs: {'+'.join(pair)} is not two of the bound's kinds {kinds}")
    variants = [("base", ()), *((kind, (kind,)) for kind in kinds),
                *(("+".join(pair), pair) for pair in pairs)]
    rows = {name: run_variant(name, only(bounds, chosen), options, args)
            for name, chosen in variants}
    est = estimate(rows, kinds, [(a, b) for a, b in pairs])
    complete = [row for row in rows.values() if row["complete"]]
    reference = max(complete, key=lambda row: row["distinct_states"])
    rate = reference["distinct_states"] / reference["duration_s"]
    per_state = reference["peak_rss_mib"] * 2**20 / reference["distinct_states"]
    which = ("low", "central", "high")
    command = "benchmarks/bench_deep_estimate.py " + " ".join(
        [args.bound, "--processes", str(args.processes), "--max-states", str(args.max_states),
         "--rss-limit-mib", f"{args.rss_limit_mib:.0f}", "--pairs", *args.pairs])
    doc = {
        "bound": Path(args.bound).stem,
        "command": command,
        "processes": args.processes,
        "symmetry": options.get("symmetry", True),
        "reduction": options.get("reduction", True),
        "livelock": False,
        "max_states": args.max_states,
        "rss_limit_mib": args.rss_limit_mib,
        "variants": list(rows.values()),
        "estimate": est,
        "cost": {
            "reference": reference["variant"],
            "states_per_s": rate,
            "bytes_per_state": per_state,
            "hours": {w: est[w] / rate / 3600 for w in which},
            "gib": {w: est[w] * per_state / 2**30 for w in which},
        },
    }
    out = ROOT / "reports" / "checker" / f"deep_estimate_{doc['bound']}"
    out.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    out.with_suffix(".md").write_text(render(doc))
    print(render(doc))
    # A capped run's counterexample is as real as a complete one's.
    violated = [(row["variant"], row["violated"]) for row in rows.values() if row["violated"]]
    for name, properties in violated:
        print(f"{name}: violated {', '.join(properties)}")
    return 1 if violated else 0


if __name__ == "__main__":
    raise SystemExit(main())
