"""`invar-check --model MODULE:FACTORY`: any model from the command line."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import networkx as nx
import pytest

from checker.cli import UsageError, main, parse_model_args

READABLE = "checker.examples.two_phase_readable:TwoPhaseReadable"


def test_the_readable_2pc_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    assert main(["--model", READABLE, "--arg", "rms=3", "--quiet", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert (doc["distinct_states"], doc["states_generated"], doc["max_depth"]) == (288, 1146, 10)
    assert doc["model"] == {"factory": READABLE, "args": {"rms": 3}}
    assert set(doc["properties"].values()) == {"holds"} and doc["counterexamples"] == {}
    assert doc["fingerprints"] == "fast" and 0 < doc["collision_probability"] < 1e-12
    text = capsys.readouterr().out
    assert "288 distinct" in text and "calculated (optimistic)" in text


def test_a_violation_exits_1_with_its_trace_in_the_json(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code = main(
        ["--model", READABLE, "--arg", "rms=3", "--arg", "buggy=true", "--quiet",
         "--json", str(out)]
    )
    assert code == 1
    trace = json.loads(out.read_text())["counterexamples"]["consistent"]
    assert [s["action"] for s in trace["steps"]] == [
        None,
        "TMCommit",
        "RMChooseToAbort(0)",
        "RMRcvCommitMsg(1)",
    ]
    assert trace["steps"][-1]["state"]["rm_state"] == ["aborted", "committed", "working"]


def test_search_options_apply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", READABLE, "--arg", "rms=3", "--dfs", "--quiet"]) == 0
    assert "dfs (1 process): 1,146 states generated, 288 distinct" in capsys.readouterr().out
    # bounded: the agreement that needs the whole depth is not reached, which is inconclusive
    assert main(["--model", READABLE, "--arg", "rms=3", "--max-depth", "4", "--quiet"]) == 0
    assert "(inconclusive): commit agreement" in capsys.readouterr().out
    assert main(["--model", READABLE, "--arg", "rms=3", "--arg", "buggy=true", "--simulate", "200",
                 "--max-depth", "12", "--seed", "3", "--quiet"]) == 1
    assert "simulate (1 process)" in capsys.readouterr().out
    assert main(["--model", READABLE, "--arg", "rms=4", "--processes", "2", "--quiet"]) == 0
    assert "bfs (2 processes): 8,258 states generated, 1,568 distinct" in capsys.readouterr().out
    assert main(["--model", READABLE, "--arg", "rms=3", "--fingerprints", "stable", "--quiet"]) == 0
    assert "fingerprints: stable" in capsys.readouterr().out
    dot, graphml = tmp_path / "g.dot", tmp_path / "g.graphml"
    args = ["--model", READABLE, "--arg", "rms=2", "--quiet",
            "--dot", str(dot), "--graphml", str(graphml)]
    assert main([*args, "--processes", "2"]) == 0
    text = capsys.readouterr().out
    assert "one process, not 2: the recorded graph is held whole" in text
    assert "bfs (1 process)" in text
    assert dot.read_text().startswith("digraph states {")
    assert nx.read_graphml(graphml).number_of_nodes() == 56


USER_MODEL = '''
    from checker import BaseModel, Property

    class Clock(BaseModel):
        """An hour hand that ticks; a user's model, in a file of its own."""

        def __init__(self, hours=12, stuck_at=None):
            self.hours, self.stuck_at = hours, stuck_at

        def init_states(self):
            return [0]

        def actions(self, h):
            return [] if h == self.stuck_at else ["tick"]

        def next_state(self, h, a):
            return (h + 1) % self.hours

        def properties(self):
            return [Property.sometimes("midnight again", lambda h: h == self.hours - 1)]

    def make(hours, stuck_at=None):
        return Clock(hours, stuck_at)

    NOT_A_FACTORY = 3
'''


def test_a_users_own_model_in_the_current_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "my_clock.py").write_text(textwrap.dedent(USER_MODEL))
    monkeypatch.chdir(tmp_path)
    assert main(["--model", "my_clock:make", "--arg", "hours=24", "--quiet"]) == 0
    assert "24 distinct" in capsys.readouterr().out
    assert (
        main(["--model", "my_clock:Clock", "--arg", "hours=5", "--arg", "stuck_at=2", "--quiet"])
        == 1
    )
    assert "deadlock" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "checker.examples"], "expected MODULE:FACTORY"),
        (["--model", "no_such_module_here:X"], "cannot import 'no_such_module_here'"),
        (["--model", "checker.examples:Nope"], "has no 'Nope'"),
        (["--model", "checker.examples.two_phase_readable:COMMIT"], "'COMMIT' is not callable"),
        (["--model", "checker.examples.two_phase_readable:Message", "--arg", "type=Commit"],
         "returned Message, not a model"),
        (["--model", READABLE, "--arg", "rms"], "expected NAME=VALUE"),
        (["--model", READABLE, "--arg", "rms=3", "--arg", "rms=4"], "rms given twice"),
        (["--model", READABLE, "--arg", "colour=3"], "unexpected keyword argument 'colour'"),
        (["--model", READABLE, "spec/gate"], "SPEC apply to the Invar model"),
        (["--model", READABLE, "--regression", "x.py"], "--regression apply to the Invar model"),
        (["--model", READABLE, "--no-livelock"], "--no-livelock apply to the Invar model"),
        (["--arg", "rms=3"], "--arg goes with --model"),
        (["--model", READABLE, "--fingerprints", "fast", "--checkpoint", "c.ckpt"],
         "need fingerprints='stable'"),
    ],
)
def test_bad_input_exits_2_saying_what_is_wrong(argv: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--quiet"]) == 2
    assert message in capsys.readouterr().err


def test_arguments_are_json_when_they_parse_else_strings() -> None:
    assert parse_model_args(
        ["n=7", "on=true", "x=1.5", "xs=[1, 2]", "s=\"7\"", "name=alice", "empty="]
    ) == {"n": 7, "on": True, "x": 1.5, "xs": [1, 2], "s": "7", "name": "alice", "empty": ""}
    with pytest.raises(UsageError):
        parse_model_args(["1x=2"])
