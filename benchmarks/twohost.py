"""Two hosts on one Linux machine, for the SSH transport's integration test and benchmarks.

    host A (netns <prefix>a, 127.200.0.1) <-veth-> wire (netns <prefix>w) <-veth-> host B
    (netns <prefix>b, 127.200.0.2, a real OpenSSH sshd on port 2222)

No namespace has a route out. The wire is a userspace bridge (this module run as
`python twohost.py wire IF1 IF2 CONTROL PIDFILE`, stdlib only) because the kernels CI runs on
may lack `netem`: it drops, duplicates, delays and reorders packets, or drops everything (a
silent partition: carriers stay up), as its JSON control file says.

Needs root, iproute2 (`ip netns`), OpenSSH's sshd and ssh-keygen, and ethtool (offloads off,
or the wire sees segments larger than a packet): `.ci/run` installs them. `TwoHosts.up()`
builds everything under a directory, `down()` removes every namespace, process and mount it
made (by PID, never by name), whatever state `up()` reached.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HOST_A, HOST_B, SSH_PORT = "127.200.0.1", "127.200.0.2", 2222


def missing_requirements() -> str:
    """Why two hosts cannot be built here ("" if they can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "ssh-keygen", "ethtool"):
        if shutil.which(tool) is None:
            return f"needs {tool} (apt-get install iproute2 openssh-server ethtool)"
    if not Path("/usr/sbin/sshd").is_file():
        return "needs /usr/sbin/sshd (apt-get install openssh-server)"
    probe = f"ivprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True,
                          check=False)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return ""


def _run(*command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): "
                           f"{done.stderr.strip()}")
    return done.stdout


