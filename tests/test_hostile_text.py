"""Issue 30 items 2, 3 and 7, on a twin over real SSH: what a hostile host's text and dates do to the
console and the command line.

- 2: a lock holder named `mallory[/]` with an intent naming `[/opt/sglang]`, and a failure that quotes a
  path in brackets: the console shows them as text (the bar, the refusal, the palette, the break's
  confirmation, the timeline) and goes on; quitting takes its presence off the host. Read as markup, each
  was a MarkupError that ended the console and left its heartbeat behind.
- 3: bidi and zero-width characters are drawn as U+FFFD by `parse` (JSON: escaped), and the apply's
  preview of a host whose running ExecStart holds an OSC title, a bidi override and a zero-width space
  prints none of them raw.
- 7: a lock `taken_at` of year 1 (+14:00) is one sentence for `restart` and no crash for the console;
  naive and absurd dates in presence, the pending-rollback record and the audit trail are refused where
  they are read (the trail's lines skipped and counted), never an exception later.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from console.core.pairing import Identity
from console.sources.hosts import load_hosts
from console.sources.profile_store import ProfileStore, shipped_profile_dir
from console.sources.session_options import SessionOptions
from console.tui.app import ConsoleApp, HostEntry
from console.tui.host_entry import PairingOptions
from console.tui.messages import BreakRequested
from console.tui.screens import ConfirmScreen
from console.twin.host import TwinHost
from tests.support.cli import one_sentence, run_cli, wait_until
from tests.support.twins import module_twin
from tests.support.waiting import eventually

TIME_SCALE = 0.004
BOB = Identity(user="bob", jump_host="jump2", pid=5151, console_id="bob2")
OSC = "\x1b]0;pwned\x07"
BIDI = "\u202e\u2066\u200b\ufeff"
GOOD = "2026-11-30T10:00:00+00:00"


def unsafe(text: str) -> list[str]:
    """What a terminal would act on, reorder or hide (a line break between lines is fine)."""
    return [
        c for c in text if c != "\n" and not c.isprintable() and unicodedata.category(c) not in ("Zs", "Co")
    ]


twin = module_twin("hostile-text", time_scale=TIME_SCALE)


def _state_dir(twin: TwinHost) -> Path:
    path = twin.layout.home_dir / ".k26-console"
    (path / "presence").mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def host_files(twin: TwinHost) -> Iterator[Callable[[str, object], None]]:
    """Write a file into the twin's state directory as a hostile host would; all removed afterwards."""
    written: list[Path] = []

    def put(name: str, content: object) -> None:
        path = _state_dir(twin) / name
        path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
        written.append(path)

    yield put
    for path in written:
        path.unlink(missing_ok=True)


def _lock(user: str, intent: str, taken_at: str) -> dict[str, Any]:
    return {
        "holder": {"user": user, "jump_host": "evil", "pid": 4242, "console_id": "mallory1"},
        "intent": intent,
        "taken_at": taken_at,
        "lock_id": "L1",
    }


def _console(twin: TwinHost, tmp: Path) -> ConsoleApp:
    config = load_hosts(twin.hosts_toml).get(twin.name)
    assert config is not None
    entry = HostEntry(
        twin.name,
        config=config,
        simulated=True,
        session=SessionOptions(gpu_interval_s=0.5, server_interval_s=0.5),
        restart_history_dir=tmp / "controller",
        pairing=PairingOptions(heartbeat_s=0.5, poll_s=0.5),
    )
    shipped = shipped_profile_dir()
    assert shipped is not None
    return ConsoleApp([entry], store=ProfileStore([tmp / "profiles", shipped]), identity=BOB, target=200_000)


def _screen(app: ConsoleApp) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


# ------------------------------------------------------------------------------------------ 2: markup


