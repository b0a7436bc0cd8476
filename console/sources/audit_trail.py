"""A host's audit trail, `audit.jsonl` in its state directory: entries stamped with the host's clock,
appended one line per write, read back bounded to its tail, followed with `tail -F`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from console.core.audit import (
    AuditAction,
    AuditEntry,
    AuditLog,
    AuditRecord,
    pair_audit,
    parse_audit,
    parse_audit_line,
)
from console.core.pairing import Identity, PairingView
from console.core.text import split_lines
from console.sources import hoststate_scripts as hs
from console.sources.bounded import CutLine, OutputTooLarge, run_bounded, stream_lines
from console.sources.presence_board import PresenceBoard
from console.sources.state_runner import HostStateError, StateRunner
from console.sources.transport import ConnState, TransportError

__all__ = ["AUDIT_FOLLOW_LINE_MAX", "AUDIT_TAIL_BYTES", "AuditTrail"]

AUDIT_TAIL_BYTES = 1 << 20
"""How much of the audit trail is read (1 MiB: its last 1,000 to 3,000 changes): a 200 MB trail took `audit
--limit 5` 3.3 GB and 44 s read whole, and a trail linked to /dev/zero never ended. Reading an entry back
costs ~0.1 ms: 1 MiB is ~0.3 s of the console's loop, where it is read when a host's tab opens."""
AUDIT_FOLLOW_LINE_MAX = 64 << 10
"""The longest trail line a follower reads (a console writes them under `AUDIT_LINE_MAX_BYTES`)."""


class AuditTrail:
    """The audit trail of one host, written as console `me`. The board is read to pair an intent
    without its outcome against who holds the lock now (`read_records`)."""

    def __init__(self, runner: StateRunner, me: Identity, board: PresenceBoard) -> None:
        self.runner = runner
        self.me = me
        self.board = board
        self.cut: str | None = None
        """What the last read of the trail left out, in one sentence (None when it read all of it)."""

    def entry(self, action: AuditAction, **fields: object) -> AuditEntry:
        """An entry by this console, on this host, stamped with the host's clock."""
        return AuditEntry.by(
            self.me, ts=self.runner.now(), host=self.runner.host.name, action=action, **fields
        )

    async def append(self, entry: AuditEntry) -> None:
        await self.runner.sync_clock()
        await self.runner.run(hs.APPEND, entry.to_jsonl(), what="append to audit.jsonl")

    async def read_log(self, *, tail_bytes: int = AUDIT_TAIL_BYTES) -> AuditLog:
        """The trail's last `tail_bytes` (all of a trail that size or less), oldest first, with the count
        of unreadable lines skipped; `lines` counts the whole file's (a follower resumes after them).

        Bounded however the host answers: a trail that is not a regular file is refused by the host's
        script, what it prints is read up to the tail's size (`run_bounded`), within `timeout`. A longer
        trail's older entries are left out, and `cut` says so."""
        runner = self.runner
        path, host = runner.path, runner.host.name
        argv = ["sh", "-c", hs.READ_AUDIT, "k26-console-state", path, str(tail_bytes)]
        try:
            result = await run_bounded(
                runner.transport, argv, limit=tail_bytes + 4096, timeout=runner.timeout
            )
        except OutputTooLarge as exc:
            raise HostStateError(
                f"cannot read audit.jsonl in {path} on {host}: the host sent more than "
                f"{exc.limit:,} characters for its last {tail_bytes:,} bytes."
            ) from None
        lines = split_lines(result.stdout)
        start = next((i for i, line in enumerate(lines) if line.startswith("now ")), None)
        head = lines[start + 1].split() if start is not None and start + 1 < len(lines) else []
        if not result.ok or len(head) != 3 or head[0] != "trail" or not (head[1] + head[2]).isdigit():
            raise HostStateError(runner.failure(result, "read audit.jsonl"))
        assert start is not None
        total, size = int(head[1]), int(head[2])
        body = lines[start + 2 :]
        self.cut = None
        if size > tail_bytes:
            body = body[1:]  # the tail begins inside a line
            self.cut = (
                f"audit.jsonl in {path} on {host} holds {size:,} bytes: its last "
                f"{tail_bytes:,} were read ({len(body):,} of its {total:,} lines), the older ones left out."
            )
        log = parse_audit(body)
        return log.model_copy(update={"lines": total})

    async def read_records(self) -> tuple[AuditLog, list[AuditRecord], PairingView | None]:
        """The whole trail, and the same paired into operations (an intent with its outcome; an intent
        without one judged against who holds the lock now). Reads only: nothing is written."""
        log = await self.read_log()
        view: PairingView | None = None
        if any(e.outcome == "started" for e in log.entries):
            with contextlib.suppress(TransportError, HostStateError):
                view = await self.board.view()
        return log, pair_audit(log.entries, view), view

    async def read(self) -> list[AuditEntry]:
        return (await self.read_log()).entries

    async def follow(self, *, after_line: int | None = None) -> AsyncIterator[AuditEntry]:
        """Entries as they are appended. `after_line=None` starts at the end (only new entries); an
        integer N replays from line N+1 (0: the whole trail, then new ones, with no gap between). A
        dropped connection resumes after the last line seen; the iterator ends when the transport is
        closed."""
        if after_line is None:
            after_line = (await self.read_log()).lines
        seen = after_line
        transport = self.runner.transport
        path, host = self.runner.path, self.runner.host.name
        while True:
            try:
                async with transport.stream(
                    ["sh", "-c", hs.FOLLOW_AUDIT, "k26-console-follow", path, str(seen + 1)],
                    timeout=self.runner.timeout,
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
                    if not got and status not in (None, 0) and transport.connection is not None:
                        # tail itself failed (no -F, an unreadable file): retrying would not help
                        reason = (await stream.stderr_text()).strip().split("\n") or [f"exit {status}"]
                        raise HostStateError(
                            f"cannot follow audit.jsonl in {path} on {host}: {reason[-1].rstrip('.')}."
                        )
            except TransportError:
                pass
            if transport.status.state is ConnState.CLOSED:
                return
            await asyncio.sleep(0.5)
