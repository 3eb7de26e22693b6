"""Autoregressive sampling with per-row reproducible randomness and exact behavior log-probs.

Two guarantees matter to the rest of Invar:

* The log-prob recorded for a sampled token is taken from the very distribution the token was
  drawn from (after temperature, top-k and top-p renormalisation), so importance ratios
  against it are exact.
* Row i's randomness is a function of `seeds[i]` alone: its Gumbel noise is drawn from a
  private CPU generator, position by position. A request re-issued alone, or in another batch,
  meets the same noise and so draws the same tokens (up to float rounding of the logits
  themselves, which can depend on the batch shape).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from invar.runtime.padding import Prompts, left_mask, positions_of
from invar.runtime.policy import KVCache, Policy
from invar.runtime.policy_config import PolicyConfig

if TYPE_CHECKING:
    from invar.runtime.worker import WorkerArgs


def sampling_logprobs(
    logits: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> Tensor:
    """Float64 log-probs [n, V] of the distribution sampled from; -inf outside its support.

    Order: temperature, then top-k (ties with the k-th logit are kept), then top-p (the
    smallest set of most likely tokens whose mass reaches `top_p`; ties with the last one
    are kept), renormalising after each cut.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be non-negative (0 disables it), got {top_k}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    logprobs = torch.log_softmax(logits.double() / temperature, dim=-1)
    if 0 < top_k < logprobs.shape[-1]:
        kth_best = logprobs.topk(top_k, dim=-1).values[..., -1:]
        logprobs = torch.log_softmax(logprobs.masked_fill(logprobs < kth_best, -torch.inf), -1)
    if top_p < 1:
        ranked = logprobs.sort(dim=-1, descending=True).values
        ranked_probs = ranked.exp()
        mass_before = ranked_probs.cumsum(dim=-1) - ranked_probs
        # A token is kept while the mass ranked above it is short of top_p (the best always is).
        kept = mass_before < top_p
        least_kept = ranked.masked_fill(~kept, torch.inf).min(dim=-1, keepdim=True).values
        logprobs = torch.log_softmax(logprobs.masked_fill(logprobs < least_kept, -torch.inf), -1)
    return logprobs


def gumbel_noise(seeds: Sequence[int], new_tokens: int, vocab_size: int) -> Tensor:
    """Float64 Gumbel noise [n, new_tokens, V]; row i depends on `seeds[i]` only.

    Drawn on the CPU so the same seed gives the same noise on every device.
    """
    steps = gumbel_steps(seeds, vocab_size)
    return torch.stack([next(steps) for _ in range(new_tokens)], dim=1)


def gumbel_steps(seeds: Sequence[int], vocab_size: int) -> Iterator[Tensor]:
    """`gumbel_noise` one position at a time: float64 noise [n, V] for each next position.
    Row i reads its own generator, seeded with `seeds[i]`, in position order, so the values
    are those of `gumbel_noise`, while only one position's noise is held at a time (with a
    150k-token vocabulary a whole response's would take gigabytes)."""
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    while True:
        uniform = torch.stack([torch.rand(vocab_size, dtype=torch.float64, generator=generator)
                               for generator in generators])
        # Keep log(0) out: a -inf draw could otherwise tie every token at -inf.
        uniform = uniform.clamp_(min=torch.finfo(torch.float64).tiny)
        yield -torch.log(-torch.log(uniform))


