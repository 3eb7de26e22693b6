"""The arguments a rollout worker process starts with, from the run's configuration (the
driver sends them to a worker process; the serial execution builds its workers in-process
from them)."""

from __future__ import annotations

from typing import Any

from invar.runtime.config import TrainConfig, split_fault, task_section, task_vocabulary
from invar.runtime.retry import heartbeat_seconds


def worker_args(config: TrainConfig, name: str, incarnation: int = 0) -> dict[str, Any]:
    """The JSON arguments a worker process is started with.

    Injected faults go to the workers they name (all when unnamed), first incarnation only.
    """
    c = config
    faults = []
    for fault in c.rollout.faults if incarnation == 0 else ():
        target, kind = split_fault(fault)
        if target in (None, name):
            faults.append(kind)
    return dict(name=name, task=task_section(c), policy=_policy_dict(c),
                prompts_per_batch=c.protocol.prompts_per_batch, group_size=c.protocol.group_size,
                chunk_prompts=c.rollout.chunk_prompts, temperature=c.sampling.temperature,
                top_k=c.sampling.top_k, top_p=c.sampling.top_p, threads=c.rollout.threads,
                backend=c.learner.backend, faults=faults, model=_model_spec(c),
                heartbeat_seconds=heartbeat_seconds(c.output.retry_seconds))


def _model_spec(config: TrainConfig) -> dict[str, Any] | None:
    """A transformers policy's resolved model for the workers (None for the built-in one)."""
    if config.policy.kind != "transformers":
        return None
    from invar.runtime.hf_policy import resolve
    return resolve(config.policy.path, config.policy.config,
                   task_vocabulary(config)).to_dict()


def _policy_dict(config: TrainConfig) -> dict[str, Any]:
    return {k: getattr(config.policy, k) for k in config.policy.__dataclass_fields__}
