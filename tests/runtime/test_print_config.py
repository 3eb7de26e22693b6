"""`invar train --print-config`: the resolved configuration as TOML that reads back to the
same configuration; `--help` says where the keys are documented."""

from __future__ import annotations

import math
import signal
import tomllib

import pytest

from invar.runtime import cli
from invar.runtime.cli import config_toml, main
from invar.runtime.config import load_config


def test_the_printed_configuration_reads_back_to_the_same(tmp_path, capsys):
    run_dir = tmp_path / "run"
    overrides = ["optim.lr=3e-4", "protocol.max_staleness=2", "rollout.frame_faults.drop=0.1",
                 'rollout.cpus=[0]', f'output.run_dir="{run_dir}"', "task.length=6",
                 'output.wandb_project="a \\"quoted\\" name"']
    assert main(["train", "--print-config", *(a for o in overrides for a in ("--set", o))]) == 0
    printed = capsys.readouterr().out
    saved = tmp_path / "printed.toml"
    saved.write_text(printed)
    assert load_config(saved) == load_config(None, overrides)
    assert load_config(saved) != load_config(None)
    assert not run_dir.exists()  # printed, nothing run or written
    assert "invar/runtime/config.py" in printed.splitlines()[0]


def test_the_defaults_read_back_to_the_defaults(tmp_path, capsys):
    assert main(["train", "--print-config"]) == 0
    saved = tmp_path / "defaults.toml"
    saved.write_text(capsys.readouterr().out)
    assert load_config(saved) == load_config(None)


def _printed(capsys, *overrides: str) -> dict:
    assert main(["train", "--print-config", *(a for o in overrides for a in ("--set", o))]) == 0
    printed = capsys.readouterr().out
    assert tomllib.loads(printed) == cli.read_keys(load_config(None, list(overrides)))
    return tomllib.loads(printed)


def test_only_the_keys_the_configuration_reads_are_printed(tmp_path, capsys):
    """The arithmetic task reads no verifier nor file; the built-in policy no path."""
    overrides = ['task.name="arithmetic"', "policy.vocab_size=258", "policy.max_len=96"]
    printed = _printed(capsys, *overrides)
    assert "verifier" not in printed["task"] and "path" not in printed["task"]
    assert "module" not in printed["task"] and printed["task"]["operand_max"] == 19
    assert "path" not in printed["policy"] and printed["policy"]["vocab_size"] == 258
    saved = tmp_path / "printed.toml"
    saved.write_text(config_toml(printed))
    assert load_config(saved) == load_config(None, overrides)


def test_a_transformers_policy_is_printed_without_the_built_in_policy_s_shape(tmp_path,
                                                                               capsys):
    pytest.importorskip("transformers")
    overrides = ['policy.kind="transformers"',
                 'policy.config={model_type = "gpt2", n_embd = 32, n_layer = 1, n_head = 2, '
                 'n_positions = 32}']
    printed = _printed(capsys, *overrides)
    assert not {"vocab_size", "layers", "width", "heads", "mlp_ratio", "max_len",
                "tie_head"} & set(printed["policy"])
    assert printed["policy"]["config"]["n_layer"] == 1 and printed["task"]["length"] == 8
    saved = tmp_path / "printed.toml"
    saved.write_text(config_toml(printed))
    assert load_config(saved) == load_config(None, overrides)


def test_every_value_kind_survives_toml():
    data = {
        "section": {"text": 'quotes " and \\ and\nnew line, tab\t, DEL \x7f, é, ∑',
                    "whole": -3, "real": 1e-08, "big": 1e16, "flag": False,
                    "infinite": math.inf, "list": [1, 2.5, "x", [True]],
                    "inline": [{"a": 1, "b c": "d"}],
                    "empty": {}, "nested": {"deeper": {"k": 1}},
                    "odd key.with dot": 1}}
    assert tomllib.loads(config_toml(data)) == data


def test_help_says_where_the_keys_are_documented(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "invar/runtime/config.py" in shown and "--print-config" in shown


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_configuration_is_checked_ends_in_one_line(signum, monkeypatch,
                                                                      capsys):
    def interrupted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        signal.raise_signal(signum)

    monkeypatch.setattr(cli, "load_config", interrupted)
    assert cli.main(["train"]) == 128 + signum
    assert capsys.readouterr().err == ("invar: interrupted while checking the configuration; "
                                       "nothing was written\n")
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handlers are put back
