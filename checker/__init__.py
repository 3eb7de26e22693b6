"""invar-check: a general explicit-state model checker (TLA+/TLC style, API after stateright).

Layering (each layer imports only the ones above it):

1. `checker.model`        – the `Model` protocol, `BaseModel` defaults, `Property` kinds.
2. `checker.fingerprint`  – stable 64-bit state fingerprints.
   `checker.trace`        – `Trace`, `diff_states`, `trace_to_json`.
3. `checker.result`       – `CheckResult`, `PropertyResult`, `Verdict`, `Progress`, graph export.
   `checker.checkpoint`   – atomic checkpoint files.
4. `checker.search`       – the engine: `Checker` (BFS, DFS, simulation), with
   `checker._expand` (the specialised hot loop), `checker.parallel` (multi-process BFS)
   and `checker.liveness` (eventually / livelock).
5. `checker.report`       – rich rendering (progress lines, summary table, traces); the engine
   itself never prints, it reports through callbacks.

`checker.examples` holds example models (two-phase commit, the engine's benchmark).
Model-specific code (e.g. the Invar model) builds on layers 1–5 and is not imported here.

Typical use::

    from checker import BaseModel, Checker, Property, print_result

    class M(BaseModel):
        def init_states(self): return [0]
        def actions(self, s): return ["inc"] if s < 3 else []
        def next_state(self, s, a): return s + 1
        def is_final(self, s): return s == 3
        def properties(self): return [Property.always("small", lambda s: s <= 3)]

    result = Checker(M()).bfs()          # or .dfs(), .simulate(runs, max_depth, seed)
    print_result(result, M())
"""

from checker.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from checker.fingerprint import canonical, fingerprint
from checker.model import BaseModel, Model, Property, PropertyKind
from checker.report import ProgressPrinter, coverage_table, print_result, render_trace, summary_table
from checker.result import CheckResult, Progress, PropertyResult, Verdict, write_dot, write_graphml
from checker.search import Checker, check
from checker.trace import Trace, diff_states, to_jsonable, trace_to_json

__all__ = [
    "BaseModel",
    "CheckResult",
    "CheckpointError",
    "Checker",
    "Model",
    "Progress",
    "ProgressPrinter",
    "Property",
    "PropertyKind",
    "PropertyResult",
    "Trace",
    "Verdict",
    "canonical",
    "check",
    "coverage_table",
    "diff_states",
    "fingerprint",
    "load_checkpoint",
    "print_result",
    "render_trace",
    "save_checkpoint",
    "summary_table",
    "to_jsonable",
    "trace_to_json",
    "write_dot",
    "write_graphml",
]