class TwoHosts:
    """The namespaces, the wire, the keys and host B's sshd."""

    def __init__(self, directory: Path, prefix: str | None = None) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        # Per-process names: several harnesses (other users of the machine) never collide.
        self.prefix = prefix or f"iv{os.getpid() % 100000}"
        self.a, self.w, self.b = (f"{self.prefix}{x}" for x in "awb")
        self.client_key = self.dir / "client_key"
        self.rogue_key = self.dir / "rogue_key"
        self.host_key = self.dir / "host_key"
        self.known_hosts = self.dir / "known_hosts"
        self.wire_control = self.dir / "wire.json"
        self._created_run_sshd = False
        self._wire: subprocess.Popen | None = None

    # -- building and tearing down -----------------------------------------------------------

    def up(self) -> TwoHosts:
        started = time.monotonic()
        try:
            self._links()
            self._start_wire()
            self._keys()
            self.start_sshd()
        except BaseException:
            self.down()
            raise
        self.up_seconds = time.monotonic() - started
        return self

    def _links(self) -> None:
        for ns in (self.a, self.w, self.b):
            _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", "a0", "netns", self.a, "type", "veth", "peer", "name", "wa",
             "netns", self.w)
        _run("ip", "link", "add", "b0", "netns", self.b, "type", "veth", "peer", "name", "wb",
             "netns", self.w)
        for ns, dev, address in ((self.a, "a0", HOST_A), (self.b, "b0", HOST_B)):
            # 127/8 on a NIC: lo keeps only 127.0.0.1/32, and route_localnet lets the rest
            # of 127/8 leave the host.
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            subprocess.run(["ip", "-n", ns, "addr", "del", "127.0.0.1/8", "dev", "lo"],
                           capture_output=True, check=False)
            _run("ip", "-n", ns, "addr", "replace", "127.0.0.1/32", "dev", "lo")
            _run("ip", "netns", "exec", ns, "sysctl", "-qw",
                 "net.ipv4.conf.all.route_localnet=1", f"net.ipv4.conf.{dev}.route_localnet=1")
            self._no_offloads(ns, dev)
            _run("ip", "-n", ns, "addr", "replace", f"{address}/24", "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
        for dev in ("wa", "wb"):
            self._no_offloads(self.w, dev)
            _run("ip", "-n", self.w, "link", "set", dev, "up")

    @staticmethod
    def _no_offloads(ns: str, dev: str) -> None:
        # Without this the wire reads 64 KiB TSO/GSO super-frames it cannot forward.
        subprocess.run(["ip", "netns", "exec", ns, "ethtool", "-K", dev, "tx", "off", "tso",
                        "off", "gso", "off", "gro", "off"], capture_output=True, check=False)

    def _start_wire(self) -> None:
        self.wire_control.write_text("{}")
        pidfile = self.dir / "wire.pid"
        log = open(self.dir / "wire.log", "ab")  # noqa: SIM115 (the child keeps it)
        self._wire = subprocess.Popen(
            ["ip", "netns", "exec", self.w, sys.executable, __file__, "wire", "wa", "wb",
             str(self.wire_control), str(pidfile)], stdin=subprocess.DEVNULL, stdout=log,
            stderr=log)
        log.close()
        for _ in range(100):
            if pidfile.exists():
                return
            if self._wire.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"the wire did not start; see {self.dir / 'wire.log'}")

    def _keys(self) -> None:
        for path, comment in ((self.host_key, "hostB"), (self.client_key, "hostA"),
                              (self.rogue_key, "rogue")):
            if not path.exists():
                _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f",
                     str(path))
        shutil.copyfile(f"{self.client_key}.pub", self.dir / "authorized_keys")
        host_public = " ".join(Path(f"{self.host_key}.pub").read_text().split()[:2])
        self.known_hosts.write_text(f"[{HOST_B}]:{SSH_PORT} {host_public}\n")
        (self.dir / "sshd_config").write_text(f"""\
Port {SSH_PORT}
ListenAddress {HOST_B}
HostKey {self.host_key}
PidFile {self.dir / 'sshd.pid'}
AuthorizedKeysFile {self.dir / 'authorized_keys'}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
MaxStartups 100
# sshd's own keepalive: a session whose client vanished in a partition is ended (and its
# worker with it) within ~4 s, as the README asks of worker hosts.
ClientAliveInterval 1
ClientAliveCountMax 3
LogLevel VERBOSE
""")

    def start_sshd(self) -> None:
        if not Path("/run/sshd").exists():  # privilege separation directory
            Path("/run/sshd").mkdir(mode=0o755)
            self._created_run_sshd = True
        pidfile = self.dir / "sshd.pid"
        pidfile.unlink(missing_ok=True)
        _run("ip", "netns", "exec", self.b, "/usr/sbin/sshd", "-f",
             str(self.dir / "sshd_config"), "-E", str(self.dir / "sshd.log"))
        for _ in range(100):
            if pidfile.exists() and pidfile.read_text().strip():
                return
            time.sleep(0.05)
        raise RuntimeError(f"sshd did not start; see {self.dir / 'sshd.log'}")

    def down(self) -> None:
        for ns in (self.a, self.b, self.w):
            if not self._exists(ns):
                continue
            for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
                pids = self.pids(ns)
                for pid in pids:
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
                deadline = time.monotonic() + wait
                while self.pids(ns) and time.monotonic() < deadline:
                    time.sleep(0.05)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        if self._wire is not None:
            self._wire.wait(5)
        if self._created_run_sshd:
            try:
                Path("/run/sshd").rmdir()
            except OSError:
                pass

    @staticmethod
    def _exists(ns: str) -> bool:
        return ns in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                    text=True, check=False).stdout.split()

    # -- looking and acting ------------------------------------------------------------------

    @staticmethod
    def pids(ns: str, match: str = "") -> list[int]:
        """Processes in namespace `ns` whose command line contains `match`."""
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                             check=False).stdout
        found = []
        for word in out.split():
            try:
                cmdline = Path(f"/proc/{word}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if match.encode() in cmdline:
                found.append(int(word))
        return found

    def workers_on_b(self) -> list[int]:
        return self.pids(self.b, "invar.runtime.worker")

    def on_a(self, command: list[str], **popen: Any) -> subprocess.Popen:
        """Start `command` on host A (the driver's host)."""
        return subprocess.Popen(["ip", "netns", "exec", self.a, *command], **popen)

    def wire(self, **settings: Any) -> None:
        """Impair the link ({} clean; down=True a silent partition); in force within 0.2 s."""
        self.wire_control.write_text(json.dumps(settings))
        time.sleep(0.25)

    def kill_sshd(self) -> list[int]:
        """kill -9 every sshd on host B (the listener and each session's)."""
        pids = self.pids(self.b, "sshd")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        return pids

    def listening_on_a(self) -> str:
        """Listening TCP/UDP sockets on host A (`ss -ltun`), header left out."""
        out = subprocess.run(["ip", "netns", "exec", self.a, "ss", "-ltunH"],
                             capture_output=True, text=True, check=False).stdout
        return out.strip()

    def ssh_settings(self, repo: Path, python: str = sys.executable,
                     keepalive: tuple[float, int] = (1.0, 3)) -> list[str]:
        """--set items for workers on host B."""
        return ["rollout.transport=ssh",
                f"rollout.ssh.known_hosts={json.dumps(str(self.known_hosts))}",
                f"rollout.ssh.client_keys=[{json.dumps(str(self.client_key))}]",
                "rollout.ssh.agent=false", "rollout.ssh.connect_timeout=3.0",
                f"rollout.ssh.keepalive_interval={keepalive[0]}",
                f"rollout.ssh.keepalive_count={keepalive[1]}",
                f"rollout.ssh.remote_python={json.dumps(python)}",
                f"rollout.ssh.remote_dir={json.dumps(str(repo))}",
                f'rollout.ssh.remote_env=[{json.dumps(f"PYTHONPATH={repo}")}]']

    @staticmethod
    def hosts(workers: int) -> str:
        host = json.dumps(f"root@{HOST_B}:{SSH_PORT}")
        return f"rollout.hosts=[{', '.join([host] * workers)}]"


# -- the wire ----------------------------------------------------------------------------------

_ETH_P_ALL, _SOL_PACKET, _PACKET_IGNORE_OUTGOING = 3, 263, 23


def _open_interface(name: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
    sock.setsockopt(_SOL_PACKET, _PACKET_IGNORE_OUTGOING, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((name, 0))
    sock.setblocking(False)
    return sock


def wire_main(first: str, second: str, control: str, pidfile: str) -> None:
    """Forward every frame between two interfaces, impaired as `control` says: {"loss": %,
    "dup": %, "delay": ms, "reorder": % of delayed frames sent at once, "down": bool}."""
    loop = asyncio.new_event_loop()
    ends = {"a2b": (_open_interface(first), _open_interface(second))}
    ends["b2a"] = (ends["a2b"][1], ends["a2b"][0])
    Path(pidfile).write_text(f"{os.getpid()}\n")  # once the sockets are open
    settings: dict[str, Any] = {}
    last_due = {"a2b": 0.0, "b2a": 0.0}
    stats = {d: {"forwarded": 0, "lost": 0} for d in ends}
    seen: list[int | None] = [None]

    def send(sock: socket.socket, frame: bytes) -> None:
        try:
            sock.send(frame)
        except OSError:
            pass  # the peer is down or its queue full: lost, as on a wire

    def readable(direction: str) -> None:
        source, target = ends[direction]
        while True:
            try:
                frame = source.recv(65536)
            except OSError:  # BlockingIOError included: nothing more for now
                return
            if settings.get("down") or random.random() * 100 < settings.get("loss", 0):
                stats[direction]["lost"] += 1
                continue
            for _ in range(2 if random.random() * 100 < settings.get("dup", 0) else 1):
                stats[direction]["forwarded"] += 1
                delay = settings.get("delay", 0) / 1000
                if delay <= 0 or random.random() * 100 < settings.get("reorder", 0):
                    send(target, frame)  # a reordered frame overtakes the delayed ones
                    continue
                due = last_due[direction] = max(loop.time() + delay,
                                                last_due[direction] + 1e-6)
                loop.call_at(due, send, target, frame)

    def reload() -> None:
        try:
            mtime: int | None = os.stat(control).st_mtime_ns
        except FileNotFoundError:
            mtime = None
        if mtime != seen[0]:
            seen[0] = mtime
            try:
                new = json.loads(Path(control).read_text()) if mtime else {}
            except (OSError, ValueError) as error:
                print(f"wire: bad control file: {error}", file=sys.stderr, flush=True)
                new = {}
            settings.clear()
            settings.update(new)
            print(f"wire: {time.strftime('%H:%M:%S')} settings={settings} stats={stats}",
                  file=sys.stderr, flush=True)
        loop.call_later(0.1, reload)

    for direction in ends:
        loop.add_reader(ends[direction][0].fileno(), readable, direction)
    loop.add_signal_handler(signal.SIGTERM, loop.stop)
    reload()
    loop.run_forever()


if __name__ == "__main__":
    if sys.argv[1:2] == ["wire"]:
        wire_main(*sys.argv[2:6])
    else:
        raise SystemExit("usage: twohost.py wire IF1 IF2 CONTROL.json PIDFILE")
