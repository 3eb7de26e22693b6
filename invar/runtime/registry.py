"""Learner backends and worker transports, by the name the configuration gives them.

`LEARNERS` (`learner.backend`) and `TRANSPORTS` (`rollout.transport`) map a name to import
paths, "module:attribute", resolved only when that name is used (the model is Hypothesis's
provider registry, `AVAILABLE_PROVIDERS`): checking a configuration imports no framework, and a
run imports only the backend and the transport it names. What the configuration's checks must
know of an entry without importing it is declared in the entry.

A learner backend is two modules: its learner (`open_learner(config, commit_dir)`, returning a
`backend.LearnerBackend`) and its sampler (a class built from a rollout worker's `WorkerArgs`,
a `backend.Sampler`: a worker samples with its run's learner backend, from the weights blob
every backend publishes). A transport is a launcher class (`transport.Launcher`), built from
the configuration. Adding either is its module(s) and one entry here (README, "Layout").
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from invar.runtime.policy_config import POLICY_KINDS


@dataclass(frozen=True)
class LearnerEntry:
    """A learner backend: where its learner and sampler are, and what it cannot run."""

    learner: str
    """"module:attribute" of `open_learner(config, commit_dir) -> LearnerBackend`."""
    sampler: str
    """"module:attribute" of the rollout worker's `Sampler` class, built from `WorkerArgs`."""
    label: str
    """The backend's name in messages ("the MLX backend ...")."""
    policy_kinds: tuple[str, ...] = POLICY_KINDS
    """The `policy.kind`s it runs."""
    synchronous: str = ""
    """Why rollout and learning cannot overlap on it (it then needs protocol.max_staleness =
    0); empty: they can."""
    device_check: str = ""
    """"module:attribute" of `(learner.device) -> problem` ("" when this machine offers the
    device), called for a device other than "cpu"; empty: the device is not checked."""


@dataclass(frozen=True)
class TransportEntry:
    """A way to reach rollout workers: its launcher, and which settings it reads."""

    launcher: str
    """"module:attribute" of its `Launcher` class, built from the configuration."""
    hosts: bool = False
    """Workers run on `rollout.hosts`, one host a worker (else the list must be empty)."""
    settings_check: str = ""
    """"module:attribute" of `(config) -> None`, raising ConfigError for a setting of this
    transport that cannot work (a framework-free module: the configuration calls it)."""


LEARNERS: dict[str, LearnerEntry] = {
    "torch": LearnerEntry("invar.runtime.torch_learner:open_learner",
                          "invar.runtime.sampler:TorchSampler", "torch",
                          device_check="invar.runtime.torch_learner:device_problem"),
    "mlx": LearnerEntry("invar.runtime.mlx_learner:open_learner",
                        "invar.runtime.mlx_sampler:MLXSampler", "MLX", policy_kinds=("gpt",),
                        synchronous="MLX evaluates lazily on one device stream, so rollout and "
                                    "learning cannot overlap"),
}
"""`learner.backend`: the learner and the sampler of each backend."""

TRANSPORTS: dict[str, TransportEntry] = {
    "local": TransportEntry("invar.runtime.transport:LocalLauncher"),
    "ssh": TransportEntry("invar.runtime.ssh:SshLauncher", hosts=True,
                          settings_check="invar.runtime.sshspec:check_settings"),
}
"""`rollout.transport`: how the driver starts its workers."""


def resolve(path: str) -> Any:
    """The object a "module:attribute" path names, its module imported now."""
    module, _, attribute = path.partition(":")
    found: Any = importlib.import_module(module)
    for part in attribute.split("."):
        found = getattr(found, part)
    return found


def one_of(names: Iterable[str]) -> str:
    """'"a", "b" or "c"': the names a setting may take, for a message."""
    quoted = [f'"{name}"' for name in names]
    return " or ".join(filter(None, (", ".join(quoted[:-1]), quoted[-1])))