async def test_a_lock_holder_and_a_failure_in_markup_are_shown_as_text(
    twin: TwinHost, tmp_path: Path, host_files: Callable[[str, object], None]
) -> None:
    host_files("lock", _lock("mallory[/]", "apply [/opt/sglang]", GOOD))
    app = _console(twin, tmp_path)
    told: list[str] = []
    shown = app.notify

    def notify(message: str, *args: Any, **kw: Any) -> None:
        told.append(message)
        shown(message, *args, **kw)

    app.notify = notify  # type: ignore[method-assign]
    async with app.run_test(size=(160, 48), notifications=True) as pilot:
        ctl = app.hosts[twin.name]
        await eventually(
            lambda: ctl.link and ctl.link.view and ctl.link.view.lock, "the lock", pilot=pilot, timeout=60
        )
        await eventually(
            lambda: "STALE lock mallory[/]@evil: apply [/opt/sglang]" in _screen(app),
            "the bar",
            pilot=pilot,
            timeout=60,
        )
        # The refusal, as a toast.
        await pilot.press("r")
        await eventually(lambda: told, "the refusal", pilot=pilot, timeout=60)
        await eventually(
            lambda: "twin: mallory[/]@evil holds the lock" in _screen(app),
            "the toast",
            pilot=pilot,
            timeout=60,
        )
        # The palette, whose help names the holder.
        await pilot.press("ctrl+p")
        await pilot.press(*"break")
        await eventually(
            lambda: "mallory[/]@evil's console has gone quiet" in _screen(app),
            "the palette's entry",
            pilot=pilot,
            timeout=60,
        )
        await pilot.press("escape")
        # The break's confirmation names the holder and the intent.
        app.post_message(BreakRequested(twin.name))
        await eventually(
            lambda: isinstance(app.screen, ConfirmScreen), "the confirmation", pilot=pilot, timeout=60
        )
        await eventually(
            lambda: "Holder: mallory[/]@evil (pid 4242)" in _screen(app), "its words", pilot=pilot, timeout=60
        )
        await pilot.press("n")
        # A failure whose sentence quotes a path in brackets (the console's own words for a failed change).
        ctl._fail(f"the restart failed: ExecStart runs [/opt/sglang/bin/python] {OSC}")
        await eventually(
            lambda: "the restart failed: ExecStart runs [/opt/sglang/bin/python] ␛]0;pwned" in _screen(app),
            "the failure",
            pilot=pilot,
            timeout=60,
        )
        assert app.is_running and not unsafe(_screen(app))
        await pilot.press("q")
    # It quit as a console quits: its heartbeat is off the host.
    assert wait_until(lambda: not (_state_dir(twin) / "presence" / f"{BOB.console_id}.json").exists(), 10)


# ---------------------------------------------------------------------------------- 3: bidi, zero-width


def test_parse_draws_bidi_and_zero_width_characters(tmp_path: Path) -> None:
    journal = tmp_path / "bidi.journal"
    journal.write_text(f"Nov 30 10:00:00 gpu1 python3[1]: serving {BIDI}model{OSC} \u00ad\U000e0041 end\n")
    res = run_cli(tmp_path, "parse", str(journal))
    assert res.returncode == 0 and not unsafe(res.stdout), repr(res.stdout)
    assert "serving \ufffd\ufffd\ufffd\ufffdmodel␛]0;pwned␇ \ufffd\ufffd end" in res.stdout
    res = run_cli(tmp_path, "parse", str(journal), "--json")
    assert res.returncode == 0 and not unsafe(res.stdout), repr(res.stdout)
    assert BIDI in json.loads(res.stdout)["raw"]  # the same text for a JSON reader


def test_the_apply_preview_draws_the_running_execstart_safe(twin: TwinHost, tmp_path: Path) -> None:
    # An ExecStart written on the host (not by the console) with a served model name holding an OSC
    # title, a bidi override and a zero-width space, as systemd reads them: C escapes and UTF-8.
    dropins = twin.layout.unit_dir / f"{twin.unit}.d"
    dropins.mkdir(parents=True, exist_ok=True)
    hostile = dropins / "95-hostile.conf"
    before = twin.systemctl("cat", twin.unit).stdout
    exec_start = next(line for line in reversed(before.splitlines()) if line.startswith("ExecStart=/"))
    name = "kimi\\x1b]0;pwned\\x07\u202etxt.exe\u200b"
    hostile.write_text(f"[Service]\nExecStart=\nExecStart={exec_start[10:]} --served-model-name {name}\n")
    twin.systemctl("daemon-reload")
    try:
        shown: dict[str, str] = {}
        for extra in ("", "--json"):
            res = run_cli(
                tmp_path, "apply", "twin", "ctx-200k", "--hosts", str(twin.hosts_toml), *extra.split()
            )
            assert res.returncode == 2 and "no terminal" in one_sentence(res.stderr), res.stderr
            assert not unsafe(res.stdout), repr(res.stdout)
            shown[extra] = res.stdout
        # The diff names the host's value, drawn safe; the JSON preview carries it whole, as escapes.
        assert "- --served-model-name 'kimi␛]0;pwned␇\ufffdtxt.exe\ufffd'" in shown[""], shown[""]
        preview = json.loads(shown["--json"].split("\n")[0])
        assert "- --served-model-name 'kimi\x1b]0;pwned\x07\u202etxt.exe\u200b'" in preview["diff"], preview
    finally:
        hostile.unlink()
        twin.systemctl("daemon-reload")


