"""The state is a hashable value: equal logical histories give equal states and digests, and
numeric payloads (tokens, log-probabilities, rewards, cotangents) take no part in equality."""

from __future__ import annotations

import enum
import gc
import hashlib
import os
import pickle
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from helpers.core_driver import Driver, small_config
from invar.model import (
    LearnerPhase,
    ObjectiveConfig,
    RunConfig,
    initial_state,
    outstanding_commands,
    schedule,
    state_digest,
    step,
)
from invar.model.messages import Completion, Completions, RunForward, TimerFired
from invar.model.ragged import Ragged
from invar.model.schedule import RequestId
from invar.model.state import (
    BatchRequests,
    History,
    JoinedDigests,
    NoOps,
    Positions,
    Sample,
    _request_int64s,
    history_text,
)
from invar.testing import canonical_run, reply

CONFIG = small_config()
ROOT = Path(__file__).resolve().parents[2]


def states_of_a_run(config=CONFIG, workers=("a", "b")):
    d = Driver(config, workers=workers)
    states = [d.state]
    while (event := d.next_reply()) is not None:
        d.apply(event)
        states.append(d.state)
    return states


def test_every_state_of_a_run_is_hashable():
    states = states_of_a_run()
    hashes = {hash(s) for s in states}
    assert len(hashes) > 1
    assert len({state_digest(s) for s in states}) == len(set(states))


def test_states_survive_pickling_whole_hashed_or_not():
    """The checker's processes and checkpoints ship states by pickle: a record leaves its
    cached hash behind (a string's hash differs between processes) and nothing else."""
    for state in states_of_a_run()[::7]:
        fresh = pickle.loads(pickle.dumps(state))
        hash(state)  # caches the hashes of the records
        again = pickle.loads(pickle.dumps(state))
        for copy in (fresh, again):
            assert copy == state and state_digest(copy) == state_digest(state)
            assert "_hash" not in copy.__dict__ and copy.ledger == state.ledger


def test_equal_runs_give_equal_states_and_digests():
    a = canonical_run(CONFIG, ("a", "b")).state
    b = canonical_run(CONFIG, ("a", "b")).state
    assert a == b and hash(a) == hash(b) and state_digest(a) == state_digest(b)
    for x, y in zip(states_of_a_run(), states_of_a_run()):
        assert x == y and hash(x) == hash(y) and state_digest(x) == state_digest(y)


def test_different_states_have_different_digests():
    state = canonical_run(CONFIG).state
    for changed in (replace(state, admitted=state.admitted + 1),
                    replace(state, timer_armed=not state.timer_armed),
                    replace(state, published=state.published[:-1]),
                    replace(state, learner=replace(state.learner, attempt=7))):
        assert changed != state
        assert state_digest(changed) != state_digest(state)


def mid_run_state():
    d = Driver(CONFIG)
    d.pump_to_phase(LearnerPhase.APPLYING, 1)
    return d.state


def test_sample_payload_is_excluded_from_equality():
    state = mid_run_state()
    batch = state.batches[0]
    position, sample = next((i, s) for i, s in enumerate(batch.slots) if isinstance(s, Sample))
    elsewhere = Completions.of((Completion(RequestId(0, 0, 0), 0, (7,), (-1.0,), 1.0),
                                Completion(RequestId(0, 0, 0), 0, (9, 9, 9),
                                           (-3.0, -3.0, -3.0), -42.0)))
    other = replace(sample, frame=elsewhere, row=1)
    assert other == sample and hash(other) == hash(sample)
    assert (other.tokens, other.behavior_logprobs, other.reward) == (
        (9, 9, 9), (-3.0, -3.0, -3.0), -42.0)
    slots = batch.slots[:position] + (other,) + batch.slots[position + 1:]
    twin = replace(state, batches=(replace(batch, slots=slots),) + state.batches[1:])
    assert twin.batches[0].slots[position].tokens == (9, 9, 9)
    assert twin == state and hash(twin) == hash(state)
    assert state_digest(twin) == state_digest(state)
    # ... but the sample's digest is compared.
    forged = replace(sample, digest="0" * len(sample.digest))
    slots = batch.slots[:position] + (forged,) + batch.slots[position + 1:]
    assert replace(state, batches=(replace(batch, slots=slots),) + state.batches[1:]) != state


