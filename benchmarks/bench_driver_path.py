"""Benchmark of the driver's own costs per event, outside `step`: what `Driver._apply` and
`Driver._accept_frame` spend beside the core (the target: core + driver < 2 % of wall time).

    python benchmarks/bench_driver_path.py RUN_DIR     # a real run's journal (default run)
    python benchmarks/bench_driver_path.py             # the canonical run's journal, framed

The journal's events are replayed through `shell.deliver` once, timed (`step` in a cold
process, as in the run, but alone on the machine), and once more keeping every state; then
each driver piece is timed on its own over the whole run, best of `--repeat`: learner inputs of
the learner commands (built in the learner's thread since a78edc7), the learner's replies (the
executor around a backend that answers with the journal's own log-prob arrays: the rules, the
replies built from the arrays, the cotangents padded back, each reply encoded; also in the
learner's thread), encoding the launches of
each dispatch (one frame per worker), reading each worker frame (`wire`: completions as bytes, a
load as JSON text), writing every line to a journal (a load and a learner reply as the text
they arrive as, completions encoded by the journal; without fsync), and
the state digests (each state's repr computed afresh, as in a run). Milliseconds per update are
printed per piece.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _journal(run_dir: str | None, scratch: Path) -> Path:
    if run_dir:
        return Path(run_dir) / "journal.jsonl"
    from invar.runtime import journal
    from invar.runtime.config import load_config
    from invar.testing import canonical_run, framed
    config = load_config(None, []).protocol
    path = scratch / "canonical.jsonl"
    journal.write_events(path, config, framed(canonical_run(config).events))
    return path


def _forget_reprs(values: Any) -> None:
    """Drop every repr cached on the records reachable from `values` (`state.cached_repr`)."""
    seen: set[int] = set()
    todo = list(values)
    while todo:
        value = todo.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, tuple):
            todo.extend(value)
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            value.__dict__.pop("_repr", None)
            todo.extend(value.__dict__.values())


class _ReplayBackend:
    """A learner backend that answers with the journal's own log-probs, as (n, T) float64
    arrays (what a real backend returns), and digests: whatever the executor does around the
    backend is all that is left to time. Scores are answered in journal order; forwards, steps
    and commits by their serial or version."""

    def __init__(self, entries: list[Any]) -> None:
        import numpy as np
        self.scores: list[tuple[Any, Any]] = []
        self.forwards: dict[int, tuple[str, Any]] = {}
        self.steps: dict[int, str] = {}
        self.commits: dict[int, str] = {}
        self.started = ("", 0)

        def table(matrix: Any) -> Any:
            return None if matrix is None else np.array([list(row) for row in matrix],
                                                        dtype=np.float64)

        for entry in entries:
            event = entry.event
            kind = type(event).__name__
            if kind == "LearnerStarted" and not self.started[0]:
                self.started = (event.weights_digest, event.committed_version)
            elif kind == "ProbabilitiesReported":
                self.scores.append((table(event.proximal), table(event.reference)))
            elif kind == "ForwardObserved":
                self.forwards[event.observation.serial] = (event.pre_step_digest,
                                                          table(event.current_logprobs))
            elif kind == "StepFinished":
                self.steps[event.observation.serial] = event.post_step_digest
            elif kind == "UpdateCommitted":
                self.commits[event.update + 1] = event.weights_digest
        self.next_score = 0

    def start(self) -> tuple[int, str]:
        self.next_score = 0
        return self.started[1], self.started[0]

    def score(self, inputs: Any, start: int, need_reference: bool) -> tuple[Any, Any]:
        answer = self.scores[self.next_score]
        self.next_score += 1
        return answer

    def forward(self, update: int, step: int, serial: int, inputs: Any, start: int
                ) -> tuple[str, Any]:
        return self.forwards[serial]

    def apply_cotangent(self, update: int, step: int, serial: int, pre_step_digest: str,
                        cotangent: Any) -> str:
        return self.steps[serial]

    def commit(self, version: int) -> str:
        return self.commits[version]


def _best(repeat: int, work: Callable[[], Any], setup: Callable[[], Any] | None = None) -> float:
    times = []
    for _ in range(repeat):
        if setup is not None:
            setup()
        began = time.perf_counter()
        work()
        times.append(time.perf_counter() - began)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", nargs="?")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)

    from invar.model.messages import RequestsCompleted, WeightsLoaded
    from invar.model.shell import LEARNER, deliver, route
    from invar.model.state import initial_state, state_digest
    from invar.runtime import driver as driver_module
    from invar.runtime import journal as journal_io
    from invar.runtime.config import load_config, task_section
    from invar.runtime.learner_executor import learner_inputs
    from invar.runtime.tasks import build_task
    from invar.runtime.wire import event_frame, read_event_frame

    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        path = _journal(args.run_dir, scratch)
        lines = path.read_text().splitlines()[1:]
        config, entries = journal_io.read(path)
        task = build_task(task_section(load_config(None, [])))
        state = initial_state(config)
        # (state after, commands) per accepted event, and the worker frames as received.
        dispatches = []
        frames = []
        # `step` (shell.deliver) in a cold process, keeping only the newest state, as a run
        # does (the pass below keeps them all, and the collector's walks grow with them).
        began = time.process_time()
        for entry in entries:
            state = deliver(state, entry.event).state
        first_replay = time.process_time() - began
        state = initial_state(config)
        for entry in entries:
            delivery = deliver(state, entry.event)
            state = delivery.state
            dispatches.append((state, delivery.commands))
            if isinstance(entry.event, (RequestsCompleted, WeightsLoaded)):
                frames.append(event_frame(entry.event))
        updates = max(state.committed, 1)
        learner = [(s, c) for s, cs in dispatches for c in cs if route(c) == LEARNER]
        # (LaunchRequests since 9c745ff+1, one per batch and worker; LaunchRequest before)
        launch_lists = [[c for c in cs if type(c).__name__ in ("LaunchRequest", "LaunchRequests")]
                        for _, cs in dispatches]
        launch_lists = [cs for cs in launch_lists if cs]
        states = [s for s, _ in dispatches]

        def inputs() -> None:
            from invar.runtime import learner_executor
            learner_executor._prompt.cache_clear()
            for s, command in learner:
                learner_inputs(s, task, command)

        import numpy as np

        from invar.model.messages import dumps
        from invar.runtime.learner_executor import LearnerExecutor
        from invar.runtime.metrics import MetricsLog
        # The commands the learner runs (its evaluations and checkpoints do backend work).
        replayed = [c for _, c in learner if type(c).__name__ in
                    ("ScoreProbabilities", "RunForward", "ApplyCotangent", "Commit")]
        executor = LearnerExecutor(_ReplayBackend(entries), task, np.zeros((1, 1)), scratch,
                                   MetricsLog(scratch, None, tensorboard=False))
        no_tokens = np.zeros((1, 1), dtype=np.int64)  # the replay backend reads none

        def replies() -> None:
            executor.start(0)
            for command in replayed:
                reply = executor.execute(command, no_tokens)
                if reply is not None:
                    dumps(reply)
                # A refusal would time a broken replay, not the learner's work.
                assert executor.last_decision != "refuse", command

        def launches() -> None:
            for commands in launch_lists:
                driver_module.launch_frames(commands)

        def decode() -> None:
            for header, blob in frames:
                read_event_frame(header, blob)

        def append() -> None:
            writer = journal_io.Journal(scratch / "bench.jsonl", config)
            for seq, (line, entry) in enumerate(zip(lines, entries)):
                # A load arrives as its text and a learner reply as the learner's thread
                # encoded it: the journal writes that text behind the head. Completions
                # arrive as bytes (`wire`): the journal encodes them when it writes.
                encoded = (None if isinstance(entry.event, RequestsCompleted)
                           else line[line.index('"event":') + 8:-1])
                writer.append(seq, entry.event, entry.before, entry.after, sync=False,
                              encoded=encoded)
            writer.close()
            (scratch / "bench.jsonl").unlink()

        def digests() -> None:
            for s in states:
                state_digest(s)

        pieces = {"learner_inputs": inputs, "learner replies": replies,
                  "launch encoding": launches,
                  "frame decoding": decode, "journal append (no fsync)": append,
                  "state digests": digests}
        print(f"{path}: {len(entries)} events, {updates} updates, "
              f"{len(learner)} learner commands, {len(frames)} worker frames")
        print(f"  {'step, first replay (CPU)':28s} {1e3 * first_replay / updates:7.3f} ms per "
              "update (not in the total)")
        total = 0.0
        # As in a run, each state's repr is computed once, when its digest is: the reprs a
        # previous repeat cached (on the states and the records they share) are forgotten.
        setups = {"state digests": lambda: _forget_reprs(states)}
        for name, work in pieces.items():
            seconds = _best(args.repeat, work, setups.get(name))
            total += seconds
            print(f"  {name:28s} {1e3 * seconds / updates:7.3f} ms per update")
        print(f"  {'total':28s} {1e3 * total / updates:7.3f} ms per update")
    return 0


if __name__ == "__main__":
    sys.exit(main())
