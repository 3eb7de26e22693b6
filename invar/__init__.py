"""Invar: asynchronous RL training whose control plane is one pure, model-checked function.

Layering (each layer imports only the ones above it):

    invar.model    the pure core: config, schedule, messages, state, `step`, invariants,
                   objective. Standard library and numpy only; no I/O, no clocks, no randomness.
    invar.journal_format
                   the journal's lines, payload segments and snapshots, read and replayed
                   through `step` (file reading and layouts, no writing policy): shared by the
                   runtime, which writes journals, and the checker, which validates them,
                   without the checker importing the runtime.
    invar.testing  deterministic fakes of every component (public: the checker, the property
                   tests and the runtime's conformance tests all drive `step` with them).
    invar.runtime  the imperative shell: what every run sets up and records (`run`), the
                   asynchronous driver and the serial reference built on it, the worker
                   supervisor, journal, transports, learners, workers, CLI.
    checker        (top-level package) `invar-check`, the explicit-state model checker: its
                   Invar model and trace validation import invar.model, invar.journal_format
                   and invar.testing, never invar.runtime.
"""

__version__ = "0.1.0"