@torch.no_grad()
def generate(
    policy: Policy,
    prompts: Tensor,
    new_tokens: int,
    seeds: Sequence[int] | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    greedy: bool = False,
    use_cache: bool = True,
    prompt_lengths: Sequence[int] | np.ndarray | None = None,
    eos: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Continue each prompt row [n, P] by up to `new_tokens` tokens.

    Returns `(tokens [n, T] int64, behavior_logprobs [n, T] float64)`, T <= new_tokens.
    Sampling draws `argmax(logprobs + gumbel)`, an exact sample of `sampling_logprobs`.
    `seeds` (one per row, the request's sampling seed) is required unless `greedy`; greedy
    decoding takes the argmax of the raw logits and records log-prob 0, since that token had
    probability one under the behavior policy. `use_cache=False` recomputes the whole prefix
    at every step (the reference the KV cache is checked against).

    `prompt_lengths`: each row's real prompt tokens, left-padded to P (`padding.Prompts`):
    the padding is masked and positions count from the row's first real token, so a padded
    row draws what it draws alone. `eos`: a response ends at its first `eos`
    (`padding.response_lengths`), and the call stops once every row has ended (T is then the
    longest response); a row's tokens up to its end do not depend on when the call stops,
    since its noise is its own.
    """
    rows = prompts.shape[0]
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be positive, got {new_tokens}")
    if prompts.shape[1] + new_tokens > policy.max_len:
        raise ValueError(
            f"{prompts.shape[1]} prompt + {new_tokens} new tokens exceed max_len "
            f"{policy.max_len}"
        )
    noise = None
    if not greedy:
        if seeds is None or len(seeds) != rows:
            given = "none" if seeds is None else len(seeds)
            raise ValueError(f"need one seed per prompt row ({rows}), got {given}")
        noise = gumbel_steps(seeds, policy.vocab_size)
    masked = prompt_lengths is not None and len(prompt_lengths) > 0 and \
        int(min(prompt_lengths)) < prompts.shape[1]
    mask = positions = None
    if masked:
        prompt_mask = left_mask(np.asarray(prompt_lengths), prompts.shape[1])
        mask = torch.as_tensor(prompt_mask, device=prompts.device)
        positions = torch.as_tensor(positions_of(prompt_mask), device=prompts.device)

    sequences = prompts
    cache: KVCache | None = None
    step_input, step_positions = prompts, positions  # with the cache, only unseen tokens
    ended = torch.zeros(rows, dtype=torch.bool, device=prompts.device)
    chosen_tokens, chosen_logprobs = [], []
    # Only the last position's logits are sampled from: a policy that can skip the output
    # layer elsewhere is told so (for a prompt of 48 tokens and a 49k vocabulary, a sixth of
    # a call's work).
    only_last = {"last": 1} if getattr(policy, "keeps_last_logits", False) else {}
    for _ in range(new_tokens):
        if use_cache:
            logits, cache = policy.forward_with_cache(step_input, cache, mask, step_positions,
                                                      **only_last)
        else:
            logits = policy(sequences, mask, positions)
        last = logits[:, -1]
        if noise is None:
            token = last.argmax(dim=-1)
            logprob = torch.zeros(rows, dtype=torch.float64, device=last.device)
        else:
            logprobs = sampling_logprobs(last, temperature, top_k, top_p)
            token = (logprobs + next(noise).to(last.device)).argmax(dim=-1)
            logprob = logprobs.gather(1, token[:, None])[:, 0]
        chosen_tokens.append(token)
        chosen_logprobs.append(logprob)
        if eos is not None:
            ended |= token == eos
            if bool(ended.all()):
                break
        step_input = token[:, None]
        sequences = torch.cat([sequences, step_input], dim=1)
        if masked:
            assert mask is not None and positions is not None
            mask = torch.cat([mask, torch.ones_like(ended)[:, None]], dim=1)
            step_positions = positions[:, -1:] + 1
            positions = torch.cat([positions, step_positions], dim=1)
    return torch.stack(chosen_tokens, dim=1), torch.stack(chosen_logprobs, dim=1)


class TorchSampler:
    """`learner.backend = "torch"`'s rollout sampler (`invar.runtime.registry.LEARNERS`): the
    built-in policy, or a transformers one (`WorkerArgs.model`), sampled by `generate`."""

    def __init__(self, args: WorkerArgs) -> None:
        self.policy: Any
        if args.model is not None:
            from invar.runtime.hf_policy import HFPolicy, ModelSpec
            spec = ModelSpec(**{**args.model, "symbol_ids": tuple(args.model["symbol_ids"])})
            self.policy = HFPolicy(spec, seed=0, pretrained=False)
        else:
            self.policy = Policy(PolicyConfig(**args.policy), seed=0).eval()
        self.args = args

    def load(self, state: Mapping[str, Any]) -> None:
        self.policy.load_state_dict(state)

    def generate(self, prompts: Prompts, response_length: int, seeds: Sequence[int],
                 eos: int | None) -> tuple[np.ndarray, np.ndarray]:
        tokens, logprobs = generate(
            self.policy, torch.as_tensor(prompts.tokens), response_length, seeds,
            temperature=self.args.temperature, top_k=self.args.top_k, top_p=self.args.top_p,
            prompt_lengths=prompts.lengths, eos=eos)
        return tokens.numpy(), logprobs.numpy()
