"""The SSH transport against an in-process asyncssh server (fast: every CI run).

The server runs each session's command as a real local process (so the real worker runs
behind it, over real SSH channels); host keys, client keys and known_hosts are generated per
test. The real-OpenSSH, two-namespace tests are in test_twohost.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from invar.model.errors import ConfigError
from invar.model.messages import LoadWeights, encode
from invar.runtime import sshspec
from invar.runtime.config import SshConfig
from invar.runtime.ssh import HostUnreachable, SshRefused, SshWorkers
from invar.runtime.wire import hello

REPO = Path(__file__).resolve().parents[2]


# -- host strings and the remote command (no network) ------------------------------------------


@pytest.mark.parametrize("text, user, host, port", [
    ("root@127.0.0.9:22", "root", "127.0.0.9", 22),
    ("gpu-3.example.org", None, "gpu-3.example.org", 22),
    ("alice@box:2222", "alice", "box", 2222),
    ("bob@[::1]:2200", "bob", "::1", 2200),
])
def test_host_strings_are_parsed(text, user, host, port):
    spec = sshspec.parse_host(text)
    assert (spec.user, spec.host, spec.port) == (user, host, port)
    assert sshspec.parse_host(str(spec)) == spec


@pytest.mark.parametrize("text, why", [
    ("root@host;rm -rf ~", "not a host name"),
    ("-oProxyCommand=touch /tmp/x", "not a host name"),
    ("ro ot@host", "not a valid user"),
    ("-l@host", "not a valid user"),
    ("host:0", "port '0'"),
    ("host:22x", "port '22x'"),
    ("host:99999", "port '99999'"),
    ("$(id)@host", "not a valid user"),
    ("[not-v6]:22", "not an IPv6 address"),
    ("", "not a host name"),
])
def test_host_strings_that_could_inject_are_refused(text, why):
    with pytest.raises(ValueError, match=why.replace("(", r"\(")):
        sshspec.parse_host(text)


def test_remote_command_quotes_every_configured_part():
    args = {"name": "worker-0", "threads": 2, "note": "it's $(id); `x` \"y\""}
    line = sshspec.remote_command("/opt/py/bin/python3", "/srv/invar", ("A=1 2", "B=$(x)"),
                                  args)
    words = shlex.split(line)  # how the remote POSIX shell splits it
    assert words[:4] == ["cd", "/srv/invar", "&&", "exec"]
    assert words[4:9] == ["env", "OMP_NUM_THREADS=2", "MKL_NUM_THREADS=2", "A=1 2", "B=$(x)"]
    assert words[9:12] == ["/opt/py/bin/python3", "-m", "invar.runtime.worker"]
    assert json.loads(words[12]) == args and len(words) == 13


@pytest.mark.parametrize("python, directory, env, key", [
    ("python3; reboot", "", (), "remote_python"),
    ("python3", "/tmp/$(id)", (), "remote_dir"),
    ("python3", "", ("1BAD=x",), "remote_env[0]"),
    ("python3", "", ("A=ok", "NOEQUALS"), "remote_env[1]"),
])
def test_remote_settings_that_need_a_shell_are_refused(python, directory, env, key):
    assert [k for k, _ in sshspec.remote_problems(python, directory, env)] == [key]


# -- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, keys", [
    (['rollout.hosts=["root@h:22"]'], ("rollout.hosts", "rollout.transport")),
    (["rollout.transport=ssh", "rollout.workers=2", 'rollout.hosts=["h"]'],
     ("rollout.hosts", "rollout.workers")),
    (["rollout.transport=ssh", 'rollout.hosts=["h;id"]'], ("rollout.hosts[0]",)),
    (["rollout.ssh.keepalive_interval=0"], ("rollout.ssh.keepalive_interval",)),
    (["rollout.ssh.keepalive_count=0"], ("rollout.ssh.keepalive_count",)),
    (["rollout.ssh.connect_timeout=nan"], ("rollout.ssh.connect_timeout",)),
    (['rollout.ssh.remote_python="py; id"'], ("rollout.ssh.remote_python",)),
    (["rollout.frame_faults.drop=1.0"], ("rollout.frame_faults.drop",)),
    (["rollout.frame_faults.drop=0.5", "rollout.frame_faults.duplicate=0.6"],
     ("rollout.frame_faults.drop", "rollout.frame_faults.duplicate",
      "rollout.frame_faults.delay")),
    (["rollout.frame_faults.delay=0.1"],
     ("rollout.frame_faults.delay", "rollout.frame_faults.delay_seconds")),
])
def test_inconsistent_transport_settings_are_refused_with_their_keys(rt, tmp_path, overrides,
                                                                     keys):
    with pytest.raises(ConfigError) as caught:
        rt.tiny_config(tmp_path, *overrides)
    assert caught.value.fields == keys


def test_ssh_needs_a_known_hosts_file_or_explicit_trust_on_first_use(rt, tmp_path):
    ssh = ["rollout.transport=ssh", 'rollout.hosts=["h"]',
           f"rollout.ssh.known_hosts={json.dumps(str(tmp_path / 'absent'))}"]
    with pytest.raises(ConfigError, match="does not exist") as caught:
        rt.tiny_config(tmp_path, *ssh)
    assert caught.value.fields == ("rollout.ssh.known_hosts",)
    assert rt.tiny_config(tmp_path, *ssh, "rollout.ssh.trust_on_first_use=true")
    with pytest.raises(ConfigError) as caught:
        rt.tiny_config(tmp_path, *ssh, "rollout.ssh.trust_on_first_use=true",
                       f'rollout.ssh.client_keys=[{json.dumps(str(tmp_path / "nokey"))}]')
    assert caught.value.fields == ("rollout.ssh.client_keys[0]",)


# -- an in-process SSH server ------------------------------------------------------------------


class _AnyPassword(asyncssh.SSHServer):
    """Offers password and keyboard-interactive login and would accept any answer: a client
    that ever fell back to them (or prompted for one) would get in."""

    def password_auth_supported(self) -> bool:
        return True

    def validate_password(self, username: str, password: str) -> bool:
        return True

    def kbdint_auth_supported(self) -> bool:
        return True

    def get_kbdint_challenge(self, username: str, lang: str, submethods: str) -> Any:
        return "", "", "", [("Password: ", False)]

    def validate_kbdint_response(self, username: str, responses: Any) -> bool:
        return True


class Server:
    """An asyncssh server on 127.0.0.1 in a thread of its own, running each session's command
    as a local process; `blackhole()` makes it a silent partition (a TCP proxy in front of it
    stops forwarding, both sockets kept open)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key = asyncssh.generate_private_key("ssh-ed25519")
        self.rogue_key = asyncssh.generate_private_key("ssh-ed25519")
        for name, key in (("client_key", self.client_key), ("rogue_key", self.rogue_key)):
            key.write_private_key(directory / name)
            os.chmod(directory / name, 0o600)
        self.processes: list[asyncio.subprocess.Process] = []
        self.silent = False
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port, self.proxy_port = self._call(self._start())
        self.known_hosts = directory / "known_hosts"
        self.write_known_hosts(self.host_key)

    def write_known_hosts(self, key: Any) -> None:
        line = key.export_public_key("openssh").decode().strip()
        self.known_hosts.write_text(
            f"[127.0.0.1]:{self.port} {line}\n[127.0.0.1]:{self.proxy_port} {line}\n")

    def _call(self, coroutine: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    async def _start(self) -> tuple[int, int]:
        authorized = asyncssh.import_authorized_keys(
            self.client_key.export_public_key("openssh").decode())
        self.acceptor = await asyncssh.create_server(
            _AnyPassword, "127.0.0.1", 0, server_host_keys=[self.host_key],
            authorized_client_keys=authorized, process_factory=self._session, encoding=None)
        port = self.acceptor.sockets[0].getsockname()[1]
        self.proxy = await asyncio.start_server(self._forward, "127.0.0.1", 0)
        return port, self.proxy.sockets[0].getsockname()[1]

    async def _session(self, process: Any) -> None:
        """Like sshd: the command's stdin ends when the session does; a killed command is
        reported as an exit signal."""
        local = await asyncio.create_subprocess_shell(
            process.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        self.processes.append(local)

        async def to_command() -> None:
            try:
                while data := await process.stdin.read(65536):
                    local.stdin.write(data)
                    await local.stdin.drain()
            except (asyncssh.Error, OSError):
                pass
            finally:
                local.stdin.close()

        async def from_command(source: asyncio.StreamReader, target: Any) -> None:
            try:
                while data := await source.read(65536):
                    target.write(data)
            except (asyncssh.Error, OSError):
                pass

        feeding = asyncio.ensure_future(to_command())
        await asyncio.gather(from_command(local.stdout, process.stdout),
                             from_command(local.stderr, process.stderr))
        status = await local.wait()
        feeding.cancel()
        await asyncio.gather(feeding, return_exceptions=True)
        with contextlib.suppress(asyncssh.Error, OSError):
            if status < 0:
                process.exit_with_signal(signal.Signals(-status).name[3:])
            else:
                process.exit(status)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                while self.silent:  # partitioned: hold everything, close nothing
                    await asyncio.sleep(0.05)
                dst.write(data)
                await dst.drain()
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer),
                             return_exceptions=True)

    def close(self) -> None:
        async def stop() -> None:
            for process in self.processes:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
            self.acceptor.close()
            self.proxy.close()
        self._call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def server(tmp_path) -> Iterator[Server]:
    server = Server(tmp_path)
    try:
        yield server
    finally:
        server.close()


