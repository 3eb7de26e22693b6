"""Messages: a lossless, versioned JSON encoding of every event and command, decode errors
that name the field at fault, and the naming rule (events are facts, commands imperatives)."""

from __future__ import annotations

import base64
import dataclasses
import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from invar.model import COMMAND_TYPES, EVENT_TYPES, DecodeError, decode, dumps, encode, loads
from invar.model import messages as m
from invar.model.messages import (
    ENCODING_VERSION,
    ObservationId,
    decode_with,
    encode_with,
    packed_fields,
)
from invar.model.objective import ObjectiveTerms
from invar.model.ragged import INT, Ragged
from invar.model.schedule import RequestId

# ---------------------------------------------------------------------------------------------
# Strategies: one per message type, built from explicit field strategies.

ints = st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1)
small = st.integers(min_value=0, max_value=10 ** 6)
names = st.text(max_size=12)
digests = st.text(alphabet="0123456789abcdefw.", max_size=32)
reals = st.floats(allow_nan=False, allow_infinity=False)
logprobs = st.floats(max_value=0.0, allow_nan=False, allow_infinity=False)
row = st.lists(logprobs, max_size=5).map(tuple)
matrix = st.lists(row, max_size=4).map(Ragged.of)
request_ids = st.builds(RequestId, batch=small, prompt=small, sample=small)
request_lists = st.lists(request_ids, max_size=5).map(tuple)
observations = st.builds(ObservationId, update=small, step=small, serial=small)
terms = st.builds(ObjectiveTerms, loss=reals, clip_fraction=reals, mean_ratio=reals,
                  mean_behavior_weight=reals, kl=reals, mean_staleness=reals, tokens=small)

STRATEGIES: dict[type, st.SearchStrategy] = {
    # events
    m.WorkerConnected: st.builds(m.WorkerConnected, worker=names, incarnation=small),
    m.WorkerLost: st.builds(m.WorkerLost, worker=names, incarnation=small),
    m.WeightsLoaded: st.builds(m.WeightsLoaded, worker=names, incarnation=small, load=small,
                               version=small),
    m.RequestsCompleted: st.builds(
        m.RequestsCompleted, worker=names, incarnation=small, completions=st.lists(st.builds(
            m.Completion, request=request_ids, version=small,
            tokens=st.lists(ints, max_size=6).map(tuple), behavior_logprobs=row, reward=reals),
            max_size=3).map(m.Completions.of)),
    m.ProbabilitiesReported: st.builds(m.ProbabilitiesReported, update=small, attempt=small,
                                       proximal=matrix, reference=st.none() | matrix),
    m.ForwardObserved: st.builds(m.ForwardObserved, observation=observations, attempt=small,
                                 pre_step_digest=digests, current_logprobs=matrix),
    m.StepFinished: st.builds(m.StepFinished, observation=observations, attempt=small,
                              post_step_digest=digests),
    m.UpdateCommitted: st.builds(m.UpdateCommitted, update=small, weights_digest=digests),
    m.VersionPublished: st.builds(m.VersionPublished, version=small, weights_digest=digests),
    m.LearnerStarted: st.builds(m.LearnerStarted, incarnation=small, committed_version=small,
                                weights_digest=digests),
    m.VersionEvaluated: st.builds(m.VersionEvaluated, version=small, reward=reals),
    m.CheckpointWritten: st.builds(m.CheckpointWritten, version=small, weights_digest=digests),
    m.TimerFired: st.builds(m.TimerFired),
    # commands
    m.LoadWeights: st.builds(m.LoadWeights, worker=names, incarnation=small, load=small,
                             version=small, weights_digest=digests),
    m.LaunchRequest: st.builds(m.LaunchRequest, worker=names, incarnation=small,
                               request=request_ids, version=small, seed=ints, prompt_index=small),
    m.LaunchRequests: st.integers(0, 4).flatmap(lambda n: st.builds(
        m.LaunchRequests, worker=names, incarnation=small, version=small,
        requests=st.lists(request_ids, min_size=n, max_size=n).map(tuple),
        seeds=st.lists(ints, min_size=n, max_size=n).map(tuple),
        prompt_indices=st.lists(small, min_size=n, max_size=n).map(tuple))),
    m.ScoreProbabilities: st.builds(m.ScoreProbabilities, update=small, attempt=small,
                                    requests=request_lists, reference=st.booleans()),
    m.RunForward: st.builds(m.RunForward, observation=observations, attempt=small,
                            requests=request_lists),
    m.ApplyCotangent: st.builds(m.ApplyCotangent, observation=observations, attempt=small,
                                pre_step_digest=digests, forward_digest=digests,
                                cotangent=st.lists(st.lists(reals, max_size=4),
                                                   max_size=3).map(Ragged.of),
                                terms=terms),
    m.Commit: st.builds(m.Commit, update=small, attempt=small, expected_digest=digests),
    m.Publish: st.builds(m.Publish, version=small, weights_digest=digests),
    m.RetainVersion: st.builds(m.RetainVersion, version=small),
    m.ReleaseVersion: st.builds(m.ReleaseVersion, version=small),
    m.Evaluate: st.builds(m.Evaluate, version=small),
    m.Checkpoint: st.builds(m.Checkpoint, version=small),
    m.SetTimer: st.builds(m.SetTimer),
}
ALL_TYPES = (*EVENT_TYPES, *COMMAND_TYPES)
any_message = st.one_of(*STRATEGIES.values())


