"""Rollout workers on other machines: the `Transport` interface over SSH (asyncssh).

One SSH connection per worker incarnation. It is opened with the host verified against
known_hosts (an unknown host refused unless trust-on-first-use was asked for; a changed key
always refused, with its own message: both fingerprints and the known_hosts line),
public-key authentication only (keys from the configuration or the agent; no password, no
prompt), a connect timeout and a keepalive; then the worker is started as the
fixed command of `invar.runtime.sshspec.remote_command` and frames travel over its
stdin/stdout exactly as over a local worker's pipes (the transport never looks inside them).
Weights travel in the load frames with their parameter digest, which the worker verifies
before loading.

Failures are of two kinds. `HostUnreachable` (a `ConnectionLost`): the host did not answer,
refused the TCP connection, or the connection died (keepalive, reset); the driver retries
with backoff, each attempt a new worker incarnation. `SshRefused` (a `TransportRefused`): the
host key does not verify or the client key is refused; retrying cannot help, and the error
names the host and what to do.

When the connection ends (closed, or the driver's process dies), sshd closes the worker's
stdin and the worker exits at the end of its stdin: no worker outlives its driver. A silent
partition is the one case the driver's side cannot end by itself; the host's sshd ends the
session when its own keepalive (`ClientAliveInterval`) gives up (README, "Workers on other
machines").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import Any

from invar.runtime.config import SshConfig, TrainConfig, worker_names
from invar.runtime.sshspec import (
    HostSpec,
    asyncssh_importing,
    parse_host,
    probe_command,
    remote_command,
)

with asyncssh_importing():
    import asyncssh
from invar.runtime.transport import (
    CLOSE_GRACE_SECONDS,
    ConnectionLost,
    StreamTransport,
    TransportRefused,
    worker_log,
)
from invar.runtime.worker_args import worker_args

log = logging.getLogger("invar.ssh")

EXIT_STATUS_WAIT = 1.0
"""Seconds to wait, after a worker's output ended, for its exit status (for the message)."""


class HostUnreachable(ConnectionLost):
    """The host cannot be reached now (retried with backoff); names the host."""


class SshRefused(TransportRefused):
    """The host or its sshd refused us for a reason retrying cannot fix; names the host."""


class _Client(asyncssh.SSHClient):
    """Never answers a password or keyboard-interactive prompt (asyncssh would ask this
    object): a worker host accepts our key or refuses us, it does not wait on a human."""

    def password_auth_requested(self) -> None:
        return None

    def kbdint_auth_requested(self) -> None:
        return None


