"""The real `Driver` in-process against fakes: its logic without torch or worker processes.

The learner is `FakeLearner` (the synthetic numerics of `invar.model.world`) behind the real
`LearnerExecutor`; the workers are coroutines behind `MemoryTransport`s speaking the frame
protocol. A run's logical projection must then equal `invar.testing.canonical_run`'s for the
same protocol, whatever goes wrong: duplicates, re-sends by the retry timer, a lost worker,
a driver crash and resume.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from invar.model import shell
from invar.model.core import logical_projection, run_complete
from invar.runtime import journal
from invar.runtime.config import worker_names
from invar.runtime.driver import Driver
from invar.runtime.learner_executor import checkpoint_path
from invar.runtime.store import WeightsStore
from invar.testing import canonical_run
from invar.testing.runtime import FakeLearner, MemoryWorkers, SimulatedCrash, request_rows

BOUNDARIES = ("rollout.workers=2", "protocol.total_updates=4", "protocol.eval_every=2",
              "protocol.checkpoint_every=2")
"""Four updates; evaluations of versions 0, 2, 4 and checkpoints of 2, 4."""


def config_for(rt, run_dir, *extra):
    return rt.tiny_config(run_dir, *BOUNDARIES, *extra)


def run(config, resume=False, workers=None, **learner_options):
    """Run (or resume) the driver with fakes; returns (driver, final state)."""
    learner = FakeLearner(Path(config.output.run_dir) / "commits",
                          config.protocol.optimizer_steps, **learner_options)
    driver = Driver(config, learner, spawn_worker=workers or MemoryWorkers(), resume=resume,
                    learner_inputs=request_rows)
    return driver, asyncio.run(asyncio.wait_for(driver.run(), 30))


def canonical(config):
    return canonical_run(config.protocol, tuple(worker_names(config.rollout.workers))).state


def evaluation_rows(run_dir: Path) -> list[int]:
    """The versions of the evaluation rows in metrics.jsonl, in order (duplicates kept)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["version"] for row in rows if row["kind"] == "evaluation"]


def assert_canonical(config, state):
    expected = canonical(config)
    assert run_complete(state)
    assert logical_projection(state) == logical_projection(expected)
    assert state.commit_digests == expected.commit_digests


def assert_checkpoints(run_dir: Path, state):
    for version in state.checkpointed:
        path = checkpoint_path(run_dir, version)
        assert path.read_text() == state.commit_digests[version]
        assert path.with_suffix(".digest").read_text() == state.commit_digests[version]
    assert not list((run_dir / "checkpoints").glob(".*.tmp"))


def test_a_whole_run_equals_the_canonical_run(tmp_path, rt):
    config = config_for(rt, tmp_path)
    driver, state = run(config)
    assert_canonical(config, state)
    assert state.evaluated == (0, 2, 4) and state.checkpointed == (2, 4)
    assert_checkpoints(tmp_path, state)
    assert evaluation_rows(tmp_path) == [0, 2, 4]
    summary = rt.summary(tmp_path)
    assert summary["updates"] == 4 and summary["refused"] == summary["noops"] == 0
    assert summary["final_heldout_reward"] is not None
    assert (tmp_path / "report.md").read_text().count("| 2 |") == 1  # the evaluations table
    assert (tmp_path / "reward_curve.png").stat().st_size > 0
    # The journal replays through the model, invariants included, to the final state.
    protocol, entries = journal.read(tmp_path / "journal.jsonl")
    outcomes = [after for _, _, after in journal.replay(protocol, entries, check_invariants=True)]
    assert not any(isinstance(o, journal.Departure) for o in outcomes)
    assert logical_projection(outcomes[-1]) == logical_projection(state)
    # Released versions are gone from the store; the final one is kept.
    store = WeightsStore(tmp_path / "store")
    assert store.path(4).exists() and not store.path(0).exists()
    assert driver.learner.calls["start"] == 1


