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
from tests.support.folds import FoldTap
from tests.support.waiting import eventually


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
        await session.wait_for(
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
        # Each reading as the session folds it: one that reads as the last (an idle host's) is not
        # published at once, so the snapshots no longer show every reading.
        tap = FoldTap(session)

        def gpu_ts() -> list[float]:
            return [s.ts for _, s in tap.gpu if s.ts is not None]

        def server_ts() -> list[float]:
            return [s.ts for _, s in tap.server if s.ts is not None]

        await eventually(
            lambda: len(gpu_ts()) >= 6 and len(server_ts()) >= 5,
            "six GPU samples and five server readings",
            timeout=45,
            detail=lambda: (gpu_ts(), server_ts()),
        )
        assert all(s.state is SamplerState.OK for _, s in tap.gpu), tap.gpu
        # The host's loop keeps its own time: the stream was started again with the new interval.
        assert getattr(poller.sampler, "streams_started", 0) >= started + 1
        assert getattr(poller.sampler, "interval_s", None) == 2.0
        # Skip the first gaps (readings already under way when the interval changed). The median: a
        # loaded machine can hand the console two of the host's samples in one read (stamped together).
        gpu_gaps = [b - a for a, b in itertools.pairwise(gpu_ts()[2:])]
        server_gaps = [b - a for a, b in itertools.pairwise(server_ts()[2:])]
        assert gpu_gaps and statistics.median(gpu_gaps) > 1.5, gpu_ts()
        assert server_gaps and statistics.median(server_gaps) > 2.5, server_ts()

        # Faster again: the next server reading comes now, not when the 3 s wait runs out.
        last = server_ts()[-1]
        asked = time.time()
        session.set_intervals(gpu_s=0.25, server_s=0.5)
        await eventually(lambda: server_ts()[-1] > last, "a server reading after the change", timeout=10)
        assert next(t for t in server_ts() if t > last) - asked < 1.5
