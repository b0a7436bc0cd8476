"""How a `HostSession` reads its host: one frozen set of options, changed with `dataclasses.replace`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from console.core.serving import DEFAULT_WINDOW_S
from console.sources.gpus import DEFAULT_INTERVAL_S, BackendChoice
from console.sources.transport import Backoff

DEFAULT_SERVER_INTERVAL_S = 2.0


@dataclass(frozen=True)
class SessionOptions:
    """What a session reads and how often. The two paces may be left `None`: the session then reads at
    its own default, and a fleet's pace (`console.tui.fleet.FleetPacer`) may set them; a pace set here
    is the host's own and the fleet leaves it."""

    # The SSH link, when the session makes its own transport.
    ssh_config: tuple[str | Path, ...] | None = None
    backoff: Backoff | None = None
    connect_timeout: float = 10.0
    keepalive_interval: float | None = None
    # The journal.
    follow_journal: bool = True
    journal_cursor: str | None = None
    journal_backlog: int = 5000
    journalctl: tuple[str, ...] = ("journalctl",)
    systemctl: tuple[str, ...] = ("systemctl",)
    # The GPUs.
    sample_gpus: bool = True
    gpu_interval_s: float | None = None
    gpu_backend: BackendChoice = "auto"
    nvml: Any = None
    """An NVML module to read the GPUs with (tests pass a stand-in); None: pynvml, where it is."""
    # The server.
    poll_server: bool = True
    server_interval_s: float | None = None
    health_interval_s: float = 30.0
    # What is kept, and the snapshots' cadence.
    keep_events: int = 2000
    serving_window_s: float = DEFAULT_WINDOW_S
    idle_flush_s: float = 1.0
    publish_interval_s: float = 0.1

    @property
    def gpu_s(self) -> float:
        return DEFAULT_INTERVAL_S if self.gpu_interval_s is None else self.gpu_interval_s

    @property
    def server_s(self) -> float:
        return DEFAULT_SERVER_INTERVAL_S if self.server_interval_s is None else self.server_interval_s