# ------------------------------------------------------------------------------------------- 7: dates


def test_a_lock_taken_in_year_one_is_one_sentence_for_restart(
    twin: TwinHost, tmp_path: Path, host_files: Callable[[str, object], None]
) -> None:
    host_files("lock", _lock("mallory", "restart", "0001-01-01T00:00:00+14:00"))
    res = run_cli(tmp_path, "restart", "twin", "--yes", "--hosts", str(twin.hosts_toml))
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "does not hold a console's lock" in one_sentence(res.stderr)
    assert (_state_dir(twin) / "lock").exists()  # nothing was taken, nothing broken


async def test_absurd_dates_on_the_host_do_not_stop_the_console(
    twin: TwinHost, tmp_path: Path, host_files: Callable[[str, object], None]
) -> None:
    host_files("lock", _lock("mallory", "apply ctx-200k", "0001-01-01T00:00:00+14:00"))
    who = {"user": "eve", "jump_host": "evil", "pid": 1, "looking_at": "dashboard"}
    # A heartbeat without an offset (naive: TypeError against the host's clock) and one in year 9999.
    host_files(
        "presence/eve1.json",
        {**who, "console_id": "eve1", "since": "2026-11-30T10:00:00", "heartbeat": "2026-11-30T10:00:00"},
    )
    host_files(
        "presence/eve2.json",
        {
            **who,
            "console_id": "eve2",
            "since": GOOD,
            "heartbeat": "9999-12-31T23:59:59-14:00",
            "interval_s": 1e308,
        },
    )
    host_files(
        "pending-rollback.json",
        {
            "unit": twin.unit,
            "timer": "k26-rollback-x.timer",
            "deadline": "0001-01-01T00:00:00+14:00",
            "armed_at": GOOD,
            "armed_by": "mallory@evil",
            "confirm_within_s": "Infinity",
        },
    )
    trail = _state_dir(twin) / "audit.jsonl"
    kept = trail.read_text() if trail.exists() else None
    entry = {"user": "mallory", "host": "twin", "action": "apply", "outcome": "ok", "profile": "ctx-200k"}
    lines = [
        {**entry, "ts": "0001-01-01T00:00:00+14:00"},
        {**entry, "ts": GOOD, "durations": {"kv_pool": 1e308, "restart": 1e308}},
        {**entry, "ts": GOOD, "total_s": "Infinity"},
        {**entry, "ts": GOOD, "profile": "readable-one"},
    ]
    trail.write_text((kept or "") + "".join(json.dumps(line) + "\n" for line in lines) + "[" * 5000 + "\n")
    try:
        app = _console(twin, tmp_path)
        async with app.run_test(size=(160, 48), notifications=True) as pilot:
            ctl = app.hosts[twin.name]
            await eventually(lambda: ctl.link and ctl.link.view, "the host's state", pilot=pilot, timeout=60)
            await eventually(
                lambda: "mallory applied readable-one" in _screen(app), "the trail", pilot=pilot, timeout=60
            )
            view = ctl.link.view
            assert view.lock is None and view.pending_rollback is None  # refused where read
            assert not {"eve1", "eve2"} & {p.console_id for p in view.presence}
            await pilot.press("ctrl+p")
            await pilot.press("escape")
            await pilot.press("r")
            await pilot.pause()  # the key's handling and what it posted, drawn
            await pilot.pause()
            assert app.is_running
            await pilot.press("q")
        res = run_cli(tmp_path, "audit", "twin", "--hosts", str(twin.hosts_toml))
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
        assert "readable-one" in res.stdout and "skipped 4 unreadable line(s)" in res.stderr, res
    finally:
        if kept is None:
            trail.unlink()
        else:
            trail.write_text(kept)
