"""A worker's frames (`invar.runtime.wire`): completions travel as bytes and come back as the
very event that was sent, journalled as its JSON encoding would have been; a load travels as
its JSON text; every malformed frame is refused with an error that names what is wrong."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from invar.model.messages import (
    Completion,
    Completions,
    DecodeError,
    RequestsCompleted,
    WeightsLoaded,
    completions_to_bytes,
    dumps,
)
from invar.model.schedule import RequestId
from invar.runtime.transport import FrameError
from invar.runtime.wire import event_frame, read_event_frame

int64 = st.integers(-(2 ** 63), 2 ** 63 - 1)
any_float = st.floats(allow_nan=True, allow_infinity=True)
completion = st.builds(
    Completion, request=st.builds(RequestId, int64, int64, int64), version=int64,
    tokens=st.lists(int64, max_size=6).map(tuple),
    behavior_logprobs=st.lists(any_float, max_size=6).map(tuple), reward=any_float)
frames = st.builds(RequestsCompleted, worker=st.text(max_size=8), incarnation=int64,
                   completions=st.lists(completion, max_size=8).map(Completions.of))


@settings(max_examples=300, deadline=None)
@given(frames, st.floats(0, 10))
def test_completions_travel_as_bytes_and_journal_as_their_json(event, seconds):
    header, blob = event_frame(event, compute_seconds=seconds)
    assert header["kind"] == "completions" and header["compute_seconds"] == seconds
    read, text = read_event_frame(header, blob)
    assert text is None  # the journal encodes it
    assert read == event  # bitwise: NaNs and -0.0 included
    assert dumps(read) == dumps(event)  # the journal's line is the one a JSON frame gave


def test_decoded_completions_are_read_only_views_of_the_frame():
    event = RequestsCompleted("w", 0, Completions.of(
        [Completion(RequestId(0, 1, 2), 3, (4, 5), (-0.5, -0.25), 1.0)] * 2))
    header, blob = event_frame(event)
    read, _ = read_event_frame(header, blob)
    assert isinstance(read, RequestsCompleted)
    for column in (read.completions.requests, read.completions.versions,
                   read.completions.rewards, read.completions.tokens.values,
                   read.completions.behavior_logprobs.values):
        assert not column.flags.writeable
        assert np.shares_memory(column, np.frombuffer(blob, dtype=np.uint8))


def test_a_load_travels_and_is_journalled_as_its_json_text():
    event = WeightsLoaded("worker-0", 1, 2, 3)
    header, blob = event_frame(event, load_seconds=0.5)
    assert header == {"kind": "event", "load_seconds": 0.5}
    assert read_event_frame(header, blob) == (event, blob.decode())


FRAME = RequestsCompleted("worker-0", 0, Completions.of(
    [Completion(RequestId(0, 0, s), 0, (1, 2, 3)[:s + 1], (-0.5, -1.0, -2.0)[:s + 1], 0.5)
     for s in range(3)]))


def _words(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<i8").copy()


@pytest.mark.parametrize("edit, error, where", [
    (lambda h, b: (h, b[:-8]), DecodeError,
     r"RequestsCompleted\.completions: \d+ words, but the row lengths ask for"),
    (lambda h, b: (h, b + b"\0" * 8), DecodeError,
     r"RequestsCompleted\.completions: \d+ words, but the row lengths ask for"),
    (lambda h, b: (h, b[:-3]), DecodeError, r"RequestsCompleted\.completions: .* 8-byte words"),
    (lambda h, b: (h, b[:8 * 7 * 3 - 8]), DecodeError,
     r"RequestsCompleted\.completions: \d+ bytes, expected 168 or more"),
    (lambda h, b: (h, _with_word(b, 3 * 4 + 1, -1)), DecodeError,
     r"RequestsCompleted\.completions\.tokens\.rows: expected non-negative"),
    (lambda h, b: (h, _with_word(b, 3 * 5 + 2, -2)), DecodeError,
     r"RequestsCompleted\.completions\.behavior_logprobs\.rows: expected non-negative"),
    (lambda h, b: (h, _with_word(_with_word(b, 3 * 4, 2 ** 62), 3 * 4 + 1, 2 ** 62)),
     DecodeError, r"RequestsCompleted\.completions: \d+ words, but the row lengths ask for"),
    (lambda h, b: ({**h, "n": -1}, b), DecodeError, r"RequestsCompleted\.completions\.n"),
    (lambda h, b: ({**h, "n": "3"}, b), DecodeError, r"RequestsCompleted\.completions\.n"),
    (lambda h, b: ({**h, "n": 2}, b), DecodeError, r"RequestsCompleted\.completions: "),
    (lambda h, b: ({**h, "worker": 7}, b), DecodeError, r"RequestsCompleted\.worker"),
    (lambda h, b: ({**h, "incarnation": True}, b), DecodeError,
     r"RequestsCompleted\.incarnation"),
    (lambda h, b: ({k: v for k, v in h.items() if k != "n"}, b), FrameError,
     r"completions frame: no 'n' in its header"),
    (lambda h, b: ({**h, "kind": "completion"}, b), FrameError,
     r"unexpected frame kind 'completion'"),
    (lambda h, b: ({"kind": "event"}, dumps(FRAME).encode()), FrameError,
     r"cannot report RequestsCompleted in an event frame"),
    (lambda h, b: ({"kind": "event"}, b), FrameError, r"event is not JSON text"),
])
def test_a_malformed_frame_is_refused_by_name(edit, error, where):
    header, blob = edit(*event_frame(FRAME))
    with pytest.raises(error, match=where):
        read_event_frame(header, blob)


def _with_word(blob: bytes, index: int, value: int) -> bytes:
    words = _words(blob)
    words[index] = value
    return words.tobytes()


def test_the_layout_is_pinned():
    """The bytes a worker of this frame layout sends: a change must bump FRAMES_VERSION."""
    words = _words(completions_to_bytes(FRAME.completions))
    assert words[:9].tolist() == [0, 0, 0, 0, 0, 1, 0, 0, 2]  # requests
    assert words[9:12].tolist() == [0, 0, 0]  # versions
    assert words[12:18].tolist() == [1, 2, 3, 1, 2, 3]  # token, then log-prob, row lengths
    assert words[18:21].view("<f8").tolist() == [0.5] * 3  # rewards
    assert words[21:27].tolist() == [1, 1, 2, 1, 2, 3]  # tokens
    assert words[27:].view("<f8").tolist() == [-0.5, -0.5, -1.0, -0.5, -1.0, -2.0]