def test_every_message_type_has_a_strategy():
    """A new event or command without a strategy here fails (so it cannot dodge the tests)."""
    assert set(STRATEGIES) == set(ALL_TYPES)
    assert len(ALL_TYPES) == len(set(ALL_TYPES))
    assert not set(EVENT_TYPES) & set(COMMAND_TYPES)


def test_message_types_are_frozen_dataclasses():
    for cls in ALL_TYPES:
        assert dataclasses.is_dataclass(cls), cls
        assert cls.__dataclass_params__.frozen, f"{cls.__name__} is not frozen"


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_round_trip(cls, data):
    message = data.draw(STRATEGIES[cls])
    assert type(message) is cls
    encoded = encode(message)
    assert encoded["type"] == cls.__name__ and encoded["v"] == ENCODING_VERSION
    assert decode(encoded) == message
    assert loads(dumps(message)) == message
    assert loads(dumps(message).encode()) == message
    # The JSON text is stable: encoding the decoded message gives the same text.
    assert dumps(loads(dumps(message))) == dumps(message)
    # The encoding is plain JSON data, and `dumps` writes what json writes for it.
    assert json.loads(json.dumps(encoded)) == json.loads(dumps(message))
    assert dumps(message) == json.dumps(encoded, separators=(",", ":"))


@settings(max_examples=60, deadline=None)
@given(message=any_message)
def test_packed_fields_travel_apart_and_back(message):
    """`encode_with` hands each packed field to the caller (the journal stores it by reference)
    and writes every other field as `encode` does; `decode_with` takes them back."""
    kept: dict[str, object] = {}

    def packed(name, value):
        kept[name] = value
        return {"kept": name}

    def unpacked(name, value, where):
        assert value == {"kept": name} and where == f"{type(message).__name__}.{name}"
        return kept[name]

    encoded = encode_with(message, packed)
    fields = packed_fields(type(message))
    assert set(kept) == {name for name in fields if getattr(message, name) is not None}
    assert {k: v for k, v in encoded.items() if k not in kept} == \
        {k: v for k, v in encode(message).items() if k not in kept}
    assert decode_with(encoded, unpacked) == message


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(max_size=4) | st.integers() | st.floats() | st.booleans() | st.none(),
        inner, max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_json_text_is_what_json_writes(value):
    """`json_text` writes packed arrays without scanning them; anything else as json does
    (non-text keys, NaN, nested lists and objects, text to escape)."""
    assert m.json_text(value) == json.dumps(value, separators=(",", ":"))


@settings(max_examples=60, deadline=None)
@given(message=any_message)
def test_decoded_types_are_exact(message):
    """Named tuples and nested dataclasses come back as themselves, not as lists or dicts."""
    back = loads(dumps(message))
    for f in dataclasses.fields(message):
        original, decoded = getattr(message, f.name), getattr(back, f.name)
        assert type(decoded) is type(original), f.name
    if isinstance(message, m.RequestsCompleted):
        assert all(isinstance(c.request, RequestId) for c in back.completions)
    if hasattr(message, "observation"):
        assert isinstance(back.observation, ObservationId)