def test_scores_and_cotangent_payloads_are_excluded_from_equality():
    state = mid_run_state()
    learner = state.learner
    assert learner.scores is not None and learner.cotangent is not None
    proximal = learner.scores.proximal
    scores = replace(learner.scores, proximal=Ragged(np.full(len(proximal.values), -1.0),
                                                     proximal.lengths))
    twin = replace(state, learner=replace(learner, scores=scores, cotangent=None))
    assert twin == state and hash(twin) == hash(state)
    assert state_digest(twin) == state_digest(state)


def test_noop_counts_are_excluded_from_equality():
    state = mid_run_state()
    counted = replace(state, noops=NoOps(**{f.name: 3 for f in fields(NoOps)}))
    assert counted == state and hash(counted) == hash(state)
    assert state_digest(counted) == state_digest(state)


def test_a_states_repr_does_not_grow_with_its_histories():
    """A digest hashes the repr: the histories appear as length and chain, never item by item,
    so its cost is the same at update 3 and at update 10,000."""
    short = canonical_run(replace(CONFIG, total_updates=2)).state
    long = canonical_run(replace(CONFIG, total_updates=12)).state
    assert len(long.commit_digests) == 13 and len(long.published) > len(short.published)
    assert "commit_digests=<13 items, chain " in repr(long)
    assert len(repr(long)) - len(repr(short)) < 16  # a few more digits, no more


def test_a_state_repr_is_its_shown_fields_then_its_histories():
    """The repr that state digests hash, spelled out from the dataclass's fields: the ones it
    shows, in order, as the dataclass repr shows them, then each history's text; a phase as
    `Enum.__repr__` shows it (both are made once per class, not per call)."""
    for state in states_of_a_run()[::7]:
        shown = [f"{f.name}={getattr(state, f.name)!r}" for f in fields(state) if f.repr]
        histories = [f"{name}={history_text(getattr(state, name))}" for name in
                     ("commit_digests", "published", "evaluated", "checkpointed")]
        assert repr(state) == f"State({', '.join(shown + histories)})"
        assert repr(state.learner.phase) == enum.Enum.__repr__(state.learner.phase)
        assert all(repr(w.phase) == enum.Enum.__repr__(w.phase) for w in state.workers)
    grown = History((1, 2)) + (3,)
    assert history_text(grown) == history_text(grown) == f"<3 items, chain {grown.chain}>"


@given(st.lists(st.integers(min_value=-2**70, max_value=2**70) | st.text(max_size=8),
                max_size=12), st.integers(min_value=0, max_value=12))
def test_a_history_is_its_tuple_with_a_chain_over_it(items, cut):
    whole = History(items)
    grown = History(items[:cut]) + tuple(items[cut:])
    assert type(grown) is History and grown == tuple(items) == whole
    assert hash(grown) == hash(tuple(items))
    chain = ""
    for item in items:  # the spec's formula (PROTOCOL.md §3), written out
        chain = hashlib.blake2b(f"{chain}|{item!r}".encode(), digest_size=16).hexdigest()
    assert grown.chain == whole.chain == chain
    assert history_text(tuple(items)) == history_text(grown)  # a plain tuple shows the same
    assert pickle.loads(pickle.dumps(grown)).chain == chain
    if cut < len(items):
        assert History(items[:cut]).chain != chain  # a prefix has a chain of its own


@given(st.integers(min_value=0, max_value=50), st.integers(min_value=1, max_value=6),
       st.integers(min_value=1, max_value=6))
def test_batch_requests_are_the_request_ids_of_the_batch(batch, prompts, group):
    config = replace(CONFIG, prompts_per_batch=prompts, group_size=group)
    ids = schedule.request_ids(config, batch)
    compact = BatchRequests(batch, prompts, group)
    assert tuple(compact) == ids and len(compact) == len(ids)
    assert compact[-1] == ids[-1] and compact[1:3] == ids[1:3]
    assert compact == BatchRequests(batch, prompts, group)
    assert hash(compact) == hash(BatchRequests(batch, prompts, group))
    assert compact != BatchRequests(batch + 1, prompts, group)
    assert compact != BatchRequests(batch, prompts, group + 1)
    assert pickle.loads(pickle.dumps(compact)) == compact
    # The ledger chain packs a whole batch's ids without making them: the same bytes.
    assert _request_int64s(compact) == _request_int64s(ids)


@given(st.lists(st.text(alphabet="0123456789abcdef", max_size=24), max_size=8))
def test_joined_digests_are_the_digests(digests):
    compact = JoinedDigests.of(digests)
    assert tuple(compact) == tuple(digests) and len(compact) == len(digests)
    assert compact == JoinedDigests.of(digests)
    assert hash(compact) == hash(JoinedDigests.of(digests))
    assert compact != JoinedDigests.of([*digests, ""])
    assert pickle.loads(pickle.dumps(compact)) == compact


