"""Example models: benchmarks and references for the engine."""

from checker.examples.two_phase_commit import TwoPhaseCommit, TwoPhaseView
from checker.examples.two_phase_readable import TwoPhaseReadable

__all__ = ["TwoPhaseCommit", "TwoPhaseReadable", "TwoPhaseView"]
