"""TLC beside invar-check on two-phase commit: the same spec, the same resource managers.

    .venv/bin/python benchmarks/bench_tlc.py --tla2tools /work/tlc/tla2tools.jar --rms 7 8 9
    ... --workers 1 2 --processes 1 2      # TLC with 1 worker beside invar with 1 process, then 2/2

TLC checks checker/examples/TwoPhase.tla (Gray & Lamport's TwoPhase) with a cfg written per
RM count (RM = {r1, ..., rN}, SPECIFICATION TPSpec, INVARIANT TCConsistent); invar-check checks
the readable Python model that mirrors it (`checker.examples.two_phase_readable`, ``rms=N``),
whose one invariant is ``consistent``, TCConsistent.  Both check deadlock (TLC by default,
invar-check by default) and neither finds one: after the TM decides, every RM can always
receive the decision again.  invar-check also checks two `sometimes` properties (all
committed, all aborted); each is dropped from the search once a state satisfies it, early.

Each run is one process started from here, one after the other (TLC first): `java
-XX:+UseParallelGC -cp tla2tools.jar tlc2.TLC -workers W ...` and `python -m checker.cli
--model ... --processes P --quiet --json ...`.  Per run: wall time; CPU time (user + system of
that process and the children it waited for, from `os.wait4`: JVM's compiler and collector
threads included); peak memory, as the process's own peak resident set (`ru_maxrss`) and as
the peak of the proportional set sizes (PSS) of the process and its live descendants summed,
sampled every 0.2 s (they differ for invar's forked workers, which share pages); the CPU time
the rest of the machine used during the run (/proc/stat), which says how quiet it was;
distinct and generated states, depth (TLC counts the initial state as depth 1, invar-check as
0) and states per second of wall time.
The distinct and generated counts must be equal between the two (exit status 1 otherwise).

Writes reports/checker/tlc_two_phase.json and .md: the rows, the commands, TLC's version
line, Java's version and the machine (CPU, cores, memory, load average before and after,
and --note).  The benchmark cannot make the machine quiet: the others' CPU of each row says how
quiet it was, --note what the reader should know besides.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "checker" / "examples" / "TwoPhase.tla"
MODEL = "checker.examples.two_phase_readable:TwoPhaseReadable"
REPORT = ROOT / "reports" / "checker" / "tlc_two_phase"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    """One checker's run on one RM count."""

    checker: str  # "TLC" or "invar-check"
    rms: int
    parallelism: int  # TLC's -workers, invar-check's --processes
    command: str
    wall_s: float
    cpu_s: float
    max_rss_mb: float  # the process's own peak resident set (ru_maxrss)
    tree_pss_mb: float  # peak of the process and its descendants' proportional sets, summed
    others_cpu_s: float  # CPU time the rest of the machine used meanwhile
    distinct: int
    generated: int
    depth: int  # as the checker reports it
    verdict: str

    @property
    def distinct_per_s(self) -> float:
        return self.distinct / self.wall_s

    @property
    def generated_per_s(self) -> float:
        return self.generated / self.wall_s


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += map(int, Path(f"/proc/{p}/task/{task}/children").read_text().split())
        except OSError:
            continue
    return found


def _tree_pss_kb(pid: int) -> int:
    """The process tree's proportional set size: a page shared by k processes (forked workers)
    counts 1/k in each, so the sum is the memory the tree holds."""
    total = 0
    for p in _descendants(pid):
        try:
            rollup = Path(f"/proc/{p}/smaps_rollup").read_text()
        except OSError:
            continue
        pss = re.search(r"^Pss:\s+(\d+) kB", rollup, re.MULTILINE)
        total += int(pss[1]) if pss else 0
    return total