class SshWorkers:
    """Opens worker transports on the configured hosts."""

    def __init__(self, options: SshConfig, hosts: tuple[str, ...], names: list[str]) -> None:
        self.options = options
        self.hosts: dict[str, HostSpec] = {name: parse_host(host)
                                          for name, host in zip(names, hosts, strict=True)}
        self.known_hosts = Path(options.known_hosts).expanduser()

    async def check(self) -> None:
        """Connect to every distinct host once and check its Python can import the worker:
        a host that is unreachable, unverifiable, refuses our key or lacks invar stops the run
        before it starts, with the host named (never a silent fallback to local workers)."""
        for host in sorted(set(self.hosts.values()), key=str):
            try:
                connection = await self._connect(host)
            except HostUnreachable as error:
                raise SshRefused(f"{error} (checked before the run starts; nothing was "
                                 "trained)") from None
            try:
                probe = probe_command(self.options.remote_python, self.options.remote_dir,
                                      self.options.remote_env)
                result = await asyncio.wait_for(connection.run(probe),
                                                self.options.connect_timeout + 60)
            except (asyncssh.Error, OSError, TimeoutError) as error:
                raise SshRefused(f"ssh {host}: checking the remote Python failed: "
                                 f"{_describe(error)}") from None
            finally:
                connection.close()
            if result.exit_status != 0:
                stderr = str(result.stderr or "").strip().splitlines()[-3:]
                raise SshRefused(
                    f"ssh {host}: `{self.options.remote_python} -c 'import "
                    f"invar.runtime.worker'` failed there (exit {result.exit_status}): "
                    f"{' / '.join(stderr) or 'no output'}; install invar with its torch extra "
                    "on the host, or set rollout.ssh.remote_python / remote_dir / remote_env")

    async def spawn(self, name: str, worker_args: dict[str, Any], log_path: Path
                    ) -> SshTransport:
        """A new worker incarnation on `name`'s host, connected."""
        host = self.hosts[name]
        connection = await self._connect(host)
        command = remote_command(self.options.remote_python, self.options.remote_dir,
                                 self.options.remote_env, worker_args)
        # Handed to asyncssh as the worker's stderr; SshTransport.close() closes it.
        log_file = open(log_path, "ab")  # noqa: SIM115, ASYNC230
        try:
            # The worker's stderr goes to its log here, as a local worker's does.
            process = await connection.create_process(command, encoding=None, stderr=log_file)
        except (asyncssh.Error, OSError) as error:
            log_file.close()
            connection.close()
            raise HostUnreachable(f"ssh {host}: starting the worker failed: "
                                  f"{_describe(error)}") from None
        return SshTransport(name, host, connection, process, log_file)

    async def _connect(self, host: HostSpec) -> asyncssh.SSHClientConnection:
        options = self.options
        known_hosts: Any = str(self.known_hosts)
        tofu = options.trust_on_first_use and not self._known(host)
        if tofu:
            known_hosts = None  # checked by hand below, then recorded
        try:
            connection, _ = await asyncssh.create_connection(
                _Client, host.host, host.port, username=host.user or (),
                known_hosts=known_hosts,
                client_keys=[str(Path(k).expanduser()) for k in options.client_keys] or (),
                agent_path=() if options.agent else None,
                password_auth=False, kbdint_auth=False, gss_auth=False, host_based_auth=False,
                preferred_auth="publickey", passphrase=None,
                connect_timeout=options.connect_timeout,
                login_timeout=options.connect_timeout,
                keepalive_interval=options.keepalive_interval,
                keepalive_count_max=options.keepalive_count)
        except asyncssh.HostKeyNotVerifiable as error:
            changed = await self._changed_key(host)
            if changed:
                raise SshRefused(changed) from None
            raise SshRefused(
                f"ssh {host}: host key not verified against {self.known_hosts} "
                f"({error.reason}): add the host's key there after checking its fingerprint "
                f"(ssh-keyscan -p {host.port} {host.host}), or set "
                "rollout.ssh.trust_on_first_use = true for a host never seen before") from None
        except asyncssh.PermissionDenied as error:
            keys = ", ".join(options.client_keys) or "the agent's and ~/.ssh's default keys"
            raise SshRefused(f"ssh {host}: our key was refused ({error.reason}); tried {keys}: "
                             "add the public key to the host's authorized_keys, or set "
                             "rollout.ssh.client_keys") from None
        except (asyncssh.KeyImportError, asyncssh.KeyEncryptionError) as error:
            raise SshRefused(f"ssh {host}: cannot use a client key: {error} (an encrypted key "
                             "must be held by the agent: no passphrase is asked for)") from None
        except (OSError, TimeoutError, asyncssh.Error) as error:
            raise HostUnreachable(f"ssh {host}: unreachable: {_describe(error)}") from None
        if tofu:
            self._trust(host, connection)
        return connection

    def _recorded(self, host: HostSpec) -> list[tuple[int, asyncssh.SSHKey]]:
        """The keys known_hosts records for this host, with their line numbers."""
        try:
            lines = self.known_hosts.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return []
        recorded: list[tuple[int, asyncssh.SSHKey]] = []
        for number, line in enumerate(lines, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                keys = asyncssh.import_known_hosts(line).match(host.host, host.host, host.port)[0]
            except (ValueError, asyncssh.KeyImportError):
                continue
            # (a key matched by name and by address is listed twice)
            unique = {key.get_fingerprint(): key for key in keys}
            recorded.extend((number, key) for key in unique.values())
        return recorded

    async def _changed_key(self, host: HostSpec) -> str:
        """When known_hosts records other keys for the host than the one it presents: the
        message that says so (OpenSSH's loud warning, with both fingerprints and where the
        old key is recorded); "" otherwise (an unknown host, or a key that cannot be read)."""
        recorded = self._recorded(host)
        if not recorded:
            return ""
        algorithms = list(dict.fromkeys(algorithm.decode() for _, key in recorded
                                        for algorithm in key.sig_algorithms))
        try:
            presented = await asyncio.wait_for(asyncssh.get_server_host_key(
                host.host, host.port, server_host_key_algs=algorithms),
                self.options.connect_timeout)
        except (OSError, TimeoutError, asyncssh.Error):
            presented = None
        if presented is None:
            return ""
        new = presented.get_fingerprint()
        if any(key.get_fingerprint() == new for _, key in recorded):
            return ""  # recorded after all: not verified for another reason
        where = ", ".join(f"line {number} ({key.get_fingerprint()})" for number, key in recorded)
        pattern = host.host if host.port == 22 else f"[{host.host}]:{host.port}"
        return (f"ssh {host}: the host key has CHANGED: {self.known_hosts} {where} records "
                f"another key than the {presented.get_algorithm()} key {new} the host presents "
                "now. Someone may be intercepting the connection (a man-in-the-middle attack), "
                "or the host was reinstalled or given a new key. Check the new fingerprint "
                "with the host's administrator; only if the change is expected, remove the "
                f"old key (ssh-keygen -R '{pattern}' -f {self.known_hosts}) and add the new one. "
                "rollout.ssh.trust_on_first_use cannot help: it never replaces a recorded key")

    def _known(self, host: HostSpec) -> bool:
        """Whether known_hosts has any entry for this host (matching or not)."""
        try:
            entries = asyncssh.read_known_hosts(str(self.known_hosts))
        except (OSError, ValueError):
            return False
        matched = entries.match(host.host, host.host, host.port)
        return any(matched[:2])

    def _trust(self, host: HostSpec, connection: asyncssh.SSHClientConnection) -> None:
        """Trust on first use: record the key the host showed, and say so."""
        key = connection.get_server_host_key()
        assert key is not None
        pattern = host.host if host.port == 22 else f"[{host.host}]:{host.port}"
        line = f"{pattern} {key.export_public_key('openssh').decode().strip()}\n"
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as file:
            file.write(line)
        log.warning("ssh %s: trusting on first use (rollout.ssh.trust_on_first_use): its key "
                    "%s was not in %s and has been added; check the fingerprint with the "
                    "host's administrator", host, key.get_fingerprint(), self.known_hosts)


class SshLauncher:
    """`rollout.transport = "ssh"` (`invar.runtime.registry.TRANSPORTS`): each worker on its
    `rollout.hosts` entry, over SSH (`SshWorkers`)."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self.workers = SshWorkers(config.rollout.ssh, config.rollout.hosts,
                                  worker_names(config.rollout.workers))

    async def check(self) -> None:
        await self.workers.check()

    async def spawn(self, name: str, incarnation: int) -> SshTransport:
        return await self.workers.spawn(
            name, worker_args(self.config, name, incarnation),
            worker_log(Path(self.config.output.run_dir), name, incarnation))


class SshTransport(StreamTransport):
    """One worker incarnation on a host: its stdin/stdout carry the frames."""

    def __init__(self, name: str, host: HostSpec, connection: asyncssh.SSHClientConnection,
                 process: asyncssh.SSHClientProcess[bytes], log_file: Any) -> None:
        # asyncssh's reader and writer offer what StreamTransport uses of asyncio's streams.
        super().__init__(name, process.stdout, process.stdin)  # type: ignore[arg-type]
        self.host = host
        self.connection = connection
        self.process = process
        self._log_file = log_file
        self._closed = False

    async def send(self, header: dict[str, Any], blob: bytes = b"") -> None:
        try:
            await super().send(header, blob)
        except (asyncssh.Error, OSError) as error:
            raise HostUnreachable(f"ssh {self.host}: {_describe(error)}") from None

    async def receive(self) -> tuple[dict[str, Any], bytes]:
        try:
            return await super().receive()
        except ConnectionLost as error:
            # The end of stdout comes before the exit status: wait a moment for it, so the
            # message says whether the worker died or the connection did.
            with contextlib.suppress(TimeoutError, asyncssh.Error, OSError):
                await asyncio.wait_for(self.process.wait_closed(), EXIT_STATUS_WAIT)
            raise HostUnreachable(f"ssh {self.host}: {self._why_ended(error)}") from None
        except (asyncssh.Error, OSError) as error:
            # asyncssh raises its own ConnectionLost when the keepalive gives up.
            raise HostUnreachable(f"ssh {self.host}: {_describe(error)}") from None

    def _why_ended(self, error: BaseException) -> str:
        status, signal = self.process.exit_status, self.process.exit_signal
        if signal:
            return f"the remote worker was killed by SIG{signal[0]}"
        if status is not None and status >= 0:
            return f"the remote worker exited with status {status}"
        return f"the connection ended ({error})"

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # End of stdin ends a worker; if it is busy, a grace period, then a KILL signal (sshd
        # delivers it since OpenSSH 7.9); closing the connection ends the session whatever.
        with contextlib.suppress(asyncssh.Error, OSError, RuntimeError):
            self.process.stdin.write_eof()
        try:
            await asyncio.wait_for(self.process.wait_closed(), CLOSE_GRACE_SECONDS)
        except (TimeoutError, asyncssh.Error, OSError):
            with contextlib.suppress(asyncssh.Error, OSError, RuntimeError):
                self.process.send_signal("KILL")
        self.connection.close()
        with contextlib.suppress(TimeoutError, asyncssh.Error, OSError):
            await asyncio.wait_for(self.connection.wait_closed(), CLOSE_GRACE_SECONDS)
        self._log_file.close()


def _describe(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return "timed out"
    text = getattr(error, "reason", "") or str(error) or ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
