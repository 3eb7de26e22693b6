"""bench_async's rendering: the report assembled from the runs' figures, and written as tables
(console and Markdown), JSON and plots."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from async_measure import first_at, steady
from async_runs import ROOT, Result


def assemble(args: argparse.Namespace, results: dict[str, Result], base: dict[str, Any],
             load_start: tuple[float, ...], load_end: tuple[float, ...],
             elapsed: float) -> dict[str, Any]:
    import torch

    runs = {}
    for name, r in results.items():
        runs[name] = {
            "label": r.spec.label, "section": r.spec.section, "settings": r.spec.sets,
            "returncode": r.returncode, "stopped_early": r.stopped_early,
            "process_wall_seconds": r.process_wall,
            "driver_wall_seconds": r.summary.get("wall_seconds",
                                                 r.updates[-1]["wall"] if r.updates else None),
            "updates": len(r.updates), "steady": steady(r),
            "cpu_seconds_total": r.cpu_total,
            "cpu_seconds_per_update_total": r.cpu_total / max(len(r.updates), 1),
            "other_cpu_seconds": r.other_cpu,
            "other_cpu_share": r.other_cpu / r.process_wall if r.process_wall else None,
            "load_before": r.load_before, "load_after": r.load_after,
            "summary": {k: v for k, v in r.summary.items() if k != "counters"},
            "evaluations": r.evaluations,
            "reached": first_at(r, args.target) if r.spec.stop_at is not None else None,
            "repeat_of": r.spec.repeat_of,
            **r.extra,
        }
    # Placement: each figure is the median over the repeats; a repeat's speedup pairs it with
    # the S=0 run of the same round.
    rounds = {s: [runs[n]["steady"] for n in runs
                  if (runs[n]["repeat_of"] or n) == f"pinned_s{s}" and runs[n]["steady"]]
              for s in (0, 1, 2)}
    for s, steadies in rounds.items():
        if len(steadies) > 1:
            first = runs[f"pinned_s{s}"]
            first["steady_first_round"] = first["steady"]
            first["steady"] = {key: (statistics.median(v[key] for v in steadies)
                                     if isinstance(steadies[0][key], (int, float))
                                     and all(v[key] is not None for v in steadies)
                                     else steadies[0][key]) for key in steadies[0]}
            first["steady_rounds"] = steadies
    placement = {}
    if rounds[0]:
        for s in (0, 1, 2):
            pairs = list(zip(rounds[0], rounds[s]))
            if not pairs:
                continue
            speedups = [a["period"] / b["period"] for a, b in pairs]
            ideals = [a["ideal"] for a, _ in pairs]
            shares = [sp / ideal for sp, ideal in zip(speedups, ideals)]
            placement[f"S={s}"] = {
                "speedup": statistics.median(speedups), "ideal": statistics.median(ideals),
                "share_of_ideal": statistics.median(shares), "rounds": len(pairs),
                "speedups": speedups, "ideals": ideals, "shares": shares,
                "periods": [b["period"] for _, b in pairs],
                "other_work_max": max(runs[n]["other_cpu_share"] for n in runs
                                      if (runs[n]["repeat_of"] or n) == f"pinned_s{s}")}
    colocated = {}
    base_run = runs.get("colocated_s0_2t", {}).get("steady")
    if base_run:
        for name in ("colocated_s0_2t", "colocated_s1_2t", "colocated_s1_1t", "pinned_s0",
                     "pinned_s1", "pinned_s2"):
            st = runs.get(name, {}).get("steady")
            if st:
                colocated[name] = {"label": runs[name]["label"],
                                   "vs_colocated_sync": base_run["period"] / st["period"]}
    return {
        "mode": "quick" if args.quick else "full",
        "command": "python benchmarks/bench_async.py" + (" --quick" if args.quick else ""),
        "argv": sys.argv[1:],
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__, "platform": platform.platform(),
                    "commit": _git_head(), "modified": _git_modified()},
        "load_start": load_start, "load_end": load_end, "elapsed_seconds": elapsed,
        "base_settings": base, "target": args.target, "updates": args.updates,
        "runs": runs, "placement": placement, "colocated": colocated,
    }


def _git_head() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _git_modified() -> list[str]:
    try:  # read-only: --no-optional-locks keeps status from refreshing the index
        out = subprocess.run(["git", "--no-optional-locks", "status", "--porcelain",
                              "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
        return [line[3:] for line in out.splitlines()]
    except (OSError, subprocess.CalledProcessError):
        return []


# ---------------------------------------------------------------------------------------------
# Output


def _f(value: Any, fmt: str = ".3f", none: str = "–") -> str:
    return none if value is None else format(value, fmt)


def _pct(value: Any, digits: int = 1) -> str:
    return "–" if value is None else f"{100 * value:.{digits}f} %"


def tables(report: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]], str]]:
    """(title, header, rows, note) for every table, shared by the console and the Markdown."""
    runs = report["runs"]
    out = []
    rows = []
    for s in (0, 1, 2):
        r = runs.get(f"pinned_s{s}")
        if not r or not r["steady"]:
            continue
        st, pl = r["steady"], report["placement"].get(f"S={s}", {})
        shares = pl.get("shares") or []
        rows.append([f"S={s}", f"{r['driver_wall_seconds']:.1f}", f"{st['period']:.3f}",
                     " ".join(f"{p:.3f}" for p in pl.get("periods", [])),
                     f"{st['R']:.3f}", f"{st['T']:.3f}", f"{st['C']:.3f}",
                     _f(pl.get("speedup"), ".2f"), _f(pl.get("ideal"), ".2f"),
                     _pct(pl.get("share_of_ideal"), 0),
                     " ".join(f"{100 * x:.0f}" for x in shares) if len(shares) > 1 else "–",
                     _f(st["cpu_per_update"], ".2f"),
                     f"{pl.get('other_work_max', r['other_cpu_share']):.2f}"])
    if rows:
        rounds = report["placement"].get("S=0", {}).get("rounds", 1)
        out.append((
            "1. Disaggregated placement: worker on CPU 1, driver + learner on CPU 0, 1 thread each",
            ["", "wall s", "s/update", "each round", "R s/batch", "T s/update",
             "core+driver s/upd", "speedup", "ideal", "of ideal", "each round %", "CPU s/upd",
             "other work, cores"], rows,
            f"Medians over {rounds} interleaved rounds (S=0, 1, 2, S=0, 1, 2, ...; 'each round' "
            "lists them; a round's speedup pairs it with that round's S=0 run). "
            "s/update, R, T, core+driver and CPU s/update over the steady window "
            f"(updates {runs['pinned_s0']['steady']['window'][0]}..."
            f"{runs['pinned_s0']['steady']['window'][1]}); wall s = driver wall incl. worker "
            "start. speedup = S=0 s/update ÷ this s/update; ideal = (R+T)/max(R,T) with the "
            "S=0 run's R and T (the phases measured uncontended); target ≥ 90 % of ideal. "
            "other work = CPU seconds the machine spent outside this run's processes ÷ its "
            "wall time (0: quiet; 1: another job kept a whole core busy)."))
    rows = []
    for name in ("colocated_s0_2t", "colocated_s1_2t", "colocated_s1_1t", "pinned_s0",
                 "pinned_s1", "pinned_s2"):
        r = runs.get(name)
        if not r or not r["steady"] or name not in report["colocated"]:
            continue
        st = r["steady"]
        rows.append([r["label"], f"{st['period']:.3f}", f"{st['R']:.3f}", f"{st['T']:.3f}",
                     f"{report['colocated'][name]['vs_colocated_sync']:.2f}×",
                     _f(st["cpu_per_update"], ".2f"), f"{r['other_cpu_share']:.2f}"])
    if rows:
        out.append(("2. Colocated baseline (both cores to whichever phase runs) vs. the rest",
                    ["configuration", "s/update", "R s/batch", "T s/update",
                     "speed vs colocated sync", "CPU s/upd", "other work, cores"], rows,
                    "Speed = colocated S=0 s/update ÷ this s/update (> 1: faster than the "
                    "synchronous loop using both cores)."))
    rows = []
    for name in ("pinned_s0", "pinned_s1", "pinned_s2", "colocated_s0_2t", "colocated_s1_2t",
                 "colocated_s1_1t", "default"):
        r = runs.get(name)
        if not r or not r["steady"]:
            continue
        split = r["steady"].get("cpu_split_per_update") or {}
        rows.append([r["label"], f"{r['cpu_seconds_per_update_total']:.2f}",
                     _f(r["steady"]["cpu_per_update"], ".2f"),
                     _f(split.get("driver_main_thread"), ".3f"),
                     _f(split.get("driver_other_threads"), ".3f"),
                     _f(split.get("workers"), ".3f"),
                     _f(r["steady"]["cpu_per_update"] / r["steady"]["period"]
                        if r["steady"]["cpu_per_update"] else None, ".2f"),
                     f"{r['other_cpu_share']:.2f}"])
    if rows:
        out.append(("Resource cost: CPU seconds per update",
                    ["configuration", "whole run", "steady", "driver thread", "learner threads",
                     "worker", "cores busy", "other work, cores"], rows,
                    "whole run: getrusage of the reaped process tree ÷ updates (includes "
                    "interpreter start, torch import, worker start); steady: /proc samples over "
                    "the steady window, split into the driver's main thread (event loop: core + "
                    "driver), its other threads (learner) and the worker process; cores busy = "
                    "steady CPU s ÷ wall s per update."))
    rows = []
    for loss in ("decoupled_ppo", "behavior_ppo"):
        for s in (0, 1, 2):
            r = runs.get(f"quality_{loss}_s{s}")
            if not r:
                continue
            hit = r["reached"]
            s0 = runs.get(f"quality_{loss}_s0", {}).get("reached")
            rel = (f"{hit['version'] / s0['version']:.2f}×" if hit and s0 else "–")
            best = max((e["heldout_reward"] for e in r["evaluations"]), default=None)
            rows.append([loss, f"S={s}", str(hit["version"]) if hit else
                         f"> {r['updates']}", f"{hit['wall']:.1f}" if hit else "–", rel,
                         _f(best, ".3f")])
    if rows:
        out.append((f"3. Time to quality: first held-out greedy reward ≥ {report['target']} "
                    "(disaggregated placement)",
                    ["objective", "", "updates", "wall s", "updates vs S=0", "best eval"], rows,
                    "Evaluations every 5 updates, so updates are multiples of 5; wall s is "
                    "driver time to that evaluation (worker start-up included). One seed."))
    rows = []
    r = runs.get("default")
    if r:
        sm = r["summary"]
        rows.append(["core_and_driver_share (summary.json)",
                     _pct(sm.get("core_and_driver_share"), 2)])
        rows.append(["core + driver seconds / wall seconds",
                     f"{sm.get('core_and_driver_seconds', 0):.1f} / "
                     f"{sm.get('wall_seconds', 0):.1f}"])
        rows.append(["learner busy share", _pct(sm.get("learner_busy_share"))])
        rows.append(["rollout compute s / wall s (1 worker)",
                     f"{sm.get('rollout_compute_seconds', 0):.1f} / "
                     f"{sm.get('wall_seconds', 0):.1f}"])
        rows.append(["events journalled", str(sm.get("events"))])
        st = r["steady"]
        if st and st.get("driver_thread_share") is not None:
            rows.append(["driver main-thread CPU share of wall (steady window, unprofiled)",
                         _pct(st["driver_thread_share"], 1)])
            rows.append(["core + driver (Driver._apply) share of wall (steady window)",
                         _pct(st["core_busy"], 1)])
        rows.append(["CPU s per update (whole run)", f"{r['cpu_seconds_per_update_total']:.2f}"])
        out.append(("4. Core + driver share of wall time, default `invar train` "
                    f"({r['updates']} updates; target < 2 %)", ["", "value"], rows,
                    "core_and_driver_share counts the driver's event path: Driver._apply "
                    "(core step, state digests, journal lines kept in memory, dispatch), "
                    "Driver._accept_frame (decoding worker frames) and the dispatch of "
                    "commands held for a journal sync, plus the CPU seconds the journal's "
                    "syncing thread spends making lines' text (a worker's completions arrive "
                    "as bytes and are encoded there). The journal's and metrics' writes and "
                    "fsyncs run in that thread, off the event path. A learner "
                    "command's inputs are built, and its reply encoded for the journal, in "
                    "the learner's thread."))
    r = runs.get("default_profiled")
    if r and r.get("profile"):
        prof = r["profile"]
        total = prof["profiled_wall"] or 1.0
        rows = [[p["part"], str(p["calls"]), f"{p['seconds']:.2f}",
                 _pct(p["seconds"] / total)] for p in prof["parts"]]
        out.append((f"4b. Driver thread under cProfile ({r['updates']} updates, driver wall "
                    f"{total:.1f} s)", ["part", "calls", "seconds", "of wall"], rows,
                    "cProfile slows Python code (the core and driver) far more than torch "
                    "kernels, so these shares overstate the unprofiled ones; read them as the "
                    "split of driver time between parts."))
        rows = [[t["function"], str(t["calls"]), f"{t['tottime']:.2f}", f"{t['cumtime']:.2f}"]
                for t in prof["top_tottime"]]
        out.append(("4c. Driver thread: top package functions by own time (under cProfile)",
                    ["function", "calls", "tottime s", "cumtime s"], rows, ""))
    cross = report.get("interference")
    if cross:
        rows = []
        for phase, cpu in (("rollout", 1), ("update", 0)):
            c = cross[phase]
            rows.append([f"{phase} (CPU {cpu}, 1 thread)",
                         _f(c.get("alone", {}).get("median"), ".3f"),
                         _f(c.get("together", {}).get("median"), ".3f"),
                         _f(c.get("slowdown"), ".2f")])
        out.append(("5. Do the two CPUs slow each other? Each phase alone, then both at once "
                    "(outside the runtime)", ["phase", "alone s", "both running s", "slowdown"],
                    rows, "Median seconds per rollout batch / learner update (score + 4 × "
                    "forward, backward, AdamW step), each in its own pinned process; no driver, "
                    "no pipes. A slowdown above 1 with nothing shared but the machine is what "
                    "caps the overlap of the two phases on this VM's two vCPUs."))
    return out


def print_tables(console: Any, report: dict[str, Any]) -> None:
    from rich.table import Table
    for title, header, rows, note in tables(report):
        table = Table(title=title, title_justify="left", caption=note or None,
                      caption_justify="left")
        for index, column in enumerate(header):
            table.add_column(column, justify="left" if index == 0 else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    console.print(f"load average at start {report['load_start']}, at end {report['load_end']};"
                  f" {report['elapsed_seconds']:.0f} s in all")


def write_outputs(out: Path, report: dict[str, Any], results: dict[str, Result]) -> None:
    (out / "async_benchmark.json").write_text(json.dumps(report, indent=2, default=str))
    plots = make_plots(out, report, results)
    lines = [
        "# Asynchronous RL on this machine: placement, colocation, time to quality",
        "",
        f"Generated by `{report['command']}` ({report['mode']} mode) on {report['when']}; "
        f"{report['elapsed_seconds'] / 60:.1f} min. Machine: {report['machine']['cpus']} CPUs, "
        f"Python {report['machine']['python']}, torch {report['machine']['torch']}, commit "
        f"`{(report['machine']['commit'] or '?')[:10]}`"
        + (f" with local changes in {', '.join(report['machine']['modified'])}"
           if report['machine']['modified'] else "") + ".",
        "",
        f"Load average (1, 5, 15 min) before the first run: {_load(report['load_start'])}; "
        f"after the last: {_load(report['load_end'])}. Each run also records the CPU seconds "
        "the machine spent outside its own processes, divided by the run's wall time (\"other "
        "work, cores\": 0 on a quiet machine; a run where it exceeded 0.2 was rerun, up to "
        "twice, and the least disturbed attempt kept).",
        "",
        "Default task and policy (reverse 8 digits, 2 layers × width 64), "
        + ("16 prompts × 4 samples" if report["mode"] == "quick" else "64 prompts × 8 samples")
        + " per batch, 4 optimizer steps per update, one rollout worker. Every configuration "
        "runs as its own `invar train` process; S = max_staleness with sync_period 1 and "
        "S + 1 batches in flight.",
        "",
    ]
    for title, header, rows, note in tables(report):
        lines += [f"## {title}", "", "| " + " | ".join(header) + " |",
                  "|" + "|".join("---" for _ in header) + "|",
                  *("| " + " | ".join(row) + " |" for row in rows), ""]
        if note:
            lines += [note, ""]
    for name, caption in plots:
        lines += [f"![{caption}]({name})", ""]
    lines += reading(report)
    (out / "async_benchmark.md").write_text("\n".join(lines) + "\n")


def _load(load: Any) -> str:
    return " / ".join(f"{v:.2f}" for v in load)


def reading(report: dict[str, Any]) -> list[str]:
    """Facts computed from the figures (the interpretation lives in reports/README.md)."""
    runs, lines = report["runs"], ["## Derived figures", ""]
    s0 = runs.get("pinned_s0", {}).get("steady")
    if s0:
        overhead = s0["period"] - s0["R"] - s0["T"]
        lines.append(f"- Synchronous pinned: one update takes {s0['period']:.3f} s = R "
                     f"{s0['R']:.3f} + T {s0['T']:.3f} + {overhead:.3f} s of everything else "
                     f"(core + driver on the critical path: {s0['C']:.3f} s).")
        for s in (1, 2):
            st = runs.get(f"pinned_s{s}", {}).get("steady")
            pl = report["placement"].get(f"S={s}")
            if st and pl:
                bound = max(st["R"], st["T"] + st["C"])
                lines.append(
                    f"- S={s}: {st['period']:.3f} s/update, speedup {pl['speedup']:.2f}× of an "
                    f"ideal {pl['ideal']:.2f}× ({100 * pl['share_of_ideal']:.0f} %). In this run "
                    f"R = {st['R']:.3f} s, T = {st['T']:.3f} s (S=0: {s0['T']:.3f}), core + "
                    f"driver {st['C']:.3f} s on the learner's CPU; max(R, T + core) = "
                    f"{bound:.3f} s. Worker busy {100 * st['rollout_busy']:.0f} %, learner busy "
                    f"{100 * st['learner_busy']:.0f} % of the update period. Against a perfect "
                    f"pipeline of the S=0 phases (max(R, T) = {max(s0['R'], s0['T']):.3f} s per "
                    f"update) this run is {st['period'] / max(s0['R'], s0['T']):.2f}× slower.")
    lines.append("")
    return lines


def make_plots(out: Path, report: dict[str, Any], results: dict[str, Result]
               ) -> list[tuple[str, str]]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    runs = report["runs"]
    names = [n for n in ("pinned_s0", "pinned_s1", "pinned_s2", "colocated_s0_2t",
                         "colocated_s1_2t", "colocated_s1_1t") if runs.get(n, {}).get("steady")]
    if names:
        figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
        periods = [runs[n]["steady"]["period"] for n in names]
        Rs = [runs[n]["steady"]["R"] for n in names]
        Ts = [runs[n]["steady"]["T"] for n in names]
        Cs = [runs[n]["steady"]["C"] for n in names]
        x = range(len(names))
        left.bar([i - 0.3 for i in x], periods, 0.2, label="s / update (measured)")
        left.bar([i - 0.1 for i in x], Rs, 0.2, label="R: rollout s / batch")
        left.bar([i + 0.1 for i in x], Ts, 0.2, label="T: learner s / update")
        left.bar([i + 0.3 for i in x], Cs, 0.2, label="core + driver s / update")
        s0 = runs.get("pinned_s0", {}).get("steady")
        if s0:
            left.axhline(max(s0["R"], s0["T"]), color="grey", ls="--", lw=1,
                         label="ideal async: max(R, T) of S=0")
        left.set_xticks(list(x), [runs[n]["label"].replace(", ", "\n") for n in names],
                        fontsize=8)
        left.set_ylabel("seconds")
        left.legend(fontsize=8)
        left.set_title("Steady-state time per update")
        for n in names:
            rows = results[n].updates
            right.plot([r["wall"] for r in rows], [r["update"] + 1 for r in rows],
                       label=runs[n]["label"])
        right.set_xlabel("driver wall seconds")
        right.set_ylabel("committed updates")
        right.grid(alpha=0.3)
        right.legend(fontsize=8)
        right.set_title("Progress")
        figure.tight_layout()
        figure.savefig(out / "async_throughput.png", dpi=110)
        plt.close(figure)
        made.append(("async_throughput.png", "time per update and progress per configuration"))
    quality = [n for n in runs if runs[n]["section"] == "quality"]
    if quality:
        figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
        for n in quality:
            ev = runs[n]["evaluations"]
            style = "-" if "decoupled" in n else "--"
            left.plot([e["version"] for e in ev], [e["heldout_reward"] for e in ev], style,
                      marker="o", ms=3, label=runs[n]["label"])
            right.plot([e["wall"] for e in ev], [e["heldout_reward"] for e in ev], style,
                       marker="o", ms=3, label=runs[n]["label"])
        for axis, xlabel in ((left, "updates"), (right, "driver wall seconds")):
            axis.axhline(report["target"], color="grey", ls=":", lw=1)
            axis.set_xlabel(xlabel)
            axis.set_ylabel("held-out greedy reward")
            axis.set_ylim(0, 1.02)
            axis.grid(alpha=0.3)
            axis.legend(fontsize=8)
        figure.suptitle("Time to quality (each run stopped at the first evaluation ≥ target)")
        figure.tight_layout()
        figure.savefig(out / "async_time_to_quality.png", dpi=110)
        plt.close(figure)
        made.append(("async_time_to_quality.png", "held-out reward against updates and time"))
    prof = runs.get("default_profiled", {}).get("profile")
    if prof:
        parts = prof["parts"]
        figure, axis = plt.subplots(figsize=(8, 4.2))
        axis.barh([p["part"] for p in parts][::-1], [p["seconds"] for p in parts][::-1])
        axis.set_xlabel("seconds in the driver thread (under cProfile)")
        axis.set_title(f"Driver thread, {prof['profiled_wall']:.1f} s driver wall")
        figure.tight_layout()
        figure.savefig(out / "async_driver_profile.png", dpi=110)
        plt.close(figure)
        made.append(("async_driver_profile.png", "driver thread time by part"))
    return made
