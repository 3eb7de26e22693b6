"""Asynchronous RL on this machine, measured honestly: placement, colocation, time to quality.

One invocation runs every configuration as its own `invar train` process (fresh interpreter,
its own CPU pinning) and writes `reports/async_benchmark.{md,json}` plus plots:

1. Disaggregated placement: the rollout worker pinned to one CPU, the driver + learner to the
   other, one torch thread each; S = 0 (synchronous), S = 1, S = 2 on the same updates. For each:
   steady-state seconds per update, the measured rollout time R per batch (worker generation
   seconds, reported in the reply frames) and update time T (learner busy seconds per update),
   the speedup over S = 0, the ideal (R + T) / max(R, T) and the share of it reached.
2. Colocated baseline: synchronous with both cores given to whichever phase runs (no pinning,
   2 threads each), and asynchronous runs unpinned for comparison.
3. Time to quality: updates and wall time to the first held-out greedy evaluation >= target, for
   S = 0, 1, 2 with the decoupled objective and with plain PPO on the behaviour ratio (each run
   is stopped at the first evaluation that reaches the target).
4. Core + driver share of wall time for the default `invar train` run, and a cProfile of the
   driver's thread (the learner runs in another thread and is not in that profile).

Resource cost: CPU seconds of the driver process and its workers (getrusage of the reaped
process tree, and /proc samples over the steady-state window) per update. Interference: the
machine's CPU seconds spent outside the benchmarked process tree during each run (/proc/stat),
and the load average before and after, are recorded beside every figure.

    .venv/bin/python benchmarks/bench_async.py            # full (~10 min), writes reports/
    .venv/bin/python benchmarks/bench_async.py --quick  # smoke test (~4 min), temp dir
    .venv/bin/python benchmarks/bench_async.py --only placement,colocated
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import pstats
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")
SECTIONS = ("placement", "colocated", "quality", "driver", "interference")

PINNED = {"rollout.cpus": [1], "rollout.threads": 1, "learner.cpus": [0], "learner.threads": 1}
UNPINNED_2 = {"rollout.cpus": [], "rollout.threads": 2, "learner.cpus": [], "learner.threads": 2}
UNPINNED_1 = {"rollout.cpus": [], "rollout.threads": 1, "learner.cpus": [], "learner.threads": 1}


def staleness(s: int) -> dict[str, Any]:
    """S = s with a publication every update and s + 1 batches in flight (S = 0: synchronous)."""
    return {"protocol.max_staleness": s, "protocol.sync_period": 1,
            "protocol.max_inflight_batches": s + 1}


@dataclass
class Spec:
    name: str
    section: str
    label: str
    sets: dict[str, Any]
    stop_at: float | None = None
    profile: bool = False
    repeat_of: str | None = None
    """For a repeat: the name of the configuration it repeats."""
    stop_after: float | None = None
    """Stop the run at the first update row at or past this many driver wall seconds (a fixed
    wall budget, as benchmarks/use_contract.py compares arms)."""


@dataclass
class Result:
    spec: Spec
    returncode: int
    process_wall: float
    summary: dict[str, Any]
    updates: list[dict[str, Any]]
    evaluations: list[dict[str, Any]]
    cpu_total: float
    cpu_window: dict[str, float] | None
    window: tuple[int, int] | None
    other_cpu: float
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    stopped_early: bool
    samples_per_batch: int
    extra: dict[str, Any] = field(default_factory=dict)


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
# Running one configuration


def command_line(spec: Spec, run_dir: Path, base: dict[str, Any]) -> list[str]:
    settings = {**base, **spec.sets, "output.run_dir": str(run_dir)}
    args = [sys.executable]
    if spec.profile:
        args += ["-m", "cProfile", "-o", str(run_dir.parent / f"{spec.name}.prof")]
    args += ["-m", "invar.runtime.cli", "train"]
    for key, value in settings.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    return args


def read_rows(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON lines appended to `path` since `offset`."""
    try:
        with open(path, "rb") as stream:
            stream.seek(offset)
            data = stream.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    rows = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
    return rows, offset + end


