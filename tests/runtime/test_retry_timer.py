"""The retry timer re-sends what was lost, not what is slow: a worker generating for longer than
`output.retry_seconds` is asked for nothing twice, while a dropped frame is still re-sent."""

from __future__ import annotations

from invar.model.core import logical_projection, run_complete


def test_a_generation_call_longer_than_the_timer_is_not_sent_again(tmp_path, rt):
    """Each generation call takes 1 s more, four times the timer's 0.25 s: every request is
    answered once (replies = samples) and nothing is a no-op."""
    config = rt.tiny_config(tmp_path, 'rollout.faults=["slow:1.0"]',
                            "output.retry_seconds=0.25")
    state = rt.run_driver(config)
    assert run_complete(state)
    summary = rt.summary(tmp_path)
    samples = config.protocol.total_updates * config.protocol.samples_per_batch
    assert summary["rollout_replies"] == samples
    assert summary["noops"] == 0
