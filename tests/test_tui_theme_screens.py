"""A theme change repaints every screen (issue 35 item 1), read off what the compositor sends the terminal:
each screen kind is opened, the theme switched, and a known coloured element's segments must carry the new
theme's colour for its role and no longer the old one's. The dashboard is the positive control (it
repainted before); the profiles editor, the probe screen, the help and confirm dialogs, the fleet overview
and the replay's bar each kept the old theme's colours until their next change of figures.

Also the screens not on top: one under a dialog when the theme changes, and an installed help screen that
is off the stack then, must be in the new theme when they come back."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from textual.app import App
from textual.strip import Strip
from textual.widget import Widget

from console.sources.hosts import HostConfig
from console.sources.profile_store import ProfileStore, shipped_profile_dir
from console.sources.recording import RecordingReader
from console.sources.replay import Replay
from console.tui.fleet import FleetView
from console.tui.probe import ProbePanel, ProbeScreen
from console.tui.profiles import ProfilesScreen
from console.tui.replay import ReplayApp
from console.tui.screens import ApplyConfirmScreen, ConfirmScreen, HelpScreen, prediction_text
from console.tui.themes import DARK, HIGH_CONTRAST, LIGHT, THEMES, palette_for
from tests.support.waiting import eventually
from tests.test_replay_opening import DATA
from tests.test_tui_fleet import fleet_app, host_snapshot
from tests.test_tui_probe import EARLIER, finished_sweep
from tests.test_tui_profiles import K25, RUNNING
from tests.test_tui_serving import serving_snapshot
from tests.tui_support import corpus_events, make_app, snapshot

SIZE = (160, 48)
REPAINT_S = 5.0
"""A repaint is the next frame or two; this only bounds a failure."""


def colour_of(theme: str, role: str) -> str:
    return palette_for(THEMES[theme]).colour(role).upper()


def variable_of(theme: str, name: str) -> str:
    """A theme's own variable (`success`, `warning`) as the fleet's cells take it."""
    from textual.color import Color

    variables = {**THEMES[theme].to_color_system().generate(), **THEMES[theme].variables}
    return Color.parse(variables[name]).hex6.upper()


def drawn(app: App[Any], *widgets: Widget) -> set[str]:
    """The foreground colours of the segments the compositor composes for the screen on top, inside the
    widgets' regions: what the terminal is sent, not what a widget would render if asked."""
    strips: list[Strip] = app.screen._compositor.render_strips()
    screen = app.screen.region
    colours: set[str] = set()
    for widget in widgets:
        region = widget.region.intersection(screen)
        for y in range(region.y, region.bottom):
            for seg in strips[y].crop(region.x, region.right):
                colour = seg.style.color if seg.style is not None else None
                if colour is not None and colour.triplet is not None:
                    colours.add(colour.triplet.hex.upper())
    return colours


async def in_theme(
    pilot: Any, theme: str, before: str, roles: Iterable[str], *widgets: Widget, what: str
) -> None:
    """The widgets draw each role in `theme`'s colour, none in `before`'s."""
    wanted = {colour_of(theme, r) for r in roles}
    stale = {colour_of(before, r) for r in roles} - wanted
    assert wanted.isdisjoint(stale)

    def ok() -> bool:
        seen = drawn(pilot.app, *widgets)
        return wanted <= seen and not (stale & seen)

    await eventually(
        ok,
        f"{what} in the {theme} theme",
        pilot=pilot,
        timeout=REPAINT_S,
        detail=lambda: (
            f"drew {sorted(drawn(pilot.app, *widgets))}, wanted {sorted(wanted)} not {sorted(stale)}"
        ),
    )


async def switch(pilot: Any, theme: str) -> None:
    pilot.app.theme = theme
    await pilot.pause()


def _profiles_store(tmp_path: Path) -> ProfileStore:
    user = tmp_path / "user"
    user.mkdir()
    (user / "k25-3m.toml").write_text(K25)
    shipped = shipped_profile_dir()
    assert shipped is not None
    return ProfileStore([user, shipped])


async def test_the_dashboard_repaints_in_a_new_theme() -> None:
    # The positive control: the dashboard restyled before this change, read the same way as the rest.
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.post_snapshot(serving_snapshot())
        await pilot.pause()
        dash = app.dashboards["gpu1"]
        panels = (dash.kv, dash.serving)
        await in_theme(pilot, DARK, LIGHT, ("muted", "info"), *panels, what="the KV and serving panels")
        await in_theme(pilot, DARK, LIGHT, ("muted",), dash.header, what="the header")
        await switch(pilot, LIGHT)
        await in_theme(pilot, LIGHT, DARK, ("muted", "info"), *panels, what="the KV and serving panels")
        await in_theme(pilot, LIGHT, DARK, ("muted",), dash.header, what="the header")


