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

The scripts themselves are in sources/hoststate_scripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pydantic import ValidationError

from console.core.audit import (
    AuditAction,
    AuditEntry,
    AuditLog,
    AuditRecord,
    pair_audit,
    parse_audit,
    parse_audit_line,
)
from console.core.confirm import PendingRollback
from console.core.pairing import (
    DEFAULT_HEARTBEAT_S,
    DEFAULT_STALE_FACTOR,
    BreakRefused,
    Identity,
    LockHeld,
    LockInfo,
    PairingView,
    Presence,
    fmt_span,
    lock_sentence,
)
from console.core.text import split_lines
from console.sources import hoststate_scripts as hs
from console.sources.bounded import CutLine, OutputTooLarge, run_bounded, stream_lines
from console.sources.hosts import HostConfig
from console.sources.transport import CommandResult, ConnState, Transport, TransportError

AUDIT_TAIL_BYTES = 1 << 20
"""How much of the audit trail is read (1 MiB: its last 1,000 to 3,000 changes): a 200 MB trail took `audit
--limit 5` 3.3 GB and 44 s read whole, and a trail linked to /dev/zero never ended. Reading an entry back
costs ~0.1 ms: 1 MiB is ~0.3 s of the console's loop, where it is read when a host's tab opens."""
AUDIT_FOLLOW_LINE_MAX = 64 << 10
"""The longest trail line a follower reads (a console writes them under `AUDIT_LINE_MAX_BYTES`)."""

__all__ = [
    "PRUNE_PER_READ",
    "BreakRefused",
    "HostStateDir",
    "HostStateError",
    "Lock",
    "LockHeld",
    "StateSnapshot",
    "local_identity",
]


PRUNE_PER_READ = 500
"""Stale heartbeat files one read removes at most (one awk compares them, one rm removes them: ~0.1 s of
the host's time for 500). Thousands left by consoles that died go over a few reads, none made slow."""


class HostStateError(Exception):
    """The state directory on the host cannot be used (permissions, a full disk); one sentence."""


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


@dataclass
class Lock:
    """A lock this console holds. `lost` turns True when a heartbeat finds it gone (broken by someone
    who judged this console dead): whoever holds it must stop changing the service."""

    info: LockInfo
    state: HostStateDir
    lost: bool = False
    released: bool = False

    async def release(self) -> bool:
        return await self.state.release(self)


@dataclass
class StateSnapshot:
    """One read of the directory: the lock line and every heartbeat line as found on the host."""

    now: datetime
    lock_line: str | None
    presence_lines: dict[str, str] = field(default_factory=dict)
    pending_line: str | None = None
    """The commit-confirmed rollback's record (`pending-rollback.json`), when one is armed."""


