"""No apply waits forever (issue 20, item 2; item 5's changed program).

- a flag value or a command line over what Linux and systemd take is refused before anything is
  written, the limit named (the 1 MB value once made an exec fail with E2BIG and `apply` sit in
  "launching" until killed, leaving the lock);
- every phase of the boot has a deadline from the host's history: a boot that stops making progress
  (here a profile whose program is `/bin/sh -c 'exec sleep …'`, which the twin starts and which never
  logs) ends as failed when its phase runs past it, and is rolled back when asked;
- a profile that changes the unit's program is shown as such, and needs its name typed (or --yes).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import pytest

from console.core.flags import load_flag_list
from console.core.profiles import parse_profile, validate_profile
from console.core.restart import Phase, RestartMachine, RestartRecord
from console.core.systemd import MAX_ARG_STRLEN, render_dropin
from console.sources.hosts import HostConfig, load_hosts
from console.sources.profile_store import ProfileStore
from console.sources.service import ServiceController, history_path
from console.sources.transport import Transport
from console.twin.host import TwinHost
from tests.support.cli import CLI, CTX200K, operator_env, wait_until
from tests.support.twins import module_twin

TIME_SCALE = 0.002


def _text(name: str, *, command: str | None = None, extra: str = "") -> str:
    text = CTX200K.replace('name = "ctx-200k"', f'name = "{name}"')
    if command is not None:
        text = text.replace('command = ["python3", "-m", "sglang.launch_server"]', f"command = {command}")
    return text.replace("[flags]\n", "[flags]\n" + extra, 1)


SLEEPER = '["/bin/sh", "-c", "exec sleep 600", "sh"]'


# ---- sizes ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1_000_000, 70_000])
def test_an_oversized_flag_value_is_an_error_naming_the_limit(size: int) -> None:
    profile = parse_profile(_text("big", extra=f'served-model-name = "{"x" * size}"\n'), name="big")
    report = validate_profile(profile, load_flag_list(profile.sglang_version))
    assert not report.ok
    first = report.errors[0]
    assert first.where == "flags.served-model-name" and first.code == "too_long"
    assert f"{size:,} bytes" in first.message and f"MAX_ARG_STRLEN = {MAX_ARG_STRLEN:,}" in first.message
    assert any("LONG_LINE_MAX" in e.message and "ARG_MAX" in e.message for e in report.errors)
    with pytest.raises(ValueError, match="MAX_ARG_STRLEN"):
        render_dropin(report.argv or ["python3", "--x", "y" * size])


def test_many_medium_values_are_refused_as_a_whole_command_line() -> None:
    extra = "".join(
        f'{flag} = "{"v" * 9000}"\n'
        for flag in ("served-model-name", "tokenizer-path", "revision", "chat-template")
    )
    profile = parse_profile(_text("wide", extra=extra), name="wide")
    report = validate_profile(profile, load_flag_list(profile.sglang_version))
    assert [e.where for e in report.errors] == ["command"], report.errors
    assert "whole command line" in report.errors[0].message and "LineMax" in report.errors[0].message


# ---- deadlines (the machine) ---------------------------------------------------------------------------


def test_a_phase_past_its_deadline_is_overdue() -> None:
    history = [{"restart": 0.1, "stopping": 1.0, "launching": 2.0, "loading_weights": 10.0}] * 3
    m = RestartMachine("p", now=0.0, history=history, phase_factor=3.0, phase_margin_s=5.0)
    for step in (Phase.VALIDATE, Phase.DIFF, Phase.WRITE_DROPIN, Phase.DAEMON_RELOAD, Phase.RESTART):
        m.step_done(step, 0.0)
    assert m.phase == Phase.STOPPING and m.phase_limit() == 6.0  # max(3 x 1.0, 1.0 + 5)
    assert m.overdue(5.9) is None
    said = m.overdue(6.5)
    assert said is not None and "stuck in stopping for 6.5 s" in said and "1.0 s" in said
    m.timed_out(6.5, said)
    assert m.phase == Phase.FAILED and m.reason == said
    fresh = RestartMachine("p", now=0.0)
    assert fresh.phase_limit(Phase.LAUNCHING) == 600.0  # no history: the default
    assert fresh.phase_limit(Phase.VERIFY) is None  # the controller's own steps have command timeouts


# ---- against a twin ------------------------------------------------------------------------------------


twin = module_twin("limits-twin", time_scale=TIME_SCALE)


def _host(twin: TwinHost) -> HostConfig:
    host = load_hosts(twin.hosts_toml).get(twin.name)
    assert host is not None
    return host


def _host_state(twin: TwinHost) -> tuple[dict[str, str], str]:
    d = twin.layout.unit_dir / f"{twin.unit}.d"
    files = {p.name: p.read_text() for p in sorted(d.iterdir())} if d.is_dir() else {}
    return files, twin.systemctl("show", "-p", "InvocationID,ActiveState,ExecStart", twin.unit).stdout


def _settled_state(twin: TwinHost) -> tuple[dict[str, str], str]:
    """The host's state once the unit has settled: an earlier test's apply ends at the server's ready line,
    while the unit's ExecStartPost= (which waits for /health) may keep it `activating` a moment longer."""
    assert wait_until(
        lambda: (
            twin.systemctl("is-active", twin.unit, check=False).stdout.strip()
            not in {"activating", "deactivating", "reloading"}
        ),
        60,
    )
    return _host_state(twin)


