"""Runtime fakes: the real `Driver` in-process, without torch numerics or worker processes.

* `FakeLearner`: a learner backend (`invar.runtime.backend.LearnerBackend`) whose
  numbers are the synthetic ones of `invar.model.world` (log-probs, digests `w0`, `w1.1`, ...,
  evaluation rewards), with commits as small files, so a run's `logical_projection` must
  equal `invar.testing.canonical_run`'s for the same protocol.
* `request_rows`: the driver's `learner_inputs` for it: the request ids of a command's rows
  (the synthetic numerics are functions of request ids, not of tokens).
* `MemoryWorkers`: a `spawn_worker` whose workers are coroutines behind a `MemoryTransport`,
  speaking the frame protocol and answering as `invar.model.world` workers do.
* `Counted`: any backend, with a count of the methods called on it.

Public (trio style): every test that runs the driver without processes uses these.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from invar.model.messages import (
    Command,
    Event,
    LoadWeights,
    Matrix,
    ObservationId,
    RunForward,
    ScoreProbabilities,
    WeightsLoaded,
    decode,
    unpack_launches,
)
from invar.model.schedule import RequestId
from invar.model.state import State
from invar.model.world import (
    evaluation_reward,
    forward_reply,
    sample_reply,
    scores_reply,
    step_digest,
    version_digest,
)
from invar.runtime.files import atomic_write
from invar.runtime.transport import MemoryTransport
from invar.runtime.wire import event_frame, hello


class FakeLearner:
    """The synthetic learner of `invar.model.world` behind the backend interface.

    Its state digest after `s` steps of update `u` is `world.step_digest(u, s, K)`; a commit
    is a file holding the digest. `crash_at[method] = v` makes `method` raise `SimulatedCrash`
    once, when called at committed version v (e.g. {"evaluate_greedy": 2}: the driver dies
    right after the boundary commit of version 2); `slow[method]` delays each call by that
    many seconds (so the driver's retry timer re-sends what is outstanding). `calls` counts
    every backend call, by method.
    """

    def __init__(self, commit_dir: Path, optimizer_steps: int,
                 crash_at: dict[str, int] | None = None, slow: dict[str, float] | None = None
                 ) -> None:
        self.commit_dir = Path(commit_dir)
        self.optimizer_steps = optimizer_steps
        self.crash_at = dict(crash_at or {})
        self.slow = dict(slow or {})
        self.calls: Counter[str] = Counter()
        self.committed_version: int | None = None
        self._digest: str | None = None
        self._pending: tuple[tuple[int, int, int, str], tuple[int, ...]] | None = None

    def _called(self, method: str) -> None:
        self.calls[method] += 1
        if method in self.crash_at and self.crash_at[method] == self.committed_version:
            del self.crash_at[method]
            raise SimulatedCrash(f"{method} at version {self.committed_version}")
        time.sleep(self.slow.get(method, 0.0))

    def _file(self, version: int) -> Path:
        return self.commit_dir / f"commit-{version:06d}.txt"

    def start(self) -> tuple[int, str]:
        self._called("start")
        self.commit_dir.mkdir(parents=True, exist_ok=True)
        self._pending = None
        versions = sorted(int(p.stem.split("-")[1]) for p in self.commit_dir.glob("commit-*.txt"))
        if versions:
            self.committed_version = versions[-1]
            self._digest = self._file(versions[-1]).read_text()
        else:
            self._digest = version_digest(0)
            self.commit(0)
        assert self.committed_version is not None
        return self.committed_version, self._digest

    def state_digest(self) -> str:
        assert self._digest is not None, "start() first"
        return self._digest

    def score(self, rows: np.ndarray, start: int, need_reference: bool
              ) -> tuple[Matrix, Matrix | None]:
        """The synthetic log-probs, each row of its response's length (`Matrix`)."""
        self._called("score")
        assert self.committed_version is not None
        # Scoring is of the frozen weights of the update's start: the newest commit.
        reply = scores_reply(ScoreProbabilities(self.committed_version, 0, _requests(rows),
                                                need_reference))
        return reply.proximal, reply.reference

    def forward(self, update: int, step: int, observation: int, rows: np.ndarray, start: int
                ) -> tuple[str, Matrix]:
        self._called("forward")
        command = RunForward(ObservationId(update, step, observation), 0, _requests(rows))
        reply = forward_reply(command, self.optimizer_steps)
        assert reply.pre_step_digest == self.state_digest(), "forward from an unexpected state"
        current = reply.current_logprobs
        self._pending = ((update, step, observation, self.state_digest()),
                         current.padded()[0].shape)
        return self.state_digest(), current

    def apply_cotangent(self, update: int, step: int, observation: int, pre_step_digest: str,
                        cotangent: np.ndarray) -> str:
        self._called("apply_cotangent")
        binding = (update, step, observation, pre_step_digest)
        if self._pending is None or self._pending[0] != binding \
                or pre_step_digest != self.state_digest():
            raise ValueError(f"cotangent {binding} is not bound to the pending forward")
        if np.shape(cotangent) != self._pending[1]:
            raise ValueError(f"cotangent shape {np.shape(cotangent)}, forward gave "
                             f"{self._pending[1]}")
        self._pending = None
        self._digest = step_digest(update, step + 1, self.optimizer_steps)
        return self._digest

    def commit(self, version: int) -> str:
        self._called("commit")
        atomic_write(self._file(version), self.state_digest().encode())
        self.committed_version = version
        return self.state_digest()

    def commit_file(self, version: int) -> Path | None:
        self._called("commit_file")
        path = self._file(version)
        return path if path.exists() else None

    def published_weights(self, version: int) -> tuple[bytes, str, str]:
        self._called("published_weights")
        digest = self._file(version).read_text()
        return digest.encode(), digest, digest

    def evaluate_greedy(self, task: Any, prompts: np.ndarray) -> float:
        self._called("evaluate_greedy")
        assert self.committed_version is not None
        return evaluation_reward(self.committed_version)


class SimulatedCrash(RuntimeError):
    """Raised by a fake where the test wants the driver to die."""


def _requests(rows: np.ndarray) -> tuple[RequestId, ...]:
    return tuple(RequestId(*map(int, row)) for row in rows)


def request_rows(state: State, task: Any, command: Command) -> np.ndarray | None:
    """`learner_inputs` for `FakeLearner`: one (batch, prompt, sample) row per request."""
    if isinstance(command, (ScoreProbabilities, RunForward)):
        return np.array([tuple(r) for r in command.requests], dtype=np.int64)
    return None


class MemoryWorkers:
    """`spawn_worker` for the driver: each worker a coroutine behind a `MemoryTransport`.

    A worker carries out loads in serial order, holds the one version it loaded last and
    answers the launches of each frame with one `invar.model.world.sample_reply` frame.
    Faults: `duplicate` sends every reply frame twice; `die_after[name] = n` closes the first
    incarnation's connection after n completions (the driver sees the worker lost);
    `reply_seconds` delays every reply that long, with no sign of life meanwhile (these
    workers send no `working` frames), so the driver's retry timer re-sends what they hold.
    """

    def __init__(self, duplicate: bool = False, die_after: dict[str, int] | None = None,
                 reply_seconds: float = 0.0) -> None:
        self.duplicate = duplicate
        self.die_after = dict(die_after or {})
        self.reply_seconds = reply_seconds
        self.spawned: list[tuple[str, int]] = []
        self._tasks: set[asyncio.Task] = set()

    async def __call__(self, name: str, incarnation: int) -> MemoryTransport:
        self.spawned.append((name, incarnation))
        transport = MemoryTransport(name)
        limit = self.die_after.get(name) if incarnation == 0 else None
        task = asyncio.ensure_future(self._serve(transport, limit))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return transport

    async def _serve(self, transport: MemoryTransport, limit: int | None) -> None:
        async def reply(event: Event) -> None:
            """As the worker process sends an event (`wire.event_frame`)."""
            await asyncio.sleep(self.reply_seconds)
            for _ in range(2 if self.duplicate else 1):
                await transport.to_driver.put(event_frame(event))

        await transport.to_driver.put((hello(transport.name), b""))
        version: int | None = None
        load_serial = -1
        sent = 0
        while (item := await transport.to_worker.get()) is not None:
            header, blob = item
            if header["kind"] == "launches":
                launches = [c for c in unpack_launches(header["launches"])
                            if c.version == version]
                if limit is not None:
                    launches = launches[:max(limit - sent, 0)]
                sent += len(launches)
                if launches:  # one reply frame per call, as the real worker sends
                    await reply(sample_reply(*launches))
                if limit is not None and sent >= limit:
                    await transport.close()  # the worker dies: its connection ends
                    return
            else:
                load = decode(header["message"])
                assert isinstance(load, LoadWeights)
                assert blob.decode() == header["params_digest"], "weights do not match digest"
                if load.load < load_serial:
                    continue  # an older load, overtaken: ignored
                version, load_serial = load.version, load.load
                loaded = WeightsLoaded(load.worker, load.incarnation, load.load, load.version)
                await reply(loaded)


class Counted:
    """A backend with a count of every method called on it (`calls`, by name)."""

    def __init__(self, learner: Any) -> None:
        self.learner = learner
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.learner, name)
        if not callable(attribute):
            return attribute

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return attribute(*args, **kwargs)
        return counted
