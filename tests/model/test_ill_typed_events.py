"""An event built by hand (a plug-in, an in-process caller: no `decode` in between) with a
field of the wrong type is refused with a `ProtocolError` naming the field, whatever the
state, never met with a TypeError or AttributeError from deep inside a handler."""

from __future__ import annotations

import dataclasses
import functools
import typing

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.core_driver import small_config
from invar.model import ObjectiveConfig, ProtocolError, Reason, initial_state, step
from invar.model.messages import (
    EVENT_TYPES,
    Completions,
    ObservationId,
    VersionEvaluated,
    WorkerLost,
)
from invar.model.ragged import Ragged
from invar.testing import canonical_run

# A reference matrix in the scores; every boundary reached (evaluations and checkpoints).
CONFIG = small_config(objective=ObjectiveConfig(kl_coef=0.1), eval_every=1, checkpoint_every=1)


@functools.cache
def trace() -> tuple[tuple[object, ...], tuple[object, ...]]:
    """A complete honest run's events, and the state before each (then the final state)."""
    run = canonical_run(CONFIG)
    states = [initial_state(CONFIG)]
    for event in run.events:
        outcome = step(states[-1], event)
        assert not isinstance(outcome, ProtocolError), outcome
        states.append(outcome[0])
    return tuple(run.events) + (WorkerLost("w0", 0),), tuple(states)


# What each annotation holds once decoded (a float may be written as an int; a bool is no int).
ACCEPTED: dict[typing.Any, tuple[type, ...]] = {
    int: (int,), float: (float, int, np.float64), str: (str,), Ragged: (Ragged,),
    Ragged | None: (Ragged, type(None)), Completions: (Completions,),
    ObservationId: (ObservationId,),
}
WRONG = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=4),
    st.binary(max_size=4), st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
    st.lists(st.integers(0, 3), max_size=3), st.integers(0, 3).map(np.int64),
    st.floats(-5, 0).map(np.float32), st.just(Ragged.of([[-0.5]])),
    st.just(ObservationId(0, 0, 0)), st.just(object()))


def field_names(kind: type) -> list[str]:
    """Every field of an event type, an observation's parts as `observation.update` etc."""
    names = []
    for name, hint in typing.get_type_hints(kind).items():
        names.append(name)
        if hint is ObservationId:
            names += [f"{name}.{part}" for part in ObservationId._fields]
    return names


def with_field(event: object, name: str, value: object) -> object:
    outer, _, part = name.partition(".")
    if part:
        value = getattr(event, outer)._replace(**{part: value})
    return dataclasses.replace(event, **{outer: value})  # type: ignore[type-var]


def accepted(kind: type, name: str) -> tuple[type, ...]:
    outer, _, part = name.partition(".")
    return ACCEPTED[int] if part else ACCEPTED[typing.get_type_hints(kind)[outer]]


def test_every_event_type_with_fields_is_in_the_trace():
    kinds = {type(event) for event in trace()[0]}
    assert {kind for kind in EVENT_TYPES if dataclasses.fields(kind)} <= kinds


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_an_ill_typed_field_is_refused_naming_it(data):
    events, states = trace()
    at = data.draw(st.integers(0, len(events) - 1), label="event")
    event = events[at]
    # The state the honest run applied it to (its deepest path), or any other.
    state = states[min(at, len(states) - 1)] if data.draw(st.booleans(), label="its state") \
        else data.draw(st.sampled_from(states), label="state")
    name = data.draw(st.sampled_from(field_names(type(event))), label="field")
    value = data.draw(WRONG.filter(lambda v: type(v) not in accepted(type(event), name)),
                      label="value")
    outcome = step(state, with_field(event, name, value))
    assert isinstance(outcome, ProtocolError), outcome
    assert outcome.reason is Reason.MALFORMED_PAYLOAD and outcome.state is state
    assert outcome.detail.startswith(f"{name}: expected "), outcome.detail
    assert outcome.detail.endswith(f"got {type(value).__name__}"), outcome.detail


def test_a_float_field_takes_an_int_as_decoding_does():
    events, states = trace()
    evaluated = next(e for e in events if type(e) is VersionEvaluated)
    at = events.index(evaluated)
    as_int = step(states[at], dataclasses.replace(evaluated, reward=int(evaluated.reward)))
    assert not isinstance(as_int, ProtocolError), as_int
