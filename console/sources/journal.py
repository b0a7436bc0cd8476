"""Follow a unit's journal over SSH, resuming from the last cursor after any drop.

The command is the one an operator would type:

    journalctl -u UNIT -o json --all --no-pager -f -n all --after-cursor CURSOR

Two flags go beyond the obvious form, both for completeness of the stream:
- `-n all`: with `-f`, journalctl shows only the last 10 entries after `--cursor`/`--after-cursor`
  unless told otherwise (systemd 252, measured), which would silently skip lines after a drop.
- `--all`: `-o json` prints fields over 4 KiB as null unless `--all` is given; SGLang's `server_args=`
  line is longer than that.

First start (no cursor yet): the current invocation of the unit, bounded to its last `backlog` entries
(`systemctl show --property=InvocationID` then `journalctl _SYSTEMD_INVOCATION_ID=ID + INVOCATION_ID=ID`
to find where it begins); when the unit has no current invocation (stopped, failed) or systemctl cannot
say, the unit's last `backlog` entries — which show how the last run ended.

The follower keeps the cursor of the last entry it read and restarts journalctl with `--after-cursor`
after a drop, so no entry is lost or read twice. Entries go into a bounded queue; when the consumer lags
the queue fills and the follower stops reading, which stops the SSH channel's window and, in turn, the
remote journalctl: memory stays bounded and nothing is dropped. The consumer takes everything waiting at
once (`next_batch`), so a slow consumer gets big batches rather than a growing backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Any

from console.core.events import Event
from console.core.parser import JournalParser
from console.core.parsing.journal_json import ENTRY_MAX_BYTES, cut_entry, load_json
from console.core.source_status import FollowerStatus, FollowState
from console.sources.bounded import CutLine, stream_lines
from console.sources.transport import Transport, TransportError

JournalEntry = dict[str, Any]

QUEUE_MAX_BYTES = 64 << 20
"""The most the follower holds for a consumer that lags (64 MiB of entries' lines; a busy journal's second
is ~2 MB): past it it stops reading, as it does at `queue_max` entries."""

ENTRY_TAIL_BYTES = 64 << 10
"""The last bytes kept of an entry over `ENTRY_MAX_BYTES`: where its cursor is when journalctl printed
it after the huge field."""


def read_entry(line: bytes) -> JournalEntry | None:
    """One `journalctl -o json` line read from a host: the entry, the one `cut_entry` makes of a line
    over `ENTRY_MAX_BYTES` (its cursor, metadata and the start of its MESSAGE, with a sentence saying
    what was cut), or None when it is no entry."""
    if type(line) is CutLine:
        return cut_entry(bytes(line), line.tail, line.size, ENTRY_MAX_BYTES)
    entry = load_json(line)  # orjson: this is most of a busy journal's reading cost
    return entry if isinstance(entry, dict) else None


_INVOCATION_ID = re.compile(r"^[0-9a-f]{32}$")


def follow_argv(
    unit: str,
    *,
    cursor: str | None = None,
    start_cursor: str | None = None,
    backlog: int = 5000,
    journalctl: Sequence[str] = ("journalctl",),
) -> list[str]:
    argv = [*journalctl, "-u", unit, "-o", "json", "--all", "--no-pager", "-f"]
    if cursor is not None:
        return [*argv, "-n", "all", "--after-cursor", cursor]
    if start_cursor is not None:
        return [*argv, "-n", "all", "--cursor", start_cursor]
    return [*argv, "-n", str(backlog)]


class JournalFollower:
    """`journalctl -f` for one unit over a `Transport`, as a stream of entry batches.

    `start()` runs the follower in the background; `next_batch()` / `batches()` hand out the entries
    (the dicts journalctl printed, `__CURSOR` included) in journal order, each exactly once.
    """

    def __init__(
        self,
        transport: Transport,
        unit: str,
        *,
        cursor: str | None = None,
        backlog: int = 5000,
        queue_max: int = 4096,
        queue_max_bytes: int = QUEUE_MAX_BYTES,
        batch_max: int = 4096,
        journalctl: Sequence[str] = ("journalctl",),
        systemctl: Sequence[str] = ("systemctl",),
        scope_to_invocation: bool = True,
        restart_delay_s: float = 1.0,
    ) -> None:
        self.transport = transport
        self.unit = unit
        self.backlog = backlog
        self.batch_max = batch_max
        self.journalctl = tuple(journalctl)
        self.systemctl = tuple(systemctl)
        self.scope_to_invocation = scope_to_invocation
        self.restart_delay_s = restart_delay_s
        self._queue: asyncio.Queue[JournalEntry] = asyncio.Queue(maxsize=queue_max)
        # The queue is bounded in bytes too (4,096 entries of up to 1 MiB would be 4 GiB): the size of
        # each queued entry's line, in queue order, and their sum.
        self.queue_max_bytes = queue_max_bytes
        self._sizes: deque[int] = deque()
        self._queued_bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        self._status = FollowerStatus(cursor=cursor)
        # Moved per entry as plain attributes (a pydantic copy per journal line was a few percent of
        # a core at 2,000 lines/s); `status` folds them in when it is read.
        self._cursor = cursor
        self._entries = 0
        self._skipped = 0
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    # ---- state -------------------------------------------------------------------------------------

    @property
    def status(self) -> FollowerStatus:
        s = self._status
        if (s.cursor, s.entries, s.skipped) != (self._cursor, self._entries, self._skipped):
            s = self._status = s.model_copy(
                update={"cursor": self._cursor, "entries": self._entries, "skipped": self._skipped}
            )
        return s

    @property
    def cursor(self) -> str | None:
        return self._cursor

    def _update(self, **fields: Any) -> None:
        self._status = self.status.model_copy(update=fields)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def changed(self) -> FollowerStatus:
        """Wait for the next status change (state, detail, restarts — not every entry)."""
        await self._changed.wait()
        return self.status

    # ---- consumer side -------------------------------------------------------------------------------

    async def next_batch(self, max_items: int | None = None) -> list[JournalEntry]:
        """Every entry waiting (at least one; waits for it), oldest first."""
        limit = max_items or self.batch_max
        batch = [await self._queue.get()]
        while len(batch) < limit:
            try:
                batch.append(self._queue.get_nowait())
            except asyncio.QueueEmpty:
                break
        for _ in range(min(len(batch), len(self._sizes))):
            self._queued_bytes -= self._sizes.popleft()
        if self._queued_bytes <= self.queue_max_bytes:
            self._room.set()
        return batch

    async def batches(self) -> AsyncIterator[list[JournalEntry]]:
        while True:
            yield await self.next_batch()

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    # ---- producer side -------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"journal-{self.transport.host.name}"
            )

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        self._update(state=FollowState.STOPPED)

    async def _invocation_start(self) -> str | None:
        """The cursor where the unit's current invocation begins (within the backlog), or None."""
        result = await self.transport.run(
            [*self.systemctl, "show", "--property=InvocationID", "--value", self.unit], timeout=15
        )
        invocation = result.stdout.strip()
        if not result.ok or not _INVOCATION_ID.match(invocation):
            return None
        argv = [
            *self.journalctl,
            f"_SYSTEMD_INVOCATION_ID={invocation}",
            "+",
            f"INVOCATION_ID={invocation}",
            "-o",
            "json",
            "--no-pager",
            "-n",
            str(self.backlog),
        ]
        # Only the first line is needed; closing the channel after it stops journalctl.
        async with self.transport.stream(argv, timeout=15) as stream:
            async with asyncio.timeout(15):
                line = await stream.readline()
        entry = load_json(line)
        cursor = entry.get("__CURSOR") if isinstance(entry, dict) else None
        if isinstance(cursor, str) and cursor:
            return cursor
        return None

    async def _run(self) -> None:
        first = True
        while True:
            try:
                await self.transport.wait_up()
            except TransportError as exc:
                # The transport gave up (a refused host key, bad credentials): nothing to resume.
                self._update(state=FollowState.FAILED, detail=str(exc))
                return
            try:
                start_cursor = None
                if self.cursor is None and self.scope_to_invocation:
                    with contextlib.suppress(TransportError, TimeoutError):
                        start_cursor = await self._invocation_start()
                argv = follow_argv(
                    self.unit,
                    cursor=self.cursor,
                    start_cursor=start_cursor,
                    backlog=self.backlog,
                    journalctl=self.journalctl,
                )
                if not first:
                    self._update(restarts=self._status.restarts + 1)
                first = False
                ended = await self._follow(argv)
            except TransportError as exc:
                self._update(state=FollowState.WAITING, detail=str(exc))
                # The transport's supervisor is reconnecting; wait_up() above waits for it.
                await asyncio.sleep(0.05)
                continue
            # journalctl ended on its own (a drop that closed the channel cleanly, or an error such as
            # a missing journal): say why, pause, and resume from the cursor.
            self._update(state=FollowState.WAITING, detail=ended)
            await asyncio.sleep(self.restart_delay_s if ended else 0.05)

    async def _follow(self, argv: list[str]) -> str | None:
        """Read one journalctl run to its end; returns why it ended when that was an error."""
        async with self.transport.stream(argv) as stream:
            self._update(state=FollowState.FOLLOWING, detail=None)
            async for lines in stream_lines(stream, ENTRY_MAX_BYTES, tail=ENTRY_TAIL_BYTES):
                for line in lines:
                    entry = read_entry(line)
                    cursor = entry.get("__CURSOR") if entry is not None else None
                    if entry is None or not isinstance(cursor, str):
                        self._skipped += 1
                        continue
                    while self._queued_bytes > self.queue_max_bytes:
                        # the consumer lags by more than the bound: stop reading (the channel's window
                        # then stops journalctl) until it has taken some
                        self._room.clear()
                        await self._room.wait()
                    await self._queue.put(entry)
                    self._sizes.append(len(line))
                    self._queued_bytes += len(line)
                    # The cursor moves only once the entry is safely queued: a drop before this point
                    # makes the next run print the entry again, a drop after it does not.
                    self._cursor = cursor
                    self._entries += 1
                    if not self._entries % 256:
                        # a chunk holds many entries, handed out without yielding: let a key in now and then
                        await asyncio.sleep(0)
            status = await stream.wait(2.0)
            if status not in (0, None):
                text = (await stream.stderr_text()).strip().split("\n")
                return f"journalctl exited with status {status}" + (f": {text[0]}" if text[0] else "")
            return None


