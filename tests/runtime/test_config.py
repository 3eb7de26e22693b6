"""The training configuration: every key checked before anything runs, the dotted key named."""

from __future__ import annotations

import json
import subprocess

import pytest

from invar.model.errors import ConfigError
from invar.runtime.cli import _flatten
from invar.runtime.config import TrainConfig, load_config, to_dict


def refused(*overrides: str, path=None) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_config(path, list(overrides))
    return caught.value


def test_defaults_are_valid():
    config = load_config(None, [])
    assert config == TrainConfig().validate()


@pytest.mark.parametrize("key", ["protocol.foo", "foo", "rollout.worker", "protocol.objective.x"])
def test_unknown_key_is_refused_naming_the_dotted_key(key):
    error = refused(f"{key}=1")
    assert error.fields == (key,)
    assert key in str(error)


@pytest.mark.parametrize("item, key", [
    ("protocol.group_size=\"four\"", "protocol.group_size"),
    ("protocol.group_size=2.5", "protocol.group_size"),
    ("protocol.group_size=true", "protocol.group_size"),
    ("output.progress=1", "output.progress"),
    ("optim.lr=\"fast\"", "optim.lr"),
    ("optim.betas=[0.9]", "optim.betas"),
    ("rollout.faults=\"exit_after:3\"", "rollout.faults"),
    ("task.length=[1]", "task.length"),
    ("protocol=3", "protocol"),
])
def test_ill_typed_value_is_refused(item, key):
    error = refused(item)
    assert error.fields[0].startswith(key)
    assert key in str(error)


def test_override_must_be_key_equals_value():
    assert "key.path=value" in str(refused("protocol.group_size"))


@pytest.mark.parametrize("overrides, fields", [
    (["protocol.max_staleness=0", "protocol.sync_period=2"],
     {"protocol.sync_period", "protocol.max_staleness"}),
    (["protocol.prompts_per_batch=1", "protocol.group_size=2", "protocol.optimizer_steps=3"],
     {"protocol.optimizer_steps", "protocol.prompts_per_batch", "protocol.group_size"}),
    (["protocol.total_updates=0"], {"protocol.total_updates"}),
    (["protocol.objective.clip_low=1.5"], {"protocol.objective.clip_low"}),
])
def test_impossible_protocol_is_refused_with_prefixed_fields(overrides, fields):
    error = refused(*overrides)
    assert set(error.fields) == fields


@pytest.mark.parametrize("overrides, field", [
    (["task.length=40"], "policy.max_len"),
    (["sampling.top_p=0"], "sampling.top_p"),
    (["rollout.transport=\"ssh\"", "rollout.workers=2"], "rollout.hosts"),
    (["rollout.faults=[\"explode\"]"], "rollout.faults[0]"),
    (["rollout.faults=[\"exit_after:x\"]"], "rollout.faults[0]"),
    (["rollout.faults=[\"worker-3:exit_after:2\"]", "rollout.workers=2"], "rollout.faults[0]"),
])
def test_impossible_runtime_combination_is_refused(overrides, field):
    assert field in refused(*overrides).fields


def test_targeted_fault_is_accepted():
    config = load_config(None, ["rollout.workers=2", "rollout.faults=[\"worker-1:exit_after:5\"]"])
    assert config.rollout.faults == ("worker-1:exit_after:5",)


def test_mlx_with_staleness_is_refused_saying_why():
    error = refused("learner.backend=\"mlx\"", "protocol.max_staleness=1")
    assert "protocol.max_staleness" in error.fields and "learner.backend" in error.fields
    assert "synchronous" in error.reason and "max_staleness = 0" in error.reason
    config = load_config(None, ["learner.backend=\"mlx\"", "protocol.max_staleness=0"])
    assert config.learner.backend == "mlx"


def test_toml_file_then_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[protocol]\ngroup_size = 2\noptimizer_steps = 2\n\n'
                    '[protocol.objective]\nkl_coef = 0.1\n\n'
                    '[rollout]\nworkers = 3\nfaults = ["garbage_frame_once"]\n')
    config = load_config(path, ["protocol.group_size=5", "output.run_dir=/tmp/somewhere"])
    assert config.protocol.group_size == 5          # --set wins over the file
    assert config.protocol.optimizer_steps == 2     # the file wins over the defaults
    assert config.protocol.objective.kl_coef == 0.1
    assert config.rollout.workers == 3 and config.rollout.faults == ("garbage_frame_once",)
    # Keys the file leaves out keep the *training* defaults, not RunConfig's class defaults.
    assert config.protocol.total_updates == TrainConfig().protocol.total_updates
    assert config.output.run_dir == "/tmp/somewhere"  # a bare word is a string


def test_bad_toml_file_is_refused(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[protocol\n")
    assert str(path) in refused(path=path).fields
    path.write_text("[protocol]\nfoo = 1\n")
    assert refused(path=path).fields == ("protocol.foo",)


def test_saved_config_round_trips_through_overrides():
    """What `--resume` does with config.json: flatten to --set items and load them again."""
    config = load_config(None, ["optim.eps=1e-08", "rollout.faults=[\"garbage_frame_once\"]",
                                "output.run_dir=\"runs/a b\""])
    saved = json.loads(json.dumps(to_dict(config)))
    assert load_config(None, _flatten(saved)) == config


def test_cli_refuses_unknown_key_with_exit_status_2(rt):
    done = subprocess.run(rt.cli("train", "--set", "protocol.foo=1"), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert "protocol.foo" in done.stderr
    assert "Traceback" not in done.stderr
