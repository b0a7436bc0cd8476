"""The host-side state directory that lets consoles pair: presence, the lock, the audit trail.

Layout, in `HostConfig.state_dir` (default `~/.k26-console` of the SSH user, `~` expanded on the host):

    presence/<console-id>.json   one heartbeat per open console, replaced atomically (temp file + mv)
    lock                         the LockInfo JSON of the console changing the service now
    audit.jsonl                  one AuditEntry JSON per line, append-only

Everything runs as plain POSIX `sh` on the host, one SSH command per operation, every value passed as
an argument (never pasted into the script):

- The lock is taken with `ln TEMP lock`: link(2) fails when `lock` exists, so of any number of consoles
  racing only one wins, and the file appears with its whole content (an O_EXCL create would show an
  empty lock to a reader for a moment). Each acquisition has its own `lock_id`; release and break
  remove only the lock they saw. What no console wrote is refused, never taken: a lock path that is
  not a regular file (`ln` would link INTO a directory and succeed, for every console) and a lock file
  that is empty or not LockInfo JSON (`HostStateError`, to be removed by hand).
- The lock's operations (acquire, release, break, leave's release) take turns under flock(1) on the
  state directory where the host has it. A release renames the lock away before it removes it, and puts
  back (with `ln`, over nothing) a lock that turned out not to be its own: a lock broken and taken by
  another console is never removed, with or without the turns.
- A lock is as alive as its holder's heartbeat: the acquire script writes the holder's presence first,
  and `locked()` keeps beating while it is held. A lock whose holder's heartbeat is stale (or gone) may
  be broken, only with an explicit confirmation; the break re-checks on the host that neither the lock
  nor the holder's heartbeat changed since it was judged, moves the lock away with one rename (so of
  two breakers only one succeeds) and appends the `lock_break` audit line in the same command.
- An audit line is one `printf '%s\\n' LINE >> audit.jsonl`: O_APPEND and a single write(2) per line
  (lines are kept under `AUDIT_LINE_MAX_BYTES`), so concurrent appends never interleave within a line.
  Readers skip a line they cannot read.
- Times are the host's: every command prints the host's clock first, and the console stamps what it
  writes with its own clock corrected by the measured offset, so staleness is judged on one clock.
- Presence and the lock are watched by polling (`watch`, every 2 s by default: one small command that
  reads the lock and every heartbeat); the audit trail is followed with `tail -F`, resumed by line
  number after a dropped connection, so nothing is lost or repeated.

The scripts themselves are in sources/hoststate_scripts. `HostStateDir` is what callers construct; its
parts, which share one `StateRunner` (one transport, one measured host clock), each do one job:

    state.runner   sources/state_runner.StateRunner    runs the scripts, keeps the host's clock offset
    state.board    sources/presence_board.PresenceBoard heartbeats, who is here, the lock held, leaving
    state.locks    sources/host_lock.HostLock           acquire, release, break, `locked()`
    state.audit    sources/audit_trail.AuditTrail       entries, append, read, follow
    state.files    sources/state_files.StateFiles       other features' files (the rollback's record)
"""

from __future__ import annotations

import getpass
import os
import socket
import time
import uuid
from collections.abc import Callable

from console.core.pairing import (
    DEFAULT_HEARTBEAT_S,
    DEFAULT_STALE_FACTOR,
    BreakRefused,
    Identity,
    LockHeld,
)
from console.sources.audit_trail import AUDIT_FOLLOW_LINE_MAX, AUDIT_TAIL_BYTES, AuditTrail
from console.sources.held_lock import Lock
from console.sources.host_lock import HostLock
from console.sources.hosts import HostConfig
from console.sources.presence_board import PRUNE_PER_READ, PresenceBoard, StateSnapshot
from console.sources.state_files import StateFiles
from console.sources.state_runner import HostStateError, StateRunner
from console.sources.transport import Transport

__all__ = [
    "AUDIT_FOLLOW_LINE_MAX",
    "AUDIT_TAIL_BYTES",
    "DEFAULT_HEARTBEAT_S",
    "DEFAULT_STALE_FACTOR",
    "PRUNE_PER_READ",
    "AuditTrail",
    "BreakRefused",
    "HostLock",
    "HostStateDir",
    "HostStateError",
    "Lock",
    "LockHeld",
    "PresenceBoard",
    "StateFiles",
    "StateRunner",
    "StateSnapshot",
    "local_identity",
]


def local_identity(*, user: str | None = None, jump_host: str | None = None) -> Identity:
    """This console: the local login, this machine's name, this process and a fresh random id."""
    try:
        login = user or getpass.getuser()
    except (KeyError, OSError):
        login = f"uid{os.getuid()}"
    return Identity(
        user=login,
        jump_host=jump_host or socket.gethostname().split(".")[0] or "localhost",
        pid=os.getpid(),
        console_id=uuid.uuid4().hex,
    )


class HostStateDir:
    """The state directory of one host, over its SSH transport, seen as console `me`: its parts over one
    runner (`runner`, `board`, `locks`, `audit`, `files`; the module's docstring says which does what)."""

    def __init__(
        self,
        transport: Transport,
        host: HostConfig,
        me: Identity | None = None,
        *,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        stale_factor: float = DEFAULT_STALE_FACTOR,
        timeout: float = 15.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`clock` is this machine's clock (tests pass a wrong one: what is written must not care)."""
        self.me = me or local_identity()
        self.runner = StateRunner(transport, host, timeout=timeout, clock=clock)
        self.board = PresenceBoard(self.runner, self.me, heartbeat_s=heartbeat_s, stale_factor=stale_factor)
        self.audit = AuditTrail(self.runner, self.me, self.board)
        self.locks = HostLock(self.runner, self.board, self.audit)
        self.files = StateFiles(self.runner)

    @property
    def transport(self) -> Transport:
        return self.runner.transport

    @property
    def host(self) -> HostConfig:
        return self.runner.host

    @property
    def path(self) -> str:
        return self.runner.path
