"""Who is on a host: this console's heartbeat in `presence/`, everyone's read back, stale ones pruned.

The board also keeps the lock this console holds (`held`): its heartbeat checks the lock is still ours,
and leaving releases it. Taking the lock (`host_lock.HostLock.acquire`) and leaving take turns under the
board's `turns`, so a lock taken while the console leaves is released by the leave.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import ValidationError

from console.core.confirm import PendingRollback
from console.core.pairing import (
    DEFAULT_HEARTBEAT_S,
    DEFAULT_STALE_FACTOR,
    Identity,
    LockInfo,
    PairingView,
    Presence,
)
from console.sources import hoststate_scripts as hs
from console.sources.held_lock import Lock
from console.sources.state_runner import HostStateError, StateRunner
from console.sources.transport import TransportError

__all__ = ["PRUNE_PER_READ", "PresenceBoard", "StateSnapshot"]


PRUNE_PER_READ = 500
"""Stale heartbeat files one read removes at most (one awk compares them, one rm removes them: ~0.1 s of
the host's time for 500). Thousands left by consoles that died go over a few reads, none made slow."""


@dataclass
class StateSnapshot:
    """One read of the directory: the lock line and every heartbeat line as found on the host."""

    now: datetime
    lock_line: str | None
    presence_lines: dict[str, str] = field(default_factory=dict)
    pending_line: str | None = None
    """The commit-confirmed rollback's record (`pending-rollback.json`), when one is armed."""


class PresenceBoard:
    """The host's presence directory, seen as console `me`."""

    def __init__(
        self,
        runner: StateRunner,
        me: Identity,
        *,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        stale_factor: float = DEFAULT_STALE_FACTOR,
    ) -> None:
        self.runner = runner
        self.me = me
        self.heartbeat_s = heartbeat_s
        self.stale_factor = stale_factor
        self.looking_at = ""
        self.held: Lock | None = None
        """The lock this console holds on the host, which every beat checks (set by `HostLock`)."""
        self.turns = asyncio.Lock()
        """Taken by leaving and by taking the lock: one waits for the other (see `leave`, `HostLock.acquire`)."""
        self.left = False
        """This console has left: no beat writes its presence again, and no lock is taken."""
        self._since: datetime | None = None

    def presence_record(self) -> Presence:
        """This console's heartbeat as written now (its `since` is the first one's)."""
        now = self.runner.now()
        if self._since is None:
            self._since = now
        return Presence(
            **self.me.model_dump(),
            since=self._since,
            heartbeat=now,
            interval_s=self.heartbeat_s,
            looking_at=self.looking_at,
        )

    async def heartbeat(self, looking_at: str | None = None) -> None:
        """Say this console is here (and what it shows); call every `heartbeat_s`. When this console
        holds a lock, the beat also checks the lock is still ours (`Lock.lost` otherwise)."""
        if looking_at is not None:
            self.looking_at = looking_at
        async with self.turns:
            # Leaving is final: a console leaves, then exits, and its heartbeat task runs until the exit
            # cancels it. A beat under way as it leaves finishes first; one due after it writes nothing
            # (it would put back the presence leaving removed, for others to see go stale).
            if not self.left:
                await self._beat(hs.HEARTBEAT, "write the heartbeat")

    async def beat_and_view(self, looking_at: str | None = None) -> PairingView:
        """`heartbeat` and `view` in one run on the host (one SSH channel where they took two: a console's
        link does both every beat). Once this console has left, only the view."""
        if looking_at is not None:
            self.looking_at = looking_at
        snap: StateSnapshot | None = None
        async with self.turns:
            if not self.left:
                snap = self._parse(
                    *await self._beat(hs.BEAT_AND_READ, "write the heartbeat and read the state")
                )
        return await self._view_of(snap if snap is not None else await self.snapshot())

    async def _beat(self, script: str, what: str) -> tuple[datetime, list[str]]:
        """Run a script that writes this console's heartbeat (and checks the lock it holds), under `turns`."""
        await self.runner.sync_clock()
        lock = self.held
        args = [self.me.console_id, self.presence_record().model_dump_json()]
        if lock is not None:
            args.append(lock.info.lock_id)
        now, lines = await self.runner.run_to_the_end(script, *args, what=what)
        if lock is not None and "held lost" in lines and self.held is lock:
            lock.lost = True
        return now, lines

    async def snapshot(self) -> StateSnapshot:
        now, lines = await self.runner.run(hs.READ_STATE, what="read presence and the lock")
        return self._parse(now, lines)

    @staticmethod
    def _parse(now: datetime, lines: list[str]) -> StateSnapshot:
        lock_line: str | None = None
        pending_line: str | None = None
        presence: dict[str, str] = {}
        for line in lines:
            if line.startswith("lock "):
                lock_line = line[5:].strip() or None
            elif line.startswith("pending "):
                pending_line = line[8:].strip() or None
            elif line.startswith("presence "):
                name, _, content = line[9:].partition(" ")
                presence[name] = content
        return StateSnapshot(now=now, lock_line=lock_line, presence_lines=presence, pending_line=pending_line)

    def judge(self, snap: StateSnapshot) -> tuple[list[Presence], dict[str, str], LockInfo | None, bool]:
        """Live heartbeats, the stale ones (file → line), the lock and whether its holder is stale."""
        live: list[Presence] = []
        stale: dict[str, str] = {}
        by_id: dict[str, Presence] = {}
        for name, line in snap.presence_lines.items():
            try:
                p = Presence.model_validate_json(line)
            except ValidationError:
                continue  # not ours to judge (a newer console's format, a hand-made file): ignored
            if name != f"{p.console_id}.json":
                continue
            if p.stale(snap.now, self.stale_factor):
                stale[name] = line
            else:
                live.append(p)
                by_id[p.console_id] = p
        lock = None
        if snap.lock_line:
            with contextlib.suppress(ValidationError):
                lock = LockInfo.model_validate_json(snap.lock_line)
        lock_stale = lock is not None and lock.holder.console_id not in by_id
        live.sort(key=lambda p: (p.since, p.console_id))
        return live, stale, lock, lock_stale

    async def view(self) -> PairingView:
        """Who is here and who holds the lock, now. Stale heartbeats are left out, and removed from the host
        (`PRUNE_PER_READ` at most per read: consoles that died leave their file, and whoever reads them
        clears them, a bounded share at a time)."""
        return await self._view_of(await self.snapshot())

    async def _view_of(self, snap: StateSnapshot) -> PairingView:
        live, stale, lock, lock_stale = self.judge(snap)
        await self._prune(stale, lock)
        pending = None
        if snap.pending_line:
            with contextlib.suppress(ValidationError, ValueError):
                pending = PendingRollback.model_validate_json(snap.pending_line)
        return PairingView(
            host=self.runner.host.name,
            now=snap.now,
            presence=live,
            lock=lock,
            lock_stale=lock_stale,
            pending_rollback=pending,
        )

    async def pending_rollback(self) -> PendingRollback | None:
        """The commit-confirmed rollback's record, when one is armed: the read `view` makes, without its
        judgement of the heartbeats and the lock (none parsed, none pruned). What `verify HOST` and a
        scrape need; judging who is here built three more models' schemas (~5 ms of a command's start)."""
        snap = await self.snapshot()
        if snap.pending_line:
            with contextlib.suppress(ValidationError, ValueError):
                return PendingRollback.model_validate_json(snap.pending_line)
        return None

    async def presence(self) -> list[Presence]:
        """The consoles on this host now, oldest first; stale heartbeats are ignored and removed (as by
        `view`, `PRUNE_PER_READ` at most)."""
        snap = await self.snapshot()
        live, stale, lock, _ = self.judge(snap)
        await self._prune(stale, lock)
        return live

    async def _prune(self, stale: dict[str, str], lock: LockInfo | None) -> list[str]:
        """Remove up to `PRUNE_PER_READ` of these stale heartbeats (file → the line judged), each only if
        its file still holds that line; the names removed. The lock holder's heartbeat stays, stale or
        not: breaking the lock re-checks that very line, and the break's entry says when it was last
        heard from. A host where they cannot be removed (a read-only state dir) is still read."""
        if lock is not None:
            stale = {k: v for k, v in stale.items() if k != f"{lock.holder.console_id}.json"}
        if not stale:
            return []
        batch = "".join(f"{name} {line}\n" for name, line in list(stale.items())[:PRUNE_PER_READ])
        try:
            _, lines = await self.runner.run(
                hs.REMOVE_IF_UNCHANGED, what="remove stale heartbeats", input=batch
            )
        except (TransportError, HostStateError):
            return []
        return [line[8:] for line in lines if line.startswith("removed ")]

    async def watch(self, poll_s: float = 2.0) -> AsyncIterator[PairingView]:
        """The view now, then again whenever who is here or the lock changes (polled every `poll_s`).
        A dropped connection only delays the next view: the transport reconnects."""
        last: tuple[object, ...] | None = None
        while True:
            try:
                view = await self.view()
            except (TransportError, HostStateError):
                view = None
            if view is not None and view.signature() != last:
                last = view.signature()
                yield view
            await asyncio.sleep(poll_s)

    async def leave(self) -> None:
        """Remove this console's heartbeat, and its lock if it still holds one."""
        async with self.turns:
            self.left = True
            lock = self.held
            _, lines = await self.runner.run(
                hs.LEAVE, self.me.console_id, lock.info.lock_id if lock else "", what="remove the heartbeat"
            )
        if lock is not None and "released" in lines:
            lock.released = True
            self.held = None
