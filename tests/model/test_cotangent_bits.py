"""The core's cotangents are `objective` of the plan's rows, to the bit.

The core does not call `objective` per minibatch: it checks a batch's inputs once when it is
scored, computes the terms that do not depend on the current policy (behaviour weights, token
shares) for the whole batch, and hands `checked_objective` each step's rows of them. Journals
record the cotangents' and steps' digests, so that path must give the very bits `objective`
gives on the step's rows padded on their own (signed zeros included): checked here over every
loss, with and without the KL penalty, on rows of one length and ragged, for log-probs that
tie, clip and sit on either side of the clip range.
"""

from __future__ import annotations

import zlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.core_driver import AnsweringWith, commands_of
from invar.model import ObjectiveConfig, RunConfig, run_complete, schedule
from invar.model import messages as m
from invar.model.objective import (
    AGGREGATIONS,
    LOSSES,
    group_advantages,
    objective,
    pad,
)
from invar.model.ragged import Ragged


class _Values:
    """Log-probs and rewards drawn per request from `seed`: rows near on-policy (ratios in
    the clip range), on a coarse grid (exact ties between policies), spread out (clipped
    ratios) or all -0.0; rewards that make some groups constant (advantage exactly 0)."""

    def __init__(self, seed: int, uniform: bool) -> None:
        self.seed, self.uniform = seed, uniform

    def _rng(self, *key: object) -> np.random.Generator:
        return np.random.default_rng(zlib.crc32(repr((self.seed, *key)).encode()))

    def length(self, request: schedule.RequestId) -> int:
        return 3 if self.uniform else 1 + int(self._rng("length", request).integers(0, 5))

    def row(self, request: schedule.RequestId, *key: object) -> tuple[float, ...]:
        rng, n = self._rng(request, *key), self.length(request)
        kind = rng.integers(0, 4)
        if kind == 0:
            return tuple(-rng.random(n) * 0.05)
        if kind == 1:
            return tuple(np.round(-rng.random(n) * 2.0, 1))
        if kind == 2:
            return tuple(-rng.exponential(2.0, n))
        return (-0.0,) * n

    def reward(self, request: schedule.RequestId) -> float:
        rng = self._rng("reward", request)
        return float(rng.integers(0, 2)) if request.prompt % 2 else float(rng.normal())

    def behavior(self, request: schedule.RequestId) -> tuple[float, ...]:
        return self.row(request, "behavior")

    def proximal(self, request: schedule.RequestId, update: int) -> tuple[float, ...]:
        return self.row(request, "proximal", update)

    def reference(self, request: schedule.RequestId) -> tuple[float, ...]:
        return self.row(request, "reference")

    def current(self, request: schedule.RequestId, update: int,
                step_index: int) -> tuple[float, ...]:
        return self.row(request, "current", update, step_index)


def _expected(config: RunConfig, v: _Values, update: int, step_index: int):
    requests = schedule.request_ids(config, update)
    plan = list(schedule.minibatch_plan(config, update)[step_index])
    rewards = np.array([v.reward(r) for r in requests], dtype=np.float64)
    advantages = group_advantages(rewards, config.group_size,
                                  config.objective.normalize_advantages)[plan]
    current, mask = pad([v.current(requests[i], update, step_index) for i in plan])
    # An update that does not score its batch (one optimizer step, no KL term) has the weights
    # before it as its current policy: its proximal log-probs are the forward's.
    proximal = pad([v.proximal(requests[i], update) for i in plan])[0] if (
        config.scores_batch) else current
    behavior, _ = pad([v.behavior(requests[i]) for i in plan])
    reference = pad([v.reference(requests[i]) for i in plan])[0] if (
        config.objective.needs_reference) else None
    staleness = np.full(len(plan), schedule.staleness(config, update), dtype=np.float64)
    with np.errstate(over="ignore"):
        terms, cotangent = objective(config.objective, advantages, current, proximal, behavior,
                                     mask, reference=reference, staleness=staleness)
    return terms, Ragged.from_padded(cotangent, mask).values.tobytes()


@settings(max_examples=16, deadline=None)
@given(loss=st.sampled_from(LOSSES), kl_coef=st.sampled_from([0.0, 0.05]),
       optimizer_steps=st.sampled_from([1, 3]), uniform=st.booleans(),
       aggregation=st.sampled_from(AGGREGATIONS), seed=st.integers(0, 2**16))
def test_every_cotangent_is_the_objective_of_its_rows_bit_for_bit(loss, kl_coef, optimizer_steps,
                                                                  uniform, aggregation, seed):
    config = RunConfig(prompts_per_batch=5, group_size=4, max_staleness=1, sync_period=1,
                       optimizer_steps=optimizer_steps, total_updates=2, max_inflight_batches=2,
                       seed=seed, objective=ObjectiveConfig(loss=loss, kl_coef=kl_coef,
                                                            aggregation=aggregation))
    _assert_cotangents_are_the_objective(config, _Values(seed, uniform))


def _assert_cotangents_are_the_objective(config: RunConfig, values: _Values) -> None:
    """Run `config` to completion, answering with `values`; every cotangent is `objective()`
    of its step's rows, to the bit."""
    driver = AnsweringWith(config)
    driver.values = values
    for _ in range(20):
        driver.pump()
        if run_complete(driver.state):
            break
        driver.apply(m.TimerFired())
    cotangents = commands_of(driver.commands, m.ApplyCotangent)
    assert run_complete(driver.state)
    assert len(cotangents) == config.total_updates * config.optimizer_steps
    scored = len(commands_of(driver.commands, m.ScoreProbabilities))
    assert scored == (config.total_updates if config.scores_batch else 0)
    assert all(bool(record.scores_digest) == config.scores_batch
               for record in driver.state.ledger)
    for command in cotangents:
        terms, cotangent = _expected(config, values, command.observation.update,
                                     command.observation.step)
        assert repr(command.terms) == repr(terms)  # -0.0 and 0.0 told apart
        assert command.cotangent.values.tobytes() == cotangent


class _FirstRowLongest(_Values):
    """Ragged rows whose first in each step's plan order is the only longest of its step: the
    width a step's inputs are cut to must count that row too."""

    def __init__(self, seed: int, config: RunConfig) -> None:
        super().__init__(seed, uniform=False)
        self.firsts = {schedule.request_ids(config, update)[step[0]]
                       for update in range(config.total_updates)
                       for step in schedule.minibatch_plan(config, update)}

    def length(self, request: schedule.RequestId) -> int:
        return 6 if request in self.firsts else super().length(request)


def test_a_step_whose_first_row_is_its_longest_is_cut_to_that_row():
    config = RunConfig(prompts_per_batch=5, group_size=4, max_staleness=1, sync_period=1,
                       optimizer_steps=3, total_updates=2, max_inflight_batches=2, seed=7)
    _assert_cotangents_are_the_objective(config, _FirstRowLongest(7, config))