def ssh_options(server: Server, **changes: Any) -> SshConfig:
    options: dict[str, Any] = {
        "known_hosts": str(server.known_hosts),
        "client_keys": (str(server.directory / "client_key"),), "agent": False,
        "connect_timeout": 5.0, "keepalive_interval": 0.5, "keepalive_count": 2,
        "remote_python": sys.executable, "remote_dir": str(REPO),
        "remote_env": (f"PYTHONPATH={REPO}",)}
    options.update(changes)
    return SshConfig(**options)


def ssh_overrides(server: Server, port: int | None = None, workers: int = 1) -> list[str]:
    host = json.dumps(f"127.0.0.1:{port or server.port}")
    return ["rollout.transport=ssh", f"rollout.workers={workers}",
            f"rollout.hosts=[{', '.join([host] * workers)}]",
            f"rollout.ssh.known_hosts={json.dumps(str(server.known_hosts))}",
            f"rollout.ssh.client_keys=[{json.dumps(str(server.directory / 'client_key'))}]",
            "rollout.ssh.agent=false", "rollout.ssh.connect_timeout=5.0",
            f"rollout.ssh.remote_python={json.dumps(sys.executable)}",
            f"rollout.ssh.remote_dir={json.dumps(str(REPO))}",
            f'rollout.ssh.remote_env=[{json.dumps(f"PYTHONPATH={REPO}")}]']


