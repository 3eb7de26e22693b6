"""The serial reference execution: the schedule of an asynchronous run, one command at a time
in one process, with the same components (the reference an asynchronous run is compared with).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from invar.model import schedule
from invar.model.core import run_complete
from invar.model.messages import (
    Event,
    LaunchRequest,
    LaunchRequests,
    LearnerStarted,
    LoadWeights,
    Publish,
    ReleaseVersion,
    RequestsCompleted,
    StepFinished,
    UpdateCommitted,
    VersionEvaluated,
    VersionPublished,
    WorkerConnected,
)
from invar.model.shell import LEARNER, STORE, TIMER, Verdict, deliver, route
from invar.model.state import State, completions_of, initial_state
from invar.runtime import journal as journal_io
from invar.runtime.backend import LearnerBackend
from invar.runtime.config import TrainConfig, task_section, to_dict, worker_names
from invar.runtime.files import atomic_write
from invar.runtime.interrupts import Interrupted, Signalled
from invar.runtime.learner_executor import LearnerExecutor, learner_inputs
from invar.runtime.metrics import MetricsLog, response_terms, sampled_entropy
from invar.runtime.run_stats import Stats, VerifierFailures
from invar.runtime.store import WeightsStore, publish
from invar.runtime.tasks import build_task, heldout_count, prompt_rows
from invar.runtime.verifier import make_verifier
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
    run_dir.mkdir(parents=True, exist_ok=True)
    journal_path = run_dir / "journal.jsonl"
    if journal_path.exists() and journal_path.stat().st_size:
        raise FileExistsError(f"{run_dir} holds a run already ({journal_path.name}): a serial "
                              "run needs a new one: --set output.run_dir=runs/NEW_NAME")
    task = build_task(task_section(config))
    metrics = MetricsLog(run_dir, config, tensorboard=False)
    heldout = prompt_rows(task, "heldout", range(heldout_count(task, config.task.heldout_prompts)))
    verifier = make_verifier(task, task_section(config))
    executor = LearnerExecutor(learner, task, heldout, run_dir, metrics, verifier)
    failures = VerifierFailures()
    store = WeightsStore(run_dir / "store")
    atomic_write(run_dir / "config.json", json.dumps(to_dict(config), indent=2).encode())
    journal = journal_io.Journal(journal_path, config.protocol, journal_key,
                                 config.output.journal_keep_updates)
    stats = Stats()
    workers: dict[str, RolloutWorker] = {}
    state = initial_state(config.protocol)
    queue: deque[Event] = deque([executor.start(state.learner.attempt + 1)])
    for name in worker_names(config.rollout.workers):
        raw = worker_args(config, name)
        workers[name] = RolloutWorker(WorkerArgs(**{**raw, "faults": tuple(raw["faults"])}))
        queue.append(WorkerConnected(name, 0))
    terms: dict[int, list[dict[str, float]]] = {}
    update_started = time.perf_counter()
    signalled: Signalled | None = None
    try:
        with metrics.progress(config.protocol.total_updates, config.output.progress) as progress:
            while queue and not run_complete(state):
                event = queue.popleft()
                began = time.perf_counter()
                before_state = state
                delivery = deliver(state, event)
                if delivery.verdict is Verdict.REFUSED:
                    raise RuntimeError(f"serial run refused an event: {delivery.error}")
                state = delivery.state
                if delivery.verdict is Verdict.ACCEPTED:
                    journal.append(stats.events, event, before_state, state, sync=delivery.durable)
                    stats.events += 1
                    if isinstance(event, VersionEvaluated):
                        metrics.evaluation(event.version, event.reward)
                    elif isinstance(event, StepFinished) and \
                            before_state.learner.cotangent is not None:
                        terms.setdefault(event.observation.update, []).append(
                            before_state.learner.cotangent.terms.to_dict())
                    elif isinstance(event, (UpdateCommitted, LearnerStarted)) and \
                            state.committed > before_state.committed:
                        update_started = _serial_row(config, metrics, before_state, terms,
                                                     failures, update_started, progress,
                                                     task.response_length)
                else:
                    stats.noops += 1
                stats.core_seconds += time.perf_counter() - began
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
                        failures.add(workers[name].verifier_failures(completions))
                        queue.append(RequestsCompleted(name, group[0].incarnation, completions))
    except Signalled as stop:  # SIGINT or SIGTERM (`signals_raise`): closed as at the end
        signalled = stop
    for worker in workers.values():
        worker.close()
    verifier.close()
    journal.close()
    if signalled is not None:
        metrics.close()
        raise Interrupted(signalled.signum, state.committed, config.protocol.total_updates,
                          run_dir, resumable=False)
    metrics.finish(stats, executor.busy_seconds, events=stats.events)
    metrics.close(complete=True)
    return state


def _serial_row(config: TrainConfig, metrics: MetricsLog, before: State,
                terms: dict[int, list[dict[str, float]]], failures: VerifierFailures,
                started: float, progress: Callable[[int, float, int], None],
                response_length: int) -> float:
    """The metrics row of the update `before` commits (as the driver writes it)."""
    update = before.committed
    completions = completions_of(before.batches[0].slots)
    rewards = completions.rewards
    applied = terms.pop(update, [])
    now = time.perf_counter()
    staleness = schedule.staleness(config.protocol, update)
    metrics.update(update=update, reward=float(np.mean(rewards)), staleness=staleness,
                   terms={**{k: float(np.mean([t[k] for t in applied]))
                             for k in (applied[0] if applied else {})},
                          **response_terms(completions.tokens, response_length)},
                   seconds=now - started, refused=0, noops=0,
                   verifier=failures.take(update), entropy=sampled_entropy(completions))
    progress(update + 1, float(np.mean(rewards)), staleness)
    return now


@contextlib.contextmanager
def _torch_threads(threads: int) -> Iterator[None]:
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
