"""What running the verifier in child processes costs a rollout worker, against running it
inline: one default batch (64 prompts x 8 samples of 8-digit reversal, chunks of 16 prompts)
generated and scored by `RolloutWorker.launch`, with task.verifier_processes = 0 (inline),
1 and 2; plus the verifier alone on the same 512 responses. Repetitions are interleaved so
background load hits every setting alike; medians.

    python benchmarks/bench_verifier.py [--repeats N] [--slow-ms MS]

`--slow-ms` adds a verifier that sleeps that long per call (a stand-in for an expensive
reward function, e.g. running code) through a plug-in, to show the overlap with generation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from invar.model.messages import LaunchRequest, LoadWeights
from invar.model.schedule import RequestId
from invar.runtime.config import load_config, to_dict
from invar.runtime.policy import Policy, PolicyConfig
from invar.runtime.verifier import Job
from invar.runtime.weights import state_dict_to_bytes, weights_digest
from invar.runtime.worker import RolloutWorker, WorkerArgs

SLOW_TASK = '''
import time
from invar.runtime.task import DigitReversal

class Slow(DigitReversal):
    def __init__(self, seconds):
        super().__init__(8)
        self.seconds = seconds

    def score(self, split, index, response):
        time.sleep(self.seconds)
        return super().score(split, index, response)

def make(seconds):
    return Slow(seconds)
'''


def task_section(processes: int, slow_ms: float, directory: Path) -> dict:
    overrides = [f"task.verifier_processes={processes}"]
    if slow_ms:
        module = directory / "slow_task.py"
        module.write_text(SLOW_TASK)
        overrides += ["task.name=module", f"task.module={json.dumps(str(module) + ':make')}",
                      f"task.options.seconds={slow_ms / 1000}"]
    return to_dict(load_config(None, overrides).task)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = PolicyConfig(max_len=18)
    state = Policy(config, seed=0).state_dict()
    blob, digest = state_dict_to_bytes(state), weights_digest(state)
    launches = [LaunchRequest("w", 0, RequestId(0, p, s), 0, 1000 + 8 * p + s, p)
                for p in range(64) for s in range(8)]
    workers = {}
    with tempfile.TemporaryDirectory() as directory:
        for processes in (0, 1, 2):
            worker = RolloutWorker(WorkerArgs(
                name="w", task=task_section(processes, args.slow_ms, Path(directory)),
                policy=vars(config), prompts_per_batch=64, group_size=8, chunk_prompts=16))
            worker.load(LoadWeights("w", 0, 0, 0, digest), blob, digest)
            workers[processes] = worker
        launch: dict[int, list[float]] = {p: [] for p in workers}
        alone: dict[int, list[float]] = {p: [] for p in workers}
        for _ in range(args.repeats):
            for processes, worker in workers.items():
                worker.replies.clear()
                began = time.perf_counter()
                completions = worker.launch(launches)
                launch[processes].append(time.perf_counter() - began)
                jobs = [Job("train", c.request.prompt, c.tokens) for c in completions]
                began = time.perf_counter()
                worker.verifier.submit(jobs).outcomes()
                alone[processes].append(time.perf_counter() - began)
        for worker in workers.values():
            worker.close()
    print(f"512 samples, median of {args.repeats}" +
          (f", verifier sleeping {args.slow_ms} ms a call" if args.slow_ms else ""))
    print("| verifier_processes | generate + score (launch) | score alone |")
    print("|---|---|---|")
    for processes in workers:
        print(f"| {processes} | {1000 * statistics.median(launch[processes]):.1f} ms | "
              f"{1000 * statistics.median(alone[processes]):.1f} ms |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
