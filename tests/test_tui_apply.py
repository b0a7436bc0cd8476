"""The console's restart flow against a twin over SSH (issue 7): from the profiles screen, ctx-200k takes
the incident's host from --mem-fraction-static 0.85 (101,134 tokens) to a verified 200k context in one
restart; a profile the planner refuses, forced, ends in a CUDA OOM that is pinned in the feed, and R rolls
back to a verified server. Each test states the host it needs: the first its own twin at the incident's
first flags, the others the module's twin once ctx-200k has been applied to it (by the command line), so
they pass alone and in any order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from textual.widgets import Input, Static

from console.sources.hosts import load_hosts
from console.sources.profile_store import ProfileStore, shipped_profile_dir
from console.sources.session_options import SessionOptions
from console.tui.app import ConsoleApp, HostEntry
from console.tui.dashboard import HostDashboard
from console.tui.messages import ApplyRequested, RollbackRequested
from console.tui.profiles import ProfilesScreen
from console.tui.screens import ApplyConfirmScreen, ConfirmScreen
from console.tui.view import display_boot
from console.twin.host import TwinHost
from tests.support.cli import run_cli
from tests.support.twins import module_twin
from tests.support.waiting import eventually
from tests.tui_support import plain

TIME_SCALE = 0.002
SIZE = (160, 48)


twin = module_twin("tui-apply-twin", time_scale=TIME_SCALE)


@pytest.fixture
def fresh_twin(tmp_path: Path) -> Iterator[TwinHost]:
    """A twin of its own, at the incident's first flags (0.85: 101,134 tokens)."""
    host = TwinHost(tmp_path / "fresh-twin", time_scale=TIME_SCALE)
    host.start_sync()
    try:
        yield host
    finally:
        host.stop_sync()


