"""A TCP proxy on loopback that a test can turn into a network partition: traffic black-holed, nothing
closed.

    with BlackHole(("127.0.0.1", twin.ssh_port)) as hole:   # hole.port: connect here instead
        ...
        hole.cut()       # from now on nothing is forwarded either way, and no connection is closed
        ...
        hole.restore()   # what was held goes through, as TCP delivers it once a partition heals

While cut, it reads nothing from either side (the kernel's buffers fill and the senders stall, as on a
lost link), holds what it had already read, and answers new connections at the TCP level only: their
SSH handshake goes nowhere until the link is back, so a client's connect times out as it would. It runs
its own event loop in a thread and forwards only to the loopback address it was given.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType

__all__ = ["BlackHole"]


class BlackHole:
    def __init__(self, target: tuple[str, int], listen: str = "127.0.0.1") -> None:
        if not target[0].startswith("127."):
            raise ValueError("the test proxy forwards to loopback only")
        self.target = target
        self.listen = listen
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._open: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._stopped: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0

    # ---- the test's side ---------------------------------------------------------------------------

    def start(self) -> BlackHole:
        ready = threading.Event()
        failure: list[BaseException] = []

        async def main() -> None:
            self._open = asyncio.Event()
            self._open.set()
            try:
                self._server = await asyncio.start_server(self._accept, self.listen, 0)
            except OSError as exc:
                failure.append(exc)
                ready.set()
                return
            self.port = self._server.sockets[0].getsockname()[1]
            self._stopped = asyncio.Event()
            ready.set()
            await self._stopped.wait()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(main())
            except asyncio.CancelledError:
                pass
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="k26-test-blackhole", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise failure[0]
        return self

    def cut(self) -> None:
        """The partition: nothing goes through from now on, and nothing is closed."""
        self._call(lambda: self._gate().clear())

    def restore(self) -> None:
        """The link is back: what was held, and everything after it, goes through."""
        self._call(lambda: self._gate().set())

    @property
    def is_cut(self) -> bool:
        return self._open is not None and not self._open.is_set()

    def stop(self) -> None:
        """Close the listener and every connection through it (the end of the test, not a partition)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return

        async def shut() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            if self._stopped is not None:
                self._stopped.set()

        with contextlib.suppress(RuntimeError):
            asyncio.run_coroutine_threadsafe(shut(), loop).result(10)
        thread.join(10)
        self._loop = self._thread = None

    def __enter__(self) -> BlackHole:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ---- the proxy ----------------------------------------------------------------------------------

    def _gate(self) -> asyncio.Event:
        assert self._open is not None
        return self._open

    def _call(self, fn: object) -> None:
        assert self._loop is not None and callable(fn)
        done = threading.Event()

        def run() -> None:
            fn()
            done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(10)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            # A connection made during the partition reaches the far side only once the link is back.
            await self._gate().wait()
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except (OSError, asyncio.CancelledError):
            writer.close()
            self._tasks.discard(task)
            return
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for w in (writer, up_writer):
                w.close()
            self._tasks.discard(task)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        gate = self._gate()
        while True:
            await gate.wait()  # cut: read nothing, so the sender's data waits in the kernel
            data = await src.read(65536)
            if not data:
                await gate.wait()
                with contextlib.suppress(OSError):
                    dst.write_eof()
                return
            await gate.wait()  # read just before the cut: held, delivered once the link is back
            dst.write(data)
            await dst.drain()