def run(spec: Spec, root: Path, base: dict[str, Any], total: int, window_start: int) -> Result:
    run_dir = root / spec.name
    args = command_line(spec, run_dir, base)
    settings = {**base, **spec.sets}
    log = open(root / f"{spec.name}.log", "wb")
    load_before = loadavg()
    busy0, children0, self0 = machine_busy_seconds(), children_cpu_seconds(), self_cpu_seconds()
    began = time.perf_counter()
    # SIGINT back to its default in the child: a benchmark started in the background (`cmd &`
    # from a script) inherits it ignored, and the early stop below relies on it.
    process = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    updates: list[dict[str, Any]] = []
    evaluations: list[dict[str, Any]] = []
    offset, stopped, cpu_marks = 0, 0.0, {}
    metrics = run_dir / "metrics.jsonl"
    while True:
        done = process.poll() is not None
        rows, offset = read_rows(metrics, offset)
        for row in rows:
            kind = row.pop("kind", None)
            if kind == "update":
                updates.append(row)
                if spec.stop_after is not None and row["wall"] >= spec.stop_after \
                        and not stopped and not done:
                    stopped = time.perf_counter()
                    process.send_signal(signal.SIGINT)
                if row["update"] in (window_start, total - 1) and not done:
                    cpu_marks[row["update"]] = tree_cpu_seconds(process.pid)
            elif kind == "evaluation":
                evaluations.append(row)
                if spec.stop_at is not None and row["heldout_reward"] >= spec.stop_at \
                        and not stopped and not done:
                    # asyncio.run turns SIGINT into a cancellation: the driver closes its
                    # workers in its `finally` and exits.
                    stopped = time.perf_counter()
                    process.send_signal(signal.SIGINT)
        if done:
            break
        if stopped and time.perf_counter() - stopped > 20:
            process.terminate()  # its workers exit at the end of their stdin
        if stopped and time.perf_counter() - stopped > 40:
            process.kill()
        time.sleep(0.05)
    wall = time.perf_counter() - began
    log.close()
    busy1, children1, self1 = machine_busy_seconds(), children_cpu_seconds(), self_cpu_seconds()
    cpu_total = children1 - children0
    other = (busy1 - busy0) - cpu_total - (self1 - self0)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    window = None
    cpu_window = None
    if window_start in cpu_marks and total - 1 in cpu_marks:
        window = (window_start, total - 1)
        cpu_window = {key: cpu_marks[total - 1][key] - cpu_marks[window_start][key]
                      for key in cpu_marks[total - 1]}
    if process.returncode != 0 and not stopped:
        tail = (root / f"{spec.name}.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{spec.name} failed (exit {process.returncode}):\n{tail}")
    return Result(spec, process.returncode, wall, summary, updates, evaluations, cpu_total,
                  cpu_window, window, other, load_before, loadavg(), bool(stopped),
                  settings["protocol.prompts_per_batch"] * settings["protocol.group_size"])


# ---------------------------------------------------------------------------------------------
# Interference between the two CPUs: the phases alone and together, outside the runtime


def phase_worker(raw: str) -> None:
    """One pinned process looping one phase (a rollout batch, or a learner update: score +
    K × forward/backward/step) during given wall-clock windows; prints iteration times."""
    spec = json.loads(raw)
    os.sched_setaffinity(0, [spec["cpu"]])
    import numpy as np
    import torch

    from invar.runtime.policy import PolicyConfig
    from invar.runtime.sampler import generate
    from invar.runtime.task import DigitReversal
    from invar.runtime.torch_learner import OptimConfig, TorchLearner
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    task = DigitReversal(8)
    commits = tempfile.TemporaryDirectory(prefix="invar-bench-phase-")
    learner = TorchLearner(PolicyConfig(), OptimConfig(), seed=0, commit_dir=commits.name)
    learner.start()
    prompts = np.repeat(task.prompts("train", range(spec["prompts"])), spec["samples"], axis=0)
    rows = len(prompts)
    tokens = torch.as_tensor(prompts)
    seeds = list(range(rows))
    sequences = np.concatenate(
        [prompts, generate(learner.model, tokens, task.response_length, seeds)[0].numpy()], axis=1)
    plan = np.array_split(np.arange(rows), 4)
    count = [0]

    def rollout() -> None:
        generate(learner.model, tokens, task.response_length, seeds)

    def update() -> None:
        learner.score(sequences, task.prompt_length, False)
        for step, part in enumerate(plan):
            digest, logprobs = learner.forward(count[0], step, step, sequences[part],
                                               task.prompt_length)
            learner.apply_cotangent(count[0], step, step, digest,
                                    np.full_like(logprobs, -1.0 / rows))
        count[0] += 1

    work = rollout if spec["phase"] == "rollout" else update
    work()  # warm-up
    times: dict[str, list[float]] = {}
    for label, start, end in spec["windows"]:
        while time.time() < start:
            time.sleep(0.005)
        while time.time() < end:
            began = time.perf_counter()
            work()
            if time.time() <= end + 0.05:
                times.setdefault(label, []).append(time.perf_counter() - began)
    commits.cleanup()
    print(json.dumps(times))