# ---------------------------------------------------------------------------------------------
# Decode errors name what is wrong.


def decode_error(data) -> str:
    with pytest.raises(DecodeError) as info:
        decode(data)
    return str(info.value)


def test_unknown_type_is_named():
    message = decode_error({"type": "WorkerExploded", "v": ENCODING_VERSION})
    assert message.startswith("type") and "WorkerExploded" in message
    assert decode_error({"v": ENCODING_VERSION}).startswith("type")


def test_not_an_object_or_not_json():
    decode_error(["WorkerLost", "w0", 0])
    with pytest.raises(DecodeError):
        loads("{not json")
    with pytest.raises(DecodeError):
        loads(b"\xff\xfe")


@settings(max_examples=40, deadline=None)
@given(message=any_message,
       version=st.none() | st.integers().filter(lambda v: v != ENCODING_VERSION))
def test_wrong_version_is_named(message, version):
    data = encode(message)
    if version is None:
        del data["v"]
    else:
        data["v"] = version
    text = decode_error(data)
    assert text.startswith("v:") and type(message).__name__ in text


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_missing_field_is_named(data):
    cls = data.draw(st.sampled_from([c for c in ALL_TYPES if dataclasses.fields(c)]))
    encoded = encode(data.draw(STRATEGIES[cls]))
    field = data.draw(st.sampled_from([f.name for f in dataclasses.fields(cls)]))
    del encoded[field]
    text = decode_error(encoded)
    assert "missing" in text and repr(field) in text and cls.__name__ in text


@settings(max_examples=60, deadline=None)
@given(message=any_message, extra=st.text(min_size=1, max_size=8))
def test_extra_field_is_named(message, extra):
    encoded = encode(message)
    if extra in encoded:
        extra = extra + "_extra"
    encoded[extra] = 1
    text = decode_error(encoded)
    assert "unknown field" in text and repr(extra) in text


WRONG_VALUES = ({"bad": 1}, "text", 1.5, True, [[["deep"]]])


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_wrong_field_type_is_named(data):
    cls = data.draw(st.sampled_from([c for c in ALL_TYPES if dataclasses.fields(c)]))
    encoded = encode(data.draw(STRATEGIES[cls]))
    field = data.draw(st.sampled_from([f.name for f in dataclasses.fields(cls)]))
    original = encoded[field]
    wrong = data.draw(st.sampled_from([v for v in WRONG_VALUES
                                       if not _acceptable(original, v)]))
    encoded[field] = wrong
    try:
        decode(encoded)
    except DecodeError as exc:
        assert f"{cls.__name__}.{field}" in str(exc), str(exc)
    else:
        raise AssertionError(f"{cls.__name__}.{field} = {wrong!r} was accepted")


def _acceptable(original, wrong) -> bool:
    """Values of the same JSON shape as the original may legitimately decode."""
    if isinstance(original, str):
        return isinstance(wrong, str)
    if isinstance(original, bool):
        return isinstance(wrong, bool)
    if isinstance(original, float):
        return isinstance(wrong, (int, float)) and not isinstance(wrong, bool)
    if isinstance(original, list) and not original:
        return isinstance(wrong, list)  # an empty list says nothing about its items
    return False


@pytest.mark.parametrize("mutate, where", [
    (lambda d: d.__setitem__("request", d["request"][:-4]),
     "completions.request: 45 bytes, expected 48"),
    (lambda d: d.__setitem__("version", "not base64!"), "completions.version: not base64"),
    (lambda d: d.__setitem__("reward", [1.0, 1.0]), "completions.reward: expected base64"),
    (lambda d: d["tokens"].__setitem__("rows", [2, -1]), "completions.tokens.rows"),
    (lambda d: d["tokens"].__setitem__("rows", [2, 1]), "completions.tokens.i64: 32 bytes"),
    (lambda d: d["behavior_logprobs"].__setitem__("rows", [4]),
     "completions: 2 completions, but 2 token rows and 1 log-prob rows"),
    (lambda d: d["behavior_logprobs"].pop("f64"), "completions.behavior_logprobs: expected"),
    (lambda d: d.__setitem__("n", 3), "completions.request: 48 bytes, expected 72"),
    (lambda d: d.__setitem__("n", -1), "completions.n: expected a non-negative integer"),
    (lambda d: d.pop("version"), "completions: expected exactly the fields"),
])
def test_packed_completion_errors_name_the_path(mutate, where):
    sample = m.Completion(RequestId(0, 1, 0), 0, (1, 2), (-0.5, -0.25), 1.0)
    message = m.RequestsCompleted("w0", 0, m.Completions.of((sample, sample)))
    data = encode(message)
    mutate(data["completions"])
    assert f"RequestsCompleted.{where}" in decode_error(data)


