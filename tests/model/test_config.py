"""Configuration validation and the logical schedule derived from it."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from invar.model import ConfigError, ObjectiveConfig, RunConfig, initial_state, report, schedule
from invar.model.schedule import (
    gen_version,
    hard_boundaries,
    minibatch_plan,
    published_versions,
    staleness,
)

# ---------------------------------------------------------------------------------------------
# Refused configurations name their fields.

BAD_CONFIGS = [
    ("P > S+1", dict(max_staleness=1, sync_period=3), {"sync_period", "max_staleness"}),
    ("P > S+1 with S=0", dict(max_staleness=0, sync_period=2), {"sync_period", "max_staleness"}),
    ("K < 1", dict(optimizer_steps=0), {"optimizer_steps"}),
    ("K negative", dict(optimizer_steps=-3), {"optimizer_steps"}),
    ("K > B*G", dict(prompts_per_batch=2, group_size=3, optimizer_steps=7),
     {"optimizer_steps", "prompts_per_batch", "group_size"}),
    ("negative S", dict(max_staleness=-1, sync_period=1), {"max_staleness"}),
    ("zero B", dict(prompts_per_batch=0), {"prompts_per_batch"}),
    ("zero G", dict(group_size=0), {"group_size"}),
    ("zero P", dict(sync_period=0), {"sync_period"}),
    ("zero N", dict(total_updates=0), {"total_updates"}),
    ("zero inflight", dict(max_inflight_batches=0), {"max_inflight_batches"}),
    ("negative eval_every", dict(eval_every=-1), {"eval_every"}),
    ("negative checkpoint_every", dict(checkpoint_every=-2), {"checkpoint_every"}),
    ("negative seed", dict(seed=-1), {"seed"}),
    ("seed wider than 63 bits", dict(seed=2 ** 63), {"seed"}),
    ("seed of issue 41", dict(seed=10 ** 26), {"seed"}),
    ("bool is not an int", dict(optimizer_steps=True), {"optimizer_steps"}),
    ("float is not an int", dict(max_staleness=1.0), {"max_staleness"}),
    ("clip_low 0", dict(objective=ObjectiveConfig(clip_low=0.0)), {"objective.clip_low"}),
    ("clip_low 1", dict(objective=ObjectiveConfig(clip_low=1.0)), {"objective.clip_low"}),
    ("clip_low bool", dict(objective=ObjectiveConfig(clip_low=True)), {"objective.clip_low"}),
    ("two objective fields", dict(objective=ObjectiveConfig(clip_low=2.0, kl_coef=-1.0)),
     {"objective.clip_low", "objective.kl_coef"}),
    ("unknown loss", dict(objective=ObjectiveConfig(loss="mse")), {"objective.loss"}),
    ("not an objective", dict(objective={"clip_low": 0.2}), {"objective"}),
]


@pytest.mark.parametrize("overrides, fields", [(o, f) for _, o, f in BAD_CONFIGS],
                         ids=[name for name, _, _ in BAD_CONFIGS])
def test_bad_config_names_its_fields(overrides, fields):
    config = RunConfig(**overrides)
    with pytest.raises(ConfigError) as info:
        config.validate()
    assert set(info.value.fields) == fields
    for name in fields:
        assert name in str(info.value)
    # A bad configuration never runs.
    with pytest.raises(ConfigError) as again:
        initial_state(config)
    assert set(again.value.fields) == fields


def test_good_configs_validate_to_themselves():
    for config in (RunConfig(), RunConfig(max_staleness=0, sync_period=1),
                   RunConfig(max_staleness=3, sync_period=4, optimizer_steps=512,
                             prompts_per_batch=64, group_size=8)):
        assert config.validate() is config


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


# ---------------------------------------------------------------------------------------------
# The schedule, over drawn valid configurations.


@st.composite
def valid_configs(draw, boundaries: bool = True):
    s = draw(st.integers(0, 6))
    p = draw(st.integers(1, s + 1))
    n = draw(st.integers(1, 30))
    b = draw(st.integers(1, 4))
    g = draw(st.integers(1, 4))
    k = draw(st.integers(1, b * g))
    eval_every = draw(st.integers(0, n + 2)) if boundaries else 0
    checkpoint_every = draw(st.integers(0, n + 2)) if boundaries else 0
    return RunConfig(prompts_per_batch=b, group_size=g, max_staleness=s, sync_period=p,
                     optimizer_steps=k, total_updates=n, eval_every=eval_every,
                     checkpoint_every=checkpoint_every,
                     max_inflight_batches=draw(st.integers(1, 4)),
                     seed=draw(st.integers(0, 2 ** 32))).validate()


@settings(max_examples=150, deadline=None)
@given(config=valid_configs())
def test_gen_version_properties(config):
    n, s = config.total_updates, config.max_staleness
    pub = published_versions(config)
    versions = [gen_version(config, b) for b in range(n)]
    for b, v in enumerate(versions):
        assert 0 <= staleness(config, b) <= s
        assert staleness(config, b) == b - v
        assert v in pub
        assert v <= b
        # Hard boundaries are hard: data consumed after a boundary is at least that new.
        assert v >= max(x for x in hard_boundaries(config) if x <= b)
    assert versions == sorted(versions), "gen_version must be non-decreasing"
    # Pub = {0} U {v : v mod P = 0} U hard boundaries, within [0, N].
    expected = {0, n} | {v for v in range(n + 1) if v % config.sync_period == 0}
    for every in (config.eval_every, config.checkpoint_every):
        if every:
            expected |= set(range(0, n + 1, every))
    assert pub == tuple(sorted(expected))
    # batches_of_version is the inverse image, and contiguous.
    for v in pub:
        assert list(schedule.batches_of_version(config, v)) == \
            [b for b in range(n) if versions[b] == v]


@settings(max_examples=150, deadline=None)
@given(config=valid_configs())
def test_gen_version_is_its_definition(config):
    """gen_version(b) = max(min{v ∈ Pub : v ≥ b − S}, last hard boundary ≤ b), written out."""
    pub = published_versions(config)
    for b in range(config.total_updates):
        oldest_allowed = min(v for v in pub if v >= b - config.max_staleness)
        last = max(v for v in hard_boundaries(config) if v <= b)
        assert gen_version(config, b) == max(oldest_allowed, last)


def _schedule_lines(total_updates: int) -> int:
    """Python lines `schedule.report` runs in invar/model/schedule.py for a run of
    `total_updates` with a boundary at every version (a fresh seed: nothing cached)."""
    import sys
    config = RunConfig(total_updates=total_updates, eval_every=1, sync_period=1,
                       max_staleness=1, seed=total_updates).validate()
    lines = 0

    def count(frame, event, arg):
        nonlocal lines
        if frame.f_code.co_filename == schedule.__file__:
            lines += event == "line"
            return count
        return None

    sys.settrace(count)
    try:
        report(config)
    finally:
        sys.settrace(None)
    return lines


def test_the_schedule_report_grows_linearly_with_the_run():
    """Issue 41: `report` scanned every published version and every boundary for each batch,
    quadratic in total_updates (100k updates: 67 s before a run wrote anything). Counted in
    lines run, not seconds: doubling the run at most about doubles them."""
    assert _schedule_lines(1600) <= 2.2 * _schedule_lines(800)


@settings(max_examples=80, deadline=None)
@given(config=valid_configs(boundaries=False))
def test_sync_period_one_is_a_sliding_window(config):
    config = replace(config, sync_period=1)
    for b in range(config.total_updates):
        assert gen_version(config, b) == max(0, b - config.max_staleness)


@settings(max_examples=80, deadline=None)
@given(config=valid_configs(boundaries=False))
def test_sync_period_s_plus_one_is_periodic(config):
    p = config.max_staleness + 1
    config = replace(config, sync_period=p)
    for b in range(config.total_updates):
        assert gen_version(config, b) == (b // p) * p
        assert staleness(config, b) == b % p


CLAMPED_BY_EVALUATION = RunConfig(
    max_staleness=11, sync_period=12, eval_every=10, total_updates=30, prompts_per_batch=2,
    group_size=2, optimizer_steps=1, max_inflight_batches=12).validate()
"""Evaluation every 10 clamps a declared staleness of 11 and sync period of 12."""


def test_eval_boundaries_clamp_staleness_and_say_so():
    config = CLAMPED_BY_EVALUATION
    rep = report(config)
    assert rep.declared_staleness == 11
    assert rep.effective_staleness == 9
    assert max(rep.staleness_per_batch) == 9
    assert rep.published_versions == (0, 10, 12, 20, 24, 30)
    assert any("max_staleness=11" in note and "9" in note for note in rep.notes), rep.notes
    # The declared figure is reported, never silently changed.
    assert config.max_staleness == 11


def test_report_without_clamp_has_no_staleness_note():
    config = RunConfig(max_staleness=2, sync_period=3, total_updates=9, prompts_per_batch=1,
                       group_size=2, optimizer_steps=1, max_inflight_batches=3)
    rep = report(config)
    assert rep.effective_staleness == 2
    assert not any("never reached" in note for note in rep.notes)
    assert rep.staleness_per_batch == tuple(b % 3 for b in range(9))
    assert not any("clamped" in note for note in rep.notes), rep.notes


def test_report_notes_a_sync_period_clamped_by_boundaries():
    config = CLAMPED_BY_EVALUATION
    rep = report(config)
    assert rep.effective_sync_period == 10
    assert any("sync_period=12 is clamped" in note for note in rep.notes), rep.notes


# ---------------------------------------------------------------------------------------------
# Minibatch plans.


@settings(max_examples=100, deadline=None)
@given(config=valid_configs(), update=st.integers(0, 50))
def test_minibatch_plan_is_a_near_equal_partition(config, update):
    plan = minibatch_plan(config, update)
    n, k = config.samples_per_batch, config.optimizer_steps
    assert len(plan) == k
    flat = [i for part in plan for i in part]
    assert sorted(flat) == list(range(n)), "every position exactly once"
    sizes = [len(part) for part in plan]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    for part in plan:
        assert list(part) == sorted(part), "each minibatch in id order"


def test_the_plan_order_is_shared_read_only():
    """`minibatch_order` is cached and shared by every scoring of its update: a caller that
    could write to it would change every later plan of that update."""
    config = RunConfig()
    order = schedule.minibatch_order(config, 3)
    with pytest.raises(ValueError, match="read-only"):
        order[0] = order[1]
    assert [p for step in minibatch_plan(config, 3) for p in step] == order.tolist()


@settings(max_examples=60, deadline=None)
@given(config=valid_configs(), other=valid_configs(), update=st.integers(0, 50))
def test_minibatch_plan_depends_only_on_seed_and_update(config, other, update):
    plan = minibatch_plan(config, update)
    # Deterministic, cache or no cache.
    minibatch_plan.cache_clear()
    assert minibatch_plan(config, update) == plan
    # Nothing but (seed, update) (and the batch's shape) matters.
    same_shape = replace(other, seed=config.seed, prompts_per_batch=config.prompts_per_batch,
                         group_size=config.group_size, optimizer_steps=config.optimizer_steps)
    assert minibatch_plan(same_shape, update) == plan


def test_minibatch_plans_differ_between_updates_and_seeds():
    config = RunConfig(prompts_per_batch=4, group_size=4, optimizer_steps=4, total_updates=20)
    plans = [minibatch_plan(config, u) for u in range(20)]
    for a, b in combinations(range(20), 2):
        assert plans[a] != plans[b], (a, b)
    assert minibatch_plan(replace(config, seed=1), 0) != plans[0]


def test_report_notes_an_inflight_bound_below_the_budget_and_a_synchronous_run():
    base = dict(prompts_per_batch=1, group_size=2, optimizer_steps=1, total_updates=9)
    tight = report(RunConfig(max_staleness=2, sync_period=1, max_inflight_batches=2, **base))
    assert any("max_inflight_batches=2 < max_staleness + 1 = 3" in n for n in tight.notes)
    roomy = report(RunConfig(max_staleness=2, sync_period=1, max_inflight_batches=3, **base))
    assert not any("max_inflight_batches" in n for n in roomy.notes), roomy.notes
    assert not any("synchronous" in n for n in roomy.notes), roomy.notes
    sync = report(RunConfig(max_staleness=0, sync_period=1, max_inflight_batches=1, **base))
    assert any(n.startswith("max_staleness=0: synchronous") for n in sync.notes), sync.notes
    assert not any("max_inflight_batches" in n for n in sync.notes), sync.notes


def test_the_cached_repr_is_the_one_dataclasses_would_write():
    """A state digest writes the config out on every event, so its repr is cached; the text
    must stay the generated one (journals' digests are pinned to it)."""
    import dataclasses
    import pickle

    twin = dataclasses.make_dataclass(
        "RunConfig", [(f.name, f.type, dataclasses.field(default=f.default,
                                                          default_factory=f.default_factory))
                      for f in dataclasses.fields(RunConfig)], frozen=True)
    config = RunConfig(prompts_per_batch=3, group_size=2, total_updates=7, seed=11)
    expected = repr(twin(**{f.name: getattr(config, f.name)
                            for f in dataclasses.fields(config)}))
    assert repr(config) == repr(config) == expected
    changed = dataclasses.replace(config, seed=12)
    assert repr(changed) == expected.replace("seed=11", "seed=12")
    assert repr(pickle.loads(pickle.dumps(config))) == expected
