"""Helpers shared by the test suites, imported as `helpers.<module>` (pyproject's pytest
`pythonpath` puts tests/ on the path):

- `core_driver`: a step-by-step, fault-free driver of the pure core (tests/model and others);
- `seeded_bugs`: small, plausible mistakes the checker must catch (tests/checker);
- `journals`: the journal of a small canonical run, as a driver writes it.
"""
