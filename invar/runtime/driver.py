"""The driver: an asyncio loop that owns the core's state and carries out its commands.

    happening -> Event -> shell.deliver(state, event) -> journal -> (fsync if durable) -> dispatch

The driver decides nothing the core or the shell decides. It turns worker frames, learner
results, process exits and timer expiries into events and delivers them with
`invar.model.shell.deliver`: an accepted event is journalled (with the state digest before and
after) and its commands are handed to the components `shell.route` names (`Driver._dispatch`);
when the delivery is `durable` they wait for a sync covering its line, and every later event's
commands wait behind them, in order (the sync runs in a thread: the loop goes on stepping
events instead of waiting on the disk). A no-op is counted, a refusal logged and counted,
neither is fatal. Rollout workers are processes behind a `Transport`, started, started again
and given up on by a `WorkerSupervisor` (`invar.runtime.supervisor`); the learner runs
in a thread of this process (`LearnerExecutor`, keeping `LearnerRules`), so rollout and
learning overlap when the schedule allows it.

A Driver is a `Run` (`invar.runtime.run`: the components and the metrics rows every run
has); the learner's commands are executed by `invar.runtime.learner_executor`, the weights
workers load kept by `invar.runtime.store`; `invar.runtime.serial.run_serial` executes the
same schedule with the same components one command at a time, in one process: the reference
an asynchronous run is compared with.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from invar.journal_format import Binding
from invar.model.core import run_complete
from invar.model.errors import Reason
from invar.model.messages import (
    Command,
    DecodeError,
    Event,
    ForwardObserved,
    LaunchRequests,
    LoadWeights,
    ProbabilitiesReported,
    Publish,
    ReleaseVersion,
    RequestsCompleted,
    TimerFired,
    VersionPublished,
    WorkerConnected,
    WorkerLost,
    dumps,
    encode,
    pack_launches,
    packed_fields,
)
from invar.model.shell import LEARNER, STORE, TIMER, Delivery, Verdict, deliver, route
from invar.model.state import State, WorkerPhase, initial_state
from invar.runtime import journal as journal_io
from invar.runtime.backend import LearnerBackend
from invar.runtime.config import TrainConfig, worker_names
from invar.runtime.faults import with_frame_faults
from invar.runtime.interrupts import STOP_SIGNALS, Interrupted
from invar.runtime.learner_executor import (
    LearnerExecutor,  # noqa: F401 (built by `Run`; callers reach it as the driver's, as before)
    LearnerInputs,
    learner_inputs,
)
from invar.runtime.registry import TRANSPORTS, resolve
from invar.runtime.retry import RetryTimer, heartbeat_seconds, launch_key, load_key
from invar.runtime.run import Run
from invar.runtime.store import heal, publish
from invar.runtime.supervisor import (
    LogTail,
    RespawnPolicy,
    SpawnWorker,
    WorkerHandle,
    WorkerSupervisor,
)
from invar.runtime.transport import (
    ConnectionLost,
    FrameError,
    Launcher,
    Transport,
)
from invar.runtime.wire import check_hello, read_event_frame, read_working_frame

log = logging.getLogger("invar.driver")

MAX_RESPAWNS = 5
"""A worker that dies this many times in a row, each incarnation without completing a request,
is not restarted again."""
RESPAWN_BACKOFF = 0.5
"""Seconds before the second respawn in a row of such a worker, doubled for each next one (and
before the second attempt to reach its host, likewise)."""
RECONNECT_BACKOFF_MAX = 10.0
"""The longest wait between two attempts to reach a worker's host (SSH)."""
YOUNG_GENERATION = 10_000
"""The collector's first threshold while a run goes (allocations less deallocations of tracked
objects between young collections; CPython's default is 700)."""


