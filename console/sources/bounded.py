"""A remote command whose output is read only up to a limit: what a host sends is untrusted.

`Transport.run` collects everything a command prints; for the answers the console reads to learn a
host (the SGLang probe, the extracted flag list, a config.json) a broken or hostile host could send
gigabytes. Here stdout and stderr are read concurrently (a full stderr window must not stall the
reading of stdout) and the channel is closed as soon as either passes its limit.

A streaming command (the journal follower, the GPU agent, the audit trail's `tail -F`) is read with
`stream_lines`: lines split on `\n` only, each kept up to a limit and the rest counted, never stored.
`RemoteStream.lines` cannot do that: asyncssh's `readline` hands back a partial line once the channel's
window (~2 MiB) is full, and a partial line reads as a dropped channel.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import asyncssh

from console.sources.ssh_channels import RemoteStream
from console.sources.transport import CommandResult, Transport, TransportError

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
    process = await transport.open_process(conn, argv, encoding="utf-8")
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


class CutLine(bytes):
    """The first `limit` bytes of a line that was longer; `size` is the whole line's length in bytes and
    `tail` its last bytes (up to the splitter's `tail`): a journal entry's cursor may come after a huge
    field (journalctl prints an entry's fields in no fixed order)."""

    size: int
    tail: bytes

    @classmethod
    def of(cls, kept: bytes, size: int, tail: bytes = b"") -> CutLine:
        line = cls(kept)
        line.size = size
        line.tail = tail
        return line


class BoundedLines:
    """Bytes in, lines out (without their `\\n`), each at most `limit` bytes: a longer line comes out as a
    `CutLine` holding its first `limit` bytes and its last `tail` bytes; the rest of it is counted, not
    kept. Memory stays under `limit + tail` plus one chunk whatever the input; time is linear in it."""

    def __init__(self, limit: int, *, tail: int = 0) -> None:
        if limit < 1:
            raise ValueError("a line limit must be at least one byte")
        self.limit = limit
        self.tail = tail
        self.cut = 0
        """Lines that came out cut."""
        self._parts: list[bytes] = []
        self._kept = 0
        self._size = 0  # the open line's length so far, dropped bytes included
        self._tail = b""  # the open line's last bytes past the limit

    def _take(self, piece: bytes) -> None:
        self._size += len(piece)
        room = self.limit - self._kept
        if room > 0 and piece:
            kept = piece[:room]
            self._parts.append(kept)
            self._kept += len(kept)
            piece = piece[room:]
        if piece and self.tail:
            self._tail = (self._tail + piece[-self.tail :])[-self.tail :]

    def _end(self) -> bytes:
        data = b"".join(self._parts)
        size, tail = self._size, self._tail
        self._parts, self._kept, self._size, self._tail = [], 0, 0, b""
        if size > self.limit:
            self.cut += 1
            return CutLine.of(data, size, tail)
        return data

    def feed(self, data: bytes) -> list[bytes]:
        """The lines `data` completes; a line still open waits for the next chunk."""
        lines: list[bytes] = []
        start = 0
        find = data.find
        while True:
            end = find(b"\n", start)
            if end < 0:
                break
            if not self._size and end - start <= self.limit:
                lines.append(data[start:end])  # the common case: a whole line inside this chunk
            else:
                self._take(data[start:end])
                lines.append(self._end())
            start = end + 1
        if start < len(data):
            self._take(data[start:])
        return lines

    @property
    def open_bytes(self) -> int:
        """Bytes of a line begun and not ended (a stream that ends here ended mid-line)."""
        return self._size


async def stream_lines(
    stream: RemoteStream, limit: int, *, tail: int = 0, chunk: int = 64 << 10
) -> AsyncIterator[list[bytes]]:
    """The stream's complete lines, a list per chunk read, each at most `limit` bytes (`CutLine` past it,
    with its last `tail` bytes). A line the stream ends in the middle of is not data (the channel
    dropped) and is not given."""
    splitter = BoundedLines(limit, tail=tail)
    while True:
        data = await stream.read(chunk)
        if not data:
            return
        lines = splitter.feed(data)
        if lines:
            yield lines


__all__ = ["STDERR_LIMIT", "BoundedLines", "CutLine", "OutputTooLarge", "run_bounded", "stream_lines"]
