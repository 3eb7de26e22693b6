"""The learner backend in MLX: the same interface and checks as `TorchLearner`, run synchronously.

MLX takes part in Invar's protocol with max_staleness = 0 (`TrainConfig.validate` refuses
anything else): the same core `step`, events and commands, and the same cotangent route.

* `score` gives float64 proximal (and reference) log-probs of response tokens.
* `forward` computes the current log-probs and binds the pending step to
  (update, step, observation, pre_step_digest). MLX keeps no autograd graph between calls,
  so what is kept is the forward's input; the cotangent's backward pass re-traces the same
  deterministic forward under `mx.vjp` (the values it differentiates at are those reported).
  A step therefore costs two forwards and one backward, against torch's one and one.
* `apply_cotangent` refuses any cotangent not bound to exactly that pending forward, naming
  every mismatched field (`BindingError`), and otherwise takes `mx.vjp` of the log-probs
  with the core's cotangent d(loss)/d(log-probs), clips the global gradient norm like
  `torch.nn.utils.clip_grad_norm_`, and steps `mlx.optimizers.AdamW` (with bias correction,
  as torch's AdamW).
* Commits use the torch backend's file format: the same header (magic, length, XXH3
  checksum), the same fields, written with `atomic_write` (temporary file, fsync, rename,
  directory fsync) and read back with `read_commit`, so a corrupt or truncated commit is
  refused with the same `CommitError`. Parameters are stored under their torch names, so a
  commit's model is also a torch `Policy` state dict: `published_weights` returns the same
  blob format the torch backend publishes, and workers load it unchanged (a worker of an MLX
  run converts it into its MLX sampler; see `invar.runtime.worker`).

The initial weights are those of the torch `Policy(config, seed)`, converted, so both
backends start from the same point.

Speed on a CPU (benchmarks/bench_mlx.py measures all of it): MLX's Linux CPU build runs
matrix products on the reference BLAS and evaluates each stream on one thread, so it is about
10x slower than torch here. The options: `fast` (default on) uses the policy's `Linear` and
`GELU` kernels, about a third faster; `compile` wraps the functions in `mx.compile`, which
measured no faster and costs seconds on each new shape, so it is off; `streams` splits each
batch over that many CPU streams (one thread each), for machines with idle cores.
MLX streams are per thread, and the driver calls the learner from whichever thread is free,
so no array is left unevaluated between calls and each thread makes its own streams.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import torch
from mlx.utils import tree_flatten, tree_map, tree_unflatten

from invar.runtime.backend import Binding, checked_sequences
from invar.runtime.commits import CommitError, CommittedLearner
from invar.runtime.config import OptimConfig, TrainConfig
from invar.runtime.mlx_policy import MLXPolicy, numpy_to_parameters, sequence_logprobs
from invar.runtime.mlx_sampler import generate
from invar.runtime.padding import Prompts, Sequences
from invar.runtime.policy_config import PolicyConfig
from invar.runtime.weights import state_dict_to_bytes, weights_digest

BACKEND = "mlx"


def response_logprobs(policy: MLXPolicy, tokens: mx.array, response_start: int) -> mx.array:
    """Float64 log-probs [n, L - response_start] of the response tokens of `tokens` [n, L]."""
    # The logits at position t predict token t + 1, so the last position is never needed.
    logits = policy(tokens[:, :-1])[:, response_start - 1 :]
    return sequence_logprobs(logits, tokens[:, response_start:])


def _to_numpy(tree: Any) -> dict[str, np.ndarray]:
    """Arrays of an MLX tree by flattened name; the optimizer's uint64 step count becomes an
    int64 (torch tensors and torch.save have no general uint64 support)."""
    out = {}
    for name, value in tree_flatten(tree):
        array = np.array(value)
        out[name] = array.astype(np.int64) if array.dtype.kind == "u" else array
    return out


def mlx_state_digest(model: Mapping[str, np.ndarray], optimizer: Mapping[str, Any]) -> str:
    """Blake2b digest of parameters (torch names) plus optimizer moments, step count and
    hyperparameters: the same construction as the torch backend's `state_digest_of`."""
    tensors = {f"model/{name}": torch.from_numpy(np.ascontiguousarray(value))
               for name, value in model.items()}
    for name, value in optimizer["state"].items():
        tensors[f"optimizer/{name}"] = torch.from_numpy(np.ascontiguousarray(value))
    groups = json.dumps({"backend": BACKEND, **optimizer["hyper"]}, sort_keys=True)
    combined = f"{weights_digest(tensors)}\n{groups}".encode()
    return hashlib.blake2b(combined, digest_size=32).hexdigest()