class Driver(Run):
    """One run (or its resumption) in one process.

    `learner`: a backend (`TorchLearner`, `MLXLearner`, or a fake: any `LearnerBackend`);
    `spawn_worker(name, incarnation)`: a connected `Transport` to a new worker (default:
    `launcher.spawn`, rollout.transport's); `learner_inputs`: what the backend gets beside
    each learner command;
    `journal_key`: the key of the journal's chain (`journal.read_key`; None: unkeyed).
    `stop_on_signals`: SIGINT and SIGTERM stop the run cleanly (`run` raises `Interrupted`;
    the command line's choice: a library caller keeps its own handlers).
    """

    def __init__(self, config: TrainConfig, learner: LearnerBackend,
                 spawn_worker: SpawnWorker | None = None, resume: bool = False,
                 learner_inputs: LearnerInputs = learner_inputs,
                 restored: tuple[Any, State, int] | None = None,
                 binding: Binding | None = None,
                 journal_key: bytes | None = None,
                 stop_on_signals: bool = False) -> None:
        super().__init__(config, learner, tensorboard=config.output.tensorboard,
                         trackers=config.output.trackers, timing=True)
        self.metrics.deferred = True  # written out with each journal sync (`_sync`)
        self.metrics.stats = self.stats  # its counts are recorded with the rows
        # The transport's module (asyncssh for "ssh") is imported only when asked for.
        self.launcher: Launcher = resolve(TRANSPORTS[config.rollout.transport].launcher)(config)
        self.spawn_worker = spawn_worker or self.launcher.spawn
        self.learner_inputs = learner_inputs
        self.events: asyncio.Queue[Event | _Crash] = asyncio.Queue()
        self.learner_queue: asyncio.Queue[tuple[Command, State]] = asyncio.Queue()
        self.supervisor = WorkerSupervisor(
            worker_names(config.rollout.workers), self._launch, serve=self._serve_worker,
            died=self._worker_died, before_respawn=self._heal_store,
            none_left=self._no_worker_left, run_dir=self.run_dir,
            policy=RespawnPolicy(respawn=config.rollout.respawn, max_respawns=MAX_RESPAWNS,
                                 backoff=RESPAWN_BACKOFF,
                                 reconnect_backoff_max=RECONNECT_BACKOFF_MAX,
                                 reconnect_seconds=config.rollout.ssh.reconnect_seconds))
        self.resume = resume
        self.restored = restored
        """`journal.restore` of the run's journal, when the caller checked it before (resume)."""
        self.binding = binding
        """What the journal binds (`journal_format.Binding`), given with `restored`."""
        self.journal_key = journal_key
        self.seq = 0
        self._timer_armed = False
        self.retry = RetryTimer(config.output.retry_seconds, time.perf_counter())
        self._tasks: set[asyncio.Task] = set()
        self._stopping = False
        self._stop_on_signals = stop_on_signals
        self._signalled: int | None = None
        """The first stop signal received, if any."""
        self._journal_text_counted = 0.0
        """The journal's `text_seconds` already counted in `stats.core_seconds`."""
        self._received: dict[int, str] = {}
        """A worker event's JSON text as received, by the event's id, until it is journalled."""
        self._deleting: dict[int, asyncio.Future[None]] = {}
        """Store deletions of released versions, running in a thread, by version."""
        self._held: deque[_Held] = deque()
        """Commands waiting for a journal sync (their own, or an earlier event's), in order."""
        self._syncing: asyncio.Future[None] | None = None
        self._synced = -1
        """The newest journal line a finished sync covers."""
        self._releasing = -1
        """The seq of the event whose commands are being dispatched."""
        self.state: State = initial_state(config.protocol)

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> State:
        """Run to completion; with `stop_on_signals`, a SIGINT or SIGTERM ends the workers,
        syncs the journal and raises `Interrupted` (the run stays resumable)."""
        loop = asyncio.get_running_loop()
        running = asyncio.current_task()
        assert running is not None
        handled = STOP_SIGNALS if self._stop_on_signals else ()
        for signum in handled:
            loop.add_signal_handler(signum, self._on_signal, signum, running)
        try:
            return await self._run()
        except asyncio.CancelledError:
            if self._signalled is None:
                raise
            running.uncancel()
            raise Interrupted(self._signalled, self.state.committed,
                              self.config.protocol.total_updates, self.run_dir) from None
        finally:
            for signum in handled:
                loop.remove_signal_handler(signum)

    def _on_signal(self, signum: int, running: asyncio.Task[State]) -> None:
        """The first stop signal cancels the run at its next wait (the event path is never
        cut in the middle of an event): `_run`'s cleanup ends the workers and syncs the
        journal. A second one, while that cleanup waits, ends the process at once: the run
        is left as a crash leaves it, still resumable."""
        if self._signalled is not None:
            print(f"invar: interrupted again: stopping at once; resume with: invar train "
                  f"--resume {self.run_dir}", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        self._signalled = signum
        # Said now: ending the update in progress and the workers may take a while (tens of
        # seconds on a real model), and a silent wait reads as a hang.
        print("invar: stopping: ending the update in progress and the workers (interrupt "
              "again to stop at once; the run stays resumable)", file=sys.stderr, flush=True)
        if not self._stopping:  # a run already shutting down finishes doing so
            running.cancel()

    async def _run(self) -> State:
        journal_path = self.run_dir / journal_io.JOURNAL
        if self.resume:
            if self.restored is None or self.binding is None:
                contents = journal_io.read_contents(journal_path, self.journal_key, "last")
                self.restored = journal_io.replayed(journal_path, contents)
                self.binding = contents.binding
            protocol, self.state, self.seq = self.restored
            if protocol != self.config.protocol:
                raise ResumeError(f"{journal_path} was written for protocol {protocol}, not "
                                  f"{self.config.protocol}: a run cannot change its protocol")
            # Metrics rows of what the journal holds (one written just before the crash is
            # written again when its update is redone).
            self.metrics.resume_at(self.state.committed, self.state.evaluated)
            if run_complete(self.state):
                # Nothing to do: leave the finished run's files (summary, report) as they are
                # (written now only if the driver died between the last event and writing them).
                log.info("%s: the run is complete, nothing to resume", self.run_dir)
                if not (self.run_dir / "summary.json").exists():
                    self.metrics.finish(self.stats, 0.0, events=self.seq)
                self.metrics.close(complete=True)
                return self.state
        else:
            journal_io.refuse_existing_run(self.run_dir)
        if self.spawn_worker == self.launcher.spawn:
            # Every host reachable, verified, accepting our key and able to run a worker, or
            # the run does not start: a TransportRefused naming the host (no fallback to local).
            await self.launcher.check()
        if not self.resume:
            self.write_config()
        self.open_files(self.journal_key)
        if self.resume:
            self.journal.sync()  # what the run is resumed from is durable before anything goes out
        self._synced = self.seq - 1
        self._spawn_task(self._learner_loop())
        thresholds = gc.get_threshold()
        try:
            # While the learner starts, the metrics' imports are done off the event path.
            started, _ = await asyncio.gather(
                asyncio.to_thread(self.executor.start, self.state.learner.attempt + 1),
                asyncio.to_thread(self.metrics.prepare))
            # Everything built so far (torch, the model, the task) lives until the run ends:
            # moved out of the collector's sight, so the collections that the event path's
            # allocations trigger do not walk it again and again.
            gc.freeze()
            # The event path makes thousands of short-lived, acyclic values per update (states,
            # samples, launch columns): in a young generation this large most die before a
            # collection would walk them, and the older generations' collections, which walk
            # the survivors again, become rarer in proportion (at the default, 700, a young
            # collection ran ~8 times per update).
            gc.set_threshold(YOUNG_GENERATION, *thresholds[1:])
            check = deliver(self.state, started)
            if check.verdict is not Verdict.ACCEPTED:
                # The learner's newest commit is not the one the journal leads to: no event can
                # fix that, and waiting would hang the run.
                raise ResumeError(f"{self.run_dir}: the learner restored version "
                                  f"{started.committed_version}, which the journal does not "
                                  f"accept: {check.error or check.verdict.value}")
            self.events.put_nowait(started)
            if self.resume:
                # Accepted: only now may the resumed run record its (operational) settings: in
                # the journal, then in config.json (its copy).
                self.record_settings(self.binding)
                self.write_config()
                # A store file damaged while the driver was down would be refused by every
                # worker sent it: published again from its commit before any worker starts.
                await self._heal_store()
                # Whatever was in flight when the driver died is re-sent (a no-op if nothing).
                self.events.put_nowait(TimerFired())
                # Workers the journal knows but the configuration no longer has (the run was
                # resumed with fewer workers) are lost: their requests go to the others.
                configured = set(worker_names(self.config.rollout.workers))
                for known in self.state.workers:
                    if known.name not in configured and known.phase is not WorkerPhase.LOST:
                        self.events.put_nowait(WorkerLost(known.name, known.incarnation))
            # Accepted: the metrics files are opened now, not by the first row on the event path.
            await asyncio.to_thread(self.metrics.open)
            self._spawn_task(self._watchdog())
            for name in worker_names(self.config.rollout.workers):
                previous = self.state.worker(name)
                self._spawn_task(self.supervisor.supervise(
                    name, 0 if previous is None else previous.incarnation + 1))
            with self.showing_progress():
                # Complete includes the final evaluation and checkpoint, acknowledged.
                while not run_complete(self.state):
                    event = await self.events.get()
                    self._apply(event)
                if self._syncing is not None:
                    await self._syncing  # the last commands (a release) are carried out
        finally:
            gc.unfreeze()  # a process that goes on (tests, notebooks) gets its objects back
            gc.set_threshold(*thresholds)
            await self._shutdown()
        self.metrics.finish(self.stats, self.executor.busy_seconds, events=self.seq)
        return self.state

    async def _shutdown(self) -> None:
        self._stopping = True
        self.supervisor.stop()
        if self._syncing is not None:  # a sync in flight finishes before the journal closes
            await asyncio.gather(self._syncing, return_exceptions=True)
        await self.supervisor.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # Released versions are gone from the store when the run returns (a failure is
        # logged by `_log_failed_deletion`).
        deleting, self._deleting = list(self._deleting.values()), {}
        await asyncio.gather(*deleting, return_exceptions=True)
        self.metrics.write_out()  # rows before the journal lines, as in `_sync`
        self.journal.close()
        self._count_journal_text()
        self.metrics.close(complete=run_complete(self.state))
        self.verifier.close()

    def _spawn_task(self, coroutine: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and not self._stopping:
            log.error("driver task failed", exc_info=task.exception())
            self.events.put_nowait(_Crash(task.exception()))  # type: ignore[arg-type]

    # -- the event path ----------------------------------------------------------------------

    def _apply(self, event: Event | _Crash) -> None:
        if isinstance(event, _Crash):
            if isinstance(event.error, (RunStopped, ReleaseNotDurable)):
                raise event.error
            raise RuntimeError("a driver task failed") from event.error
        with self.stats.core_time():
            # Popped first, while `event` is alive: its id cannot have been reused.
            encoded = self._received.pop(id(event), None)
            delivery = deliver(self.state, event)
            if delivery.verdict is Verdict.REFUSED:
                assert delivery.error is not None
                self.stats.refused += 1
                self.metrics.count(f"refused_{delivery.error.reason.value}")
                log.warning("%s", delivery.error)
                if _repeats(event, delivery.error.reason):
                    # Re-sending the forward would bring the same log-probs back: a stall.
                    detail = delivery.error.detail if delivery.error.reason is Reason.DIVERGED \
                        else f"the learner's log-probs are refused ({delivery.error.detail})"
                    raise RunStopped(
                        f"the policy diverged: {detail}; the run stops at update "
                        f"{self.state.committed} of {self.config.protocol.total_updates} and "
                        f"can be resumed from its last commit (version {self.state.committed}) "
                        f"with `invar train --resume {self.run_dir}`")
            elif delivery.verdict is Verdict.NOOP:
                self.stats.noops += 1
                self.state = delivery.state  # keeps the no-op counts
            else:
                self._accept(event, delivery, encoded)

    def _accept(self, event: Event, delivery: Delivery, encoded: str | None) -> None:
        """Journal an accepted event (synced when the delivery is durable), then dispatch."""
        before_state, after_state = self.state, delivery.state
        # Metrics rows go first (kept, then written before the journal's lines by `_sync`): a
        # crash right after the journal line must not lose them (a row whose event the
        # journal missed is written again, and replaced, on resume).
        self.record(event, before_state, after_state)
        seq = self.seq
        # The journal digests the states when it writes the line, in the thread that syncs.
        self.journal.append(seq, event, before_state, after_state, sync=False, encoded=encoded)
        self.seq += 1
        self.stats.events += 1
        self.state = after_state
        if not isinstance(event, TimerFired):
            self.retry.progress(time.perf_counter())
        if delivery.durable or self._held:
            # Commands wait for the sync that makes their line durable, and any command
            # issued after them waits behind them (dispatch keeps the order of events); the
            # loop goes on taking events meanwhile instead of waiting on the disk.
            self._held.append(_Held(seq, delivery.durable, delivery.commands, after_state))
            if delivery.durable and self._syncing is None:
                self._syncing = asyncio.ensure_future(self._sync_and_release())
                self._syncing.add_done_callback(self._task_done)
        else:
            self._releasing = seq
            self._dispatch(delivery.commands, after_state)

    async def _sync_and_release(self) -> None:
        """Sync the journal and dispatch the held commands its sync covers, in order, until
        none is held. One sync covers every line written before it starts, so a burst of
        durable deliveries shares syncs. The journal's snapshots of the update boundaries a
        sync made durable are written once the commands it released are out."""
        try:
            while self._held or self.journal.snapshots_due:
                if any(held.durable and held.seq > self._synced for held in self._held):
                    covered = self.seq - 1
                    self.stats.core_cpu_seconds += await asyncio.to_thread(self._sync)
                    self._count_journal_text()
                    self._synced = covered
                if self._stopping:
                    return  # a run that stops sends nothing more (a resume re-sends it)
                with self.stats.core_time():
                    while self._held and not (self._held[0].durable
                                              and self._held[0].seq > self._synced):
                        held = self._held.popleft()
                        self._releasing = held.seq
                        self._dispatch(held.commands, held.state)
                if self.journal.snapshots_due:
                    self.stats.core_cpu_seconds += await asyncio.to_thread(
                        self._write_snapshots)
        finally:
            self._syncing = None

    def _count_journal_text(self) -> None:
        """The journal's text written since the last count, as the event path's time: encoding
        an event for its line is the driver's work wherever it runs (here, in the thread that
        syncs), so the core + driver share counts it as before."""
        written = self.journal.text_seconds
        self.stats.core_seconds += written - self._journal_text_counted
        self._journal_text_counted = written

    def _sync(self) -> float:
        """In a thread: the metrics rows kept so far, then the journal's lines and its fsync
        (rows first: a crash must not lose the row of a journalled event). Returns the CPU
        seconds it took (the driver's)."""
        began = time.thread_time()
        self.metrics.write_out()
        self.journal.sync()
        return time.thread_time() - began

    def _write_snapshots(self) -> float:
        """In a thread: the journal's snapshots and pruning (`Journal.write_snapshots`).
        Returns the CPU seconds it took (the driver's)."""
        began = time.thread_time()
        self.journal.write_snapshots()
        return time.thread_time() - began

    def _dispatch(self, commands: tuple[Command, ...], state: State) -> None:
        """The one place where commands meet the world: each goes where `shell.route` says.
        `state`: the state the commands were issued in."""
        launches: list[LaunchRequests] = []
        self.retry.sent(commands, time.perf_counter())
        for command in commands:
            where = route(command)
            if where == LEARNER:
                self.retry.in_process_started()
                # The state the command was issued in: its inputs are built from it by the
                # learner's thread (data preparation is the learner's work, as on a learner
                # host; states are immutable, so reading one there is safe).
                self.learner_queue.put_nowait((command, state))
            elif where == STORE:
                self._to_store(command)
            elif where == TIMER:
                self._timer_armed = True
            elif isinstance(command, LaunchRequests):  # to worker `where`, in one frame
                launches.append(command)
            else:
                assert isinstance(command, LoadWeights), command  # route: the one other kind
                self._send_load(command)
        if launches:
            for (name, incarnation), header in launch_frames(launches).items():
                handle = self.supervisor.current(name, incarnation)
                if handle is not None:
                    self._spawn_task(self._send(handle, header))

    def _to_store(self, command: Command) -> None:
        if isinstance(command, Publish):
            self.retry.in_process_started()
            self._spawn_task(self._publish(command))
        elif isinstance(command, ReleaseVersion):
            # Deleted only once the release is durable: a driver restarted from a journal
            # without it would still need the version. The delivery was durable, so its
            # commands waited for a sync covering the line; the check keeps that explicit.
            if self._synced < self._releasing:
                raise ReleaseNotDurable(f"release of version {command.version} before its "
                                        f"journal line {self._releasing} is durable")
            # The unlinks run off the event loop (on a busy disk they cost milliseconds); a
            # later publication of the version, and the shutdown, wait for them.
            deleting = asyncio.get_running_loop().run_in_executor(None, self.store.delete,
                                                                  command.version)
            deleting.add_done_callback(_log_failed_deletion)
            self._deleting = {v: f for v, f in self._deleting.items() if not f.done()}
            self._deleting[command.version] = deleting
        # RetainVersion: the store keeps what Publish wrote until ReleaseVersion.

    async def _watchdog(self) -> None:
        """The core's retry timer, armed by `SetTimer`: it fires once something the core awaits
        has shown no sign of life for the timeout (`invar.runtime.retry`), so a slow but
        healthy step is not re-sent and a lost message is."""
        while True:
            await asyncio.sleep(heartbeat_seconds(self.config.output.retry_seconds))
            if self._timer_armed and self.retry.due(self.state, time.perf_counter()):
                self._timer_armed = False
                self.retry.fired()
                self.events.put_nowait(TimerFired())

    # -- learner -----------------------------------------------------------------------------

    async def _learner_loop(self) -> None:
        while True:
            command, state = await self.learner_queue.get()
            try:
                answer = await asyncio.to_thread(self._execute, command, state)
            finally:
                self.learner_queue.task_done()
                self.retry.in_process_finished(time.perf_counter())
            if answer is not None:
                reply, encoded = answer
                if encoded is not None:
                    # Journalled as encoded in the learner's thread, as a worker's event is
                    # journalled as the worker encoded it.
                    self._received[id(reply)] = encoded
                self.events.put_nowait(reply)

    def _execute(self, command: Command, state: State) -> tuple[Event, str | None] | None:
        """In the learner's thread: the command's inputs, the command, and its reply's
        journal encoding (None for a reply with payloads: the journal stores those apart)."""
        reply = self.executor.execute(command, self.learner_inputs(state, self.task, command))
        if reply is None:
            return None
        return reply, None if packed_fields(type(reply)) else dumps(reply)

    async def _publish(self, command: Publish) -> None:
        try:
            deleting = self._deleting.pop(command.version, None)
            if deleting is not None:
                await deleting
            digest = await asyncio.to_thread(publish, self.learner, self.store, command.version)
        finally:
            self.retry.in_process_finished(time.perf_counter())
        self.events.put_nowait(VersionPublished(command.version, digest))

    # -- workers -----------------------------------------------------------------------------

    async def _launch(self, name: str, incarnation: int) -> Transport:
        """A new incarnation of `name` (`spawn_worker`), with the protocol-level faults of
        rollout.frame_faults whatever the transport (off: unwrapped)."""
        transport = await self.spawn_worker(name, incarnation)
        return with_frame_faults(transport, self.config.rollout.frame_faults, incarnation,
                                 self.metrics.count)

    async def _serve_worker(self, handle: WorkerHandle) -> bool:
        """Read one incarnation's frames until its connection ends; True if it completed a
        request."""
        name, incarnation, transport = handle.name, handle.incarnation, handle.transport
        completed = self.stats.completed_by.get(name, 0)
        try:
            header, _ = await transport.receive()
            # A worker of another version is refused, not respawned into the same mismatch
            # forever (MAX_RESPAWNS applies).
            check_hello(name, header)
            handle.connected = True
            self.events.put_nowait(WorkerConnected(name, incarnation))
            while True:
                try:
                    header, blob = await transport.receive()
                    if header.get("kind") == "working":
                        self._heard(name, incarnation, header)
                    else:
                        self._accept_frame(name, header, blob)
                except (FrameError, DecodeError, KeyError, TypeError) as error:
                    self.stats.malformed_frames += 1
                    self.metrics.count("malformed_frames")
                    log.warning("malformed frame from %s#%d: %s", name, incarnation, error)
        except (ConnectionLost, FrameError) as error:
            if not self._stopping:
                log.warning("worker %s#%d lost: %s", name, incarnation, error)
        return self.stats.completed_by.get(name, 0) > completed

    def _worker_died(self, name: str, incarnation: int, connected: bool) -> None:
        self.stats.worker_deaths += 1
        self.metrics.count("worker_deaths")
        if connected:
            # Only an incarnation the core saw connect can be lost (a connection that
            # failed before its hello is just a failed attempt).
            self.events.put_nowait(WorkerLost(name, incarnation))

    async def _heal_store(self) -> None:
        """Publish again the kept versions whose store files are damaged (`store.heal`): a
        worker sent one refuses it, and dies."""
        await asyncio.to_thread(heal, self.learner, self.store, self.state.retained)

    def _no_worker_left(self, name: str, why: str, tail: LogTail | None) -> None:
        """The last worker was given up: the run stops (it stays resumable: the journal and the
        commits are as a crash would leave them)."""
        where = f"; last lines of {tail.path}:\n{tail.lines}" if tail else ""
        self.events.put_nowait(_Crash(RunStopped(
            f"no rollout worker can serve: {name} died and is not restarted ({why}); the "
            f"run stops at update {self.state.committed} of "
            f"{self.config.protocol.total_updates} and can be resumed with "
            f"`invar train --resume {self.run_dir}`{where}")))

    def _heard(self, name: str, incarnation: int, header: dict[str, Any]) -> None:
        """A worker's `working` frame: what it names is alive (`RetryTimer.heard`)."""
        requests, loads = read_working_frame(header)
        self.retry.heard([*(launch_key(name, incarnation, r) for r in requests),
                          *(load_key(name, incarnation, k) for k in loads)],
                         time.perf_counter())

    def _accept_frame(self, name: str, header: dict[str, Any], blob: bytes) -> None:
        """A worker's event, as `wire.read_event_frame` reads it: a load's JSON text is
        journalled as received; completions, which came as bytes, are encoded for the journal
        by its writer (`Journal.sync`), off the event path."""
        with self.stats.core_time():
            self._decode_frame(name, header, blob)

    def _decode_frame(self, name: str, header: dict[str, Any], blob: bytes) -> None:
        # Worker-reported compute time and the samples it went into (rollout time R per batch).
        self.stats.rollout_seconds += float(header.get("compute_seconds", 0.0))
        self.stats.rollout_generated += int(header.get("generated", 0))
        self.stats.load_seconds += float(header.get("load_seconds", 0.0))
        event, raw = read_event_frame(header, blob)
        if isinstance(event, RequestsCompleted):
            self.verifier_failures.add(header)
            done = len(event.completions)
            self.stats.completed_by[name] = self.stats.completed_by.get(name, 0) + done
            if "compute_seconds" in header:
                self.stats.rollout_replies += done
        if raw is not None:  # the journal writes the event as received, not encoded again
            self._received[id(event)] = raw
        self.events.put_nowait(event)

    async def _send(self, handle: WorkerHandle, header: dict[str, Any], blob: bytes = b"") -> None:
        try:
            await handle.transport.send(header, blob)
        except ConnectionLost:
            pass  # its reader notices and reports WorkerLost

    def _send_load(self, command: LoadWeights) -> None:
        """Read the weights from the store now, at dispatch, and send them with the load: a
        release that follows cannot take them away from a load already sent (and sends keep
        the order of dispatch, so a worker sees its loads in serial order)."""
        handle = self.supervisor.current(command.worker, command.incarnation)
        if handle is None:
            return
        blob, params_digest = self.store.read(command.version)
        self._spawn_task(self._send(handle, {"kind": "command", "message": encode(command),
                                             "params_digest": params_digest}, blob))


def _log_failed_deletion(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("a released version could not be deleted from the store",
                  exc_info=future.exception())


def launch_frames(launches: list[LaunchRequests]) -> dict[tuple[str, int], dict[str, Any]]:
    """The frame each worker incarnation gets for `launches` (one dispatch's, in order): its
    launches as columns (`pack_launches`), one frame however many commands."""
    by_worker: dict[tuple[str, int], list[LaunchRequests]] = {}
    for command in launches:
        by_worker.setdefault((command.worker, command.incarnation), []).append(command)
    return {key: {"kind": "launches", "launches": pack_launches(commands)}
            for key, commands in by_worker.items()}


class ResumeError(RuntimeError):
    """The run directory's commits and journal disagree: the run cannot continue from them."""


def _repeats(event: Event, reason: Reason) -> bool:
    """True when the learner would answer a re-sent command with the same refused event: its
    objective overflowed, or its log-probs are no log-probabilities (weights no longer finite:
    the learner runs in this process, so nothing on the way damaged them)."""
    return reason is Reason.DIVERGED or (
        reason is Reason.MALFORMED_PAYLOAD
        and isinstance(event, (ForwardObserved, ProbabilitiesReported)))


class RunStopped(RuntimeError):
    """The run cannot go on (no worker can serve); it stays resumable."""


class ReleaseNotDurable(RuntimeError):
    """A version's release was about to be carried out before its journal line was synced:
    the driver stops rather than delete weights a restart may need."""


@dataclass
class _Crash:
    error: BaseException


@dataclass(frozen=True)
class _Held:
    """An accepted event's commands, waiting for a journal sync."""

    seq: int
    durable: bool
    commands: tuple[Command, ...]
    state: State


def pin_current_process(cpus: tuple[int, ...]) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)
