"""Rollout workers on a second host over a real OpenSSH sshd: two network namespaces joined
by veth pairs through a userspace wire (`benchmarks/twohost.py`), the driver on host A.

Skipped, with the reason, where two hosts cannot be built (not root, no `ip netns`, no sshd or
ethtool); `.ci/run` installs what they need and sets INVAR_REQUIRE_TWOHOST=1, which turns the
skip into a failure there.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


twohost = _load("twohost")
acceptance = _load("twohost_acceptance")

pytestmark = [pytest.mark.slow, pytest.mark.twohost]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    why = twohost.missing_requirements()
    if why:
        if os.environ.get("INVAR_REQUIRE_TWOHOST") == "1":
            pytest.fail(f"two hosts are required here (INVAR_REQUIRE_TWOHOST=1) but: {why}")
        pytest.skip(f"two hosts cannot be built here: {why}")
    built = twohost.TwoHosts(tmp_path_factory.mktemp("hosts"))
    built.up()
    try:
        yield built
    finally:
        built.down()
    assert not twohost.TwoHosts._exists(built.a), "a namespace survived down()"


def _train_on_a(hosts, run_dir: Path, *items: str) -> subprocess.CompletedProcess:
    base = [*acceptance.BASE, "protocol.total_updates=2", *hosts.ssh_settings(acceptance.REPO),
            hosts.hosts(2), f"output.run_dir=\"{run_dir}\"", *items]
    process = hosts.on_a([*acceptance.tool("invar"), "train", *acceptance.sets(base)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=acceptance.environment())
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_a_wrong_host_key_is_refused_by_name(hosts, tmp_path):
    wrong = tmp_path / "known_hosts"
    rogue = " ".join(Path(f"{hosts.rogue_key}.pub").read_text().split()[:2])
    wrong.write_text(f"[{twohost.HOST_B}]:{twohost.SSH_PORT} {rogue}\n")
    done = _train_on_a(hosts, tmp_path / "run", f"rollout.ssh.known_hosts=\"{wrong}\"")
    assert done.returncode == 1, done.stderr
    # The recorded key is not the host's: a CHANGED key, named with its file.
    assert (f"invar: cannot start: ssh root@{twohost.HOST_B}:{twohost.SSH_PORT}: the host key "
            "has CHANGED") in done.stderr
    assert str(wrong) in done.stderr
    assert not (tmp_path / "run" / "journal.jsonl").exists()


def test_an_unknown_client_key_is_refused_by_name(hosts, tmp_path):
    done = _train_on_a(hosts, tmp_path / "run",
                       f"rollout.ssh.client_keys=[\"{hosts.rogue_key}\"]")
    assert done.returncode == 1, done.stderr
    assert (f"invar: cannot start: ssh root@{twohost.HOST_B}:{twohost.SSH_PORT}: our key was "
            "refused") in done.stderr
    assert not (tmp_path / "run" / "journal.jsonl").exists()


def test_the_acceptance_run_survives_every_fault_and_equals_the_serial_run(hosts, tmp_path):
    """kill -9 of a worker, a silent partition, an sshd restart, a lossy wire, dropped and
    duplicated frames, kill -9 of the driver and --resume (see twohost_acceptance.py)."""
    result = acceptance.acceptance(hosts, tmp_path, updates=40)
    assert result["listening_on_a"] == ""
    assert result["trace"][0] == 0
    assert result["bitwise"][0], result["bitwise"][1]
    assert result["incarnations"] >= 9  # 2 first, 1 kill, 2 partition, 2 sshd, 2 resume
    log = "\n".join(result["driver_log"])
    assert "the remote worker was killed by SIGKILL" in log
    assert "not responding to keepalive" in log
    # Keepalive 1 s x 3: the partition is seen in seconds (TCP alone: ~15 minutes).
    assert result["partition_detected_seconds"] < 8
