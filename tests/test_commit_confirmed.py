"""Commit-confirmed apply: the host rolls itself back when the console that applied cannot confirm.

Against a twin whose unit runs under the REAL systemd manager where this machine allows one (else the
simulated one, which implements `systemd-run --on-active` as its own timer):
- a verified apply leaves no rollback timer armed and no pending record;
- the 0.97 profile forced with --yes and a short --confirm-within, the apply killed (SIGKILL, and SIGHUP as
  a closed terminal sends) once the restart has begun: before the deadline plus one boot the unit runs
  the flags it ran before again, `verify` passes on that boot, and `audit --json` holds the host's own
  rollback entry;
- `verify --json` reports the armed rollback while it waits.

The console's side is the same under either manager; what differs is the timer. Where the real manager
runs, the simulated one (whose `systemd-run --on-active` timer is the twin's own code) runs the two tests
that arm it, disarm it and let it fire, and the rest run under the real manager only: each simulated case
costs 13-27 s of a busy worker. Where only the simulated manager can run, every test runs under it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from console.core.confirm import PENDING_FILE, rollback_unit
from console.core.pairing import PairingView
from console.sources.hosts import load_hosts
from console.sources.hoststate import HostStateDir, local_identity
from console.sources.transport import Transport
from console.tui.pairing import pairing_text
from console.twin.host import TwinHost
from console.twin.realsd import why_unavailable
from tests.support.cli import CLI, REPO, operator_env, profile_variant, run_cli, wait_until

TIME_SCALE = 0.002
MODES = ["simulated", *(["real"] if why_unavailable() is None else [])]
ONE_MODE = [MODES[-1]]  # the real manager where there is one


@pytest.fixture(scope="module")
def twin(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwinHost]:
    host = TwinHost(
        tmp_path_factory.mktemp("confirm-twin") / "state", time_scale=TIME_SCALE, systemd=request.param
    )
    host.start_sync()
    try:
        assert host.cfg is not None and host.cfg.systemd == request.param
        yield host
    finally:
        host.stop_sync()


def _timer_active(twin: TwinHost) -> bool:
    res = twin.systemctl("is-active", f"{rollback_unit(twin.unit)}.timer", check=False)
    return res.stdout.strip() == "active"


def _pending(twin: TwinHost) -> Path:
    return twin.layout.home_dir / ".k26-console" / PENDING_FILE


def _exec_start(twin: TwinHost) -> str:
    return twin.systemctl("show", "-p", "ExecStart", twin.unit).stdout


@pytest.mark.parametrize("twin", MODES, indirect=True)
def test_verified_apply_leaves_no_timer_armed(twin: TwinHost, tmp_path: Path) -> None:
    # --break-stale-lock as every apply here: a killed apply of an earlier test (any order) leaves its lock.
    res = run_cli(
        tmp_path,
        "apply",
        "twin",
        "ctx-200k",
        "--yes",
        "--break-stale-lock",
        "--hosts",
        str(twin.hosts_toml),
        "--confirm-within",
        "120",
    )
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert "host-side rollback of profile ctx-200k is armed" in res.stdout
    assert "confirmed: the host-side rollback is disarmed" in res.stdout
    assert not _timer_active(twin)
    assert not _pending(twin).exists()


def _apply_until_restart(
    twin: TwinHost, home: Path, profile: Path, name: str, *, confirm_within: int
) -> subprocess.Popen[str]:
    """`apply PROFILE` with a host-side rollback, returned once the restart has begun (the unit has a new
    invocation)."""
    invocation = twin.systemctl("show", "-p", "InvocationID", "--value", twin.unit).stdout.strip()
    proc = subprocess.Popen(
        [
            *CLI,
            "apply",
            "twin",
            str(profile),
            "--yes",
            "--break-stale-lock",
            "--hosts",
            str(twin.hosts_toml),
            "--confirm-within",
            str(confirm_within),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=operator_env(home),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        while True:
            line = proc.stdout.readline()
            assert line, f"apply ended before arming: {proc.stderr.read() if proc.stderr else ''}"
            if f"host-side rollback of profile {name} is armed" in line:
                break
        assert wait_until(
            lambda: (
                twin.systemctl("show", "-p", "InvocationID", "--value", twin.unit).stdout.strip()
                != invocation
            ),
            30,
        )
    except BaseException:
        _reap(proc)
        raise
    return proc


def _reap(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _apply_and_signal(
    twin: TwinHost, home: Path, profile: Path, name: str, sig: signal.Signals, *, confirm_within: int
) -> None:
    proc = _apply_until_restart(twin, home, profile, name, confirm_within=confirm_within)
    try:
        os.kill(proc.pid, sig)
        proc.wait(30)
    finally:
        _reap(proc)


def _hot(tmp_path: Path) -> Path:
    return profile_variant(tmp_path, "hot", fraction="0.97")


@pytest.mark.parametrize(
    ("twin", "sig"),
    [(mode, sig) for mode in ONE_MODE for sig in (signal.SIGHUP, signal.SIGKILL)]
    + [("simulated", signal.SIGKILL)] * (MODES != ONE_MODE),
    indirect=["twin"],
)
def test_killed_apply_is_rolled_back_by_the_host(twin: TwinHost, tmp_path: Path, sig: signal.Signals) -> None:
    before = _argv(twin)
    _apply_and_signal(twin, tmp_path, _hot(tmp_path), "hot", sig, confirm_within=8)
    assert _pending(twin).exists() or not _timer_active(twin)
    # The deadline (8 s) plus one boot: the host ran the rollback by itself.
    assert wait_until(lambda: not _pending(twin).exists(), 60), "the host-side rollback did not fire"
    assert wait_until(
        lambda: (
            before in _exec_start(twin)
            and twin.systemctl("is-active", twin.unit, check=False).stdout.strip() == "active"
        ),
        90,
    ), _exec_start(twin)
    assert not _timer_active(twin)
    verify = run_cli(
        tmp_path, "verify", "twin", "--target-context", "100000", "--hosts", str(twin.hosts_toml)
    )
    assert verify.returncode == 0, (verify.stdout, verify.stderr)
    audit = run_cli(tmp_path, "audit", "twin", "--json", "--hosts", str(twin.hosts_toml))
    assert audit.returncode == 0, audit.stderr
    host_rollbacks = [
        e for e in _entries(audit.stdout) if e.get("user") == "host" and e.get("outcome") == "rolled_back"
    ]
    assert host_rollbacks and host_rollbacks[-1]["profile"] == "hot"
    assert "was not confirmed within 8 s" in host_rollbacks[-1]["summary"]


@pytest.mark.parametrize("twin", ONE_MODE, indirect=True)
def test_a_partner_sees_the_armed_rollback_and_confirms_the_boot(twin: TwinHost, tmp_path: Path) -> None:
    """The console that applied is gone (SIGTERM releases its lock, the rollback stays armed): `verify
    --json` and a partner's pairing view show the rollback and its deadline; `confirm` verifies the boot
    and disarms it, audited."""
    nothing = run_cli(
        tmp_path, "confirm", "twin", "--break-stale-lock", "--yes", "--hosts", str(twin.hosts_toml)
    )
    assert nothing.returncode == 1 and "no host-side rollback is armed on twin" in nothing.stderr
    _apply_and_signal(
        twin, tmp_path, REPO / "profiles" / "ctx-128k.toml", "ctx-128k", signal.SIGTERM, confirm_within=600
    )
    assert _timer_active(twin) and _pending(twin).exists()

    verify = run_cli(
        tmp_path, "verify", "twin", "--target-context", "1000", "--json", "--hosts", str(twin.hosts_toml)
    )
    pending = json.loads(verify.stdout)["pending_rollback"]
    assert pending["profile"] == "ctx-128k" and pending["active"] is True
    assert pending["timer"] == f"{rollback_unit(twin.unit)}.timer" and pending["armed_by"].startswith(
        twin.user
    )

    async def partner_view() -> PairingView:
        cfg = load_hosts(twin.hosts_toml).get(twin.name)
        assert cfg is not None
        async with Transport(cfg) as transport:
            return await HostStateDir(transport, cfg).board.view()

    view = asyncio.run(partner_view())
    assert view.pending_rollback is not None and view.pending_rollback.profile == "ctx-128k"
    bar = pairing_text(view, local_identity(user="bob")).plain
    assert "ROLLBACK ARMED ctx-128k by " in bar and "unless confirmed" in bar

    # The boot comes up (the console that applied is not there to see it); then bob confirms it.
    deadline = time.monotonic() + 90
    while True:
        res = run_cli(
            tmp_path, "confirm", "twin", "--break-stale-lock", "--yes", "--hosts", str(twin.hosts_toml)
        )
        if res.returncode == 0 or time.monotonic() > deadline:
            break
        assert "not confirmed" in res.stderr, res.stderr
        time.sleep(0.5)
    assert res.returncode == 0, res.stderr
    assert "confirmed ctx-128k on twin ahead of the host-side rollback" in res.stdout
    assert not _timer_active(twin) and not _pending(twin).exists()
    audit = run_cli(tmp_path, "audit", "twin", "--json", "--hosts", str(twin.hosts_toml))
    assert any(
        e.get("action") == "confirm" and e.get("profile") == "ctx-128k" for e in _entries(audit.stdout)
    )


@pytest.mark.parametrize("twin", ONE_MODE, indirect=True)
def test_rollback_now_puts_the_previous_flags_back(twin: TwinHost, tmp_path: Path) -> None:
    before = _argv(twin)
    _apply_and_signal(
        twin,
        tmp_path,
        profile_variant(tmp_path, "undo-me", fraction="0.94"),
        "undo-me",
        signal.SIGTERM,
        confirm_within=600,
    )
    assert _timer_active(twin)
    res = run_cli(
        tmp_path,
        "confirm",
        "twin",
        "--break-stale-lock",
        "--yes",
        "--rollback-now",
        "--hosts",
        str(twin.hosts_toml),
        timeout=180,
    )
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert not _timer_active(twin) and not _pending(twin).exists()
    assert _argv(twin) == before
    audit = run_cli(tmp_path, "audit", "twin", "--json", "--hosts", str(twin.hosts_toml))
    assert any(e.get("action") == "rollback" and e.get("user") != "host" for e in _entries(audit.stdout))


def _argv(twin: TwinHost) -> str:
    return _exec_start(twin).split("; argv[]=", 1)[1].split(" ;", 1)[0]


def _entries(audit_json: str) -> list[dict[str, object]]:
    docs = [json.loads(line) for line in audit_json.splitlines() if line.strip()]
    return docs[0]["trail"] if len(docs) == 1 and "trail" in docs[0] else docs


@pytest.mark.parametrize("twin", ONE_MODE, indirect=True)
def test_a_cut_connection_is_rolled_back_by_the_host(twin: TwinHost, tmp_path: Path) -> None:
    """The console lives on but loses the host (the network is cut): it waits for the link until just
    before the deadline, then ends saying what the host will do (issue 36: it used to hang until the link
    came back); the host rolls itself back at the deadline."""
    before = _argv(twin)
    proc = _apply_until_restart(twin, tmp_path, _hot(tmp_path), "hot", confirm_within=8)
    try:
        twin.cut_ssh()
        try:
            assert wait_until(lambda: not _pending(twin).exists(), 60), "the host-side rollback did not fire"
            assert wait_until(
                lambda: (
                    _argv(twin) == before
                    and twin.systemctl("is-active", twin.unit, check=False).stdout.strip() == "active"
                ),
                90,
            ), _exec_start(twin)
        finally:
            twin.restore_ssh()
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 1, (out, err)
        assert "link to twin lost since" in out, out
        assert "The host-side rollback armed fires at" in out, out
        assert "unless `k26-console confirm twin` reaches the host first" in out, out
    finally:
        _reap(proc)
