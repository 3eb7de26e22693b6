"""The MLX backend against the torch one: converted weights, gradients, sampler, CLI, runs.

Shared learner behaviour is in test_backend_conformance.py; this module checks what is MLX's
own. MLX on a Linux CPU is far slower than torch, so every batch here is a few rows.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import torch

pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'mlx[cpu]')")

import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten, tree_unflatten  # noqa: E402

from invar.runtime import sampler as torch_sampler  # noqa: E402
from invar.runtime.commits import CommitError  # noqa: E402
from invar.runtime.mlx_learner import MLXLearner  # noqa: E402
from invar.runtime.mlx_policy import MLXPolicy, to_torch_state_dict  # noqa: E402
from invar.runtime.mlx_sampler import generate, sampling_logprobs  # noqa: E402
from invar.runtime.policy import Policy, PolicyConfig  # noqa: E402
from invar.runtime.task import DigitReversal  # noqa: E402
from invar.runtime.torch_learner import OptimConfig, TorchLearner  # noqa: E402
from invar.runtime.weights import weights_digest  # noqa: E402

pytestmark = pytest.mark.usefixtures("few_threads")

TASK = DigitReversal(8)  # the default task and policy shape
CONFIG = PolicyConfig()
START = TASK.prompt_length

GRADIENT_RTOL = 1e-5
"""Cross-backend gradient tolerance, relative to each tensor's largest entry. Measured: at
most 5.4e-7 absolute and 1.8e-6 relative (float32 networks; the frameworks sum in different
orders)."""


def batch(rows, seed):
    prompts = TASK.prompts("train", range(seed * 100, seed * 100 + rows))
    responses = np.random.default_rng(seed).integers(0, 10, size=(rows, TASK.response_length))
    return np.concatenate([prompts, responses], axis=1)


# -- weights -----------------------------------------------------------------------------------


@pytest.mark.parametrize("tie_head", [False, True])
def test_weights_convert_both_ways_bit_for_bit(tie_head):
    config = PolicyConfig(max_len=TASK.sequence_length, tie_head=tie_head)
    torch_policy = Policy(config, seed=3)
    mlx_policy = MLXPolicy.initial(config, seed=3)
    back = to_torch_state_dict(mlx_policy)
    assert back.keys() == torch_policy.state_dict().keys()
    for name, tensor in torch_policy.state_dict().items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
    assert weights_digest(back) == weights_digest(torch_policy.state_dict())
    tokens = batch(4, 0)
    expected = torch_policy(torch.as_tensor(tokens)).detach().numpy()
    np.testing.assert_allclose(np.array(mlx_policy(mx.array(tokens))), expected, atol=2e-6)


def test_conversion_refuses_mismatched_state_dicts():
    policy = MLXPolicy(CONFIG)
    state = Policy(CONFIG, seed=0).state_dict()
    with pytest.raises(ValueError, match="missing.*head.weight"):
        policy.load_torch_state_dict({k: v for k, v in state.items() if k != "head.weight"})
    with pytest.raises(ValueError, match="unexpected.*extra"):
        policy.load_torch_state_dict({**state, "extra": torch.zeros(1)})
    with pytest.raises(ValueError, match="head.weight: shape"):
        policy.load_torch_state_dict({**state, "head.weight": torch.zeros(3, 3)})


# -- gradients and the optimizer, across backends ----------------------------------------------


def test_same_weights_batch_and_cotangent_give_the_same_gradients(tmp_path):
    torch_learner = TorchLearner(CONFIG, OptimConfig(grad_clip=0.0), 0, tmp_path / "torch")
    mlx_learner = MLXLearner(CONFIG, OptimConfig(grad_clip=0.0), 0, tmp_path / "mlx")
    torch_learner.start()
    mlx_learner.start()
    assert weights_digest(mlx_learner.torch_state_dict()) == \
        weights_digest(torch_learner.model.state_dict())  # the same starting point
    sequences = batch(16, 1)
    cotangent = np.random.default_rng(1).normal(size=(16, TASK.response_length)) / 16

    torch_gradients, mlx_gradients = {}, {}
    torch_learner.optimizer.step = lambda: torch_gradients.update(
        {n: p.grad.numpy().copy() for n, p in torch_learner.model.named_parameters()})
    mlx_learner._apply_gradients = lambda gradients: mlx_gradients.update(
        {n: np.array(g) for n, g in tree_flatten(gradients)})
    digest, torch_logprobs = torch_learner.forward(0, 0, 0, sequences, START)
    torch_learner.apply_cotangent(0, 0, 0, digest, cotangent)
    digest, mlx_logprobs = mlx_learner.forward(0, 0, 0, sequences, START)
    mlx_learner.apply_cotangent(0, 0, 0, digest, cotangent)

    np.testing.assert_allclose(mlx_logprobs, torch_logprobs, atol=1e-6)
    assert mlx_gradients.keys() == torch_gradients.keys()
    worst_abs = worst_rel = 0.0
    for name, expected in torch_gradients.items():
        scale = np.abs(expected).max()
        difference = np.abs(mlx_gradients[name] - expected).max()
        worst_abs, worst_rel = max(worst_abs, difference), max(worst_rel, difference / scale)
        assert difference <= GRADIENT_RTOL * scale, (name, difference, scale)
    print(f"cross-backend gradients: max abs diff {worst_abs:.2e}, "
          f"max diff relative to the tensor's largest entry {worst_rel:.2e}")


def test_the_optimizer_step_is_torchs_adamw(tmp_path):
    """The same gradients through both optimizers (bias-corrected AdamW, clipping, decay)."""
    optim = OptimConfig(lr=1e-2, weight_decay=0.1, grad_clip=0.5)
    torch_learner = TorchLearner(CONFIG, optim, 0, tmp_path / "torch")
    mlx_learner = MLXLearner(CONFIG, optim, 0, tmp_path / "mlx")
    rng = np.random.default_rng(0)
    for _ in range(3):
        gradients = {n: rng.normal(size=p.shape).astype(np.float32)
                     for n, p in torch_learner.model.named_parameters()}
        for name, parameter in torch_learner.model.named_parameters():
            parameter.grad = torch.from_numpy(gradients[name].copy())
        torch.nn.utils.clip_grad_norm_(torch_learner.model.parameters(), optim.grad_clip)
        torch_learner.optimizer.step()
        from invar.runtime.mlx_learner import clip_grad_norm
        tree = tree_unflatten([(n, mx.array(g)) for n, g in gradients.items()])
        mlx_learner._apply_gradients(clip_grad_norm(tree, optim.grad_clip))
    for name, value in mlx_learner.model.numpy_parameters().items():
        expected = torch_learner.model.state_dict()[name].numpy()
        np.testing.assert_allclose(value, expected, atol=1e-6, err_msg=name)


def test_a_torch_commit_is_refused_by_the_mlx_learner(tmp_path):
    TorchLearner(CONFIG, OptimConfig(), 0, tmp_path).start()
    with pytest.raises(CommitError, match="written by the torch backend"):
        MLXLearner(CONFIG, OptimConfig(), 0, tmp_path).start()


# -- the sampler -------------------------------------------------------------------------------


def reference_logprobs(logits, temperature, top_k, top_p):
    """Numpy float64 log-softmax of the truncated distribution, written independently."""
    z = logits.astype(np.float64) / temperature
    z = z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(
        -1, keepdims=True)
    keep = np.ones_like(z, dtype=bool)
    if 0 < top_k < z.shape[-1]:
        keep &= z >= np.sort(z, axis=-1)[:, -top_k][:, None]
    if top_p < 1:
        for row in range(len(z)):
            kept = np.where(keep[row], z[row], -np.inf)
            order = np.argsort(-kept, kind="stable")
            probs = np.exp(kept[order] - np.log(np.exp(kept[order]).sum()))
            before = np.cumsum(probs) - probs
            least = kept[order][before < top_p].min()
            keep[row] &= z[row] >= least
    z = np.where(keep, z, -np.inf)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


SAMPLINGS = [dict(), dict(temperature=0.7, top_k=4), dict(top_p=0.8),
             dict(temperature=1.5, top_k=6, top_p=0.6)]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=str)
def test_sampler_records_the_logprobs_of_the_truncated_distribution(sampling):
    policy = MLXPolicy.initial(CONFIG, seed=1)
    prompts = TASK.prompts("train", range(6))
    seeds = list(range(100, 106))
    tokens, logprobs = generate(policy, prompts, TASK.response_length, seeds, **sampling)
    assert tokens.dtype == np.int64 and logprobs.dtype == np.float64
    # The KV cache changes nothing: recomputing every prefix draws the same tokens.
    no_cache_tokens, no_cache_logprobs = generate(policy, prompts, TASK.response_length, seeds,
                                                  use_cache=False, **sampling)
    np.testing.assert_array_equal(no_cache_tokens, tokens)
    np.testing.assert_allclose(no_cache_logprobs, logprobs, atol=1e-6)
    # Each recorded log-prob is the sampled token's entry of the truncated distribution.
    sequences = np.concatenate([prompts, tokens], axis=1)
    logits = np.array(policy(mx.array(sequences[:, :-1])))[:, START - 1:]
    noise = torch_sampler.gumbel_noise(seeds, TASK.response_length, CONFIG.vocab_size).numpy()
    for position in range(TASK.response_length):
        expected = reference_logprobs(logits[:, position], **{
            "temperature": 1.0, "top_k": 0, "top_p": 1.0, **sampling})
        chosen = tokens[:, position]
        assert np.isfinite(expected[np.arange(6), chosen]).all()  # inside the support
        np.testing.assert_allclose(logprobs[:, position], expected[np.arange(6), chosen],
                                   atol=2e-6)
        np.testing.assert_array_equal(chosen, np.argmax(expected + noise[:, position], axis=-1))
    # The sampling distribution itself, against the torch sampler's.
    last = logits[:, -1]
    np.testing.assert_allclose(np.array(sampling_logprobs(mx.array(last), **sampling)),
                               torch_sampler.sampling_logprobs(torch.as_tensor(last),
                                                               **sampling).numpy(), atol=1e-6)


def test_sampler_draws_the_torch_samplers_tokens_from_equal_weights():
    torch_policy = Policy(CONFIG, seed=2)
    mlx_policy = MLXPolicy.initial(CONFIG, seed=2)
    prompts = TASK.prompts("train", range(16))
    seeds = list(range(16))
    torch_tokens, torch_logprobs = torch_sampler.generate(
        torch_policy, torch.as_tensor(prompts), TASK.response_length, seeds)
    tokens, logprobs = generate(mlx_policy, prompts, TASK.response_length, seeds)
    np.testing.assert_array_equal(tokens, torch_tokens.numpy())
    np.testing.assert_allclose(logprobs, torch_logprobs.numpy(), atol=1e-5)
    # A row's draw depends on its seed alone, not on the rest of the batch.
    alone, _ = generate(mlx_policy, prompts[5:6], TASK.response_length, seeds[5:6])
    np.testing.assert_array_equal(alone[0], tokens[5])
    greedy, zeros = generate(mlx_policy, prompts, TASK.response_length, greedy=True)
    np.testing.assert_array_equal(zeros, 0.0)
    with pytest.raises(ValueError, match="one seed per prompt row"):
        generate(mlx_policy, prompts, TASK.response_length, seeds[:3])


def test_an_mlx_worker_samples_what_the_learner_scores(tmp_path):
    from invar.model.messages import Completion, LaunchRequest, LoadWeights
    from invar.model.schedule import RequestId
    from invar.runtime.config import reverse_task
    from invar.runtime.worker import RolloutWorker, WorkerArgs

    learner = MLXLearner(CONFIG, OptimConfig(), 0, tmp_path)
    learner.start()
    blob, params_digest, _ = learner.published_weights(0)
    args = WorkerArgs(name="w", task=reverse_task(TASK.length), policy=vars(CONFIG).copy(),
                      prompts_per_batch=2, group_size=2, chunk_prompts=2, backend="mlx")
    worker = RolloutWorker(args)
    assert isinstance(worker.policy, MLXPolicy)
    worker.load(LoadWeights("w", 0, 0, 0, params_digest), blob, params_digest)
    launches = [LaunchRequest("w", 0, RequestId(0, prompt, sample), 0, 7 + 2 * prompt + sample,
                              prompt) for prompt in range(2) for sample in range(2)]
    events = worker.launch(launches)
    assert all(isinstance(event, Completion) for event in events)
    assert [event.request for event in events] == [launch.request for launch in launches]
    sequences = np.array([TASK.prompt(launch.prompt_index) + list(event.tokens)
                          for event, launch in zip(events, launches)])
    proximal, _ = learner.score(sequences, START, need_reference=False)
    np.testing.assert_allclose(np.array([event.behavior_logprobs for event in events]),
                               proximal, atol=1e-5)


# -- the command line and whole runs -----------------------------------------------------------


def test_mlx_with_staleness_is_refused_before_anything_runs(tmp_path, rt):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        rt.cli("train", "--set", "learner.backend=mlx", "--set", "protocol.max_staleness=1",
               "--set", f"output.run_dir={json.dumps(str(run_dir))}"),
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "learner.backend, protocol.max_staleness" in result.stderr
    assert "synchronously" in result.stderr and "max_staleness = 0" in result.stderr
    assert not run_dir.exists()  # nothing ran, nothing was written

    from invar.runtime.cli import main
    assert main(["train", "--backend", "mlx",
                 "--set", f"output.run_dir={json.dumps(str(run_dir))}"]) == 2
    assert not run_dir.exists()


def test_a_run_cannot_change_its_backend_on_resume(tmp_path, rt, capsys):
    from helpers.journals import write_journal
    from invar.runtime.binding import bound_settings
    from invar.runtime.cli import main
    from invar.runtime.config import to_dict
    config = rt.tiny_config(tmp_path, *MLX_TINY)
    (tmp_path / "config.json").write_text(json.dumps(to_dict(config)))
    journal = write_journal(tmp_path / "journal.jsonl", config.protocol, bound_settings(config))
    written = journal.read_bytes()
    assert main(["train", "--resume", str(tmp_path), "--backend", "torch"]) == 2
    assert "resume refused: learner.backend:" in (err := capsys.readouterr().err)
    assert 'learner.backend "mlx" -> "torch"' in err
    assert journal.read_bytes() == written  # nothing ran


MLX_TINY = ('learner.backend="mlx"', "protocol.max_staleness=0",
            "protocol.max_inflight_batches=1", "protocol.total_updates=2")


def test_a_tiny_serial_mlx_run_completes(tmp_path, rt):
    from invar.runtime.worker_args import worker_args
    config = rt.tiny_config(tmp_path, *MLX_TINY, "protocol.eval_every=2")
    assert worker_args(config, "worker-0")["backend"] == "mlx"
    state = rt.run_serial(config)
    assert state.committed == 2
    assert rt.final_weights(tmp_path)["version"] == 2
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["version"] for row in rows if row["kind"] == "evaluation"] == [0, 2]


def test_a_tiny_mlx_run_with_worker_processes_completes(tmp_path, rt):
    config = rt.tiny_config(tmp_path, *MLX_TINY)
    state = rt.run_driver(config)
    assert state.committed == 2
    summary = rt.summary(tmp_path)
    assert summary["updates"] == 2 and summary["refused"] == 0
    assert summary["worker_deaths"] == 0


@pytest.mark.parametrize("options", [dict(compile=True), dict(streams=2), dict(fast=False)],
                         ids=["compile", "two streams", "stock layers"])
def test_learner_variants_agree_with_the_default(tmp_path, options):
    """`mx.compile`, work split over CPU streams and MLX's stock layers change the speed, and
    the float rounding, but not the result."""
    sequences = batch(6, 2)
    cotangent = np.random.default_rng(2).normal(size=(6, TASK.response_length))
    results = []
    for name, kwargs in (("default", {}), ("variant", options), ("again", options)):
        learner = MLXLearner(CONFIG, OptimConfig(), 0, tmp_path / name, **kwargs)
        learner.start()
        for update in range(2):
            digest, logprobs = learner.forward(update, 0, update, sequences, START)
            learner.apply_cotangent(update, 0, update, digest, cotangent)
        results.append((logprobs, learner.model.numpy_parameters(), learner.state_digest()))
    (default, default_weights, _), (variant, weights, digest), (_, _, again) = results
    assert digest == again  # each variant is itself deterministic
    np.testing.assert_allclose(variant, default, atol=1e-5)
    for name, value in weights.items():
        np.testing.assert_allclose(value, default_weights[name], atol=1e-5, err_msg=name)
