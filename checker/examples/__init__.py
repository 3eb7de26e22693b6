"""Example models: benchmarks and references for the engine."""

from checker.examples.two_phase_commit import TwoPhaseCommit, TwoPhaseView

__all__ = ["TwoPhaseCommit", "TwoPhaseView"]