def interference(args: argparse.Namespace, base: dict[str, Any]) -> dict[str, Any]:
    """Rollout pinned to CPU 1 and update pinned to CPU 0, each alone, then both at once."""
    span = 3.0 if args.quick else 8.0
    t0 = time.time() + 15.0  # both processes have imported torch and warmed up by then
    windows = {"update": [("alone", t0, t0 + span), ("together", t0 + 2 * span, t0 + 3 * span)],
               "rollout": [("alone", t0 + span, t0 + 2 * span),
                           ("together", t0 + 2 * span, t0 + 3 * span)]}
    processes = {}
    for phase, cpu in (("update", 0), ("rollout", 1)):
        spec = {"phase": phase, "cpu": cpu, "windows": windows[phase],
                "prompts": base["protocol.prompts_per_batch"],
                "samples": base["protocol.group_size"]}
        processes[phase] = subprocess.Popen(
            [sys.executable, __file__, "--phase-worker", json.dumps(spec)], cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    busy0, self0 = machine_busy_seconds(), self_cpu_seconds()
    children0 = children_cpu_seconds()
    out: dict[str, Any] = {}
    for phase, process in processes.items():
        stdout, stderr = process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"phase worker {phase} failed:\n{stderr[-2000:]}")
        times = json.loads(stdout.strip().splitlines()[-1])
        out[phase] = {label: {"median": statistics.median(v), "n": len(v)}
                      for label, v in times.items() if v}
    used = (machine_busy_seconds() - busy0 - (children_cpu_seconds() - children0)
            - (self_cpu_seconds() - self0))
    out["other_cpu_seconds"] = used
    for phase in ("rollout", "update"):
        alone, together = out[phase].get("alone"), out[phase].get("together")
        if alone and together:
            out[phase]["slowdown"] = together["median"] / alone["median"]
    return out


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
    # R per batch: generation seconds ÷ batches whose replies arrived in the window (with S > 0
    # the worker finishes its last batches before the learner does, so not one per update).
    replies = sum(r.get("rollout_replies", 0) for r in inside)
    batches = replies / result.samples_per_batch if replies else n
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
        ("    learner_inputs (token rows)", "runtime/driver.py", "learner_inputs"),
        ("  Driver._record_update (metrics row)", "runtime/driver.py", "_record_update"),
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


# ---------------------------------------------------------------------------------------------
# The benchmark


