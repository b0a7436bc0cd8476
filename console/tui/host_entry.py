"""A host the console shows, as the command line hands it over."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from console.sources.hosts import HostConfig


@dataclass
class HostEntry:
    """One host the console shows. `prepare` (blocking, run in a thread) produces the config when it is
    not known up front (the demo starts its twin first); `after_start` runs once the session is up."""

    name: str
    config: HostConfig | None = None
    simulated: bool = False
    sandbox: bool = False
    learn: bool = False
    """Learn the host's SGLang, flag list and model over SSH once connected (`k26-console host`); the
    console's commands turn it on (a few SSH commands and one flag extraction per SGLang version)."""
    """The console's config, profiles and histories are a temporary sandbox (the demo): the header says so."""
    prepare: Callable[[], HostConfig] | None = None
    after_start: Callable[[], object] | None = None
    session_options: dict[str, object] = field(default_factory=dict)
    controller_options: dict[str, object] = field(default_factory=dict)
    """Passed to `ServiceController` (tests keep its restart history in a temporary `state_dir`)."""
    confirm_within_s: float | None = None
    """The deadline of the host-side rollback an apply from the console arms (`open --confirm-within`);
    None: the command line's default, from this host's usual restart; 0 arms none."""
    pairing_options: dict[str, object] = field(default_factory=dict)
    """Passed to `HostStateDir` (`heartbeat_s`, `stale_factor`), except `poll_s`: how often the
    presence directory and the lock are read."""
