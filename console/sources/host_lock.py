"""The host's lock, `lock` in its state directory: taken by one console at a time to change the service,
released by it, broken by another only when its holder's heartbeat is stale and an operator confirmed.

A lock is as alive as its holder's heartbeat, so the lock works with the presence board: taking it writes
this console's presence, the board's beat checks it is still ours, and the board's leave releases it.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

from pydantic import ValidationError

from console.core.pairing import BreakRefused, LockHeld, LockInfo, Presence, fmt_span, lock_sentence
from console.sources import hoststate_scripts as hs
from console.sources.audit_trail import AuditTrail
from console.sources.held_lock import Lock
from console.sources.presence_board import PresenceBoard
from console.sources.state_runner import HostStateError, StateRunner
from console.sources.transport import TransportError

__all__ = ["HostLock"]


class HostLock:
    """The lock of one host, taken as the board's console; a break is written to the audit trail."""

    def __init__(self, runner: StateRunner, board: PresenceBoard, audit: AuditTrail) -> None:
        self.runner = runner
        self.board = board
        self.audit = audit

    @property
    def held(self) -> Lock | None:
        """The lock this console holds now, if any (the board keeps it: its beat checks it)."""
        return self.board.held

    async def acquire(self, intent: str) -> Lock:
        """Take the host's lock for `intent` ("apply ctx-200k"), or raise `LockHeld` naming the holder."""
        board, host = self.board, self.runner.host.name
        # Serialised with leave(): a lock taken while the console leaves is known to it by the time it
        # leaves, so leaving releases it; after leaving no lock is taken (nor presence written).
        async with board.turns:
            if board.left:
                raise HostStateError(f"this console has left {host}; it takes no lock there.")
            await self.runner.sync_clock()
            info = LockInfo(
                holder=board.me, intent=intent, taken_at=self.runner.now(), lock_id=uuid.uuid4().hex
            )

            def given_as_cancelled(lines: list[str]) -> None:
                # A lock the host gave is this console's to release: known before the cancellation goes on.
                if "acquired" in lines:
                    board.held = Lock(info=info, locks=self)

            now, lines = await self.runner.run_to_the_end(
                hs.ACQUIRE,
                board.me.console_id,
                board.presence_record().model_dump_json(),
                info.model_dump_json(),
                what="take the lock",
                landed=given_as_cancelled,
            )
            if "acquired" in lines:
                lock = Lock(info=info, locks=self)
                board.held = lock
                return lock
        lock_path = f"{self.runner.path.rstrip('/')}/lock"
        by_hand = "nothing was taken — remove it by hand once nobody is changing the service."
        kind = next((ln[10:] for ln in lines if ln.startswith("lock-kind ")), "")
        if kind:
            raise HostStateError(
                f"the lock path {lock_path} on {host} is not a regular file ({kind}); {by_hand}"
            )
        if "lock-empty" in lines:
            raise HostStateError(
                f"the lock file {lock_path} on {host} is empty, so it is no console's lock; {by_hand}"
            )
        held_line = next((ln[5:] for ln in lines if ln.startswith("held ")), "")
        holder_line = next((ln[7:] for ln in lines if ln.startswith("holder ")), "")
        try:
            held = LockInfo.model_validate_json(held_line)
        except ValidationError:
            raise HostStateError(
                f"the lock file {lock_path} on {host} does not hold a console's lock "
                f"(it is not LockInfo JSON); {by_hand}"
            ) from None
        holder = None
        with contextlib.suppress(ValidationError):
            holder = Presence.model_validate_json(holder_line) if holder_line else None
        stale = holder is None or holder.console_id != held.holder.console_id
        stale = stale or (holder is not None and holder.stale(now, board.stale_factor))
        raise LockHeld(held, stale, host=host, holder=holder, now=now)

    async def release(self, lock: Lock | None = None) -> bool:
        """Release our own lock (never another console's); True when it was ours and is gone."""
        lock = lock or self.board.held
        if lock is None or lock.info.holder.console_id != self.board.me.console_id:
            return False
        _, lines = await self.runner.run(hs.RELEASE, lock.info.lock_id, what="release the lock")
        lock.released = "released" in lines
        if self.board.held is lock:
            self.board.held = None
        return lock.released

    async def break_lock(self, confirm: bool, *, reason: str = "") -> LockInfo:
        """Break the lock of a console whose heartbeat is stale; `confirm` must be True (the operator
        said yes). Records a `lock_break` audit entry. Raises `BreakRefused` with the reason otherwise."""
        host = self.runner.host.name
        snap = await self.board.snapshot()
        _, _, lock, lock_stale = self.board.judge(snap)
        if lock is None:
            raise BreakRefused(f"{host} is not locked; there is nothing to break.")
        holder_line = snap.presence_lines.get(f"{lock.holder.console_id}.json", "")
        seen: Presence | None = None
        if holder_line:
            with contextlib.suppress(ValidationError):
                seen = Presence.model_validate_json(holder_line)
        said = lock_sentence(lock, host, stale=lock_stale, holder=seen, now=snap.now)
        if not lock_stale:
            raise BreakRefused(f"{said}; its console is alive, so the lock cannot be broken.")
        if not confirm:
            raise BreakRefused(f"{said}; breaking it needs an explicit confirmation.")
        age = f", last heard from {fmt_span(seen.age_s(snap.now))} before" if seen is not None else ""
        summary = (
            f"broke {lock.holder.who}'s lock ({lock.intent}, pid {lock.holder.pid}, taken "
            f"{lock.taken_at.astimezone():%H:%M:%S}{age})" + (f": {reason}" if reason else "")
        )
        entry = self.audit.entry("lock_break", outcome="ok", summary=summary)
        _, lines = await self.runner.run(
            hs.BREAK,
            lock.lock_id,
            lock.holder.console_id,
            holder_line,
            entry.to_jsonl(),
            what="break the lock",
        )
        if "broken" not in lines:
            raise BreakRefused(
                f"the lock on {host} changed while it was being broken (its holder came back or "
                "another console broke it first); look again."
            )
        return lock

    @contextlib.asynccontextmanager
    async def locked(self, intent: str, *, leave: bool = False) -> AsyncIterator[Lock]:
        """`async with state.locks.locked("apply ctx-200k") as lock:` holds the lock for the block, beats
        the heartbeat meanwhile (so the lock never looks stale), and releases it on the way out, on an
        exception and on cancellation too. `leave=True` (a command that exits afterwards) also removes
        this console's heartbeat, which taking the lock wrote; an open console keeps beating instead."""
        board = self.board
        try:
            lock = await self.acquire(intent)
        except asyncio.CancelledError:
            # Cancelled while the host took the lock (`acquire` then knows it was given): give it back,
            # and leave, as below. (A refusal, `LockHeld`, keeps the presence: the caller may break a
            # stale lock and take it again as this console.)
            if leave or board.held is not None:
                with contextlib.suppress(TransportError, HostStateError):
                    await asyncio.shield(board.leave() if leave else self.release(board.held))
            raise
        beat = asyncio.get_running_loop().create_task(self._beat_while(lock), name="k26-lock-heartbeat")
        try:
            yield lock
        finally:
            beat.cancel()
            # Shielded: a second cancellation must not leave the lock behind.
            with contextlib.suppress(TransportError, HostStateError):
                await asyncio.shield(board.leave() if leave else self.release(lock))
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([beat])

    async def _beat_while(self, lock: Lock) -> None:
        while not lock.released:
            await asyncio.sleep(self.board.heartbeat_s)
            with contextlib.suppress(TransportError, HostStateError):
                await self.board.heartbeat()
