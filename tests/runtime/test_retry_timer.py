"""The retry timer re-sends what was lost, not what is slow (`invar.runtime.retry`): a worker
generating for longer than `output.retry_seconds` is asked for nothing twice, while a dropped
frame is still re-sent."""

from __future__ import annotations

import json

import pytest

from invar.model import RunConfig, initial_state, step
from invar.model.core import logical_projection, outstanding_commands, run_complete
from invar.model.messages import LearnerStarted, LoadWeights, WorkerConnected
from invar.runtime.retry import MAX_BACKOFF, RetryTimer, launch_key, load_key, worker_keys
from invar.runtime.transport import FrameError
from invar.runtime.wire import read_working_frame, working_frame
from invar.testing import reply, version_digest

TIMEOUT = 1.0


def _started():
    """A one-worker run whose learner started and whose worker connected: the publication of
    version 0 is outstanding (an in-process command)."""
    config = RunConfig(prompts_per_batch=2, group_size=2, max_staleness=1, sync_period=1,
                       optimizer_steps=1, total_updates=2, max_inflight_batches=2, seed=7)
    state = initial_state(config)
    for event in (LearnerStarted(0, 0, version_digest(0)), WorkerConnected("w0", 0)):
        state, _ = step(state, event)
    return state


def _loading():
    """Then version 0 published: the worker's load is outstanding."""
    state, commands = step(_started(), reply(outstanding_commands(_started())[0], 1))
    return state, tuple(c for c in commands if isinstance(c, LoadWeights))


def _launched():
    """Then loaded: the launches of batches 0 and 1 to w0#0 are outstanding."""
    state, (load,) = _loading()
    return step(state, reply(load, 1))


def _keys(commands):
    return [key for command in commands for key in worker_keys(command)]


def test_a_worker_that_names_its_requests_is_never_asked_again():
    state, launches = _launched()
    timer = RetryTimer(TIMEOUT, now=0.0)
    timer.sent(launches, 0.0)
    for tick in range(1, 400):  # 100 timeouts of a generation call that goes on
        now = tick / 4
        timer.heard(_keys(launches), now)
        assert not timer.due(state, now + 0.24)


def test_a_request_the_worker_does_not_name_is_re_sent_after_the_timeout():
    """The frame of batch 1's launches was dropped: the worker, busy with batch 0, names only
    batch 0's requests; batch 1's are due one timeout after they were sent."""
    state, launches = _launched()
    first, dropped = launches
    timer = RetryTimer(TIMEOUT, now=0.0)
    timer.sent(launches, 0.0)
    for now in (0.25, 0.5, 0.75):
        timer.heard(_keys([first]), now)
        assert not timer.due(state, now)
    timer.heard(_keys([first]), 1.0)
    assert timer.due(state, 1.0)


def test_a_reply_lost_after_the_worker_stopped_naming_its_requests_is_re_sent():
    state, launches = _launched()
    timer = RetryTimer(TIMEOUT, now=0.0)
    timer.sent(launches, 0.0)
    timer.heard(_keys(launches), 5.0)  # then answered: named no more, the reply lost
    assert not timer.due(state, 5.75)
    assert timer.due(state, 6.0)


def test_only_the_incarnation_a_request_was_sent_to_speaks_for_it():
    state, launches = _launched()
    timer = RetryTimer(TIMEOUT, now=0.0)
    timer.sent(launches, 0.0)
    timer.heard([launch_key("w0", 1, tuple(r)) for c in launches for r in c.requests], 0.5)
    assert timer.due(state, 1.0)


def test_a_load_is_alive_while_the_worker_names_its_serial():
    state, (load,) = _loading()
    timer = RetryTimer(TIMEOUT, now=0.0)
    timer.sent([load], 0.0)
    timer.heard([load_key("w0", 0, load.load)], 0.75)
    assert not timer.due(state, 1.5)
    assert timer.due(state, 1.75)
    timer.heard([load_key("w0", 0, load.load + 1)], 1.75)  # another serial: not this load
    assert timer.due(state, 1.75)


