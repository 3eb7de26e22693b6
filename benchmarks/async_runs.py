"""bench_async's orchestration: the configurations it runs, each run as its own `invar train`
process (pinned, watched through its metrics file, stopped early where the configuration says),
and the interference runs (the two phases pinned to the two CPUs, outside the runtime)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from async_measure import (
    children_cpu_seconds,
    loadavg,
    machine_busy_seconds,
    self_cpu_seconds,
    tree_cpu_seconds,
)

ROOT = Path(__file__).resolve().parents[1]
BENCHMARK = Path(__file__).with_name("bench_async.py")
"""The script whose `--phase-worker` runs one phase of the interference runs."""

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
    wall budget, as studies/use_contract.py compares arms)."""


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
    # The child writes to it until it ends, after this function returns.
    log = open(root / f"{spec.name}.log", "wb")  # noqa: SIM115
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
            [sys.executable, str(BENCHMARK), "--phase-worker", json.dumps(spec)], cwd=ROOT,
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
# The configurations


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
