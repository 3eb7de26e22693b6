"""The serial reference execution: the schedule of an asynchronous run, one command at a time
in one process, with the same components (the reference an asynchronous run is compared with).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from invar.model.core import run_complete
from invar.model.messages import (
    Event,
    LaunchRequest,
    LaunchRequests,
    LoadWeights,
    Publish,
    ReleaseVersion,
    RequestsCompleted,
    VersionPublished,
    WorkerConnected,
)
from invar.model.shell import LEARNER, STORE, TIMER, Verdict, deliver, route
from invar.model.state import State, initial_state
from invar.runtime.backend import LearnerBackend
from invar.runtime.config import TrainConfig, worker_names
from invar.runtime.interrupts import Interrupted, Signalled
from invar.runtime.journal import refuse_existing_run
from invar.runtime.learner_executor import learner_inputs
from invar.runtime.run import Run
from invar.runtime.store import publish
from invar.runtime.worker import RolloutWorker, WorkerArgs
from invar.runtime.worker_args import worker_args


def run_serial(config: TrainConfig, learner: LearnerBackend,
               journal_key: bytes | None = None) -> State:
    """The same schedule, one command at a time in FIFO order, every component in-process:
    events through `shell.deliver`, commands where `shell.route` says (nothing is lost, so
    the retry timer never fires). Like any run it journals every accepted event (with the
    state digests around it), writes a metrics row per update, shows the progress bar and
    ends with summary.json and report.md; it cannot be resumed (a serial run is a reference,
    run whole). `journal_key`: the key of the journal's chain (None: unkeyed). Under
    `signals_raise`, a SIGINT or SIGTERM closes it and raises `Interrupted`."""
    run_dir = Path(config.output.run_dir)
    refuse_existing_run(run_dir, serial=True)
    run = Run(config, learner, tensorboard=False, trackers=(), timing=False)
    run.write_config()
    run.open_files(journal_key)
    task, executor, store, stats = run.task, run.executor, run.store, run.stats
    workers: dict[str, RolloutWorker] = {}
    state = initial_state(config.protocol)
    queue: deque[Event] = deque([executor.start(state.learner.attempt + 1)])
    for name in worker_names(config.rollout.workers):
        raw = worker_args(config, name)
        workers[name] = RolloutWorker(WorkerArgs(**{**raw, "faults": tuple(raw["faults"])}))
        queue.append(WorkerConnected(name, 0))
    signalled: Signalled | None = None
    try:
        with run.showing_progress():
            while queue and not run_complete(state):
                event = queue.popleft()
                with stats.core_time():
                    before = state
                    delivery = deliver(state, event)
                    if delivery.verdict is Verdict.REFUSED:
                        raise RuntimeError(f"serial run refused an event: {delivery.error}")
                    state = delivery.state
                    if delivery.verdict is Verdict.ACCEPTED:
                        run.journal.append(stats.events, event, before, state,
                                           sync=delivery.durable)
                        stats.events += 1
                        run.record(event, before, state)
                    else:
                        stats.noops += 1
                launches: dict[str, list[LaunchRequest]] = {}  # one worker call each, as a frame
                for command in delivery.commands:
                    where = route(command)
                    if where == LEARNER:
                        reply = executor.execute(command, learner_inputs(state, task, command))
                        if reply is not None:
                            queue.append(reply)
                    elif where == STORE:
                        if isinstance(command, Publish):
                            published = publish(learner, store, command.version)
                            queue.append(VersionPublished(command.version, published))
                        elif isinstance(command, ReleaseVersion):
                            store.delete(command.version)
                    elif where == TIMER:
                        pass  # nothing is lost here: the retry timer never needs to fire
                    elif isinstance(command, LaunchRequests):
                        launches.setdefault(where, []).extend(command.launches())
                    else:
                        assert isinstance(command, LoadWeights), command  # route: the other kind
                        loaded = workers[where].load(command, *store.read(command.version))
                        if loaded is not None:
                            queue.append(loaded)
                for name, group in launches.items():
                    # Generate with the thread count a worker process uses, not the learner's.
                    with _torch_threads(config.rollout.threads):
                        completions = workers[name].launch(group)
                    if len(completions):  # one frame per call, as a worker process replies
                        run.verifier_failures.add(workers[name].verifier_failures(completions))
                        queue.append(RequestsCompleted(name, group[0].incarnation, completions))
    except Signalled as stop:  # SIGINT or SIGTERM (`signals_raise`): closed as at the end
        signalled = stop
    for worker in workers.values():
        worker.close()
    run.verifier.close()
    run.journal.close()
    if signalled is not None:
        run.metrics.close()
        raise Interrupted(signalled.signum, state.committed, config.protocol.total_updates,
                          run_dir, resumable=False)
    run.metrics.finish(stats, executor.busy_seconds, events=stats.events)
    run.metrics.close(complete=True)
    return state


@contextlib.contextmanager
def _torch_threads(threads: int) -> Iterator[None]:
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
