"""Events (facts, past tense) that `step` consumes and commands (imperatives) it returns.

All are frozen dataclasses with a stable, versioned JSON encoding: the runtime journals them,
the checker prints them, and `decode(encode(m)) == m` for every type (tested).

Messages addressed to or coming from a component carry that component's *incarnation*
(workers) or *attempt* (the learner's incarnation), so a reply from a dead incarnation is
recognised as late, and a command meant for a dead one is ignored by its successor.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import hashlib
import itertools
import json
import struct
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Union

import numpy as np

from invar.model.completions import Completion as Completion
from invar.model.completions import Completions as Completions
from invar.model.objective import ObjectiveTerms
from invar.model.ragged import FLOAT, Ragged
from invar.model.schedule import RequestId

ENCODING_VERSION = 3
"""Bumped whenever a field of any message changes meaning; decode refuses other versions.
2: a worker's replies arrive as frames (`RequestsCompleted`), no longer one event per sample.
3: number arrays travel packed (`pack_matrix`, `pack_completions`): log-prob matrices and a
frame's completions are most of a run's journal, and as JSON numbers each value costs ~20
characters and a parse."""

Matrix = Ragged
"""A log-prob matrix: a row of float64 per sample (`Ragged`; see `logprob_matrix`). Events
carry it as such from the learner to the journal: checked, digested, padded and packed as
one array, never as Python floats."""


class ObservationId(NamedTuple):
    """A forward pass the core asked for: its binding travels with the cotangent."""

    update: int
    step: int
    serial: int
    """Unique per forward the core ever requested, so a redo of the same step is a new one."""


# ---------------------------------------------------------------------------------------------
# Events: what happened.


@dataclass(frozen=True)
class WorkerConnected:
    """A rollout worker came up (a higher incarnation replaces, and so retires, a lower one)."""

    worker: str
    incarnation: int


@dataclass(frozen=True)
class WorkerLost:
    """A rollout worker's incarnation is gone (process died, connection dropped)."""

    worker: str
    incarnation: int


@dataclass(frozen=True)
class WeightsLoaded:
    """A worker finished load number `load`: it now samples from `version`."""

    worker: str
    incarnation: int
    load: int
    version: int


@dataclass(frozen=True)
class RequestsCompleted:
    """A worker finished `completions` in one call: one reply frame is one event, so the core,
    the journal and the digests run once per frame. Each completion is judged on its own (a
    frame may repeat some and bring others); a frame with any malformed one is refused whole.
    The completions travel as columns (`Completions`; `Completions.of` makes them from
    records)."""

    worker: str
    incarnation: int
    completions: Completions


@dataclass(frozen=True)
class ProbabilitiesReported:
    """The learner scored update's samples with the weights frozen at the update's start."""

    update: int
    attempt: int
    proximal: Matrix
    reference: Matrix | None


@dataclass(frozen=True)
class ForwardObserved:
    """The learner ran the forward of `observation` from the state with `pre_step_digest`."""

    observation: ObservationId
    attempt: int
    pre_step_digest: str
    current_logprobs: Matrix


@dataclass(frozen=True)
class StepFinished:
    """The learner applied the cotangent of `observation` and stepped its optimizer."""

    observation: ObservationId
    attempt: int
    post_step_digest: str


@dataclass(frozen=True)
class UpdateCommitted:
    """The single durable commit point: the weights after `update` are on stable storage."""

    update: int
    weights_digest: str


@dataclass(frozen=True)
class VersionPublished:
    """`version`'s weights are in the store that workers load from."""

    version: int
    weights_digest: str


@dataclass(frozen=True)
class LearnerStarted:
    """The learner (re)started from its last commit; incarnation 0 is the first start."""

    incarnation: int
    committed_version: int
    weights_digest: str


@dataclass(frozen=True)
class VersionEvaluated:
    """The learner evaluated committed `version` on the held-out prompts (answers Evaluate)."""

    version: int
    reward: float


