"""The core's state at an update boundary, as a snapshot file, and the ledger's records: what
a journal whose oldest payloads were pruned is resumed and validated from.

A snapshot (`journal.d/snapshot-000012.json`: the state right after the line that committed
update 11, the start of update 12) is JSON: the state's fields, its samples as rows of reply
frames that it names by their payloads' references (the frames stay in their segments), and
how many records of the ledger file (`journal.d/ledger.jsonl`, one `Consumption` a line) it
holds. Reading one builds the state anew from what it holds and recomputes everything a
state keeps behind a digest: each sample's digest from its frame's content (and its version
from the frame), each batch's summary from its slots, the ledger's chain from its records,
each history's chain from its items. The reader then requires the state's digest to be the one
the journal recorded at the snapshot's line, so a snapshot, a frame or a ledger record changed
after it was written is refused; only the state's no-op counts (outside every digest and
every decision) are taken as written. JSON is read into the state's own types field by field,
never unpickled.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from invar.journal_format.errors import SnapshotError
from invar.model.completions import Completions
from invar.model.config import RunConfig
from invar.model.core import sample_digests
from invar.model.messages import parse_json
from invar.model.state import (
    AppliedStep,
    Assigned,
    BatchRequests,
    BatchState,
    Consumption,
    History,
    JoinedDigests,
    LearnerPhase,
    LearnerState,
    NoOps,
    Positions,
    Sample,
    Slot,
    State,
    WorkerPhase,
    WorkerState,
    chain_ledger,
    sample_of,
)

SNAPSHOT_FORMAT = 1
LEDGER_FILE = "ledger.jsonl"

FrameReference = tuple[int, str]
"""A reply frame's payload: (segment, digest)."""


def snapshot_path(directory: Path, update: int) -> Path:
    """The snapshot at the start of update `update`."""
    return directory / f"snapshot-{update:06d}.json"


def snapshot_update(path: Path) -> int | None:
    """The update whose start `path` is the snapshot of (None: not a snapshot's name)."""
    name = path.name
    if name.startswith("snapshot-") and name.endswith(".json") and name[9:-5].isdigit():
        return int(name[9:-5])
    return None


def at_boundary(state: State) -> bool:
    """Whether `state` is one a snapshot holds: no update in progress in the learner (a commit
    just accepted: its scores, forwards and steps are gone)."""
    learner = state.learner
    return (learner.scores is None and learner.cotangent is None and not learner.applied
            and not learner.positions and learner.observation is None and learner.step == 0
            and learner.forward_digest == "")


def snapshot_document(state: State, seq: int,
                      frame_reference: Callable[[Completions], FrameReference]
                      ) -> dict[str, Any]:
    """The snapshot of `state`, the state after journal entry `seq`, at an update boundary
    (`at_boundary`); `frame_reference(frame)`: where a reply frame the state's samples are
    rows of lies."""
    if not at_boundary(state):
        raise ValueError("a snapshot is taken at an update boundary, not with an update in "
                         "progress")
    frames: dict[int, int] = {}
    references: list[list[Any]] = []

    def slot(value: Slot) -> Any:
        if value is None:
            return None
        if isinstance(value, Assigned):
            return [value.worker, value.incarnation]
        index = frames.get(id(value.frame))
        if index is None:
            index = frames[id(value.frame)] = len(references)
            references.append(list(frame_reference(value.frame)))
        return [index, value.row]

    learner = state.learner
    return {
        "snapshot": SNAPSHOT_FORMAT,
        "seq": seq,
        "committed": state.committed,
        "learner": {"attempt": learner.attempt, "phase": learner.phase.value,
                    "step_digest": learner.step_digest, "observations": learner.observations},
        "workers": [[w.name, w.incarnation, w.phase.value, w.version, w.load, w.assigned]
                    for w in state.workers],
        "admitted": state.admitted,
        "batches": [{"batch": b.batch, "slots": [slot(s) for s in b.slots]}
                    for b in state.batches],
        "commit_digests": list(state.commit_digests),
        "published": list(state.published),
        "publishing": state.publishing,
        "retained": list(state.retained),
        "ledger": len(state.ledger),
        "timer_armed": state.timer_armed,
        "evaluated": list(state.evaluated),
        "checkpointed": list(state.checkpointed),
        "noops": [state.noops.duplicates, state.noops.late, state.noops.divergent],
        "frames": references,
    }


