"""What every part of a host's state directory runs its scripts through: one transport, one host clock.

Every script prints the host's clock first; the runner measures the offset from this machine's clock at
each run, and every part (presence, the lock, the audit trail, the state files) stamps what it writes
with `now()`, so staleness is judged on one clock whichever part measured it last.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from datetime import UTC, datetime

from console.core.text import split_lines
from console.sources import hoststate_scripts as hs
from console.sources.hosts import HostConfig
from console.sources.transport import CommandResult, Transport

__all__ = ["HostStateError", "StateRunner"]


class HostStateError(Exception):
    """The state directory on the host cannot be used (permissions, a full disk); one sentence."""


def _host_time(text: str) -> float:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        # A date without %N prints it literally ("1700000000.N"): the whole seconds still count.
        return float(text.split(".")[0])


class StateRunner:
    """Runs the state directory's scripts on one host and keeps the host's clock offset they measure."""

    def __init__(
        self,
        transport: Transport,
        host: HostConfig,
        *,
        timeout: float = 15.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`clock` is this machine's clock (tests pass a wrong one: what is written must not care)."""
        self.transport = transport
        self.host = host
        self.timeout = timeout
        self.clock = clock
        self.offset: float | None = None
        """The host's clock minus this machine's, as the last run measured it (None before any run)."""

    @property
    def path(self) -> str:
        return self.host.state_dir

    def now(self) -> datetime:
        """The host's clock as best known (this machine's clock plus the last measured offset)."""
        return datetime.fromtimestamp(self.clock() + (self.offset or 0.0), UTC)

    async def run(
        self, script: str, *args: str, what: str, input: str | None = None
    ) -> tuple[datetime, list[str]]:
        argv = ["sh", "-c", script, "k26-console-state", self.path, *args]
        t0 = self.clock()
        result = await self.transport.run(argv, timeout=self.timeout, input=input)
        t1 = self.clock()
        # split_lines: "\n" only; Python's general line splitter also breaks at U+2028, U+0085..., which a
        # profile name or summary may hold inside a valid JSON line (it once hid two audit entries).
        lines = split_lines(result.stdout)
        # A login shell's start-up files may print before the script does: skip to its first line.
        start = next((i for i, line in enumerate(lines) if line.startswith("now ")), None)
        if start is None:
            raise HostStateError(self.failure(result, what))
        host_now = _host_time(lines[start][4:])
        self.offset = host_now - (t0 + t1) / 2
        if not result.ok:
            raise HostStateError(self.failure(result, what))
        return datetime.fromtimestamp(host_now, UTC), lines[start + 1 :]

    async def run_to_the_end(
        self, script: str, *args: str, what: str, landed: Callable[[list[str]], None] | None = None
    ) -> tuple[datetime, list[str]]:
        """`run`, awaited to its end even when the caller is cancelled meanwhile (the cancellation is
        raised after it, once `landed` has had the script's lines). Cancelling a run closes its channel,
        and the host may kill the script anywhere in it: a heartbeat cut between its write and its `mv`
        left `.<id>.json.<pid>` behind, one that ran on after its console left put back the presence the
        leave had removed. Whatever this console does next on the host (leave, release) must come after
        the write, not beside it."""
        run = asyncio.ensure_future(self.run(script, *args, what=what))
        try:
            return await asyncio.shield(run)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                _, lines = await run
                if landed is not None:
                    landed(lines)
            raise

    def failure(self, result: CommandResult, what: str) -> str:
        return f"cannot {what} in {self.path} on {self.host.name}: {result.first_error_line().rstrip('.')}."

    async def sync_clock(self) -> None:
        if self.offset is None:
            await self.run(hs.READ_PROLOGUE, what="read the clock")
