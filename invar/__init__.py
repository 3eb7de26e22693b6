"""Invar: asynchronous RL training whose control plane is one pure, model-checked function.

Layering (each layer imports only the ones above it):

    invar.model    the pure core: config, schedule, messages, state, `step`, invariants,
                   objective. Standard library and numpy only; no I/O, no clocks, no randomness.
    invar.testing  deterministic fakes of every component (public: the checker, the property
                   tests and the runtime's conformance tests all drive `step` with them).
    invar.runtime  the imperative shell: driver, journal, transports, learners, workers, CLI.
    checker        (top-level package) `invar-check`, the explicit-state model checker.
"""

__version__ = "0.1.0"
