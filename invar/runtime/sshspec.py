"""What an SSH worker is started as, checked without asyncssh: host strings, the remote
command line, and the transport's settings (`check_settings`, what the configuration calls for
`rollout.transport = "ssh"`).

The remote command is fixed: `[cd DIR &&] exec env NAME=value... PYTHON -m
invar.runtime.worker ARGS`, every part quoted for the remote POSIX shell (sshd runs a command
through the user's login shell). Host strings and the remote settings are also checked against
narrow patterns, so a value that would need quoting to be harmless is refused with its key
named instead of being sent: nothing from the configuration reaches a shell unquoted.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shlex
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from invar.model.errors import ConfigError

DEFAULT_PORT = 22
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9._-]{0,31}")
_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
_PROGRAM = re.compile(r"[A-Za-z0-9_./~+-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class HostSpec:
    """One "[user@]host[:port]" of rollout.hosts."""

    user: str | None
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user + '@' if self.user else ''}{host}:{self.port}"


def parse_host(text: str) -> HostSpec:
    """"user@host:port" (user and port optional; an IPv6 address in brackets); ValueError
    saying what is wrong with anything else (spaces, shell metacharacters, options such as
    "-oProxyCommand=...", a port out of range)."""
    user: str | None = None
    rest = text
    if "@" in rest:
        user, _, rest = rest.partition("@")
        if not _USER.fullmatch(user):
            raise ValueError(f"{text!r}: user {user!r} is not a valid user name "
                             "(letters, digits, '.', '_', '-'; not starting with '-')")
    port = DEFAULT_PORT
    if rest.startswith("["):
        host, bracket, tail = rest[1:].partition("]")
        if not bracket:
            raise ValueError(f"{text!r}: unclosed '[' around an IPv6 address")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{text!r}: {host!r} in brackets is not an IPv6 address") from None
        if tail:
            if not tail.startswith(":"):
                raise ValueError(f"{text!r}: expected ':port' after the address")
            port = _port(text, tail[1:])
    else:
        host, colon, port_text = rest.partition(":")
        if colon:
            port = _port(text, port_text)
        if not _HOSTNAME.fullmatch(host):
            raise ValueError(f"{text!r}: {host!r} is not a host name or IPv4 address "
                             "(letters, digits, '-' and '.' only)")
    return HostSpec(user, host, port)


@contextlib.contextmanager
def asyncssh_importing() -> Iterator[None]:
    """Around `import asyncssh`: its import makes `cryptography` warn about DSA (ten lines
    of CryptographyDeprecationWarning that would come before any message of ours)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"asyncssh\.")
        yield


def check_settings(config: Any) -> None:
    """The SSH transport's settings of `config` (a `TrainConfig`, not imported: the
    configuration imports this module) can work: every host well formed, asyncssh installed,
    the client keys readable, known_hosts there (unless trust_on_first_use); else a
    ConfigError naming the key."""
    rollout, ssh = config.rollout, config.rollout.ssh
    for index, host in enumerate(rollout.hosts):
        try:
            parse_host(host)
        except ValueError as error:
            raise ConfigError((f"rollout.hosts[{index}]",), str(error)) from None
    try:
        with asyncssh_importing():
            import asyncssh  # noqa: F401
    except ImportError:
        raise ConfigError(("rollout.transport",),
                          "\"ssh\" needs asyncssh: pip install -e '.[ssh]' in the Invar "
                          "checkout") from None
    for index, key in enumerate(ssh.client_keys):
        path = Path(key).expanduser()
        if not os.access(path, os.R_OK):
            raise ConfigError((f"rollout.ssh.client_keys[{index}]",),
                              f"{str(path)!r} is not a readable file")
    known = Path(ssh.known_hosts).expanduser()
    if not ssh.trust_on_first_use and not known.is_file():
        raise ConfigError(("rollout.ssh.known_hosts",),
                          f"{str(known)!r} does not exist, so no host can be verified; "
                          "add the hosts' keys to it, or set "
                          "rollout.ssh.trust_on_first_use = true")


def _port(text: str, port: str) -> int:
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{text!r}: port {port!r} is not a number in 1..65535")
    return int(port)


def remote_problems(python: str, directory: str, env: tuple[str, ...]
                    ) -> list[tuple[str, str]]:
    """(key under rollout.ssh, what is wrong) for each remote setting that is refused."""
    problems = []
    if not _PROGRAM.fullmatch(python):
        problems.append(("remote_python", (f"{python!r} is not a program name or path "
                                           "(letters, digits and _ . / ~ + - only)")))
    if directory and not _PROGRAM.fullmatch(directory):
        problems.append(("remote_dir", (f"{directory!r} is not a plain path "
                                        "(letters, digits and _ . / ~ + - only)")))
    for index, item in enumerate(env):
        name, equals, value = item.partition("=")
        if not equals or not _ENV_NAME.fullmatch(name):
            problems.append((f"remote_env[{index}]", (f"{item!r} is not NAME=value with "
                                                      "NAME a shell variable name")))
        elif "\n" in value or "\0" in value:
            problems.append((f"remote_env[{index}]", "a value cannot hold a newline or NUL"))
    return problems


def remote_command(python: str, directory: str, env: tuple[str, ...],
                   worker_args: dict[str, Any]) -> str:
    """The command line a worker is started with on its host (every part quoted)."""
    threads = str(worker_args.get("threads", 1))
    return _line(python, directory, env, threads,
                 ["-m", "invar.runtime.worker", shlex.quote(json.dumps(worker_args))])


def probe_command(python: str, directory: str, env: tuple[str, ...]) -> str:
    """A command that fails on a host whose Python cannot import the worker."""
    return _line(python, directory, env, "1", ["-c", shlex.quote("import invar.runtime.worker")])


def _line(python: str, directory: str, env: tuple[str, ...], threads: str,
          tail: list[str]) -> str:
    problems = remote_problems(python, directory, env)
    if problems:
        raise ValueError("; ".join(f"rollout.ssh.{key}: {why}" for key, why in problems))
    # The same thread caps a local worker gets (LocalProcessTransport.spawn), then the user's.
    assignments = [f"OMP_NUM_THREADS={threads}", f"MKL_NUM_THREADS={threads}", *env]
    # `python` and `directory` match _PROGRAM: a leading "~/" is left unquoted so the remote
    # shell expands it; everything else is quoted.
    words = ["exec", "env", *(shlex.quote(a) for a in assignments), _path(python), *tail]
    line = " ".join(words)
    return f"cd {_path(directory)} && {line}" if directory else line


def _path(path: str) -> str:
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)
