"""Is a word on the command line a host the console can reach, a mistyped command, or neither?

`k26-console WORD` opens the console on host WORD. A typo of a command (`verfy`) or of a host used to
open a full-screen console that retried a name nothing answers to, forever; these checks run first.
"""

from __future__ import annotations

import difflib
import ipaddress
import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from console.sources.hosts import HostsFile

_RESOLVE_TIMEOUT_S = 5.0
"""A resolver that has not answered by then is given the benefit of the doubt: the connection says more."""


def close_command(word: str, commands: set[str]) -> str | None:
    """The command `word` is probably a typo of (`verfy` → `verify`, `profile` → `profiles`), or None."""
    matches = difflib.get_close_matches(word, sorted(commands), n=1, cutoff=0.75)
    return matches[0] if matches else None


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def _ssh_alias_target(name: str) -> str | None:
    """The HostName the user's ssh config gives `name`, or None when it gives none."""
    config = Path("~", ".ssh", "config").expanduser()
    if not config.is_file():
        return None
    import asyncssh

    try:
        options = asyncssh.SSHClientConnectionOptions(host=name, config=[str(config)])
    except (OSError, ValueError, asyncssh.Error):
        return None
    target = options.config.get("Hostname")
    return target if isinstance(target, str) and target else None


def resolves(host: str, timeout_s: float = _RESOLVE_TIMEOUT_S) -> bool:
    """Whether the system resolver knows `host`. A lookup still running after `timeout_s` counts as yes:
    a slow resolver is no proof the name is wrong."""
    if _is_address(host):
        return True
    answer: list[bool] = []

    def look() -> None:
        try:
            socket.getaddrinfo(host, 22, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            answer.append(False)
        else:
            answer.append(True)

    worker = threading.Thread(target=look, name="k26-resolve", daemon=True)
    worker.start()
    worker.join(timeout_s)
    return answer[0] if answer else True


def close_host(name: str, hosts: HostsFile) -> str | None:
    """The host of the hosts file `name` is probably a typo of (`twn` → `twin`), or None."""
    matches = difflib.get_close_matches(name, sorted(hosts.hosts), n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(name: str, hosts: HostsFile) -> str:
    """`: did you mean 'twin'?` when `name` is close to a host of the file, else nothing."""
    close = close_host(name, hosts)
    return f": did you mean {close!r}?" if close is not None else ""


def unknown_host(name: str, hosts: HostsFile) -> str | None:
    """The sentence refusing `name` when it is neither in the hosts file, nor an ssh config alias, nor a
    name the resolver knows (with the known host it is close to); None when the console may try it."""
    if hosts.get(name) is not None:
        return None
    target = name.rpartition("@")[2]
    if not target:
        return None  # "user@" alone: the hosts check of the command says what is wrong
    alias = _ssh_alias_target(target)
    if resolves(alias or target):
        return None
    where = str(hosts.path) if hosts.path else "the hosts file"
    known = ", ".join(sorted(hosts.hosts)) or "none"
    return (
        f"{name!r} is not a host in {where} and does not resolve as a host name{did_you_mean(name, hosts)}"
        f" (known hosts: {known})"
    )