async def test_the_profiles_editor_its_help_and_its_save_dialog_repaint(tmp_path: Path) -> None:
    app = make_app(store=_profiles_store(tmp_path), profile="k25-3m")
    app.hosts["gpu1"].running_argv = list(RUNNING)
    async with app.run_test(size=SIZE) as pilot:
        app.post_snapshot(snapshot(corpus_events("case-01"), None))
        await pilot.pause()
        await pilot.press("p")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ProfilesScreen)
        title, side = screen.query_one("#profiles-title"), screen.query_one("#profile-side")
        plist = screen.query_one("#profile-list")
        # the title's labels, the checks' verdicts (3M tokens at f=0.83 does not fit: bad) and the list's
        # origins (faint)
        await in_theme(pilot, DARK, LIGHT, ("muted",), title, what="the profiles title")
        await in_theme(pilot, DARK, LIGHT, ("muted", "bad", "ok"), side, what="the checks")
        await in_theme(pilot, DARK, LIGHT, ("faint",), plist, what="the profile list")
        await switch(pilot, LIGHT)
        await in_theme(pilot, LIGHT, DARK, ("muted",), title, what="the profiles title")
        await in_theme(pilot, LIGHT, DARK, ("muted", "bad", "ok"), side, what="the checks")
        await in_theme(pilot, LIGHT, DARK, ("faint",), plist, what="the profile list")

        # The help on top of it, then the theme changes under the help: both follow.
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        close = app.screen.query_one("#help-close")
        await in_theme(pilot, LIGHT, DARK, ("muted",), close, what="the help's last line")
        await switch(pilot, HIGH_CONTRAST)
        await in_theme(pilot, HIGH_CONTRAST, LIGHT, ("muted",), close, what="the help's last line")
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is screen
        await in_theme(
            pilot, HIGH_CONTRAST, LIGHT, ("muted",), title, what="the profiles title after the help"
        )
        await in_theme(
            pilot, HIGH_CONTRAST, LIGHT, ("muted", "bad", "ok"), side, what="the checks after the help"
        )

        # The help screen is kept installed off the stack: changed meanwhile, it comes back in the theme.
        await switch(pilot, DARK)
        await pilot.press("f1")
        await pilot.pause()
        assert app.screen.query_one("#help-close") is close
        await in_theme(pilot, DARK, HIGH_CONTRAST, ("muted",), close, what="the kept help's last line")
        await pilot.press("escape")
        await pilot.pause()

        # The save dialog: the edit line by line (+ ok, - bad) and where it goes (muted).
        screen.editor.load_text(K25.replace("0.83", "0.80"))
        await pilot.pause()
        await pilot.press("ctrl+s")
        await eventually(lambda: app.screen is not screen, "the save dialog", pilot=pilot, timeout=REPAINT_S)
        edit = app.screen.query_one("#save-edit")
        await in_theme(pilot, DARK, LIGHT, ("muted", "ok", "bad"), edit, what="the save dialog's edit")
        await switch(pilot, LIGHT)
        await in_theme(pilot, LIGHT, DARK, ("muted", "ok", "bad"), edit, what="the save dialog's edit")


class _Preview:
    predicted_pool_tokens = 120_000
    headroom_gib = 1.5
    fits = False


async def test_the_confirm_and_apply_dialogs_and_the_dashboard_help_repaint() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(ConfirmScreen("Roll back gpu1?", "to ctx-128k: --context-length 131072"))
        await pilot.pause()
        detail = app.screen.query_one("#confirm-detail")
        await in_theme(pilot, DARK, LIGHT, ("muted",), detail, what="the confirmation's detail")
        await switch(pilot, LIGHT)
        await in_theme(pilot, LIGHT, DARK, ("muted",), detail, what="the confirmation's detail")
        app.pop_screen()
        await pilot.pause()

        app.push_screen(
            ApplyConfirmScreen(
                "Apply ctx-200k to gpu1?",
                ok=False,
                diff=["+ --context-length 200000", "- --context-length 131072", "~ --mem-fraction-static"],
                prediction=prediction_text(_Preview(), 200_000),
                errors=["the pool is below the target"],
                warnings=["a warning"],
                note="No host-side rollback is armed (--confirm-within 0).",
            )
        )
        await pilot.pause()
        box = app.screen
        parts = [box.query_one(f"#apply-{p}") for p in ("diff", "prediction", "notes")]
        await in_theme(pilot, LIGHT, DARK, ("ok", "bad", "warn", "muted"), *parts, what="the apply dialog")
        await switch(pilot, HIGH_CONTRAST)
        await in_theme(
            pilot, HIGH_CONTRAST, LIGHT, ("ok", "bad", "warn", "muted"), *parts, what="the apply dialog"
        )
        app.pop_screen()
        await pilot.pause()

        # The dashboard's help: the GPU panel's help names its memory segments' colours by role.
        app.dashboards["gpu1"].gpus.focus()
        await pilot.press("f1")
        await pilot.pause()
        body = app.screen.query_one("#help-panel")
        await in_theme(pilot, HIGH_CONTRAST, DARK, ("kv", "weights"), body, what="the GPU panel's help")
        await switch(pilot, DARK)
        await in_theme(pilot, DARK, HIGH_CONTRAST, ("kv", "weights"), body, what="the GPU panel's help")


