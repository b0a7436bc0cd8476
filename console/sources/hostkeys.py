"""The host keys a connect trusts, and the sentence that refuses a key it does not.

The console decides the trusted keys itself (the hosts file's `known_hosts`, else the user's own
known_hosts files) and hands asyncssh those, because asyncssh takes `UserKnownHostsFile none` in the ssh
config as "accept any key". A refusal names the key type, the SHA256 fingerprint the server presented
and the known_hosts line to add once that fingerprint is checked.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import asyncssh
from asyncssh.config import SSHClientConfig

from console.sources.hosts import HostConfig
from console.sources.remote_command import SetupError, TransportError

__all__ = ["HostKeyRefused", "RecordingClient", "Trust", "refusal", "trusted_keys"]


class HostKeyRefused(TransportError):
    def __init__(
        self,
        sentence: str,
        fingerprint: str | None,
        changed: bool,
        *,
        key_type: str | None = None,
        known_hosts_line: str | None = None,
    ) -> None:
        super().__init__(sentence)
        self.fingerprint = fingerprint
        self.changed = changed
        self.key_type = key_type
        self.known_hosts_line = known_hosts_line
        """The line to add to a known_hosts file once the fingerprint is checked on the host."""


# Expanded at each connect (HOME decides), like ssh(1).
_DEFAULT_KNOWN_HOSTS = Path("~", ".ssh", "known_hosts")
_GLOBAL_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")

# The short key type ssh-keyscan -t and the host's key file names use.
_KEY_KIND = {"ssh-ed25519": "ed25519", "ssh-rsa": "rsa", "ssh-dss": "dsa"}


def _key_kind(algorithm: str) -> str | None:
    if algorithm.startswith("ecdsa-sha2-"):
        return "ecdsa"
    return _KEY_KIND.get(algorithm)


def _config_paths(value: object) -> list[Path]:
    """The file names an ssh config option lists (asyncssh types them as `object`)."""
    if not isinstance(value, list | tuple):
        return []
    return [Path(str(p)).expanduser() for p in value]


@dataclass(frozen=True)
class Trust:
    """The host keys the console trusts for one connect, decided before asyncssh sees the ssh config."""

    known: asyncssh.SSHKnownHosts | None
    """All trusted entries; None only for `insecure_skip_host_key_check = true`."""
    files: tuple[tuple[Path, asyncssh.SSHKnownHosts], ...]
    """Each file read, with its own entries (to name the one holding an entry that no longer matches)."""
    add_to: Path | None
    """Where a checked key belongs: the hosts file's known_hosts, else the user's own file."""


class RecordingClient(asyncssh.SSHClient):
    """Records the key a server presented when it was not trusted, to name its fingerprint, and the
    reason a connection ended. Returning False keeps asyncssh's refusal: nothing is accepted here."""

    def __init__(self) -> None:
        self.rejected: tuple[str, str, int, asyncssh.SSHKey] | None = None
        self.lost: Exception | None = None

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        self.rejected = (host, addr, port, key)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc


def trusted_keys(host: HostConfig, config: SSHClientConfig) -> Trust:
    """The keys to trust. Never taken from asyncssh's own reading of the ssh config, where
    `UserKnownHostsFile none` means "accept any key"; `StrictHostKeyChecking` is not read at all."""
    if host.insecure_skip_host_key_check:
        return Trust(known=None, files=(), add_to=None)
    user_default = _DEFAULT_KNOWN_HOSTS.expanduser()
    if host.known_hosts is not None:
        candidates = [host.known_hosts]
        add_to = host.known_hosts
    else:
        # The user's own files: those the ssh config names (none for "none"; /dev/null is no file),
        # ~/.ssh/known_hosts, and the system-wide ones, as ssh(1) reads them.
        named = _config_paths(config.get("UserKnownHostsFile"))
        system = _config_paths(config.get("GlobalKnownHostsFile"))
        candidates = list(dict.fromkeys([*named, user_default, *system, _GLOBAL_KNOWN_HOSTS]))
        add_to = next((p for p in named if p.is_file()), user_default)
    known = asyncssh.SSHKnownHosts()
    files: list[tuple[Path, asyncssh.SSHKnownHosts]] = []
    for path in candidates:
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise SetupError(f"the known_hosts file {path} cannot be read: {exc.strerror or exc}") from None
        try:
            own = asyncssh.SSHKnownHosts(text)
            known.load(text)
        except ValueError as exc:
            raise SetupError(
                f"the known_hosts file {path} has a line the console cannot read: {exc}"
            ) from None
        files.append((path, own))
    return Trust(known=known, files=tuple(files), add_to=add_to)


def refusal(target: HostConfig, client: RecordingClient, trust: Trust) -> HostKeyRefused:
    if client.rejected is None or trust.known is None:
        # A revoked key or a host certificate that does not validate: asyncssh refused it before
        # asking us, so there is no key of ours to name.
        return HostKeyRefused(
            f"the host key of {target.name} ({target.describe()}) could not be verified, "
            "so the console refuses to connect",
            None,
            changed=False,
        )
    host, addr, port, key = client.rejected
    fingerprint = key.get_fingerprint("sha256")
    algorithm, blob = key.export_public_key("openssh").decode().split()[:2]
    kind = _key_kind(algorithm)
    presented = f"{algorithm} {fingerprint}"
    pattern = host if port == 22 else f"[{host}]:{port}"
    line = f"{pattern} {algorithm} {blob}"
    match_port = None if port == 22 else port
    holders = [path for path, entries in trust.files if entries.match(host, addr, match_port)[0]]
    label = ", ".join(str(path) for path, _ in trust.files) or "any known_hosts file (there is none)"
    where = f"{target.name} ({addr} port {port})"
    on_host = f"ssh-keygen -lf /etc/ssh/ssh_host_{kind}_key.pub" if kind else "ssh-keygen -lf on its host key"
    keyscan = shlex.join(
        ["ssh-keyscan", *(["-p", str(port)] if port != 22 else []), *(["-t", kind] if kind else []), host]
    )
    add = (
        f"add this line to {trust.add_to}: {line} (the line {keyscan} prints; "
        "add it only once the fingerprint is checked)"
    )
    if holders:
        remove = "; ".join(shlex.join(["ssh-keygen", "-R", pattern, "-f", str(p)]) for p in holders)
        return HostKeyRefused(
            f"the host key of {where} has CHANGED: it presents {presented}, which does not match "
            f"{', '.join(map(str, holders))}, so the console refuses to connect; if the change is "
            f"expected, check the new fingerprint on the host ({on_host}), remove the old entry "
            f"({remove}) and {add}",
            fingerprint,
            changed=True,
            key_type=algorithm,
            known_hosts_line=line,
        )
    return HostKeyRefused(
        f"the host key of {where} is unknown: it presents {presented}, which is not in {label}, so "
        f"the console refuses to connect; check that fingerprint on the host ({on_host}), then {add}",
        fingerprint,
        changed=False,
        key_type=algorithm,
        known_hosts_line=line,
    )
