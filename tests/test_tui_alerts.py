"""Alerts in the console: a firing shows in the header and the feed, rings the bell once and runs the
configured hook (a real script that saves its stdin); the clearing is said too. Fed corpus events and
GPU samples like the other dashboard tests."""

from __future__ import annotations

import asyncio
import io
import json
import sys
import time
from pathlib import Path

from rich.console import Console

from console.core.alerts import parse_rules
from console.sources.alerts import AlertConfig
from console.sources.profile_store import ProfileStore, shipped_profile_dir
from console.tui.app import ConsoleApp, HostEntry
from tests.tui_support import NOW, corpus_events, gpu_sample, snapshot

GIB = 1024.0


def plain(renderable: object) -> str:
    console = Console(width=200, file=io.StringIO(), record=True)
    console.print(renderable)
    return console.export_text()


def app_with(alerts: AlertConfig) -> ConsoleApp:
    shipped = shipped_profile_dir()
    return ConsoleApp(
        [HostEntry("gpu1")],
        clock=lambda: NOW,
        connect=False,
        store=ProfileStore([shipped] if shipped else []),
        alerts=alerts,
    )


async def until(cond, timeout_s: float = 20.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.05)
    return bool(cond())


def feed_alerts(app: ConsoleApp) -> list[str]:
    return [
        line for line in app.dashboards["gpu1"].feed.visible_lines() if "ALERT" in line or "alert" in line
    ]


async def test_an_alert_fires_rings_once_runs_the_hook_and_clears(tmp_path: Path) -> None:
    saved = tmp_path / "alerts.jsonl"
    hook = tmp_path / "hook.py"
    hook.write_text(
        "import sys\nwith open(sys.argv[1], 'ab') as out:\n    out.write(sys.stdin.buffer.read())\n"
    )
    config = AlertConfig(
        rules=parse_rules(["gpu_mem_free_gib < 1", "error"]),
        bell=True,
        command=(sys.executable, str(hook), str(saved)),
    )
    app = app_with(config)
    rings: list[float] = []
    events = corpus_events("case-31")  # a clean boot, serving
    async with app.run_test(size=(160, 48)) as pilot:
        app.bell = lambda: rings.append(time.monotonic())  # type: ignore[method-assign]
        header = app.dashboards["gpu1"].header
        full = gpu_sample([287.5 * GIB] * 8, 288 * GIB)  # 0.5 GiB free on every GPU
        app.post_snapshot(snapshot(events, full))
        await pilot.pause()
        assert await until(lambda: saved.exists() and saved.read_text().count("\n") >= 1)
        fired = json.loads(saved.read_text().splitlines()[0])
        assert fired["rule"] == "gpu_mem_free_gib < 1" and fired["state"] == "fired"
        assert fired["host"] == "gpu1" and fired["value"] == 0.5 and fired["severity"] == "warning"
        assert "ALERT gpu_mem_free_gib < 1" in plain(header.render())
        assert len(rings) == 1
        assert any(
            "ALERT (warning) gpu_mem_free_gib < 1: gpu_mem_free_gib = 0.5" in x for x in feed_alerts(app)
        )
        # Still full: nothing new, no second ring, no second hook run.
        app.post_snapshot(snapshot(events, full, seq=2))
        await pilot.pause()
        assert len(rings) == 1 and len(feed_alerts(app)) == 1
        # Memory freed: the alert clears, in the feed and in the header, and the hook hears it.
        app.post_snapshot(snapshot(events, gpu_sample([200.0 * GIB] * 8, 288 * GIB), seq=3))
        await pilot.pause()
        assert await until(lambda: saved.read_text().count("\n") >= 2)
        cleared = json.loads(saved.read_text().splitlines()[1])
        assert cleared["rule"] == "gpu_mem_free_gib < 1" and cleared["state"] == "cleared"
        assert "ALERT" not in plain(header.render())
        assert any("alert cleared (warning) gpu_mem_free_gib < 1" in x for x in feed_alerts(app))
        assert len(rings) == 1


async def test_the_worst_alert_is_the_badge_a_failing_hook_is_said_once_and_the_bell_can_be_off(
    tmp_path: Path,
) -> None:
    hook = tmp_path / "broken.py"
    runs = tmp_path / "runs"
    hook.write_text(
        f"import sys\nsys.stdin.read()\nopen({str(runs)!r}, 'a').write('run\\n')\nprint('pager down')\nsys.exit(4)\n"
    )
    config = AlertConfig(
        rules=parse_rules(["gpu_mem_free_gib < 1", "error"]),
        bell=False,
        command=(sys.executable, str(hook)),
    )
    app = app_with(config)
    rings: list[float] = []
    async with app.run_test(size=(160, 48)) as pilot:
        app.bell = lambda: rings.append(time.monotonic())  # type: ignore[method-assign]
        header = app.dashboards["gpu1"].header
        # A boot that logged a scheduler exception, on full GPUs: two alerts, the error is the critical one.
        app.post_snapshot(snapshot(corpus_events("case-01"), gpu_sample([287.5 * GIB] * 8, 288 * GIB)))
        await pilot.pause()
        assert "ALERT error +1" in plain(header.render())
        said = "exited with status 4: pager down."

        def failures() -> list[str]:
            return [x for x in app.dashboards["gpu1"].feed.visible_lines() if said in x]

        assert await until(lambda: len(failures()) >= 1)
        # The second alert's run fails the same way: once both runs have ended, it was not said again.
        assert await until(lambda: runs.exists() and runs.read_text().count("\n") == 2)
        assert await until(lambda: not [w for w in app.workers if w.group == "alerts" and w.is_running])
        await pilot.pause()
        assert len(failures()) == 1
        assert rings == []


async def test_a_latency_rule_fires_on_the_sessions_serving_figures() -> None:
    # The window's latencies reach the rules from the snapshot's serving figures (the session's window of
    # /metrics scrapes): an ITL rule fires on them, and does not without them.
    from tests.test_tui_serving import serving_snapshot

    snap = serving_snapshot()
    assert snap.serving is not None
    config = AlertConfig(rules=parse_rules(["itl_p50_s > 0.000001"]), bell=False)
    app = app_with(config)
    async with app.run_test(size=(160, 48)) as pilot:
        app.post_snapshot(snap.model_copy(update={"serving": None}))
        await pilot.pause()
        assert "ALERT" not in plain(app.dashboards["gpu1"].header.render())
        app.post_snapshot(snap.model_copy(update={"seq": snap.seq + 1}))
        await pilot.pause()
        assert await until(lambda: "ALERT itl_p50_s" in plain(app.dashboards["gpu1"].header.render()))
