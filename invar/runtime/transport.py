"""How the driver talks to a rollout worker: length-prefixed frames over a byte stream.

A frame is `u32 header length | header (JSON object) | u32 blob length | blob`. To a worker,
the header carries encoded commands (`invar.model.messages`) and the blob the weights of a
load; from a worker, the header carries the kind and measurements and the blob one event
(`invar.runtime.wire`: completions as binary columns, a load as its JSON text).
Frames are checked on receipt: a malformed one raises `FrameError` naming what is wrong, and
the caller logs it and drops it; the stream itself stays usable when the lengths were sound.

`Transport` is the interface the driver uses; `LocalProcessTransport` runs a worker as a
subprocess over its stdin/stdout pipes, `MemoryTransport` is the in-memory fake (public, so
that every driver test and backend runs against the same interface), and the SSH transport
(`invar.runtime.ssh`) implements the same interface. A `Launcher` is how the driver gets them
for `rollout.transport` (`invar.runtime.registry.TRANSPORTS`): `LocalLauncher` here,
`invar.runtime.ssh.SshLauncher` over SSH.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from invar.runtime.worker_args import worker_args

if TYPE_CHECKING:
    from invar.runtime.config import TrainConfig

MAX_HEADER = 1 << 20
MAX_BLOB = 1 << 30
CLOSE_GRACE_SECONDS = 2.0
"""How long a worker whose stdin was closed may take to exit before it is killed."""
_LENGTH = struct.Struct(">I")


class FrameError(ValueError):
    """A frame that is not well formed; says which part."""


class ConnectionLost(ConnectionError):
    """The other end is gone (EOF, broken pipe, process exit)."""


class TransportRefused(RuntimeError):
    """A worker's host refused the connection for a reason retrying cannot fix (its host key
    does not verify, our key is refused); the message names the host. The driver does not
    respawn such a worker, and at start-up the run does not begin."""


def encode_frame(header: dict[str, Any], blob: bytes = b"") -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    return _LENGTH.pack(len(head)) + head + _LENGTH.pack(len(blob)) + blob


def decode_header(head: bytes) -> dict[str, Any]:
    try:
        header = json.loads(head)
    except ValueError as error:
        raise FrameError(f"header is not JSON: {error}") from None
    if not isinstance(header, dict) or not isinstance(header.get("kind"), str):
        raise FrameError("header must be a JSON object with a string 'kind'")
    return header


async def read_frame(reader: asyncio.StreamReader) -> tuple[dict[str, Any], bytes]:
    """Next frame; ConnectionLost at EOF; FrameError for a bad header (lengths consumed)."""
    try:
        (size,) = _LENGTH.unpack(await reader.readexactly(4))
        if size > MAX_HEADER:
            raise ConnectionLost(f"header of {size} bytes: stream out of sync")
        head = await reader.readexactly(size)
        (blob_size,) = _LENGTH.unpack(await reader.readexactly(4))
        if blob_size > MAX_BLOB:
            raise ConnectionLost(f"blob of {blob_size} bytes: stream out of sync")
        blob = await reader.readexactly(blob_size)
    except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError) as error:
        raise ConnectionLost(str(error)) from None
    return decode_header(head), blob


def read_frame_blocking(stream: BinaryIO) -> tuple[dict[str, Any], bytes]:
    """The worker side's blocking read; ConnectionLost at EOF."""
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = stream.read(n - len(data))
            if not chunk:
                raise ConnectionLost("end of stream")
            data += chunk
        return data

    (size,) = _LENGTH.unpack(exactly(4))
    if size > MAX_HEADER:
        raise ConnectionLost(f"header of {size} bytes: stream out of sync")
    head = exactly(size)
    (blob_size,) = _LENGTH.unpack(exactly(4))
    if blob_size > MAX_BLOB:
        raise ConnectionLost(f"blob of {blob_size} bytes: stream out of sync")
    return decode_header(head), exactly(blob_size)


def write_frame_blocking(stream: BinaryIO, header: dict[str, Any], blob: bytes = b"") -> None:
    stream.write(encode_frame(header, blob))
    stream.flush()


class Transport(Protocol):
    """One connection to one worker incarnation."""

    name: str

    async def send(self, header: dict[str, Any], blob: bytes = b"") -> None:
        """Queue a frame; raises ConnectionLost if the worker is gone."""

    async def receive(self) -> tuple[dict[str, Any], bytes]:
        """Next frame from the worker; ConnectionLost when it is gone."""

    async def close(self) -> None:
        """Stop the worker and release the connection (idempotent)."""