def _machine_cpu_s() -> float:
    """CPU seconds the whole machine has been busy (every core, /proc/stat), for what other
    processes took during a run."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def timed(argv: list[str], cwd: Path,
          log: Path) -> tuple[float, float, float, float, float, int]:
    """Run `argv` to its end: (wall s, CPU s, own peak RSS MB, process tree's peak PSS MB,
    the other processes' CPU s meanwhile, exit status); its output goes to `log`."""
    peak = [0]
    with log.open("wb") as out:
        busy0 = _machine_cpu_s()
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.2):
                peak[0] = max(peak[0], _tree_pss_kb(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        busy = _machine_cpu_s() - busy0
        done.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss / 1024, peak[0] / 1024, max(busy - cpu, 0.0), \
        proc.returncode


def tlc_cfg(rms: int) -> str:
    members = ", ".join(f"r{i}" for i in range(1, rms + 1))
    return f"CONSTANT RM = {{{members}}}\nSPECIFICATION TPSpec\nINVARIANT TCConsistent\n"


def _shown(argv: list[str], work: Path) -> str:
    """The command as run, its temporary folder written TMP."""
    return shlex.join(argv).replace(str(work), "TMP")


def run_tlc(java: str, jar: Path, rms: int, workers: int, work: Path) -> Run:
    (work / "TwoPhase.tla").write_text(SPEC.read_text())
    cfg = f"TwoPhase_{rms}.cfg"
    (work / cfg).write_text(tlc_cfg(rms))
    argv = [java, "-XX:+UseParallelGC", "-cp", str(jar), "tlc2.TLC", "-workers", str(workers),
            "-metadir", str(work / f"states_{rms}_{workers}"), "-config", cfg, "TwoPhase"]
    log = work / f"tlc_{rms}_{workers}.log"
    wall, cpu, rss, tree, others, status = timed(argv, work, log)
    text = log.read_text()
    counts = re.search(r"([\d,]+) states generated, ([\d,]+) distinct states found, "
                       r"0 states left on queue", text)
    depth = re.search(r"depth of the complete state graph search is (\d+)", text)
    if status != 0 or not counts or not depth:
        sys.exit(f"TLC failed (exit {status}), its output:\n{text[-3000:]}")
    verdict = "no error" if "No error has been found" in text else "error"
    return Run("TLC", rms, workers, _shown(argv, work), wall, cpu, rss, tree, others,
               int(counts[2].replace(",", "")), int(counts[1].replace(",", "")), int(depth[1]),
               verdict)


def run_invar(rms: int, processes: int, work: Path) -> Run:
    out = work / f"invar_{rms}_{processes}.json"
    argv = [sys.executable, "-m", "checker.cli", "--model", MODEL, "--arg", f"rms={rms}",
            "--processes", str(processes), "--quiet", "--json", str(out)]
    wall, cpu, rss, tree, others, status = timed(argv, ROOT,
                                                 work / f"invar_{rms}_{processes}.log")
    if status != 0:
        sys.exit(f"invar-check failed (exit {status}): "
                 f"{(work / f'invar_{rms}_{processes}.log').read_text()[-3000:]}")
    doc = json.loads(out.read_text())
    verdict = ", ".join(f"{n} {v}" for n, v in doc["properties"].items())
    return Run("invar-check", rms, processes, _shown(argv, work), wall, cpu, rss, tree, others,
               doc["distinct_states"], doc["states_generated"], doc["max_depth"], verdict)


def java_version(java: str) -> str:
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    return " / ".join(line.strip() for line in out.stderr.splitlines()[:2])


def machine() -> dict[str, object]:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = re.search(r"model name\s*:\s*(.+)", cpuinfo)
    mem = re.search(r"MemTotal:\s*(\d+) kB", Path("/proc/meminfo").read_text())
    return {"cpu": model[1] if model else platform.processor(), "cpus": os.cpu_count(),
            "memory_gb": round(int(mem[1]) / 2**20, 1) if mem else None,
            "python": platform.python_version()}


def markdown(doc: dict) -> str:
    m = doc["machine"]
    lines = [
        "# TLC beside invar-check: two-phase commit (TwoPhase), measured side by side",
        "",
        f"Generated by `benchmarks/bench_tlc.py` on {doc['date']} (do not edit by hand):",
        "",
        f"    {doc['command']}",
        "",
        f"TLC: {doc['tlc_version']} (`{doc['tla2tools']}`); Java: {doc['java_version']}.  "
        f"Machine: {m['cpu']}, {m['cpus']} CPUs, {m['memory_gb']} GB; Python {m['python']}; "
        f"load average {doc['load_before']:.2f} before, {doc['load_after']:.2f} after.",
    ]
    if doc["note"]:
        lines += ["", doc["note"]]
    lines += [
        "",
        "One run per row, each its own process, one after the other; wall and CPU seconds "
        "(CPU: the process and what it waited for, the JVM's compiler and collector threads "
        "included); peak RSS: the process's own (for invar-check's workers: the largest one's); "
        "tree PSS: the peak of the process tree's proportional set sizes summed (a page its "
        "forked workers share counted once; sampled every 0.2 s); others' CPU: what the rest of "
        "the machine used meanwhile (0 on a quiet machine); states per second of wall time.  "
        "Depth as each reports it (TLC counts the initial state as 1).",
        "",
        f"TLC's memory is the JVM's default sizing, which TLC reports as: "
        f"\"{doc.get('tlc_memory', '?')}\".",
        "",
        "| RMs | checker | workers | wall s | CPU s | others' CPU s | peak RSS MB | tree PSS MB "
        "| distinct | generated | depth | distinct/s | generated/s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["runs"]:
        lines.append(
            f"| {r['rms']} | {r['checker']} | {r['parallelism']} | {r['wall_s']:.1f} "
            f"| {r['cpu_s']:.1f} | {r['others_cpu_s']:.1f} | {r['max_rss_mb']:,.0f} "
            f"| {r['tree_pss_mb']:,.0f} "
            f"| {r['distinct']:,} | {r['generated']:,} | {r['depth']} "
            f"| {r['distinct_per_s']:,.0f} | {r['generated_per_s']:,.0f} |")
    lines += ["", "TLC / invar-check, the same RMs and parallelism (above 1: invar-check is "
              "faster or smaller):", "",
              "| RMs | workers | wall | CPU | peak RSS | tree PSS |",
              "|---:|---:|---:|---:|---:|---:|"]
    for tlc, invar in pairs(doc["runs"]):
        lines.append(
            f"| {tlc['rms']} | {tlc['parallelism']} | {tlc['wall_s'] / invar['wall_s']:.2f} "
            f"| {tlc['cpu_s'] / invar['cpu_s']:.2f} "
            f"| {tlc['max_rss_mb'] / invar['max_rss_mb']:.2f} "
            f"| {tlc['tree_pss_mb'] / invar['tree_pss_mb']:.2f} |")
    lines += ["", "Each run's command:", ""]
    lines += [f"    {r['command']}" for r in doc["runs"]]
    lines += ["", "TLC checks `TCConsistent` and deadlock on checker/examples/TwoPhase.tla with "
              "`CONSTANT RM = {r1, ..., rN}`; invar-check checks the readable model's "
              "`consistent`, deadlock and its two `sometimes` properties (verdicts: "
              f"{doc['runs'][-1]['verdict'] if doc['runs'] else ''}).", ""]
    return "\n".join(lines)


def pairs(runs: list[dict]) -> list[tuple[dict, dict]]:
    """(TLC, invar-check) runs of the same RM count and parallelism."""
    tlc = {(r["rms"], r["parallelism"]): r for r in runs if r["checker"] == "TLC"}
    return [(tlc[r["rms"], r["parallelism"]], r) for r in runs
            if r["checker"] == "invar-check" and (r["rms"], r["parallelism"]) in tlc]


def write_report(out: Path, doc: dict, runs: list[Run], mismatch: bool) -> None:
    doc["load_after"] = os.getloadavg()[0]
    doc["runs"] = [asdict(r) | {"distinct_per_s": round(r.distinct_per_s),
                                "generated_per_s": round(r.generated_per_s)} for r in runs]
    doc["counts_equal"] = not mismatch
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(doc))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tla2tools", type=Path, required=True, help="TLC's tla2tools.jar")
    parser.add_argument("--java", default="java")
    parser.add_argument("--rms", type=int, nargs="+", default=[8, 9], help="RM counts")
    parser.add_argument("--workers", type=int, nargs="+", default=[1],
                        help="TLC workers, one row each, paired with --processes")
    parser.add_argument("--processes", type=int, nargs="+", default=[1],
                        help="invar-check processes, as many as --workers")
    parser.add_argument("--note", default="", help="what else ran, anything the reader needs")
    parser.add_argument("--out", type=Path, default=REPORT,
                        help="report path without extension (.json and .md are written)")
    args = parser.parse_args(argv)
    if len(args.workers) != len(args.processes):
        parser.error("--workers and --processes pair up: give as many of each")
    if not args.tla2tools.is_file():
        parser.error(f"no {args.tla2tools}")
    jar = args.tla2tools.resolve()
    doc: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": shlex.join(["python", "benchmarks/bench_tlc.py", *sys.argv[1:]]
                              if argv is None else ["python", "benchmarks/bench_tlc.py", *argv]),
        "tla2tools": str(jar),
        "java_version": java_version(args.java), "machine": machine(), "note": args.note,
        "load_before": os.getloadavg()[0],
    }
    runs: list[Run] = []
    mismatch = False
    with tempfile.TemporaryDirectory(prefix="bench_tlc_") as tmp:
        for rms in args.rms:
            for workers, processes in zip(args.workers, args.processes, strict=True):
                tlc = run_tlc(args.java, jar, rms, workers, Path(tmp))
                if "tlc_version" not in doc:  # TLC's first line: "TLC2 Version ... (rev: ...)"
                    log = Path(tmp, f"tlc_{rms}_{workers}.log").read_text()
                    doc["tlc_version"] = log.splitlines()[0].strip()
                    memory = re.search(r"^Running .* with (\d+ workers? on .*)$", log,
                                       re.MULTILINE)
                    doc["tlc_memory"] = memory[1] if memory else "?"
                invar = run_invar(rms, processes, Path(tmp))
                for r in (tlc, invar):
                    runs.append(r)
                    print(f"R={r.rms} {r.checker:>11} x{r.parallelism}: {r.wall_s:7.1f} s wall "
                          f"{r.cpu_s:7.1f} s CPU ({r.others_cpu_s:.1f} others) "
                          f"{r.max_rss_mb:7,.0f} MB ({r.tree_pss_mb:,.0f} MB tree PSS) "
                          f"{r.distinct:,} distinct {r.generated:,} generated depth "
                          f"{r.depth} {r.distinct_per_s:,.0f} distinct/s", flush=True)
                if (tlc.distinct, tlc.generated) != (invar.distinct, invar.generated):
                    print(f"MISMATCH at R={rms}: TLC {tlc.distinct:,} distinct {tlc.generated:,} "
                          f"generated, invar-check {invar.distinct:,} / {invar.generated:,}")
                    mismatch = True
                # written after every pair: a run stopped early keeps the rows it finished
                write_report(args.out, doc, runs, mismatch)
    print(f"wrote {args.out.with_suffix('.json')} and .md")
    return 1 if mismatch else 0


if __name__ == "__main__":
    raise SystemExit(main())