@dataclass(frozen=True)
class CheckpointWritten:
    """Committed `version` is durably kept as a checkpoint (answers Checkpoint)."""

    version: int
    weights_digest: str


@dataclass(frozen=True)
class TimerFired:
    """The retry timer the core set has expired."""


# ---------------------------------------------------------------------------------------------
# Commands: what to do.


@dataclass(frozen=True)
class LoadWeights:
    """Worker: load published `version` (the reply names `load`, so late replies are known)."""

    worker: str
    incarnation: int
    load: int
    version: int
    weights_digest: str


@dataclass(frozen=True)
class LaunchRequest:
    """Worker: sample `request` from `version` with `seed`, on task prompt `prompt_index`."""

    worker: str
    incarnation: int
    request: RequestId
    version: int
    seed: int
    prompt_index: int


@dataclass(frozen=True)
class LaunchRequests:
    """Worker: sample each of `requests` from `version`, with its seed and task prompt: the
    launches of one batch that the core gives one worker incarnation in one decision, as
    columns (the mirror of `RequestsCompleted`). Each is `LaunchRequest` `i` of `launches()`;
    the transport sends them in one frame, and a model checker's network carries each alone."""

    worker: str
    incarnation: int
    version: int
    requests: tuple[RequestId, ...]
    seeds: tuple[int, ...]
    prompt_indices: tuple[int, ...]

    def __post_init__(self) -> None:
        if not len(self.requests) == len(self.seeds) == len(self.prompt_indices):
            raise ValueError(f"LaunchRequests: {len(self.requests)} requests, "
                             f"{len(self.seeds)} seeds, {len(self.prompt_indices)} prompt "
                             f"indices (one each per request)")

    def launches(self) -> tuple[LaunchRequest, ...]:
        return tuple(
            LaunchRequest(self.worker, self.incarnation, request, self.version, seed, prompt)
            for request, seed, prompt in zip(self.requests, self.seeds, self.prompt_indices))


def one_per_request(commands: Iterable[Command]) -> tuple[Command, ...]:
    """`commands` in order, each `LaunchRequests` replaced by its launches: commands as a
    component that takes them one at a time sees them (the model checker's network, tests)."""
    out: list[Command] = []
    for command in commands:
        if type(command) is LaunchRequests:
            out.extend(command.launches())
        else:
            out.append(command)
    return tuple(out)


@dataclass(frozen=True)
class ScoreProbabilities:
    """Learner: score these samples with the current (frozen) weights, and the reference."""

    update: int
    attempt: int
    requests: tuple[RequestId, ...]
    reference: bool


@dataclass(frozen=True)
class RunForward:
    """Learner: forward these samples under the current weights, keep the graph."""

    observation: ObservationId
    attempt: int
    requests: tuple[RequestId, ...]


@dataclass(frozen=True)
class ApplyCotangent:
    """Learner: backward with this cotangent and step, only if the binding is the pending one."""

    observation: ObservationId
    attempt: int
    pre_step_digest: str
    forward_digest: str
    """Digest of the current log-probs the cotangent was computed from (`matrix_digest`): a
    learner whose pending forward returned anything else must refuse it."""
    cotangent: Matrix
    terms: ObjectiveTerms


@dataclass(frozen=True)
class Commit:
    """Learner: write the state after `update` durably as version `update + 1`."""

    update: int
    attempt: int
    expected_digest: str


@dataclass(frozen=True)
class Publish:
    """Copy committed `version` into the store that workers load from."""

    version: int
    weights_digest: str


@dataclass(frozen=True)
class RetainVersion:
    """Keep `version`'s weights in the store: a batch still needs them."""

    version: int


@dataclass(frozen=True)
class ReleaseVersion:
    """`version`'s weights are needed by no unfinished batch: the store may drop them, once the
    journal holds the release durably (a restart from an older journal could need them)."""

    version: int


@dataclass(frozen=True)
class Evaluate:
    """Evaluate committed `version` on held-out prompts (a hard boundary); re-sent until
    `VersionEvaluated` arrives."""

    version: int