def test_duplicated_worker_replies_are_noops(tmp_path, rt):
    config = config_for(rt, tmp_path)
    _, state = run(config, workers=MemoryWorkers(duplicate=True))
    assert_canonical(config, state)
    summary = rt.summary(tmp_path)
    assert summary["noops"] > 0 and summary["refused"] == 0


def test_timer_resends_are_answered_from_memory_and_recorded_once(tmp_path, rt):
    """Workers that answer late without a sign of life make the retry timer re-send every
    outstanding command, the slow learner's too (a busy learner alone never makes it fire):
    the executor answers a re-sent step or commit from memory (`test_learner_executor`),
    re-evaluates an evaluation (whose second reply is a no-op: its metrics row is written
    once), and the repeated replies change nothing."""
    config = config_for(rt, tmp_path, "output.retry_seconds=0.02")
    slow = {"evaluate_greedy": 0.1, "apply_cotangent": 0.05, "commit": 0.05}
    driver, state = run(config, workers=MemoryWorkers(reply_seconds=0.05), slow=slow)
    assert_canonical(config, state)
    assert rt.summary(tmp_path)["noops"] > 0
    assert driver.learner.calls["evaluate_greedy"] > 3  # some were evaluated twice
    assert driver.learner.calls["commit"] == 1 + 4  # commit 0 at start, then one per update
    assert driver.learner.calls["apply_cotangent"] == 4 * config.protocol.optimizer_steps
    assert evaluation_rows(tmp_path) == [0, 2, 4]
    assert_checkpoints(tmp_path, state)


def test_a_lost_worker_is_replaced_and_the_run_is_the_same(tmp_path, rt):
    config = config_for(rt, tmp_path, "rollout.respawn=true")
    workers = MemoryWorkers(die_after={"worker-0": 5})
    _, state = run(config, workers=workers)
    assert_canonical(config, state)
    assert ("worker-0", 1) in workers.spawned
    assert rt.summary(tmp_path)["worker_deaths"] == 1


@pytest.mark.parametrize("crash_at", [{"evaluate_greedy": 2}, {"commit_file": 2}],
                         ids=["before evaluating", "before checkpointing"])
def test_resume_after_a_crash_at_a_boundary_evaluates_and_checkpoints(tmp_path, rt, crash_at):
    """Finding 4: the driver dies right after the boundary commit of version 2, before its
    evaluation or checkpoint is done; the resumed run does them (they are outstanding until
    acknowledged), and the metrics hold one evaluation row per version."""
    config = config_for(rt, tmp_path)
    with pytest.raises(RuntimeError, match="a driver task failed"):
        run(config, crash_at=crash_at)
    _, crashed, _ = journal.restore(tmp_path / "journal.jsonl")
    assert crashed.committed == 2 and 2 not in crashed.checkpointed
    assert not checkpoint_path(tmp_path, 2).exists()

    driver, state = run(config, resume=True)
    assert_canonical(config, state)
    assert state.evaluated == (0, 2, 4) and state.checkpointed == (2, 4)
    assert_checkpoints(tmp_path, state)
    assert sorted(set(evaluation_rows(tmp_path))) == [0, 2, 4]
    assert [e["version"] for e in driver.metrics.evaluations] == [0, 2, 4]
    assert rt.summary(tmp_path)["updates"] == 4


def test_a_crash_while_writing_a_checkpoint_leaves_no_partial_file(tmp_path, rt, monkeypatch):
    """The checkpoint is written with atomic_write: a crash before its rename leaves no file
    under the checkpoint's name; the resumed run writes it whole."""
    import os
    config = config_for(rt, tmp_path)
    real_replace = os.replace

    def crash_on_checkpoint(source, target):
        if Path(target).parent.name == "checkpoints":
            raise SimulatedCrash(f"power lost before renaming {target}")
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", crash_on_checkpoint)
    with pytest.raises(RuntimeError, match="a driver task failed"):
        run(config)
    assert not list((tmp_path / "checkpoints").iterdir())  # no partial file, no leftover
    monkeypatch.undo()
    _, state = run(config, resume=True)
    assert_canonical(config, state)
    assert_checkpoints(tmp_path, state)


