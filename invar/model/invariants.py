"""Named invariants of the protocol: predicates over a state, and over a transition.

The model checker checks every one in every explored state (and on every explored transition);
the property tests check them after every step of drawn runs; trace validation checks them on
real journals. Each returns "" when it holds, or a sentence saying what is wrong.
"""

from __future__ import annotations

from typing import Callable, Sequence

from invar.model import schedule
from invar.model.messages import ApplyCotangent, Command, LaunchRequest, LoadWeights, Publish
from invar.model.state import Assigned, LearnerPhase, Sample, State, WorkerPhase


def no_sample_consumed_twice(state: State) -> str:
    seen: set = set()
    for record in state.ledger:
        for request in record.requests:
            if request in seen:
                return f"request {tuple(request)} consumed again by update {record.update}"
            seen.add(request)
    return ""


def consumed_version_is_scheduled(state: State) -> str:
    """Each update u consumed batch u, whole, in id order, from gen_version(u); staleness <= S."""
    config = state.config
    for record in state.ledger:
        u = record.update
        if record.requests != schedule.request_ids(config, u):
            return f"update {u} consumed {len(record.requests)} samples not batch {u} in id order"
        if record.version != schedule.gen_version(config, u):
            return (f"update {u} consumed data of version {record.version}, scheduled "
                    f"{schedule.gen_version(config, u)}")
        if not 0 <= u - record.version <= config.max_staleness:
            return f"update {u} consumed data {u - record.version} updates stale"
        if record.plan != schedule.minibatch_plan(config, u):
            return f"update {u} did not follow its minibatch plan"
    return ""


def each_update_commits_once(state: State) -> str:
    updates = [r.update for r in state.ledger]
    if updates != list(range(len(updates))):
        return f"commit sequence is {updates}, not 0, 1, 2, ..."
    if state.commit_digests and len(state.commit_digests) != len(updates) + 1:
        return f"{len(state.commit_digests) - 1} versions committed for {len(updates)} commits"
    return ""


def publish_after_commit_in_order(state: State) -> str:
    published = state.published
    if list(published) != sorted(set(published)):
        return f"publication sequence {list(published)} is not strictly increasing"
    for version in published:
        if version > state.committed:
            return f"version {version} published before it was committed ({state.committed})"
        if not schedule.is_published(state.config, version):
            return f"version {version} published though it is not in Pub"
    expected = [v for v in schedule.published_versions(state.config) if v <= state.committed]
    if list(published) != expected[:len(published)]:
        return f"publication sequence {list(published)} skips a version of {expected}"
    return ""


def launch_only_published_and_loaded(state: State) -> str:
    for batch in state.batches:
        version = schedule.gen_version(state.config, batch.batch)
        if not state.published or version > state.published[-1]:
            return f"batch {batch.batch} admitted before version {version} was published"
        for slot in batch.slots:
            if isinstance(slot, Assigned):
                worker = state.worker(slot.worker)
                if (worker is None or worker.incarnation != slot.incarnation
                        or worker.phase is not WorkerPhase.READY or worker.version != version):
                    return (f"a request of batch {batch.batch} runs on {slot.worker}#"
                            f"{slot.incarnation}, which has not loaded version {version}")
    return ""


def inflight_batches_bounded(state: State) -> str:
    inflight = state.admitted - state.committed
    if inflight > state.config.max_inflight_batches:
        return f"{inflight} batches in flight, bound {state.config.max_inflight_batches}"
    if [b.batch for b in state.batches] != list(range(state.committed, state.admitted)):
        return "the admitted, unconsumed batches are not exactly [committed, admitted)"
    return ""


def version_retained_while_in_use(state: State) -> str:
    for batch in state.batches:
        if batch.completed < len(batch.slots):
            version = schedule.gen_version(state.config, batch.batch)
            if version not in state.retained:
                return f"version {version} released while batch {batch.batch} is incomplete"
    for worker in state.workers:
        if worker.phase is WorkerPhase.LOADING and worker.version not in state.retained:
            return f"{worker.name} loads version {worker.version}, which is not retained"
    return ""


