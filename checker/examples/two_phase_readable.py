"""Two-phase commit written as a user writes a model: the TLA+ ``TwoPhase`` spec, state for state.

The same system as `checker.examples.two_phase_commit` (Gray & Lamport's spec; the same
actions, the same 296,448 distinct states and 2,744,706 generated for 7 resource managers),
but the state is the spec's four variables held as they read, not packed into an int::

    rmState    -> rm_state:    tuple of "working" | "prepared" | "committed" | "aborted"
    tmState    -> tm_state:    "init" | "committed" | "aborted"
    tmPrepared -> tm_prepared: frozenset of RM indices
    msgs       -> msgs:        frozenset of Message("Prepared", rm) | Message("Commit") |
                               Message("Abort")

This is the engine's benchmark on ordinary states (`benchmarks/bench_checker.py` runs it beside
the packed model): whatever it costs above the model's own functions is the engine's share.

The spec itself is checker/examples/TwoPhase.tla (`tests/checker/test_tla_spec.py` holds this
model to its variables and actions; `benchmarks/bench_tlc.py` runs TLC on it beside this model).

Each TLA+ action is one method returning the next state, or ``None`` when the action is not
enabled; `successors` lists them in the spec's order.  The actions are the packed model's
classes, so traces and coverage read the same for both models.

Check it from the command line::

    invar-check --model checker.examples.two_phase_readable:TwoPhaseReadable --arg rms=5
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from checker.examples.two_phase_commit import (
    RMChooseToAbort,
    RMPrepare,
    RMRcvAbortMsg,
    RMRcvCommitMsg,
    TMAbort,
    TMCommit,
    TMRcvPrepared,
    TwoPhaseAction,
)
from checker.model import BaseModel, Property

__all__ = ["Message", "TwoPhaseReadable", "TwoPhaseState"]


class Message(NamedTuple):
    """A message of the spec: ``[type |-> "Prepared", rm |-> r]``, ``[type |-> "Commit"]``..."""

    type: str
    rm: int | None = None


COMMIT = Message("Commit")
ABORT = Message("Abort")


class TwoPhaseState(NamedTuple):
    rm_state: tuple[str, ...]
    tm_state: str
    tm_prepared: frozenset[int]
    msgs: frozenset[Message]


class TwoPhaseReadable(BaseModel[TwoPhaseState, TwoPhaseAction]):
    """TwoPhase with `rms` resource managers; ``buggy=True`` lets the TM commit before every
    RM is prepared (which breaks ``consistent``), as in the packed model."""

    def __init__(self, rms: int = 3, *, buggy: bool = False) -> None:
        if rms < 1:
            raise ValueError("at least one resource manager")
        self.rms = rms
        self.buggy = buggy
        self.all_rms = frozenset(range(rms))

    def __repr__(self) -> str:
        return f"TwoPhaseReadable(rms={self.rms}, buggy={self.buggy})"

    def init_states(self) -> list[TwoPhaseState]:
        return [TwoPhaseState(("working",) * self.rms, "init", frozenset(), frozenset())]

    # ------------------------------------------------------------------ the spec's actions

    def tm_rcv_prepared(self, s: TwoPhaseState, rm: int) -> TwoPhaseState | None:
        if s.tm_state == "init" and Message("Prepared", rm) in s.msgs:
            return s._replace(tm_prepared=s.tm_prepared | {rm})
        return None

    def tm_commit(self, s: TwoPhaseState) -> TwoPhaseState | None:
        if s.tm_state == "init" and (self.buggy or s.tm_prepared == self.all_rms):
            return s._replace(tm_state="committed", msgs=s.msgs | {COMMIT})
        return None

    def tm_abort(self, s: TwoPhaseState) -> TwoPhaseState | None:
        if s.tm_state == "init":
            return s._replace(tm_state="aborted", msgs=s.msgs | {ABORT})
        return None

    def rm_prepare(self, s: TwoPhaseState, rm: int) -> TwoPhaseState | None:
        if s.rm_state[rm] == "working":
            return s._replace(
                rm_state=_set(s.rm_state, rm, "prepared"), msgs=s.msgs | {Message("Prepared", rm)}
            )
        return None

    def rm_choose_to_abort(self, s: TwoPhaseState, rm: int) -> TwoPhaseState | None:
        if s.rm_state[rm] == "working":
            return s._replace(rm_state=_set(s.rm_state, rm, "aborted"))
        return None

    def rm_rcv_commit_msg(self, s: TwoPhaseState, rm: int) -> TwoPhaseState | None:
        if COMMIT in s.msgs:
            return s._replace(rm_state=_set(s.rm_state, rm, "committed"))
        return None

    def rm_rcv_abort_msg(self, s: TwoPhaseState, rm: int) -> TwoPhaseState | None:
        if ABORT in s.msgs:
            return s._replace(rm_state=_set(s.rm_state, rm, "aborted"))
        return None

    # ------------------------------------------------------------------ the Model API

    def actions(self, s: TwoPhaseState) -> list[TwoPhaseAction]:
        """Every action of the spec, in its order (disabled ones give ``None`` below)."""
        out: list[TwoPhaseAction] = [TMCommit(), TMAbort()]
        for rm in range(self.rms):
            out += [
                TMRcvPrepared(rm),
                RMPrepare(rm),
                RMChooseToAbort(rm),
                RMRcvCommitMsg(rm),
                RMRcvAbortMsg(rm),
            ]
        return out

    def next_state(self, s: TwoPhaseState, action: TwoPhaseAction) -> TwoPhaseState | None:
        match action:
            case TMCommit():
                return self.tm_commit(s)
            case TMAbort():
                return self.tm_abort(s)
            case TMRcvPrepared(rm):
                return self.tm_rcv_prepared(s, rm)
            case RMPrepare(rm):
                return self.rm_prepare(s, rm)
            case RMChooseToAbort(rm):
                return self.rm_choose_to_abort(s, rm)
            case RMRcvCommitMsg(rm):
                return self.rm_rcv_commit_msg(s, rm)
            case RMRcvAbortMsg(rm):
                return self.rm_rcv_abort_msg(s, rm)
        raise TypeError(f"not a two-phase-commit action: {action!r}")

    def successors(self, s: TwoPhaseState) -> Iterator[tuple[TwoPhaseAction, TwoPhaseState]]:
        """`actions` + `next_state` in one pass: the enabled actions only, in the same order
        (the tests check they agree), without building the disabled ones."""
        rm_state, tm_state, tm_prepared, msgs = s
        if tm_state == "init":
            if self.buggy or tm_prepared == self.all_rms:
                yield TMCommit(), TwoPhaseState(rm_state, "committed", tm_prepared, msgs | {COMMIT})
            yield TMAbort(), TwoPhaseState(rm_state, "aborted", tm_prepared, msgs | {ABORT})
        commit = COMMIT in msgs
        abort = ABORT in msgs
        for rm, phase in enumerate(rm_state):
            if tm_state == "init" and Message("Prepared", rm) in msgs:
                yield TMRcvPrepared(rm), TwoPhaseState(rm_state, tm_state, tm_prepared | {rm}, msgs)
            if phase == "working":
                prepared = Message("Prepared", rm)
                yield RMPrepare(rm), TwoPhaseState(
                    _set(rm_state, rm, "prepared"), tm_state, tm_prepared, msgs | {prepared}
                )
                yield RMChooseToAbort(rm), TwoPhaseState(
                    _set(rm_state, rm, "aborted"), tm_state, tm_prepared, msgs
                )
            if commit:
                yield RMRcvCommitMsg(rm), TwoPhaseState(
                    _set(rm_state, rm, "committed"), tm_state, tm_prepared, msgs
                )
            if abort:
                yield RMRcvAbortMsg(rm), TwoPhaseState(
                    _set(rm_state, rm, "aborted"), tm_state, tm_prepared, msgs
                )

    def properties(self) -> list[Property]:
        return [
            Property.always("consistent", self.consistent),
            Property.sometimes(
                "commit agreement", lambda s: all(p == "committed" for p in s.rm_state)
            ),
            Property.sometimes(
                "abort agreement", lambda s: all(p == "aborted" for p in s.rm_state)
            ),
        ]

    @staticmethod
    def consistent(s: TwoPhaseState) -> bool:
        """No RM committed while another aborted."""
        return not ("committed" in s.rm_state and "aborted" in s.rm_state)

    def format_action(self, action: TwoPhaseAction) -> str:
        rm = getattr(action, "rm", None)
        return type(action).__name__ if rm is None else f"{type(action).__name__}({rm})"


def _set(phases: tuple[str, ...], rm: int, phase: str) -> tuple[str, ...]:
    """`phases` with RM `rm` in `phase` (TLA+'s ``[rmState EXCEPT ![rm] = phase]``)."""
    return phases[:rm] + (phase,) + phases[rm + 1 :]