def build_specs(args: argparse.Namespace) -> list[Spec]:
    specs: list[Spec] = []
    if "placement" in args.only:
        # Repeats interleaved (S=0, 1, 2, S=0, 1, 2, ...): a drift in the machine's speed hits
        # every S alike, and each speedup pairs runs made a few seconds apart.
        for k in range(args.repeats):
            for s in (0, 1, 2):
                specs.append(Spec(f"pinned_s{s}" + (f"_r{k}" if k else ""), "placement",
                                  f"pinned, S={s}", {**PINNED, **staleness(s)},
                                  repeat_of=f"pinned_s{s}" if k else None))
    if "colocated" in args.only:
        specs.append(Spec("colocated_s0_2t", "colocated", "unpinned, S=0, 2+2 threads",
                          {**UNPINNED_2, **staleness(0)}))
        specs.append(Spec("colocated_s1_2t", "colocated", "unpinned, S=1, 2+2 threads",
                          {**UNPINNED_2, **staleness(1)}))
        specs.append(Spec("colocated_s1_1t", "colocated", "unpinned, S=1, 1+1 threads",
                          {**UNPINNED_1, **staleness(1)}))
    if "quality" in args.only:
        for loss in ("decoupled_ppo", "behavior_ppo"):
            for s in (0, 1, 2):
                specs.append(Spec(
                    f"quality_{loss}_s{s}", "quality", f"{loss}, S={s}",
                    {**PINNED, **staleness(s), "protocol.objective.loss": loss,
                     "protocol.total_updates": args.quality_updates,
                     "protocol.eval_every": args.eval_every,
                     "task.heldout_prompts": args.heldout},
                    stop_at=args.target))
    if "driver" in args.only:
        default = {"output.tensorboard": True, "protocol.eval_every": 20,
                   "protocol.checkpoint_every": 40,
                   "protocol.total_updates": args.default_updates}
        specs.append(Spec("default", "driver", "default `invar train`", default))
        specs.append(Spec("default_profiled", "driver", "default, under cProfile",
                          {**default, "protocol.total_updates": args.profile_updates},
                          profile=True))
    return specs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="few updates, small batches: checks the script, measures nothing")
    parser.add_argument("--out", type=Path, help="report folder (default: reports/, or a "
                        "temporary folder with --quick)")
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help=f"comma-separated sections: {','.join(SECTIONS)}")
    parser.add_argument("--updates", type=int, help="updates per throughput run (default 30)")
    parser.add_argument("--repeats", type=int, help="rounds of the placement runs (default 3; "
                        "1 with --quick)")
    parser.add_argument("--target", type=float, help="held-out greedy reward (default 0.8)")
    parser.add_argument("--quality-updates", type=int, help="cap on updates per time-to-quality "
                        "run (default 150)")
    parser.add_argument("--max-load", type=float, default=1.5,
                        help="wait until the 1-minute load average is at most this")
    parser.add_argument("--max-wait", type=float, default=900, help="seconds to wait for it")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for a quiet machine")
    parser.add_argument("--keep-runs", action="store_true", help="keep the run directories")
    parser.add_argument("--busy-share", type=float, default=0.2,
                        help="rerun a configuration when other work took more than this many "
                             "cores on average during it (full mode)")
    parser.add_argument("--retries", type=int, default=2, help="reruns per configuration")
    parser.add_argument("--retry-wait", type=float, default=300,
                        help="seconds to wait for idle CPUs before a rerun")
    parser.add_argument("--phase-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase_worker:
        phase_worker(args.phase_worker)
        return 0
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(args.only) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    q = args.quick
    args.updates = args.updates or (6 if q else 30)
    args.repeats = args.repeats or (1 if q else 3)
    args.target = args.target if args.target is not None else (0.2 if q else 0.8)
    args.quality_updates = args.quality_updates or (10 if q else 150)
    args.eval_every = 5
    args.heldout = 64 if q else 256
    args.default_updates = 8 if q else 120
    args.profile_updates = 6 if q else 40
    out = args.out or (Path(tempfile.mkdtemp(prefix="invar-bench-quick-")) if q
                       else ROOT / "reports")
    out.mkdir(parents=True, exist_ok=True)

    from rich.console import Console
    console = Console(width=150)
    load_start = loadavg() if (q or args.no_wait) else wait_until_quiet(
        args.max_load, args.max_wait, console)
    # Every run: no progress bar, no TensorBoard (the default run turns it back on), no
    # checkpoints, evaluation only where a section asks for it.
    base: dict[str, Any] = {"output.progress": False, "output.tensorboard": False,
                            "protocol.total_updates": args.updates, "protocol.eval_every": 0,
                            "protocol.checkpoint_every": 0, "protocol.prompts_per_batch": 64,
                            "protocol.group_size": 8}
    if q:
        base.update({"protocol.prompts_per_batch": 16, "protocol.group_size": 4})
    specs = build_specs(args)
    root = Path(tempfile.mkdtemp(prefix="invar-bench-runs-"))
    console.print(f"[bold]bench_async[/] {'quick' if q else 'full'}: {len(specs)} runs, "
                  f"load {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}; "
                  f"runs in {root}")
    results: dict[str, Result] = {}
    started = time.perf_counter()
    try:
        for spec in specs:
            total = spec.sets.get("protocol.total_updates", base["protocol.total_updates"])
            window_start = max(2, total // 5)
            console.print(f"  {spec.name:<28} ...", end="")
            result = run(spec, root, base, total, window_start)
            attempts = [result.other_cpu / result.process_wall]
            while not q and attempts[-1] > args.busy_share and len(attempts) <= args.retries:
                console.print(f" other work took {attempts[-1]:.2f} cores: rerun")
                shutil.rmtree(root / spec.name, ignore_errors=True)
                wait_for_idle(args.busy_share / 2, args.retry_wait, console)
                console.print(f"  {spec.name:<28} ...", end="")
                again = run(spec, root, base, total, window_start)
                attempts.append(again.other_cpu / again.process_wall)
                if spec.profile or attempts[-1] < min(attempts[:-1]):
                    result = again
            result.extra["interference_attempts"] = attempts
            if spec.profile:
                result.extra["profile"] = profile_breakdown(root / f"{spec.name}.prof",
                                                            result.summary.get("wall_seconds",
                                                                               0.0))
            results[spec.name] = result
            console.print(f" {result.process_wall:6.1f} s  (other work "
                          f"{result.other_cpu / result.process_wall:4.2f} cores, load "
                          f"{result.load_after[0]:.2f})")
    finally:
        if not args.keep_runs:
            shutil.rmtree(root, ignore_errors=True)
    cross = None
    if "interference" in args.only:
        console.print(f"  {'interference':<28} ...", end="")
        began = time.perf_counter()
        cross = interference(args, base)
        console.print(f" {time.perf_counter() - began:6.1f} s")
    elapsed = time.perf_counter() - started
    report = assemble(args, results, base, load_start, loadavg(), elapsed)
    report["interference"] = cross
    print_tables(console, report)
    write_outputs(out, report, results)
    console.print(f"[bold]wrote[/] {out / 'async_benchmark.md'}, {out / 'async_benchmark.json'}")
    return 0


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
                    "core_and_driver_share counts Driver._apply (core step, state digests, "
                    "journal, dispatch); decoding worker frames is not in it (see the "
                    "profile)."))
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


if __name__ == "__main__":
    sys.exit(main())
