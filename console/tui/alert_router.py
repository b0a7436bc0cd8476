"""Where a firing or clearing alert goes outside the host's own state: the terminal bell once per firing
(if the config wants it) and the configured hook (a local command given the alert as JSON on stdin,
console/sources/alerts.py), whose failure is said on the host's feed. The header's badge and the feed's
line are the host controller's published state (console/tui/host_ui.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from console.core.alerts import Alert, TransitionKind
from console.core.events import Event, Log
from console.sources.alerts import AlertConfig, HookRunner
from console.tui.messages import AlertChanged


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


def alert_line(alert: Alert) -> Log:
    """The feed's line for an alert's firing or clearing."""
    what = "ALERT" if alert.state is TransitionKind.FIRED else "alert cleared"
    text = f"{what} ({alert.severity}) {alert.rule}: {alert.message}"
    return Log(ts=_iso(alert.ts), host=alert.host, raw=text, message=text)


class AlertRouter:
    def __init__(
        self,
        alerts: AlertConfig,
        *,
        say: Callable[[str, list[Event]], None],
        bell: Callable[[], None],
        run: Callable[[Coroutine[Any, Any, None]], object],
        running: Callable[[], bool],
    ) -> None:
        """`say` puts lines on a host's feed, `bell` rings the terminal's bell, `run` starts a coroutine as
        the app's worker, `running` says whether the app still draws (a hook that ends after quitting says
        nothing)."""
        self.alerts = alerts
        self._say, self._bell, self._run, self._running = say, bell, run, running
        self.hook = HookRunner(alerts) if alerts.command else None

    def changed(self, message: AlertChanged) -> None:
        alert = message.alert
        if alert.state is TransitionKind.FIRED and self.alerts.bell:
            self._bell()
        if self.hook is not None:
            self._run(self._deliver(message.host, alert))

    async def _deliver(self, host: str, alert: Alert) -> None:
        assert self.hook is not None
        problem = await self.hook.deliver(alert)
        if problem is not None and self._running():
            self._say(host, [Log(ts=_iso(time.time()), host=host, raw=problem, message=problem)])
