"""The rollout worker keeps the world's worker rules (`invar.model.world.worker_accepts`): it
carries out loads in serial order only (an older load, duplicated or delayed, is ignored; the
current one re-sent is answered again) and answers launches only for the version it holds."""

from __future__ import annotations

import torch

from invar.model.messages import Completion, LaunchRequest, LoadWeights, WeightsLoaded
from invar.model.schedule import RequestId
from invar.runtime.config import reverse_task
from invar.runtime.policy import Policy, PolicyConfig
from invar.runtime.task import DigitReversal
from invar.runtime.weights import state_dict_to_bytes, weights_digest
from invar.runtime.worker import RolloutWorker, WorkerArgs

TASK = DigitReversal(4)
CONFIG = PolicyConfig(max_len=TASK.sequence_length, width=16, layers=1)


def weights(seed):
    state = Policy(CONFIG, seed).state_dict()
    return state_dict_to_bytes(state), weights_digest(state)


def launch(version):
    return [LaunchRequest("w", 0, RequestId(0, 0, sample), version, 11 + sample, 3)
            for sample in range(2)]


def test_an_older_load_is_ignored_and_the_current_one_answered_again():
    torch.set_num_threads(1)
    worker = RolloutWorker(WorkerArgs(name="w", task=reverse_task(TASK.length), policy=vars(CONFIG),
                                      prompts_per_batch=1, group_size=2, chunk_prompts=1))
    old, new = weights(1), weights(2)
    assert worker.load(LoadWeights("w", 0, 1, 2, "d2"), *new) == WeightsLoaded("w", 0, 1, 2)
    assert worker.load(LoadWeights("w", 0, 0, 1, "d1"), *old) is None  # overtaken: ignored
    assert worker.version == 2 and worker.load_serial == 1
    assert worker.load(LoadWeights("w", 0, 1, 2, "d2"), *new) == WeightsLoaded("w", 0, 1, 2)
    assert len(worker.launch(launch(1))) == 0  # a launch for a version it does not hold
    completed = worker.launch(launch(2))
    assert [type(e) for e in completed] == [Completion] * 2
    assert all(e.version == 2 for e in completed)
    # A re-sent launch is answered with the very rows first sent (its frame's columns).
    assert worker.launch(launch(2)[::-1]) == completed.take([1, 0])
