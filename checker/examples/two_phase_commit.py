"""Two-phase commit (Gray & Lamport's TLA+ ``TwoPhase`` spec; stateright's ``examples/2pc.rs``).

R resource managers (RMs) and one transaction manager (TM).  Variables::

    rmState    : [RM -> {"working", "prepared", "committed", "aborted"}]
    tmState    : {"init", "committed", "aborted"}
    tmPrepared : SUBSET RM
    msgs       : SUBSET ({Prepared(rm)} \\cup {Commit, Abort})

Actions (as in the spec, so self-loops such as receiving Commit twice are transitions too)::

    TMRcvPrepared(rm)  tmState = init /\\ Prepared(rm) \\in msgs   -> tmPrepared += rm
    TMCommit           tmState = init /\\ tmPrepared = RM          -> tmState = committed, +Commit
    TMAbort            tmState = init                              -> tmState = aborted,   +Abort
    RMPrepare(rm)      rmState[rm] = working                       -> prepared, +Prepared(rm)
    RMChooseToAbort(rm) rmState[rm] = working                      -> aborted
    RMRcvCommitMsg(rm) Commit \\in msgs                             -> rmState[rm] = committed
    RMRcvAbortMsg(rm)  Abort \\in msgs                              -> rmState[rm] = aborted

Properties: always ``consistent`` (no RM committed while another aborted); sometimes
``commit agreement`` (all committed) and ``abort agreement`` (all aborted).

The state is one int (the model is the benchmark of the *engine*, so its own cost is kept
low); bit layout for R RMs::

    bits [2r, 2r+2)   rmState[r]   (0 working, 1 prepared, 2 committed, 3 aborted)
    bits [2R, 2R+2)   tmState      (0 init, 1 committed, 2 aborted)
    bit  2R+2+r       r \\in tmPrepared
    bit  3R+2+r       Prepared(r) \\in msgs
    bit  4R+2         Commit \\in msgs
    bit  4R+3         Abort \\in msgs

`view_state` decodes it into a readable `TwoPhaseView` for traces.  ``symmetry=True`` makes the
RMs interchangeable: the fingerprint key is the state with the per-RM triples
(rmState[r], r \\in tmPrepared, Prepared(r) \\in msgs) sorted.  ``buggy=True`` lets the TM commit
without waiting for every RM to be prepared, which breaks ``consistent``.

Reference counts (unreduced): R=3: 288 states; R=5: 8,832; R=7: 296,448 distinct states,
2,744,706 generated (TLC's figures for TwoPhase with 7 RMs).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from checker.model import BaseModel, Property

__all__ = [
    "RM_STATES",
    "TM_STATES",
    "RMChooseToAbort",
    "RMPrepare",
    "RMRcvAbortMsg",
    "RMRcvCommitMsg",
    "TMAbort",
    "TMCommit",
    "TMRcvPrepared",
    "TwoPhaseAction",
    "TwoPhaseCommit",
    "TwoPhaseView",
]

RM_STATES = ("working", "prepared", "committed", "aborted")
TM_STATES = ("init", "committed", "aborted")
_WORKING, _PREPARED, _COMMITTED, _ABORTED = 0, 1, 2, 3
_TM_INIT, _TM_COMMITTED, _TM_ABORTED = 0, 1, 2


@dataclass(frozen=True, slots=True)
class TMRcvPrepared:
    rm: int


@dataclass(frozen=True, slots=True)
class TMCommit:
    pass


@dataclass(frozen=True, slots=True)
class TMAbort:
    pass


@dataclass(frozen=True, slots=True)
class RMPrepare:
    rm: int


@dataclass(frozen=True, slots=True)
class RMChooseToAbort:
    rm: int


@dataclass(frozen=True, slots=True)
class RMRcvCommitMsg:
    rm: int


@dataclass(frozen=True, slots=True)
class RMRcvAbortMsg:
    rm: int


TwoPhaseAction = (
    TMRcvPrepared
    | TMCommit
    | TMAbort
    | RMPrepare
    | RMChooseToAbort
    | RMRcvCommitMsg
    | RMRcvAbortMsg
)


@dataclass(frozen=True)
class TwoPhaseView:
    """A readable decoding of a 2PC state (for traces and diffs)."""

    rm_state: tuple[str, ...]
    tm_state: str
    tm_prepared: frozenset[int]
    msgs: frozenset[str]


class TwoPhaseCommit(BaseModel[int, TwoPhaseAction]):
    """The TwoPhase spec with `rms` resource managers (see the module docstring)."""

    def __init__(self, rms: int, *, symmetry: bool = False, buggy: bool = False) -> None:
        if rms < 1:
            raise ValueError("at least one resource manager")
        self.rms = rms
        self.symmetry = symmetry
        self.buggy = buggy
        r = rms
        self._tm_shift = 2 * r
        self._tmp_shift = 2 * r + 2
        self._msg_shift = 3 * r + 2
        self._commit_bit = 1 << (4 * r + 2)
        self._abort_bit = 1 << (4 * r + 3)
        self._tm_mask = 3 << self._tm_shift
        self._tmp_all = ((1 << r) - 1) << self._tmp_shift
        self._tm_commit = TMCommit()
        self._tm_abort = TMAbort()
        self._global_mask = self._tm_mask | self._commit_bit | self._abort_bit
        lo = 0
        for i in range(r):
            lo |= 1 << (2 * i)
        self._lo = lo  # the low bit of every rmState field
        # per RM: the constants of its transitions, in the spec's action order
        self._rm_table = tuple(
            (
                3 << (2 * i),  # field mask
                _PREPARED << (2 * i),
                _COMMITTED << (2 * i),
                _ABORTED << (2 * i),
                1 << (self._tmp_shift + i),  # tmPrepared bit
                1 << (self._msg_shift + i),  # Prepared(i) message bit
                TMRcvPrepared(i),
                RMPrepare(i),
                RMChooseToAbort(i),
                RMRcvCommitMsg(i),
                RMRcvAbortMsg(i),
            )
            for i in range(r)
        )
        if symmetry:
            # Only then is a fingerprint key installed: without it the engine skips the call.
            self.fingerprint_key = self.representative  # type: ignore[method-assign]
        self._props = (
            Property.always("consistent", self.consistent),
            Property.sometimes("commit agreement", self.all_committed),
            Property.sometimes("abort agreement", self.all_aborted),
        )

    def __repr__(self) -> str:
        return f"TwoPhaseCommit(rms={self.rms}, symmetry={self.symmetry}, buggy={self.buggy})"

    # ------------------------------------------------------------------ the Model API

    def init_states(self) -> list[int]:
        return [0]  # every RM working, TM init, nothing prepared, no message

    def actions(self, state: int) -> list[TwoPhaseAction]:
        out: list[TwoPhaseAction] = []
        tm_init = state & self._tm_mask == 0
        if tm_init:
            if self.buggy or state & self._tmp_all == self._tmp_all:
                out.append(self._tm_commit)
            out.append(self._tm_abort)
        commit = state & self._commit_bit
        abort = state & self._abort_bit
        for mask, _p, _c, _a, _tmp, msg, rcvp, prep, choose, rcvc, rcva in self._rm_table:
            if tm_init and state & msg:
                out.append(rcvp)
            if state & mask == 0:
                out.append(prep)
                out.append(choose)
            if commit:
                out.append(rcvc)
            if abort:
                out.append(rcva)
        return out

    def next_state(self, state: int, action: TwoPhaseAction) -> int | None:
        tm_init = state & self._tm_mask == 0
        if isinstance(action, TMCommit):
            if not tm_init or not (self.buggy or state & self._tmp_all == self._tmp_all):
                return None
            return state | (_TM_COMMITTED << self._tm_shift) | self._commit_bit
        if isinstance(action, TMAbort):
            if not tm_init:
                return None
            return state | (_TM_ABORTED << self._tm_shift) | self._abort_bit
        mask, prepared, committed, aborted, tmp, msg = self._rm_table[action.rm][:6]
        if isinstance(action, TMRcvPrepared):
            return state | tmp if tm_init and state & msg else None
        if isinstance(action, RMPrepare):
            return state | prepared | msg if state & mask == 0 else None
        if isinstance(action, RMChooseToAbort):
            return state | aborted if state & mask == 0 else None
        if isinstance(action, RMRcvCommitMsg):
            return (state & ~mask) | committed if state & self._commit_bit else None
        if isinstance(action, RMRcvAbortMsg):
            return (state & ~mask) | aborted if state & self._abort_bit else None
        raise TypeError(f"not a two-phase-commit action: {action!r}")

    def successors(self, state: int) -> Iterator[tuple[TwoPhaseAction, int]]:
        """Fused `actions` + `next_state` (same pairs, same order; checked by the tests)."""
        tm_init = state & self._tm_mask == 0
        if tm_init:
            if self.buggy or state & self._tmp_all == self._tmp_all:
                yield self._tm_commit, state | (_TM_COMMITTED << self._tm_shift) | self._commit_bit
            yield self._tm_abort, state | (_TM_ABORTED << self._tm_shift) | self._abort_bit
        commit = state & self._commit_bit
        abort = state & self._abort_bit
        for (
            mask, prepared, committed, aborted, tmp, msg, rcvp, prep, choose, rcvc, rcva
        ) in self._rm_table:
            if tm_init and state & msg:
                yield rcvp, state | tmp
            if state & mask == 0:
                yield prep, state | prepared | msg
                yield choose, state | aborted
            if commit:
                yield rcvc, (state & ~mask) | committed
            if abort:
                yield rcva, (state & ~mask) | aborted

    def properties(self) -> tuple[Property, ...]:
        return self._props

    def format_action(self, action: TwoPhaseAction) -> str:
        rm = getattr(action, "rm", None)
        return type(action).__name__ if rm is None else f"{type(action).__name__}({rm})"

    # ------------------------------------------------------------------ predicates

    def consistent(self, state: int) -> bool:
        """No RM committed while another aborted."""
        lo = state & self._lo
        hi = (state >> 1) & self._lo
        committed_any = hi & ~lo
        aborted_any = hi & lo
        return not (committed_any and aborted_any)

    def all_committed(self, state: int) -> bool:
        return (state >> 1) & self._lo == self._lo and state & self._lo == 0

    def all_aborted(self, state: int) -> bool:
        return (state >> 1) & state & self._lo == self._lo

    # ------------------------------------------------------------------ symmetry and views

    def rm_triples(self, state: int) -> list[tuple[int, int, int]]:
        """(rmState, in tmPrepared, Prepared msg sent) per RM."""
        return [
            (
                (state >> (2 * i)) & 3,
                (state >> (self._tmp_shift + i)) & 1,
                (state >> (self._msg_shift + i)) & 1,
            )
            for i in range(self.rms)
        ]

    def representative(self, state: int) -> int:
        """The canonical member of `state`'s orbit under permutations of the RMs."""
        out = state & self._global_mask
        for i, (rs, tp, msg) in enumerate(sorted(self.rm_triples(state))):
            out |= (rs << (2 * i)) | (tp << (self._tmp_shift + i)) | (msg << (self._msg_shift + i))
        return out

    def view_state(self, state: int) -> TwoPhaseView:
        msgs = {f"Prepared({i})" for i in range(self.rms) if state >> (self._msg_shift + i) & 1}
        if state & self._commit_bit:
            msgs.add("Commit")
        if state & self._abort_bit:
            msgs.add("Abort")
        return TwoPhaseView(
            rm_state=tuple(RM_STATES[(state >> (2 * i)) & 3] for i in range(self.rms)),
            tm_state=TM_STATES[(state >> self._tm_shift) & 3],
            tm_prepared=frozenset(i for i in range(self.rms) if state >> (self._tmp_shift + i) & 1),
            msgs=frozenset(msgs),
        )
