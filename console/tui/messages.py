"""What widgets, screens and the palette ask of the console, as Textual messages.

Each bubbles up to the app, which hands it to the named host's controller: no widget reaches into the
app or a controller by itself.
"""

from __future__ import annotations

from textual.message import Message

from console.core.alerts import Alert


class SnapshotReady(Message):
    """A newer snapshot of `host` waits to be shown (one such message in flight per host)."""

    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host


class AlertChanged(Message):
    """An alert of `host` fired or cleared (`alert.state`); `worst` is the most severe alert still firing
    after it and `firing` how many are."""

    def __init__(self, host: str, alert: Alert, worst: Alert | None, firing: int) -> None:
        super().__init__()
        self.host = host
        self.alert = alert
        self.worst = worst
        self.firing = firing


class HostRequest(Message):
    """The operator asked for something on `host`."""

    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host


class RestartRequested(HostRequest):
    """Restart the service (after a confirmation), followed on the timeline."""


class RollbackRequested(HostRequest):
    """Roll back the last apply (after a confirmation)."""


class ApplyRequested(HostRequest):
    """Apply the saved profile `profile`: preview, confirmation, restart, verification."""

    def __init__(self, host: str, profile: str) -> None:
        super().__init__(host)
        self.profile = profile


class BreakRequested(HostRequest):
    """Break another console's stale lock (after a confirmation)."""


class ProfilesRequested(HostRequest):
    """Open the profile editor on `host`, on `select` if given."""

    def __init__(self, host: str, select: str | None = None) -> None:
        super().__init__(host)
        self.select = select


class ProbeRequested(HostRequest):
    """Open the probe screen on `host`."""


class HostChosen(HostRequest):
    """Show `host`'s dashboard."""