@dataclass(frozen=True)
class Checkpoint:
    """Keep committed `version` as a checkpoint, written atomically (a hard boundary); re-sent
    until `CheckpointWritten` arrives."""

    version: int


@dataclass(frozen=True)
class SetTimer:
    """Arm the retry timer; when it fires, every outstanding command is sent again."""


Event = (
    WorkerConnected | WorkerLost | WeightsLoaded | RequestsCompleted | ProbabilitiesReported
    | ForwardObserved | StepFinished | UpdateCommitted | VersionPublished | LearnerStarted
    | VersionEvaluated | CheckpointWritten | TimerFired
)
Command = (
    LoadWeights | LaunchRequest | LaunchRequests | ScoreProbabilities | RunForward
    | ApplyCotangent | Commit | Publish | RetainVersion | ReleaseVersion | Evaluate | Checkpoint
    | SetTimer
)
EVENT_TYPES: tuple[type, ...] = typing.get_args(Event)
COMMAND_TYPES: tuple[type, ...] = typing.get_args(Command)
_REGISTRY: dict[str, type] = {t.__name__: t for t in (*EVENT_TYPES, *COMMAND_TYPES)}


# ---------------------------------------------------------------------------------------------
# JSON encoding: {"type": name, "v": ENCODING_VERSION, <fields>}, tuples as lists.


Built = typing.TypeVar("Built")


def built(cls: type[Built], fields: dict[str, Any]) -> Built:
    """An instance of the frozen dataclass `cls` holding `fields` (every field, by name), made
    without `__init__`'s `object.__setattr__` per field: for the records made by the hundred
    per event (completions decoded, samples stored, launches sent). Nothing is checked or
    defaulted: the caller passes exactly the dataclass's fields."""
    record = object.__new__(cls)
    object.__setattr__(record, "__dict__", fields)
    return record


class DecodeError(ValueError):
    """A message that is not a well-formed encoding of a known type; names the field at fault."""


def encode(message: Any) -> dict[str, Any]:
    return {"type": type(message).__name__, "v": ENCODING_VERSION, **_encode_fields(message)}


def decode(data: Any) -> Any:
    return decode_with(data, None)


Packer = Callable[[str, Any], Any]
Unpacker = Callable[[str, Any, str], Any]


def encode_with(message: Any, packed: Packer) -> dict[str, Any]:
    """`encode(message)` with each packed field (`packed_fields`: a frame's completions, a
    log-prob matrix; a None stays None) written as `packed(name, value)` returns: how the
    journal keeps those arrays apart, by reference."""
    body = {"type": type(message).__name__, "v": ENCODING_VERSION}
    plan: tuple[tuple[str, Any], ...] = _encoding_plan(type(message))  # type: ignore[arg-type]
    for name, packer in plan:
        value = getattr(message, name)
        body[name] = _to_json(value) if packer is None or value is None else packed(name, value)
    return body


def decode_with(data: Any, unpacked: Unpacker | None) -> Any:
    """`decode(data)`, each packed field (`packed_fields`; a None stays None) read by
    `unpacked(name, value, where)` when it is given: the mirror of `encode_with`."""
    if not isinstance(data, dict):
        raise DecodeError(f"message must be a JSON object, got {type(data).__name__}")
    name = data.get("type")
    if name not in _REGISTRY:
        raise DecodeError(f"type: unknown message type {name!r}")
    if data.get("v") != ENCODING_VERSION:
        raise DecodeError(f"v: {name} encoded with version {data.get('v')!r}, "
                          f"expected {ENCODING_VERSION}")
    cls = _REGISTRY[name]
    return _decode_dataclass(cls, data, name, skip=("type", "v"), unpacked=unpacked)


def packed_fields(cls: type) -> tuple[str, ...]:
    """The fields of message type `cls` that travel as packed arrays (`pack_matrix`,
    `pack_completions`): the token and log-prob payloads."""
    plan: tuple[tuple[str, Any], ...] = _encoding_plan(cls)
    return tuple(name for name, packer in plan if packer is not None)


