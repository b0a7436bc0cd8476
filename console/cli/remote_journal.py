"""The boots in a host's unit journal, read over SSH, for the commands that judge or plan from them
(`verify HOST`, `plan HOST`, `profiles validate --host`): one module they all import, so none of them
imports another command."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

from console.cli.errors import UsageError
from console.core.confirm import PendingRollback
from console.core.state import Boot

if TYPE_CHECKING:
    from console.sources.hosts import HostConfig
    from console.sources.transport import Transport

T = TypeVar("T")


async def together(first: Awaitable[list[str]], second: Awaitable[T]) -> tuple[list[str], T]:
    """Both reads at once, each on a channel of its own over the one connection (the second's round
    trip, ~25 ms on loopback, hides behind journalctl's); a failure is the first's first, as when they
    ran one after the other, and the other read is cancelled."""
    import asyncio

    one, two = asyncio.ensure_future(first), asyncio.ensure_future(second)
    try:
        return await one, await two
    finally:
        for task in (one, two):
            task.cancel()
        await asyncio.gather(one, two, return_exceptions=True)


async def unit_journal(transport: Transport, host: HostConfig) -> list[str]:
    """HOST's unit journal as `journalctl -u UNIT -o json` lines, bounded (sources.journal)."""
    from console.sources.journal import read_unit_journal

    return await read_unit_journal(transport, host.unit_name)


def boots_of(name: str, lines: list[str]) -> list[Boot]:
    """The boots in HOST's journal lines; a usage error when it shows none."""
    from console.core.parser import parse_lines
    from console.core.state import fold_boots

    boots = fold_boots(parse_lines(lines))
    if not boots:
        raise UsageError(
            f"the journal of {name} shows no SGLang boot (no unit start and no SGLang startup, pool or error line)."
        )
    return boots


def remote_boots(
    name: str, hosts_file: str | None, *, with_pending: bool = False
) -> tuple[list[Boot], PendingRollback | None]:
    """The boots in HOST's unit journal, read over SSH as `journalctl -u UNIT -o json` lines, and (with
    `with_pending`) the commit-confirmed rollback armed on HOST, if any."""
    import asyncio

    from console.cli.remote import inventory_host
    from console.sources.confirm import read_pending
    from console.sources.hosts import HostsError
    from console.sources.hoststate import HostStateDir, HostStateError
    from console.sources.transport import Backoff, Transport, TransportError

    host = inventory_host(name, hosts_file, strict=False)  # a typo is refused before any connection

    async def no_pending() -> None:
        return None

    async def fetch() -> tuple[list[str], PendingRollback | None]:
        transport = Transport(host, backoff=Backoff(max_attempts=3))
        try:
            pending = (
                read_pending(HostStateDir(transport, host), host.unit_name, sudo=host.sudo)
                if with_pending
                else no_pending()
            )
            return await together(unit_journal(transport, host), pending)
        finally:
            await transport.close()

    try:
        lines, pending = asyncio.run(fetch())
    except (HostsError, TransportError, HostStateError) as exc:
        raise UsageError(f"{str(exc).rstrip('.')}.") from None
    return boots_of(name, lines), pending
