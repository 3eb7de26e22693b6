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

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from invar.model.schedule import derive_seed
from invar.runtime.backend import Binding, checked_sequences
from invar.runtime.commits import CommitError, CommittedLearner
from invar.runtime.config import OptimConfig, TrainConfig, task_vocabulary
from invar.runtime.padding import Prompts, Sequences, positions_of
from invar.runtime.policy import PolicyConfig, build_policy, sequence_logprobs
from invar.runtime.sampler import generate
from invar.runtime.tasks import end_token
from invar.runtime.weights import (
    state_dict_from_bytes,
    state_dict_to_bytes,
    weights_digest,
)


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


def response_logprobs(policy: torch.nn.Module, tokens: Tensor, response_start: int,
                      padding: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Float64 log-probs [n, L - response_start] of the response tokens of `tokens` [n, L];
    `padding`: the (attention mask, positions) [n, L] of left-padded prompts."""
    # The logits at position t predict token t + 1, so the last position is never needed,
    # and only those that predict a response token are (a policy that can skip the others'
    # output layer is told so: with a large vocabulary it is a fifth of the model's work).
    responses = tokens.shape[1] - response_start
    mask, positions = (None, None) if padding is None else (padding[0][:, :-1],
                                                            padding[1][:, :-1])
    if getattr(policy, "keeps_last_logits", False):
        logits = policy(tokens[:, :-1], mask, positions, last=responses)
    else:
        logits = policy(tokens[:, :-1], mask, positions)[:, response_start - 1:]
    return sequence_logprobs(logits, tokens[:, response_start:])


def open_learner(config: TrainConfig, commit_dir: Path) -> TorchLearner:
    """`learner.backend = "torch"` (`invar.runtime.registry.LEARNERS`): the learner of the
    run, with torch's threads and deterministic kernels set for this process."""
    torch.set_num_threads(config.learner.threads)
    torch.use_deterministic_algorithms(True)
    return TorchLearner(config.policy, config.optim, config.protocol.seed, commit_dir,
                        device=config.learner.device, keep_commits=config.learner.keep_commits,
                        task_vocabulary=task_vocabulary(config))


def device_problem(device: str) -> str:
    """Why this machine cannot run the learner on `device` ("cuda" or "cuda:N"); "" if it can."""
    if not torch.cuda.is_available():
        return f"{device!r}, but CUDA is not available on this machine"
    _, _, index = device.partition(":")
    if index and int(index) >= torch.cuda.device_count():
        return f"{device!r}, but this machine has {torch.cuda.device_count()} CUDA device(s)"
    return ""


class TorchLearner(CommittedLearner):
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
        super().__init__(policy_config, optim_config, seed, commit_dir, keep_commits)
        self.device = torch.device(device)
        # The process's torch RNG (kept in every commit) starts from the run's seed, so two
        # identical runs write byte-identical commits.
        torch.manual_seed(derive_seed(seed, "learner", "torch_rng"))
        self.model: Any = build_policy(policy_config, seed, task_vocabulary).to(self.device)
        self._task_vocabulary = task_vocabulary
        self._reference: Any = None
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=optim_config.lr,
            betas=optim_config.betas,
            eps=optim_config.eps,
            weight_decay=optim_config.weight_decay,
        )

    @property
    def reference(self) -> Any:
        """The initial policy, frozen: the anchor for KL penalties. Built the first time it is
        asked for (from the seed or the model's own weights, as the policy was), so a run
        without a KL term never holds a second copy of the model."""
        if self._reference is None:
            self._reference = build_policy(self.policy_config, self.seed,
                                           self._task_vocabulary).to(self.device)
            self._reference.requires_grad_(False)
        return self._reference

    # -- the state commits hold --------------------------------------------------------------

    def _compute_digest(self) -> str:
        return state_digest_of(self.model.state_dict(), self.optimizer.state_dict())

    def _parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(t.shape) for name, t in self.model.state_dict().items()}

    def _commit_state(self) -> dict[str, Any]:
        return {
            "model": {name: t.detach().cpu() for name, t in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
        }

    def _load_commit(self, path: Path, content: dict[str, Any]) -> None:
        if state_digest_of(content["model"], content["optimizer"]) != content["state_digest"]:
            raise CommitError(path, "state does not hash to its recorded state_digest")
        self.model.load_state_dict(content["model"])
        self.optimizer.load_state_dict(content["optimizer"])

    # -- scoring and updates -----------------------------------------------------------------

    def _tokens(self, sequences: np.ndarray | Sequences, response_start: int
                ) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """The token rows as a tensor, and the (mask, positions) of padded prompts."""
        checked = checked_sequences(sequences, response_start)
        tokens = torch.as_tensor(checked.tokens, dtype=torch.long, device=self.device)
        if not checked.padded_prompts:
            return tokens, None
        mask = checked.attention_mask()
        return tokens, (torch.as_tensor(mask, device=self.device),
                        torch.as_tensor(positions_of(mask), device=self.device))

    @torch.no_grad()
    def score(
        self, sequences: np.ndarray | Sequences, response_start: int, need_reference: bool
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Float64 log-probs [n, R] of the response tokens under the current weights (the
        proximal policy) and, if asked, under the frozen reference."""
        self.state_digest()  # refuses before start()
        tokens, padding = self._tokens(sequences, response_start)
        proximal = response_logprobs(self.model, tokens, response_start, padding).cpu().numpy()
        if not need_reference:
            return proximal, None
        return proximal, response_logprobs(self.reference, tokens, response_start,
                                           padding).cpu().numpy()

    def forward(
        self, update: int, step: int, observation: int, sequences: np.ndarray | Sequences,
        response_start: int
    ) -> tuple[str, np.ndarray]:
        """Log-probs [n, R] with grad; the graph waits for the cotangent bound to this call.

        Returns `(pre_step_digest, current_logprobs)`. A later forward replaces a pending one.
        """
        pre_step_digest = self.state_digest()
        tokens, padding = self._tokens(sequences, response_start)
        with torch.enable_grad():
            logprobs = response_logprobs(self.model, tokens, response_start, padding)
        self._pending = (Binding(update, step, observation, pre_step_digest),
                         tuple(logprobs.shape), logprobs)
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
        cotangent, logprobs = self._bound_cotangent(update, step, observation, pre_step_digest,
                                                    cotangent)
        logprobs.backward(torch.as_tensor(cotangent, device=self.device))
        if self.optim_config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.optim_config.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._pending = None
        self.applied_steps += 1
        self._digest = self._compute_digest()
        return self._digest

    # -- weights for workers and evaluation --------------------------------------------------

    def weights_bytes(self) -> bytes:
        """Current policy weights serialised for publication (see `load_weights_bytes`)."""
        return state_dict_to_bytes(self.model.state_dict())

    def evaluate_greedy(self, task: Any, prompts: np.ndarray | Prompts) -> float:
        """Mean reward of greedy answers to `prompts` ([n, P], or left-padded `Prompts`)
        under the current weights; `task` gives `response_length`, optionally `eos_token`,
        and `rewards(prompts, responses)` (a task, or the driver's `HeldoutScoring`, which
        runs the verifier with its time limit)."""
        if not isinstance(prompts, Prompts):
            prompts = Prompts.of(np.asarray(prompts).tolist(), np.asarray(prompts).shape[1])
        prompt_tokens = torch.as_tensor(prompts.tokens, dtype=torch.long, device=self.device)
        responses, _ = generate(self.model, prompt_tokens, task.response_length, greedy=True,
                                prompt_lengths=prompts.lengths, eos=end_token(task))
        return float(task.rewards(prompts.tokens, responses.cpu().numpy()).mean())