def check(server: Server, **changes: Any) -> None:
    workers = SshWorkers(ssh_options(server, **changes), (f"127.0.0.1:{server.port}",),
                         ["worker-0"])
    asyncio.run(workers.check())


# -- security ----------------------------------------------------------------------------------


def test_a_verified_host_and_authorized_key_pass_the_check(server):
    check(server)


def test_a_changed_host_key_is_refused_naming_the_host_the_keys_and_the_line(server):
    server.write_known_hosts(server.rogue_key)  # known_hosts says another key
    old = server.rogue_key.get_fingerprint()
    new = server.host_key.get_fingerprint()
    # Trust on first use does not override a known host's different key.
    for trust in (False, True):
        with pytest.raises(SshRefused) as refused:
            check(server, trust_on_first_use=trust)
        message = str(refused.value)
        assert message.startswith(f"ssh 127.0.0.1:{server.port}: the host key has CHANGED: "
                                  f"{server.known_hosts} line 1 ({old}) records another key "
                                  f"than the ssh-ed25519 key {new} the host presents now")
        assert "man-in-the-middle" in message
        assert f"ssh-keygen -R '[127.0.0.1]:{server.port}' -f {server.known_hosts}" in message
        assert "trust_on_first_use cannot help" in message


def test_an_unknown_host_is_refused_unless_trust_on_first_use_is_asked_for(server, caplog):
    server.known_hosts.write_text("")
    with pytest.raises(SshRefused, match="host key not verified"):
        check(server)
    with caplog.at_level("WARNING", logger="invar.ssh"):
        check(server, trust_on_first_use=True)
    assert "trusting on first use" in caplog.text and f"127.0.0.1:{server.port}" in caplog.text
    recorded = server.known_hosts.read_text()
    assert recorded.startswith(f"[127.0.0.1]:{server.port} ssh-ed25519 ")
    check(server)  # now known: verified strictly, without trust on first use
    assert server.known_hosts.read_text() == recorded


def test_an_unauthorized_client_key_is_refused_naming_the_host(server):
    """The server would take any password: we are refused all the same, never prompted."""
    with pytest.raises(SshRefused, match=rf"ssh 127\.0\.0\.1:{server.port}: our key was "
                                         "refused"):
        check(server, client_keys=(str(server.directory / "rogue_key"),))


