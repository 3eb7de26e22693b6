"""invar-check: a general explicit-state model checker (TLA+/TLC style, API after stateright).

Layering: each layer imports only the ones above it (`tests/checker/test_layers.py` checks
it on every module's imports, deferred ones included, and that the import graph has no cycle):

1. `checker.model`        – the `Model` protocol, `BaseModel` defaults, `Property` kinds.
2. `checker.fingerprint`  – stable 64-bit state fingerprints.
   `checker.fpset`        – the visited set as a compact table of them (TLC's FPSet).
   `checker.trace`        – `Trace`, `diff_states`, `trace_to_json`.
3. `checker.result`       – `CheckResult`, `PropertyResult`, `Verdict`, `Progress`, graph export.
   `checker.checkpoint`   – atomic checkpoint files, and a breadth-first search's levels in
                            them (`save_levels`, `resume_levels`).
   `checker.statefiles`   – what the sequential BFS keeps on disk: parent pointers, spilled
                            levels of its queue (TLC's states/ folder).
4. `checker._expand`      – the specialised hot loop of the breadth-first searches.
5. `checker.engine`       – the vocabulary every search speaks: `ModelContext`,
   `PropertyTracker`, `Coverage`, `Found`, `Outcome`, `SearchOptions` (with the stop rule).
6. the strategies, none importing another: `checker.bfs` (sequential BFS), `checker.dfs`,
   `checker.simulate` (random walks), `checker.parallel` (multi-process BFS) and
   `checker.liveness` (eventually / livelock, after the search).
7. `checker.search`       – `Checker`, the entry point: runs a strategy, builds the result.
8. `checker.report`       – rich rendering (progress lines, summary table, traces); the engine
   itself never prints, it reports through callbacks.
9. `checker`              – this package: the public API.
10. models and tools: `checker.examples` (two-phase commit, the engine's benchmark),
   `checker.invar_model` and `checker.prove` (the Invar protocol: they import `invar.model`
   and `invar.testing`), `checker.pinned` (the gate: its bounds, package data in checker/gate/,
   and its pinned values, held against the schedule and `checker.prove`), `checker.inductive`
   (the invariants proved inductive on `step` over a universe, checker/universes/),
   `checker.cli`
   (`invar-check`; trace validation reads journals with `invar.journal_format`, never with the
   runtime's shell).  Layers 1–9 know nothing of Invar.

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
from checker.report import (
    ProgressPrinter,
    coverage_table,
    print_result,
    render_trace,
    summary_table,
)
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
