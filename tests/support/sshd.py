"""Run the real OpenSSH `sshd` on a loopback address for tests.

    handle = start_sshd(tmp_path / "sshd", listen="127.0.0.2", session_env={"PATH": "/twin/bin:/usr/bin"})
    try:
        async with asyncssh.connect(handle.host, port=handle.port, username=handle.user,
                                    client_keys=[str(handle.client_key)],
                                    known_hosts=str(handle.known_hosts)) as conn: ...
    finally:
        handle.stop()

`sshd` runs in the foreground (`-D -e`) with a private config: only public-key authentication for the
current user with the generated (or given) client key, `StrictModes no` (keys under /tmp), `UsePAM no`.
Sessions get `session_env` through `SetEnv` (OpenSSH >= 8.7), which sshd applies after its own defaults,
so a PATH given there wins over sshd's default PATH; set HOME to a clean directory too, or the user's
shell start-up files run on every command.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = "/usr/bin/ssh-keygen"


def sshd_unavailable_reason() -> str | None:
    """Why the real sshd cannot run here, or None when it can."""
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is not installed (Debian package openssh-server; scripts/bootstrap --dev installs it)"
    if not os.access(SSH_KEYGEN, os.X_OK):
        return f"{SSH_KEYGEN} is not installed (Debian package openssh-client)"
    if os.getuid() != 0:
        # sshd needs /run/sshd (privilege separation directory) and to switch users; only root can.
        return "running the real sshd needs root (it drops privileges into /run/sshd)"
    return None


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _keygen(path: Path, comment: str) -> None:
    if not path.exists():
        subprocess.run(
            [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
            check=True,
            capture_output=True,
        )
    path.chmod(0o600)


def _config_value(value: str) -> str:
    # sshd_config quoting: double quotes around a value holding spaces.
    if '"' in value or "\n" in value:
        raise ValueError(f"sshd_config cannot carry this value: {value!r}")
    return f'"{value}"' if any(c.isspace() for c in value) else value


@dataclass
class SshdHandle:
    host: str
    port: int
    user: str
    config_dir: Path
    host_key: Path
    client_key: Path
    known_hosts: Path
    process: subprocess.Popen[bytes]
    log_path: Path
    session_env: dict[str, str] = field(default_factory=dict)

    def ssh_argv(self, command: str | None = None) -> list[str]:
        """An OpenSSH client command line that reaches this sshd."""
        argv = [
            "ssh",
            "-i",
            str(self.client_key),
            "-p",
            str(self.port),
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            f"{self.user}@{self.host}",
        ]
        return [*argv, command] if command is not None else argv

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def stop(self) -> None:
        """Stop sshd and every session it still runs (they share its process group)."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, 15)
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, 9)
                self.process.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, 9)


def start_sshd(
    config_dir: Path,
    *,
    listen: str = "127.0.0.2",
    port: int | None = None,
    host_key: Path | None = None,
    client_key: Path | None = None,
    session_env: Mapping[str, str] | None = None,
    user: str | None = None,
    timeout: float = 5.0,
) -> SshdHandle:
    """Start sshd on `listen`:`port` (a free port when None) with its files in `config_dir`.

    `host_key` / `client_key` are private key paths (generated into config_dir when None; the client's
    public key is `<client_key>.pub`). `session_env` is the environment sessions get (PATH, HOME, ...).
    Raises RuntimeError with sshd's log when it does not come up.

    A free port is only free when it is picked: another test (an xdist worker, another engineer's suite)
    may bind it before sshd does. sshd then cannot bind and exits; with `port=None` another free port is
    tried (up to `PORT_TRIES` in all). Up means this sshd's own process holds the listening socket, not
    merely that something answers on the port.
    """
    reason = sshd_unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    tries = 1 if port else PORT_TRIES
    for attempt in range(1, tries + 1):
        try:
            return _start_sshd_once(
                config_dir,
                listen=listen,
                port=port or free_port(listen),
                host_key=host_key,
                client_key=client_key,
                session_env=session_env,
                user=user,
                timeout=timeout,
            )
        except _PortTaken:
            if attempt == tries:
                raise
    raise AssertionError("unreachable")


