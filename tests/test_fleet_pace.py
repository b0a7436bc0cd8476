"""A session's polling retuned while it runs (what the fleet view does to the hosts not on screen), on a
twin over SSH: the GPU stream restarts at the new interval without an error sample, a slower server
interval spaces the readings out, and a faster one takes effect at once."""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Iterator

import pytest

from console.core.gpus import SamplerState
from console.sources.hosts import load_hosts
from console.sources.session import HostSession
from console.sources.session_options import SessionOptions
from console.twin.host import TwinHost


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwinHost]:
    host = TwinHost(
        tmp_path_factory.mktemp("fleet-pace") / "state",
        name="pace",
        time_scale=0.004,
        ssh_host="127.0.0.31",
    )
    host.start_sync()
    try:
        yield host
    finally:
        host.stop_sync()


async def test_gpu_and_server_intervals_change_while_the_session_runs(twin: TwinHost) -> None:
    config = load_hosts(twin.hosts_toml).get(twin.name)
    assert config is not None
    session = HostSession(
        config, SessionOptions(follow_journal=False, gpu_interval_s=0.25, server_interval_s=0.5)
    )
    async with session:
        snap = await session.wait_for(
            lambda s: s.gpus is not None and s.gpus.state is SamplerState.OK and s.server is not None, 30
        )
        poller = session.poller
        assert poller is not None and poller.sampler is not None
        # Over SSH the GPUs are read from one long-lived stream (the NVML agent or the nvidia-smi loop).
        started = getattr(poller.sampler, "streams_started", None)
        assert started is not None, poller.sampler

        # Slower: the GPUs every 2 s, the server every 3 s.
        session.set_intervals(gpu_s=2.0, server_s=3.0)
        assert poller.interval_s == 2.0 and session.server_interval_s == 3.0
        gpu_ts: list[float] = []
        server_ts: list[float] = []
        deadline = time.monotonic() + 45
        async for snap in session.snapshots():
            assert snap.gpus is not None and snap.gpus.state is SamplerState.OK, snap.gpus
            if snap.gpus.ts is not None and (not gpu_ts or snap.gpus.ts != gpu_ts[-1]):
                gpu_ts.append(snap.gpus.ts)
            stamp = snap.server.ts if snap.server is not None else None
            if stamp is not None and (not server_ts or stamp != server_ts[-1]):
                server_ts.append(stamp)
            if len(gpu_ts) >= 6 and len(server_ts) >= 5:
                break
            assert time.monotonic() < deadline, (gpu_ts, server_ts)
        # The host's loop keeps its own time: the stream was started again with the new interval.
        assert getattr(poller.sampler, "streams_started", 0) >= started + 1
        assert getattr(poller.sampler, "interval_s", None) == 2.0
        # Skip the first gaps (readings already under way when the interval changed). The median: a
        # loaded machine can hand the console two of the host's samples in one read (stamped together).
        gpu_gaps = [b - a for a, b in itertools.pairwise(gpu_ts[2:])]
        server_gaps = [b - a for a, b in itertools.pairwise(server_ts[2:])]
        assert gpu_gaps and statistics.median(gpu_gaps) > 1.5, gpu_ts
        assert server_gaps and statistics.median(server_gaps) > 2.5, server_ts

        # Faster again: the next server reading comes now, not when the 3 s wait runs out.
        last = server_ts[-1]
        asked = time.time()
        session.set_intervals(gpu_s=0.25, server_s=0.5)
        snap = await session.wait_for(
            lambda s: s.server is not None and s.server.ts is not None and s.server.ts > last, 10
        )
        assert snap.server is not None and snap.server.ts is not None
        assert snap.server.ts - asked < 1.5
