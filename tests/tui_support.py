"""Pinned inputs for the TUI tests: real corpus events, fixed GPU samples, a fixed clock."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console

from console.core.events import Event
from console.core.gpus import GpuProcess, GpuSample, HostGpuSample, SamplerState
from console.core.parser import parse_lines
from console.core.snapshot import ConnectionStatus, ConnState, HostSnapshot
from console.core.state import HostState
from console.sources.profile_store import ProfileStore, shipped_profile_dir
from console.tui.app import ConsoleApp, HostEntry

CORPUS = Path(__file__).resolve().parent.parent.parent / "shared" / "corpus" / "public"
NOW = 1_780_000_000.0


def corpus_events(case: str) -> list[Event]:
    return list(parse_lines((CORPUS / f"{case}.log").read_text().splitlines(), host="gpu1"))


def gpu_sample(
    used_mib: Sequence[float], total_mib: float, *, pid: int | None = None, util: float = 37.0
) -> HostGpuSample:
    gpus = tuple(
        GpuSample(
            index=i,
            name="AMD Instinct MI355X",
            utilization_pct=util,
            memory_used_mib=u,
            memory_total_mib=total_mib,
            processes=(GpuProcess(pid=pid, name="python3", used_memory_mib=u),) if pid else (),
        )
        for i, u in enumerate(used_mib)
    )
    return HostGpuSample(state=SamplerState.OK, backend="nvidia-smi", gpus=gpus, ts=NOW - 2, host="gpu1")


def snapshot(
    events: Sequence[Event], gpus: HostGpuSample | None, *, ts: float = NOW, seq: int = 1
) -> HostSnapshot:
    return HostSnapshot(
        host="gpu1",
        seq=seq,
        ts=ts,
        connection=ConnectionStatus(host="gpu1", state=ConnState.UP, since=NOW - 60),
        state=HostState().apply_all(events),
        gpus=gpus,
        recent=tuple(events[-2000:]),
        events_total=len(events),
    )


def make_app(
    *,
    read_only: bool = False,
    target: int | None = 200_000,
    store: ProfileStore | None = None,
    profile: str | None = None,
    theme: str = "dark",
    clock: Callable[[], float] | None = None,
) -> ConsoleApp:
    """A console with no session; profiles come from `store` (default: only the shipped examples, so a
    test never reads or writes the user's own)."""
    shipped = shipped_profile_dir()
    return ConsoleApp(
        [HostEntry("gpu1")],
        read_only=read_only,
        target=target,
        target_source="--target-context" if target else None,
        clock=clock if clock is not None else lambda: NOW,
        connect=False,
        store=store if store is not None else ProfileStore([shipped] if shipped else []),
        profile=profile,
        theme=theme,
    )


def plain(renderable: object, width: int = 150) -> str:
    console = Console(width=width, file=io.StringIO(), record=True)
    console.print(renderable)
    return console.export_text()
