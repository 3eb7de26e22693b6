"""Errors of the pure core: a refused configuration and a refused event.

A refused *configuration* is an exception (nothing has run yet, there is nothing to keep).
A refused *event* is a value: `ProtocolError` carries the state it was applied to, the event
and a reason code, so the caller can log it, count it and carry on with the unchanged state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A configuration that cannot describe a run; `fields` names every field at fault."""

    def __init__(self, fields: tuple[str, ...] | list[str], reason: str) -> None:
        self.fields = tuple(fields)
        self.reason = reason
        super().__init__(f"{', '.join(self.fields)}: {reason}")


class Reason(enum.Enum):
    """Why an event was refused: each is something no correct component could send."""

    UNKNOWN_REQUEST = "unknown_request"
    WRONG_VERSION = "wrong_version"
    MALFORMED_PAYLOAD = "malformed_payload"
    UNKNOWN_WORKER = "unknown_worker"
    UNREQUESTED_LOAD = "unrequested_load"
    UNREQUESTED_SCORES = "unrequested_scores"
    UNREQUESTED_OBSERVATION = "unrequested_observation"
    BINDING_MISMATCH = "binding_mismatch"
    PREMATURE_COMMIT = "premature_commit"
    COMMIT_DIGEST_MISMATCH = "commit_digest_mismatch"
    UNKNOWN_COMMIT = "unknown_commit"
    UNREQUESTED_PUBLICATION = "unrequested_publication"
    UNREQUESTED_BOUNDARY = "unrequested_boundary"
    DIVERGED = "diverged"
    """Not a faulty component: the learner's log-probs are finite, but the objective of its
    forward is not (a ratio of the policies overflows). Nothing can be applied: the run
    stops, resumable from its last commit."""


@dataclass(frozen=True)
class ProtocolError:
    """An event refused by `step`; the state it names is unchanged and still current."""

    state: Any
    event: Any
    reason: Reason
    detail: str

    def __str__(self) -> str:
        return f"{type(self.event).__name__} refused ({self.reason.value}): {self.detail}"