def test_a_release_deletes_weights_only_after_its_journal_line_is_synced(tmp_path, rt,
                                                                         monkeypatch):
    """Finding 2: the store file of a released version is deleted only once the journal line
    that released it is durable (fsynced), so a restart from the journal never needs a version
    that is gone. (The deletion runs in a thread: later lines may be appended meanwhile.)"""
    from invar.model.messages import ReleaseVersion
    config = config_for(rt, tmp_path)
    happened: list[tuple] = []
    append, sync, delete = journal.Journal.append, journal.Journal.sync, WeightsStore.delete
    to_store = Driver._to_store

    def spy_to_store(self, command):
        if isinstance(command, ReleaseVersion):  # the commands of the line self._releasing
            happened.append(("release", command.version, self._releasing))
        to_store(self, command)

    def spy_append(self, seq, event, *args, **kwargs):
        happened.append(("append", seq))
        append(self, seq, event, *args, **kwargs)

    def spy_sync(self):
        sync(self)
        happened.append(("sync", self.synced_seq))

    def spy_delete(self, version):
        happened.append(("delete", version))
        delete(self, version)

    monkeypatch.setattr(journal.Journal, "append", spy_append)
    monkeypatch.setattr(journal.Journal, "sync", spy_sync)
    monkeypatch.setattr(WeightsStore, "delete", spy_delete)
    monkeypatch.setattr(Driver, "_to_store", spy_to_store)
    _, state = run(config)
    assert_canonical(config, state)
    deletes = [i for i, h in enumerate(happened) if h[0] == "delete"]
    assert deletes, "no version was released: the test tests nothing"
    for i in deletes:
        version = happened[i][1]
        released = [h[2] for h in happened[:i] if h[0] == "release" and h[1] == version]
        assert released, f"version {version} deleted before its release was dispatched"
        synced = [h[1] for h in happened[:i] if h[0] == "sync"]
        assert synced and synced[-1] >= released[-1], happened[max(i - 4, 0):i + 1]
    assert not (tmp_path / "store" / f"weights-{happened[deletes[0]][1]:06d}.bin").exists()


def test_commands_wait_for_their_sync_while_the_loop_goes_on(tmp_path, rt, monkeypatch):
    """On a slow disk the loop keeps journalling events while a sync runs, yet no command of a
    durable delivery goes out before a sync covers its line, and commands go out in the order
    of their events."""
    import threading
    import time

    config = config_for(rt, tmp_path)
    durable: set[int] = set()
    dispatched: list[tuple[int, int]] = []  # (the issuing event's seq, the journal's synced)
    appended_while_syncing: list[int] = []
    syncing = threading.Event()
    accept, append, sync, dispatch = (Driver._accept, journal.Journal.append,
                                      journal.Journal.sync, Driver._dispatch)

    def spy_accept(self, event, delivery, encoded):
        if delivery.durable:
            durable.add(self.seq)
        accept(self, event, delivery, encoded)

    def spy_append(self, seq, *args, **kwargs):
        if syncing.is_set():
            appended_while_syncing.append(seq)
        append(self, seq, *args, **kwargs)

    def slow_sync(self):
        syncing.set()
        time.sleep(0.02)
        sync(self)
        syncing.clear()

    def spy_dispatch(self, commands, state):
        dispatched.append((self._releasing, self.journal.synced_seq))
        dispatch(self, commands, state)

    monkeypatch.setattr(Driver, "_accept", spy_accept)
    monkeypatch.setattr(journal.Journal, "append", spy_append)
    monkeypatch.setattr(journal.Journal, "sync", slow_sync)
    monkeypatch.setattr(Driver, "_dispatch", spy_dispatch)
    _, state = run(config)
    assert_canonical(config, state)
    assert appended_while_syncing, "the loop waited for every sync"
    assert durable and {seq for seq, _ in dispatched} >= durable
    for seq, synced in dispatched:
        assert seq not in durable or synced >= seq, (seq, synced)
    order = [seq for seq, _ in dispatched]
    assert order == sorted(order)