def test_packed_arrays_are_exact_and_keep_ragged_rows():
    """Float64 bits survive packing (no decimal round trip), and rows keep their own lengths."""
    tiny, third = 5e-324, -1.0 / 3.0
    event = m.ProbabilitiesReported(2, 1, Ragged.of(((tiny, third), (), (-0.0,))),
                                    Ragged.of(((third,),)))
    back = loads(dumps(event))
    assert back == event and back.proximal[2][0] == 0.0 and str(back.proximal[2][0]) == "-0.0"
    assert [len(r) for r in back.proximal] == [2, 0, 1]


def test_packed_matrices_are_the_wire_format_of_encoding_3():
    """The text a log-prob matrix travels as, pinned (written by the encoder of tuples of
    floats that `Ragged` replaced): journals written before read the same, byte for byte."""
    third = -1.0 / 3.0
    event = m.ProbabilitiesReported(
        2, 1, Ragged.of(((-0.5, third), (), (-0.0, 5e-324))),
        Ragged.of(((third,), (-2.0,), (-1e-300, -1e300))))
    text = ('{"type":"ProbabilitiesReported","v":3,"update":2,"attempt":1,'
            '"proximal":{"rows":[2,0,2],"f64":"AAAAAAAA4L9VVVVVVVXVvwAAAAAAAACAAQAAAAAAAAA="},'
            '"reference":{"rows":[1,1,2],"f64":"VVVVVVVV1b8AAAAAAAAAwFnz+MIfbqWBnHUAiDzkN/4="}}')
    assert dumps(event) == text and loads(text) == event
    command = m.ApplyCotangent(ObservationId(0, 1, 2), 0, "w0", "f0",
                               Ragged.of(((0.1, -0.2), (0.3,))),
                               ObjectiveTerms(0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 3))
    assert '"cotangent":{"rows":[2,1],"f64":"mpmZmZmZuT+amZmZmZnJvzMzMzMzM9M/"}' in dumps(command)
    assert loads(dumps(command)) == command


def test_a_decoded_matrix_is_a_read_only_view_of_the_decoded_bytes():
    back = loads(dumps(m.ForwardObserved(ObservationId(0, 0, 0), 0, "w0",
                                         Ragged.of(((-0.5, -0.25),) * 3))))
    values = back.current_logprobs.values
    assert values.dtype == np.dtype("<f8") and not values.flags.writeable
    assert isinstance(values.base, bytes)  # no copy, no Python float per value
    with pytest.raises(ValueError):
        values[0] = 0.0


@pytest.mark.parametrize("mutate, where", [
    (lambda d: d.__setitem__("rows", [2, 1]), "ForwardObserved.current_logprobs.f64: 32 bytes, "
                                              "expected 24"),
    (lambda d: d.__setitem__("rows", [2, -2]), "ForwardObserved.current_logprobs.rows"),
    (lambda d: d.__setitem__("rows", [2.0, 2]), "ForwardObserved.current_logprobs.rows"),
    (lambda d: d.__setitem__("f64", "not base64!"), "current_logprobs.f64: not base64"),
    (lambda d: d.__setitem__("f64", [-0.5, -0.5]), "current_logprobs.f64: expected base64"),
    (lambda d: d.pop("rows"), "current_logprobs: expected exactly the fields"),
    (lambda d: d.__setitem__("i64", ""), "current_logprobs: expected exactly the fields"),
])
def test_packed_matrix_errors_name_the_field(mutate, where):
    data = encode(m.ForwardObserved(ObservationId(0, 0, 0), 0, "w0",
                                    Ragged.of(((-0.5, -0.25), (-1.0, -2.0)))))
    mutate(data["current_logprobs"])
    assert where in decode_error(data)