def batch_counters_consistent(state: State) -> str:
    for batch in state.batches:
        pending = sum(1 for s in batch.slots if s is None)
        done = sum(1 for s in batch.slots if isinstance(s, Sample))
        if (pending, done) != (batch.pending, batch.completed):
            return f"batch {batch.batch} counts {batch.pending}/{batch.completed}, holds {pending}/{done}"
    for worker in state.workers:
        held = sum(1 for b in state.batches for s in b.slots
                   if isinstance(s, Assigned) and s.worker == worker.name
                   and s.incarnation == worker.incarnation)
        if worker.phase is not WorkerPhase.LOST and held != worker.assigned:
            return f"{worker.name} counts {worker.assigned} requests, holds {held}"
    return ""


def learner_bound_to_its_step(state: State) -> str:
    learner = state.learner
    if learner.phase in (LearnerPhase.FORWARD, LearnerPhase.APPLYING):
        obs = learner.observation
        if obs is None or (obs.update, obs.step) != (state.committed, learner.step):
            return f"learner at update {state.committed} step {learner.step} bound to {obs}"
        if obs.serial != learner.observations - 1:
            return f"pending forward {obs} is not the newest requested"
    if learner.phase is LearnerPhase.FINISHED and state.committed != state.config.total_updates:
        return "learner finished before every update committed"
    return ""


Invariant = Callable[[State], str]

INVARIANTS: dict[str, Invariant] = {
    "no_sample_consumed_twice": no_sample_consumed_twice,
    "consumed_version_is_scheduled": consumed_version_is_scheduled,
    "each_update_commits_once": each_update_commits_once,
    "publish_after_commit_in_order": publish_after_commit_in_order,
    "launch_only_published_and_loaded": launch_only_published_and_loaded,
    "inflight_batches_bounded": inflight_batches_bounded,
    "version_retained_while_in_use": version_retained_while_in_use,
    "batch_counters_consistent": batch_counters_consistent,
    "learner_bound_to_its_step": learner_bound_to_its_step,
}


# ---------------------------------------------------------------------------------------------
# Transition invariants: over (state, commands returned, next state).


def cotangent_bound_to_its_step(before: State, commands: Sequence[Command], after: State) -> str:
    """Every cotangent sent names the pending forward and the state that step starts from."""
    for command in commands:
        if isinstance(command, ApplyCotangent):
            learner = after.learner
            if (learner.phase is not LearnerPhase.APPLYING
                    or command.observation != learner.observation
                    or command.attempt != learner.attempt
                    or command.pre_step_digest != learner.step_digest):
                return (f"cotangent for {tuple(command.observation)} sent while the learner is "
                        f"bound to {learner.observation} ({learner.phase.value})")
    return ""


def history_only_grows(before: State, commands: Sequence[Command], after: State) -> str:
    """The ledger, commits and publications are append-only: nothing done is undone."""
    if after.ledger[:len(before.ledger)] != before.ledger:
        return "the ledger of consumed batches was rewritten"
    if after.commit_digests[:len(before.commit_digests)] != before.commit_digests:
        return "a committed version changed or disappeared"
    if after.published[:len(before.published)] != before.published:
        return "the publication sequence was rewritten"
    return ""


def commands_respect_schedule(before: State, commands: Sequence[Command], after: State) -> str:
    """Launches carry the scheduled version and seed; loads and publications name commits."""
    config = after.config
    for command in commands:
        if isinstance(command, LaunchRequest):
            if command.version != schedule.gen_version(config, command.request.batch):
                return f"request {tuple(command.request)} launched with version {command.version}"
            if command.seed != schedule.sampling_seed(config, command.request):
                return f"request {tuple(command.request)} launched with another seed"
        if isinstance(command, LoadWeights) and command.version not in after.retained:
            return f"{command.worker} told to load version {command.version}, not retained"
        if isinstance(command, Publish) and command.version > after.committed:
            return f"version {command.version} published before its commit"
    return ""


TransitionInvariant = Callable[[State, Sequence[Command], State], str]

TRANSITION_INVARIANTS: dict[str, TransitionInvariant] = {
    "cotangent_bound_to_its_step": cotangent_bound_to_its_step,
    "history_only_grows": history_only_grows,
    "commands_respect_schedule": commands_respect_schedule,
}


def violations(state: State) -> dict[str, str]:
    """Every state invariant that fails, with what is wrong."""
    return {name: msg for name, check in INVARIANTS.items() if (msg := check(state))}


def transition_violations(before: State, commands: Sequence[Command], after: State) -> dict[str, str]:
    return {name: msg for name, check in TRANSITION_INVARIANTS.items()
            if (msg := check(before, commands, after))}
