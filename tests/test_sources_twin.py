"""The live sources against twin hosts behind the real OpenSSH sshd on 127.0.0.2-4.

- The key resilience test: the SSH connection is killed 20 times (sshd's per-connection process gets
  SIGKILL) while a restart prints ~2,000 lines; the events the session holds equal, line for line, what
  the journal holds — nothing lost, nothing twice.
- The GPU back-ends over SSH: the NVML agent (a pynvml stand-in on the session's PYTHONPATH) gives the
  same sample as local NVML through the same stand-in; nvidia-smi gives the twin's GPUs; a host whose
  python3 has no pynvml falls back to nvidia-smi on its own.
- Three twins sampled at once; one of them hangs (its sshd and sessions stopped with SIGSTOP): the other
  two keep getting snapshots on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from console.core.gpus import SamplerState
from console.core.snapshot import ConnState, FollowState, HostSnapshot
from console.sources.gpus import (
    AgentSampler,
    NvidiaSmiSampler,
    NvidiaSmiStreamSampler,
    NvmlSampler,
    open_sampler,
)
from console.sources.hosts import HostConfig
from console.sources.journal import JournalFollower
from console.sources.session import HostSession
from console.sources.session_options import SessionOptions
from console.sources.transport import Backoff, Transport
from console.twin.host import DEFAULT_UNIT, TwinHost
from console.twin.layout import GpuInventory
from tests.support.folds import FoldTap
from tests.support.procs import processes_of
from tests.support.sshd import SshdHandle, sshd_unavailable_reason, start_sshd
from tests.test_sources_gpus import EXPECTED, STANDIN, _load

pytestmark = [
    pytest.mark.sshd,
    pytest.mark.skipif(sshd_unavailable_reason() is not None, reason=sshd_unavailable_reason() or ""),
]

UNIT = DEFAULT_UNIT
RESTART_LINES = 2000

# Prints `first_lines` lines in its first life, then RESTART_LINES on every later start (a traceback in
# the middle of each), pausing `pause` s every 10 lines so that a restart's output takes a few seconds;
# stops at once on SIGTERM.
FAKE_SERVER = r"""
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
counter, restart_lines, first_lines, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
starts = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
open(counter, "w").write(str(starts))
total = first_lines if starts == 1 else restart_lines
for i in range(total):
    print(f"[start {starts}] line {i:05d} of {total}", flush=True)
    if i == total // 2:
        print("Traceback (most recent call last):", flush=True)
        print('  File "/opt/sglang/scheduler.py", line 42, in event_loop', flush=True)
        print("    self.step()", flush=True)
        print("RuntimeError: a traceback in the middle of the restart", flush=True)
    if i % 10 == 0 and pause:
        time.sleep(pause)
while True:
    time.sleep(0.1)
