"""The two-host acceptance run, and SSH-versus-local throughput (README, "Workers on other
machines").

    sudo .venv/bin/python benchmarks/twohost_acceptance.py            # acceptance + measure
    sudo .venv/bin/python benchmarks/twohost_acceptance.py --no-measure   # acceptance only
    sudo .venv/bin/python benchmarks/twohost_acceptance.py --no-acceptance  # measure only

Host A (driver and learner) trains with two rollout workers on host B over SSH (a real
OpenSSH sshd in another network namespace, `benchmarks/twohost.py`). During the run, one after
another: a remote worker is killed with kill -9; the link is silently partitioned for longer
than the keepalive timeout, then healed; host B's sshd is killed and restarted; the wire drops,
duplicates, delays and reorders packets for a while; and all along the fault layer drops and
duplicates protocol frames. Then host A's driver is killed with kill -9 (its remote workers
must go too) and the run is resumed with `invar train --resume`. It must complete,
`invar-check --trace` must pass on its journal, no request may be consumed twice, and the final
weights must equal the serial execution's bit for bit. Writes reports/twohost_acceptance.md
(and reports/ssh_benchmark.md with the measurement). `tests/runtime/test_twohost.py` runs the
acceptance part in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from twohost import TwoHosts, missing_requirements

REPO = Path(__file__).resolve().parents[1]
BASE = (
    "protocol.prompts_per_batch=4", "protocol.group_size=4", "protocol.optimizer_steps=2",
    "protocol.eval_every=0", "protocol.checkpoint_every=0", "protocol.max_staleness=1",
    "protocol.sync_period=1", "protocol.max_inflight_batches=2", "task.length=4",
    "task.heldout_prompts=8", "policy.width=32", "policy.layers=1", "output.progress=false",
    "output.tensorboard=false", "rollout.chunk_prompts=2", "rollout.workers=2",
    "output.retry_seconds=1.0",
)
"""The tiny configuration of the runtime's tests, with two workers and a 1 s retry timer."""
FRAME_FAULTS = ("rollout.frame_faults.drop=0.05", "rollout.frame_faults.duplicate=0.05",
                "rollout.frame_faults.seed=1")


def tool(name: str) -> list[str]:
    """`invar` / `invar-check` as installed beside this Python, else as modules."""
    script = Path(sys.executable).parent / name
    if script.exists():
        return [str(script)]
    module = {"invar": "invar.runtime.cli", "invar-check": "checker.cli"}[name]
    return [sys.executable, "-m", module]


def sets(items: list[str] | tuple[str, ...]) -> list[str]:
    return [word for item in items for word in ("--set", item)]


def environment() -> dict[str, str]:
    # The checked-out code, whatever the virtual environment was installed from.
    return {**os.environ, "PYTHONPATH": str(REPO)}


def incarnations(run_dir: Path) -> int:
    """Worker incarnations started so far (each has its log file)."""
    return len(list((run_dir / "logs").glob("worker-*.log")))


def committed(run_dir: Path) -> int:
    """Updates committed so far, from the journal (a torn last line ignored)."""
    try:
        lines = (run_dir / "journal.jsonl").read_text().splitlines()[1:]
    except OSError:
        return 0
    count = 0
    for line in lines:
        try:
            count += json.loads(line)["event"]["type"] == "UpdateCommitted"
        except (ValueError, KeyError):
            pass
    return count