def dumps(message: Any) -> str:
    """`message` as compact JSON text: `json.dumps(encode(message), separators=(",", ":"))`,
    byte for byte."""
    return json_text(encode(message))


_COMPACT = json.JSONEncoder(separators=(",", ":")).encode


def json_text(value: Any) -> str:
    """`json.dumps(value, separators=(",", ":"))`, byte for byte, for an encoded message: the
    packed arrays in it (`Packed`) are written as they are, not scanned for characters to
    escape (they have none), which is most of the work for a frame of completions or a
    matrix of log-probs. Any other dict, as json would, when a key is not text."""
    kind = type(value)
    if kind is Packed:
        return "{" + ",".join([f'"{key}":"{item}"' if type(item) is str
                               else f'"{key}":{json_text(item)}'
                               for key, item in value.items()]) + "}"
    if kind is dict and all(type(key) is str for key in value):
        return "{" + ",".join([_COMPACT(key) + ":" + json_text(item)
                               for key, item in value.items()]) + "}"
    if kind is list and value and type(value[0]) in (dict, list):
        return "[" + ",".join(map(json_text, value)) + "]"
    return _COMPACT(value)  # scalars and lists of scalars: in C


def matrix_digest(*matrices: Matrix | None) -> str:
    """Content digest of log-prob matrices: binds a cotangent to the forward it was computed
    from, and a proximal score to the update. Learners compute the same: blake2b_96 over each
    matrix's rows as little-endian float64, back to back, then `|` (None: just the `|`)."""
    h = hashlib.blake2b(digest_size=12)
    for matrix in matrices:
        if matrix is not None:
            h.update(np.ascontiguousarray(matrix.values).data)
        h.update(b"|")
    return h.hexdigest()


def logprob_matrix(values: np.ndarray) -> Matrix:
    """A learner's log-probs, an (n, T) array with every row whole (fixed-shape generation),
    as a `Matrix` of n rows of T float64 values: one copy, no Python floats."""
    table = np.array(values, dtype=FLOAT, order="C")
    table.flags.writeable = False  # nothing else holds it: shared, not copied again
    return Ragged.from_table(table)


def parse_json(text: str | bytes) -> Any:
    """`json.loads`, with a document nested too deeply for the parser (a RecursionError, which
    is no ValueError) refused as a malformed one is: a ValueError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply to be read") from None


def loads(text: str | bytes) -> Any:
    try:
        data = parse_json(text)
    except ValueError as exc:
        raise DecodeError(f"not JSON: {exc}") from None
    return decode(data)


_SCALARS = (int, float, str, bool, type(None))


def _encode_fields(message: Any) -> dict[str, Any]:
    """A dataclass's fields by its schema: packed arrays where the type says so."""
    body = {}
    plan: tuple[tuple[str, Any], ...] = _encoding_plan(type(message))  # type: ignore[arg-type]
    for name, packer in plan:
        value = getattr(message, name)
        body[name] = _to_json(value) if packer is None or value is None else packer(value)
    return body


@functools.cache
def _encoding_plan(cls: type) -> tuple[tuple[str, Any], ...]:
    """Each field's name and its packer (None: plain JSON), looked up once per type."""
    hints, names = _schema(cls)
    return tuple((name, _PACKERS.get(hints[name])) for name in names)


def _to_json(value: Any) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is tuple:
        # Payload fast path: rows of numbers become lists without a call per number.
        if not value or type(value[0]) in _SCALARS:
            return list(value)
        return [_to_json(v) for v in value]
    if isinstance(value, tuple):  # named tuples (RequestId, ObservationId)
        return list(value)
    if hasattr(kind, "__dataclass_fields__"):
        return _encode_fields(value)
    return value


