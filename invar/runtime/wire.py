"""What a rollout worker's frames carry: written once, for the worker process, the in-memory
workers of the tests and the driver that reads them.

A frame is the transport's `header | blob` (`invar.runtime.transport`). A worker sends:

- `hello` first: its name, its message encoding (`ENCODING_VERSION`) and its frame layout
  (`FRAMES_VERSION`); a driver refuses a worker that differs in either, naming both;
- a reply of completions as a `completions` frame: the header names the worker, its
  incarnation and the count, the blob holds the columns as bytes
  (`messages.completions_to_bytes`). A real run's frames are hundreds of completions: as
  JSON text they cost the driver a base64 and JSON pass over ~250 KB each on its event path,
  and the worker as much to write; as bytes, decoding is a view;
- any other event (a finished load) as an `event` frame: its compact JSON text as the blob,
  journalled as received;
- while it holds launches or a load it has not answered, a `working` frame naming them (their
  requests as `[batch, prompt, sample]`, their load serials), every few seconds: no event, a
  sign of life the driver's retry timer reads (`invar.runtime.retry`).

Measurements (seconds computing, verifier failures) ride in the header beside the event: they
are never part of an event, so neither the core nor the journal sees them.
"""

from __future__ import annotations

import json
from typing import Any

from invar.model.messages import (
    ENCODING_VERSION,
    Event,
    RequestsCompleted,
    WeightsLoaded,
    completed_from_bytes,
    completions_to_bytes,
    decode,
    dumps,
)
from invar.runtime.transport import FrameError

FRAMES_VERSION = 3
"""The layout of a worker's frames (2: completions as binary columns; 3: `working` frames)."""

_COMPLETIONS_HEADER = ("worker", "incarnation", "n")


def hello(name: str) -> dict[str, Any]:
    """A worker's first frame (its header; the blob is empty)."""
    return {"kind": "hello", "name": name, "encoding": ENCODING_VERSION,
            "frames": FRAMES_VERSION}


def check_hello(name: str, header: dict[str, Any]) -> None:
    """`FrameError` unless `header` is the hello of a worker that speaks this driver's
    frames: a worker of another invar version would misread every frame, so say so plainly."""
    if header.get("kind") != "hello":
        raise FrameError(f"first frame of {name} is {header.get('kind')!r}, not hello")
    for field, ours, what in (("encoding", ENCODING_VERSION, "message encoding"),
                              ("frames", FRAMES_VERSION, "frame layout")):
        if header.get(field) != ours:
            raise FrameError(f"{name} speaks {what} {header.get(field)!r}, this driver "
                             f"{ours}: run the same invar version on every host")


def event_frame(event: Event, **measurements: Any) -> tuple[dict[str, Any], bytes]:
    """The frame a worker sends `event` in, with `measurements` in its header."""
    if isinstance(event, RequestsCompleted):
        return ({"kind": "completions", "worker": event.worker,
                 "incarnation": event.incarnation, "n": len(event.completions),
                 **measurements}, completions_to_bytes(event.completions))
    return {"kind": "event", **measurements}, dumps(event).encode()


def working_frame(requests: list[tuple[int, ...]], loads: list[int]) -> dict[str, Any]:
    """The header of a worker's `working` frame (the blob is empty)."""
    return {"kind": "working", "requests": [list(r) for r in requests], "loads": loads}


def read_working_frame(header: dict[str, Any]) -> tuple[list[tuple[int, ...]], list[int]]:
    """The requests and load serials a `working` frame names; `FrameError` if it is malformed."""
    requests, loads = header.get("requests"), header.get("loads")
    if not (isinstance(requests, list) and all(
            isinstance(r, list) and len(r) == 3 and all(type(x) is int for x in r)
            for r in requests)):
        raise FrameError("working frame: 'requests' is not a list of [batch, prompt, sample]")
    if not (isinstance(loads, list) and all(type(x) is int for x in loads)):
        raise FrameError("working frame: 'loads' is not a list of load serials")
    return [tuple(r) for r in requests], loads


def read_event_frame(header: dict[str, Any], blob: bytes) -> tuple[Event, str | None]:
    """The event a worker's frame carries, and its JSON text when the frame carried it as text
    (journalled as is; None: the journal encodes the event). `FrameError` or `DecodeError`
    names what is wrong."""
    kind = header["kind"]
    if kind == "completions":
        for field in _COMPLETIONS_HEADER:
            if field not in header:
                raise FrameError(f"completions frame: no {field!r} in its header")
        return completed_from_bytes(header["worker"], header["incarnation"], header["n"],
                                    blob), None
    if kind != "event":
        raise FrameError(f"unexpected frame kind {kind!r}")
    try:
        raw = blob.decode("utf-8")
        data = json.loads(raw)
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError both are
        raise FrameError(f"event is not JSON text: {error}") from None
    event = decode(data)
    if not isinstance(event, WeightsLoaded):
        raise FrameError(f"a worker cannot report {type(event).__name__} in an event frame")
    return event, raw