class Timeline:
    def __init__(self, run_dir: Path, say: Callable[[str], None]) -> None:
        self.run_dir = run_dir
        self.began = time.monotonic()
        self.rows: list[tuple[float, int, str]] = []
        self.say = say

    def note(self, what: str) -> None:
        row = (time.monotonic() - self.began, committed(self.run_dir), what)
        self.rows.append(row)
        self.say(f"[{row[0]:6.1f} s, update {row[1]:3d}, incarnations "
                 f"{incarnations(self.run_dir):2d}] {what}")

    def only_current_workers(self, hosts: TwoHosts, expected: int, timeout: float = 15) -> None:
        """Wait until host B runs exactly the current workers: no orphan of an incarnation
        whose connection is gone."""
        deadline = time.monotonic() + timeout
        while len(hosts.workers_on_b()) != expected and time.monotonic() < deadline:
            time.sleep(0.1)
        running = hosts.workers_on_b()
        self.note(f"worker processes on host B: {len(running)} {running}")
        assert len(running) == expected, f"orphaned workers on host B: {running}"

    def wait_incarnations(self, target: int, process: subprocess.Popen, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while incarnations(self.run_dir) < target:
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no new worker incarnation ({target}) within {timeout} "
                                     "s")
            time.sleep(0.1)

    def wait_updates(self, target: int, process: subprocess.Popen, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while committed(self.run_dir) < target:
            if process.poll() is not None:
                raise AssertionError(f"the driver exited ({process.returncode}) at update "
                                     f"{committed(self.run_dir)}, before update {target}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no update {target} within {timeout} s (at "
                                     f"{committed(self.run_dir)})")
            time.sleep(0.1)


def acceptance(hosts: TwoHosts, workdir: Path, updates: int = 40,
               say: Callable[[str], None] = print) -> dict[str, Any]:
    """The acceptance run; raises AssertionError at the first requirement not met."""
    run_dir = workdir / "twohost-run"
    items = [*BASE, f"protocol.total_updates={updates}", *FRAME_FAULTS,
             *hosts.ssh_settings(REPO), hosts.hosts(2),
             f"output.run_dir={json.dumps(str(run_dir))}"]
    log = open(workdir / "driver.log", "ab")  # noqa: SIM115 (both lives append to it)
    t = Timeline(run_dir, say)
    driver = hosts.on_a([*tool("invar"), "train", *sets(items)], stdout=log, stderr=log,
                        env=environment())
    result: dict[str, Any] = {}
    try:
        t.note(f"driver started on host A (pid {driver.pid}); 2 workers on host B over SSH")
        t.wait_updates(2, driver, 120)
        result["listening_on_a"] = hosts.listening_on_a()
        t.note(f"listening sockets on host A: {result['listening_on_a'] or 'none'}")
        assert not result["listening_on_a"], "the driver's host listens on a socket"

        victim, started = hosts.workers_on_b()[0], incarnations(run_dir)
        os.kill(victim, signal.SIGKILL)
        t.note(f"kill -9 remote worker pid {victim} on host B")
        t.wait_incarnations(started + 1, driver, 30)
        t.wait_updates(committed(run_dir) + 2, driver, 60)
        t.note("training goes on (the worker reconnected as a new incarnation)")
        t.only_current_workers(hosts, 2)

        seen, started = _keepalive_losses(workdir), incarnations(run_dir)
        hosts.wire(down=True)
        cut = time.monotonic()
        t.note("link partitioned silently (keepalive 1 s x 3: timeout ~4 s)")
        while _keepalive_losses(workdir) == seen and time.monotonic() - cut < 15:
            time.sleep(0.05)
        result["partition_detected_seconds"] = time.monotonic() - cut
        t.note(f"driver detected the partition after {result['partition_detected_seconds']:.1f} "
               "s (\"Server not responding to keepalive\")")
        time.sleep(max(0.0, 7 - (time.monotonic() - cut)))
        hosts.wire()
        t.note("link healed after 7 s")
        t.wait_incarnations(started + 2, driver, 60)  # both workers reconnect
        t.wait_updates(committed(run_dir) + 2, driver, 90)
        t.note("training goes on after the partition")
        t.only_current_workers(hosts, 2)

        started = incarnations(run_dir)
        killed = hosts.kill_sshd()
        t.note(f"kill -9 every sshd on host B (pids {killed}): sessions and listener gone")
        time.sleep(1.0)
        hosts.start_sshd()
        t.note("sshd restarted on host B")
        t.wait_incarnations(started + 2, driver, 60)
        t.wait_updates(committed(run_dir) + 2, driver, 90)
        t.note("training goes on after the sshd restart")
        t.only_current_workers(hosts, 2)

        impaired_from = committed(run_dir)
        hosts.wire(loss=10, dup=5, delay=20, reorder=25)
        t.note("wire: 10 % loss, 5 % duplication, 20 ms delay, 25 % reordering, for 5 s")
        time.sleep(5)
        t.wait_updates(impaired_from + 2, driver, 120)  # and the run progressed through it
        hosts.wire()
        t.note("wire clean again")

        t.wait_updates(committed(run_dir) + 1, driver, 60)
        before = hosts.workers_on_b()
        driver.kill()
        driver.wait()
        t.note(f"kill -9 the driver and learner on host A (remote workers then: {before})")
        deadline = time.monotonic() + 20
        while hosts.workers_on_b() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = hosts.workers_on_b()
        t.note(f"remote workers left on host B: {left or 'none'}")
        assert not left, f"remote workers outlived their driver: {left}"
        result["stopped_at"] = committed(run_dir)

        driver = hosts.on_a([*tool("invar"), "train", "--resume", str(run_dir)], stdout=log,
                            stderr=log, env=environment())
        t.note("invar train --resume on host A")
        code = driver.wait(300)
        t.note(f"resumed run exited with {code}")
        assert code == 0, f"the resumed run failed ({code}); see {workdir / 'driver.log'}"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        log.close()

    summary = json.loads((run_dir / "summary.json").read_text())
    result["summary"] = summary
    # The first life was killed before its summary: its worker losses are in its log.
    driver_log = (workdir / "driver.log").read_text(errors="replace").splitlines()
    result["driver_log"] = [line for line in driver_log
                            if " lost: " in line or "not started: " in line]
    result["incarnations"] = incarnations(run_dir)
    trace = subprocess.run([*tool("invar-check"), "--trace", str(run_dir / "journal.jsonl")],
                           capture_output=True, text=True, env=environment(), check=False)
    result["trace"] = (trace.returncode, (trace.stdout + trace.stderr).strip())
    t.note(f"invar-check --trace: exit {trace.returncode}: {result['trace'][1][-200:]}")
    assert trace.returncode == 0, result["trace"]

    from invar.runtime import journal
    _, state, _ = journal.restore(run_dir / "journal.jsonl")
    consumed = [request for record in state.ledger for request in record.requests]
    assert [r.update for r in state.ledger] == list(range(updates))
    assert len(consumed) == len(set(consumed)), "a request was consumed twice"
    commits = [json.loads(line)["event"]["update"] for line in
               (run_dir / "journal.jsonl").read_text().splitlines()[1:]
               if json.loads(line)["event"]["type"] == "UpdateCommitted"]
    assert sorted(commits) == list(range(updates)), f"commits per update: {commits}"
    result["consumed"] = len(consumed)
    t.note(f"ledger: {updates} updates, {len(consumed)} requests, each consumed once; one "
           "UpdateCommitted per update")

    serial_dir = workdir / "serial"
    serial = subprocess.run(
        [*tool("invar"), "train", "--serial",
         *sets([*BASE, f"protocol.total_updates={updates}",
                f"output.run_dir={json.dumps(str(serial_dir))}"])],
        capture_output=True, text=True, env=environment(), check=False)
    assert serial.returncode == 0, serial.stderr
    same, detail = same_weights(run_dir, serial_dir)
    result["bitwise"] = (same, detail)
    t.note(f"final weights vs the serial execution: {'bitwise equal' if same else detail}")
    assert same, detail
    result["timeline"] = t.rows
    return result


def _keepalive_losses(workdir: Path) -> int:
    """Connections the driver has so far dropped for want of keepalive answers."""
    try:
        return (workdir / "driver.log").read_text(errors="replace").count(
            "not responding to keepalive")
    except OSError:
        return 0


def same_weights(a: Path, b: Path) -> tuple[bool, str]:
    import torch

    from invar.runtime.commits import list_commits, read_commit
    (va, pa), (vb, pb) = list_commits(a / "commits")[-1], list_commits(b / "commits")[-1]
    ma, mb = read_commit(pa)["model"], read_commit(pb)["model"]
    if va != vb or ma.keys() != mb.keys():
        return False, f"versions {va} / {vb}, tensors {sorted(ma)} / {sorted(mb)}"
    differ = [name for name in ma if not torch.equal(ma[name], mb[name])]
    return not differ, (f"version {va}: {len(ma)} tensors, all equal" if not differ
                        else f"differ: {differ}")


CONFIGURATIONS = {
    "tiny": [*BASE, "protocol.total_updates=20"],
    "default": ["protocol.total_updates=20", "rollout.workers=2", "output.progress=false",
                "output.tensorboard=false"],
}
"""What is measured: the tests' tiny configuration, and `invar train`'s default one (reverse
8 digits, 64 prompts x 8 samples, a ~106k-parameter policy) cut to 20 updates; 2 workers."""
IMPAIRED = {"loss": 2, "dup": 1, "delay": 10, "reorder": 10}


def measure(hosts: TwoHosts, workdir: Path, say: Callable[[str], None] = print
            ) -> list[tuple[str, str, dict[str, Any]]]:
    """Each configuration, driver on host A: local workers, SSH workers on a clean link, SSH
    workers on an impaired one."""
    rows = []
    ssh = [*hosts.ssh_settings(REPO), hosts.hosts(2)]
    for name, items in CONFIGURATIONS.items():
        for label, transport, impairment in (
                ("local processes (host A)", [], {}),
                ("SSH to host B, clean link", ssh, {}),
                ("SSH to host B, 2 % loss, 1 % dup, 10 ms delay, 10 % reorder", ssh,
                 IMPAIRED)):
            run_dir = workdir / f"measure-{len(rows)}"
            hosts.wire(**impairment)
            process = hosts.on_a([*tool("invar"), "train", *sets(
                [*items, *transport, f"output.run_dir={json.dumps(str(run_dir))}"])],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=environment())
            output = process.communicate(timeout=600)[0].decode()
            hosts.wire()
            assert process.returncode == 0, output
            summary = json.loads((run_dir / "summary.json").read_text())
            seconds = sorted(json.loads(line)["seconds"] for line in
                             (run_dir / "metrics.jsonl").read_text().splitlines()
                             if '"seconds"' in line)
            summary["median_update_seconds"] = seconds[len(seconds) // 2]
            rows.append((name, label, summary))
            say(f"{name}, {label}: {summary['updates_per_second']:.2f} updates/s, median "
                f"{summary['median_update_seconds']:.3f} s per update")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-measure", action="store_true", help="the acceptance run only")
    parser.add_argument("--no-acceptance", action="store_true", help="the measurement only")
    parser.add_argument("--updates", type=int, default=40, help="of the acceptance run")
    args = parser.parse_args()
    why = missing_requirements()
    if why:
        print(f"two hosts cannot be built here: {why}", file=sys.stderr)
        return 2
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)
    result: dict[str, Any] = {}
    rows: list[tuple[str, str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="invar-twohost-") as tmp:
        hosts = TwoHosts(Path(tmp) / "hosts").up()
        try:
            began = time.monotonic()
            if not args.no_acceptance:
                result = acceptance(hosts, Path(tmp), args.updates, say)
            took = time.monotonic() - began
            if not args.no_measure:
                rows = measure(hosts, Path(tmp), say=say)
        finally:
            hosts.down()
    reports = REPO / "reports"
    command = "sudo .venv/bin/python benchmarks/twohost_acceptance.py"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if result:
        write_acceptance(reports / "twohost_acceptance.md", result, lines, args.updates, took,
                         f"{command} --no-measure", when)
    if rows:
        table = ["# Rollout over SSH versus local workers", "",
                 (f"Reproduce: `{command} --no-acceptance` ({when}). Driver and learner on "
                  "host A; 2 workers, local processes on host A or on host B over SSH "
                  "(OpenSSH sshd in another network namespace, through the userspace wire; "
                  f"impaired: {json.dumps(IMPAIRED)}). Configurations: "
                  "`tiny` = the runtime tests' (4 prompts x 4 samples, 1-layer width-32 "
                  "policy), `default` = `invar train`'s (64 x 8, 2-layer width-64); 20 updates "
                  "each. One run per row on one 2-core machine shared with other jobs: both "
                  "\"hosts\" share its CPUs, so read the differences, not the absolute "
                  "figures. updates/s is over the whole run (start-up included); the median "
                  "is of the per-update wall time."), "",
                 "| configuration | workers | updates/s | median s per update | wall s |",
                 "|---|---|---|---|---|"]
        table += [f"| {name} | {label} | {s['updates_per_second']:.2f} | "
                  f"{s['median_update_seconds']:.3f} | {s['wall_seconds']:.1f} |"
                  for name, label, s in rows]
        (reports / "ssh_benchmark.md").write_text("\n".join(table) + "\n")
    return 0


def write_acceptance(path: Path, result: dict[str, Any], lines: list[str], updates: int,
                     took: float, command: str, when: str) -> None:
    summary = result["summary"]
    text = [
        "# Two-host acceptance run", "",
        (f"Reproduce: `{command}` ({when}; root: network namespaces; needs openssh-server, "
         "ethtool). CI runs the same (tests/runtime/test_twohost.py)."), "",
        ("Driver and learner on host A, two rollout workers on host B over SSH (OpenSSH sshd, "
         "another network namespace joined by veth through a userspace wire). "
         f"{updates} updates of the tiny test configuration; fault layer dropping 5 % and "
         "duplicating 5 % of protocol frames throughout; keepalive 1 s x 3; sshd with "
         f"ClientAliveInterval 1 x 3. Took {took:.0f} s."),
        "", "```", *lines[:len(result["timeline"])], "```", "",
        (f"- outcome: complete, {summary['updates']} updates over {summary.get('lives', 1)} "
         f"lives; killed at update {result['stopped_at']} and resumed; "
         f"{result['incarnations']} worker incarnations started in all"),
        "- what the driver logged about its workers (both lives):", "", "```",
        *result["driver_log"], "```", "",
        (f"- counters of the resumed life (the first was killed before writing its own): "
         f"{json.dumps(summary.get('counters', {}))}; worker deaths "
         f"{summary['worker_deaths']}, refused {summary['refused']}"),
        f"- `invar-check --trace`: exit {result['trace'][0]} ({result['trace'][1][-160:]})",
        f"- every request consumed once ({result['consumed']} requests)",
        f"- final weights vs `invar train --serial`: {result['bitwise'][1]}",
        f"- listening sockets on host A during the run: {result['listening_on_a'] or 'none'}",
    ]
    path.write_text("\n".join(text) + "\n")


if __name__ == "__main__":
    sys.exit(main())