def test_a_ledger_record_holds_a_few_objects_not_one_per_sample():
    """The ledger keeps a record per update for the whole run."""
    config = replace(CONFIG, prompts_per_batch=8, group_size=4, total_updates=2)
    record = canonical_run(config).state.ledger[-1]
    assert type(record.requests) is BatchRequests and type(record.sample_digests) is JoinedDigests
    assert tuple(record.requests) == schedule.request_ids(config, record.update)
    reached, todo = {id(record)}, [record]
    while todo:  # every object the collector tracks that the record holds (types aside)
        for held in gc.get_referents(todo.pop()):
            if gc.is_tracked(held) and not isinstance(held, type) and id(held) not in reached:
                reached.add(id(held))
                todo.append(held)
    assert len(reached) < 32  # 32 samples: their ids are not objects of their own


PINNED_CONFIG = RunConfig(prompts_per_batch=2, group_size=2, max_staleness=1, sync_period=1,
                          optimizer_steps=2, total_updates=3, seed=7)
PINNED_DIGEST = "34870ffb628d5ac4295651d4d38fa950"
PINNED_FINAL_DIGEST = "3e63a94137a7fcf1b69747da33357e43"


def test_state_digest_is_pinned():
    """Journals record state digests: a change here breaks every existing journal. If the
    state's shape changed on purpose, update the literal (and the journal format version)."""
    assert state_digest(initial_state(PINNED_CONFIG)) == PINNED_DIGEST
    # And at the end of a run, where every history has items (journal format 4).
    assert state_digest(canonical_run(PINNED_CONFIG, ("a", "b")).state) == PINNED_FINAL_DIGEST


def test_state_digest_is_stable_across_processes():
    code = ("import sys; from invar.model import *; from invar.testing import canonical_run;"
            "c = RunConfig(prompts_per_batch=2, group_size=2, max_staleness=1, sync_period=1,"
            " optimizer_steps=2, total_updates=3, seed=7);"
            "print(state_digest(initial_state(c)),"
            " state_digest(canonical_run(c, ('a','b')).state))")
    digests = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True, cwd=ROOT)
        digests.add(out.stdout.strip())
    here = f"{state_digest(initial_state(PINNED_CONFIG))} " \
           f"{state_digest(canonical_run(PINNED_CONFIG, ('a', 'b')).state)}"
    assert digests == {here}


def test_equal_states_have_equal_digests_whatever_the_number_spelling():
    a = initial_state(RunConfig(objective=ObjectiveConfig(kl_coef=0)))
    b = initial_state(RunConfig(objective=ObjectiveConfig(kl_coef=0.0)))
    assert a == b and hash(a) == hash(b)
    assert state_digest(a) == state_digest(b)


def test_states_with_different_cotangents_differ():
    """The pending cotangent is derived from the forward's log-probs, which stand behind
    `forward_digest`: states that would re-send different cotangents are not equal."""
    d = Driver(CONFIG)
    d.pump_to_phase(LearnerPhase.FORWARD, 0)
    (forward,) = [c for c in outstanding_commands(d.state) if isinstance(c, RunForward)]
    observed = reply(forward, CONFIG.optimizer_steps)
    current = observed.current_logprobs
    other = replace(observed, current_logprobs=Ragged(current.values - 0.3, current.lengths))
    a, _ = step(d.state, observed)
    b, _ = step(d.state, other)
    assert a != b and state_digest(a) != state_digest(b)
    assert step(a, TimerFired())[1] != step(b, TimerFired())[1]


def test_positions_are_their_tuple_rendered_once():
    """A step's `Positions` equals, hashes and renders as the tuple of its items (state
    digests are recorded in journals); the text is kept after the first repr and is not
    pickled (a cache, not part of the value)."""
    items = tuple(range(3, 300, 7))
    positions = Positions(items)
    assert positions == items and hash(positions) == hash(items)
    assert repr(positions) == repr(items) and repr(positions) is repr(positions)
    d = Driver(CONFIG)
    d.pump_to_phase(LearnerPhase.FORWARD, 0)
    learner = d.state.learner
    assert type(learner.positions) is Positions
    assert repr(learner) == repr(replace(learner, positions=tuple(learner.positions)))
    copied = pickle.loads(pickle.dumps(positions))
    assert type(copied) is Positions and copied == items and "_text" not in copied.__dict__