async def test_the_probe_screen_repaints(tmp_path: Path) -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        host = HostConfig(name="gpu1", ssh="nobody@127.0.0.1", unit="sglang.service")
        app.push_screen(
            ProbeScreen(host, history=tmp_path / "probes.jsonl", profile="ctx-200k", store=app.store)
        )
        await pilot.pause()
        panel = app.screen.query_one(ProbePanel)
        panel.show_report(finished_sweep(), EARLIER)
        await pilot.pause()
        parts = [
            app.screen.query_one(f"#{p}")
            for p in ("probe-title", "probe-table", "probe-notes", "probe-chart")
        ]
        # the title's profile (muted), the refused depth (warn), attention-bound notes (bad), the curve (ok)
        roles = ("muted", "warn", "bad", "ok")
        await in_theme(pilot, DARK, LIGHT, roles, *parts, what="the probe screen")
        await switch(pilot, LIGHT)
        await in_theme(pilot, LIGHT, DARK, roles, *parts, what="the probe screen")


async def test_the_fleet_overview_repaints_on_screen_and_off_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # The overview redraws its rows each second while on screen, in the theme then in force: stopped here,
    # so that what repaints it is the theme change alone (on a busy machine two pauses took a second).
    monkeypatch.setattr(FleetView, "_tick", lambda self: None)
    app = fleet_app(("gpu-a", "gpu-b"))
    async with app.run_test(size=SIZE) as pilot:
        app.post_snapshot(host_snapshot("gpu-a", "case-31"))
        app.post_snapshot(host_snapshot("gpu-b", "case-01"))
        await pilot.pause()
        await pilot.press("o")
        await pilot.pause()
        fleet = app.fleet
        assert fleet is not None and fleet.is_on_screen
        table = fleet.table

        def level(theme: str) -> set[str]:
            return {variable_of(theme, "success"), variable_of(theme, "error")}

        async def fleet_in(theme: str, before: str, what: str) -> None:
            await eventually(
                lambda: level(theme) <= drawn(app, table) and not (level(before) & drawn(app, table)),
                what,
                pilot=pilot,
                timeout=REPAINT_S,
                detail=lambda: sorted(drawn(app, table)),
            )

        await fleet_in(DARK, LIGHT, "the fleet in the dark theme")
        # On screen: repainted by the theme change.
        app.theme = LIGHT
        await pilot.pause()
        await pilot.pause()
        seen = drawn(app, table)
        assert level(LIGHT) <= seen and not (level(DARK) & seen), sorted(seen)
        # Off screen (a host's tab in front) when the theme changes: back on screen in the new theme.
        await pilot.press("enter")
        await eventually(lambda: app.active_dashboard is not None, "the host's dashboard", pilot=pilot)
        app.theme = HIGH_CONTRAST
        await pilot.pause()
        await pilot.press("o")
        await pilot.pause()
        await pilot.pause()
        seen = drawn(app, table)
        assert level(HIGH_CONTRAST) <= seen and not (level(LIGHT) & seen), sorted(seen)


async def test_the_replay_bar_repaints_while_paused() -> None:
    with RecordingReader(DATA) as reader:
        app = ReplayApp(Replay(reader), DATA)
        async with app.run_test(size=SIZE) as pilot:
            await app.wait_settled()
            assert not app.playing  # paused: nothing else redraws the bar
            line = app.bar.line
            # the timeline (faint), its phases (info), the restart (warn) and what comes next (muted)
            roles = ("faint", "info", "warn", "muted")
            await in_theme(pilot, DARK, LIGHT, roles, line, what="the replay bar")
            await switch(pilot, LIGHT)
            await in_theme(pilot, LIGHT, DARK, roles, line, what="the replay bar")


async def test_the_note_under_the_timeline_repaints_in_a_new_theme() -> None:
    # The host's last change, from its audit trail, stays under the timeline until the next entry: its
    # colour was set once, so the dashboard sets it again after a theme change.
    from datetime import UTC, datetime

    from console.core.audit import AuditEntry
    from console.core.pairing import Identity
    from console.tui.host_ui import HostUi

    alice = Identity(user="alice", jump_host="jump1", pid=4242, console_id="alice-console")
    entry = AuditEntry.by(
        alice,
        ts=datetime(2026, 12, 7, 6, 0, tzinfo=UTC),
        host="gpu1",
        action="apply",
        profile="ctx-200k",
        outcome="ok",
        pool_tokens=218_484,
    )
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        app.post_snapshot(snapshot(corpus_events("case-01"), None))
        await pilot.pause()
        dash = app.dashboards["gpu1"]
        dash.present(HostUi(last_change=entry))
        await eventually(lambda: dash.timeline.note is not None, "the note", pilot=pilot, timeout=REPAINT_S)
        await in_theme(pilot, DARK, LIGHT, ("info",), dash.timeline, what="the note under the timeline")
        await switch(pilot, LIGHT)
        await in_theme(pilot, LIGHT, DARK, ("info",), dash.timeline, what="the note under the timeline")