def test_an_in_process_command_is_alive_while_its_component_works():
    state = _started()  # the publication of version 0 is outstanding
    timer = RetryTimer(TIMEOUT, now=0.0)
    timer.in_process_started()
    assert not timer.due(state, 100.0)
    timer.in_process_finished(100.0)  # finished without a reply: quiet from now
    assert not timer.due(state, 100.75)
    assert timer.due(state, 101.0)


def test_an_in_process_command_not_yet_dispatched_counts_from_the_event_that_issued_it():
    """Its event's commands wait for a journal sync: the idle learner's last work is older."""
    state = _started()
    timer = RetryTimer(TIMEOUT, now=0.0)
    timer.progress(50.0)
    assert not timer.due(state, 50.75)
    assert timer.due(state, 51.0)


def test_a_command_never_seen_sent_counts_from_when_it_is_first_seen():
    """A resumed run's outstanding commands were sent by the driver that died."""
    state, _ = _launched()
    timer = RetryTimer(TIMEOUT, now=0.0)
    assert not timer.due(state, 50.0)
    assert not timer.due(state, 50.75)
    assert timer.due(state, 51.0)


def test_the_timeout_doubles_while_the_timer_keeps_firing_and_resets_on_progress():
    timer = RetryTimer(TIMEOUT, now=0.0)
    timeouts = []
    for _ in range(MAX_BACKOFF + 2):
        timeouts.append(timer.timeout)
        timer.fired()
    assert timeouts == [TIMEOUT * 2 ** min(k, MAX_BACKOFF) for k in range(MAX_BACKOFF + 2)]
    timer.progress(0.0)
    assert timer.timeout == TIMEOUT


def test_a_working_frame_reads_back_and_a_malformed_one_is_refused():
    header = working_frame([(0, 1, 2), (3, 4, 5)], [7])
    assert read_working_frame(json.loads(json.dumps(header))) == ([(0, 1, 2), (3, 4, 5)], [7])
    for bad in ({"requests": [[0, 1]], "loads": []}, {"requests": [], "loads": ["7"]},
                {"requests": [[0, 1, 2.5]], "loads": []}, {"loads": []}):
        with pytest.raises(FrameError, match="working frame"):
            read_working_frame({"kind": "working", **bad})


# -- end to end, with a worker process ---------------------------------------------------------

SLOW_WORKER = ("rollout.chunk_prompts=4", 'rollout.faults=["slow:2.5"]',
               "output.retry_seconds=1.0")
"""One generation call per batch, each 2.5 s longer than it would be: over twice the timer."""


def test_a_generation_call_longer_than_the_timer_is_asked_for_once(tmp_path, rt):
    """Every request is answered once (replies = samples = samples generated) and nothing is
    a no-op."""
    config = rt.tiny_config(tmp_path, *SLOW_WORKER, "protocol.total_updates=2")
    state = rt.run_driver(config)
    assert run_complete(state)
    summary = rt.summary(tmp_path)
    samples = config.protocol.total_updates * config.protocol.samples_per_batch
    assert summary["rollout_replies"] == summary["rollout_generated"] == samples
    assert summary["noops"] == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    replies = [row["rollout_replies"] for row in rows if row["kind"] == "update"]
    assert sum(replies) == summary["rollout_replies"]


def test_frames_dropped_while_a_slow_worker_works_are_re_sent(tmp_path, rt):
    """A quarter of the frames dropped, both ways (loads, launches, replies, `working`
    frames): what was lost is re-sent by the timer, and the run is the serial one."""
    faults = ("rollout.frame_faults.drop=0.25", "rollout.frame_faults.seed=3")
    config = rt.tiny_config(tmp_path / "faulty", *SLOW_WORKER, *faults)
    state = rt.run_driver(config)
    assert rt.summary(tmp_path / "faulty")["counters"]["frames_dropped"] >= 1
    events = [event["type"] for event in rt.journal_events(tmp_path / "faulty")]
    assert "TimerFired" in events
    serial = rt.run_serial(rt.tiny_config(tmp_path / "serial", "rollout.chunk_prompts=4"))
    assert run_complete(state)
    assert logical_projection(state) == logical_projection(serial)
    rt.assert_same_weights(rt.final_weights(tmp_path / "serial"),
                           rt.final_weights(tmp_path / "faulty"))
