"""Where a firing or clearing alert goes in the console: the host's header badge, a line on its feed, the
terminal bell once per firing (if the config wants it) and the configured hook (a local command given the
alert as JSON on stdin, console/sources/alerts.py), whose failure is said on the feed."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Mapping
from datetime import UTC, datetime
from typing import Any

from console.core.alerts import Alert, TransitionKind
from console.core.events import Log
from console.sources.alerts import AlertConfig, HookRunner
from console.tui.dashboard import HostDashboard
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
        dashboards: Mapping[str, HostDashboard],
        *,
        bell: Callable[[], None],
        run: Callable[[Coroutine[Any, Any, None]], object],
        running: Callable[[], bool],
    ) -> None:
        """`bell` rings the terminal's bell, `run` starts a coroutine as the app's worker, `running` says
        whether the app still draws (a hook that ends after quitting says nothing)."""
        self.alerts = alerts
        self.dashboards = dashboards
        self._bell, self._run, self._running = bell, run, running
        self.hook = HookRunner(alerts) if alerts.command else None

    def changed(self, message: AlertChanged) -> None:
        dash = self.dashboards.get(message.host)
        if dash is None:
            return
        alert = message.alert
        dash.header.show_alert(message.worst, message.firing)
        dash.feed.add_external([alert_line(alert)])
        if alert.state is TransitionKind.FIRED and self.alerts.bell:
            self._bell()
        if self.hook is not None:
            self._run(self._deliver(message.host, alert))

    async def _deliver(self, host: str, alert: Alert) -> None:
        assert self.hook is not None
        problem = await self.hook.deliver(alert)
        dash = self.dashboards.get(host)
        if problem is not None and dash is not None and self._running():
            dash.feed.add_external([Log(ts=_iso(time.time()), host=host, raw=problem, message=problem)])