# ---------------------------------------------------------------------------------------------
# Packed arrays: little-endian float64 / int64 bytes in base64, ragged rows by their lengths.
# Exact (a float64 round-trips bit for bit) and decoded in C. A log-prob matrix decodes to a
# `Ragged` over the decoded bytes, with no Python float per value.


class Packed(dict):  # type: ignore[type-arg]
    """A packed value's JSON object (`pack_matrix`, `pack_completions`): every text in it is
    base64, which JSON writes as it is, between quotes (`json_text`)."""

    __slots__ = ()


def _pack(values: Sequence[float] | Sequence[int] | np.ndarray, dtype: str) -> str:
    """`values` as little-endian `dtype` bytes in base64 (an array of that dtype as it is)."""
    return base64.b64encode(np.asarray(values, dtype=dtype).tobytes()).decode("ascii")


def _unpack_array(text: Any, dtype: str, count: int, where: str) -> np.ndarray:
    if not isinstance(text, str):
        raise DecodeError(f"{where}: expected base64 text, got {type(text).__name__}")
    try:
        data = binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise DecodeError(f"{where}: not base64: {exc}") from None
    if len(data) != 8 * count:
        raise DecodeError(f"{where}: {len(data)} bytes, expected {8 * count} "
                          f"({count} values of 8 bytes)")
    return np.frombuffer(data, dtype=dtype)


def _unpack(text: Any, dtype: str, count: int, where: str) -> list[Any]:
    values: list[Any] = _unpack_array(text, dtype, count, where).tolist()
    return values


def _lengths(value: Any, where: str) -> list[int]:
    # One pass in C for the common case (every length an int, none negative); bool is not int.
    if type(value) is not list or not (set(map(type, value)) <= {int}
                                       and (not value or min(value) >= 0)):
        raise DecodeError(f"{where}: expected a list of non-negative row lengths")
    return value