def test_an_integer_matrix_is_packed_as_its_float64_values():
    """An int64 matrix is no log-prob matrix (the core refuses it before anything is
    journalled), but it is never packed as int64 bytes that would read back as other floats."""
    event = m.ForwardObserved(ObservationId(0, 0, 0), 0, "w0", Ragged.of(((1, 2),), INT))
    assert loads(dumps(event)).current_logprobs == Ragged.of(((1.0, 2.0),))


def test_decoded_completions_are_views_of_the_wire_that_read_as_records():
    """A frame decodes to columns over the decoded bytes (read-only, not copied out) that equal,
    hash, print and read back as the frame of the records it was made from, in rows of one
    length or several, and encode again to the very same text."""
    made = (m.Completion(RequestId(3, 1, 0), 2, (1, 2), (-0.5, -0.25), 1.0),
            m.Completion(RequestId(3, 1, 1), 2, (4, 5), (-1.5, -0.0), 0.0))
    for records in (made, (made[0], dataclasses.replace(made[1], tokens=(7,))),
                    tuple(dataclasses.replace(c, tokens=(), behavior_logprobs=())
                          for c in made)):
        frame = m.Completions.of(records)
        text = dumps(m.RequestsCompleted("w", 1, frame))
        back = loads(text).completions
        assert back == frame and hash(back) == hash(frame) and repr(back) == repr(frame)
        assert tuple(back) == records and [back[i] for i in range(len(back))] == list(records)
        assert all(type(c.request) is RequestId and type(c.tokens) is tuple for c in back)
        for column in (back.requests, back.versions, back.rewards, back.tokens.values,
                       back.behavior_logprobs.values):
            assert not column.flags.writeable and not column.flags.owndata
        assert dumps(m.RequestsCompleted("w", 1, back)) == text


def test_completions_pack_as_the_records_did():
    """The columns' encoding (journal format 3) is the one the records had: byte for byte."""
    frame = m.Completions.of((m.Completion(RequestId(3, 1, 0), 2, (1, 2), (-0.5, -0.25), 1.0),
                              m.Completion(RequestId(3, 1, 1), 2, (4,), (-1.5,), 0.0)))
    assert json.dumps(m.pack_completions(frame), separators=(",", ":")) == (
        '{"n":2,"request":"AwAAAAAAAAABAAAAAAAAAAAAAAAAAAAAAwAAAAAAAAABAAAAAAAAAAEAAAAAAAAA",'
        '"version":"AgAAAAAAAAACAAAAAAAAAA==",'
        '"tokens":{"rows":[2,1],"i64":"AQAAAAAAAAACAAAAAAAAAAQAAAAAAAAA"},'
        '"behavior_logprobs":{"rows":[2,1],"f64":"AAAAAAAA4L8AAAAAAADQvwAAAAAAAPi/"},'
        '"reward":"AAAAAAAA8D8AAAAAAAAAAA=="}')


launch_frames = st.tuples(names, small).flatmap(lambda key: st.lists(
    st.integers(0, 4).flatmap(lambda n: st.builds(
        m.LaunchRequests, worker=st.just(key[0]), incarnation=st.just(key[1]), version=small,
        requests=st.lists(request_ids, min_size=n, max_size=n).map(tuple),
        seeds=st.lists(ints, min_size=n, max_size=n).map(tuple),
        prompt_indices=st.lists(small, min_size=n, max_size=n).map(tuple))),
    min_size=1, max_size=3).filter(lambda frame: any(c.requests for c in frame)))


@given(launch_frames)
@settings(max_examples=100, deadline=None)
def test_packed_launches_round_trip(frame):
    """A frame's launches (one worker incarnation) travel as columns and come back as each
    command's launches, in order."""
    packed = json.loads(json.dumps(m.pack_launches(frame)))
    back = m.unpack_launches(packed)
    assert back == tuple(launch for command in frame for launch in command.launches())
    assert all(type(c.request) is RequestId for c in back)


@given(launch_frames)
@settings(max_examples=100, deadline=None)
def test_packed_launch_columns_are_int64_le_in_command_order(frame):
    """Each column is its values, command after command, as little-endian int64 in base64."""
    def column(values):
        return base64.b64encode(np.asarray(values, dtype="<i8").tobytes()).decode("ascii")

    packed = m.pack_launches(frame)
    assert packed["request"] == column([x for c in frame for r in c.requests for x in r])
    assert packed["version"] == column([c.version for c in frame for _ in c.requests])
    assert packed["seed"] == column([seed for c in frame for seed in c.seeds])
    assert packed["prompt_index"] == column([p for c in frame for p in c.prompt_indices])


