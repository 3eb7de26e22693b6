"""The partial-order reduction's commutation claims (`InvarModel.ample_set`: the actions on
a launch, a load or the learner's command), checked on the states themselves rather than argued: on
the states of small bounds (each fault kind, and several together) where the reduction acts,
and on every state reached from one by actions outside its ample set, for each action a of
the set and each other enabled action b:

* the delivery stays enabled (nothing outside the set takes the message away);
* b absorbs the delivery (b after it reaches the state b reaches without it: a driver
  restart always, the crash of a dead letter's worker), or: if a is still enabled after b,
  then b is enabled after a, and a-then-b and b-then-a reach the same state (the checker's
  key); an action of the set that b disabled stays disabled.

The same check run on ample sets that are wrong on purpose fails, so it can tell.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import replace

import pytest

from checker.invar_model import Bounds, Budget, Explored, InvarModel
from invar.model.world import World

AmpleSet = Callable[[InvarModel, World, Budget], "list[tuple] | None"]

TWO = Bounds(workers=2, prompts_per_batch=2, group_size=1)
SMALL = [  # each bound, and the kinds of action the ample sets checked there hold
    (Bounds(total_updates=1, drops=1, duplicates=1), {"deliver", "drop", "duplicate"}),
    (Bounds(total_updates=1, early_timers=1, duplicates=1), {"deliver", "duplicate"}),
    (Bounds(total_updates=1, learner_crashes=1, drops=1), {"deliver", "drop", "crash_learner"}),
    (Bounds(total_updates=1, learner_crashes=1, driver_restarts=1),
     {"deliver", "crash_learner"}),
    (Bounds(total_updates=1, optimizer_steps=2, learner_crashes=1, duplicates=1),
     {"deliver", "duplicate", "crash_learner"}),
    (Bounds(total_updates=2, eval_every=1, checkpoint_every=1, learner_crashes=1),
     {"deliver", "crash_learner"}),
    (Bounds(total_updates=3, max_inflight_batches=1), {"deliver"}),  # a reload
    (replace(TWO, total_updates=1, driver_restarts=1), {"deliver"}),
    (replace(TWO, total_updates=1, worker_crashes=1, drops=1),
     {"deliver", "drop", "crash_worker"}),
    (replace(TWO, total_updates=1, worker_crashes=1, duplicates=1, learner_crashes=1,
             driver_restarts=1), {"deliver", "duplicate", "crash_worker"}),
    (replace(TWO, total_updates=1, worker_crashes=1, learner_crashes=1, driver_restarts=1,
             repeats=1), {"deliver", "crash_worker"}),
    (replace(TWO, total_updates=1, worker_crashes=1, early_timers=1), {"deliver", "crash_worker"}),
]
STATES = 12_000
"""States of a bound checked, the first in breadth-first order (the larger bounds have more)."""
PATH_DEPTH = 2
"""Actions outside the ample set taken from each reduced state, the diamonds checked after
each (the argument needs every such path; two steps reach every pair of its actions)."""


def _reachable(model: InvarModel) -> list[Explored]:
    """The first `STATES` states of `model`'s bound, unreduced, breadth-first."""
    seen = set()
    states: list[Explored] = []
    queue = deque(model.init_states())
    while queue and len(states) < STATES:
        state = queue.popleft()
        key = model.fingerprint_key(state)
        if key in seen:
            continue
        seen.add(key)
        states.append(state)
        queue.extend(after for _, after in model.successors(state))
    return states


