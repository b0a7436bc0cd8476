"""One live host: the sources wired together, exposed as a stream of immutable snapshots.

A `HostSession` owns one `Transport` and starts, on it, the journal follower (its entries go through
`core.parser` into `core.state`), the GPU poller and the server poller. Whenever something changes it
publishes a new `HostSnapshot` — at most every `publish_interval_s`, so a burst of journal lines costs a
few snapshots, not thousands. Readers get the latest snapshot only: a slow screen skips snapshots rather
than holding the session back.

Several sessions share nothing but the event loop: each has its own connection, tasks and queues, every
remote wait has a timeout, and the journal consumer yields to the loop after each batch, so one slow or
hung host never stalls the others' snapshots.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from console.core.events import DecodeBatch, Event, PrefillBatch
from console.core.gpus import HostGpuSample
from console.core.parser import JournalParser
from console.core.serving import DEFAULT_WINDOW_S, Scrape, ServingFigures, TrendPoint
from console.core.serving_history import ServingHistory
from console.core.snapshot import FollowerStatus, FollowState, HealthState, HostSnapshot, ServerSample
from console.core.state import HostState
from console.sources.gpus import DEFAULT_INTERVAL_S, BackendChoice, GpuPoller
from console.sources.hosts import HostConfig
from console.sources.journal import JournalFollower
from console.sources.server import ServerClient, ServerError
from console.sources.transport import Backoff, Transport

_NOT_FOLLOWED = FollowerStatus(state=FollowState.STOPPED, detail="the journal is not followed")


MAX_SCRAPES = 600
"""The most `/metrics` scrapes a session keeps, whatever its window and interval (one scrape of SGLang
0.5.12 parsed is about 140 samples)."""

CONSUME_BATCH = 256
"""Journal entries parsed and folded per turn of the event loop: under 2,000 lines a second a whole
queue at once held the loop for 5-8 ms, and a key pressed meanwhile waited for it."""


class HostSession:
    def __init__(
        self,
        host: HostConfig,
        *,
        transport: Transport | None = None,
        ssh_config: Sequence[str | Path] | None = None,
        backoff: Backoff | None = None,
        connect_timeout: float = 10.0,
        keepalive_interval: float = 5.0,
        follow_journal: bool = True,
        journal_cursor: str | None = None,
        journal_backlog: int = 5000,
        journalctl: Sequence[str] = ("journalctl",),
        systemctl: Sequence[str] = ("systemctl",),
        sample_gpus: bool = True,
        gpu_interval_s: float = DEFAULT_INTERVAL_S,
        gpu_backend: BackendChoice = "auto",
        nvml: Any = None,
        poll_server: bool = True,
        server_interval_s: float = 2.0,
        health_interval_s: float = 30.0,
        keep_events: int = 2000,
        serving_window_s: float = DEFAULT_WINDOW_S,
        idle_flush_s: float = 1.0,
        publish_interval_s: float = 0.1,
    ) -> None:
        self.host = host
        self.transport = transport or Transport(
            host,
            backoff=backoff,
            connect_timeout=connect_timeout,
            keepalive_interval=keepalive_interval,
            ssh_config=ssh_config,
        )
        self.follower = (
            JournalFollower(
                self.transport,
                host.unit_name,
                cursor=journal_cursor,
                backlog=journal_backlog,
                journalctl=journalctl,
                systemctl=systemctl,
            )
            if follow_journal
            else None
        )
        self.poller = (
            GpuPoller(
                None if host.local else self.transport,
                interval_s=gpu_interval_s,
                backend="auto" if host.local else gpu_backend,
                nvml=nvml,
                host=host.name,
            )
            if sample_gpus
            else None
        )
        self.poll_server = poll_server
        self.server_interval_s = server_interval_s
        self.health_interval_s = health_interval_s
        self.idle_flush_s = idle_flush_s
        self.publish_interval_s = publish_interval_s
        self._parser = JournalParser(host=host.name)
        self._state = HostState()
        self._recent: deque[Event] = deque(maxlen=keep_events)
        self._events_total = 0
        self._gpus: HostGpuSample | None = None
        self._server: ServerSample | None = None
        # The window's scrapes at the server interval (5 min at 2 s: 151), never more than MAX_SCRAPES.
        self._history = ServingHistory(
            window_s=serving_window_s,
            max_scrapes=min(MAX_SCRAPES, math.ceil(serving_window_s / max(server_interval_s, 0.1)) + 1),
        )
        self._serving: ServingFigures | None = None
        self._trend: tuple[TrendPoint, ...] = ()
        self._max_running: float | None = None
        self._seq = 0
        self._snapshot = self._build()
        self._published = asyncio.Event()
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._client: ServerClient | None = None
        self._closed = False
        self._server_wake = asyncio.Event()

    # ---- reading -----------------------------------------------------------------------------------

    @property
    def snapshot(self) -> HostSnapshot:
        return self._snapshot

    async def snapshots(self) -> AsyncIterator[HostSnapshot]:
        """The current snapshot, then each newer one; a slow reader skips to the latest."""
        last = -1
        while True:
            snap, published = self._snapshot, self._published
            if snap.seq != last:
                yield snap
                last = snap.seq
            if self._closed:
                return
            await published.wait()

    async def wait_for(
        self, predicate: Callable[[HostSnapshot], bool], timeout: float | None = None
    ) -> HostSnapshot:
        async def first() -> HostSnapshot:
            async for snap in self.snapshots():
                if predicate(snap):
                    return snap
            raise RuntimeError(f"the session of {self.host.name} closed before the condition held")

        async with asyncio.timeout(timeout):
            return await first()

    # ---- lifecycle ---------------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(coro, name=f"{name}-{self.host.name}"))

    async def start(self) -> None:
        self.transport.start()
        self._spawn(self._publisher(), "publish")
        self._spawn(self._watch_connection(), "link")
        if self.follower is not None:
            self.follower.start()
            self._spawn(self._consume_journal(), "journal-consumer")
            self._spawn(self._watch_follower(), "journal-status")
        if self.poller is not None:
            self._spawn(self._sample_gpus(), "gpus")
        if self.poll_server:
            self._spawn(self._poll_server(), "server")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self.follower is not None:
            await self.follower.close()
        if self.poller is not None:
            await self.poller.close()
        if self._client is not None:
            await self._client.aclose()
        await self.transport.close()
        self._publish_now()

    def set_intervals(self, *, gpu_s: float | None = None, server_s: float | None = None) -> None:
        """Poll the GPUs and the server at new intervals (the fleet view slows the hosts not on screen:
        `console.core.fleet`). A shorter interval takes effect now, not after the old one runs out."""
        if gpu_s is not None and self.poller is not None:
            self.poller.set_interval(gpu_s)
        if server_s is not None and server_s != self.server_interval_s:
            sooner = server_s < self.server_interval_s
            self.server_interval_s = server_s
            self._history.resize(min(MAX_SCRAPES, math.ceil(self._history.window_s / max(server_s, 0.1)) + 1))
            if sooner:
                self._server_wake.set()

    async def __aenter__(self) -> HostSession:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- snapshots ---------------------------------------------------------------------------------

    def _build(self) -> HostSnapshot:
        # model_construct: every part is already a validated, frozen model; re-validating a few thousand
        # events ten times a second would be the session's largest cost.
        return HostSnapshot.model_construct(
            host=self.host.name,
            seq=self._seq,
            ts=time.time(),
            connection=self.transport.status,
            follower=self.follower.status if self.follower is not None else _NOT_FOLLOWED,
            state=self._state,
            gpus=self._gpus,
            server=self._server,
            recent=tuple(self._recent),
            events_total=self._events_total,
            serving=self._serving,
            serving_trend=self._trend,
        )

    def _publish_now(self) -> None:
        self._seq += 1
        self._snapshot = self._build()
        published, self._published = self._published, asyncio.Event()
        published.set()

    def _touch(self) -> None:
        self._dirty.set()

    async def _publisher(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            self._publish_now()
            await asyncio.sleep(self.publish_interval_s)

    # ---- sources -----------------------------------------------------------------------------------

    async def _watch_connection(self) -> None:
        async for _status in self.transport.watch():
            self._touch()

    async def _watch_follower(self) -> None:
        assert self.follower is not None
        while True:
            await self.follower.changed()
            self._touch()

    def _apply(self, events: list[Event]) -> None:
        if not events:
            return
        self._state = self._state.apply_all(events)
        self._recent.extend(events)
        self._events_total += len(events)

    async def _consume_journal(self) -> None:
        assert self.follower is not None
        while True:
            try:
                async with asyncio.timeout(self.idle_flush_s):
                    batch = await self.follower.next_batch(CONSUME_BATCH)
            except TimeoutError:
                # Quiet for a while: release a traceback the parser is holding for more lines.
                events = self._parser.flush()
                if events:
                    self._apply(events)
                    self._touch()
                continue
            self._apply(self._parser.feed_many(batch))
            self._touch()
            # Let the other hosts' tasks run between batches.
            await asyncio.sleep(0)

    async def _sample_gpus(self) -> None:
        assert self.poller is not None
        async for sample in self.poller.samples():
            self._gpus = sample
            self._touch()

    async def _poll_server(self) -> None:
        loop = asyncio.get_running_loop()
        self._client = await ServerClient.through(
            self.transport, self.host, timeout_s=self.server_interval_s * 2
        )
        info: dict[str, str | None] | None = None
        deep_at = -1e18  # when /health (a one-token generation on the server) last ran
        while True:
            started = loop.time()
            sample = None
            healthy = self._server is not None and self._server.health is HealthState.OK
            if healthy and started - deep_at < self.health_interval_s:
                light = await self._client.light_sample()
                if light.health is HealthState.OK:
                    sample = light
            if sample is None:
                # starting, just failed, or due: the real verdict (and /metrics with it)
                sample = await self._client.sample()
                deep_at = started
            if sample.health is not HealthState.OK:
                info = None  # the next healthy server may be another build
            elif info is None:
                with contextlib.suppress(ServerError):
                    raw = await self._client.server_info()
                    info = {
                        key: str(raw[src]) if raw.get(src) else None
                        for key, src in (("version", "version"), ("model", "served_model_name"))
                    }
                    limit = raw.get("max_running_requests")
                    self._max_running = float(limit) if isinstance(limit, int | float) else None
            self._server = sample.model_copy(update=info) if info else sample
            self._read_serving(self._server)
            self._touch()
            self._server_wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, self.server_interval_s - (loop.time() - started))):
                    await self._server_wake.wait()

    def _read_serving(self, sample: ServerSample) -> None:
        """Once per server reading (never per repaint): the scrape joins the window, and the window's
        figures are read from what each pair of scrapes added."""
        if sample.scrape is not None and sample.ts is not None:
            self._history.add(Scrape(ts=sample.ts, metrics=sample.scrape))
            self._trend = tuple(self._history.trend)
        if sample.health is not HealthState.OK and self._serving is None:
            return
        # The newest decode and prefill lines stand in for what the scrapes lack (metrics off).
        decode = prefill = None
        for event in reversed(self._recent):
            if decode is None and isinstance(event, DecodeBatch):
                decode = event
            elif prefill is None and isinstance(event, PrefillBatch):
                prefill = event
            if decode is not None and prefill is not None:
                break
        lines = [e for e in (prefill, decode) if e is not None]
        self._serving = self._history.figures(
            version=sample.version, max_running=self._max_running, lines=lines
        )
