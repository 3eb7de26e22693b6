"""The protocol's phase machines as data (h11 style): which event moves which phase where.

`step` consults these tables to decide whether an in-protocol event is expected; the spec's
diagrams (`python -m invar.model.transitions`) and the checker's coverage read the same tables,
and the checker's `phase_moves_are_listed` (`checker.invar_model`) fails on any phase move a
handler makes that they do not list: the tables are the phase machines, not notes on them.
Events not listed for a phase are classified by `step` as duplicate, late or a ProtocolError.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from invar.model.messages import (
    ForwardObserved,
    LearnerStarted,
    ProbabilitiesReported,
    StepFinished,
    UpdateCommitted,
    WeightsLoaded,
    WorkerConnected,
    WorkerLost,
)
from invar.model.state import LearnerPhase as L
from invar.model.state import WorkerPhase as W

LEARNER: dict[tuple[L, type], tuple[L, ...]] = {
    (L.OFFLINE, LearnerStarted): (L.WAITING,),
    (L.SCORING, ProbabilitiesReported): (L.FORWARD,),
    (L.FORWARD, ForwardObserved): (L.APPLYING,),
    (L.APPLYING, StepFinished): (L.FORWARD, L.COMMITTING),
    (L.COMMITTING, UpdateCommitted): (L.WAITING, L.FINISHED),
    # A restart from the last commit abandons the update in progress: it is redone whole.
    **{(phase, LearnerStarted): (L.WAITING,)
       for phase in (L.WAITING, L.SCORING, L.FORWARD, L.APPLYING)},
    # ... unless its commit became durable before the crash: then that commit counts.
    (L.COMMITTING, LearnerStarted): (L.WAITING, L.FINISHED),
    (L.FINISHED, LearnerStarted): (L.FINISHED,),
}
"""(phase, event type) -> the phases it may lead to; pairs not listed are not in-protocol."""

LEARNER_INTERNAL: dict[L, tuple[L, ...]] = {
    # Its batch is complete and the newest version's evaluation and checkpoint are
    # acknowledged: it scores the batch, or, when the update needs no scores
    # (`RunConfig.scores_batch`), asks for its first forward.
    L.WAITING: (L.SCORING, L.FORWARD),
}
"""Moves the core makes on its own when a condition on the rest of the state holds."""

WORKER: dict[tuple[W | None, type], tuple[W, ...]] = {
    (None, WorkerConnected): (W.IDLE,),
    (W.LOST, WorkerConnected): (W.IDLE,),
    (W.IDLE, WorkerConnected): (W.IDLE,),
    (W.LOADING, WorkerConnected): (W.IDLE,),
    (W.READY, WorkerConnected): (W.IDLE,),
    (W.LOADING, WeightsLoaded): (W.READY,),
    (W.IDLE, WorkerLost): (W.LOST,),
    (W.LOADING, WorkerLost): (W.LOST,),
    (W.READY, WorkerLost): (W.LOST,),
}

WORKER_INTERNAL: dict[W, tuple[W, ...]] = {
    W.IDLE: (W.LOADING,),   # a pending request needs a version no worker holds
    W.READY: (W.LOADING,),  # same, and this worker's version is no longer needed
}


def learner_accepts(phase: L, event_type: type) -> bool:
    return bool(LEARNER.get((phase, event_type)))


def with_internal_moves(
    targets: Iterable[Any], internal: Mapping[Any, tuple[Any, ...]]
) -> set[Any]:
    """The phases `targets` and every phase the core's `internal` moves (`LEARNER_INTERNAL`,
    `WORKER_INTERNAL`) take them to in the same step."""
    reached = set(targets)
    todo = list(reached)
    while todo:
        for target in internal.get(todo.pop(), ()):
            if target not in reached:
                reached.add(target)
                todo.append(target)
    return reached


def to_dot() -> str:
    """Both phase machines as one Graphviz digraph (rendered into spec/)."""
    lines = ["digraph invar_phases {", "  rankdir=LR;", '  node [shape=box, fontname="monospace"];']
    for (phase, event), targets in LEARNER.items():
        for target in targets:
            lines.append(f'  "learner.{phase.value}" -> "learner.{target.value}" '
                         f'[label="{event.__name__}"];')
    for phase, targets in LEARNER_INTERNAL.items():
        for target in targets:
            lines.append(f'  "learner.{phase.value}" -> "learner.{target.value}" '
                         '[style=dashed, label="batch complete, boundary acknowledged"];')
    for (worker_phase, event), worker_targets in WORKER.items():
        source = "worker.new" if worker_phase is None else f"worker.{worker_phase.value}"
        for worker_target in worker_targets:
            lines.append(f'  "{source}" -> "worker.{worker_target.value}" '
                         f'[label="{event.__name__}"];')
    for internal, internal_targets in WORKER_INTERNAL.items():
        for worker_target in internal_targets:
            lines.append(f'  "worker.{internal.value}" -> "worker.{worker_target.value}" '
                         '[style=dashed, label="version needed"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_markdown() -> str:
    """The learner table as Markdown (embedded in spec/PROTOCOL.md)."""
    rows = ["| phase | event | next phase(s) |", "|---|---|---|"]
    for (phase, event), targets in LEARNER.items():
        shown = ", ".join(t.value for t in targets) or "refused"
        rows.append(f"| {phase.value} | {event.__name__} | {shown} |")
    for (worker_phase, event), worker_targets in WORKER.items():
        source = "(new worker)" if worker_phase is None else f"worker {worker_phase.value}"
        shown = ", ".join(t.value for t in worker_targets)
        rows.append(f"| {source} | {event.__name__} | {shown} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(to_dot())
