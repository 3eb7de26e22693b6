"""checker/examples/TwoPhase.tla and the readable model that claims to mirror it agree.

TLC is not run here (it is not installed in CI; benchmarks/bench_tlc.py runs it): these tests
read the TLA+ text and hold the Python model to it -- the same variables, the same actions in
`TPNext`'s order, each taking an RM exactly when the spec's does, the invariant the cfg checks
being the model's one `always` property, and the spec's type invariant on every reachable state.
"""

from __future__ import annotations

import re
from pathlib import Path

from checker.examples import TwoPhaseReadable
from checker.examples.two_phase_readable import Message, TwoPhaseState
from checker.model import PropertyKind, reachable_states

EXAMPLES = Path(__file__).resolve().parents[2] / "checker" / "examples"
SPEC = (EXAMPLES / "TwoPhase.tla").read_text()
CFG = (EXAMPLES / "TwoPhase.cfg").read_text()


def _definition(name: str) -> str:
    """The body of the top-level definition `name` (up to the next one)."""
    match = re.search(rf"^{name}\b.*?==(.*?)(?=^\w[\w(), ]*==|^-{{4,}}|^={{4,}})", SPEC,
                      re.MULTILINE | re.DOTALL)
    assert match, f"TwoPhase.tla defines no {name}"
    return match.group(1)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def test_the_variables_are_the_models_state_fields() -> None:
    declared = re.search(r"^VARIABLES\s*(.*?)\n\s*\n", SPEC, re.MULTILINE | re.DOTALL)
    assert declared
    names = re.findall(r"^\s*(\w+),?\s*(?:\\\*.*)?$", declared.group(1), re.MULTILINE)
    assert [_snake(n) for n in names] == list(TwoPhaseState._fields)


def test_next_lists_the_models_actions_in_its_order() -> None:
    """`TPNext`'s disjuncts, in order, are the action classes `actions` lists (one RM's
    five after the TM's two), and an action takes an RM in the spec iff its class has one."""
    spec_order = re.findall(r"\b([A-Z]\w+)(\(r\))?", _definition("TPNext"))
    spec_actions = [(name, bool(arg)) for name, arg in spec_order if name != "RM"]
    model = TwoPhaseReadable(1)
    (init,) = model.init_states()
    model_actions = [(type(a).__name__, hasattr(a, "rm")) for a in model.actions(init)]
    assert spec_actions == model_actions
    for name, takes_rm in spec_actions:
        head = re.escape(f"{name}(r)" if takes_rm else name)
        assert re.search(rf"^{head} ==", SPEC, re.MULTILINE), f"TwoPhase.tla defines no {name}"


def test_the_cfg_checks_the_models_invariant_and_deadlock() -> None:
    """TLC checks deadlock unless the cfg says CHECK_DEADLOCK FALSE; invar-check does too."""
    invariants = re.findall(r"^INVARIANTS?\s+(.+)$", CFG, re.MULTILINE)
    assert [name for line in invariants for name in line.split()] == ["TCConsistent"]
    assert "CHECK_DEADLOCK" not in CFG
    always = [p.name for p in TwoPhaseReadable(3).properties() if p.kind is PropertyKind.ALWAYS]
    assert always == ["consistent"]
    assert '"aborted"' in _definition("TCConsistent") and '"committed"' in _definition(
        "TCConsistent"
    )


def test_every_reachable_state_is_type_correct() -> None:
    """TPTypeOK, read in the model's terms, on all 8,832 states of 5 RMs."""
    rms = 5
    model = TwoPhaseReadable(rms)
    messages = {Message("Prepared", r) for r in range(rms)} | {Message("Commit"), Message("Abort")}
    states = reachable_states(model)
    assert len(states) == 8_832
    for s in states:
        assert len(s.rm_state) == rms
        assert set(s.rm_state) <= {"working", "prepared", "committed", "aborted"}
        assert s.tm_state in {"init", "committed", "aborted"}
        assert s.tm_prepared <= model.all_rms
        assert s.msgs <= messages