def test_an_unreachable_host_stops_the_run_before_it_starts(server, tmp_path, rt):
    closed = server.port + 1 if server.port < 65535 else server.port - 1
    with contextlib.suppress(OSError):  # make sure nothing listens there
        import socket
        probe = socket.create_connection(("127.0.0.1", closed), 0.5)
        probe.close()
        pytest.skip("the port next to the server's is in use")
    run_dir = tmp_path / "run"
    items = [*rt.tiny_overrides(run_dir), *ssh_overrides(server, port=closed)]
    result = subprocess.run(rt.cli("train", *(a for item in items for a in ("--set", item))),
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1, result.stderr
    assert f"invar: cannot start: ssh 127.0.0.1:{closed}: unreachable" in result.stderr
    assert "nothing was trained" in result.stderr
    assert "Warning" not in result.stderr  # asyncssh's import warns about DSA: not shown
    assert not (run_dir / "journal.jsonl").exists()  # no local worker trained in its place


# -- frames, weights and the connection ----------------------------------------------------------


def _hello_and_load(server: Server, tmp_path: Path, rt: Any, digest: str) -> tuple[str, str]:
    """Start a worker over SSH, send it version 0's weights with `digest` (empty: the right
    one): (the worker's answer, or what ended the transport; the worker's log)."""
    import torch

    from invar.runtime.cli import make_learner
    from invar.runtime.worker_args import worker_args

    config = rt.tiny_config(tmp_path / "run")
    threads = torch.get_num_threads()
    try:
        learner = make_learner(config)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(False)
    _, state_digest = learner.start()
    blob, params_digest, _ = learner.published_weights(0)
    workers = SshWorkers(ssh_options(server), (f"127.0.0.1:{server.port}",), ["worker-0"])
    log_path = tmp_path / "worker.log"

    async def go() -> str:
        transport = await workers.spawn("worker-0", worker_args(config, "worker-0"), log_path)
        try:
            header, _ = await transport.receive()
            assert header == hello("worker-0")
            load = LoadWeights("worker-0", 0, 1, 0, state_digest)
            await transport.send({"kind": "command", "message": encode(load),
                                  "params_digest": digest or params_digest}, blob)
            header, event = await asyncio.wait_for(transport.receive(), 60)
            return json.dumps(header, separators=(",", ":")) + event.decode()
        except HostUnreachable as error:
            return str(error)
        finally:
            await transport.close()
    return asyncio.run(go()), log_path.read_text()


def test_weights_travel_over_ssh_and_are_verified_by_digest(server, tmp_path, rt):
    loaded, _ = _hello_and_load(server, tmp_path, rt, "")
    assert '"type":"WeightsLoaded"' in loaded
    ended, log_text = _hello_and_load(server, tmp_path, rt, "0" * 64)
    # The worker refuses the load and dies of it (an error status, or SIGABRT when its
    # interpreter aborts shutting down around the stdin reader thread).
    assert re.fullmatch(rf"ssh 127\.0\.0\.1:{server.port}: the remote worker "
                        r"(exited with status [1-9]\d*|was killed by SIG[A-Z]+)", ended), ended
    assert "weights of version 0 do not match their digest" in log_text


def test_a_silent_partition_is_detected_by_the_keepalive(server, tmp_path, rt):
    """Through the proxy, then the proxy stops forwarding: no FIN, no RST, just silence."""
    from invar.runtime.worker_args import worker_args
    config = rt.tiny_config(tmp_path / "run")
    options = ssh_options(server, keepalive_interval=0.5, keepalive_count=2)
    workers = SshWorkers(options, (f"127.0.0.1:{server.proxy_port}",), ["worker-0"])

    async def go() -> tuple[float, str]:
        transport = await workers.spawn("worker-0", worker_args(config, "worker-0"),
                                        tmp_path / "worker.log")
        try:
            assert (await transport.receive())[0]["kind"] == "hello"
            server.silent = True
            began = time.monotonic()
            with pytest.raises(HostUnreachable) as caught:
                await asyncio.wait_for(transport.receive(), 30)
            return time.monotonic() - began, str(caught.value)
        finally:
            await transport.close()
    seconds, message = asyncio.run(go())
    print(f"silent partition detected after {seconds:.2f} s (keepalive 0.5 s x 2)")
    assert message.startswith(f"ssh 127.0.0.1:{server.proxy_port}: ")
    # asyncssh checks every interval and gives up after count unanswered ones.
    assert 0.5 <= seconds < 0.5 * (2 + 1) + 1.5


# -- training over SSH -------------------------------------------------------------------------


def test_two_workers_over_ssh_survive_a_crash_and_frame_faults_bitwise(server, tmp_path, rt):
    """Two workers on one host; one exits mid-run (a new incarnation reconnects), frames are
    dropped, duplicated and delayed; the result is the serial execution's, bit for bit."""
    from invar.model.core import logical_projection, run_complete
    config = rt.tiny_config(tmp_path / "ssh", *ssh_overrides(server, workers=2),
                            'rollout.faults=["worker-1:exit_after:5"]',
                            "rollout.frame_faults.drop=0.2", "protocol.total_updates=4",
                            "rollout.frame_faults.duplicate=0.2",
                            "rollout.frame_faults.delay=0.2",
                            "rollout.frame_faults.delay_seconds=0.2",
                            "rollout.frame_faults.seed=3", "output.retry_seconds=0.5")
    state = rt.run_driver(config)
    summary = rt.summary(tmp_path / "ssh")
    assert run_complete(state)
    assert summary["worker_deaths"] == 1
    assert summary["counters"].get("frames_dropped", 0) >= 1
    assert summary["counters"].get("frames_duplicated", 0) >= 1
    assert (tmp_path / "ssh" / "logs" / "worker-1.1.log").exists()  # the new incarnation
    serial = rt.run_serial(rt.tiny_config(tmp_path / "serial", "rollout.workers=2",
                                               "protocol.total_updates=4"))
    assert logical_projection(serial) == logical_projection(state)
    rt.assert_same_weights(rt.final_weights(tmp_path / "serial"),
                           rt.final_weights(tmp_path / "ssh"))
    # No worker outlives the run (each ends at the end of its stdin, or is killed).
    deadline = time.monotonic() + 10
    while any(p.returncode is None for p in server.processes) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(p.returncode is not None for p in server.processes)


# -- reconnection (the driver's side, whatever the transport) -----------------------------------


def _unreachable_then_local(times: int, tried: list[int]) -> Any:
    """A spawn whose first `times` attempts find the host unreachable."""
    async def spawn(driver: Any, name: str, incarnation: int) -> Any:
        tried.append(incarnation)
        if len(tried) <= times:
            raise HostUnreachable(f"ssh test-host:22: unreachable: attempt {len(tried)}")
        return await driver.launcher.spawn(name, incarnation)
    return spawn


def test_an_unreachable_host_is_retried_with_backoff_and_is_not_a_death(rt, tmp_path, caplog):
    tried: list[int] = []
    config = rt.tiny_config(tmp_path, "protocol.total_updates=2")
    began = time.monotonic()
    with caplog.at_level("WARNING", logger="invar.driver"):
        state = rt.run_driver(config, spawn=_unreachable_then_local(3, tried))
    from invar.model.core import run_complete
    assert run_complete(state)
    assert tried == [0, 1, 2, 3]  # each attempt a new incarnation
    assert time.monotonic() - began >= 0.5 + 1.0 + 2.0  # backed off 0.5 s, 1 s, 2 s
    summary = rt.summary(tmp_path)
    assert summary["worker_deaths"] == 0 and summary["refused"] == 0
    assert caplog.text.count("not started: ssh test-host:22: unreachable") == 3


def test_a_host_unreachable_for_longer_than_reconnect_seconds_stops_the_run(rt, tmp_path):
    from invar.runtime.driver import RunStopped
    config = rt.tiny_config(tmp_path, "rollout.ssh.reconnect_seconds=1.0")
    with pytest.raises(RunStopped, match=r"worker-0 died and is not restarted \(its host "
                                         r"stayed unreachable for \d+ s"):
        rt.run_driver(config, spawn=_unreachable_then_local(100, []))


@pytest.mark.skipif(shutil.which("ssh-agent") is None or shutil.which("ssh-add") is None,
                    reason="needs OpenSSH's ssh-agent and ssh-add")
def test_a_key_held_by_the_agent_is_used_only_when_the_agent_is(server, monkeypatch):
    socket_path = server.directory / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(socket_path)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if socket_path.exists():
                break
            time.sleep(0.05)
        environment = {**os.environ, "SSH_AUTH_SOCK": str(socket_path)}
        subprocess.run(["ssh-add", "-q", str(server.directory / "client_key")],
                       env=environment, check=True, capture_output=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(socket_path))
        monkeypatch.setenv("HOME", str(server.directory))  # no default ~/.ssh keys
        check(server, client_keys=(), agent=True)  # the agent's key gets in
        with pytest.raises(SshRefused, match="our key was refused"):
            check(server, client_keys=(), agent=False)
    finally:
        agent.terminate()
        agent.wait(5)