def _launches(worker: str, incarnation: int, *requests: RequestId) -> m.LaunchRequests:
    return m.LaunchRequests(worker, incarnation, 0, requests, (12345,) * len(requests),
                            (7,) * len(requests))


def test_pack_launches_takes_one_worker_incarnation():
    first = _launches("w0", 0, RequestId(0, 0, 0))
    with pytest.raises(ValueError, match="more than one worker incarnation"):
        m.pack_launches([first, dataclasses.replace(first, incarnation=1)])
    with pytest.raises(ValueError, match="no launches"):
        m.pack_launches([])
    with pytest.raises(ValueError, match="no launches"):
        m.pack_launches([_launches("w0", 0)])


def test_launches_need_a_seed_and_a_prompt_per_request():
    with pytest.raises(ValueError, match="2 requests, 1 seeds, 2 prompt indices"):
        m.LaunchRequests("w0", 0, 0, (RequestId(0, 0, 0), RequestId(0, 0, 1)), (1,), (0, 0))


@pytest.mark.parametrize("mutate, where", [
    (lambda d: d.__setitem__("request", d["request"][:-4]), "launches.request: 45 bytes"),
    (lambda d: d.__setitem__("seed", "not base64!"), "launches.seed: not base64"),
    (lambda d: d.__setitem__("version", [0, 0]), "launches.version: expected base64"),
    (lambda d: d.__setitem__("prompt_index", d["version"][:4]), "launches.prompt_index: 3 bytes"),
    (lambda d: d.__setitem__("n", 3), "launches.request: 48 bytes, expected 72"),
    (lambda d: d.__setitem__("n", True), "launches.n: expected a non-negative integer"),
    (lambda d: d.__setitem__("worker", 7), "launches.worker: expected str"),
    (lambda d: d.__setitem__("incarnation", "0"), "launches.incarnation: expected an integer"),
    (lambda d: d.__setitem__("v", ENCODING_VERSION - 1), "launches.v: launches encoded with"),
    (lambda d: d.__setitem__("type", "LoadWeights"), "launches.type: expected 'LaunchRequest'"),
    (lambda d: d.pop("seed"), "launches: expected exactly the fields"),
    (lambda d: d.__setitem__("extra", 1), "launches: expected exactly the fields"),
])
def test_packed_launch_errors_name_the_field(mutate, where):
    data = m.pack_launches([_launches("w0", 0, RequestId(0, 1, 0), RequestId(0, 1, 1))])
    mutate(data)
    with pytest.raises(DecodeError) as info:
        m.unpack_launches(data)
    assert where in str(info.value)
    with pytest.raises(DecodeError, match="launches: expected an object"):
        m.unpack_launches([data])


def test_nested_dataclass_error_names_the_path():
    command = m.ApplyCotangent(ObservationId(0, 0, 0), 0, "w0", "f0", Ragged.of(((0.1,),)),
                               ObjectiveTerms(0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1))
    data = encode(command)
    data["terms"]["tokens"] = "many"
    assert "ApplyCotangent.terms.tokens" in decode_error(data)
    data = encode(command)
    del data["terms"]["kl"]
    text = decode_error(data)
    assert "ApplyCotangent.terms" in text and "'kl'" in text


# ---------------------------------------------------------------------------------------------
# Naming: events are facts (past tense), commands are imperatives.

IRREGULAR_PARTICIPLE = re.compile(
    r"(Lost|Sent|Done|Gone|Begun|Known|Made|Held|Built|Kept|Written)$")


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
def test_event_names_are_past_tense(cls):
    assert re.search(r"ed$", cls.__name__) or IRREGULAR_PARTICIPLE.search(cls.__name__), \
        f"event {cls.__name__} is not named as a fact (past tense)"


@pytest.mark.parametrize("cls", COMMAND_TYPES, ids=lambda c: c.__name__)
def test_command_names_are_not_past_tense(cls):
    assert not re.search(r"ed$", cls.__name__) and not IRREGULAR_PARTICIPLE.search(cls.__name__), \
        f"command {cls.__name__} is named as a fact, not an imperative"