def _failures(full: InvarModel, state: Explored, ample: list[tuple]) -> list[str]:
    """Where the claims fail for `ample` at `state` and the paths from it outside the set."""
    key, step, enabled_in = full.fingerprint_key, full.next_state, full.actions
    deliver = ample[0]
    out: list[str] = []
    stack = [(state, frozenset[tuple](), 0)]
    while stack:
        x, disabled, depth = stack.pop()
        enabled = enabled_in(x)
        if deliver not in enabled:
            out.append(f"{deliver} disabled at depth {depth}")
            continue
        out += [f"{a} disabled, then enabled again" for a in ample
                if a in disabled and a in enabled]
        out += [f"{a} disabled unseen" for a in ample if a not in disabled and a not in enabled]
        firsts = {a: step(x, a) for a in ample if a in enabled}
        for b in enabled:
            if b in ample:
                continue
            after_b = step(x, b)
            if b in enabled_in(firsts[deliver]) and \
                    key(step(firsts[deliver], b)) == key(after_b):
                continue  # b absorbs the delivery: the argument needs nothing after it
            if b[0] == "restart_driver":
                out.append(f"{b} does not absorb {deliver}")
                continue
            enabled_after_b = set(enabled_in(after_b))
            for a, after_a in firsts.items():
                if a not in enabled_after_b:
                    continue
                if b not in enabled_in(after_a):
                    out.append(f"{a} disables {b}")
                elif key(step(after_b, a)) != key(step(after_a, b)):
                    out.append(f"{a} and {b} do not commute")
            if depth < PATH_DEPTH:
                stack.append((after_b, disabled | {a for a in firsts if a not in enabled_after_b},
                              depth + 1))
    return out


def _check(bounds: Bounds, ample_set: AmpleSet,
           until_failure: bool = False) -> tuple[Counter[str], list[str]]:
    """The reduced states checked, by the kinds of action in their ample set, and the
    failures, over the states of `bounds` (`until_failure`: stop at the first state that
    fails)."""
    full, reducer = InvarModel(bounds), InvarModel(bounds, reduction=True)
    checked: Counter[str] = Counter()
    failures: list[str] = []
    for state in _reachable(full):
        ample = ample_set(reducer, state.world, state.budget)
        if ample is None:
            continue
        checked.update(kind for kind, _ in ample)
        failures += _failures(full, state, ample)
        if failures and until_failure:
            break
    return checked, failures


def _short(bounds: Bounds) -> str:
    default = Bounds()
    return ",".join(f"{k}={v}" for k, v in vars(bounds).items() if getattr(default, k) != v)


@pytest.mark.parametrize("bounds, kinds", SMALL, ids=[_short(b) for b, _ in SMALL])
def test_ample_sets_commute_with_every_action_outside_them(bounds: Bounds,
                                                           kinds: set[str]) -> None:
    checked, failures = _check(bounds, InvarModel.ample_set)
    assert not failures, failures[:5]
    assert set(checked) == kinds


def _without_crash(model: InvarModel, world: World, budget: Budget) -> list[tuple] | None:
    """Wrong: the launch's actions alone while its worker may crash."""
    ample = model.launch_ample_set(world, budget._replace(worker_crashes=0))
    return [a for a in ample if a[0] != "crash_worker"] if ample is not None else None


def _crash_beside_other_mail(model: InvarModel, world: World,
                             budget: Budget) -> list[tuple] | None:
    """Wrong: the worker's crash in the set while other messages to it are in flight."""
    ample = model.launch_ample_set(world, budget._replace(worker_crashes=0))
    if ample is None or not budget.worker_crashes:
        return ample
    worker = next(m.body.worker for m in world.network if m.key == ample[0][1])
    if sum(m.to == worker for m in world.network) < 2:
        return None
    return [*ample, ("crash_worker", worker)]


def _early_timer_beside_drop(model: InvarModel, world: World,
                             budget: Budget) -> list[tuple] | None:
    """Wrong: a droppable launch while the timer may fire early."""
    return model.launch_ample_set(world, budget._replace(early_timers=0))


def _learner_without_crash(model: InvarModel, world: World,
                           budget: Budget) -> list[tuple] | None:
    """Wrong: the learner's command alone while the learner may crash."""
    ample = model.learner_ample_set(world, budget._replace(learner_crashes=0))
    return ample if budget.learner_crashes else None


WRONG = [
    (_without_crash, replace(TWO, total_updates=1, worker_crashes=1)),
    (_crash_beside_other_mail, replace(TWO, total_updates=1, worker_crashes=1, group_size=2)),
    (_early_timer_beside_drop, Bounds(total_updates=1, early_timers=1, drops=1)),
    (_learner_without_crash, Bounds(total_updates=1, learner_crashes=1)),
]


@pytest.mark.parametrize("ample_set, bounds", WRONG, ids=[w[0].__name__ for w in WRONG])
def test_a_wrong_ample_set_fails_the_check(ample_set: AmpleSet, bounds: Bounds) -> None:
    checked, failures = _check(bounds, ample_set, until_failure=True)
    assert checked["deliver"] and failures
