"""A rollout worker: loads the version it is told to, samples, scores with the task's verifier.

It decides nothing: version, seed and prompt of every request come in the LaunchRequest.
Rewards come from the task's verifier (`invar.runtime.verifier`), run in child processes with a
time limit while the next chunk is generated; a sample whose verifier failed or timed out is
named in the reply frame's header, beside the event, for the driver's metrics.
Requests are generated in fixed-shape chunks with each request at a fixed row (its position
in the batch), so a request's tokens and behaviour log-probs do not depend on which other
requests happened to share the call: re-issuing it elsewhere reproduces it bit for bit on the
same kind of machine (the numerical-invariance evidence the guarantees rest on).

Run as a process: `python -m invar.runtime.worker '<json args>'`, frames on stdin/stdout.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from invar.model.messages import (
    ENCODING_VERSION,
    Completions,
    LaunchRequest,
    LoadWeights,
    RequestsCompleted,
    WeightsLoaded,
    decode,
    unpack_launches,
)
from invar.model.ragged import Ragged
from invar.runtime import retry
from invar.runtime.allocator import limit_fragmentation
from invar.runtime.backend import Sampler
from invar.runtime.config import OutputConfig
from invar.runtime.padding import Prompts, response_lengths
from invar.runtime.registry import LEARNERS, resolve
from invar.runtime.tasks import build_task, end_token
from invar.runtime.transport import (
    ConnectionLost,
    FrameError,
    read_frame_blocking,
    write_frame_blocking,
)
from invar.runtime.verifier import FAILED, OK, TIMEOUT, Job, Pending, make_verifier
from invar.runtime.weights import state_dict_from_bytes, weights_digest
from invar.runtime.wire import event_frame, hello, working_frame

REPLY_CACHE = 8192
"""Replies kept to answer a re-sent launch without sampling again."""


@dataclass(frozen=True)
class WorkerArgs:
    """What a worker process is started with (JSON on its command line)."""

    name: str
    task: dict[str, Any]
    """The configuration's `task` section, `task.tokenizer` resolved (`config.task_section`):
    the worker and its verifier processes build the task from it."""
    policy: dict[str, Any]
    prompts_per_batch: int
    group_size: int
    chunk_prompts: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    threads: int = 1
    backend: str = "torch"
    """The learner's backend, whose sampler this worker generates with
    (`invar.runtime.registry.LEARNERS`; every backend publishes the same weights blob)."""
    model: dict[str, Any] | None = None
    """For a transformers policy: its resolved `hf_policy.ModelSpec` (config and token map),
    so the worker builds the same architecture without reading `policy.path`."""
    heartbeat_seconds: float = retry.heartbeat_seconds(OutputConfig.retry_seconds)
    """How often the worker names what it holds unanswered (`invar.runtime.retry`)."""
    faults: tuple[str, ...] = ()
    """Test-only misbehaviour: "wrong_version_once", "garbage_frame_once", "exit_after:N"
    (exit after exactly N replies, dropping the rest of the batch it was working on),
    "slow:SECONDS" (each generation call takes SECONDS longer)."""


class RolloutWorker:
    """The worker's logic, independent of how frames reach it."""

    def __init__(self, args: WorkerArgs) -> None:
        self.args = args
        self.task = build_task(args.task)
        self.verifier = make_verifier(self.task, args.task)
        backend = LEARNERS.get(args.backend)
        if backend is None:
            raise ValueError(f"unknown backend {args.backend!r}; known: {', '.join(LEARNERS)}")
        self.sampler: Sampler = resolve(backend.sampler)(args)
        self.version: int | None = None
        self.load_serial = -1
        """The serial of the last load carried out (`LoadWeights.load`)."""
        self.replies: OrderedDict[tuple[int, ...], tuple[Completions, int]] = OrderedDict()
        """Each request answered since the last load: the frame it was sampled in and its row
        there (a re-sent launch is answered with the same row)."""
        self.verifier_status: dict[tuple[int, ...], str] = {}
        """FAILED or TIMEOUT, for each request in `replies` whose verifier did not succeed."""
        self.faults = set(args.faults)
        self.slow_seconds = next((float(f.split(":")[1]) for f in args.faults
                                  if f.startswith("slow:")), 0.0)
        self.sent = 0
        self.generated = 0
        """Requests sampled so far (not answered again from `replies`)."""
        self._prompts: dict[int, list[int]] = {}

    def load(self, command: LoadWeights, blob: bytes, params_digest: str
             ) -> WeightsLoaded | None:
        """Hold version `command.version` (verified against `params_digest`) and say so; a
        load older than the last one (duplicated or delayed) is ignored: None, as
        `invar.model.world.worker_accepts` rules. The current one re-sent is answered again."""
        if command.load < self.load_serial:
            return None
        if command.load == self.load_serial and command.version == self.version:
            return WeightsLoaded(command.worker, command.incarnation, command.load,
                                 command.version)
        state = state_dict_from_bytes(blob)
        if weights_digest(state) != params_digest:
            raise FrameError(f"weights of version {command.version} do not match their digest")
        self.sampler.load(state)
        self.version = command.version
        self.load_serial = command.load
        self.replies.clear()
        self.verifier_status.clear()
        return WeightsLoaded(command.worker, command.incarnation, command.load, command.version)

    def launch(self, commands: list[LaunchRequest]) -> Completions:
        """The completions of these launches (cached ones re-sent), as the columns of the one
        `RequestsCompleted` frame the caller sends (empty: nothing to send)."""
        frames: list[Completions] = []
        rows: list[int] = []
        fresh: dict[tuple[int, int], list[LaunchRequest]] = {}
        for command in commands:
            key = tuple(command.request)
            if key in self.replies:
                frame, row = self.replies[key]
                frames.append(frame)
                rows.append(row)
            elif command.version == self.version:
                chunk = (command.request.batch, command.request.prompt // self.args.chunk_prompts)
                fresh.setdefault(chunk, []).append(command)
            # A launch for another version predates our last load: its request is done.
        sampled = [self._sample_chunk(chunk, group)
                   for (batch, chunk), group in sorted(fresh.items())]
        self.generated += len({tuple(c.request) for group in fresh.values() for c in group})
        for group, rows_of_group, generated, pending in sampled:
            completed = self._complete(group, rows_of_group, *generated, pending)
            frames.extend([completed] * len(completed))
            rows.extend(range(len(completed)))
        return Completions.gathered(frames, rows)

    def verifier_failures(self, completions: Completions) -> dict[str, list[list[int]]]:
        """The requests among `completions` whose verifier failed or timed out (the reply
        frame's header carries them; cached replies re-sent carry them again)."""
        found: dict[str, list[list[int]]] = {}
        for request in completions.request_ids():
            status = self.verifier_status.get(tuple(request))
            if status is not None:
                found.setdefault(f"verifier_{status}", []).append(list(request))
        return found

    @property
    def policy(self) -> Any:
        """The network the sampler holds."""
        return self.sampler.policy

    def close(self) -> None:
        self.verifier.close()

    def _prompt(self, index: int) -> list[int]:
        if index not in self._prompts:
            if len(self._prompts) > REPLY_CACHE:
                self._prompts.clear()
            self._prompts[index] = self.task.prompt(index)
        return self._prompts[index]

    def _sample_chunk(self, chunk: int, group: list[LaunchRequest]
                      ) -> tuple[list[LaunchRequest], list[int],
                                 tuple[np.ndarray, np.ndarray, np.ndarray], Pending]:
        """Generate one fixed-shape chunk and submit its responses (each up to its first EOS)
        to the verifier, which scores them while the next chunk is generated. Returns the
        group, its rows in the chunk, the chunk's (tokens, log-probs, response lengths)."""
        g = self.args.group_size
        first_prompt = chunk * self.args.chunk_prompts
        prompts_here = min(self.args.chunk_prompts, self.args.prompts_per_batch - first_prompt)
        rows = prompts_here * g
        filler = group[0]
        prompt_of_row = [self._prompt(filler.prompt_index)] * rows
        seeds = [0] * rows
        for command in group:
            row = (command.request.prompt - first_prompt) * g + command.request.sample
            prompt_of_row[row] = self._prompt(command.prompt_index)
            seeds[row] = command.seed
        prompts = Prompts.of(prompt_of_row, self.task.prompt_length)
        eos = end_token(self.task)
        tokens, logprobs = self.sampler.generate(prompts, self.task.response_length, seeds, eos)
        time.sleep(self.slow_seconds)
        lengths = response_lengths(tokens, eos)
        rows_of_group = [(command.request.prompt - first_prompt) * g + command.request.sample
                         for command in group]
        pending = self.verifier.submit([Job("train", command.prompt_index,
                                            tuple(tokens[row, :lengths[row]].tolist()))
                                        for command, row in zip(group, rows_of_group)])
        return group, rows_of_group, (tokens, logprobs, lengths), pending

    def _complete(self, group: list[LaunchRequest], rows: list[int], tokens: np.ndarray,
                  logprobs: np.ndarray, lengths: np.ndarray, pending: Pending) -> Completions:
        """The chunk's completions of `group` (its rows `rows` of `tokens` and `logprobs`, each
        cut to its response's length), as one frame's columns, each kept to answer a re-sent
        launch."""
        outcomes = pending.outcomes()
        failed = [(tuple(c.request), o) for c, o in zip(group, outcomes) if o.status != OK]
        if failed:  # one line a chunk, to the worker's log
            request, outcome = failed[0]
            print(f"verifier: {len(failed)} of {len(group)} calls failed or timed out; the first, "
                  f"request {request}: {outcome.status}: {outcome.detail}", file=sys.stderr,
                  flush=True)
        versions = [command.version for command in group]
        if "wrong_version_once" in self.faults:
            self.faults.discard("wrong_version_once")
            versions[0] += 1
        frame = Completions(np.array([tuple(c.request) for c in group], dtype=np.int64),
                            np.array(versions, dtype=np.int64),
                            _rows_of(np.asarray(tokens, dtype=np.int64)[rows], lengths[rows]),
                            _rows_of(np.asarray(logprobs, dtype=np.float64)[rows],
                                     lengths[rows]),
                            np.array([outcome.reward for outcome in outcomes], dtype=np.float64))
        for row, (command, outcome) in enumerate(zip(group, outcomes)):
            if versions[row] == command.version:
                key = tuple(command.request)
                self.replies[key] = (frame, row)
                if outcome.status in (FAILED, TIMEOUT):
                    self.verifier_status[key] = outcome.status
                if len(self.replies) > REPLY_CACHE:
                    evicted, _ = self.replies.popitem(last=False)
                    self.verifier_status.pop(evicted, None)
        return frame


def _rows_of(table: np.ndarray, lengths: np.ndarray) -> Ragged:
    """A fixed-shape chunk's rows (a fresh (n, T) array), each cut to its length, as `Ragged`
    rows (without a copy when every row is whole)."""
    if (lengths == table.shape[1]).all():
        table.flags.writeable = False
        return Ragged.from_table(table)
    return Ragged.from_padded(table, np.arange(table.shape[1]) < lengths[:, None])


def main(argv: list[str]) -> int:
    limit_fragmentation()
    raw = json.loads(argv[1])
    raw["faults"] = tuple(raw.get("faults", ()))
    args = WorkerArgs(**raw)
    torch.set_num_threads(args.threads)
    worker = RolloutWorker(args)
    try:
        return serve(worker, args)
    finally:
        worker.close()


def serve(worker: RolloutWorker, args: WorkerArgs) -> int:
    """Answer frames on stdin until it closes; the exit status. While it holds launches or a
    load not yet answered, a thread names them in a `working` frame every
    `args.heartbeat_seconds` (`invar.runtime.retry`: the driver does not re-send them)."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    inbox: queue.Queue[tuple[dict[str, Any], bytes, Any] | None] = queue.Queue()
    held = Held()
    writing = threading.Lock()
    stopped = threading.Event()

    def write(header: dict[str, Any], blob: bytes = b"") -> None:
        with writing:  # a frame is written whole, whichever thread writes it
            write_frame_blocking(stdout, header, blob)

    def read() -> None:  # frames are drained by a thread so launches can be batched
        try:
            while True:
                header, blob = read_frame_blocking(stdin)
                inbox.put((header, blob, held.receive(header)))
        except (ConnectionLost, FrameError, OSError):
            inbox.put(None)

    def beat() -> None:
        try:
            while not stopped.wait(args.heartbeat_seconds):
                requests, loads = held.named()
                if requests or loads:
                    write(working_frame(requests, loads))
        except (ConnectionLost, OSError):
            pass  # the driver is gone: the main loop sees its stdin close

    threading.Thread(target=read, daemon=True).start()
    exit_after = next((int(f.split(":")[1]) for f in args.faults if f.startswith("exit_after:")),
                      None)
    write(hello(args.name))
    threading.Thread(target=beat, daemon=True).start()

    def launch(launches: list[LaunchRequest]) -> tuple[RequestsCompleted | None, float, int]:
        """The reply frame to these launches, the seconds spent computing it and the samples
        generated for it (measurement only: reported in the frame's header, never part of any
        event)."""
        began, generated = time.perf_counter(), worker.generated
        completions = worker.launch(launches)
        frame = None
        if len(completions):
            frame = RequestsCompleted(launches[0].worker, launches[0].incarnation, completions)
        return frame, time.perf_counter() - began, worker.generated - generated

    def reply(frame: RequestsCompleted | None, seconds: float, generated: int) -> bool:
        """Send the frame (cut after exit_after completions); True when it is time to crash."""
        if frame is not None and exit_after is not None:
            frame = replace(frame, completions=frame.completions[:max(exit_after - worker.sent,
                                                                      0)])
        if frame is not None and len(frame.completions):
            # `compute_seconds` (generation time) with the samples it `generated` (the rest
            # answered from the cache), and the requests whose verifier failed ride in the
            # header beside the event, so the event and the journal are unchanged.
            write(*event_frame(frame, compute_seconds=seconds, generated=generated,
                               **worker.verifier_failures(frame.completions)))
            worker.sent += len(frame.completions)
        return exit_after is not None and worker.sent >= exit_after

    def answer(launches: list[LaunchRequest]) -> bool:
        """Launch, reply, and let go of the launches; True when it is time to crash."""
        frame, seconds, generated = launch(launches)
        if "garbage_frame_once" in worker.faults and frame is not None:
            worker.faults.discard("garbage_frame_once")
            write({"kind": "event"}, b'{"type":"Nonsense"}')
        crash = reply(frame, seconds, generated)
        held.answered(launches)
        return crash

    try:
        while True:
            items = [inbox.get()]
            while not inbox.empty():
                items.append(inbox.get_nowait())
            launches: list[LaunchRequest] = []
            for item in items:
                if item is None:
                    return 0
                header, blob, content = item
                if isinstance(content, Exception):
                    raise content
                if content is None:
                    raise SystemExit(
                        f"worker {args.name}: a frame of kind {header.get('kind')!r} from the "
                        f"driver (expected 'launches' or 'command'): the driver runs another "
                        f"invar version (this worker's message encoding: {ENCODING_VERSION})")
                if header["kind"] == "launches":
                    launches.extend(content)
                    continue
                if isinstance(content, LoadWeights):
                    # Requests asked before the load are answered first, in order.
                    if answer(launches):
                        return 3  # simulated crash, for tests
                    launches = []
                    began = time.perf_counter()
                    loaded = worker.load(content, blob, header["params_digest"])
                    if loaded is not None:
                        write(*event_frame(loaded, load_seconds=time.perf_counter() - began))
                    held.loaded(content)
            if answer(launches):
                return 3  # simulated crash, for tests: the rest of this batch is lost
    finally:
        stopped.set()


class Held:
    """What a worker has received and not yet answered, which its `working` frames name: the
    reader thread adds, the main loop lets go, the heartbeat thread reads (under a lock).
    Counted: a request received twice is held until both are answered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Counter[tuple[int, ...]] = Counter()
        self._loads: Counter[int] = Counter()

    def receive(self, header: dict[str, Any]) -> Any:
        """A frame from the driver, read: its launches, its command, None for a frame of
        another kind, or the error reading it (which the main loop raises)."""
        try:
            kind = header.get("kind")
            if kind == "launches":
                launches = unpack_launches(header["launches"])
                with self._lock:
                    self._requests.update(tuple(c.request) for c in launches)
                return launches
            if kind != "command" or "message" not in header:
                return None
            message = decode(header["message"])
            if isinstance(message, LoadWeights):
                with self._lock:
                    self._loads[message.load] += 1
            return message
        except Exception as error:  # noqa: BLE001 (raised by the main loop, as if read there)
            return error

    def answered(self, launches: list[LaunchRequest]) -> None:
        with self._lock:
            self._requests.subtract(tuple(c.request) for c in launches)
            self._requests = +self._requests

    def loaded(self, load: LoadWeights) -> None:
        with self._lock:
            self._loads[load.load] -= 1
            self._loads = +self._loads

    def named(self) -> tuple[list[tuple[int, ...]], list[int]]:
        """The requests and load serials held now."""
        with self._lock:
            return list(self._requests), list(self._loads)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
