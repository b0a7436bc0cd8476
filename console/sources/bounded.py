"""A remote command whose output is read only up to a limit: what a host sends is untrusted.

`Transport.run` collects everything a command prints; for the answers the console reads to learn a
host (the SGLang probe, the extracted flag list, a config.json) a broken or hostile host could send
gigabytes. Here stdout and stderr are read concurrently (a full stderr window must not stall the
reading of stdout) and the channel is closed as soon as either passes its limit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import asyncssh

from console.sources.transport import CommandResult, Transport, TransportError, quote

STDERR_LIMIT = 16 << 10


class OutputTooLarge(Exception):
    """The command printed more than the caller allows; `size` is how much had arrived."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"more than {limit:,} characters")
        self.size = size
        self.limit = limit


async def _read_upto(stream: asyncssh.SSHReader[str], limit: int, *, strict: bool = True) -> str:
    """Up to `limit` characters; past it raise (`strict`) or keep draining without storing (stderr:
    a chatty interpreter must not fail the command, nor stall it on a full window)."""
    parts: list[str] = []
    size = 0
    while True:
        chunk = await stream.read(64 << 10)
        if not chunk:
            return "".join(parts)
        size += len(chunk)
        if size > limit:
            if strict:
                raise OutputTooLarge(size, limit)
            continue
        parts.append(chunk)


async def run_bounded(
    transport: Transport,
    argv: Sequence[str],
    *,
    limit: int,
    input: str | None = None,
    timeout: float = 60.0,
) -> CommandResult:
    """Run `argv` on the host, `input` on its stdin; raise OutputTooLarge past `limit` characters of
    stdout, TransportError when the connection is lost or the command outlives `timeout`."""
    conn = await transport.wait_up(timeout)
    try:
        process = await conn.create_process(quote(argv), encoding="utf-8", errors="replace")
    except (asyncssh.Error, OSError) as exc:
        raise TransportError(f"{transport.host.name}: cannot start {argv[0]}: {exc}") from None
    try:
        if input is not None:
            process.stdin.write(input)
        process.stdin.write_eof()
        async with asyncio.timeout(timeout):
            stdout, stderr = await asyncio.gather(
                _read_upto(process.stdout, limit), _read_upto(process.stderr, STDERR_LIMIT, strict=False)
            )
            completed = await process.wait()
    except TimeoutError:
        raise TransportError(
            f"{transport.host.name}: {argv[0]} did not finish within {timeout:g} s"
        ) from None
    except (asyncssh.Error, OSError, BrokenPipeError) as exc:
        raise TransportError(
            f"{transport.host.name}: lost the connection while running {argv[0]} ({exc})"
        ) from None
    finally:
        with contextlib.suppress(Exception):
            process.close()
    return CommandResult(argv=tuple(argv), exit_status=completed.exit_status, stdout=stdout, stderr=stderr)


__all__ = ["STDERR_LIMIT", "OutputTooLarge", "run_bounded"]