PORT_TRIES = 5


class _PortTaken(RuntimeError):
    """sshd could not bind its port: something else took it first."""


def listening_inodes(host: str, port: int) -> set[str]:
    """The socket inodes listening on IPv4 `host`:`port`, from /proc/net/tcp (machine-wide, by address)."""
    want = f"{socket.inet_aton(host)[::-1].hex().upper()}:{port:04X}"
    found = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[1] == want and fields[3] == "0A":  # st 0A: LISTEN
                found.add(fields[9])
    return found


def holds_socket(pid: int, inodes: set[str]) -> bool:
    """Whether process `pid` has one of these socket inodes open."""
    fd_dir = Path(f"/proc/{pid}/fd")
    with contextlib.suppress(OSError):
        for fd in fd_dir.iterdir():
            with contextlib.suppress(OSError):
                link = os.readlink(fd)
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return True
    return False


def _start_sshd_once(
    config_dir: Path,
    *,
    listen: str,
    port: int,
    host_key: Path | None,
    client_key: Path | None,
    session_env: Mapping[str, str] | None,
    user: str | None,
    timeout: float,
) -> SshdHandle:
    config_dir = config_dir.resolve()
    config_dir.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
    user = user or getpass.getuser()
    if host_key is None:
        host_key = config_dir / "ssh_host_ed25519_key"
        _keygen(host_key, "k26-test-sshd-host")
    if client_key is None:
        client_key = config_dir / "client_ed25519"
        _keygen(client_key, "k26-test-client")
    authorized = config_dir / "authorized_keys"
    shutil.copyfile(f"{client_key}.pub", authorized)
    authorized.chmod(0o600)
    known_hosts = config_dir / "known_hosts"
    host_pub = Path(f"{host_key}.pub").read_text().split()
    known_hosts.write_text(f"[{listen}]:{port} {host_pub[0]} {host_pub[1]}\n")
    env = dict(session_env or {})
    lines = [
        f"Port {port}",
        f"ListenAddress {listen}",
        f"HostKey {host_key}",
        f"AuthorizedKeysFile {authorized}",
        f"PidFile {config_dir / 'sshd.pid'}",
        f"AllowUsers {user}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "PrintMotd no",
        "PrintLastLog no",
        "UseDNS no",
        "AllowTcpForwarding local",
        "X11Forwarding no",
        "MaxSessions 32",
        "MaxStartups 100",
        "LogLevel ERROR",
    ]
    if env:
        lines.append("SetEnv " + " ".join(_config_value(f"{k}={v}") for k, v in env.items()))
    config = config_dir / "sshd_config"
    config.write_text("\n".join(lines) + "\n")
    log_path = config_dir / "sshd.log"
    log = log_path.open("wb")
    try:
        proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()
    handle = SshdHandle(
        host=listen,
        port=port,
        user=user,
        config_dir=config_dir,
        host_key=host_key,
        client_key=client_key,
        known_hosts=known_hosts,
        process=proc,
        log_path=log_path,
        session_env=env,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log = handle.log().strip()
            if "Address already in use" in log:
                raise _PortTaken(f"sshd could not bind {listen}:{port}: {log}")
            raise RuntimeError(f"sshd exited with {proc.returncode}: {log}")
        # Ours, not whatever else listens there: sshd's own process holds the listening socket.
        if holds_socket(proc.pid, listening_inodes(listen, port)):
            return handle
        time.sleep(0.01)  # a poll interval within the deadline, not a wait in itself
    handle.stop()
    raise RuntimeError(f"sshd did not listen on {listen}:{port} within {timeout} s: {handle.log().strip()}")