@pytest.fixture(scope="module")
def twin_at_200k(twin: TwinHost, tmp_path_factory: pytest.TempPathFactory) -> TwinHost:
    """The module's twin running ctx-200k as `apply` writes it (applied once, from the command line)."""
    home = tmp_path_factory.mktemp("apply-200k")
    res = run_cli(home, "apply", twin.name, "ctx-200k", "--yes", "--hosts", str(twin.hosts_toml), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return twin


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> ProfileStore:
    user = tmp_path_factory.mktemp("tui-apply-profiles")
    shipped = shipped_profile_dir()
    assert shipped is not None
    # A profile the planner refuses: 0.97 leaves no headroom (the twin runs out of memory at f ≥ 0.97).
    text = (shipped / "ctx-200k.toml").read_text()
    text = text.replace('name = "ctx-200k"', 'name = "ctx-200k-greedy"')
    text = text.replace("mem-fraction-static = 0.93 ", "mem-fraction-static = 0.97 ")
    (user / "ctx-200k-greedy.toml").write_text(text)
    return ProfileStore([user, shipped])


def console(twin: TwinHost, store: ProfileStore, state: Path, *, read_only: bool = False) -> ConsoleApp:
    config = load_hosts(twin.hosts_toml).get(twin.name)
    assert config is not None
    entry = HostEntry(
        twin.name,
        config=config,
        simulated=True,
        session=SessionOptions(gpu_interval_s=0.5, server_interval_s=0.5),
        restart_history_dir=state,
    )
    return ConsoleApp([entry], read_only=read_only, store=store, target=200_000, target_source="test")


def ready_pool(dash: HostDashboard) -> int | None:
    boot = display_boot(dash.snap.state) if dash.snap is not None else None
    return boot.pool.tokens if boot is not None and boot.ready and not boot.ended else None


async def test_profiles_screen_takes_the_host_to_a_verified_200k(fresh_twin, store, tmp_path) -> None:
    twin = fresh_twin
    app = console(twin, store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        dash = app.dashboards[twin.name]
        await eventually(lambda: ready_pool(dash) == 101_134, "the first boot", pilot=pilot, timeout=60)
        await eventually(
            lambda: dash.snap.server and dash.snap.server.version,
            "the server's version",
            pilot=pilot,
            timeout=60,
        )
        header = plain(dash.header.render())
        assert f"SGLang {dash.snap.server.version}" in header and "moonshotai/Kimi-K2.6" in header

        await pilot.press("p")
        await eventually(
            lambda: isinstance(app.screen, ProfilesScreen), "the profiles screen", pilot=pilot, timeout=60
        )
        screen = app.screen
        screen.stash()
        screen.open_profile("ctx-200k")
        # The running ExecStart arrives over SSH; the diff then shows the one change that matters.
        await eventually(
            lambda: app.hosts[twin.name].running_argv is not None,
            "the running ExecStart",
            pilot=pilot,
            timeout=60,
        )
        await eventually(
            lambda: "~ --mem-fraction-static 0.85 → 0.93" in screen.check.diff,
            "the diff",
            pilot=pilot,
            timeout=60,
        )
        w = screen.check.whatif
        assert w.fits and 200_000 <= w.predicted_pool_tokens < 215_000

        await pilot.press("ctrl+r")
        await eventually(
            lambda: isinstance(app.screen, ApplyConfirmScreen), "the confirmation", pilot=pilot, timeout=60
        )
        confirm = app.screen
        assert confirm.ok and "~ --mem-fraction-static 0.85 → 0.93" in confirm.diff
        assert "✔ fits" in confirm.prediction.plain
        await pilot.press("y")
        # Back on the dashboard, where the restart plays on the timeline.
        await eventually(
            lambda: not isinstance(app.screen, ProfilesScreen | ApplyConfirmScreen),
            "the dashboard",
            pilot=pilot,
            timeout=60,
        )
        track = dash.track
        assert track is not None and track.action == "apply ctx-200k"
        await eventually(lambda: track.done, "the verdict", pilot=pilot, timeout=60)
        assert track.ok, track.summary
        assert track.summary.startswith("verified: pool ")
        # The timeline ends verified, with the controller's own steps done before the boot. Its boot phases
        # come from the session's journal follower, which can be a snapshot (~100 ms) behind the
        # controller's own reading that gave the verdict: seen under a loaded suite, "▶ CUDA graphs" then.
        steps = ("validate … restart (5 steps)", "stopping", "KV pool", "ready", "verify, record")
        await eventually(
            lambda: all(f"✔ {step}" in plain(dash.timeline.render()) for step in steps),
            "the boot's phases on the timeline",
            pilot=pilot,
            timeout=30,
        )
        timeline = plain(dash.timeline.render())
        assert "apply ctx-200k verified" in timeline
        # (its five quick steps on one line, so that the boot's phases keep room in a short pane)
        for step in steps:
            assert f"✔ {step}" in timeline, (step, timeline)
        assert dash.verdict.display and "verified" in plain(dash.verdict.render())
        # The dashboard follows the new boot: a pool of at least 200k, one restart.
        await eventually(lambda: (ready_pool(dash) or 0) >= 200_000, "the new boot", pilot=pilot, timeout=60)
        boots = [b for b in dash.snap.state.boots if b.pool.tokens]
        assert boots[0].pool.tokens == 101_134 and len(boots) == 2
        # The verified numbers went into a user copy of the profile, comments kept.
        copy = store.dirs[0] / "ctx-200k.toml"
        saved = copy.read_text()
        assert "[verified]" in saved and f"pool_tokens = {boots[-1].pool.tokens}" in saved
        assert "# T(0.93) = 205,444" in saved


async def test_a_refused_profile_forced_fails_pinned_and_rolls_back(twin_at_200k, store, tmp_path) -> None:
    twin = twin_at_200k
    app = console(twin, store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        dash = app.dashboards[twin.name]
        await eventually(lambda: (ready_pool(dash) or 0) >= 200_000, "a ready boot", pilot=pilot, timeout=60)
        before = ready_pool(dash)
        app.post_message(
            ApplyRequested(twin.name, "ctx-200k-greedy")
        )  # as the palette's "Apply profile" does
        await eventually(
            lambda: isinstance(app.screen, ApplyConfirmScreen), "the confirmation", pilot=pilot, timeout=60
        )
        confirm = app.screen
        assert not confirm.ok and any("headroom" in e for e in confirm.errors)
        # As on the command line, a refused profile is forced only by typing its name: neither a
        # wrong name nor the keys y and F (letters of the name being typed) apply it.
        assert confirm.name_gate == "ctx-200k-greedy"
        await pilot.press(*"ctx-200k", "enter")
        await pilot.pause()
        assert app.screen is confirm and dash.track is None
        confirm.query_one("#apply-gate", Input).value = ""
        await pilot.press(*"ctx-200k-greedy", "enter")
        await eventually(lambda: dash.track is not None, "the apply", pilot=pilot, timeout=60)
        track = dash.track
        await eventually(lambda: track.done, "the verdict", pilot=pilot, timeout=60)
        assert track.ok is False and track.can_roll_back
        # The OOM of this boot is pinned above the feed; the banner and the timeline offer the rollback.
        await eventually(lambda: dash.feed.open_errors, "the pinned error", pilot=pilot, timeout=60)
        assert any(e.category == "cuda_oom" for e in dash.feed.open_errors)
        assert "R: roll back" in plain(dash.verdict.render())
        assert "R rolls back" in plain(dash.timeline.render())

        app.screen.set_focus(dash.gpus)
        await pilot.press("R")
        await eventually(
            lambda: isinstance(app.screen, ConfirmScreen),
            "the rollback confirmation",
            pilot=pilot,
            timeout=60,
        )
        # The failed apply left its host-side rollback armed (commit-confirmed, as from the command line):
        # the confirmation says where the rollback goes and that it settles that one.
        body = app.screen.detail
        assert "the drop-in the last apply kept" in body and "- --mem-fraction-static 0.97" in body
        assert "it is disarmed first" in body
        await pilot.press("y")
        await eventually(lambda: dash.track is not track, "the rollback", pilot=pilot, timeout=60)
        rollback = dash.track
        await eventually(lambda: rollback.done, "the rollback's verdict", pilot=pilot, timeout=60)
        assert rollback.action == "rollback" and rollback.ok, rollback.summary
        await eventually(lambda: ready_pool(dash) == before, "the server back", pilot=pilot, timeout=60)
        assert dash.feed.open_errors == []  # the OOM belonged to the failed boot, not this one


async def test_read_only_console_refuses_apply_on_a_live_host(twin, store, tmp_path) -> None:
    app = console(twin, store, tmp_path, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        dash = app.dashboards[twin.name]
        await eventually(
            lambda: dash.snap and dash.snap.connection and dash.snap.connection.state == "up",
            "the link",
            pilot=pilot,
            timeout=60,
        )
        invocation = twin.systemctl("show", "-p", "InvocationID", twin.unit).stdout
        told: list[str] = []
        notify = app.notify

        def noted(message: str, **kw: object) -> None:
            told.append(str(message))
            notify(message, **kw)  # type: ignore[arg-type]

        app.notify = noted  # type: ignore[method-assign,assignment]
        app.post_message(ApplyRequested(twin.name, "ctx-200k"))
        app.post_message(RollbackRequested(twin.name))
        # The requests are answered (a refusal, in words), not dropped unseen.
        await eventually(
            lambda: len([t for t in told if t.startswith("read-only:")]) == 2,
            "the two refusals",
            pilot=pilot,
            timeout=60,
        )
        # R and r do nothing; the key after them (p, the profiles) does: the keys were read, in order.
        await pilot.press("R", "r", "p")
        await eventually(
            lambda: isinstance(app.screen, ProfilesScreen), "the profiles screen", pilot=pilot, timeout=60
        )
        assert len(app.screen_stack) == 2 and dash.track is None and app.hosts[twin.name].busy is None
        await pilot.press("escape")
        await eventually(lambda: len(app.screen_stack) == 1, "the dashboard again", pilot=pilot, timeout=60)
        enabled = {k for k, b in app.active_bindings.items() if b.enabled}
        assert not {"r", "R"} & enabled and "p" in enabled
        assert twin.systemctl("show", "-p", "InvocationID", twin.unit).stdout == invocation


async def test_a_probe_is_kept_in_a_profile_only_when_that_profile_runs(
    twin_at_200k, store, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console's --profile is a goal, not what the server runs: a probe's tok/s go into a profile's
    `[verified]` only when the unit runs that profile as apply writes it; otherwise to the history alone,
    and the probe screen says so. (The twin runs ctx-200k here, applied by the fixture.)"""
    twin = twin_at_200k
    from console.sources.probe_history import load_history

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state-home"))
    other = await _probe_with(twin, store, tmp_path, "ctx-128k")
    assert other.not_in_force and "--mem-fraction-static" in other.not_in_force
    assert "results to the history only, not to ctx-128k" in other.title, other.title
    assert "The unit runs other flags than ctx-128k (~ --context-length" in other.title, other.title
    assert other.report_profile is None
    running = await _probe_with(twin, store, tmp_path, "ctx-200k")
    assert running.not_in_force is None and "profile ctx-200k" in running.title, running.title
    assert running.report_profile == "ctx-200k"

    kept = {name: store.load(name).verified for name in ("ctx-128k", "ctx-200k")}
    assert kept["ctx-128k"] is None or not kept["ctx-128k"].tok_s_at_depth
    assert kept["ctx-200k"] is not None and list(kept["ctx-200k"].tok_s_at_depth) == [2_000]
    # Both runs are in the history either way.
    assert len(load_history(tmp_path / "state-home" / "k26-console" / "probes.jsonl")) == 2


@dataclass
class ProbeSeen:
    title: str
    not_in_force: str | None
    report_profile: str | None


async def _probe_with(twin: TwinHost, store: ProfileStore, tmp_path: Path, profile: str) -> ProbeSeen:
    """A console opened with `--profile profile` probes 2k deep from its probe screen (P)."""
    from console.tui.probe import ProbePanel, ProbeScreen

    app = console(twin, store, tmp_path / profile)
    app.profile = profile
    async with app.run_test(size=SIZE) as pilot:
        dash = app.dashboards[twin.name]
        await eventually(lambda: (ready_pool(dash) or 0) >= 200_000, "a ready boot", pilot=pilot, timeout=60)
        await pilot.press("P")
        await eventually(
            lambda: isinstance(app.screen, ProbeScreen), "the probe screen", pilot=pilot, timeout=60
        )
        screen = app.screen
        assert isinstance(screen, ProbeScreen)
        await eventually(lambda: screen.profile_checked, "the profile check", pilot=pilot, timeout=60)
        panel = screen.query_one(ProbePanel)
        panel.query_one("#probe-depths", Input).value = "2k"
        panel.query_one("#probe-tokens", Input).value = "3"
        await pilot.click("#probe-fire")
        await eventually(lambda: panel.report is not None, "the report", pilot=pilot, timeout=60)
        report = panel.report
        assert report is not None and report.ok and report.results[0].decode_tok_s, report
        return ProbeSeen(
            plain(screen.query_one("#probe-title", Static).render()), screen.not_in_force, report.profile
        )


async def test_the_banner_follows_a_change_made_elsewhere(twin_at_200k, store, tmp_path) -> None:
    """This console's verdict stands only until the host is changed from elsewhere: a restart from the
    command line replaces it with that change's line, as the host's latest change."""
    import asyncio

    twin = twin_at_200k
    app = console(twin, store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        dash = app.dashboards[twin.name]
        await eventually(lambda: (ready_pool(dash) or 0) >= 200_000, "a ready boot", pilot=pilot, timeout=60)
        await eventually(
            lambda: app.hosts[twin.name].link is not None, "the pairing link", pilot=pilot, timeout=60
        )
        app.post_message(ApplyRequested(twin.name, "ctx-200k"))
        await eventually(
            lambda: isinstance(app.screen, ApplyConfirmScreen), "the confirmation", pilot=pilot, timeout=60
        )
        await pilot.press("y")
        await eventually(
            lambda: dash.track is not None and dash.track.done, "the verdict", pilot=pilot, timeout=60
        )
        assert dash.track.ok and "unchanged" in dash.track.summary
        assert "unchanged" in plain(dash.verdict.render())
        home = tmp_path / "elsewhere"
        restart = asyncio.get_running_loop().run_in_executor(
            None,
            lambda: run_cli(
                home, "restart", twin.name, "--yes", "--hosts", str(twin.hosts_toml), timeout=240
            ),
        )
        await eventually(
            lambda: "restarted" in plain(dash.verdict.render()),
            "the banner of the restart",
            pilot=pilot,
            timeout=240,
        )
        assert dash.track is None and "unchanged" not in plain(dash.verdict.render())
        res = await restart
        assert res.returncode == 0, (res.stdout, res.stderr)


async def test_the_banner_does_not_outlive_the_boot_it_verified(twin_at_200k, store, tmp_path) -> None:
    """A verdict describes one boot: when that server dies after it (killed here), the banner says so
    instead of "verified"; the service is then started again for the module's other tests."""
    import os
    import signal

    twin = twin_at_200k
    app = console(twin, store, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        dash = app.dashboards[twin.name]
        await eventually(lambda: (ready_pool(dash) or 0) >= 200_000, "a ready boot", pilot=pilot, timeout=60)
        app.post_message(ApplyRequested(twin.name, "ctx-200k"))
        await eventually(
            lambda: isinstance(app.screen, ApplyConfirmScreen), "the confirmation", pilot=pilot, timeout=60
        )
        await pilot.press("y")
        await eventually(
            lambda: dash.track is not None and dash.track.done, "the verdict", pilot=pilot, timeout=60
        )
        assert dash.track.ok and "✔" in plain(dash.verdict.render())
        pid = twin.main_pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await eventually(
            lambda: dash.track is None and "✔" not in plain(dash.verdict.render()),
            "the banner to drop the verdict",
            pilot=pilot,
            timeout=60,
        )
    twin.systemctl("start", twin.unit, check=False)
    assert twin.systemctl("is-active", twin.unit, check=False).stdout.strip() in ("active", "activating")