JOURNAL_READ_MAX_BYTES = 256 << 20
"""The most of a unit's journal `read_unit_journal` keeps (256 MiB of JSON lines, ~100,000 busy SGLang
entries): past it the oldest entries go (a verdict is on the latest boot, at the end)."""


async def read_unit_journal(
    transport: Transport,
    unit: str,
    *,
    lines: int = 50_000,
    journalctl: Sequence[str] = ("journalctl",),
    timeout: float = 120.0,
    max_bytes: int = JOURNAL_READ_MAX_BYTES,
) -> list[str]:
    """The unit's last `lines` journal entries as `journalctl -o json` lines (what `journalctl -u UNIT
    -o json > saved.journal` would hold, bounded), for one-shot commands such as `verify HOST`.

    Read as the follower reads (`read_entry`): an entry over `ENTRY_MAX_BYTES` is cut, with a sentence in
    its MESSAGE; past `max_bytes` in all the oldest entries are dropped; past `timeout` seconds the read
    is a `TransportError`. Lines are split on "\\n" only: journalctl ends an entry there, while a message
    may hold "\\r" (a tqdm frame), U+2028 or \\x85, at which str.splitlines would cut one entry into
    pieces that parse as nothing."""
    argv = [*journalctl, "-u", unit, "-o", "json", "--all", "--no-pager", "-n", str(lines)]
    kept: deque[str] = deque()
    size = 0
    try:
        async with asyncio.timeout(timeout):
            async with transport.stream(argv, timeout=timeout) as stream:
                async for chunk in stream_lines(stream, ENTRY_MAX_BYTES, tail=ENTRY_TAIL_BYTES):
                    for line in chunk:
                        if type(line) is CutLine:
                            entry = read_entry(line)
                            if entry is None:
                                continue
                            text = json.dumps(entry, ensure_ascii=False)
                        else:
                            text = line.decode("utf-8", "replace")
                            if not text.strip():
                                continue
                        kept.append(text)
                        size += len(text)
                        while size > max_bytes and len(kept) > 1:
                            size -= len(kept.popleft())
                status = await stream.wait(5.0)
                if status is None:
                    raise TransportError(
                        f"{transport.host.name}: lost the connection while running {argv[0]}"
                    )
                if status != 0:
                    error = (await stream.stderr_text()).strip().split("\n")[0]
                    raise TransportError(
                        f"journalctl on {transport.host.name} failed with status {status}"
                        + (f": {error}" if error else "")
                    )
    except TimeoutError:
        raise TransportError(
            f"journalctl on {transport.host.name} did not finish within {timeout:g} s"
        ) from None
    return list(kept)


async def follow_unit_events(
    transport: Transport,
    unit: str,
    *,
    backlog: int = 5000,
    host: str | None = None,
    idle_flush_s: float = 1.0,
) -> AsyncIterator[list[Event]]:
    """Parsed events of a unit's journal, live, batch by batch (`parse HOST --follow`). Resumes from its
    cursor across drops like the session does; ends only when the transport fails for good."""
    follower = JournalFollower(transport, unit, backlog=backlog)
    parser = JournalParser(host=host)
    follower.start()
    try:
        while True:
            if follower.status.state is FollowState.FAILED:
                raise TransportError(follower.status.detail or f"cannot follow the journal of {unit}")
            try:
                async with asyncio.timeout(idle_flush_s):
                    batch = await follower.next_batch()
            except TimeoutError:
                held = parser.flush()
                if held:
                    yield held
                continue
            events = parser.feed_many(batch)
            if events:
                yield events
    finally:
        await follower.close()
