"""`policy.kind = "transformers"`: a transformers causal LM behind the protocol.

Tiny random-weight models (hidden 32, 2 layers, 2 heads) built from configs, or saved into a
temporary directory with `save_pretrained` and loaded back; nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import torch  # noqa: E402
from tokenizers import Regex, Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402

from invar.model.core import logical_projection, run_complete  # noqa: E402
from invar.model.errors import ConfigError  # noqa: E402
from invar.model.messages import LoadWeights  # noqa: E402
from invar.runtime import export  # noqa: E402
from invar.runtime.commits import read_commit  # noqa: E402
from invar.runtime.config import load_config, to_dict  # noqa: E402
from invar.runtime.hf_policy import HFPolicy, resolve, task_tokenizer  # noqa: E402
from invar.runtime.policy import PolicyConfig  # noqa: E402
from invar.runtime.sampler import generate  # noqa: E402
from invar.runtime.task import BOS, SEP, DigitReversal  # noqa: E402
from invar.runtime.torch_learner import OptimConfig, TorchLearner  # noqa: E402
from invar.runtime.worker import RolloutWorker, WorkerArgs  # noqa: E402
from invar.runtime.worker_args import worker_args  # noqa: E402
from invar.testing.runtime import SimulatedCrash  # noqa: E402

TASK = DigitReversal(4)
SHAPES = {
    "llama": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_key_value_heads": 2,
              "max_position_embeddings": 32},
    "qwen2": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_key_value_heads": 2,
              "max_position_embeddings": 32},
    # GPT-2's default dropout (0.1) stays in the config: the policy must not apply it.
    "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 32},
}
LLAMA = {"model_type": "llama", **SHAPES["llama"]}
LEARNING_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 256,
                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
                  "max_position_embeddings": 64}
"""The README's example: the built-in policy's width, depth and heads."""


def transformers_overrides(rt, run_dir: Path, *extra: str) -> list[str]:
    """The runtime tests' tiny run with the tiny Llama as its policy (TINY's policy keys shape
    the built-in policy only)."""
    return [*(item for item in rt.TINY if not item.startswith("policy.")),
            "policy.kind=\"transformers\"", f"policy.config={_toml_table(LLAMA)}",
            f"output.run_dir={json.dumps(str(run_dir))}", *extra]


def _toml_table(table: dict) -> str:
    return "{" + ", ".join(f"{key} = {json.dumps(value)}" for key, value in table.items()) + "}"


def invar(rt, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(rt.cli(*args), capture_output=True, text=True, timeout=120,
                          check=False)


def policy_of(model_type: str, seed: int = 0) -> HFPolicy:
    return HFPolicy(resolve("", {"model_type": model_type, **SHAPES[model_type]}), seed)


def prompts_of(indices) -> torch.Tensor:
    return torch.as_tensor(TASK.prompts("train", indices))


@pytest.mark.parametrize("model_type", sorted(SHAPES))
def test_the_cache_gives_the_full_forward_s_logits_and_no_dropout(model_type):
    policy = policy_of(model_type)
    policy.train()  # the learner's mode: dropout would still be off
    tokens = torch.as_tensor(np.concatenate([TASK.prompts("train", range(3)),
                                             TASK.prompts("train", range(3, 6))], axis=1))
    full = policy(tokens)
    assert full.shape == (3, tokens.shape[1], 12)
    assert torch.equal(full, policy(tokens))
    prefix, cache = policy.forward_with_cache(tokens[:, :5], None)
    steps = [prefix]
    for position in range(5, tokens.shape[1]):
        logits, cache = policy.forward_with_cache(tokens[:, position:position + 1], cache)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    assert list(policy.state_dict()) == list(policy.model.state_dict())


def test_weights_come_from_the_seed_alone_and_leave_the_global_rng_alone():
    before = torch.get_rng_state()
    first, again, other = policy_of("llama", 3), policy_of("llama", 3), policy_of("llama", 4)
    assert torch.equal(torch.get_rng_state(), before)
    for name, tensor in first.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name])
    assert not torch.equal(first.state_dict()["lm_head.weight"],
                           other.state_dict()["lm_head.weight"])


def test_a_request_s_tokens_do_not_depend_on_what_shared_the_call():
    policy = policy_of("llama")
    seeds = [11, 12, 13, 14]
    alone = prompts_of([0, 0, 0, 0])
    mixed = prompts_of([5, 0, 7, 9])
    tokens_alone, logprobs_alone = generate(policy, alone, TASK.response_length, seeds)
    tokens_mixed, logprobs_mixed = generate(policy, mixed, TASK.response_length, seeds)
    assert torch.equal(tokens_alone[1], tokens_mixed[1])
    assert torch.equal(logprobs_alone[1], logprobs_mixed[1])


def test_behaviour_logprobs_are_the_learner_s_proximal_and_reference_scores(tmp_path):
    learner = TorchLearner(PolicyConfig(kind="transformers", config=LLAMA), OptimConfig(), 0,
                           tmp_path)
    learner.start()
    prompts = TASK.prompts("train", range(8))
    tokens, behaviour = generate(learner.model, torch.as_tensor(prompts),
                                 TASK.response_length, seeds=list(range(8)))
    sequences = np.concatenate([prompts, tokens.numpy()], axis=1)
    proximal, reference = learner.score(sequences, TASK.prompt_length, need_reference=True)
    np.testing.assert_allclose(proximal, behaviour.numpy(), atol=1e-5)
    np.testing.assert_array_equal(proximal, reference)  # no step taken yet


def test_a_worker_builds_the_model_from_its_arguments_and_loads_published_weights(tmp_path, rt):
    config = load_config(None, transformers_overrides(rt, tmp_path))
    learner = TorchLearner(config.policy, config.optim, 5, tmp_path / "commits")
    learner.start()
    raw = worker_args(config, "worker-0")
    json.dumps(raw)  # travels as JSON on a command line
    worker = RolloutWorker(WorkerArgs(**{**raw, "faults": ()}))
    blob, params_digest, state_digest = learner.published_weights(0)
    loaded = worker.load(LoadWeights("worker-0", 0, 0, 0, state_digest), blob, params_digest)
    assert loaded is not None
    for name, tensor in learner.model.state_dict().items():
        assert torch.equal(tensor, worker.policy.state_dict()[name]), name
    prompts = prompts_of(range(4))
    expected = generate(learner.model, prompts, TASK.response_length, [1, 2, 3, 4])
    got = generate(worker.policy, prompts, TASK.response_length, [1, 2, 3, 4])
    assert all(torch.equal(a, b) for a, b in zip(expected, got))


def _own_id_tokenizer() -> PreTrainedTokenizerFast:
    """A tokenizer whose ids are not the task's: filler tokens first, digits in reverse order,
    "<s>" its BOS token."""
    vocabulary = {text: token for token, text in enumerate(
        ["<s>", "a", "b", "=", *(str(d) for d in reversed(range(10))), "c", "d"])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocabulary, unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.add_special_tokens(["<s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>")


def _saved_model(directory: Path, tokenizer, vocab_size: int) -> Path:
    from transformers import AutoConfig
    config = AutoConfig.for_model("llama", vocab_size=vocab_size, **SHAPES["llama"])
    torch.manual_seed(7)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_a_directory_s_tokenizer_maps_the_task_s_tokens(tmp_path):
    directory = _saved_model(tmp_path, _own_id_tokenizer(), vocab_size=16)
    spec = resolve(str(directory), {})
    digits = [13 - d for d in range(10)]
    assert spec.symbol_ids == (*digits, 0, 3)  # BOS is "<s>", SEP is "="
    policy = HFPolicy(spec, seed=0)
    saved = AutoModelForCausalLM.from_pretrained(directory)
    for name, tensor in saved.state_dict().items():
        assert torch.equal(tensor, policy.state_dict()[name]), name
    prompts = prompts_of(range(2))
    model_ids = torch.as_tensor(spec.symbol_ids)[prompts]
    assert model_ids[0, 0] == 0 and model_ids[0, -1] == 3
    torch.testing.assert_close(policy(prompts), saved(model_ids).logits[..., list(spec.symbol_ids)])


def test_a_directory_without_weights_or_tokenizer_is_refused(tmp_path, rt):
    directory = _saved_model(tmp_path / "model", task_tokenizer(), vocab_size=12)
    (directory / "tokenizer.json").unlink()
    (directory / "tokenizer_config.json").unlink()

    def refusal(path: Path) -> str:
        with pytest.raises(ConfigError) as refused:
            load_config(None, [*transformers_overrides(rt, tmp_path / "run"),
                               "policy.config={}", f"policy.path={json.dumps(str(path))}"])
        assert refused.value.fields == ("policy.path",)
        return refused.value.reason

    assert refusal(directory) == (f"no tokenizer in {directory} (none of tokenizer.json, "
                                  "tokenizer_config.json, tokenizer.model, vocab.json)")
    (directory / "model.safetensors").unlink()
    assert refusal(directory) == (f"no model weights (*.safetensors or pytorch_model.bin) in "
                                  f"{directory}")
    assert refusal(tmp_path / "absent") == (f"{str(tmp_path / 'absent')!r} is neither a model "
                                             "directory nor a .gguf file")


@pytest.mark.parametrize("extra, fields", [
    (["learner.backend=\"mlx\"", "protocol.max_staleness=0"], ("learner.backend", "policy.kind")),
    (["policy.width=32"], ("policy.width",)),
    (["policy.config={hidden_size = 32}"], ("policy.config.model_type",)),
    (["policy.config.hidden_sise=32"], ("policy.config.hidden_sise",)),
    (["policy.config.vocab_size=10"], ("policy.config.vocab_size",)),
    (["policy.config.max_position_embeddings=8"],
     ("policy.config.max_position_embeddings", "task.length")),
    (["policy.path=\"/tmp\""], ("policy.path", "policy.config")),
    (["policy.kind=\"gpt\""], ("policy.kind", "policy.config")),
    (["policy.config.model_type=\"t5\""], ("policy.config.model_type",)),
], ids=["mlx", "gpt shape", "no model_type", "misspelt key", "vocabulary", "positions",
        "path and config", "gpt with config", "not causal"])
def test_configurations_that_cannot_serve_are_refused_naming_the_field(tmp_path, rt, extra,
                                                                         fields):
    with pytest.raises(ConfigError) as refused:
        load_config(None, transformers_overrides(rt, tmp_path, *extra))
    assert refused.value.fields == fields


def test_the_readme_s_example_configuration_is_the_learning_test_s(tmp_path):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    example = readme.split("```toml\n# llama.toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "llama.toml").write_text(example)
    config = load_config(tmp_path / "llama.toml")
    assert config.policy.kind == "transformers" and config.policy.config == LEARNING_LLAMA
    assert config.task == load_config().task and config.protocol == load_config().protocol


@pytest.fixture(scope="module")
def asynchronous_run(tmp_path_factory, rt):
    """A tiny run with the Llama policy: two worker processes, 4 updates, a checkpoint."""
    run_dir = tmp_path_factory.mktemp("asynchronous")
    config = load_config(None, transformers_overrides(
        rt, run_dir, "rollout.workers=2", "protocol.total_updates=4",
        "protocol.checkpoint_every=2"))
    state = rt.run_driver(config)
    assert run_complete(state)
    return run_dir, state


def test_an_asynchronous_run_equals_the_serial_reference_bitwise(asynchronous_run, tmp_path, rt):
    run_dir, state = asynchronous_run
    config = load_config(None, transformers_overrides(
        rt, tmp_path, "rollout.workers=2", "protocol.total_updates=4",
        "protocol.checkpoint_every=2"))
    serial = rt.run_serial(config)
    assert logical_projection(serial) == logical_projection(state)
    assert serial.commit_digests == state.commit_digests
    rt.assert_same_weights(rt.final_weights(tmp_path), rt.final_weights(run_dir))
    assert "model.layers.1.mlp.down_proj.weight" in rt.final_weights(run_dir)["model"]


class CrashBeforeCommit:
    """A learner that dies (with its driver) when asked to commit `version`."""

    def __init__(self, learner, version: int) -> None:
        self.learner = learner
        self.version = version

    def __getattr__(self, name):
        return getattr(self.learner, name)

    def commit(self, version: int) -> str:
        if version == self.version:
            raise SimulatedCrash(f"killed before committing version {version}")
        return self.learner.commit(version)


def test_a_resumed_run_ends_with_the_uninterrupted_run_s_weights(asynchronous_run, tmp_path,
                                                                  rt):
    from invar.runtime.cli import make_learner
    from invar.runtime.driver import Driver
    config = load_config(None, transformers_overrides(
        rt, tmp_path, "rollout.workers=2", "protocol.total_updates=4",
        "protocol.checkpoint_every=2"))
    with rt.torch_globals_kept(), pytest.raises(RuntimeError, match="a driver task failed"):
        asyncio.run(Driver(config, CrashBeforeCommit(make_learner(config), 3)).run())
    state = rt.run_driver(config, resume=True)
    assert run_complete(state)
    run_dir, uninterrupted = asynchronous_run
    assert state.commit_digests == uninterrupted.commit_digests
    rt.assert_same_weights(rt.final_weights(tmp_path), rt.final_weights(run_dir))


def test_export_writes_a_directory_transformers_loads(asynchronous_run, tmp_path, rt):
    run_dir, _ = asynchronous_run
    out = tmp_path / "exported"
    done = invar(rt, "export", str(run_dir), str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"exported version 4 of {run_dir} to {out}\n"
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    committed = rt.final_weights(run_dir)["model"]
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, committed[name]), name
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert tokenizer("<bos>3141=", add_special_tokens=False).input_ids == [BOS, 3, 1, 4, 1, SEP]

    # The exported directory is a policy.path like any other: training starts from it.
    config = load_config(None, [*transformers_overrides(rt, tmp_path / "again"),
                                "policy.config={}", f"policy.path={json.dumps(str(out))}"])
    learner = TorchLearner(config.policy, config.optim, 0, tmp_path / "again" / "commits")
    learner.start()
    start = read_commit(tmp_path / "again" / "commits" / "commit-000000.pt")["model"]
    for name, tensor in committed.items():
        assert torch.equal(tensor, start[name]), name


def test_export_of_an_older_version_and_refusals(asynchronous_run, tmp_path, rt):
    run_dir, _ = asynchronous_run
    assert export.export(run_dir, tmp_path / "two", version=2) == 2  # from the checkpoints
    checkpoint = read_commit(run_dir / "checkpoints" / "commit-000002.pt")["model"]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "two", local_files_only=True)
    assert torch.equal(model.state_dict()["lm_head.weight"], checkpoint["lm_head.weight"])

    refused = invar(rt, "export", str(run_dir), str(tmp_path / "two"))
    assert refused.returncode == 2
    assert "OUT_DIR" in refused.stderr and "not an empty directory" in refused.stderr
    with pytest.raises(export.ExportError, match=r"--version: no commit or checkpoint of "
                                                 r"version 9 in .* \(kept: \[.*, 4\]\)"):
        export.export(run_dir, tmp_path / "nine", version=9)


def test_the_built_in_policy_is_exported_as_the_gpt2_it_is(tmp_path):
    config = load_config(None, [f"output.run_dir={json.dumps(str(tmp_path))}"])
    (tmp_path / "config.json").write_text(json.dumps(to_dict(config)))
    learner = TorchLearner(config.policy, config.optim, 3, tmp_path / "commits")
    learner.start()
    assert export.export(tmp_path, tmp_path / "exported") == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "exported", local_files_only=True)
    assert model.config.model_type == "gpt2"
    tokens = torch.as_tensor(np.concatenate([DigitReversal(8).prompts("train", range(4)),
                                             DigitReversal(8).prompts("train", range(4, 8))],
                                            axis=1))
    torch.testing.assert_close(model(tokens).logits, learner.model(tokens), rtol=0, atol=1e-5)


LEARNING_UPDATES = 40


def test_a_tiny_llama_learns_the_default_task(tmp_path, rt):
    """The default task (reverse 8 digits, 64 prompts x 8 samples, S = 1) with a random-weight
    Llama of the built-in policy's width and depth: reward rises clearly within 40 updates
    (~40 s on a shared 2-core machine; the curve is in reports/hf_learning.md)."""
    config = load_config(None, [
        "policy.kind=\"transformers\"",
        f"policy.config={_toml_table(LEARNING_LLAMA)}",
        f"protocol.total_updates={LEARNING_UPDATES}", "output.progress=false",
        "output.tensorboard=false", f"output.run_dir={json.dumps(str(tmp_path))}"])
    assert run_complete(rt.run_driver(config))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rewards = [row["reward"] for row in rows if row["kind"] == "update"]
    heldout = {row["version"]: row["heldout_reward"] for row in rows
               if row["kind"] == "evaluation"}
    assert len(rewards) == LEARNING_UPDATES
    assert np.mean(rewards[-5:]) > 1.5 * np.mean(rewards[:5])
    assert heldout[LEARNING_UPDATES] > 2 * heldout[0]


def test_gpt2_through_transformers_trains_as_the_built_in_policy_does(tmp_path, rt):
    """The built-in policy's initial weights exported as GPT-2 and trained through the
    transformers path meet the same samples and end with the same weights (to float
    rounding): the adapter adds nothing to what is learned."""
    builtin_dir, hf_dir = tmp_path / "built-in", tmp_path / "transformers"
    builtin = load_config(None, rt.tiny_overrides(builtin_dir))
    rt.run_serial(builtin)
    export.export(builtin_dir, tmp_path / "initial", version=0)
    rt.run_serial(load_config(None, [
        *transformers_overrides(rt, hf_dir), "policy.config={}",
        f"policy.path={json.dumps(str(tmp_path / 'initial'))}"]))

    def rewards(run_dir: Path) -> list[float]:
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [row["reward"] for row in rows if row["kind"] == "update"]

    assert rewards(hf_dir) == rewards(builtin_dir)
    trained = export.builtin_as_gpt2(builtin.policy, rt.final_weights(builtin_dir)["model"])
    through_transformers = rt.final_weights(hf_dir)["model"]
    for name, tensor in trained.state_dict().items():
        torch.testing.assert_close(through_transformers[name], tensor, rtol=0, atol=1e-5)


def test_a_resume_refuses_a_policy_config_key_the_run_did_not_have(asynchronous_run):
    from invar.runtime.cli import resume_config
    run_dir, _ = asynchronous_run
    with pytest.raises(ConfigError) as refused:
        resume_config(str(run_dir), None, ["policy.config.rope_theta=100.0"])
    assert refused.value.fields == ("policy.config.rope_theta",)


# -- JSONL and plug-in tasks in the model's own tokens -----------------------------------------

ADDITION = Path(__file__).parents[2] / "invar" / "runtime" / "data" / "addition.jsonl"
CHAT_TEMPLATE = ("{% for message in messages %}<s>{{ message['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %}</s>{% endif %}")
"""A chat template that frames the user's turn in the tokenizer's special tokens."""


def _text_tokenizer(chat_template: str | None) -> PreTrainedTokenizerFast:
    """One token a character over digits, arithmetic and a few letters (the sums of the
    shipped JSONL file), with PAD, BOS and EOS special tokens."""
    from tokenizers import decoders
    vocabulary = {text: token for token, text in enumerate(
        ["<pad>", "<s>", "</s>", *"0123456789+-=? ", *"abcdefgh"])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocabulary, unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.add_special_tokens(["<pad>", "<s>", "</s>"])
    tokenizer.decoder = decoders.Fuse()
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>",
                                      bos_token="<s>", eos_token="</s>")
    wrapped.chat_template = chat_template
    return wrapped


def jsonl_overrides(rt, run_dir: Path, model_dir: Path, *extra: str) -> list[str]:
    """The tiny run on the shipped addition file, with the model of `model_dir`."""
    return [*transformers_overrides(rt, run_dir), "policy.config={}",
            f"policy.path={json.dumps(str(model_dir))}", "task.name=\"jsonl\"",
            f"task.path={json.dumps(str(ADDITION))}", "task.verifier=\"numeric\"",
            "task.prompt_length=12", "task.response_length=4", *extra]


def test_a_jsonl_task_runs_in_the_model_s_own_tokens_async_equal_to_serial(tmp_path, rt):
    tokenizer = _text_tokenizer(CHAT_TEMPLATE)
    model_dir = _saved_model(tmp_path / "model", tokenizer, vocab_size=len(tokenizer) + 3)
    config = load_config(None, jsonl_overrides(rt, tmp_path / "serial", model_dir))
    raw = worker_args(config, "worker-0")
    assert raw["task"]["tokenizer"] == str(model_dir)  # "auto": the model's own
    assert raw["model"]["symbol_ids"] == []  # no map: the model's whole vocabulary
    worker = RolloutWorker(WorkerArgs(**{**raw, "faults": ()}))
    assert worker.policy.vocab_size == len(tokenizer) + 3
    # The chat template frames "3+4=" (line 3), ended by </s> (the runtime left-pads it).
    framed = tokenizer.encode("<s>3+4=</s>", add_special_tokens=False)
    assert worker.task.prompt(2) == framed

    rt.run_serial(config)
    asynchronous = load_config(None, jsonl_overrides(rt, tmp_path / "async", model_dir,
                                                     "protocol.eval_every=3"))
    assert run_complete(rt.run_driver(asynchronous))
    rows = {name: [json.loads(line) for line in
                   (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
            for name in ("serial", "async")}
    rewards = {name: [row["reward"] for row in found if row["kind"] == "update"]
               for name, found in rows.items()}
    assert len(rewards["async"]) == 3 and rewards["async"] == rewards["serial"]
    assert any(row["kind"] == "evaluation" for row in rows["async"])
    rt.assert_same_weights(rt.final_weights(tmp_path / "serial"),
                           rt.final_weights(tmp_path / "async"))
    # Exported with the model directory's tokenizer, chat template included.
    export.export(tmp_path / "async", tmp_path / "exported")
    exported = AutoTokenizer.from_pretrained(tmp_path / "exported", local_files_only=True)
    assert exported.chat_template == CHAT_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "exported", local_files_only=True)
    assert model.config.vocab_size == len(tokenizer) + 3


def test_without_a_chat_template_the_prompt_is_its_own_text(tmp_path, rt):
    tokenizer = _text_tokenizer(None)
    model_dir = _saved_model(tmp_path / "model", tokenizer, vocab_size=len(tokenizer))
    config = load_config(None, jsonl_overrides(rt, tmp_path / "run", model_dir))
    task = RolloutWorker(WorkerArgs(**{**worker_args(config, "worker-0"), "faults": ()})).task
    plain = tokenizer.encode("3+4=", add_special_tokens=False)
    assert task.prompt(2) == plain
    seven, eos, pad = tokenizer.convert_tokens_to_ids(["7", "</s>", "<pad>"])
    assert task.score("train", 2, [seven, eos, seven, pad]) == 1.0  # read up to EOS
    assert task.score("train", 2, [seven, seven, pad, pad]) == 0.0


def test_a_model_built_from_a_config_reads_a_jsonl_task_in_bytes(tmp_path, rt):
    jsonl = ["task.name=\"jsonl\"", f"task.path={json.dumps(str(ADDITION))}",
             "task.prompt_length=8", "task.response_length=4"]
    config = load_config(None, transformers_overrides(rt, tmp_path, *jsonl))
    assert worker_args(config, "worker-0")["model"]["config"]["vocab_size"] == 258


@pytest.mark.parametrize("extra, fields", [
    (["policy.config.vocab_size=200"], ("policy.config.vocab_size",)),
    (["task.tokenizer=\"model\""], ("task.tokenizer",)),
    (["policy.config.max_position_embeddings=10"],
     ("policy.config.max_position_embeddings", "task.prompt_length", "task.response_length")),
], ids=["bytes beyond the vocabulary", "no tokenizer directory", "positions"])
def test_a_jsonl_task_a_model_cannot_serve_is_refused_naming_the_key(tmp_path, rt, extra,
                                                                    fields):
    jsonl = ["task.name=\"jsonl\"", f"task.path={json.dumps(str(ADDITION))}",
             "task.prompt_length=8", "task.response_length=4"]
    with pytest.raises(ConfigError) as refused:
        load_config(None, transformers_overrides(rt, tmp_path, *jsonl, *extra))
    assert refused.value.fields == fields


def test_a_model_directory_whose_vocabulary_is_smaller_than_its_tokenizer_is_refused(tmp_path,
                                                                                     rt):
    tokenizer = _text_tokenizer(None)
    model_dir = _saved_model(tmp_path / "model", tokenizer, vocab_size=len(tokenizer) - 1)
    with pytest.raises(ConfigError) as refused:
        load_config(None, jsonl_overrides(rt, tmp_path / "run", model_dir))
    assert refused.value.fields == ("policy.path",)
    assert "cannot hold the task's token ids 0..25" in refused.value.reason


def test_the_readme_s_model_directory_and_jsonl_example_is_a_configuration(tmp_path):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    example = readme.split("```toml\n# my-lm.toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "my-lm.toml").write_text(example)
    config = load_config(tmp_path / "my-lm.toml", validate=False)  # no model here to check
    assert (config.policy.kind, config.task.name, config.task.tokenizer) == \
        ("transformers", "jsonl", "auto")


def test_a_plugin_task_speaks_the_model_s_own_ids(tmp_path, rt):
    example = Path(__file__).parents[2] / "examples" / "parity_task.py"
    config = load_config(None, transformers_overrides(
        rt, tmp_path, "task.name=\"module\"", f"task.module={json.dumps(f'{example}:make_task')}"))
    model = worker_args(config, "worker-0")["model"]
    assert model["symbol_ids"] == [] and model["config"]["vocab_size"] == 3  # the task's


def test_a_named_tokenizer_directory_sizes_a_config_s_vocabulary_and_needs_an_eos(tmp_path, rt):
    tokenizer = _text_tokenizer(CHAT_TEMPLATE)
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    jsonl = ["task.name=\"jsonl\"", f"task.path={json.dumps(str(ADDITION))}",
             "task.prompt_length=12", "task.response_length=4",
             f"task.tokenizer={json.dumps(str(tmp_path / 'tokenizer'))}"]
    config = load_config(None, transformers_overrides(rt, tmp_path / "run", *jsonl))
    assert worker_args(config, "worker-0")["model"]["config"]["vocab_size"] == len(tokenizer)
    tokenizer.eos_token = None
    tokenizer.save_pretrained(tmp_path / "no-eos")
    jsonl[-1] = f"task.tokenizer={json.dumps(str(tmp_path / 'no-eos'))}"
    with pytest.raises(ConfigError) as refused:
        load_config(None, transformers_overrides(rt, tmp_path / "run", *jsonl))
    assert refused.value.fields == ("task.tokenizer",) and "no EOS token" in refused.value.reason