def _host_time(text: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        # A date without %N prints it literally ("1700000000.N"): the whole seconds still count.
        return float(text.split(".")[0])


class HostStateDir:
    """The state directory of one host, over its SSH transport, seen as console `me`."""

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
        self.transport = transport
        self._clock = clock
        self.host = host
        self.me = me or local_identity()
        self.heartbeat_s = heartbeat_s
        self.stale_factor = stale_factor
        self.timeout = timeout
        self.looking_at = ""
        self._since: datetime | None = None
        self._offset: float | None = None
        self._lock: Lock | None = None
        self._presence_lock = asyncio.Lock()
        self._left = False

    @property
    def path(self) -> str:
        return self.host.state_dir

    # ---- clock ---------------------------------------------------------------------------------------

    def now(self) -> datetime:
        """The host's clock as best known (this machine's clock plus the last measured offset)."""
        return datetime.fromtimestamp(self._clock() + (self._offset or 0.0), UTC)

    async def _run(
        self, script: str, *args: str, what: str, input: str | None = None
    ) -> tuple[datetime, list[str]]:
        argv = ["sh", "-c", script, "k26-console-state", self.path, *args]
        t0 = self._clock()
        result = await self.transport.run(argv, timeout=self.timeout, input=input)
        t1 = self._clock()
        # split_lines: "\n" only; Python's general line splitter also breaks at U+2028, U+0085..., which a
        # profile name or summary may hold inside a valid JSON line (it once hid two audit entries).
        lines = split_lines(result.stdout)
        # A login shell's start-up files may print before the script does: skip to its first line.
        start = next((i for i, line in enumerate(lines) if line.startswith("now ")), None)
        if start is None:
            raise HostStateError(self._failure(result, what))
        host_now = _host_time(lines[start][4:])
        self._offset = host_now - (t0 + t1) / 2
        if not result.ok:
            raise HostStateError(self._failure(result, what))
        return datetime.fromtimestamp(host_now, UTC), lines[start + 1 :]

    async def _run_to_the_end(
        self, script: str, *args: str, what: str, landed: Callable[[list[str]], None] | None = None
    ) -> tuple[datetime, list[str]]:
        """`_run`, awaited to its end even when the caller is cancelled meanwhile (the cancellation is
        raised after it, once `landed` has had the script's lines). Cancelling a run closes its channel,
        and the host may kill the script anywhere in it: a heartbeat cut between its write and its `mv`
        left `.<id>.json.<pid>` behind, one that ran on after its console left put back the presence the
        leave had removed. Whatever this console does next on the host (leave, release) must come after
        the write, not beside it."""
        run = asyncio.ensure_future(self._run(script, *args, what=what))
        try:
            return await asyncio.shield(run)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                _, lines = await run
                if landed is not None:
                    landed(lines)
            raise

    def _failure(self, result: CommandResult, what: str) -> str:
        return f"cannot {what} in {self.path} on {self.host.name}: {result.first_error_line().rstrip('.')}."

    async def _sync_clock(self) -> None:
        if self._offset is None:
            await self._run(hs.READ_PROLOGUE, what="read the clock")

    # ---- presence ------------------------------------------------------------------------------------

    def _presence(self) -> Presence:
        now = self.now()
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
        async with self._presence_lock:
            # Leaving is final: a console leaves, then exits, and its heartbeat task runs until the exit
            # cancels it. A beat under way as it leaves finishes first; one due after it writes nothing
            # (it would put back the presence leaving removed, for others to see go stale).
            if self._left:
                return
            await self._sync_clock()
            lock = self._lock
            args = [self.me.console_id, self._presence().model_dump_json()]
            if lock is not None:
                args.append(lock.info.lock_id)
            _, lines = await self._run_to_the_end(hs.HEARTBEAT, *args, what="write the heartbeat")
        if lock is not None and "lock lost" in lines and self._lock is lock:
            lock.lost = True

    async def snapshot(self) -> StateSnapshot:
        now, lines = await self._run(hs.READ_STATE, what="read presence and the lock")
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

    def _judge(self, snap: StateSnapshot) -> tuple[list[Presence], dict[str, str], LockInfo | None, bool]:
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
        snap = await self.snapshot()
        live, stale, lock, lock_stale = self._judge(snap)
        await self._prune(stale, lock)
        pending = None
        if snap.pending_line:
            with contextlib.suppress(ValidationError, ValueError):
                pending = PendingRollback.model_validate_json(snap.pending_line)
        return PairingView(
            host=self.host.name,
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

    # ---- files of other features (the commit-confirmed rollback's record and script) -----------------

    async def absolute_path(self) -> str:
        _, lines = await self._run(hs.WHERE, what="find the state directory")
        return next((line[4:] for line in lines if line.startswith("dir ")), self.path)

    async def put_file(self, name: str, text: str, mode: str = "600") -> str:
        """Write `name` in the state directory atomically; its absolute path on the host."""
        await self._run(hs.PUT_FILE, name, text, mode, what=f"write {name}")
        return f"{await self.absolute_path()}/{name}"

    async def remove_file(self, name: str) -> None:
        await self._run(hs.REMOVE_FILE, name, what=f"remove {name}")

    async def presence(self) -> list[Presence]:
        """The consoles on this host now, oldest first; stale heartbeats are ignored and removed (as by
        `view`, `PRUNE_PER_READ` at most)."""
        snap = await self.snapshot()
        live, stale, lock, _ = self._judge(snap)
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
            _, lines = await self._run(hs.REMOVE_IF_UNCHANGED, what="remove stale heartbeats", input=batch)
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

    async def keep_alive(self, looking_at: str | None = None) -> None:
        """Heartbeat every `heartbeat_s` until cancelled (run it as a task or a Textual worker)."""
        if looking_at is not None:
            self.looking_at = looking_at
        while True:
            with contextlib.suppress(TransportError, HostStateError):
                await self.heartbeat()
            await asyncio.sleep(self.heartbeat_s)

    async def leave(self) -> None:
        """Remove this console's heartbeat, and its lock if it still holds one."""
        async with self._presence_lock:
            self._left = True
            lock = self._lock
            _, lines = await self._run(
                hs.LEAVE, self.me.console_id, lock.info.lock_id if lock else "", what="remove the heartbeat"
            )
        if lock is not None and "released" in lines:
            lock.released = True
            self._lock = None

    # ---- the lock ------------------------------------------------------------------------------------

    async def acquire(self, intent: str) -> Lock:
        """Take the host's lock for `intent` ("apply ctx-200k"), or raise `LockHeld` naming the holder."""
        # Serialised with leave(): a lock taken while the console leaves is known to it by the time it
        # leaves, so leaving releases it; after leaving no lock is taken (nor presence written).
        async with self._presence_lock:
            if self._left:
                raise HostStateError(f"this console has left {self.host.name}; it takes no lock there.")
            await self._sync_clock()
            info = LockInfo(holder=self.me, intent=intent, taken_at=self.now(), lock_id=uuid.uuid4().hex)

            def given_as_cancelled(lines: list[str]) -> None:
                # A lock the host gave is this console's to release: known before the cancellation goes on.
                if "acquired" in lines:
                    self._lock = Lock(info=info, state=self)

            now, lines = await self._run_to_the_end(
                hs.ACQUIRE,
                self.me.console_id,
                self._presence().model_dump_json(),
                info.model_dump_json(),
                what="take the lock",
                landed=given_as_cancelled,
            )
            if "acquired" in lines:
                lock = Lock(info=info, state=self)
                self._lock = lock
                return lock
        lock_path = f"{self.path.rstrip('/')}/lock"
        by_hand = "nothing was taken — remove it by hand once nobody is changing the service."
        kind = next((ln[10:] for ln in lines if ln.startswith("lock-kind ")), "")
        if kind:
            raise HostStateError(
                f"the lock path {lock_path} on {self.host.name} is not a regular file ({kind}); {by_hand}"
            )
        if "lock-empty" in lines:
            raise HostStateError(
                f"the lock file {lock_path} on {self.host.name} is empty, so it is no console's lock; {by_hand}"
            )
        held_line = next((ln[5:] for ln in lines if ln.startswith("held ")), "")
        holder_line = next((ln[7:] for ln in lines if ln.startswith("holder ")), "")
        try:
            held = LockInfo.model_validate_json(held_line)
        except ValidationError:
            raise HostStateError(
                f"the lock file {lock_path} on {self.host.name} does not hold a console's lock "
                f"(it is not LockInfo JSON); {by_hand}"
            ) from None
        holder = None
        with contextlib.suppress(ValidationError):
            holder = Presence.model_validate_json(holder_line) if holder_line else None
        stale = holder is None or holder.console_id != held.holder.console_id
        stale = stale or (holder is not None and holder.stale(now, self.stale_factor))
        raise LockHeld(held, stale, host=self.host.name, holder=holder, now=now)

    async def release(self, lock: Lock | None = None) -> bool:
        """Release our own lock (never another console's); True when it was ours and is gone."""
        lock = lock or self._lock
        if lock is None or lock.info.holder.console_id != self.me.console_id:
            return False
        _, lines = await self._run(hs.RELEASE, lock.info.lock_id, what="release the lock")
        lock.released = "released" in lines
        if self._lock is lock:
            self._lock = None
        return lock.released

    async def break_lock(self, confirm: bool, *, reason: str = "") -> LockInfo:
        """Break the lock of a console whose heartbeat is stale; `confirm` must be True (the operator
        said yes). Records a `lock_break` audit entry. Raises `BreakRefused` with the reason otherwise."""
        snap = await self.snapshot()
        _, _, lock, lock_stale = self._judge(snap)
        if lock is None:
            raise BreakRefused(f"{self.host.name} is not locked; there is nothing to break.")
        holder_line = snap.presence_lines.get(f"{lock.holder.console_id}.json", "")
        seen: Presence | None = None
        if holder_line:
            with contextlib.suppress(ValidationError):
                seen = Presence.model_validate_json(holder_line)
        said = lock_sentence(lock, self.host.name, stale=lock_stale, holder=seen, now=snap.now)
        if not lock_stale:
            raise BreakRefused(f"{said}; its console is alive, so the lock cannot be broken.")
        if not confirm:
            raise BreakRefused(f"{said}; breaking it needs an explicit confirmation.")
        age = f", last heard from {fmt_span(seen.age_s(snap.now))} before" if seen is not None else ""
        summary = (
            f"broke {lock.holder.who}'s lock ({lock.intent}, pid {lock.holder.pid}, taken "
            f"{lock.taken_at.astimezone():%H:%M:%S}{age})" + (f": {reason}" if reason else "")
        )
        entry = self.audit_entry("lock_break", outcome="ok", summary=summary)
        _, lines = await self._run(
            hs.BREAK,
            lock.lock_id,
            lock.holder.console_id,
            holder_line,
            entry.to_jsonl(),
            what="break the lock",
        )
        if "broken" not in lines:
            raise BreakRefused(
                f"the lock on {self.host.name} changed while it was being broken (its holder came back or "
                "another console broke it first); look again."
            )
        return lock

    @contextlib.asynccontextmanager
    async def locked(self, intent: str, *, leave: bool = False) -> AsyncIterator[Lock]:
        """`async with state.locked("apply ctx-200k") as lock:` holds the lock for the block, beats
        the heartbeat meanwhile (so the lock never looks stale), and releases it on the way out, on an
        exception and on cancellation too. `leave=True` (a command that exits afterwards) also removes
        this console's heartbeat, which taking the lock wrote; an open console keeps beating instead."""
        try:
            lock = await self.acquire(intent)
        except asyncio.CancelledError:
            # Cancelled while the host took the lock (`acquire` then knows it was given): give it back,
            # and leave, as below. (A refusal, `LockHeld`, keeps the presence: the caller may break a
            # stale lock and take it again as this console.)
            if leave or self._lock is not None:
                with contextlib.suppress(TransportError, HostStateError):
                    await asyncio.shield(self.leave() if leave else self.release(self._lock))
            raise
        beat = asyncio.get_running_loop().create_task(self._beat_while(lock), name="k26-lock-heartbeat")
        try:
            yield lock
        finally:
            beat.cancel()
            # Shielded: a second cancellation must not leave the lock behind.
            with contextlib.suppress(TransportError, HostStateError):
                await asyncio.shield(self.leave() if leave else self.release(lock))
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([beat])

    async def _beat_while(self, lock: Lock) -> None:
        while not lock.released:
            await asyncio.sleep(self.heartbeat_s)
            with contextlib.suppress(TransportError, HostStateError):
                await self.heartbeat()

    # ---- the audit trail -----------------------------------------------------------------------------

    def audit_entry(self, action: AuditAction, **fields: object) -> AuditEntry:
        """An entry by this console, on this host, stamped with the host's clock."""
        return AuditEntry.by(self.me, ts=self.now(), host=self.host.name, action=action, **fields)

    async def append_audit(self, entry: AuditEntry) -> None:
        await self._sync_clock()
        await self._run(hs.APPEND, entry.to_jsonl(), what="append to audit.jsonl")

    audit_cut: str | None = None
    """What the last read of the trail left out, in one sentence (None when it read all of it)."""

    async def read_audit_log(self, *, tail_bytes: int = AUDIT_TAIL_BYTES) -> AuditLog:
        """The trail's last `tail_bytes` (all of a trail that size or less), oldest first, with the count
        of unreadable lines skipped; `lines` counts the whole file's (a follower resumes after them).

        Bounded however the host answers: a trail that is not a regular file is refused by the host's
        script, what it prints is read up to the tail's size (`run_bounded`), within `timeout`. A longer
        trail's older entries are left out, and `audit_cut` says so."""
        argv = ["sh", "-c", hs.READ_AUDIT, "k26-console-state", self.path, str(tail_bytes)]
        try:
            result = await run_bounded(self.transport, argv, limit=tail_bytes + 4096, timeout=self.timeout)
        except OutputTooLarge as exc:
            raise HostStateError(
                f"cannot read audit.jsonl in {self.path} on {self.host.name}: the host sent more than "
                f"{exc.limit:,} characters for its last {tail_bytes:,} bytes."
            ) from None
        lines = split_lines(result.stdout)
        start = next((i for i, line in enumerate(lines) if line.startswith("now ")), None)
        head = lines[start + 1].split() if start is not None and start + 1 < len(lines) else []
        if not result.ok or len(head) != 3 or head[0] != "trail" or not (head[1] + head[2]).isdigit():
            raise HostStateError(self._failure(result, "read audit.jsonl"))
        assert start is not None
        total, size = int(head[1]), int(head[2])
        body = lines[start + 2 :]
        self.audit_cut = None
        if size > tail_bytes:
            body = body[1:]  # the tail begins inside a line
            self.audit_cut = (
                f"audit.jsonl in {self.path} on {self.host.name} holds {size:,} bytes: its last "
                f"{tail_bytes:,} were read ({len(body):,} of its {total:,} lines), the older ones left out."
            )
        log = parse_audit(body)
        return log.model_copy(update={"lines": total})

    async def read_audit_records(self) -> tuple[AuditLog, list[AuditRecord], PairingView | None]:
        """The whole trail, and the same paired into operations (an intent with its outcome; an intent
        without one judged against who holds the lock now). Reads only: nothing is written."""
        log = await self.read_audit_log()
        view: PairingView | None = None
        if any(e.outcome == "started" for e in log.entries):
            with contextlib.suppress(TransportError, HostStateError):
                view = await self.view()
        return log, pair_audit(log.entries, view), view

    async def read_audit(self) -> list[AuditEntry]:
        return (await self.read_audit_log()).entries

    async def follow_audit(self, *, after_line: int | None = None) -> AsyncIterator[AuditEntry]:
        """Entries as they are appended. `after_line=None` starts at the end (only new entries); an
        integer N replays from line N+1 (0: the whole trail, then new ones, with no gap between). A
        dropped connection resumes after the last line seen; the iterator ends when the transport is
        closed."""
        if after_line is None:
            after_line = (await self.read_audit_log()).lines
        seen = after_line
        while True:
            try:
                async with self.transport.stream(
                    ["sh", "-c", hs.FOLLOW_AUDIT, "k26-console-follow", self.path, str(seen + 1)],
                    timeout=self.timeout,
                ) as stream:
                    got = False
                    async for chunk in stream_lines(stream, AUDIT_FOLLOW_LINE_MAX):
                        for raw in chunk:
                            got = True
                            seen += 1
                            if type(raw) is CutLine:
                                continue  # no entry this console writes is near this long
                            entry = parse_audit_line(raw.decode("utf-8", "replace"))
                            if entry is not None:
                                yield entry
                    status = await stream.wait(1.0)
                    if not got and status not in (None, 0) and self.transport.connection is not None:
                        # tail itself failed (no -F, an unreadable file): retrying would not help
                        reason = (await stream.stderr_text()).strip().split("\n") or [f"exit {status}"]
                        raise HostStateError(
                            f"cannot follow audit.jsonl in {self.path} on {self.host.name}: "
                            f"{reason[-1].rstrip('.')}."
                        )
            except TransportError:
                pass
            if self.transport.status.state is ConnState.CLOSED:
                return
            await asyncio.sleep(0.5)
