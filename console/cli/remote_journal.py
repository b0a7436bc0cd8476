"""The boots in a host's unit journal, read over SSH, for the commands that judge or plan from them
(`verify HOST`, `plan HOST`, `profiles validate --host`): one module they all import, so none of them
imports another command."""

from __future__ import annotations

from console.cli.errors import UsageError
from console.core.confirm import PendingRollback
from console.core.state import Boot


def remote_boots(
    name: str, hosts_file: str | None, *, with_pending: bool = False
) -> tuple[list[Boot], PendingRollback | None]:
    """The boots in HOST's unit journal, read over SSH as `journalctl -u UNIT -o json` lines, and (with
    `with_pending`) the commit-confirmed rollback armed on HOST, if any."""
    import asyncio

    from console.cli.remote import inventory_host
    from console.core.parser import parse_lines
    from console.core.state import fold_boots
    from console.sources.confirm import read_pending
    from console.sources.hosts import HostsError
    from console.sources.hoststate import HostStateDir, HostStateError
    from console.sources.journal import read_unit_journal
    from console.sources.transport import Backoff, Transport, TransportError

    host = inventory_host(name, hosts_file, strict=False)  # a typo is refused before any connection

    async def fetch() -> tuple[list[str], PendingRollback | None]:
        transport = Transport(host, backoff=Backoff(max_attempts=3))
        # The journal and the state directory are read at once, each on a channel of its own over the one
        # connection: the state's round trip (~25 ms on loopback) hides behind journalctl's. A failure is
        # the journal's first, as when they were read one after the other.
        journal = asyncio.ensure_future(read_unit_journal(transport, host.unit_name))
        pending = (
            asyncio.ensure_future(read_pending(HostStateDir(transport, host), host.unit_name, sudo=host.sudo))
            if with_pending
            else None
        )
        tasks = [t for t in (journal, pending) if t is not None]
        try:
            lines = await journal
            return lines, (await pending if pending is not None else None)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await transport.close()

    try:
        lines, pending = asyncio.run(fetch())
    except (HostsError, TransportError, HostStateError) as exc:
        raise UsageError(f"{str(exc).rstrip('.')}.") from None
    boots = fold_boots(parse_lines(lines))
    if not boots:
        raise UsageError(
            f"the journal of {name} shows no SGLang boot (no unit start and no SGLang startup, pool or error line)."
        )
    return boots, pending
