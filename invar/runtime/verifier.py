"""Running a task's verifier: in child processes with a per-call time limit, beside generation.

A verifier is plain Python (`Task.score`) and may raise, return nonsense or hang. None of that
may crash or stall a run: each call's outcome is a reward and a status, "ok", "failed" (it
raised or returned no finite number) or "timeout" (it ran past `task.verifier_timeout_s`);
a failed or timed-out sample gets `task.failure_reward` and is counted.

Why processes: a hung pure-Python call cannot be stopped in a thread, but its process can be
killed. Each of a `VerifierPool`'s lanes owns one child (`python -m invar.runtime.verifier`,
which builds the task from the same configuration) and a thread that streams it jobs, a
window of them at a time so the pipe round trip is not paid per call, and reads one result
line per job; the clock of each call starts when the previous result arrived. A call past its
limit gets its child killed and restarted, and the jobs after it are sent again to the new
child. Jobs are submitted while the worker goes on generating, and collected when its reply
is due. The reward of a call is a function of (split, index, response) only, so it is the same
in whichever process, lane or order it runs.
"""

from __future__ import annotations

import json
import math
import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

OK, FAILED, TIMEOUT = "ok", "failed", "timeout"
WINDOW = 64
"""Jobs a lane sends its child ahead of the results it has read."""
WINDOW_BYTES = 32 * 1024
"""Bytes of jobs a lane sends ahead, below a pipe's buffer: a write never waits on a child
that is busy with a hung call (a single larger job is sent only when none is outstanding,
when the child is reading)."""
STARTUP_SECONDS = 120.0
"""How long a child may take to import and build the task before its job counts as failed
(not part of any call's time limit)."""


@dataclass(frozen=True)
class Job:
    """One call: the response to prompt `index` of `split`."""

    split: str
    index: int
    response: tuple[int, ...]


@dataclass(frozen=True)
class Outcome:
    reward: float
    status: str
    """OK, FAILED or TIMEOUT."""
    detail: str = ""
    """What went wrong (the exception, the bad value, the time limit)."""


def verify(task: Any, job: Job, failure_reward: float) -> Outcome:
    """`task.score` of one job, any exception or non-number turned into a failure."""
    try:
        value = task.score(job.split, job.index, job.response)
    except Exception as error:  # the verifier is user code: any exception is its failure
        return Outcome(failure_reward, FAILED, f"{type(error).__name__}: {error}")
    try:
        reward = float(value)
    except (TypeError, ValueError):
        return Outcome(failure_reward, FAILED, f"returned {value!r}, not a number")
    if not math.isfinite(reward):
        return Outcome(failure_reward, FAILED, f"returned {reward}, not a finite number")
    return Outcome(reward, OK)


class Pending:
    """The outcomes of submitted jobs, in submission order, once every lane is done."""

    def __init__(self, parts: list[tuple[list[int], Future[list[Outcome]]]]) -> None:
        self._parts = parts

    def outcomes(self) -> list[Outcome]:
        total = sum(len(positions) for positions, _ in self._parts)
        merged: list[Outcome] = [Outcome(0.0, OK)] * total
        for positions, future in self._parts:
            for position, outcome in zip(positions, future.result()):
                merged[position] = outcome
        return merged


def _done(outcomes: list[Outcome]) -> Future[list[Outcome]]:
    future: Future[list[Outcome]] = Future()
    future.set_result(outcomes)
    return future


class InlineVerifier:
    """`task.verifier_processes = 0`: the verifier runs in the calling thread, at submission,
    with no time limit (an exception is still a recorded failure)."""

    def __init__(self, task: Any, failure_reward: float) -> None:
        self.task = task
        self.failure_reward = failure_reward

    def submit(self, jobs: Sequence[Job]) -> Pending:
        return Pending([(list(range(len(jobs))),
                         _done([verify(self.task, job, self.failure_reward) for job in jobs]))])

    def close(self) -> None:
        """Nothing to stop."""


class VerifierPool:
    """`task.verifier_processes` lanes, each a child process and the thread that feeds it,
    as the `task` section (`task_config`, a dict) says (module doc)."""

    def __init__(self, task_config: dict[str, Any]) -> None:
        self.lanes = [_Lane(task_config) for _ in range(int(task_config["verifier_processes"]))]

    def submit(self, jobs: Sequence[Job]) -> Pending:
        """Start scoring `jobs` (spread over the lanes); returns at once."""
        count = len(self.lanes)
        parts = []
        for lane_index, lane in enumerate(self.lanes):
            positions = list(range(lane_index, len(jobs), count))
            if positions:
                parts.append((positions, lane.submit([jobs[p] for p in positions])))
        return Pending(parts)

    def close(self) -> None:
        for lane in self.lanes:
            lane.close()


