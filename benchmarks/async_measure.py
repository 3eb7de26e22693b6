"""bench_async's measurement: what the machine and the benchmarked process tree spend (/proc
and getrusage readings), and the figures taken from one finished run (its steady-state window,
the first evaluation at a target, the driver thread's profile)."""

from __future__ import annotations

import os
import pstats
import resource
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from async_runs import Result

TICK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------
# /proc readings


def loadavg() -> tuple[float, float, float]:
    one, five, fifteen = Path("/proc/loadavg").read_text().split()[:3]
    return float(one), float(five), float(fifteen)


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent not idle since boot (all CPUs)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / TICK


def _stat_times(path: Path) -> tuple[int, float] | None:
    """(parent pid, utime + stime seconds) from a /proc stat file."""
    try:
        text = path.read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2:].split()
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / TICK


def tree_cpu_seconds(root: int) -> dict[str, float]:
    """CPU seconds (utime + stime) of the driver process `root`, split into its main thread
    (the asyncio loop: core + driver) and its other threads (learner, executor), and of its
    live descendants (the rollout workers, alive until the run ends)."""
    parent: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (found := _stat_times(entry / "stat")) is not None:
            parent[int(entry.name)], times[int(entry.name)] = found
    descendants, frontier = 0.0, [root]
    while frontier:
        pid = frontier.pop()
        children = [child for child, p in parent.items() if p == pid]
        descendants += sum(times.get(child, 0.0) for child in children)
        frontier.extend(children)
    main = _stat_times(Path(f"/proc/{root}/task/{root}/stat"))
    process = times.get(root, 0.0)
    main_thread = main[1] if main else 0.0
    return {"driver_main_thread": main_thread, "driver_other_threads": process - main_thread,
            "workers": descendants, "total": process + descendants}


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def self_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def wait_until_quiet(limit: float, max_wait: float, console: Any) -> tuple[float, float, float]:
    """Wait (checking each minute) until the 1-minute load is at most `limit`."""
    waited = 0.0
    load = loadavg()
    while load[0] > limit and waited < max_wait:
        console.print(f"[yellow]load average {load[0]:.2f} > {limit}: waiting 60 s "
                      f"({waited / 60:.0f}/{max_wait / 60:.0f} min)")
        time.sleep(60)
        waited += 60
        load = loadavg()
    if load[0] > limit:
        console.print(f"[red]machine still busy (load {load[0]:.2f}); measuring anyway — "
                      f"the report records it")
    return load


def foreign_cores(seconds: float = 5.0) -> float:
    """Cores' worth of CPU the machine spends while this benchmark runs nothing (sampled)."""
    busy0, self0 = machine_busy_seconds(), self_cpu_seconds()
    time.sleep(seconds)
    return (machine_busy_seconds() - busy0 - (self_cpu_seconds() - self0)) / seconds


def wait_for_idle(limit: float, max_wait: float, console: Any) -> float:
    """Wait until other work uses at most `limit` cores (5 s samples, every 15 s)."""
    began = time.perf_counter()
    while (used := foreign_cores()) > limit and time.perf_counter() - began < max_wait:
        console.print(f"[yellow]    other work uses {used:.2f} cores: waiting")
        time.sleep(10)
    return used


# ---------------------------------------------------------------------------------------------
# Figures from one run