"""


@dataclass
class Host:
    twin: TwinHost
    sshd: SshdHandle
    config: HostConfig


def _fake_twin(
    root: Path, name: str, first_lines: int = 10, pause: float = 0.04, nvml: bool = True
) -> TwinHost:
    root.mkdir(parents=True, exist_ok=True)
    script = root / "fake_server.py"
    script.write_text(FAKE_SERVER)
    return TwinHost(
        root / "state",
        name=name,
        ssh=False,
        server_command=[
            sys.executable,
            str(script),
            str(root / "starts"),
            str(RESTART_LINES),
            str(first_lines),
            str(pause),
        ],
        wait_ready=False,
        start_service=True,
        gpus=GpuInventory(name="NVIDIA RTX PRO 6000 Blackwell Server Edition", count=8, total_mib=97887),
        nvml=nvml,
    )


@contextlib.contextmanager
def _host(
    root: Path, name: str, address: str, extra_env: dict[str, str] | None = None, **fake: float | bool
) -> Iterator[Host]:
    twin = _fake_twin(root, name, **fake)  # type: ignore[arg-type]
    twin.start_blocking()
    try:
        env = {**twin.session_env(), **(extra_env or {})}
        sshd = start_sshd(root / "sshd", listen=address, session_env=env)
        try:
            config = HostConfig(
                name=name,
                ssh=f"{sshd.user}@{address}",
                port=sshd.port,
                unit=UNIT,
                identity_file=sshd.client_key,
                known_hosts=sshd.known_hosts,
            )
            yield Host(twin, sshd, config)
        finally:
            _signal_tree(sshd.process.pid, signal.SIGCONT)
            sshd.stop()
    finally:
        twin.stop_blocking()


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            # The command name may hold spaces and parentheses: the fields after the last ")" are fixed.
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def _signal_tree(pid: int, sig: signal.Signals) -> None:
    for p in [pid, *_descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)


def _kill_connections(sshd: SshdHandle) -> int:
    """SIGKILL sshd's per-connection processes: to the client, the network dropped the connection."""
    killed = 0
    for pid in _children(sshd.process.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed


def _journal(twin: TwinHost, *args: str) -> list[dict[str, object]]:
    """What the twin's journal holds for the unit, read on the twin itself (not over SSH)."""
    out = subprocess.run(
        [str(twin.layout.bin_dir / "journalctl"), "-u", UNIT, "-o", "json", "--all", "--no-pager", *args],
        env=twin.session_env(),
        capture_output=True,
        check=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines()]


def _lines(snapshot: HostSnapshot) -> list[str]:
    """The journal lines behind the session's events, in order (a traceback event carries all of its)."""
    lines: list[str] = []
    for event in snapshot.recent:
        event_lines = getattr(event, "lines", None)
        lines.extend(event_lines if event_lines else [event.raw])
    return lines


@pytest.fixture
async def session_host(tmp_path: Path) -> AsyncIterator[Host]:
    with _host(tmp_path / "a", "gpu-a", "127.0.0.2") as host:
        yield host


@pytest.mark.serial  # its 20 kills must land while one restart prints: starved by parallel tests, they
# outlast the restart (a 15 s wait for a moving stream timed out in a 4-worker run)
async def test_twenty_connection_kills_during_a_restart_lose_and_repeat_nothing(session_host: Host) -> None:
    host = session_host
    session = HostSession(
        host.config,
        SessionOptions(
            ssh_config=(),
            backoff=Backoff(initial_s=0.1, max_s=0.5, stable_s=0),
            sample_gpus=False,
            poll_server=False,
            keep_events=20_000,
            idle_flush_s=0.5,
        ),
    )
    rng = random.Random(26)
    async with session:
        first = await session.wait_for(lambda s: s.follower.entries >= 10, 15)
        assert first.connection and first.connection.state is ConnState.UP
        tasks_before = len(asyncio.all_tasks())
        restart = asyncio.ensure_future(asyncio.to_thread(host.twin.systemctl, "restart", UNIT))
        kills, started = 0, time.monotonic()
        while kills < 20:
            # Kill only a live stream that has moved since the last kill, on a connection made after it
            # (the last kill counted as a drop): entries still buffered from the killed connection can
            # move the count, and a kill during the next login is a failed connect, not a drop.
            seen = session.follower.status.entries if session.follower else 0
            await session.wait_for(
                lambda s, seen=seen, kills=kills: (
                    s.follower.state is FollowState.FOLLOWING
                    and s.follower.entries > seen
                    and s.connection is not None
                    and s.connection.state is ConnState.UP
                    and s.connection.drops >= kills
                ),
                15,
            )
            await asyncio.sleep(rng.uniform(0.02, 0.12))
            kills += _kill_connections(host.sshd) > 0
        kill_window = time.monotonic() - started
        await restart
        # Let the restart finish printing, then wait for the session to hold every entry of the journal.
        cursor = first.recent[0].cursor
        assert cursor is not None
        expected: list[dict[str, object]] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            expected = _journal(host.twin, "--cursor", cursor)
            if len(expected) >= RESTART_LINES + 14 and session.snapshot.follower.entries == len(expected):
                break
            await asyncio.sleep(0.2)
        # The parser holds a traceback until the journal has been idle for idle_flush_s, then releases
        # it: wait until the session holds every line (a line lost for good fails below, at the deadline).
        journal_lines = Counter(str(e["MESSAGE"]) for e in expected)
        deadline = time.monotonic() + session.idle_flush_s + 15
        while journal_lines - Counter(_lines(session.snapshot)) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        snap = session.snapshot
        # A console stays open for days across drops: each reconnect replaces its tasks, never adds.
        tasks_after = len(asyncio.all_tasks())
    messages = [str(e["MESSAGE"]) for e in expected]
    held = _lines(snap)
    lost = sum((Counter(messages) - Counter(held)).values())
    repeated = sum((Counter(held) - Counter(messages)).values())
    print(
        f"\nkill test: {kills} kills in {kill_window:.1f} s, {snap.follower.entries} entries, "
        f"{snap.follower.restarts} journalctl restarts, lost {lost}, repeated {repeated}, "
        f"drops {snap.connection.drops if snap.connection else '?'}"
    )
    assert sum(1 for m in messages if "line " in m and "[start 2]" in m) == RESTART_LINES
    assert (lost, repeated) == (0, 0)
    assert held == messages  # line for line, in journal order
    assert snap.follower.entries == len(expected)
    cursors = [e.cursor for e in snap.recent if e.cursor]
    assert len(cursors) == len(set(cursors))
    assert snap.connection is not None and snap.connection.drops >= 20
    assert snap.follower.restarts >= 20
    assert tasks_after <= tasks_before + 2, (tasks_before, tasks_after)
    errors = [e for e in snap.recent if e.kind == "error"]
    assert [len(e.lines) for e in errors] == [4, 4]  # each life's traceback came through whole, once


async def test_gpu_back_ends_over_ssh_give_the_same_samples(tmp_path: Path) -> None:
    standin = tmp_path / "standin"
    standin.mkdir()
    (standin / "pynvml.py").write_text(STANDIN)
    # A python3 without nvidia-ml-py of its own, given the stand-in module on its PYTHONPATH.
    with _host(tmp_path / "b", "gpu-b", "127.0.0.3", {"PYTHONPATH": str(standin)}, nvml=False) as host:
        transport = Transport(host.config, ssh_config=[])
        try:
            started = time.monotonic()
            await transport.wait_up(10)
            connect_s = time.monotonic() - started

            agent = AgentSampler(transport, interval_s=0.25)
            samples = [await agent.sample() for _ in range(3)]
            await agent.close()
            local = await NvmlSampler(_load(standin / "pynvml.py")).sample()
            assert all(s.state is SamplerState.OK and s.backend == "agent" for s in samples), samples
            assert samples[0].gpus == local.gpus == EXPECTED

            smi = await NvidiaSmiSampler(transport, host="gpu-b").sample()
            assert smi.state is SamplerState.OK and len(smi.gpus) == 8
            assert {g.name for g in smi.gpus} == {"NVIDIA RTX PRO 6000 Blackwell Server Edition"}
            assert all(g.memory_total_mib == 97887.0 and g.uuid for g in smi.gpus)
            assert [g.index for g in smi.gpus] == list(range(8))
            print(f"\nconnect over real sshd: {connect_s * 1000:.0f} ms")
        finally:
            await transport.close()


async def test_host_without_pynvml_falls_back_to_nvidia_smi(tmp_path: Path) -> None:
    """A host whose python3 has no nvidia-ml-py: the fallback streams. Every tick's answer comes down one
    channel (a command per tick cost two SSH channels a second), and the host's loop ends once the
    channel closes."""
    with _host(tmp_path / "a", "gpu-a", "127.0.0.2", nvml=False) as session_host:
        await _nvidia_smi_fallback(session_host)


async def _nvidia_smi_fallback(session_host: Host) -> None:
    transport = Transport(session_host.config, ssh_config=[])
    try:
        sampler, first = await open_sampler(transport, interval_s=0.25)
        assert isinstance(sampler, NvidiaSmiStreamSampler), first
        assert first.state is SamplerState.OK and len(first.gpus) == 8
        later = [await sampler.sample() for _ in range(4)]
        assert all(s.state is SamplerState.OK and len(s.gpus) == 8 for s in later), later
        assert sampler.streams_started == 1
        assert _loops_on_host(session_host), "the nvidia-smi loop is not running on the host"
        await sampler.close()
        deadline = time.monotonic() + 5
        while _loops_on_host(session_host) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not _loops_on_host(session_host), "the nvidia-smi loop outlived its channel"
    finally:
        await transport.close()


def _loops_on_host(host: Host) -> list[str]:
    """This machine plays the host: the `sh` loops of the nvidia-smi back-end that this test's twin
    sessions run (they carry its K26_TWIN_ROOT); another console's loops on the machine are not counted."""
    return processes_of(host.twin.layout.root, cmdline_has="@@k26-nvidia-smi")


@pytest.mark.serial  # the live hosts' sampling gaps are timed: measured with no other test running
async def test_three_hosts_one_hangs_the_others_stay_on_time(tmp_path: Path) -> None:
    tick = 0.5
    with contextlib.ExitStack() as stack:
        hosts = [
            stack.enter_context(_host(tmp_path / name, name, address))
            for name, address in (("gpu-2", "127.0.0.2"), ("gpu-3", "127.0.0.3"), ("gpu-4", "127.0.0.4"))
        ]
        sessions = [
            HostSession(
                h.config,
                SessionOptions(ssh_config=(), gpu_interval_s=tick, poll_server=False, keepalive_interval=1.0),
            )
            for h in hosts
        ]
        for s in sessions:
            await s.start()
        try:
            for s in sessions:
                await s.wait_for(
                    lambda snap: snap.gpus is not None and snap.gpus.state is SamplerState.OK, 20
                )
            # Each sample as the session folds it (an unchanged one is not published at once, so the
            # snapshots no longer show every sample).
            taps = {s.host.name: FoldTap(s) for s in sessions}

            def stamps(name: str) -> list[float]:
                return [t for t, sample in taps[name].gpu if sample.state is SamplerState.OK]

            async def until(done: Callable[[], bool], what: str) -> None:
                deadline = time.monotonic() + 30
                while not done():
                    assert time.monotonic() < deadline, (
                        f"timed out waiting for {what}: {[stamps(n) for n in taps]}"
                    )
                    await asyncio.sleep(tick / 5)

            # The baseline, in this run and under whatever else the machine is doing: the live hosts'
            # gaps while no host hangs.
            await until(lambda: min(len(stamps("gpu-2")), len(stamps("gpu-4"))) >= 8, "eight samples each")
            baseline = {name: stamps(name) for name in ("gpu-2", "gpu-4")}
            for tap in taps.values():
                tap.gpu.clear()
            hung = hosts[1]
            _signal_tree(hung.sshd.process.pid, signal.SIGSTOP)

            # Watch until each live host has sampled ten times (~5 s at this tick) and the hung one's
            # snapshot says so.
            def watched_enough() -> bool:
                hung_gpus = sessions[1].snapshot.gpus
                live = min(len(stamps("gpu-2")), len(stamps("gpu-4")))
                return live >= 10 and hung_gpus is not None and hung_gpus.state is SamplerState.ERROR

            await until(watched_enough, "ten samples of the live hosts and the hung host's error")
            for tap in taps.values():
                tap.on = False
            hung_snap = sessions[1].snapshot
        finally:
            _signal_tree(hosts[1].sshd.process.pid, signal.SIGCONT)
            for s in sessions:
                await s.close()
    for name in ("gpu-2", "gpu-4"):
        times = stamps(name)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        before = [b - a for a, b in itertools.pairwise(baseline[name])]
        assert len(times) >= 6, (name, times)
        # On time: no gap longer than the tick allows, or than the same host showed before the hang
        # (a loaded machine stretches both alike; a host waiting on the hung one stretches only these).
        limit = max(tick * 2.5, 1.5 * max(before))
        assert max(gaps) < limit, (name, gaps, before)
    # The hung host's samples stopped; its snapshot says why instead of pretending.
    assert len(stamps("gpu-3")) <= 1
    assert hung_snap.gpus is not None and hung_snap.gpus.state is SamplerState.ERROR


async def test_follower_backlog_throughput_and_bounded_queue(tmp_path: Path) -> None:
    """A backlog of 5,000 entries: read at full speed (the figure is printed), then again through a
    16-entry queue with a consumer that lags — the queue never grows past its bound, nothing is lost."""
    backlog = 5000
    with _host(tmp_path / "c", "gpu-c", "127.0.0.2", first_lines=backlog, pause=0) as host:
        deadline = time.monotonic() + 30
        while len(_journal(host.twin)) < backlog + 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        expected = [str(e["MESSAGE"]) for e in _journal(host.twin)]
        transport = Transport(host.config, ssh_config=[])
        try:
            fast = JournalFollower(transport, UNIT, backlog=10_000, scope_to_invocation=False)
            fast.start()
            started, got = time.monotonic(), []
            while len(got) < len(expected):
                got += [str(e["MESSAGE"]) for e in await asyncio.wait_for(fast.next_batch(), 10)]
            rate = len(got) / (time.monotonic() - started)
            await fast.close()
            assert got == expected

            slow = JournalFollower(transport, UNIT, backlog=10_000, queue_max=16, scope_to_invocation=False)
            slow.start()
            got, most = [], 0
            while len(got) < len(expected):
                most = max(most, slow.pending)
                batch = await asyncio.wait_for(slow.next_batch(), 10)
                got += [str(e["MESSAGE"]) for e in batch]
                await asyncio.sleep(0.002)  # the lagging consumer
            await slow.close()
            assert got == expected and most <= 16
            print(f"\nfollower: {rate:,.0f} entries/s over SSH (backlog of {len(expected)})")
        finally:
            await transport.close()
