"""The learner backend: torch execution of what the pure core decides, on CPU or CUDA.

The core chooses versions, batches and minibatches; this class only executes them and
reports digests the core can check:

* `score` gives proximal (and reference) log-probs of response tokens, without grad.
* `forward` runs a minibatch with grad and keeps the graph bound to the request's
  (update, step, observation, pre_step_digest).
* `apply_cotangent` refuses any cotangent not bound to exactly that pending forward, and
  otherwise backpropagates it through the kept graph and takes one AdamW step. The core
  computes the objective; the cotangent is d(loss)/d(log-prob), so the learner never needs
  to know the objective.
* `commit` writes the whole learner state atomically; `start` restores the newest commit
  and refuses a corrupt one instead of loading it.

Nothing here draws random numbers after initialisation, and the network avoids
non-deterministic kernels, so the same inputs give bitwise-identical results (on CUDA, run
with `torch.use_deterministic_algorithms(True)` and `CUBLAS_WORKSPACE_CONFIG=:4096:8`).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import io
import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from invar.model.schedule import derive_seed
from invar.runtime.policy import PolicyConfig, build_policy, sequence_logprobs
from invar.runtime.sampler import generate
from invar.runtime.weights import (
    atomic_write,
    atomic_write_leftovers,
    state_dict_from_bytes,
    state_dict_to_bytes,
    weights_digest,
)

COMMIT_PREFIX = "commit-"
_COMMIT_NAME = re.compile(rf"{COMMIT_PREFIX}(\d{{6,}})\.pt")
COMMIT_MAGIC = b"INVARCKP"
# A commit file is this header (magic, payload length, blake2b-256 of the payload) + payload.
_COMMIT_HEADER = struct.Struct("<8sQ32s")
COMMIT_FIELDS = (
    "version",
    "model",
    "optimizer",
    "torch_rng",
    "counters",
    "policy_config",
    "seed",
    "state_digest",
)


class CommitError(RuntimeError):
    """A commit file that must not be loaded; `path` names it and `reason` says why."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"commit {self.path} refused: {reason}")


class BindingError(ValueError):
    """A cotangent that does not belong to the pending forward; `fields` names each mismatch."""

    def __init__(self, fields: tuple[str, ...] | list[str], detail: str) -> None:
        self.fields = tuple(fields)
        self.detail = detail
        super().__init__(f"cotangent refused ({', '.join(self.fields)}): {detail}")


@dataclass(frozen=True)
class OptimConfig:
    """AdamW and gradient clipping."""

    lr: float = 1e-3
    """Learning rate."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Decay rates of the first and second moment estimates."""
    eps: float = 1e-8
    """Added to the second-moment root for numerical stability."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping."""


@dataclass(frozen=True)
class Binding:
    """What a forward's graph belongs to; its cotangent must name exactly the same."""

    update: int
    step: int
    observation: int
    pre_step_digest: str


def commit_path(commit_dir: str | Path, version: int) -> Path:
    """Where the commit of `version` lives."""
    return Path(commit_dir) / f"{COMMIT_PREFIX}{version:06d}.pt"