def test_a_release_that_is_not_durable_stops_the_driver(tmp_path, rt, monkeypatch):
    """The driver checks the ordering itself: were the shell ever to let a release out
    without a sync, the run stops instead of deleting weights a restart may need."""
    from invar.model.messages import ReleaseVersion
    real = shell.requires_fsync

    def no_release_sync(event, commands):
        return real(event, [c for c in commands if not isinstance(c, ReleaseVersion)])

    monkeypatch.setattr(shell, "requires_fsync", no_release_sync)
    with pytest.raises(RuntimeError, match="before its journal line .* is durable") as stopped:
        run(config_for(rt, tmp_path))
    # The version whose release was not durable is kept. (Which one it is depends on timing:
    # a release dispatched beside a Commit or Publish is synced anyway, and carried out.)
    version = int(re.search(r"release of version (\d+)", str(stopped.value)).group(1))
    assert WeightsStore(tmp_path / "store").path(version).exists()


@pytest.mark.parametrize("field, what", [("encoding", "message encoding"),
                                         ("frames", "frame layout")])
def test_a_worker_of_another_invar_version_is_refused_at_its_hello(tmp_path, rt, monkeypatch,
                                                                    caplog, field, what):
    """A worker speaking another message encoding or frame layout would misread every frame
    (or be misread): the driver refuses its hello by name and version, never sends it work,
    and stops once it gives up. A worker from before binary completions sent no layout."""
    from invar.runtime import driver as driver_module
    from invar.runtime.driver import RunStopped
    from invar.runtime.transport import MemoryTransport
    from invar.runtime.wire import hello

    monkeypatch.setattr(driver_module, "RESPAWN_BACKOFF", 0.01)
    sent_work: list[dict] = []
    ours = hello("worker-0")[field]
    theirs = ours - 1 if field == "encoding" else None

    async def old_worker(name: str, incarnation: int) -> MemoryTransport:
        transport = MemoryTransport(name)
        header = hello(name)
        if theirs is None:
            del header[field]
        else:
            header[field] = theirs
        await transport.to_driver.put((header, b""))

        async def record() -> None:
            while (item := await transport.to_worker.get()) is not None:
                sent_work.append(item[0])
        asyncio.ensure_future(record())
        return transport

    config = rt.tiny_config(tmp_path, "rollout.respawn=true")
    with pytest.raises(RunStopped, match="no rollout worker can serve"):
        run(config, workers=old_worker)
    assert f"speaks {what} {theirs!r}, this driver {ours}: " \
        "run the same invar version on every host" in caplog.text
    assert sent_work == []


def test_the_metrics_files_are_open_before_the_first_event(tmp_path, rt, monkeypatch):
    """Opening them (rewrites, TensorBoard's writer) is start-up work: no event's delivery
    pays for it."""
    from invar.runtime import metrics

    applied = Driver._apply

    def first_event_finds_them_open(self, event):
        assert self.metrics._jsonl is not None, "metrics opened on the event path"
        applied(self, event)

    monkeypatch.setattr(Driver, "_apply", first_event_finds_them_open)
    opened = metrics.MetricsLog.open
    calls = []
    monkeypatch.setattr(metrics.MetricsLog, "open",
                        lambda self: calls.append(1) or opened(self))
    run(config_for(rt, tmp_path))
    assert calls and (tmp_path / "metrics.jsonl").exists()