def _object(value: Any, keys: tuple[str, ...], where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DecodeError(f"{where}: expected an object")
    if set(value) != set(keys):
        raise DecodeError(f"{where}: expected exactly the fields {list(keys)}, "
                          f"got {sorted(value)}")
    return value


def pack_matrix(matrix: Matrix) -> dict[str, Any]:
    """`{"rows": [length per row], "f64": base64}`: the matrix's values as they are."""
    return Packed(rows=list(matrix.lengths), f64=_pack(matrix.values, "<f8"))  # int64: floats


def unpack_matrix(value: Any, where: str) -> Matrix:
    """`pack_matrix`'s encoding as a `Ragged` over the decoded bytes (read-only, not copied)."""
    data = _object(value, ("rows", "f64"), where)
    lengths = _lengths(data["rows"], f"{where}.rows")
    return Ragged(_unpack_array(data["f64"], "<f8", sum(lengths), f"{where}.f64"), lengths)


_COMPLETION_COLUMNS = ("n", "request", "version", "tokens", "behavior_logprobs", "reward")


def pack_completions(completions: Completions) -> dict[str, Any]:
    """A frame's completions as columns: `n`, then one packed array per column (requests as n
    rows of 3; tokens and log-probs ragged, by their row lengths): each column's bytes."""
    tokens, logprobs = completions.tokens, completions.behavior_logprobs
    return Packed(
        n=len(completions),
        request=_pack(completions.requests, "<i8"),
        version=_pack(completions.versions, "<i8"),
        tokens=Packed(rows=list(tokens.lengths), i64=_pack(tokens.values, "<i8")),
        behavior_logprobs=Packed(rows=list(logprobs.lengths),
                                 f64=_pack(logprobs.values, "<f8")),
        reward=_pack(completions.rewards, "<f8"),
    )


def unpack_completions(value: Any, where: str) -> Completions:
    """`pack_completions`' columns, as arrays over the decoded bytes (read-only, not copied);
    what the values are (finite, in range) is the core's to judge."""
    data = _object(value, _COMPLETION_COLUMNS, where)
    count = _count(data["n"], f"{where}.n")
    requests = _unpack_array(data["request"], "<i8", 3 * count, f"{where}.request")
    versions = _unpack_array(data["version"], "<i8", count, f"{where}.version")
    rewards = _unpack_array(data["reward"], "<f8", count, f"{where}.reward")
    tokens_data = _object(data["tokens"], ("rows", "i64"), f"{where}.tokens")
    token_lengths = _lengths(tokens_data["rows"], f"{where}.tokens.rows")
    logprobs_data = _object(data["behavior_logprobs"], ("rows", "f64"),
                            f"{where}.behavior_logprobs")
    logprob_lengths = _lengths(logprobs_data["rows"], f"{where}.behavior_logprobs.rows")
    if len(token_lengths) != count or len(logprob_lengths) != count:
        raise DecodeError(f"{where}: {count} completions, but {len(token_lengths)} token rows "
                          f"and {len(logprob_lengths)} log-prob rows")
    tokens = _unpack_array(tokens_data["i64"], "<i8", sum(token_lengths), f"{where}.tokens.i64")
    logprobs = _unpack_array(logprobs_data["f64"], "<f8", sum(logprob_lengths),
                             f"{where}.behavior_logprobs.f64")
    return Completions(requests.reshape(count, 3), versions, Ragged(tokens, token_lengths),
                       Ragged(logprobs, logprob_lengths), rewards)


# The columns of `pack_completions` as bytes, for a wire that carries bytes: n request rows of 3,
# then n versions, token row lengths, log-prob row lengths and rewards, then the tokens and
# the log-probs back to back. Every value is 8 bytes little-endian (int64; float64 for rewards
# and log-probs), so the layout follows from n and the two length columns alone.
_WORD = np.dtype("<i8")
_HEAD_WORDS_PER_COMPLETION = 3 + 1 + 1 + 1 + 1


def completions_to_bytes(completions: Completions) -> bytes:
    """`completions` as binary columns (the layout above): no text, no base64."""
    return b"".join((
        np.ascontiguousarray(completions.requests, dtype="<i8").tobytes(),
        np.ascontiguousarray(completions.versions, dtype="<i8").tobytes(),
        np.asarray(completions.tokens.lengths, dtype="<i8").tobytes(),
        np.asarray(completions.behavior_logprobs.lengths, dtype="<i8").tobytes(),
        np.ascontiguousarray(completions.rewards, dtype="<f8").tobytes(),
        np.ascontiguousarray(completions.tokens.values, dtype="<i8").tobytes(),
        np.ascontiguousarray(completions.behavior_logprobs.values, dtype="<f8").tobytes(),
    ))


def completions_from_bytes(blob: bytes | memoryview, count: Any, where: str) -> Completions:
    """`completions_to_bytes`' columns of `count` completions, as arrays over `blob` (read-only,
    not copied); a `DecodeError` names the column whose size is wrong. What the values are
    (finite, in range) is the core's to judge, as for `unpack_completions`."""
    n = _count(count, f"{where}.n")
    head = _HEAD_WORDS_PER_COMPLETION * n
    if len(blob) % 8 or len(blob) < 8 * head:
        raise DecodeError(f"{where}: {len(blob)} bytes, expected {8 * head} or more, in "
                          f"8-byte words ({n} completions)")
    words = np.frombuffer(blob, dtype=_WORD)
    token_lengths, logprob_lengths = words[4 * n:5 * n], words[5 * n:6 * n]
    if n and min(token_lengths.min(), logprob_lengths.min()) < 0:
        column = "tokens" if token_lengths.min() < 0 else "behavior_logprobs"
        raise DecodeError(f"{where}.{column}.rows: expected non-negative row lengths")
    # No row is longer than the frame, so the sums below cannot overflow int64.
    longest = max(token_lengths.max(), logprob_lengths.max()) if n else 0
    tokens_end = head + int(token_lengths.sum())
    if longest > len(words) or len(words) != tokens_end + int(logprob_lengths.sum()):
        tokens, logprobs = sum(token_lengths.tolist()), sum(logprob_lengths.tolist())
        raise DecodeError(f"{where}: {len(words)} words, but the row lengths ask for "
                          f"{head + tokens + logprobs} ({n} completions, {tokens} tokens, "
                          f"{logprobs} log-probs)")
    floats = words.view("<f8")
    return Completions(words[:3 * n].reshape(n, 3), words[3 * n:4 * n],
                       Ragged(words[head:tokens_end], token_lengths.tolist()),
                       Ragged(floats[tokens_end:], logprob_lengths.tolist()),
                       floats[6 * n:7 * n])


def completed_from_bytes(worker: Any, incarnation: Any, count: Any,
                         blob: bytes) -> RequestsCompleted:
    """A `RequestsCompleted` from its fields as a frame's header carries them and its
    completions as `completions_to_bytes` wrote them; `DecodeError` names the field at fault,
    as `decode` does."""
    return RequestsCompleted(_from_json(str, worker, "RequestsCompleted.worker"),
                             _from_json(int, incarnation, "RequestsCompleted.incarnation"),
                             completions_from_bytes(blob, count, "RequestsCompleted.completions"))


def _request_rows(text: Any, count: int, where: str) -> list[RequestId]:
    """`count` request ids packed as rows of 3 int64."""
    rows = _unpack_array(text, "<i8", 3 * count, where).reshape(count, 3).tolist()
    # What RequestId._make does, without a Python-level call per row.
    return list(map(tuple.__new__, itertools.repeat(RequestId, count), rows))


def _count(value: Any, where: str) -> int:
    if type(value) is not int or value < 0:
        raise DecodeError(f"{where}: expected a non-negative integer, got {value!r}")
    return value


_LAUNCH_FIELDS = ("type", "v", "worker", "incarnation", "n", "request", "version", "seed",
                  "prompt_index")


def pack_launches(launches: Sequence[LaunchRequests]) -> dict[str, Any]:
    """The launches of one frame, all for one worker incarnation, as columns (like
    `pack_completions`): `n`, requests as n rows of 3, version, seed and prompt index packed;
    the worker and its incarnation once. `unpack_launches` gives each `LaunchRequest` back."""
    if not launches or not any(c.requests for c in launches):
        raise ValueError("pack_launches: no launches")
    worker, incarnation = launches[0].worker, launches[0].incarnation
    if any(c.worker != worker or c.incarnation != incarnation for c in launches):
        raise ValueError("pack_launches: launches for more than one worker incarnation")
    count = sum(len(c.requests) for c in launches)
    return {
        "type": "LaunchRequest", "v": ENCODING_VERSION, "worker": worker,
        "incarnation": incarnation, "n": count,
        "request": _pack_int64s(list(itertools.chain.from_iterable(
            itertools.chain.from_iterable(c.requests for c in launches)))),
        "version": _pack_int64s(list(itertools.chain.from_iterable(
            [c.version] * len(c.requests) for c in launches))),
        "seed": _pack_int64s(_joined(launches, "seeds")),
        "prompt_index": _pack_int64s(_joined(launches, "prompt_indices")),
    }


def _joined(launches: Sequence[LaunchRequests], column: str) -> Sequence[int]:
    """A column of the launches, command after command (one command's as it is)."""
    if len(launches) == 1:
        values: Sequence[int] = getattr(launches[0], column)
        return values
    return list(itertools.chain.from_iterable(getattr(c, column) for c in launches))


def _pack_int64s(values: Sequence[int]) -> str:
    """`_pack(values, "<i8")` for ints, packed by `struct` in one call (a launch frame's
    columns: hundreds of ints, which numpy converts one object at a time)."""
    return base64.b64encode(struct.pack(f"<{len(values)}q", *values)).decode("ascii")


def unpack_launches(value: Any, where: str = "launches") -> tuple[LaunchRequest, ...]:
    """`pack_launches`' commands; refuses anything else, naming the field at fault."""
    data = _object(value, _LAUNCH_FIELDS, where)
    if data["type"] != "LaunchRequest":
        raise DecodeError(f"{where}.type: expected 'LaunchRequest', got {data['type']!r}")
    if data["v"] != ENCODING_VERSION:
        raise DecodeError(f"{where}.v: launches encoded with version {data['v']!r}, "
                          f"expected {ENCODING_VERSION}")
    worker = data["worker"]
    if not isinstance(worker, str):
        raise DecodeError(f"{where}.worker: expected str, got {worker!r}")
    incarnation = data["incarnation"]
    if type(incarnation) is not int:
        raise DecodeError(f"{where}.incarnation: expected an integer, got {incarnation!r}")
    count = _count(data["n"], f"{where}.n")
    requests = _request_rows(data["request"], count, f"{where}.request")
    versions = _unpack(data["version"], "<i8", count, f"{where}.version")
    seeds = _unpack(data["seed"], "<i8", count, f"{where}.seed")
    prompts = _unpack(data["prompt_index"], "<i8", count, f"{where}.prompt_index")
    return tuple(LaunchRequest(worker, incarnation, request, version, seed, prompt)
                 for request, version, seed, prompt in zip(requests, versions, seeds, prompts))


_PACKERS: dict[Any, Any] = {
    Matrix: pack_matrix, Matrix | None: pack_matrix, Completions: pack_completions}
_UNPACKERS: dict[Any, Any] = {Matrix: unpack_matrix, Completions: unpack_completions}


@functools.cache
def _schema(cls: type) -> tuple[dict[str, Any], tuple[str, ...]]:
    return typing.get_type_hints(cls), tuple(f.name for f in dataclasses.fields(cls))


@typing.no_type_check
def _decode_dataclass(cls: type, data: dict, where: str, skip: tuple[str, ...] = (),
                      unpacked: Unpacker | None = None) -> Any:
    hints, names = _schema(cls)
    unknown = set(data) - set(names) - set(skip)
    if unknown:
        raise DecodeError(f"{where}: unknown field(s) {sorted(unknown)}")
    missing = [n for n in names if n not in data]
    if missing:
        raise DecodeError(f"{where}: missing field(s) {missing}")
    given = () if unpacked is None else packed_fields(cls)
    return cls(**{n: unpacked(n, data[n], f"{where}.{n}") if n in given and data[n] is not None
                  else _from_json(hints[n], data[n], f"{where}.{n}") for n in names})


@typing.no_type_check
def _from_json(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        (inner,) = [o for o in options if o is not type(None)]
        return _from_json(inner, value, where)
    unpacker = _UNPACKERS.get(tp)
    if unpacker is not None:
        return unpacker(value, where)
    if isinstance(tp, type) and issubclass(tp, tuple) and hasattr(tp, "_fields"):
        if not isinstance(value, list) or len(value) != len(tp._fields):
            raise DecodeError(f"{where}: expected a list of {len(tp._fields)} integers")
        return tp(*(_from_json(int, v, f"{where}[{i}]") for i, v in enumerate(value)))
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, list):
            raise DecodeError(f"{where}: expected a list, got {type(value).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            fast = _fast_row(args[0], value)
            if fast is not None:
                return fast
            return tuple(_from_json(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise DecodeError(f"{where}: expected {len(args)} items, got {len(value)}")
        return tuple(_from_json(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise DecodeError(f"{where}: expected an object")
        return _decode_dataclass(tp, value, where)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DecodeError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise DecodeError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise DecodeError(f"{where}: expected {tp.__name__}, got {value!r}")
        return value
    raise DecodeError(f"{where}: cannot decode type {tp!r}")  # pragma: no cover


def _fast_row(element: Any, value: list[Any]) -> tuple[Any, ...] | None:
    """A list of plain numbers decoded in one pass (None: take the checked, slow path)."""
    if element is float:
        if all(type(v) is float or type(v) is int for v in value):
            return tuple(float(v) for v in value)
    elif element is int and all(type(v) is int for v in value):
        return tuple(value)
    return None
