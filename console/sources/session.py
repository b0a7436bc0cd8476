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
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from console.core.events import DecodeBatch, Event, HttpAccess, PrefillBatch
from console.core.gpus import same_reading
from console.core.hostfold import MAX_SCRAPES, HostFold
from console.core.recording import RecordSink, marks_between
from console.core.snapshot import FollowerStatus, FollowState, HealthState, HostSnapshot, same_server_reading
from console.sources.gpus import GpuPoller
from console.sources.hosts import HostConfig
from console.sources.journal import JournalFollower
from console.sources.server import ServerClient, ServerError
from console.sources.session_options import SessionOptions
from console.sources.transport import Transport

_NOT_FOLLOWED = FollowerStatus(state=FollowState.STOPPED, detail="the journal is not followed")

__all__ = ["CONSUME_BATCH", "MAX_SCRAPES", "HostSession", "SessionOptions"]

CONSUME_BATCH = 256
"""Journal entries parsed and folded per turn of the event loop: under 2,000 lines a second a whole
queue at once held the loop for 5-8 ms, and a key pressed meanwhile waited for it."""
IDLE_READINGS = 5
"""Server readings in a row that read as the last one: the server is idle, scraped at half the pace
(`IDLE_PACE`) until a reading differs or the journal shows a batch (which wakes the poll at once)."""
IDLE_PACE = 2.0
BATCH_EVENTS = (DecodeBatch, PrefillBatch)
SAME_READING_S = 3.0
"""A GPU sample or a server reading that reads as the last one, or journal lines that are only HTTP
access lines (the console's own scrapes among them), are published within this time rather than at once
(when nothing else is): they change only the age of the freshest reading, or the log pane's tail, which
the feed already shows as the lines come (`on_journal`)."""


