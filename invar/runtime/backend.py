"""The learner backend interface, and the checks every backend makes the same way.

`LearnerBackend` is what the driver, its `LearnerExecutor` and `run_serial` call: the torch
and MLX learners (`invar.runtime.torch_learner`, `invar.runtime.mlx_learner`) and the test
fake (`invar.testing.runtime.FakeLearner`) implement it, and
`invar.testing.backend_conformance` checks a backend against it. `Sampler` is the backend's
other half, what a rollout worker generates with (`invar.runtime.sampler.TorchSampler`,
`invar.runtime.mlx_sampler.MLXSampler`); `invar.runtime.registry.LEARNERS` names both halves
of each backend. The binding and input checks below are shared by the real backends, so a
refusal reads the same whatever the framework. Nothing here imports a framework.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from invar.model.messages import Matrix
from invar.runtime.padding import Prompts, Sequences


class LearnerBackend(Protocol):
    """A learner the core drives: restored from its newest commit, stepped only by
    cotangents bound to a pending forward, committed to files workers' weights come from."""

    def start(self) -> tuple[int, str]:
        """Restore the newest commit (or write commit 0): (committed version, state digest)."""
        ...

    def score(self, sequences: np.ndarray | Sequences, response_start: int, need_reference: bool
              ) -> tuple[np.ndarray | Matrix, np.ndarray | Matrix | None]:
        """Float64 log-probs [n, R] of the responses: proximal, and reference if asked (or
        each as a `Matrix` of the responses' own lengths)."""
        ...

    def forward(self, update: int, step: int, observation: int,
                sequences: np.ndarray | Sequences, response_start: int
                ) -> tuple[str, np.ndarray | Matrix]:
        """(pre-step digest, current log-probs [n, R] or a `Matrix` of the responses' own
        lengths); the step waits for its bound cotangent."""
        ...

    def apply_cotangent(self, update: int, step: int, observation: int, pre_step_digest: str,
                        cotangent: np.ndarray) -> str:
        """Take the pending step with d(loss)/d(log-probs); the post-step state digest.
        Raises ValueError (a `BindingError` for a binding) and changes nothing otherwise."""
        ...

    def commit(self, version: int) -> str:
        """Write the whole state as commit `version`; its state digest."""
        ...

    def commit_file(self, version: int) -> Path | None:
        """The file of commit `version`, if it is still kept (checkpoints copy it)."""
        ...

    def published_weights(self, version: int) -> tuple[bytes, str, str]:
        """Committed `version` for workers: (weights blob, weights digest, state digest)."""
        ...

    def evaluate_greedy(self, task: Any, prompts: np.ndarray | Prompts) -> float:
        """Mean reward of greedy answers to `prompts` under the current weights."""
        ...


class Sampler(Protocol):
    """What a rollout worker samples with: built from the worker's `WorkerArgs` (its policy
    and sampling settings), it holds the weights of the version the worker loaded."""

    policy: Any
    """The network sampled from."""

    def load(self, state: Mapping[str, Any]) -> None:
        """Hold the published weights `state` (a torch state dict, as every backend publishes
        them: `weights.state_dict_from_bytes`)."""
        ...

    def generate(self, prompts: Prompts, response_length: int, seeds: Sequence[int],
                 eos: int | None) -> tuple[np.ndarray, np.ndarray]:
        """(tokens [n, T], their float64 behaviour log-probs [n, T]) of one fixed-shape
        chunk, T <= response_length (a backend may stop once every row has reached `eos`);
        row i's randomness is `seeds[i]`'s alone (`invar.runtime.sampler`'s guarantees)."""
        ...


class BindingError(ValueError):
    """A cotangent that does not belong to the pending forward; `fields` names each mismatch."""

    def __init__(self, fields: tuple[str, ...] | list[str], detail: str) -> None:
        self.fields = tuple(fields)
        self.detail = detail
        super().__init__(f"cotangent refused ({', '.join(self.fields)}): {detail}")


@dataclass(frozen=True)
class Binding:
    """What a forward's graph belongs to; its cotangent must name exactly the same."""

    update: int
    step: int
    observation: int
    pre_step_digest: str


def check_binding(pending: Binding, offered: Binding, current_digest: str) -> None:
    """Refuse (BindingError naming every mismatching field) a cotangent not bound to exactly
    the pending forward, or whose pre-step digest is not the learner's current state."""
    mismatches = {
        field.name: f"got {getattr(offered, field.name)!r}, "
        f"the pending forward has {getattr(pending, field.name)!r}"
        for field in dataclasses.fields(Binding)
        if getattr(offered, field.name) != getattr(pending, field.name)
    }
    if "pre_step_digest" not in mismatches and offered.pre_step_digest != current_digest:
        mismatches["pre_step_digest"] = f"not the current state {current_digest!r}"
    if mismatches:
        detail = "; ".join(f"{name}: {why}" for name, why in mismatches.items())
        raise BindingError(tuple(mismatches), detail)


def checked_cotangent(pending: Binding | None, offered: Binding, current_digest: str,
                      cotangent: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`cotangent` as float64, if it may step the learner: bound to the pending forward
    (`pending`, None when there is none), of that forward's log-probs' `shape`, finite."""
    if pending is None:
        raise BindingError(("forward",), "no forward is pending")
    check_binding(pending, offered, current_digest)
    cotangent = np.asarray(cotangent, dtype=np.float64)
    if cotangent.shape != tuple(shape):
        raise BindingError(("cotangent",),
                           f"shape {cotangent.shape}, forward gave {tuple(shape)}")
    if not np.isfinite(cotangent).all():
        raise ValueError("cotangent has non-finite entries")
    return cotangent


def checked_sequences(sequences: np.ndarray | Sequences, response_start: int) -> Sequences:
    """`sequences` (a `Sequences`, or a 2-D integer array whose rows are all whole) with a
    response starting inside it; ValueError names what is wrong."""
    if not isinstance(sequences, Sequences):
        sequences = Sequences(np.asarray(sequences), response_start)
    tokens = sequences.tokens
    if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(
            f"sequences must be a 2-D integer array, got {tokens.dtype} {tokens.shape}"
        )
    if response_start != sequences.response_start:
        raise ValueError(f"response_start {response_start}, the sequences start responses at "
                         f"{sequences.response_start}")
    if not 1 <= response_start < tokens.shape[1]:
        raise ValueError(f"response_start {response_start} is outside 1..{tokens.shape[1] - 1}")
    width = tokens.shape[1] - response_start
    for name, lengths, most in (("prompt_lengths", sequences.prompt_lengths, response_start),
                                ("response_lengths", sequences.response_lengths, width)):
        if lengths is not None and (lengths.shape != (len(tokens),) or lengths.min() < 1
                                    or lengths.max() > most):
            raise ValueError(f"{name} must be {len(tokens)} lengths in 1..{most}")
    return sequences