def _state_dir(twin: TwinHost) -> Path:
    return twin.layout.home_dir / ".k26-console"


def _presence(twin: TwinHost) -> list[str]:
    d = _state_dir(twin) / "presence"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def test_cli_refuses_a_1mb_value_before_touching_the_host(twin: TwinHost, tmp_path: Path) -> None:
    path = tmp_path / "huge.toml"
    path.write_text(_text("huge", extra=f'served-model-name = "{"x" * 1_000_000}"\n'))
    before, presence = _settled_state(twin), _presence(twin)
    started = time.monotonic()
    res = subprocess.run(
        [*CLI, "apply", "twin", str(path), "--yes", "--hosts", str(twin.hosts_toml), "--confirm-within", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=operator_env(tmp_path),
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 2, (res.stdout[-2000:], res.stderr)
    assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1
    assert "1,000,000 bytes" in res.stderr and "MAX_ARG_STRLEN = 131,072" in res.stderr
    assert time.monotonic() - started < 60
    assert _host_state(twin) == before
    assert not (_state_dir(twin) / "lock").exists()
    assert _presence(twin) == presence  # the heartbeat apply wrote when it took the lock is gone


def test_cli_apply_leaves_no_presence_file_behind(twin: TwinHost, tmp_path: Path) -> None:
    """Each apply wrote presence/<id>.json when it took the lock and never removed it (79 → 80)."""
    path = tmp_path / "ctx-cli.toml"
    path.write_text(_text("ctx-cli").replace("mem-fraction-static = 0.93", "mem-fraction-static = 0.94"))
    presence = _presence(twin)
    res = subprocess.run(
        [*CLI, "apply", "twin", str(path), "--yes", "--hosts", str(twin.hosts_toml), "--confirm-within", "0"],
        capture_output=True,
        text=True,
        timeout=240,
        env=operator_env(tmp_path),
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr)
    assert _presence(twin) == presence
    assert not (_state_dir(twin) / "lock").exists()


def test_a_boot_that_stops_making_progress_fails_at_its_phase_deadline_and_rolls_back(
    twin: TwinHost, tmp_path: Path
) -> None:
    store_dir = tmp_path / "profiles"
    store_dir.mkdir()
    (store_dir / "sleeper.toml").write_text(_text("sleeper", command=SLEEPER))
    store = ProfileStore([store_dir])
    # This host's history: launching took 0.2 s in earlier restarts.
    history = history_path(twin.name, tmp_path / "state")
    history.parent.mkdir(parents=True)
    durations = {"restart": 0.05, "stopping": 0.2, "launching": 0.2, "loading_weights": 0.5}
    record = RestartRecord(profile="x", started=0.0, ended=1.0, outcome="verified", durations=durations)
    history.write_text((record.model_dump_json() + "\n") * 3)

    async def main() -> tuple[object, float]:
        async with Transport(_host(twin), ssh_config=[]) as transport:
            ctl = ServiceController(
                _host(twin), transport, state_dir=tmp_path / "state", phase_factor=3.0, phase_margin_s=2.0
            )
            profile = store.load("sleeper")
            pv = await ctl.preview(profile)
            assert pv.valid and pv.program_changed
            assert any("another program" in w and "not SGLang's launcher" in w for w in pv.warnings), (
                pv.warnings
            )
            assert any(
                d.startswith("~ command ") and "sglang.launch_server → /bin/sh -c" in d for d in pv.diff
            )
            t0 = time.monotonic()
            outcome = await ctl.apply(profile, force=True, rollback_on_failure=True, preview=pv)
            return outcome, time.monotonic() - t0

    outcome, took = asyncio.run(main())
    assert not outcome.ok and outcome.rolled_back  # type: ignore[attr-defined]
    assert "stuck in launching" in outcome.summary and "deadline of 2.2 s" in outcome.summary  # type: ignore[attr-defined]
    assert outcome.rollback is not None and outcome.rollback.ok, outcome.rollback  # type: ignore[attr-defined]
    assert took < 60, took  # not the 1800 s boot timeout
    assert "sglang.launch_server" in twin.systemctl("show", "-p", "ExecStart", twin.unit).stdout


def test_a_changed_program_needs_its_name_or_yes(twin: TwinHost, tmp_path: Path) -> None:
    """Without a terminal and without --yes the apply refuses; the preview says the program changes."""
    path = tmp_path / "shell.toml"
    path.write_text(_text("shell", command=SLEEPER))
    before = _settled_state(twin)
    res = subprocess.run(
        [*CLI, "apply", "twin", str(path), "--hosts", str(twin.hosts_toml), "--confirm-within", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=operator_env(tmp_path),
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 2 and "--yes" in res.stderr, res.stderr
    assert "warning: the unit would run another program: " in res.stdout
    assert "sglang.launch_server → /bin/sh -c 'exec sleep 600' sh (not SGLang's launcher" in res.stdout
    assert "type the profile's name to confirm" in res.stdout
    assert _host_state(twin) == before