class HostSession:
    def __init__(
        self, host: HostConfig, options: SessionOptions | None = None, *, transport: Transport | None = None
    ) -> None:
        """`transport`: one already made (a command that also runs other things on the host); None: the
        session makes its own from `options`' SSH settings."""
        o = self.options = options or SessionOptions()
        self.host = host
        self.transport = transport or Transport(
            host,
            backoff=o.backoff,
            connect_timeout=o.connect_timeout,
            keepalive_interval=o.keepalive_interval,
            ssh_config=o.ssh_config,
        )
        self.follower = (
            JournalFollower(
                self.transport,
                host.unit_name,
                cursor=o.journal_cursor,
                backlog=o.journal_backlog,
                journalctl=o.journalctl,
                systemctl=o.systemctl,
            )
            if o.follow_journal
            else None
        )
        self.poller = (
            GpuPoller(
                None if host.local else self.transport,
                interval_s=o.gpu_s,
                backend="auto" if host.local else o.gpu_backend,
                nvml=o.nvml,
                host=host.name,
            )
            if o.sample_gpus
            else None
        )
        self.poll_server = o.poll_server
        self.server_interval_s = o.server_s
        self.health_interval_s = o.health_interval_s
        self.idle_flush_s = o.idle_flush_s
        self.publish_interval_s = o.publish_interval_s
        # Everything the inputs below turn into (the same code folds a replay's recorded inputs).
        self.fold = HostFold(
            host.name,
            keep_events=o.keep_events,
            serving_window_s=o.serving_window_s,
            server_interval_s=o.server_s,
        )
        self.recorder: RecordSink | None = None
        """Where the session's inputs are recorded as they arrive (`console.sources.recording`); None:
        not recording. Set and cleared at any time (the console's record key)."""
        self.on_journal: Callable[[HostFold], None] | None = None
        """Called with the fold each time journal lines made events, before a snapshot holds them: a
        reader that must show a line at once (the console's feed) takes it here, where the snapshot
        cadence would add up to `publish_interval_s`."""
        self._seq = 0
        self._published_at = -math.inf
        self.idle_readings = 0
        """Server readings in a row that read as the one before (`IDLE_READINGS` or more: idle)."""
        self._snapshot = self._build()
        self._published = asyncio.Event()
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._client: ServerClient | None = None
        self._closed = False
        self._server_wake = asyncio.Event()
        self._quiet_due: asyncio.TimerHandle | None = None

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
            self.fold.history.resize(
                min(MAX_SCRAPES, math.ceil(self.fold.history.window_s / max(server_s, 0.1)) + 1)
            )
            if sooner:
                self._server_wake.set()

    async def __aenter__(self) -> HostSession:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- snapshots ---------------------------------------------------------------------------------

    def _build(self) -> HostSnapshot:
        return self.fold.snapshot(
            seq=self._seq,
            ts=time.time(),
            connection=self.transport.status,
            follower=self.follower.status if self.follower is not None else _NOT_FOLLOWED,
        )

    def current(self) -> HostSnapshot:
        """A snapshot of everything read so far, published now (not at the next publishing tick)."""
        self._publish_now()
        return self._snapshot

    def _publish_now(self) -> None:
        self._published_at = time.monotonic()
        if self._quiet_due is not None:
            # This snapshot carries what was waiting.
            self._quiet_due.cancel()
            self._quiet_due = None
        self._seq += 1
        self._snapshot = self._build()
        published, self._published = self._published, asyncio.Event()
        published.set()

    def _touch(self) -> None:
        self._dirty.set()

    def _touch_quiet(self) -> None:
        """A change that may wait: published with the next change, or within `SAME_READING_S` of the last
        snapshot."""
        wait = SAME_READING_S - (time.monotonic() - self._published_at)
        if wait <= 0:
            self._touch()
        elif self._quiet_due is None:
            self._quiet_due = asyncio.get_running_loop().call_later(wait, self._quiet_elapsed)

    def _quiet_elapsed(self) -> None:
        self._quiet_due = None
        if not self._closed:
            self._touch()

    async def _publisher(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            self._publish_now()
            await asyncio.sleep(self.publish_interval_s)

    # ---- sources -----------------------------------------------------------------------------------

    async def _watch_connection(self) -> None:
        async for status in self.transport.watch():
            if self.recorder is not None:
                self.recorder.record(self.host.name, "link", status)
            self._touch()

    async def _watch_follower(self) -> None:
        assert self.follower is not None
        while True:
            status = await self.follower.changed()
            if self.recorder is not None:
                self.recorder.record(self.host.name, "follower", status)
            self._touch()

    def start_recording(self, recorder: RecordSink) -> None:
        """Record from now on: first what the session holds now that a replay cannot rebuild from the
        inputs that follow (what the journal has made so far, the link, the follower, the latest GPU
        sample and server reading), then every input as it comes."""
        name = self.host.name
        fold = self.fold
        if fold.events_total:
            recorder.record(name, "seed", (fold.state, tuple(fold.recent), fold.events_total))
        recorder.record(name, "link", self.transport.status)
        if self.follower is not None:
            recorder.record(name, "follower", self.follower.status)
        if fold.gpus is not None:
            recorder.record(name, "gpu", fold.gpus)
        if fold.server is not None:
            recorder.record(name, "server", (fold.server, fold.max_running))
        # Keyframes of the fold from here on (a replay's seek starts from the nearest one, issue 33).
        recorder.follow(name, fold)
        self.recorder = recorder

    def _journal(self, batch: list[dict[str, Any]] | None) -> list[Event]:
        """A batch of journal entries (None: the journal went quiet, flush), recorded then folded."""
        before = self.fold.state
        rec = self.recorder
        if rec is not None:
            rec.record(self.host.name, "journal" if batch is not None else "flush", batch)
        events = self.fold.journal(batch) if batch is not None else self.fold.flush()
        if self.idle_readings >= IDLE_READINGS and any(isinstance(e, BATCH_EVENTS) for e in events):
            # The server works again: its figures are read now, and at the full pace from here on.
            self.idle_readings = 0
            self._server_wake.set()
        if rec is not None and events:
            for kind, label in marks_between(before, self.fold.state):
                rec.mark(self.host.name, kind, label)
        if events and self.on_journal is not None:
            self.on_journal(self.fold)
        return events

    async def _consume_journal(self) -> None:
        assert self.follower is not None
        while True:
            try:
                async with asyncio.timeout(self.idle_flush_s):
                    batch = await self.follower.next_batch(CONSUME_BATCH)
            except TimeoutError:
                # Quiet for a while: release a traceback the parser is holding for more lines.
                if self._journal(None):
                    self._touch()
                continue
            events = self._journal(batch)
            if any(not isinstance(e, HttpAccess) for e in events):
                self._touch()
            else:
                # Only access lines (the console's own /metrics scrapes every few seconds, on a real
                # server as on the twin): the feed has them already; the snapshot can wait.
                self._touch_quiet()
            # Let the other hosts' tasks run between batches.
            await asyncio.sleep(0)

    async def _sample_gpus(self) -> None:
        assert self.poller is not None
        async for sample in self.poller.samples():
            if self.recorder is not None:
                self.recorder.record(self.host.name, "gpu", sample)
            before = self.fold.gpus
            made = self.fold.gpu(sample)
            # A sample that reads as the last one did (an idle host, every second) changes only the
            # freshest reading's age; the snapshot that carries it can wait a few seconds (the header
            # reads any age under 5 s as "< 5s ago"), or for the next server reading.
            if made or not same_reading(before, sample):
                self._touch()
            else:
                self._touch_quiet()

    async def _poll_server(self) -> None:
        loop = asyncio.get_running_loop()
        self._client = await ServerClient.through(
            self.transport, self.host, timeout_s=self.server_interval_s * 2
        )
        info: dict[str, str | None] | None = None
        max_running: float | None = None
        deep_at = -1e18  # when /health (a one-token generation on the server) last ran
        while True:
            started = loop.time()
            sample = None
            last = self.fold.server
            healthy = last is not None and last.health is HealthState.OK
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
                    max_running = float(limit) if isinstance(limit, int | float) else None
            reading = sample.model_copy(update=info) if info else sample
            if self.recorder is not None:
                self.recorder.record(self.host.name, "server", (reading, max_running))
            before = self.fold.server
            self.fold.server_reading(reading, max_running)
            # An idle server's scrape, word for word the last one (the same reading: `PrometheusReader`)
            # moves no figure: published with the next change, or within SAME_READING_S.
            same = same_server_reading(before, reading)
            self.idle_readings = self.idle_readings + 1 if same else 0
            if same:
                self._touch_quiet()
            else:
                self._touch()
            self._server_wake.clear()
            pace = self.server_interval_s * (IDLE_PACE if self.idle_readings >= IDLE_READINGS else 1.0)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, pace - (loop.time() - started))):
                    await self._server_wake.wait()
