"""Helpers shared by the test suites, imported as `helpers.<module>` (pyproject's pytest
`pythonpath` puts tests/ on the path):

- `core_driver`: a step-by-step, fault-free driver of the pure core (tests/model);
- `faulty_runs`: runs in the shared world with every core step checked, and the Hypothesis
  state machine that chooses their actions and faults (tests/model);
- `bulk_frames`: two workers holding large batches, and their replies (tests/model);
- `seeded_bugs`: small, plausible mistakes the checker must catch (tests/checker);
- `journals`: the journal of a small canonical run, as a driver writes it (tests/checker,
  tests/runtime).
"""