def steady(result: Result) -> dict[str, Any]:
    """Seconds per update, R, T and core+driver per update over the steady-state window
    (from update row a to row b: the pipeline has filled and the workers have started)."""
    rows = {r["update"]: r for r in result.updates}
    if result.window is None:
        first = min(rows) if rows else 0
        last = max(rows) if rows else 0
    else:
        first, last = result.window
    n = last - first
    if n < 1:
        return {}
    inside = [rows[u] for u in range(first + 1, last + 1) if u in rows]
    period = (rows[last]["wall"] - rows[first]["wall"]) / n
    # R per batch: generation seconds ÷ batches generated in the window (with S > 0 the worker
    # finishes its last batches before the learner does, so not one per update). Samples the
    # workers generated, not replies: a re-sent request is answered from the worker's cache
    # at no generation cost. Rows recorded before workers reported it count their replies.
    generated = sum(r.get("rollout_generated", r.get("rollout_replies", 0)) for r in inside)
    batches = generated / result.samples_per_batch if generated else n
    R = sum(r.get("rollout_seconds", 0.0) for r in inside) / batches
    T = sum(r.get("learner_seconds", 0.0) for r in inside) / n
    C = sum(r.get("core_seconds", 0.0) for r in inside) / n
    out = {"window": [first, last], "period": period, "updates_per_second": 1 / period,
           "R": R, "T": T, "C": C, "ideal": (R + T) / max(R, T) if max(R, T) > 0 else None,
           "cpu_per_update": (result.cpu_window["total"] / n) if result.cpu_window else None,
           "cpu_split_per_update": ({k: v / n for k, v in result.cpu_window.items()}
                                    if result.cpu_window else None),
           # The driver's main thread (event loop: core, journal, frames) busy share of wall.
           "driver_thread_share": (result.cpu_window["driver_main_thread"] / n / period
                                   if result.cpu_window else None),
           "rollout_busy": R / period, "learner_busy": T / period, "core_busy": C / period}
    return out


def first_at(result: Result, target: float) -> dict[str, Any] | None:
    for row in result.evaluations:
        if row["heldout_reward"] >= target:
            return {"version": row["version"], "wall": row["wall"],
                    "reward": row["heldout_reward"]}
    return None


def profile_breakdown(path: Path, wall: float) -> dict[str, Any]:
    """The driver thread's time by part, from a cProfile of the driver process's main thread."""
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]

    def find(suffix: str, name: str) -> tuple[int, float, float]:
        calls, tt, ct = 0, 0.0, 0.0
        for (filename, _, function), (_, nc, t, c, _) in stats.items():
            if function == name and filename.endswith(suffix):
                calls, tt, ct = calls + nc, tt + t, max(ct, c)
        return calls, tt, ct

    # Only plain functions: cProfile's cumulative times of coroutines (which suspend) and of
    # the event loop itself are not reliable.
    parts = [
        ("Driver._apply (core + journal + dispatch)", "runtime/driver.py", "_apply"),
        ("  invar.model.core.step", "model/core.py", "step"),
        ("  state_digest (before/after)", "model/state.py", "state_digest"),
        ("  journal append", "runtime/journal.py", "append"),
        ("  Driver._dispatch", "runtime/driver.py", "_dispatch"),
        ("  Run._record_update (metrics row)", "runtime/run.py", "_record_update"),
        ("Driver._accept_frame (decode worker events)", "runtime/driver.py", "_accept_frame"),
        ("  messages.decode", "model/messages.py", "decode"),
        ("transport.decode_header (frame JSON)", "runtime/transport.py", "decode_header"),
        ("transport.encode_frame (frame JSON)", "runtime/transport.py", "encode_frame"),
        ("MetricsLog.finish (summary, report.md, plot)", "runtime/metrics.py", "finish"),
    ]
    table = []
    for label, suffix, name in parts:
        calls, _, ct = find(suffix, name)
        table.append({"part": label, "calls": calls, "seconds": ct})
    # Own time of the package's functions (and the stdlib JSON they call) in the driver
    # thread; C built-ins are left out: most of theirs is start-up imports.
    keep = ("/invar/", "/json/")
    top = []
    for (filename, line, function), (_, nc, tt, ct, _) in sorted(
            stats.items(), key=lambda kv: -kv[1][2]):
        if not any(part in filename for part in keep):
            continue
        where = function if filename == "~" else f"{Path(filename).name}:{line}({function})"
        top.append({"function": where, "calls": nc, "tottime": tt, "cumtime": ct})
        if len(top) == 15:
            break
    return {"parts": table, "top_tottime": top, "profiled_wall": wall}
