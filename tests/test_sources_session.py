"""A `HostSession` against the simulated SGLang twin over SSH (the twin's in-process asyncssh endpoint):
the journal folds into boots, GPUs come from the twin's nvidia-smi, the server's health and metrics
come through the port forward, and the streaming /generate helper yields parsed events."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Callable, Iterator

import pytest

from console.core.gpus import SamplerState
from console.core.snapshot import ConnState, FollowState, HealthState, HostSnapshot
from console.sources.gpus import DEFAULT_INTERVAL_S
from console.sources.hosts import HostConfig, load_hosts
from console.sources.server import ServerClient, ServerError
from console.sources.session import HostSession
from console.sources.session_options import DEFAULT_SERVER_INTERVAL_S, SessionOptions
from console.sources.transport import Transport
from console.twin.host import TwinHost
from tests.support.folds import FoldTap
from tests.support.waiting import eventually

POOL_AT_085 = 101_134  # the twin's pool for the incident's first flags


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwinHost]:
    # The twin serves SSH from a loop in its own thread, so it outlives each test's event loop.
    host = TwinHost(tmp_path_factory.mktemp("session-twin") / "state", time_scale=0.002)
    host.start_sync()
    try:
        yield host
    finally:
        host.stop_sync()


def _config(twin: TwinHost) -> HostConfig:
    return load_hosts(twin.hosts_toml).hosts[twin.name]


async def _republished(
    session: HostSession, reading_ts: Callable[[HostSnapshot], float | None], same_s: float
) -> int:
    """The snapshots published over `3 × same_s + 1` seconds of unchanged readings, each checked to carry
    a reading (`reading_ts`: its time) no older than the republishing bound."""
    seq0 = session.snapshot.seq
    started = time.monotonic()
    while time.monotonic() - started < 3 * same_s + 1:
        snap = await session.wait_for(lambda s, seq=session.snapshot.seq: s.seq > seq, 2 * same_s)
        ts = reading_ts(snap)
        assert ts is not None and time.time() - ts < same_s + 1.5, (ts, time.time())
    return session.snapshot.seq - seq0


def _ready(snap: HostSnapshot) -> bool:
    return (
        snap.server is not None
        and snap.server.health is HealthState.OK
        and snap.server.metrics is not None
        and snap.gpus is not None
        and snap.gpus.state is SamplerState.OK
        and any(b.pool.max_total_num_tokens for b in snap.state.boots)
    )


async def test_session_snapshots_hold_journal_gpus_and_server(twin: TwinHost) -> None:
    session = HostSession(
        _config(twin), SessionOptions(ssh_config=(), gpu_interval_s=0.25, server_interval_s=0.25)
    )
    async with session:
        snap = await session.wait_for(_ready, 30)
        assert snap.connection is not None and snap.connection.state is ConnState.UP
        assert snap.follower.state is FollowState.FOLLOWING and snap.follower.entries > 50
        assert [b.pool.max_total_num_tokens for b in snap.state.boots if b.pool.max_total_num_tokens] == [
            POOL_AT_085
        ]
        assert snap.events_total == len(snap.recent)
        assert snap.gpus is not None and snap.gpus.backend == "agent" and len(snap.gpus.gpus) == 8
        metrics = snap.server.metrics if snap.server else None
        assert metrics is not None and metrics.series > 0
        assert metrics.max_total_num_tokens == POOL_AT_085
        seqs = []
        async for later in session.snapshots():
            seqs.append(later.seq)
            if len(seqs) == 3:
                break
        assert seqs == sorted(set(seqs))  # every reader sees increasing, never repeated snapshots
    assert session.snapshot.connection is not None
    assert session.snapshot.connection.state is ConnState.CLOSED


async def test_server_client_info_and_streaming_generate(twin: TwinHost) -> None:
    transport = Transport(_config(twin), ssh_config=[])
    client = await ServerClient.through(transport)
    try:
        health = await client.health()
        assert health.health is HealthState.OK and health.status_code == 200
        info = await client.server_info()
        assert info.get("max_total_num_tokens") == POOL_AT_085 or "internal_states" in info
        model = await client.model_info()
        assert "model_path" in model
        payload = {
            "input_ids": list(range(1, 65)),
            "sampling_params": {
                "max_new_tokens": 8,
                "min_new_tokens": 8,
                "ignore_eos": True,
                "temperature": 0,
            },
        }
        events = [event async for event in client.generate_stream(payload, timeout_s=30)]
        assert events and events[-1]["meta_info"]["completion_tokens"] == 8
        assert events[-1]["meta_info"]["prompt_tokens"] == 64
        too_long = {"input_ids": [1] * 300_000, "sampling_params": {"max_new_tokens": 1}}
        with pytest.raises(ServerError) as err:
            async for _ in client.generate_stream(too_long, timeout_s=30):
                pass
        assert "\n" not in str(err.value)
    finally:
        await client.aclose()
        await transport.close()


async def test_a_dead_server_port_is_down_not_a_crash(twin: TwinHost) -> None:
    config = _config(twin).model_copy(update={"server_url": "http://127.0.0.1:1"})
    transport = Transport(config, ssh_config=[])
    client = await ServerClient.through(transport)
    try:
        sample = await client.sample()
        assert sample.health is HealthState.DOWN and sample.detail
        with pytest.raises(ServerError, match="not reachable"):
            await client.metrics()
    finally:
        await client.aclose()
        await transport.close()
    await asyncio.sleep(0)


async def test_polls_do_not_make_the_server_generate_every_few_seconds(twin: TwinHost) -> None:
    """SGLang's /health runs a one-token generation: the session asks it once per health interval (and
    whenever the cheap poll fails); in between it polls /metrics. A stopped server is still seen at once."""
    from console.core.events import HttpAccess

    session = HostSession(
        _config(twin),
        SessionOptions(ssh_config=(), gpu_interval_s=1.0, server_interval_s=0.2, health_interval_s=30.0),
    )
    async with session:
        await session.wait_for(_ready, 30)
        # What has been folded so far, published now: access lines alone wait for the next snapshot
        # (`SAME_READING_S`), and the first /health check's line may not be in the last one yet.
        seen = session.current().events_total

        def paths_since(snap: HostSnapshot) -> list[str]:
            new = snap.recent[-(snap.events_total - seen) :] if snap.events_total > seen else ()
            return [e.path for e in new if isinstance(e, HttpAccess)]

        # Twelve /metrics polls (~2.4 s at 0.2 s) and not one /health among them.
        snap = await session.wait_for(lambda s: paths_since(s).count("/metrics") >= 12, 20)
        assert paths_since(snap).count("/health") == 0, paths_since(snap)
        await asyncio.to_thread(twin.systemctl, "stop", twin.unit)
        try:
            down = await session.wait_for(
                lambda s: s.server is not None and s.server.health is not HealthState.OK, 15
            )
            assert down.server is not None and down.server.health in (HealthState.DOWN, HealthState.ERROR)
        finally:
            await asyncio.to_thread(twin.systemctl, "start", twin.unit)
            await session.wait_for(_ready, 60)


async def test_close_ends_even_when_a_journal_batch_lands_in_the_turn_of_the_cancel(twin: TwinHost) -> None:
    """On Python 3.11 `asyncio.wait_for` drops a cancellation that arrives in the loop turn its inner
    task finished in, and returns the result instead: the session's journal consumer then looped on,
    and `close()` (which waits for its tasks) never returned. A CI run hung 300 s in a test's teardown
    on that. Here a real journal line lands zero to three turns before the cancel; each close must end."""
    line = (
        "[2026-11-30 10:00:00] Decode batch. #running-req: 1, #token: 185000, gen throughput (token/s): 0.70"
    )
    for turns in range(4):
        session = HostSession(
            _config(twin), SessionOptions(ssh_config=(), sample_gpus=False, poll_server=False)
        )
        await session.start()
        await session.wait_for(lambda s: s.follower.entries > 0, 30)
        follower = session.follower
        assert follower is not None
        follower._queue.put_nowait({"MESSAGE": line, "_SYSTEMD_UNIT": twin.unit, "__CURSOR": "c"})
        for _ in range(turns):
            await asyncio.sleep(0)
        # Timed, not bounded with asyncio.timeout: close() finishes its cleanup through a cancellation,
        # so a hung close would come back at the bound looking fine.
        started = time.monotonic()
        closing = asyncio.ensure_future(session.close())
        done, _ = await asyncio.wait([closing], timeout=5)
        took = time.monotonic() - started
        closing.cancel()
        await asyncio.wait([closing])
        assert done, (
            f"close() still waiting after {took:.1f} s with the line {turns} turn(s) before the cancel"
        )


async def test_the_session_keeps_a_bounded_window_of_scrapes_and_publishes_the_serving_figures(
    twin: TwinHost,
) -> None:
    # a 2 s window at 0.2 s: 11 scrapes at most, however long the session runs (fewer on a busy machine,
    # where the polls come later than every 0.2 s)
    session = HostSession(
        _config(twin),
        SessionOptions(ssh_config=(), sample_gpus=False, server_interval_s=0.2, serving_window_s=2.0),
    )
    async with session:
        snap = await session.wait_for(
            lambda s: s.serving is not None and s.serving.scrapes >= 5 and s.serving.covered_s is not None,
            30,
        )
        serving = snap.serving
        assert serving is not None
        assert serving.kv_pool == POOL_AT_085 and serving.sources["kv_pool"] == "sglang:max_total_num_tokens"
        assert serving.max_running is not None and serving.max_running > 0  # from /server_info
        assert serving.covered_s <= 2.0 and serving.version is not None
        # Well past the window's 11 scrapes (counted as folded: an idle server's readings are not each
        # published), then the latest snapshot.
        readings = FoldTap(session).server
        await eventually(lambda: len(readings) >= 15, "15 more server readings", timeout=30)
        session.current()
        assert len(session.fold.history.scrapes) <= 11 and len(session.snapshot.serving_trend) <= 10
        assert session.snapshot.serving is not None and session.snapshot.serving.scrapes <= 11


def test_options_are_frozen_and_a_pace_left_unset_reads_at_the_sessions_default() -> None:
    options = SessionOptions(follow_journal=False, sample_gpus=False, poll_server=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.server_interval_s = 1.0  # type: ignore[misc]
    session = HostSession(HostConfig(name="h", ssh="127.0.0.1"), options)
    assert session.server_interval_s == DEFAULT_SERVER_INTERVAL_S and options.gpu_s == DEFAULT_INTERVAL_S
    paced = dataclasses.replace(options, server_interval_s=8.0)
    assert options.server_interval_s is None  # replace() made a new one
    assert HostSession(HostConfig(name="h", ssh="127.0.0.1"), paced).server_interval_s == 8.0


async def test_an_idle_hosts_unchanged_gpu_samples_are_published_every_few_seconds_a_change_at_once(
    twin: TwinHost,
) -> None:
    """A GPU sample that reads as the last one changes only the age of the freshest reading: the session
    publishes it at most every `SAME_READING_S` (the header reads any age under 5 s alike), where it
    published every sample (the idle console's largest cost after the server poll). A sample that reads
    differently is published at once."""
    from console.sources.session import SAME_READING_S
    from console.twin.gpuhealth import GpuConditions, fault_conditions, write_conditions

    write_conditions(twin.layout, GpuConditions())
    session = HostSession(
        _config(twin), SessionOptions(ssh_config=(), gpu_interval_s=0.25, poll_server=False)
    )
    async with session:
        await session.wait_for(lambda s: s.gpus is not None and s.gpus.state.value == "ok", 30)
        samples = FoldTap(session).gpu
        shown = await _republished(session, lambda s: s.gpus.ts if s.gpus else None, SAME_READING_S)
        assert len(samples) >= 30, f"only {len(samples)} GPU samples at 0.25 s"
        assert shown <= 6, f"{shown} snapshots for {len(samples)} samples that read the same"
        # positive control: GPU 3 in thermal slowdown reads differently, and is published at once
        last = session.snapshot.gpus
        assert last is not None
        cool = next(g.temperature_c for g in last.gpus if g.index == 3)
        write_conditions(twin.layout, fault_conditions("thermal"))
        try:
            hot = await session.wait_for(
                lambda s: (
                    s.gpus is not None and any(g.index == 3 and g.temperature_c != cool for g in s.gpus.gpus)
                ),
                SAME_READING_S - 1,
            )
            assert hot.gpus is not None
        finally:
            write_conditions(twin.layout, GpuConditions())


async def test_an_idle_servers_unchanged_scrapes_are_published_every_few_seconds_a_change_at_once(
    twin: TwinHost,
) -> None:
    """A scrape word for word the last one (an idle server) moves no figure: the session publishes it at
    most every `SAME_READING_S`, where it published every reading, and after `IDLE_READINGS` such
    readings scrapes at half the pace, until it works again (a request: its batch lines in the journal
    wake the poll, its scrape differs). The server stopping is published at once."""
    from console.sources.session import IDLE_PACE, IDLE_READINGS, SAME_READING_S

    session = HostSession(
        _config(twin),
        SessionOptions(
            ssh_config=(),
            sample_gpus=False,
            follow_journal=False,
            server_interval_s=0.2,
            health_interval_s=600.0,
        ),
    )
    async with session:
        await session.wait_for(lambda s: s.server is not None and s.server.health is HealthState.OK, 30)
        readings = FoldTap(session).server
        shown = await _republished(session, lambda s: s.server.ts if s.server else None, SAME_READING_S)
        assert len(readings) >= 12, f"only {len(readings)} server readings at 0.2 s"
        assert shown <= 8, f"{shown} snapshots for {len(readings)} readings of an idle server"
        assert session.idle_readings >= IDLE_READINGS
        gaps = sorted(b[0] - a[0] for a, b in itertools.pairwise(readings[IDLE_READINGS + 1 :]))
        assert gaps[len(gaps) // 2] >= 0.2 * IDLE_PACE * 0.9, f"an idle server scraped every {gaps} s"
        # a request: the server works, and is read at the full pace again
        with_batch = len(readings)
        assert session._client is not None
        request = {"input_ids": [7] * 64, "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}
        async for _ in session._client.generate_stream(request, timeout_s=30):
            pass
        await session.wait_for(lambda s: session.idle_readings == 0 and len(readings) > with_batch, 10)
        await asyncio.to_thread(twin.systemctl, "stop", twin.unit)
        try:
            stopped = time.monotonic()
            await session.wait_for(
                lambda s: s.server is not None and s.server.health is not HealthState.OK, 15
            )
            assert time.monotonic() - stopped < 15
        finally:
            await asyncio.to_thread(twin.systemctl, "start", twin.unit)
            await session.wait_for(lambda s: s.server is not None and s.server.health is HealthState.OK, 60)


async def test_access_lines_alone_are_published_within_a_few_seconds_other_lines_at_once(
    twin: TwinHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each scrape of the console's own puts an access line in the server's journal (uvicorn's, on a real
    SGLang as on the twin): a batch of nothing else reaches the feed at once (`on_journal`) but waits for
    the next snapshot, at most `SAME_READING_S` (one snapshot per scrape before: the idle console's most
    frequent repaint). Any other line (a request's batch) is published at once, and an access line with
    nothing after it is published when the wait runs out."""
    import console.sources.session as session_mod
    from console.core.events import HttpAccess, PrefillBatch

    same_s = 1.0
    monkeypatch.setattr(session_mod, "SAME_READING_S", same_s)
    session = HostSession(
        _config(twin),
        SessionOptions(ssh_config=(), sample_gpus=False, server_interval_s=0.05, health_interval_s=600.0),
    )
    folded: list[tuple[float, int, type]] = []  # (when, events so far, a type of the batch's events)
    published: list[tuple[float, int]] = []

    def on_journal(fold: object) -> None:
        # one entry per batch: its newest event of each type, with the events made so far
        now, total = time.monotonic(), session.fold.events_total
        fresh = list(session.fold.recent)[-(total - (folded[-1][1] if folded else total - 1)) :]
        for kind in dict.fromkeys(type(e) for e in fresh):
            folded.append((now, total, kind))

    async def watch() -> None:
        async for snap in session.snapshots():
            published.append((time.monotonic(), snap.events_total))

    def seen_by(total: int) -> float | None:
        return next((t for t, n in published if n >= total), None)

    async with session:
        await session.wait_for(lambda s: s.server is not None and s.server.health is HealthState.OK, 30)
        session.on_journal = on_journal
        watcher = asyncio.create_task(watch())
        try:
            started = time.monotonic()
            await asyncio.sleep(6 * same_s + 0.5)
            window = [f for f in folded if f[0] >= started]
            access = [f for f in window if f[2] is HttpAccess]
            # ~20 on a quiet machine, 17 once on a loaded CI run; with one snapshot a batch, as before, 14
            # batches would still be more snapshots than the bound below.
            assert len(access) >= 14, f"only {len(access)} batches of access lines at 0.05 s a scrape"
            # One a second, and a few more for readings that changed (one published per batch before).
            shown = [p for p in published if p[0] >= started]
            assert len(shown) <= 10, f"{len(shown)} snapshots for {len(access)} batches of access lines"
            for t, total, _ in access[:-3]:
                at = seen_by(total)
                assert at is not None and at - t <= same_s + 0.5, (t, total, at)

            # A request: its batch lines are published at once.
            assert session._client is not None
            request = {"input_ids": [7] * 64, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
            async for _ in session._client.generate_stream(request, timeout_s=30):
                pass
            await eventually_folded(folded, PrefillBatch, detail=lambda: [f[2].__name__ for f in folded[-8:]])
            t, total, _ = next(f for f in folded if f[2] is PrefillBatch)
            await session.wait_for(lambda s: s.events_total >= total, 5)
            at = seen_by(total)
            assert at is not None and at - t < 0.5 * same_s, (
                f"a batch published {at - t if at else None} s late"
            )

            # Scrapes further apart than the wait: each access line is published when the wait runs out,
            # with nothing else coming to carry it.
            session.set_intervals(server_s=3 * same_s)

            def at_new_pace() -> bool:  # the last two access lines folded a new-pace gap apart
                times = [f[0] for f in folded if f[2] is HttpAccess]
                return len(times) >= 2 and times[-1] - times[-2] >= 2 * same_s

            await eventually(at_new_pace, "an access line at the new pace", timeout=4 * 3 * same_s)
            mark = time.monotonic()
            await eventually_folded(folded, HttpAccess, after=mark, timeout=4 * 3 * same_s)
            t, total, _ = next(f for f in folded if f[2] is HttpAccess and f[0] >= mark)
            await session.wait_for(lambda s: s.events_total >= total, 2 * same_s + 1)
            at = seen_by(total)
            assert at is not None and at - t <= same_s + 0.5, f"published {at - t if at else None} s after"
        finally:
            watcher.cancel()


async def eventually_folded(
    folded: list[tuple[float, int, type]],
    kind: type,
    *,
    after: float = 0.0,
    timeout: float = 15.0,
    detail: Callable[[], object] | None = None,
) -> None:
    await eventually(
        lambda: any(f[2] is kind and f[0] >= after for f in folded),
        f"a {kind.__name__} folded",
        timeout=timeout,
        detail=detail,
    )