class StreamTransport:
    """A Transport over an asyncio reader/writer pair (pipes, sockets, SSH channels)."""

    def __init__(self, name: str, reader: asyncio.StreamReader, writer: Any) -> None:
        self.name = name
        self._reader = reader
        self._writer = writer

    async def send(self, header: dict[str, Any], blob: bytes = b"") -> None:
        try:
            self._writer.write(encode_frame(header, blob))
            await self._writer.drain()
        except (ConnectionResetError, BrokenPipeError, RuntimeError) as error:
            raise ConnectionLost(str(error)) from None

    async def receive(self) -> tuple[dict[str, Any], bytes]:
        return await read_frame(self._reader)

    async def close(self) -> None:
        try:
            self._writer.close()
        except (RuntimeError, OSError):
            pass


class LocalProcessTransport(StreamTransport):
    """A worker as a local subprocess (`python -m invar.runtime.worker`) over its pipes."""

    def __init__(self, name: str, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None and process.stdin is not None
        super().__init__(name, process.stdout, process.stdin)
        self.process = process

    @classmethod
    async def spawn(cls, name: str, worker_args: dict[str, Any], log_path: Path,
                    cpus: tuple[int, ...] = ()) -> LocalProcessTransport:
        env = dict(os.environ)
        threads = str(worker_args.get("threads", 1))
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)

        def pin() -> None:  # runs in the child before exec
            if cpus:
                os.sched_setaffinity(0, cpus)
            # Ctrl-C on a terminal reaches the whole foreground process group: the driver
            # decides, and ends its workers by closing their stdin (kept across exec, and by
            # the worker's own verifier processes).
            signal.signal(signal.SIGINT, signal.SIG_IGN)

        # The child gets its own copy of the log's descriptor; ours closes once it is spawned.
        with open(log_path, "ab") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "invar.runtime.worker", json.dumps(worker_args),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log,
                env=env, preexec_fn=pin, limit=MAX_BLOB)
        return cls(name, process)

    async def close(self) -> None:
        await super().close()
        if self.process.returncode is None:
            # A worker exits by itself at the end of its stdin. Killing it unasked races with
            # its exit: Popen.kill() polls first and may reap the child under asyncio's child
            # watcher ("Unknown child process pid ..., will report returncode 255").
            try:
                await asyncio.wait_for(self.process.wait(), CLOSE_GRACE_SECONDS)
            except TimeoutError:
                try:
                    self.process.kill()
                except ProcessLookupError:
                    pass
        await self.process.wait()


class Launcher(Protocol):
    """How `rollout.transport` starts workers, built from the run's configuration."""

    async def check(self) -> None:
        """Before the run starts: every worker can be started; else `TransportRefused` naming
        the host and why (the run does not start)."""

    async def spawn(self, name: str, incarnation: int) -> Transport:
        """A connected transport to incarnation `incarnation` of worker `name` (the driver's
        `SpawnWorker`), its stderr in `worker_log`; `ConnectionLost` when its host cannot be
        reached now (retried), `TransportRefused` when it never will."""


def worker_log(run_dir: Path, name: str, incarnation: int) -> Path:
    """The log file of one worker incarnation (its stderr); its directory made."""
    logs = run_dir / "logs"
    logs.mkdir(exist_ok=True)
    return logs / f"{name}.{incarnation}.log"


class LocalLauncher:
    """`rollout.transport = "local"`: each worker a subprocess of this one, with this Python
    (`LocalProcessTransport`)."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config

    async def check(self) -> None:
        """Nothing to check: a local worker runs with the driver's own interpreter."""

    async def spawn(self, name: str, incarnation: int) -> Transport:
        return await LocalProcessTransport.spawn(
            name, worker_args(self.config, name, incarnation),
            worker_log(Path(self.config.output.run_dir), name, incarnation),
            cpus=self.config.rollout.cpus)


class MemoryTransport:
    """In-memory fake: frames go through asyncio queues to a coroutine playing the worker."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.to_worker: asyncio.Queue[tuple[dict[str, Any], bytes] | None] = asyncio.Queue()
        self.to_driver: asyncio.Queue[tuple[dict[str, Any], bytes] | None] = asyncio.Queue()
        self.closed = False

    async def send(self, header: dict[str, Any], blob: bytes = b"") -> None:
        if self.closed:
            raise ConnectionLost(f"{self.name} is closed")
        # Round-trip through the wire encoding so the fake checks what the real one would.
        frame = encode_frame(header, blob)
        (size,) = _LENGTH.unpack(frame[:4])
        await self.to_worker.put((decode_header(frame[4:4 + size]), blob))

    async def receive(self) -> tuple[dict[str, Any], bytes]:
        item = await self.to_driver.get()
        if item is None:
            raise ConnectionLost(f"{self.name} closed")
        return item

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self.to_worker.put(None)
            await self.to_driver.put(None)
