"""SIGINT and SIGTERM stop a run cleanly: Ctrl-C on a real (pseudo-)terminal, SIGTERM to a
piped run. The driver ends its workers and verifier processes, syncs its journal, prints one
line naming the update it stopped at and how to resume, and exits 130 / 143 without a
traceback; the run then resumes to its end."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import time
from pathlib import Path

from invar.runtime import journal

UPDATES = 40
STOP_AFTER_COMMITS = 3
STOPPING = ("invar: stopping: ending the update in progress and the workers (interrupt again "
            "to stop at once; the run stays resumable)")
NOISE = ("Traceback", "KeyboardInterrupt", "CancelledError", "Exception ignored")


def _descendants(pid: int) -> set[int]:
    """The processes below `pid` now (its workers and their verifier processes)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _assert_all_gone(pids: set[int]) -> None:
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if _alive(pid)], "child processes outlived the run"


def _stopped_line(text: str, run_dir: Path) -> int:
    """The update the one `interrupted at` line names (checked against the message)."""
    lines = [line for line in text.splitlines() if "interrupted at update" in line]
    assert len(lines) == 1, text
    found = re.fullmatch(rf"invar: interrupted at update (\d+) of {UPDATES}; resume with: "
                         rf"invar train --resume {re.escape(str(run_dir))}; its report so "
                         rf"far: invar report {re.escape(str(run_dir))}", lines[0].strip())
    assert found, lines[0]
    return int(found.group(1))


def _journal_committed(run_dir: Path) -> int:
    _, state, _ = journal.restore(run_dir / "journal.jsonl")
    return state.committed


def _resume_to_the_end(rt, run_dir: Path) -> None:
    resumed = subprocess.run(rt.cli("train", "--resume", str(run_dir)), capture_output=True,
                             text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    assert rt.summary(run_dir)["updates"] == UPDATES


def test_ctrl_c_on_a_terminal_stops_cleanly_and_the_run_resumes(tmp_path, rt):
    run_dir = tmp_path / "run"
    overrides = rt.tiny_overrides(run_dir, f"protocol.total_updates={UPDATES}",
                                  "output.progress=true")
    command = rt.cli("train", *(arg for item in overrides for arg in ("--set", item)))
    pid, terminal = pty.fork()
    if pid == 0:  # the child: `invar train` with the pty as its controlling terminal
        os.execv(command[0], command)
    output = bytearray()

    def read(timeout: float) -> bool:
        """Read what the terminal shows; False at its end."""
        if not select.select([terminal], [], [], timeout)[0]:
            return True
        try:
            chunk = os.read(terminal, 65536)
        except OSError:  # EIO: every process holding the terminal has ended
            return False
        output.extend(chunk)
        return bool(chunk)

    def running() -> bool:
        read(0.0)
        return os.waitpid(pid, os.WNOHANG) == (0, 0)

    try:
        rt.wait_for_commits(run_dir, STOP_AFTER_COMMITS, running)
        children = _descendants(pid)
        assert children, "no worker process found"
        os.write(terminal, b"\x03")  # Ctrl-C: SIGINT to the terminal's foreground group
        deadline = time.monotonic() + 60
        while read(0.5):
            assert time.monotonic() < deadline, "invar train did not stop on Ctrl-C"
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(terminal)
    # What the terminal shows, without its escape sequences (colours, cursor).
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output.decode(errors="replace"))
    assert os.waitstatus_to_exitcode(status) == 130, text
    assert not [noise for noise in NOISE if noise in text], text
    stopped = _stopped_line(text, run_dir)
    assert STOP_AFTER_COMMITS <= stopped < UPDATES
    # Said as the signal arrives, before the wait for the update in progress and the workers.
    assert STOPPING in " ".join(text.split("interrupted at update")[0].split()), text
    assert re.search(r"(?:upd/s|s/upd) \d:\d\d:\d\d ETA \d:\d\d:\d\d", text), text  # the bar
    assert _journal_committed(run_dir) == stopped  # the journal was synced to that point
    _assert_all_gone(children)
    _resume_to_the_end(rt, run_dir)


def _terminated(rt, command: list[str], run_dir: Path) -> tuple[int, str, set[int]]:
    """A piped run sent SIGTERM once its journal holds a few commits: its exit status, its
    output and the child processes it had."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        rt.wait_for_commits(run_dir, STOP_AFTER_COMMITS, lambda: process.poll() is None)
        children = _descendants(process.pid)
        process.send_signal(signal.SIGTERM)
        text = process.communicate(timeout=60)[0].decode(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
    assert not [noise for noise in NOISE if noise in text], text
    return process.returncode, text, children


def test_sigterm_stops_a_piped_run_cleanly(tmp_path, rt):
    run_dir = tmp_path / "run"
    overrides = rt.tiny_overrides(run_dir, f"protocol.total_updates={UPDATES}",
                                  "output.progress=true")
    status, text, children = _terminated(
        rt, rt.cli("train", *(arg for item in overrides for arg in ("--set", item))), run_dir)
    assert status == 143, text
    assert _journal_committed(run_dir) == _stopped_line(text, run_dir)
    assert STOPPING in " ".join(text.split("interrupted at update")[0].split()), text
    # Outside a terminal, plain progress lines (the first update's at least).
    progress = re.findall(rf"^update (\d+)/{UPDATES}  reward \d\.\d{{3}}  staleness [01]  "
                          r"(?:\d+\.\d\d upd/s|\d+\.\d s/upd)  elapsed \d:\d\d:\d\d  "
                          r"ETA (?:\d:\d\d:\d\d|-)$",
                          text, re.MULTILINE)
    assert progress and progress[0] == "1", text
    _assert_all_gone(children)


def test_sigterm_stops_a_serial_run_and_says_it_cannot_be_resumed(tmp_path, rt):
    run_dir = tmp_path / "run"
    overrides = rt.tiny_overrides(run_dir, f"protocol.total_updates={UPDATES}")
    status, text, _ = _terminated(
        rt, rt.cli("train", "--serial", *(arg for item in overrides for arg in ("--set", item))),
        run_dir)
    assert status == 143, text
    assert re.search(rf"interrupted at update \d+ of {UPDATES}; a serial run cannot be "
                     "resumed", text), text