def ledger_line(record: Consumption) -> str:
    """A ledger record as a line of the ledger file (without its newline)."""
    requests = record.requests
    if not isinstance(requests, BatchRequests) or not isinstance(record.sample_digests,
                                                                 JoinedDigests):
        raise ValueError("a ledger record of a whole batch, as the core makes them")
    return json.dumps({
        "update": record.update,
        "requests": [requests.batch, requests.prompts_per_batch, requests.group_size],
        "sample_versions": list(record.sample_versions),
        "sample_digests": record.sample_digests.joined,
        "scores_digest": record.scores_digest,
        "steps": [[s.step, list(s.positions), s.forward_digest, s.post_step_digest]
                  for s in record.steps],
        "commit_digest": record.commit_digest,
    }, separators=(",", ":"))


def ledger_record(text: str, where: str) -> Consumption:
    """`ledger_line`'s record back; a SnapshotError names `where`."""
    try:
        data = parse_json(text)
    except ValueError as error:
        raise SnapshotError(f"{where}: not a ledger record: {error}") from None
    fields = _Fields(data, where)
    batch, prompts, group = fields.integers("requests", 3)
    steps = []
    for index, step in enumerate(fields.items("steps")):
        at = f"{where}: steps[{index}]"
        number, positions, forward, post = _list(step, at, 4)
        steps.append(AppliedStep(_int(number, at), Positions(_ints(_list(positions, at), at)),
                                 _str(forward, at), _str(post, at)))
    digests = fields.text("sample_digests")
    return Consumption(
        update=fields.integer("update"),
        requests=BatchRequests(batch, prompts, group),
        sample_versions=fields.integers("sample_versions"),
        sample_digests=JoinedDigests.of(digests.split(",") if digests else ()),
        scores_digest=fields.text("scores_digest"),
        steps=tuple(steps),
        commit_digest=fields.text("commit_digest"),
    )


def snapshot_state(data: Any, config: RunConfig, ledger: Sequence[Consumption],
                   frame: Callable[[FrameReference], Completions], where: str) -> State:
    """The state a snapshot document holds, everything behind a digest recomputed (module
    doc): `ledger` the ledger file's records (at least as many as the snapshot holds),
    `frame(reference)` the reply frame a reference names. A SnapshotError names `where`."""
    fields = _Fields(data, where)
    if fields.integer("snapshot") != SNAPSHOT_FORMAT:
        raise SnapshotError(f"{where}: snapshot format {data['snapshot']!r}; this version of "
                            f"invar reads format {SNAPSHOT_FORMAT}")
    frames = [frame(_reference(item, f"{where}: frames[{i}]"))
              for i, item in enumerate(fields.items("frames"))]
    digests: dict[int, list[str]] = {}
    learner = _Fields(fields.get("learner"), f"{where}: learner")
    workers = []
    for index, item in enumerate(fields.items("workers")):
        at = f"{where}: workers[{index}]"
        name, incarnation, phase, version, load, assigned = _list(item, at, 6)
        workers.append(WorkerState(_str(name, at), _int(incarnation, at),
                                   _phase(WorkerPhase, phase, at),
                                   None if version is None else _int(version, at),
                                   _int(load, at), _int(assigned, at)))
    batches = []
    for index, item in enumerate(fields.items("batches")):
        batch = _Fields(item, f"{where}: batches[{index}]")
        number = batch.integer("batch")
        slots = batch.items("slots")
        if len(slots) != config.samples_per_batch:
            raise SnapshotError(f"{batch.where}: {len(slots)} slots, a batch has "
                                f"{config.samples_per_batch}")
        changes: dict[int, Slot] = {}
        for position, value in enumerate(slots):
            if value is not None:
                changes[position] = _slot(value, number, position, config, frames, digests,
                                          f"{batch.where}.slots[{position}]")
        batches.append(BatchState.admitted(number, len(slots)).with_slots(changes))
    held = fields.integer("ledger")
    if not 0 <= held <= len(ledger):
        raise SnapshotError(f"{where}: holds {held} ledger records, the ledger file "
                            f"{len(ledger)}")
    records = tuple(ledger[:held])
    ledger_digest = ""
    for record in records:
        ledger_digest = chain_ledger(ledger_digest, record)
    publishing = fields.get("publishing")
    noops = fields.integers("noops", 3)
    return State(
        config=config,
        learner=LearnerState(attempt=learner.integer("attempt"),
                             phase=_phase(LearnerPhase, learner.get("phase"), learner.where),
                             step=0, observation=None, step_digest=learner.text("step_digest"),
                             scores=None, observations=learner.integer("observations")),
        workers=tuple(workers),
        admitted=fields.integer("admitted"),
        batches=tuple(batches),
        commit_digests=History(_strs(fields.items("commit_digests"),
                                     f"{where}: commit_digests")),
        published=History(fields.integers("published")),
        publishing=None if publishing is None else _int(publishing, f"{where}: publishing"),
        retained=fields.integers("retained"),
        ledger=records,
        ledger_digest=ledger_digest,
        timer_armed=fields.flag("timer_armed"),
        evaluated=History(fields.integers("evaluated")),
        checkpointed=History(fields.integers("checkpointed")),
        noops=NoOps(*noops),
    )


