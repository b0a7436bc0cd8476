"""Issue 30 item 5: what a GPU host's sampler prints is held to its range before anything draws it.

A host runs whatever it calls `python3`: here a stand-in on the host's PATH (over the real sshd) prints
what a broken or hostile NVML agent could, one line per tick. Before: NaN or Infinity in a memory figure
crashed the console (OverflowError, exit 0), 10,000 GPUs pinned a core and `q` took 11 s, a negative
memory was drawn, a line over the SSH window restarted the agent forever.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from console.core.gpus import MAX_GPUS, HostGpuSample, SamplerState, sample_from_agent_line
from console.sources.gpus import LINE_MAX_BYTES, AgentSampler
from console.sources.hosts import HostConfig
from console.sources.transport import Backoff, Transport
from tests.support.sshd import SshdHandle, sshd_unavailable_reason, start_sshd
from tests.tui_support import corpus_events, make_app, plain, snapshot

GIB = 1024.0


def _gpu(index: int, used: object, total: object = 97_887.0, util: object = 37) -> dict[str, object]:
    return {
        "index": index,
        "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "uuid": f"GPU-{index:08d}",
        "utilization_pct": util,
        "memory_used_mib": used,
        "memory_total_mib": total,
        "processes": [{"pid": 4242, "name": "python3", "used_memory_mib": used}],
    }


def _line(gpus: list[dict[str, object]]) -> str:
    # json.dumps writes NaN and Infinity as Python's json reads them back: what a hostile agent sends
    return json.dumps({"state": "ok", "gpus": gpus})


GOOD = _line([_gpu(i, 80_000.0) for i in range(8)])
HOSTILE = {
    "nan": _line([_gpu(0, math.nan), *(_gpu(i, 80_000.0) for i in range(1, 8))]),
    "infinity": _line([_gpu(0, math.inf, math.inf, math.inf), *(_gpu(i, 80_000.0) for i in range(1, 8))]),
    "negative": _line([_gpu(0, -5_000.0, util=-3), *(_gpu(i, 80_000.0) for i in range(1, 8))]),
    "over total": _line([_gpu(0, 200_000.0), *(_gpu(i, 80_000.0) for i in range(1, 8))]),
    "10,000 GPUs": _line(
        [{"index": i, "memory_used_mib": 1.0, "memory_total_mib": 2.0} for i in range(10_000)]
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_value_out_of_range_is_refused_and_said(name: str) -> None:
    sample = sample_from_agent_line(HOSTILE[name], host="gpu1")
    if name == "10,000 GPUs":
        assert sample.state is SamplerState.ERROR and sample.gpus == ()
        assert sample.detail == (
            f"the GPU sampler reported 10,000 GPUs; more than {MAX_GPUS} is no host's: sample refused."
        )
        return
    assert sample.state is SamplerState.OK and len(sample.gpus) == 8
    first = sample.gpus[0]
    assert first.memory_used_mib is None and first.refused
    assert sample.detail is not None and sample.detail.startswith("values out of range refused: GPU0 ")
    for g in sample.gpus:
        for value in (g.memory_used_mib, g.memory_total_mib, g.utilization_pct):
            assert value is None or (math.isfinite(value) and value >= 0)
    assert all(g.refused == () for g in sample.gpus[1:])
    # what the recording writes reads back the same: held to the same range
    again = HostGpuSample.model_validate(json.loads(sample.model_dump_json()))
    assert again == sample


@pytest.mark.parametrize("name", list(HOSTILE))
async def test_the_console_draws_a_hostile_sample_and_quits_at_once(name: str) -> None:
    sample = sample_from_agent_line(HOSTILE[name], host="gpu1")
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        app.post_snapshot(snapshot(corpus_events("case-31"), sample))
        await pilot.pause()
        text = plain(app.dashboards["gpu1"].gpus.render())
        if name == "10,000 GPUs":
            assert "sample refused" in text and "GPU9999" not in text
        else:
            # the refused value is drawn as missing, never as a bar of NaN, infinite or negative GiB
            row = next(line for line in text.split("\n") if line.startswith("GPU0"))
            assert "█" not in row and " —/" in row, row
            assert "GPU1  ███" in text and "78.1/95.6 GiB" in text
        started = time.monotonic()
        await pilot.press("q")
        await pilot.pause()
    assert time.monotonic() - started < 2.0


needs_sshd = pytest.mark.skipif(sshd_unavailable_reason() is not None, reason=sshd_unavailable_reason() or "")


@pytest.fixture
def hostile_host(tmp_path: Path) -> Iterator[tuple[SshdHandle, Path]]:
    """A host whose `python3` prints the lines of `lines.txt`, one a tick, then waits for its stdin to close."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    lines = tmp_path / "lines.txt"
    fake = bindir / "python3"
    fake.write_text(
        "#!/bin/sh\n"
        f'while IFS= read -r line; do printf "%s\\n" "$line"; sleep 0.05; done < "{lines}"\n'
        "cat > /dev/null\n"
    )
    fake.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    handle = start_sshd(
        tmp_path / "sshd",
        listen="127.0.0.2",
        session_env={"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(home)},
    )
    try:
        yield handle, lines
    finally:
        handle.stop()


@needs_sshd
@pytest.mark.sshd
async def test_the_agent_stream_goes_on_past_hostile_lines(hostile_host: tuple[SshdHandle, Path]) -> None:
    sshd, lines = hostile_host
    huge = _line([_gpu(i, 1.0, 2.0) for i in range(8)]).replace('"python3"', '"' + "p" * (3 << 20) + '"', 1)
    lines.write_text("\n".join([*HOSTILE.values(), huge, GOOD]) + "\n")
    config = HostConfig(
        name="gpu-h",
        ssh=f"{sshd.user}@{sshd.host}",
        port=sshd.port,
        identity_file=sshd.client_key,
        known_hosts=sshd.known_hosts,
    )
    transport = Transport(config, ssh_config=[], backoff=Backoff(max_attempts=3))
    sampler = AgentSampler(transport, interval_s=0.25, patience_s=10)
    try:
        samples = [await sampler.sample() for _ in range(len(HOSTILE) + 2)]
    finally:
        await sampler.close()
        await transport.close()
    states = [s.state for s in samples]
    assert states == [*(SamplerState.OK,) * 4, SamplerState.ERROR, SamplerState.ERROR, SamplerState.OK]
    assert samples[5].detail == (
        f"the GPU agent sent a line of {len(huge.encode()):,} bytes, over the {LINE_MAX_BYTES:,}-byte limit: "
        "not read."
    )
    assert samples[-1].gpus[0].memory_used_mib == 80_000.0  # the line after them is read as before
    assert sampler.streams_started == 1  # the agent was never restarted