def test_the_collector_is_tuned_for_the_run_and_restored_after(tmp_path, rt, monkeypatch):
    import gc

    from invar.runtime import driver as driver_module

    before = gc.get_threshold()
    seen = []
    applied = Driver._apply

    def noting_threshold(self, event):
        seen.append(gc.get_threshold()[0])
        applied(self, event)

    monkeypatch.setattr(Driver, "_apply", noting_threshold)
    run(config_for(rt, tmp_path))
    assert set(seen) == {driver_module.YOUNG_GENERATION}
    assert gc.get_threshold() == before


def test_the_journal_s_encoding_counts_as_the_driver_s_time(tmp_path, rt, monkeypatch):
    """Events that arrive without their text (completions, as bytes) are encoded, and every
    state digested, by the journal in the thread that syncs: that is still the driver's work,
    and the core + driver seconds count it (as they did when it was done on the event path)."""
    from invar.runtime import journal as journal_module

    line_text = journal_module._Line.text
    slow = 0.005

    def slow_text(line, digest, payloads):
        import time
        began = time.thread_time()
        while time.thread_time() - began < slow:  # CPU work, as encoding is
            pass
        return line_text(line, digest, payloads)

    monkeypatch.setattr(journal_module._Line, "text", slow_text)
    driver, _ = run(config_for(rt, tmp_path))
    assert driver.seq > 20
    assert driver.stats.core_seconds >= slow * driver.seq


def test_a_diverged_policy_stops_the_run_which_resumes_from_its_last_commit(
        tmp_path, rt, monkeypatch):
    """Finding 4: a forward whose objective is not finite is refused (`Reason.DIVERGED`); the
    learner would send the same log-probs again, so the driver stops with one line naming the
    update and the ratio instead of stalling, and the run resumes from its last commit."""
    from invar.model import core
    from invar.runtime.driver import RunStopped
    real = core._cotangent

    def diverging_at_update_1(config, inputs, event):
        if event.observation.update == 1:
            return "the ratio exp(current - proximal) overflows (log-ratio 799.0)"
        return real(config, inputs, event)

    monkeypatch.setattr(core, "_cotangent", diverging_at_update_1)
    config = config_for(rt, tmp_path)
    with pytest.raises(RunStopped) as stopped:
        run(config)
    message = str(stopped.value)
    assert message.startswith("the policy diverged: update 1 step 0: the ratio exp(current - "
                              "proximal) overflows"), message
    assert "stops at update 1 of" in message and "--resume" in message
    monkeypatch.undo()
    _, state = run(config, resume=True)
    assert_canonical(config, state)


def test_a_learner_whose_log_probs_are_not_finite_stops_the_run(tmp_path, rt):
    """Issue 41: with `optim.lr = 1e308` the weights became infinite and every forward's
    log-probs NaN; the core refused each ForwardObserved (malformed) and the retry timer asked
    again, every 20 s, forever. The learner runs in the driver's process and would send the
    same again: the run stops with one line, resumable."""
    import numpy as np

    from invar.model.ragged import Ragged
    from invar.runtime.driver import RunStopped

    class DivergingLearner(FakeLearner):
        def forward(self, update, step, observation, rows, start):
            digest, current = super().forward(update, step, observation, rows, start)
            if update == 1:
                current = Ragged(np.full_like(current.values, np.nan), current.lengths)
            return digest, current

    config = config_for(rt, tmp_path, "output.retry_seconds=0.05")
    learner = DivergingLearner(tmp_path / "commits", config.protocol.optimizer_steps)
    driver = Driver(config, learner, spawn_worker=MemoryWorkers(), learner_inputs=request_rows)
    with pytest.raises(RunStopped) as stopped:
        asyncio.run(asyncio.wait_for(driver.run(), 30))
    message = str(stopped.value)
    assert message.startswith("the policy diverged: the learner's log-probs are refused "
                              "(current_logprobs[0]: every value must be a finite "
                              "log-probability"), message
    assert "stops at update 1 of" in message and "--resume" in message
