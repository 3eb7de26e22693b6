"""The pure core of Invar: `step(state, event) -> (state, commands) | ProtocolError`.

No I/O, threads, clocks or randomness here, only the standard library and numpy (a test walks
the imports). The checker and the runtime import these names; neither re-decides anything.
"""

from invar.model.config import RunConfig
from invar.model.core import (
    logical_projection,
    outstanding_commands,
    requires_fsync,
    run_complete,
    step,
)
from invar.model.errors import ConfigError, ProtocolError, Reason
from invar.model.invariants import (
    INVARIANTS,
    TRANSITION_INVARIANTS,
    transition_violations,
    violations,
)
from invar.model.messages import (
    COMMAND_TYPES,
    EVENT_TYPES,
    Command,
    DecodeError,
    Event,
    ObservationId,
    decode,
    dumps,
    encode,
    loads,
)
from invar.model.objective import ObjectiveConfig, ObjectiveTerms
from invar.model.schedule import RequestId, ScheduleReport, gen_version, report, staleness
from invar.model.state import LearnerPhase, State, WorkerPhase, initial_state, state_digest

__all__ = [
    "COMMAND_TYPES", "EVENT_TYPES", "INVARIANTS", "TRANSITION_INVARIANTS", "Command",
    "ConfigError", "DecodeError", "Event", "LearnerPhase", "ObjectiveConfig", "ObjectiveTerms",
    "ObservationId", "ProtocolError", "Reason", "RequestId", "RunConfig", "ScheduleReport",
    "State", "WorkerPhase", "decode", "dumps", "encode", "gen_version", "initial_state",
    "loads", "logical_projection", "outstanding_commands", "report", "requires_fsync",
    "run_complete",
    "staleness", "state_digest", "step", "transition_violations", "violations",
]
