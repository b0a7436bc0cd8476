"""The SSH channels beyond one command: a streaming command's output, and a local port forwarded to the
far side of the transport."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Protocol

import asyncssh

from console.sources.remote_command import TransportError

__all__ = ["LocalForward", "RemoteStream"]


class RemoteStream:
    """The stdout of a streaming command, line by line, as bytes (no decoding cost, no decode errors)."""

    def __init__(self, process: asyncssh.SSHClientProcess[bytes], argv: tuple[str, ...], host: str) -> None:
        self._process = process
        self.argv = argv
        self._host = host

    async def readline(self) -> bytes:
        """One line with its newline; b"" at the end. A lost connection raises `TransportError`."""
        try:
            return await self._process.stdout.readline()
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"{self._host}: the stream of {self.argv[0]} broke ({exc})") from None

    async def read(self, size: int = 64 << 10) -> bytes:
        """Up to `size` bytes of stdout as they come, b"" at the end: what a reader that bounds each line
        itself needs. `readline` cannot bound one: asyncssh hands back a partial line once the channel's
        window (~2 MiB) is full, which `lines` takes for a drop."""
        try:
            return await self._process.stdout.read(size)
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"{self._host}: the stream of {self.argv[0]} broke ({exc})") from None

    async def lines(self) -> AsyncIterator[bytes]:
        while True:
            line = await self.readline()
            if not line:
                return
            if not line.endswith(b"\n"):
                # A partial last line means the channel ended mid-line (a drop): it is not data.
                return
            yield line

    async def stderr_text(self, limit: int = 4096) -> str:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                data = await self._process.stderr.read(limit)
            return data.decode("utf-8", "replace")
        return ""

    @property
    def exit_status(self) -> int | None:
        return self._process.exit_status

    async def wait(self, timeout: float | None = None) -> int | None:
        with contextlib.suppress(TimeoutError, asyncssh.Error, OSError):
            async with asyncio.timeout(timeout):
                await self._process.wait_closed()
        return self._process.exit_status

    def write(self, data: bytes) -> None:
        self._process.stdin.write(data)


class LiveConnection(Protocol):
    """What a forward needs of the transport: its live connection. A protocol, so that this module does not
    import the transport that builds its streams on it."""

    async def wait_up(self, timeout: float | None = None) -> asyncssh.SSHClientConnection: ...


class LocalForward:
    """127.0.0.1:PORT here → DEST_HOST:DEST_PORT as seen from the remote host, through the transport.

    The listening port stays the same across reconnects: each accepted client opens its own
    direct-tcpip channel on whatever connection is current, so an httpx client built once keeps
    working after the SSH connection comes back.
    """

    def __init__(
        self, transport: LiveConnection, dest_host: str, dest_port: int, *, open_timeout: float = 10.0
    ) -> None:
        self.transport = transport
        self.dest_host = dest_host
        self.dest_port = dest_port
        self.open_timeout = open_timeout
        self._server: asyncio.Server | None = None
        self._writers: set[Any] = set()
        self.port: int = 0

    async def start(self, listen_port: int = 0) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", listen_port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A handler task of asyncio.start_server must not end in CancelledError (asyncio logs it as an
        # unhandled exception), so close() ends the pipes by closing their writers instead.
        self._writers.add(writer)
        remote_writer: Any = None
        try:
            conn = await self.transport.wait_up(self.open_timeout)
            remote_reader, remote_writer = await conn.open_connection(self.dest_host, self.dest_port)
            self._writers.add(remote_writer)

            async def pump(src: Any, dst: Any) -> None:
                try:
                    while data := await src.read(65536):
                        dst.write(data)
                        await dst.drain()
                except (asyncssh.Error, OSError, ConnectionError):
                    pass
                finally:
                    with contextlib.suppress(Exception):
                        dst.write_eof()

            await asyncio.gather(pump(reader, remote_writer), pump(remote_reader, writer))
        except (TransportError, asyncssh.Error, OSError):
            # The client sees a closed connection, as it would if the port were down.
            pass
        except asyncio.CancelledError:
            return
        finally:
            for w in (remote_writer, writer):
                if w is not None:
                    self._writers.discard(w)
                    with contextlib.suppress(Exception):
                        w.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            with contextlib.suppress(Exception):
                w.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self._server.wait_closed()
        self._server = None

    async def __aenter__(self) -> LocalForward:
        if self._server is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
