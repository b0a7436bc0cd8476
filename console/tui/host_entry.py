"""A host the console shows, as the command line hands it over."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from console.core.pairing import DEFAULT_STALE_FACTOR
from console.sources.hosts import HostConfig
from console.sources.session_options import SessionOptions


@dataclass(frozen=True)
class PairingOptions:
    """The pairing link's paces: `heartbeat_s` (how often this console says it is here), `poll_s` (how
    often the presence directory and the lock are read), and how many missed beats make a heartbeat
    stale."""

    heartbeat_s: float | None = None
    poll_s: float | None = None
    stale_factor: float = DEFAULT_STALE_FACTOR


@dataclass
class HostEntry:
    """One host the console shows. `prepare` (blocking, run in a thread) produces the config when it is
    not known up front (the demo starts its twin first); `after_start` runs once the session is up."""

    name: str
    config: HostConfig | None = None
    simulated: bool = False
    sandbox: bool = False
    """The console's config, profiles and histories are a temporary sandbox (the demo): the header says so."""
    learn: bool = False
    """Learn the host's SGLang, flag list and model over SSH once connected (`k26-console host`); the
    console's commands turn it on (a few SSH commands and one flag extraction per SGLang version)."""
    prepare: Callable[[], HostConfig] | None = None
    after_start: Callable[[], object] | None = None
    session: SessionOptions = field(default_factory=SessionOptions)
    """How the host's session reads it; a pace left None follows the fleet's plan."""
    restart_history_dir: Path | None = None
    """Where the host's service controller keeps its restart history (tests: a temporary directory);
    None: the console's state dir."""
    confirm_within_s: float | None = None
    """The deadline of the host-side rollback an apply from the console arms (`open --confirm-within`);
    None: the command line's default, from this host's usual restart; 0 arms none."""
    pairing: PairingOptions = field(default_factory=PairingOptions)
    """How this console beats its heartbeat and reads who is there; a pace left None follows the
    fleet's plan (or the console's own default)."""