def list_commits(commit_dir: str | Path) -> list[tuple[int, Path]]:
    """(version, path) of every commit file in `commit_dir`, oldest first."""
    found = []
    for path in Path(commit_dir).iterdir():
        match = _COMMIT_NAME.fullmatch(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def encode_commit(content: Mapping[str, Any]) -> bytes:
    """Commit file bytes: the header (with the payload's length and checksum), then payload."""
    buffer = io.BytesIO()
    torch.save(dict(content), buffer)
    payload = buffer.getvalue()
    checksum = hashlib.blake2b(payload, digest_size=32).digest()
    return _COMMIT_HEADER.pack(COMMIT_MAGIC, len(payload), checksum) + payload


def read_commit(path: str | Path) -> dict[str, Any]:
    """The verified content of a commit file; raises `CommitError` rather than return junk."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise CommitError(path, "no such file (never written, or pruned)") from None
    if len(data) < _COMMIT_HEADER.size:
        raise CommitError(
            path, f"truncated: {len(data)} bytes, the header alone needs {_COMMIT_HEADER.size}"
        )
    magic, length, checksum = _COMMIT_HEADER.unpack_from(data)
    if magic != COMMIT_MAGIC:
        raise CommitError(path, f"not a commit file (magic {magic!r})")
    payload = data[_COMMIT_HEADER.size :]
    if len(payload) < length:
        raise CommitError(path, f"truncated: payload has {len(payload)} of {length} bytes")
    if len(payload) > length:
        raise CommitError(path, f"{len(payload) - length} unexpected bytes after the payload")
    if hashlib.blake2b(payload, digest_size=32).digest() != checksum:
        raise CommitError(path, "checksum mismatch: the payload is not what was written")
    # weights_only: a commit holds tensors and plain values, never code to run.
    content = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    if not isinstance(content, dict):
        raise CommitError(path, f"payload is a {type(content).__name__}, not a dict")
    missing = [field for field in COMMIT_FIELDS if field not in content]
    if missing:
        raise CommitError(path, f"missing field(s): {', '.join(missing)}")
    return content


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


def write_commit(commit_dir: Path, version: int, content: Mapping[str, Any], keep: int) -> None:
    """Write commit `version` atomically, then prune all but the newest `keep` commits."""
    atomic_write(commit_path(commit_dir, version), encode_commit(content))
    for _, old in list_commits(commit_dir)[:-keep]:
        old.unlink()


def checked_sequences(sequences: np.ndarray, response_start: int) -> np.ndarray:
    """`sequences` as a 2-D integer array with a response starting inside it."""
    sequences = np.asarray(sequences)
    if sequences.ndim != 2 or not np.issubdtype(sequences.dtype, np.integer):
        raise ValueError(
            f"sequences must be a 2-D integer array, got {sequences.dtype} {sequences.shape}"
        )
    if not 1 <= response_start < sequences.shape[1]:
        raise ValueError(f"response_start {response_start} is outside 1..{sequences.shape[1] - 1}")
    return sequences


def state_digest_of(model_state: Mapping[str, Tensor], optimizer_state: Mapping[str, Any]) -> str:
    """Blake2b digest of parameters plus optimizer moments, step counts and hyperparameters."""
    tensors = {f"model/{name}": tensor for name, tensor in model_state.items()}
    for index, parameter_state in optimizer_state["state"].items():
        for key, value in parameter_state.items():
            tensors[f"optimizer/{index}/{key}"] = torch.as_tensor(value)
    groups = json.dumps(optimizer_state["param_groups"], sort_keys=True)
    combined = f"{weights_digest(tensors)}\n{groups}".encode()
    return hashlib.blake2b(combined, digest_size=32).hexdigest()


def load_weights_bytes(policy: torch.nn.Module, data: bytes) -> str:
    """Load published weights into a worker's policy; returns their `weights_digest`."""
    state = state_dict_from_bytes(data)
    policy.load_state_dict(state)
    return weights_digest(state)


def response_logprobs(policy: torch.nn.Module, tokens: Tensor, response_start: int) -> Tensor:
    """Float64 log-probs [n, L - response_start] of the response tokens of `tokens` [n, L]."""
    # The logits at position t predict token t + 1, so the last position is never needed.
    logits = policy(tokens[:, :-1])[:, response_start - 1 :]
    return sequence_logprobs(logits, tokens[:, response_start:])


class TorchLearner:
    """Policy, frozen reference and AdamW state, with checked commits and bound updates."""

    def __init__(
        self,
        policy_config: PolicyConfig,
        optim_config: OptimConfig,
        seed: int,
        commit_dir: str | Path,
        device: str | torch.device = "cpu",
        keep_commits: int = 3,
        task_vocabulary: int | None = None,
    ) -> None:
        """`task_vocabulary`: for a transformers policy, what its vocabulary serves
        (`config.task_vocabulary`)."""
        if keep_commits < 1:
            raise ValueError(f"keep_commits must be at least 1, got {keep_commits}")
        self.policy_config = policy_config
        self.optim_config = optim_config
        self.seed = seed
        self.commit_dir = Path(commit_dir)
        self.device = torch.device(device)
        self.keep_commits = keep_commits
        # The process's torch RNG (kept in every commit) starts from the run's seed, so two
        # identical runs write byte-identical commits.
        torch.manual_seed(derive_seed(seed, "learner", "torch_rng"))
        self.model = build_policy(policy_config, seed, task_vocabulary).to(self.device)
        # The reference is the initial policy, frozen: the anchor for KL penalties.
        self.reference = copy.deepcopy(self.model).requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=optim_config.lr,
            betas=optim_config.betas,
            eps=optim_config.eps,
            weight_decay=optim_config.weight_decay,
        )
        self.committed_version: int | None = None
        self.applied_steps = 0
        self._digest: str | None = None  # of the current state; set by start, each step
        self._pending: tuple[Binding, Tensor] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> tuple[int, str]:
        """Restore the newest commit, or initialise and write commit 0 if there is none.

        Returns `(committed_version, state_digest)`. If the newest commit fails verification
        it raises `CommitError` and loads nothing: falling back to an older commit silently
        would hide data loss from the core, which holds the newest version as committed.
        """
        self.commit_dir.mkdir(parents=True, exist_ok=True)
        for leftover in atomic_write_leftovers(self.commit_dir, COMMIT_PREFIX):
            # A commit interrupted by a crash; the file it was to replace is intact.
            leftover.unlink()
        self._pending = None
        commits = list_commits(self.commit_dir)
        if commits:
            version, path = commits[-1]
            self._restore(version, path)
        else:
            self._digest = state_digest_of(self.model.state_dict(), self.optimizer.state_dict())
            self.commit(0)
        return self.committed_version, self._digest

    def _restore(self, version: int, path: Path) -> None:
        content = read_commit(path)
        # Every check comes before the first tensor is copied, so a refusal loads nothing.
        if content["version"] != version:
            raise CommitError(path, f"holds version {content['version']}, its name says {version}")
        if content["policy_config"] != dataclasses.asdict(self.policy_config):
            raise CommitError(path, f"written for policy {content['policy_config']}")
        if content["seed"] != self.seed:
            raise CommitError(path, f"written for seed {content['seed']}, not {self.seed}")
        expected_shapes = {name: t.shape for name, t in self.model.state_dict().items()}
        found_shapes = {name: t.shape for name, t in content["model"].items()}
        if found_shapes != expected_shapes:
            raise CommitError(path, "model tensors do not match the policy's names and shapes")
        if state_digest_of(content["model"], content["optimizer"]) != content["state_digest"]:
            raise CommitError(path, "state does not hash to its recorded state_digest")
        self.model.load_state_dict(content["model"])
        self.optimizer.load_state_dict(content["optimizer"])
        torch.set_rng_state(content["torch_rng"])
        self.applied_steps = content["counters"]["applied_steps"]
        self.committed_version = version
        self._digest = state_digest_of(self.model.state_dict(), self.optimizer.state_dict())
        if self._digest != content["state_digest"]:
            raise CommitError(path, "restored state differs from the committed state")

    def commit(self, version: int) -> str:
        """Write `commit-{version:06d}.pt` atomically, prune old commits, return the digest."""
        digest = self.state_digest()
        if self.committed_version is not None and version <= self.committed_version:
            raise ValueError(f"commit {version} is not newer than commit {self.committed_version}")
        content = {
            "version": version,
            "model": {name: t.detach().cpu() for name, t in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "counters": {"applied_steps": self.applied_steps},
            "policy_config": dataclasses.asdict(self.policy_config),
            "seed": self.seed,
            "state_digest": digest,
        }
        write_commit(self.commit_dir, version, content, self.keep_commits)
        self.committed_version = version
        return digest

    def state_digest(self) -> str:
        """Digest of parameters and optimizer state (only start and a step change it)."""
        if self._digest is None:
            raise RuntimeError("the learner has no state yet: call start() first")
        return self._digest

    # -- scoring and updates -----------------------------------------------------------------

    def _tokens(self, sequences: np.ndarray, response_start: int) -> Tensor:
        sequences = checked_sequences(sequences, response_start)
        return torch.as_tensor(sequences, dtype=torch.long, device=self.device)

    @torch.no_grad()
    def score(
        self, sequences: np.ndarray, response_start: int, need_reference: bool
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Float64 log-probs [n, R] of the response tokens under the current weights (the
        proximal policy) and, if asked, under the frozen reference."""
        self.state_digest()  # refuses before start()
        tokens = self._tokens(sequences, response_start)
        proximal = response_logprobs(self.model, tokens, response_start).cpu().numpy()
        if not need_reference:
            return proximal, None
        return proximal, response_logprobs(self.reference, tokens, response_start).cpu().numpy()

    def forward(
        self, update: int, step: int, observation: int, sequences: np.ndarray, response_start: int
    ) -> tuple[str, np.ndarray]:
        """Log-probs [n, R] with grad; the graph waits for the cotangent bound to this call.

        Returns `(pre_step_digest, current_logprobs)`. A later forward replaces a pending one.
        """
        pre_step_digest = self.state_digest()
        tokens = self._tokens(sequences, response_start)
        with torch.enable_grad():
            logprobs = response_logprobs(self.model, tokens, response_start)
        self._pending = (Binding(update, step, observation, pre_step_digest), logprobs)
        return pre_step_digest, logprobs.detach().cpu().numpy()

    def apply_cotangent(
        self,
        update: int,
        step: int,
        observation: int,
        pre_step_digest: str,
        cotangent: np.ndarray,
    ) -> str:
        """Backpropagate d(loss)/d(log-probs) through the pending graph and step AdamW.

        Refuses with `BindingError` (changing nothing, the forward stays pending) unless the
        binding equals the pending forward's and `pre_step_digest` is the current state.
        Returns the post-step state digest.
        """
        if self._pending is None:
            raise BindingError(("forward",), "no forward is pending")
        pending, logprobs = self._pending
        offered = Binding(update, step, observation, pre_step_digest)
        check_binding(pending, offered, self.state_digest())
        cotangent = np.asarray(cotangent, dtype=np.float64)
        if cotangent.shape != tuple(logprobs.shape):
            raise BindingError(
                ("cotangent",), f"shape {cotangent.shape}, forward gave {tuple(logprobs.shape)}"
            )
        if not np.isfinite(cotangent).all():
            raise ValueError("cotangent has non-finite entries")

        logprobs.backward(torch.as_tensor(cotangent, device=self.device))
        if self.optim_config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.optim_config.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._pending = None
        self.applied_steps += 1
        self._digest = state_digest_of(self.model.state_dict(), self.optimizer.state_dict())
        return self._digest

    # -- weights for workers and evaluation --------------------------------------------------

    def weights_bytes(self) -> bytes:
        """Current policy weights serialised for publication (see `load_weights_bytes`)."""
        return state_dict_to_bytes(self.model.state_dict())

    def commit_file(self, version: int) -> Path | None:
        """The commit file of `version`, if it is still kept."""
        path = commit_path(self.commit_dir, version)
        return path if path.exists() else None

    def published_weights(self, version: int) -> tuple[bytes, str, str]:
        """Weights of committed `version` for workers: (blob, weights digest, state digest).

        Read from the verified commit file, not from memory: the learner may already be
        stepping the next update when a version is published.
        """
        content = read_commit(commit_path(self.commit_dir, version))
        model = content["model"]
        return state_dict_to_bytes(model), weights_digest(model), content["state_digest"]

    def evaluate_greedy(self, task: Any, prompts: np.ndarray) -> float:
        """Mean reward of greedy answers to `prompts` [n, P] under the current weights;
        `task` gives `response_length` and `rewards(prompts, responses)` (a task, or the
        driver's `HeldoutScoring`, which runs the verifier with its time limit)."""
        prompt_tokens = torch.as_tensor(prompts, dtype=torch.long, device=self.device)
        responses, _ = generate(self.model, prompt_tokens, task.response_length, greedy=True)
        return float(task.rewards(prompts, responses.cpu().numpy()).mean())
