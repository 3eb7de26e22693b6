"""Learner backends and transports are registry entries (`invar.runtime.registry`): a backend
or a transport added by one entry is offered by the command line, checked by the
configuration and used by the workers and the driver, with nothing else edited.

The toy backend's learner is `FakeLearner` and its sampler answers without a network; the toy
transport starts `MemoryWorkers`. Each is registered for one test (`monkeypatch.setitem`), by
the import path of this module, as a new backend's own modules would be."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from invar.model.core import logical_projection, run_complete
from invar.model.errors import ConfigError
from invar.model.messages import LaunchRequest, LoadWeights, WeightsLoaded
from invar.model.schedule import RequestId
from invar.runtime import registry
from invar.runtime.cli import main, make_learner
from invar.runtime.config import TrainConfig, load_config, reverse_task, worker_names
from invar.runtime.padding import Prompts
from invar.runtime.registry import LearnerEntry, TransportEntry, one_of
from invar.runtime.transport import MemoryTransport
from invar.testing import canonical_run
from invar.testing.runtime import FakeLearner, MemoryWorkers, request_rows


def open_toy_learner(config: TrainConfig, commit_dir: Path) -> FakeLearner:
    return FakeLearner(commit_dir, config.protocol.optimizer_steps)


class ToySampler:
    """Answers every row with its seed, repeated, at log-prob -1; records the loads."""

    def __init__(self, args: Any) -> None:
        self.policy = args.policy
        self.loaded: list[list[str]] = []

    def load(self, state: Mapping[str, Any]) -> None:
        self.loaded.append(sorted(state))

    def generate(self, prompts: Prompts, response_length: int, seeds: Sequence[int],
                 eos: int | None) -> tuple[np.ndarray, np.ndarray]:
        tokens = np.repeat(np.asarray(seeds, dtype=np.int64)[:, None] % 10, response_length, 1)
        return tokens, np.full(tokens.shape, -1.0)


class ToyLauncher:
    """Workers as coroutines (`MemoryWorkers`); counts its checks."""

    def __init__(self, config: TrainConfig) -> None:
        self.workers = MemoryWorkers()
        self.checks = 0

    async def check(self) -> None:
        self.checks += 1

    async def spawn(self, name: str, incarnation: int) -> MemoryTransport:
        return await self.workers(name, incarnation)


def refuse_every_host(config: TrainConfig) -> None:
    raise ConfigError(("rollout.hosts",), f"the toy refuses {', '.join(config.rollout.hosts)}")


TOY = LearnerEntry(f"{__name__}:open_toy_learner", f"{__name__}:ToySampler", "toy",
                   synchronous="it samples and learns in turn")


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(registry.LEARNERS, "toy", TOY)
    monkeypatch.setitem(registry.TRANSPORTS, "toy", TransportEntry(f"{__name__}:ToyLauncher"))


def test_a_registered_backend_is_offered_and_checked_like_the_others(toy, tmp_path, capsys):
    synchronous = ['learner.backend="toy"', "protocol.max_staleness=0"]
    assert load_config(None, synchronous).learner.backend == "toy"
    with pytest.raises(ConfigError) as unknown:
        load_config(None, ['learner.backend="jax"'])
    assert unknown.value.reason == 'must be "torch", "mlx" or "toy"'
    # What the entry declares it cannot do is refused, with its reason.
    with pytest.raises(ConfigError) as stale:
        load_config(None, ['learner.backend="toy"', "protocol.max_staleness=1"])
    assert stale.value.fields == ("learner.backend", "protocol.max_staleness")
    assert stale.value.reason == ("the toy backend runs synchronously: it samples and learns in "
                                  "turn; set protocol.max_staleness = 0")
    # The command line's --backend takes it.
    printed = tmp_path / "printed.toml"
    assert main(["train", "--backend", "toy", "--set", "protocol.max_staleness=0",
                 "--print-config"]) == 0
    printed.write_text(capsys.readouterr().out)
    assert load_config(printed) == load_config(None, synchronous)


def test_a_worker_samples_with_its_backend_s_sampler(toy):
    import torch

    from invar.runtime.weights import state_dict_to_bytes, weights_digest
    from invar.runtime.worker import RolloutWorker, WorkerArgs

    worker = RolloutWorker(WorkerArgs(name="w", task=reverse_task(4), policy={"width": 16},
                                      prompts_per_batch=1, group_size=2, chunk_prompts=1,
                                      backend="toy"))
    try:
        state = {"weight": torch.zeros(2)}
        loaded = worker.load(LoadWeights("w", 0, 0, 0, "d"), state_dict_to_bytes(state),
                             weights_digest(state))
        assert loaded == WeightsLoaded("w", 0, 0, 0)
        assert isinstance(worker.sampler, ToySampler) and worker.sampler.loaded == [["weight"]]
        completions = worker.launch([LaunchRequest("w", 0, RequestId(0, 0, sample), 0,
                                                   13 + sample, 3) for sample in range(2)])
    finally:
        worker.close()
    assert [c.tokens for c in completions] == [(3,) * 4, (4,) * 4]
    assert all(c.behavior_logprobs == (-1.0,) * 4 for c in completions)


def test_a_registered_transport_starts_the_workers_of_a_whole_run(toy, rt, tmp_path):
    from invar.runtime.driver import Driver

    config = rt.tiny_config(tmp_path, 'learner.backend="toy"', "protocol.max_staleness=0",
                            'rollout.transport="toy"', "rollout.workers=2")
    driver = Driver(config, make_learner(config), learner_inputs=request_rows)
    assert isinstance(driver.launcher, ToyLauncher)
    state = asyncio.run(asyncio.wait_for(driver.run(), 30))
    assert driver.launcher.checks == 1
    assert driver.launcher.workers.spawned == [(name, 0) for name in worker_names(2)]
    expected = canonical_run(config.protocol, tuple(worker_names(2))).state
    assert run_complete(state) and logical_projection(state) == logical_projection(expected)


def test_a_transport_s_own_settings_are_checked_from_its_entry(monkeypatch):
    monkeypatch.setitem(registry.TRANSPORTS, "toy", TransportEntry(
        f"{__name__}:ToyLauncher", hosts=True, settings_check=f"{__name__}:refuse_every_host"))
    with pytest.raises(ConfigError) as hosts:
        load_config(None, ['rollout.transport="toy"', "rollout.workers=2", 'rollout.hosts=["a"]'])
    assert hosts.value.fields == ("rollout.hosts", "rollout.workers")
    assert hosts.value.reason.startswith("toy transport needs one host per worker")
    with pytest.raises(ConfigError) as refused:
        load_config(None, ['rollout.transport="toy"', 'rollout.hosts=["a"]'])
    assert str(refused.value) == "rollout.hosts: the toy refuses a"
    with pytest.raises(ConfigError) as local:
        load_config(None, ['rollout.hosts=["a"]'])
    assert 'set rollout.transport = "ssh" or "toy" to use them' in local.value.reason


def test_one_of_names_the_choices():
    assert one_of(["torch"]) == '"torch"'
    assert one_of(["local", "ssh"]) == '"local" or "ssh"'
    assert one_of(["a", "b", "c"]) == '"a", "b" or "c"'
