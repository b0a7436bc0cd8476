"""The console's KV gauge, given no --target-context or --profile, takes the target of the profile the host's
audit trail says it was last applied with, as `snapshot` and `export` do (issue 34 item 2: the console said
"none" where `export` said ctx-200k's 200,000). The trail's entries go to the host's controller as the live
link (and a replay) hands them; ctx-200k is the shipped profile."""

from __future__ import annotations

from datetime import UTC, datetime

from console.core.audit import AuditEntry
from console.core.pairing import Identity
from console.tui.app import ConsoleApp
from tests.tui_support import corpus_events, gpu_sample, make_app, snapshot

GIB = 1024.0
ALICE = Identity(user="alice", jump_host="jump1", pid=4242, console_id="alice-console")
T0 = datetime(2026, 5, 30, 12, 1, 33, tzinfo=UTC)


def _screen(app: ConsoleApp) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def _apply(profile: str, outcome: str) -> AuditEntry:
    return AuditEntry.by(
        ALICE, ts=T0, host="gpu1", action="apply", profile=profile, outcome=outcome, pool_tokens=218_484
    )


async def _dashboard(app: ConsoleApp, pilot) -> None:
    app.post_snapshot(snapshot(corpus_events("case-01"), gpu_sample([240.0 * GIB] * 8, 288 * GIB)))
    await pilot.pause()


async def test_without_a_target_the_gauge_takes_the_last_applied_profiles() -> None:
    app = make_app(target=None)
    async with app.run_test(size=(160, 48)) as pilot:
        await _dashboard(app, pilot)
        assert "none (pass --profile or --target-context)" in _screen(app)
        ctl = app.hosts["gpu1"]
        # A failed apply is not the profile in force.
        ctl._on_audit([_apply("ctx-256k", "failed")])
        await pilot.pause()
        assert "none (pass --profile or --target-context)" in _screen(app)
        ctl._on_audit([_apply("ctx-200k", "ok")])
        await pilot.pause()
        screen = _screen(app)
        assert "200,000 (profile ctx-200k, last applied)" in screen, screen
        assert "none (pass --profile" not in screen


async def test_a_target_given_on_the_command_line_stays() -> None:
    app = make_app(target=32_768)
    async with app.run_test(size=(160, 48)) as pilot:
        await _dashboard(app, pilot)
        app.hosts["gpu1"]._on_audit([_apply("ctx-200k", "ok")])
        await pilot.pause()
        screen = _screen(app)
        assert "32,768 (--target-context)" in screen, screen
        assert "last applied" not in screen