def _slot(value: Any, batch: int, position: int, config: RunConfig,
          frames: list[Completions], digests: dict[int, list[str]], where: str) -> Slot:
    """A slot: [worker, incarnation] (assigned) or [frame, row] (a sample, which must be that
    frame row's completion of this very request)."""
    first, second = _list(value, where, 2)
    if isinstance(first, str):
        return Assigned(first, _int(second, where))
    index, row = _int(first, where), _int(second, where)
    if not 0 <= index < len(frames) or not 0 <= row < len(frames[index]):
        raise SnapshotError(f"{where}: row {row} of frame {index}, which it does not hold")
    frame = frames[index]
    request = (batch, *divmod(position, config.group_size))
    if tuple(frame.requests[row].tolist()) != request:
        raise SnapshotError(f"{where}: row {row} of frame {index} completes request "
                            f"{tuple(frame.requests[row].tolist())}, not {request}")
    if index not in digests:
        digests[index] = sample_digests(frame)
    sample: Sample = sample_of(frame, row, digests[index][row], int(frame.versions[row]))
    return sample


class _Fields:
    """A JSON object's fields, each read as the type it must be, or a SnapshotError naming
    the field."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, dict):
            raise SnapshotError(f"{where}: expected a JSON object")
        self.data, self.where = data, where

    def get(self, name: str) -> Any:
        if name not in self.data:
            raise SnapshotError(f"{self.where}: no field {name!r}")
        return self.data[name]

    def integer(self, name: str) -> int:
        return _int(self.get(name), f"{self.where}: {name}")

    def text(self, name: str) -> str:
        return _str(self.get(name), f"{self.where}: {name}")

    def flag(self, name: str) -> bool:
        value = self.get(name)
        if type(value) is not bool:
            raise SnapshotError(f"{self.where}: {name}: expected true or false")
        return value

    def items(self, name: str, length: int | None = None) -> list[Any]:
        return _list(self.get(name), f"{self.where}: {name}", length)

    def integers(self, name: str, length: int | None = None) -> tuple[int, ...]:
        return _ints(self.items(name, length), f"{self.where}: {name}")


def _int(value: Any, where: str) -> int:
    if type(value) is not int:
        raise SnapshotError(f"{where}: expected an integer, got {str(value)[:40]}")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise SnapshotError(f"{where}: expected a string, got {str(value)[:40]}")
    return value


def _list(value: Any, where: str, length: int | None = None) -> list[Any]:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        raise SnapshotError(f"{where}: expected a list{f' of {length}' if length else ''}")
    return value


def _ints(values: list[Any], where: str) -> tuple[int, ...]:
    return tuple(_int(value, where) for value in values)


def _strs(values: list[Any], where: str) -> tuple[str, ...]:
    return tuple(_str(value, where) for value in values)


def _reference(value: Any, where: str) -> FrameReference:
    segment, digest = _list(value, where, 2)
    return _int(segment, where), _str(digest, where)


def _phase(kind: Any, value: Any, where: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise SnapshotError(f"{where}: phase {str(value)[:40]!r} is none of "
                            f"{[p.value for p in kind]}") from None