def open_learner(config: TrainConfig, commit_dir: Path) -> MLXLearner:
    """`learner.backend = "mlx"` (`invar.runtime.registry.LEARNERS`): the learner of the run."""
    return MLXLearner(config.policy, config.optim, config.protocol.seed, commit_dir,
                      keep_commits=config.learner.keep_commits)


class MLXLearner(CommittedLearner):
    """MLX policy, frozen reference and AdamW state, with checked commits and bound updates."""

    commit_backend = BACKEND

    def __init__(
        self,
        policy_config: PolicyConfig,
        optim_config: OptimConfig,
        seed: int,
        commit_dir: str | Path,
        keep_commits: int = 3,
        compile: bool = False,
        fast: bool = True,
        streams: int = 1,
    ) -> None:
        super().__init__(policy_config, optim_config, seed, commit_dir, keep_commits)
        if streams < 1:
            raise ValueError(f"streams must be at least 1, got {streams}")
        self.compile = compile
        self.streams = streams
        self._local = threading.local()  # MLX streams belong to the thread that made them
        self.model = MLXPolicy.initial(policy_config, seed, fast=fast)
        # The reference is the initial policy, frozen: the anchor for KL penalties.
        self.reference = MLXPolicy(policy_config, fast=fast)
        self.reference.update(self.model.parameters())
        self.reference.freeze()
        mx.eval(self.model.parameters(), self.reference.parameters())
        self.optimizer = self._new_optimizer()
        self._functions: dict[tuple[str, int], Callable[..., Any]] = {}

    def _new_optimizer(self) -> optim.AdamW:
        config = self.optim_config
        optimizer = optim.AdamW(learning_rate=config.lr, betas=list(config.betas),
                                eps=config.eps, weight_decay=config.weight_decay,
                                bias_correction=True)
        optimizer.init(self.model.trainable_parameters())
        # Evaluate now: MLX streams are per thread, and the driver calls the learner from
        # whichever thread is free, so no state may be left lazy between calls.
        mx.eval(optimizer.state)
        return optimizer

    def _hyperparameters(self) -> dict[str, Any]:
        config = self.optim_config
        return {"lr": config.lr, "betas": list(config.betas), "eps": config.eps,
                "weight_decay": config.weight_decay, "bias_correction": True,
                "grad_clip": config.grad_clip}

    def _optimizer_numpy(self) -> dict[str, Any]:
        return {"state": _to_numpy(self.optimizer.state), "hyper": self._hyperparameters()}

    # -- the state commits hold --------------------------------------------------------------

    def _compute_digest(self) -> str:
        return mlx_state_digest(self.model.numpy_parameters(), self._optimizer_numpy())

    def _parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: a.shape for name, a in self.model.numpy_parameters().items()}

    def _commit_state(self) -> dict[str, Any]:
        state = _to_numpy(self.optimizer.state)
        return {
            "model": {name: torch.from_numpy(a) for name, a in
                      self.model.numpy_parameters().items()},
            "optimizer": {
                "state": {name: torch.from_numpy(a) for name, a in state.items()},
                "hyper": self._hyperparameters(),
            },
        }

    def _load_commit(self, path: Path, content: dict[str, Any]) -> None:
        model = {name: t.numpy() for name, t in content["model"].items()}
        optimizer = content["optimizer"]
        state = {name: t.numpy() for name, t in optimizer["state"].items()}
        expected_state = {name: a.shape for name, a in _to_numpy(self.optimizer.state).items()}
        if {name: a.shape for name, a in state.items()} != expected_state:
            raise CommitError(path, "optimizer state does not match the policy's parameters")
        if optimizer["hyper"] != self._hyperparameters():
            raise CommitError(path, f"written with optimizer {optimizer['hyper']}")
        if mlx_state_digest(model, {"state": state, "hyper": optimizer["hyper"]}) != \
                content["state_digest"]:
            raise CommitError(path, "state does not hash to its recorded state_digest")
        try:
            parameters = numpy_to_parameters(model, self.model)
        except ValueError as error:
            raise CommitError(path, str(error)) from None
        self.model.update(parameters)
        self.optimizer = self._new_optimizer()
        dtypes = {name: value.dtype for name, value in tree_flatten(self.optimizer.state)}
        self.optimizer.state = tree_unflatten([
            (name, mx.array(value).astype(dtypes[name]))
            for name, value in state.items()])
        mx.eval(self.model.parameters(), self.optimizer.state)
        self._functions.clear()

    # -- scoring and updates -----------------------------------------------------------------

    def _tokens(self, sequences: np.ndarray | Sequences, response_start: int) -> mx.array:
        checked = checked_sequences(sequences, response_start)
        if checked.padded_prompts:
            raise ValueError("the MLX learner does not mask padded prompts: give every prompt "
                             "task.prompt_length tokens (or use the torch backend)")
        return mx.array(checked.tokens.astype(np.int32))

    def _function(self, kind: str, response_start: int) -> Callable[..., Any]:
        """The (optionally `mx.compile`d) log-prob or gradient function for this start.

        Compiled functions take the model's parameters as explicit state, so each call sees
        the current weights rather than those at tracing time.
        """
        key = (kind, response_start)
        if key in self._functions:
            return self._functions[key]
        model = self.model
        if kind == "logprobs":
            def function(tokens: mx.array) -> mx.array:
                return response_logprobs(model, tokens, response_start)
        elif kind == "reference":
            reference = self.reference

            def function(tokens: mx.array) -> mx.array:
                return response_logprobs(reference, tokens, response_start)
        else:
            def pullback(tokens: mx.array, cotangent: mx.array) -> mx.array:
                # d/d(params) of sum(logp * cotangent) is the VJP of logp with the cotangent.
                return (response_logprobs(model, tokens, response_start) * cotangent).sum()

            function = nn.value_and_grad(model, pullback)
        if self.compile:
            state = self.reference.state if kind == "reference" else model.state
            # The gradient function swaps tracers into the model and back (value_and_grad),
            # so the model's state is an output of the compiled function too.
            function = mx.compile(function, inputs=state,
                                  outputs=state if kind == "gradient" else None)
        self._functions[key] = function
        return function

    def _split(self, rows: int) -> list[tuple[mx.Stream | None, slice]]:
        """The rows each CPU stream works on: one part on the default stream, or `streams`
        contiguous parts, each on a stream of its own (MLX runs each CPU stream on a thread
        of its own; the split depends on the row count only, so results stay reproducible)."""
        if self.streams == 1 or rows < 2:
            return [(None, slice(None))]
        if getattr(self._local, "streams", None) is None:
            self._local.streams = [mx.new_stream(mx.cpu) for _ in range(self.streams)]
        bounds = np.linspace(0, rows, min(self.streams, rows) + 1).round().astype(int)
        return [(stream, slice(int(a), int(b)))
                for stream, a, b in zip(self._local.streams, bounds[:-1], bounds[1:])]

    def _logprobs(self, kind: str, tokens: mx.array, response_start: int) -> mx.array:
        function = self._function(kind, response_start)
        parts = []
        for stream, rows in self._split(tokens.shape[0]):
            with contextlib.nullcontext() if stream is None else mx.stream(stream):
                parts.append(function(tokens[rows]))
        return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=0)

    def _gradients(self, tokens: mx.array, cotangent: mx.array, response_start: int
                   ) -> dict[str, Any]:
        """Gradient of sum(log-probs * cotangent): the VJP of the log-probs, summed over the
        streams' parts in a fixed order."""
        function = self._function("gradient", response_start)
        parts = []
        for stream, rows in self._split(tokens.shape[0]):
            with contextlib.nullcontext() if stream is None else mx.stream(stream):
                parts.append(function(tokens[rows], cotangent[rows])[1])
        if len(parts) == 1:
            return parts[0]
        return tree_map(lambda *gradients: sum(gradients[1:], gradients[0]), *parts)

    def score(
        self, sequences: np.ndarray | Sequences, response_start: int, need_reference: bool
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Float64 log-probs [n, R] of the response tokens under the current weights (the
        proximal policy) and, if asked, under the frozen reference."""
        self.state_digest()  # refuses before start()
        tokens = self._tokens(sequences, response_start)
        proximal = self._logprobs("logprobs", tokens, response_start)
        if not need_reference:
            return np.array(proximal), None
        reference = self._logprobs("reference", tokens, response_start)
        mx.eval(proximal, reference)
        return np.array(proximal), np.array(reference)

    def forward(
        self, update: int, step: int, observation: int, sequences: np.ndarray | Sequences,
        response_start: int
    ) -> tuple[str, np.ndarray]:
        """Current log-probs [n, R]; the step waits for the cotangent bound to this call.

        Returns `(pre_step_digest, current_logprobs)`. A later forward replaces a pending one.
        """
        pre_step_digest = self.state_digest()
        tokens = self._tokens(sequences, response_start)
        logprobs = np.array(self._logprobs("logprobs", tokens, response_start))
        # The sequences are kept as numpy: the cotangent may arrive on another thread.
        self._pending = (Binding(update, step, observation, pre_step_digest), logprobs.shape,
                         (checked_sequences(sequences, response_start).tokens, response_start))
        return pre_step_digest, logprobs

    def apply_cotangent(
        self,
        update: int,
        step: int,
        observation: int,
        pre_step_digest: str,
        cotangent: np.ndarray,
    ) -> str:
        """Pull d(loss)/d(log-probs) back through the pending forward and step AdamW.

        Refuses with `BindingError` (changing nothing, the forward stays pending) unless the
        binding equals the pending forward's and `pre_step_digest` is the current state.
        Returns the post-step state digest.
        """
        cotangent, (sequences, response_start) = self._bound_cotangent(
            update, step, observation, pre_step_digest, cotangent)
        gradients = self._gradients(self._tokens(sequences, response_start),
                                    mx.array(cotangent, dtype=mx.float64), response_start)
        if self.optim_config.grad_clip > 0:
            gradients = clip_grad_norm(gradients, self.optim_config.grad_clip)
        self._apply_gradients(gradients)
        self._pending = None
        self.applied_steps += 1
        self._digest = self._compute_digest()
        return self._digest

    def _apply_gradients(self, gradients: dict[str, Any]) -> None:
        """One AdamW step with these (already clipped) gradients."""
        self.optimizer.update(self.model, gradients)
        mx.eval(self.model.parameters(), self.optimizer.state)

    # -- weights for workers and evaluation --------------------------------------------------

    def torch_state_dict(self) -> dict[str, torch.Tensor]:
        """The current weights as a torch `Policy` state dict."""
        return {name: torch.from_numpy(a) for name, a in self.model.numpy_parameters().items()}

    def weights_bytes(self) -> bytes:
        """Current policy weights, serialised like the torch backend's (torch names)."""
        return state_dict_to_bytes(self.torch_state_dict())

    def evaluate_greedy(self, task: Any, prompts: np.ndarray | Prompts) -> float:
        """Mean reward of greedy answers to `prompts` [n, P] under the current weights;
        `task` gives `response_length` and `rewards(prompts, responses)` (a task, or the
        driver's `HeldoutScoring`, which runs the verifier with its time limit, reading each
        response up to its end token)."""
        if isinstance(prompts, Prompts):
            if prompts.padded:
                raise ValueError("the MLX learner does not mask padded prompts: give every "
                                 "prompt task.prompt_length tokens (or use the torch backend)")
            prompts = prompts.tokens
        responses, _ = generate(self.model, prompts, task.response_length, greedy=True)
        return float(task.rewards(prompts, responses).mean())


def clip_grad_norm(gradients: dict[str, Any], max_norm: float) -> dict[str, Any]:
    """Scale the gradients by min(1, max_norm / (norm + 1e-6)), as torch's clip_grad_norm_."""
    squares = [mx.sum(mx.square(g)) for _, g in tree_flatten(gradients)]
    norm = mx.sqrt(sum(squares[1:], squares[0]))
    scale = mx.minimum(max_norm / (norm + 1e-6), 1.0)
    return tree_map(lambda g: g * scale, gradients)

