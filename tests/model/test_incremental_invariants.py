"""The incremental invariant checker of trace validation decides every state invariant."""

from invar.model.invariants import INVARIANTS, IncrementalInvariants


def test_every_invariant_has_a_fast_path():
    """A new invariant must be added to `IncrementalInvariants` (otherwise its fast path
    could declare a state valid without ever checking it)."""
    covered = {*IncrementalInvariants._ALWAYS, *IncrementalInvariants._MEMOISED,
               *IncrementalInvariants._SPECIAL}
    assert covered == set(INVARIANTS)