def make_verifier(task: Any, task_config: dict[str, Any]) -> InlineVerifier | VerifierPool:
    """The verifier runner `task_config` (the `task` section as a dict) asks for."""
    if int(task_config["verifier_processes"]) == 0:
        return InlineVerifier(task, float(task_config["failure_reward"]))
    return VerifierPool(task_config)


class _Lane:
    """One child process and the thread that streams it jobs."""

    def __init__(self, task_config: dict[str, Any]) -> None:
        self.task_config = task_config
        self.timeout_s = float(task_config["verifier_timeout_s"])
        self.failure_reward = float(task_config["failure_reward"])
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verifier")
        self.child: subprocess.Popen[bytes] | None = None
        """Started with the first jobs (a run that never scores starts none)."""
        self.buffer = b""

    def submit(self, jobs: list[Job]) -> Future[list[Outcome]]:
        return self.thread.submit(self._run, jobs)

    def close(self) -> None:
        self.thread.shutdown(wait=True, cancel_futures=True)
        self._kill()

    def _start(self) -> str:
        """Start a child if none runs; "" once it is ready, else why it is not."""
        if self.child is not None:
            return ""
        self.buffer = b""
        self.child = subprocess.Popen(
            [sys.executable, "-m", "invar.runtime.verifier", json.dumps(self.task_config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            # Out of the terminal's process group: Ctrl-C is the driver's to handle, and the
            # child ends when its stdin does.
            process_group=0)
        line = self._read_line(time.monotonic() + STARTUP_SECONDS)
        if line == b"ready":
            return ""
        self._kill()
        return "the verifier process did not start (its stderr is in the worker's log)"

    def _kill(self) -> None:
        if self.child is not None:
            self.child.kill()
            self.child.wait()
            for stream in (self.child.stdin, self.child.stdout):
                if stream is not None:
                    stream.close()
            self.child = None

    def _read_line(self, deadline: float) -> bytes | None:
        """The child's next result line; None when the deadline passes or the child ends."""
        assert self.child is not None and self.child.stdout is not None
        descriptor = self.child.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([descriptor], [], [], left)[0]:
                return None
            chunk = os.read(descriptor, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def _run(self, jobs: list[Job]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        lines = [json.dumps([number, job.split, job.index, list(job.response)]).encode() + b"\n"
                 for number, job in enumerate(jobs)]
        sent = 0
        while len(outcomes) < len(jobs):
            problem = self._start()
            if problem:
                outcomes.append(Outcome(self.failure_reward, FAILED, problem))
                sent = len(outcomes)
                continue
            assert self.child is not None and self.child.stdin is not None
            try:
                ahead = sum(len(line) for line in lines[len(outcomes):sent])
                while sent < len(jobs) and sent - len(outcomes) < WINDOW and \
                        (sent == len(outcomes) or ahead + len(lines[sent]) <= WINDOW_BYTES):
                    self.child.stdin.write(lines[sent])
                    ahead += len(lines[sent])
                    sent += 1
                self.child.stdin.flush()
            except OSError:  # the child is gone: the read below says so
                pass
            began = time.monotonic()
            line = self._read_line(began + self.timeout_s)
            if line is None:
                timed_out = self.child.poll() is None and \
                    time.monotonic() - began >= self.timeout_s
                code = self.child.returncode
                self._kill()
                outcomes.append(Outcome(self.failure_reward, TIMEOUT,
                                        f"ran past task.verifier_timeout_s = {self.timeout_s} s")
                                if timed_out else
                                Outcome(self.failure_reward, FAILED,
                                        f"the verifier process ended (exit code {code})"))
                sent = len(outcomes)  # the rest again, to a new child
                continue
            number, reward, status, detail = json.loads(line)
            if number != len(outcomes):
                raise RuntimeError(f"verifier process answered job {number}, expected "
                                   f"{len(outcomes)}")
            outcomes.append(Outcome(float(reward), status, detail))
        return outcomes


def main(argv: list[str]) -> int:
    """The child: build the task, then answer one JSON line per job line on stdin until it
    closes. The protocol has its own descriptor: whatever the verifier prints goes to stderr."""
    from invar.runtime.tasks import build_task
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    config = json.loads(argv[1])
    task = build_task(config)
    failure_reward = float(config["failure_reward"])
    channel.write("ready\n")
    channel.flush()
    for line in sys.stdin:
        number, split, index, response = json.loads(line)
        outcome = verify(task, Job(split, index, tuple(response)), failure_reward)
        channel.write(json.dumps([number, outcome.reward, outcome.status, outcome.detail])
                      + "\n")
        channel.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
