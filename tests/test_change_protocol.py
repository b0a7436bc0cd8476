"""The one change protocol (console.sources.change), on a twin under the REAL systemd manager where this
machine allows one (else the simulated one):

- a command-line apply killed (SIGKILL) as each phase starts, "write drop-in" included, leaves the host on
  the flags it ran before, or on the new drop-in with the host-side rollback armed: never a new drop-in
  without its timer; then the host converges to the flags it ran before, and an armed rollback frees the
  dead apply's lock (the next apply needs no --break-stale-lock);
- the console's own apply (the Textual app in a process of its own, under its pilot) arms the same
  rollback; killed mid-restart, the host rolls back and frees its lock;
- a confirmation and the host's timer racing around the deadline, 20 times at random offsets: what the
  console is told always matches the drop-in the host ends on;
- `rollback` previews where it goes, and refuses to remove the console's first drop-in without
  --to-unit-default; `confirm` never reads a local file the host's record names.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from console.core.audit import AuditEntry
from console.core.confirm import PENDING_FILE, PendingRollback, rollback_unit
from console.core.systemd import DROPIN_NAME
from console.sources.change import HostChanger
from console.sources.confirm import HostRollback, Settled
from console.sources.hosts import load_hosts
from console.sources.hoststate import HostStateDir
from console.sources.service import ServiceController
from console.sources.transport import Transport
from console.twin.host import TwinHost
from console.twin.realsd import why_unavailable
from tests.support.cli import CLI, REPO, lock_looks_stale, operator_env, profile_variant, run_cli, wait_until
from tests.support.twins import module_twin

TIME_SCALE = 0.002
MODE = "real" if why_unavailable() is None else "simulated"
CONFIRM_S = 6


twin = module_twin("change-twin", time_scale=TIME_SCALE, systemd=MODE)


def _dropin(twin: TwinHost) -> str | None:
    path = twin.layout.unit_dir / f"{twin.unit}.d" / DROPIN_NAME
    return path.read_text() if path.exists() else None


def _state_dir(twin: TwinHost) -> Path:
    return twin.layout.home_dir / ".k26-console"


def _timer_active(twin: TwinHost) -> bool:
    res = twin.systemctl("is-active", f"{rollback_unit(twin.unit)}.timer", check=False)
    return res.stdout.strip() in ("active", "activating")


def _argv(twin: TwinHost) -> str:
    out = twin.systemctl("show", "-p", "ExecStart", twin.unit).stdout
    return out.split("; argv[]=", 1)[1].split(" ;", 1)[0]


def _settled(twin: TwinHost) -> bool:
    """No rollback armed or firing, and the unit up."""
    firing = list(_state_dir(twin).glob(".pending-rollback.fired.*"))
    return (
        not firing
        and not (_state_dir(twin) / PENDING_FILE).exists()
        and not _timer_active(twin)
        and twin.systemctl("is-active", twin.unit, check=False).stdout.strip() == "active"
    )


def _trail(twin: TwinHost) -> list[dict[str, object]]:
    path = _state_dir(twin) / "audit.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _free_lock(twin: TwinHost, home: Path) -> None:
    """The lock of an earlier test's killed command (no rollback armed to free it) broken, once its
    heartbeat is stale, as an operator would: `confirm --break-stale-lock` (nothing armed: exit 1).
    Until the heartbeat looks stale in the twin's files, no command is started (each ~1 s of CPU; the
    lock goes stale 6 s after a kill, and polling it with the command cost ~9 s and 8 starts a lock)."""

    def free() -> bool:
        if not (_state_dir(twin) / "lock").exists():
            return True
        res = run_cli(home, "confirm", "twin", "--break-stale-lock", "--yes", "--hosts", str(twin.hosts_toml))
        return res.returncode != 3

    assert wait_until(lambda: lock_looks_stale(twin), 60, max_interval_s=0.2), (
        "an earlier test's lock never looked stale"
    )
    assert wait_until(free, 60), "an earlier test's lock never went stale"


def _kill_apply_at(twin: TwinHost, home: Path, profile: Path, phase: str) -> None:
    """`apply PROFILE --json`, SIGKILLed the moment it reports `phase` (its first progress line there)."""
    proc = subprocess.Popen(
        [
            *CLI,
            "apply",
            "twin",
            str(profile),
            "--yes",
            "--json",
            "--break-stale-lock",
            "--hosts",
            str(twin.hosts_toml),
            "--confirm-within",
            str(CONFIRM_S),
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
            assert line, f"apply ended before {phase}: {proc.stderr.read() if proc.stderr else ''}"
            doc = json.loads(line)
            if doc.get("type") == "progress" and doc.get("purpose") == "apply" and doc.get("phase") == phase:
                os.kill(proc.pid, signal.SIGKILL)
                break
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize(
    "phase", ["validate", "diff", "write_dropin", "daemon_reload", "restart", "loading_weights"]
)
def test_an_apply_killed_at_any_phase_leaves_no_dropin_without_its_timer(
    twin: TwinHost, tmp_path: Path, phase: str
) -> None:
    assert wait_until(lambda: _settled(twin), 120), "an earlier change did not settle"
    _free_lock(twin, tmp_path)
    before_argv, before_dropin = _argv(twin), _dropin(twin)
    _kill_apply_at(twin, tmp_path, profile_variant(tmp_path, "hot", fraction="0.96"), phase)

    # The moment after the kill: the drop-in in force, or the new one with its timer armed.
    armed = (_state_dir(twin) / PENDING_FILE).exists()
    now_dropin = _dropin(twin)
    if now_dropin != before_dropin:
        assert armed and _timer_active(twin), f"killed at {phase}: a new drop-in with no rollback armed"
    if phase in ("validate", "diff"):
        assert not armed and now_dropin == before_dropin

    # The host converges to the flags it ran before; a rollback it armed also frees the dead apply's lock.
    assert wait_until(lambda: _settled(twin) and _dropin(twin) == before_dropin, CONFIRM_S + 90), (
        f"killed at {phase}: the host did not converge ({_dropin(twin)!r})"
    )
    assert _argv(twin) == before_argv
    if armed:
        assert wait_until(lambda: not (_state_dir(twin) / "lock").exists(), 30), (
            "the dead apply's lock stayed"
        )
        host_lines = [e for e in _trail(twin) if e.get("user") == "host"]
        assert any(
            e.get("action") == "lock_break" and "released the lock" in str(e["summary"]) for e in host_lines
        )
        # The next apply needs no --break-stale-lock.
        res = run_cli(
            tmp_path, "apply", "twin", "ctx-128k", "--yes", "--hosts", str(twin.hosts_toml), timeout=240
        )
        assert res.returncode == 0, (res.stdout, res.stderr)
        undo = run_cli(
            tmp_path,
            "rollback",
            "twin",
            "--yes",
            "--to-unit-default",
            "--hosts",
            str(twin.hosts_toml),
            timeout=240,
        )
        assert undo.returncode == 0, (undo.stdout, undo.stderr)
        assert wait_until(lambda: _argv(twin) == before_argv, 30)


def test_rollback_previews_its_target_and_stops_at_the_first_dropin(twin: TwinHost, tmp_path: Path) -> None:
    assert wait_until(lambda: _settled(twin), 120)
    _free_lock(twin, tmp_path)
    hosts = str(twin.hosts_toml)
    if _dropin(twin) is not None:  # an earlier test's drop-in: back to the unit's own
        run_cli(
            tmp_path,
            "rollback",
            "twin",
            "--yes",
            "--to-unit-default",
            "--break-stale-lock",
            "--hosts",
            hosts,
            timeout=240,
        )
    assert _dropin(twin) is None
    before = _argv(twin)
    one = run_cli(
        tmp_path, "apply", "twin", "ctx-128k", "--yes", "--break-stale-lock", "--hosts", hosts, timeout=240
    )
    assert one.returncode == 0, (one.stdout, one.stderr)
    # The first rollback of the console's first drop-in is refused without the explicit flag, after
    # showing where it would go.
    refused = run_cli(tmp_path, "rollback", "twin", "--yes", "--hosts", hosts, timeout=120)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert "the unit's own ExecStart" in refused.stdout
    assert "--context-length" in refused.stdout  # the flag diff: ctx-128k's flags go
    assert "--to-unit-default" in refused.stderr and _dropin(twin) is not None
    # Two applies: the rollback goes back one level, with its diff, and a second one is refused.
    two = run_cli(tmp_path, "apply", "twin", "ctx-200k", "--yes", "--hosts", hosts, timeout=240)
    assert two.returncode == 0, (two.stdout, two.stderr)
    back = run_cli(tmp_path, "rollback", "twin", "--yes", "--hosts", hosts, timeout=240)
    assert back.returncode == 0, (back.stdout, back.stderr)
    assert "the drop-in the last apply kept" in back.stdout
    assert "- --mem-fraction-static 0.93" in back.stdout
    again = run_cli(tmp_path, "rollback", "twin", "--yes", "--hosts", hosts, timeout=120)
    assert again.returncode == 2 and "--to-unit-default" in again.stderr
    last = run_cli(tmp_path, "rollback", "twin", "--yes", "--to-unit-default", "--hosts", hosts, timeout=240)
    assert last.returncode == 0, (last.stdout, last.stderr)
    assert _dropin(twin) is None and _argv(twin) == before


async def _race_once(twin: TwinHost, rng: random.Random) -> tuple[Settled, str, str | None, str]:
    """Arm a 1 s rollback, put a marked drop-in in place, disarm at a random moment around the deadline;
    returns what the console was told, the marked text, the text before, and the op_id."""
    cfg = load_hosts(twin.hosts_toml).get(twin.name)
    assert cfg is not None
    async with Transport(cfg) as transport:
        state = HostStateDir(transport, cfg)
        ctl = ServiceController(cfg, transport)
        guard = HostRollback(ctl, state)
        before = await guard.dropin_in_force()
        op_id = os.urandom(8).hex()
        marked = (before or "[Service]\n") + f"# race {op_id}\n"
        entry = AuditEntry(
            ts=state.runner.now(),
            user="host",
            host=cfg.name,
            action="rollback",
            outcome="rolled_back",
            summary=f"race {op_id}",
            op_id=op_id,
        )
        loop = asyncio.get_running_loop()
        await guard.arm(
            1,
            armed_by="race",
            profile="race",
            op_id=op_id,
            target_context=None,
            lock_id=None,
            holder=None,
            audit=entry,
        )
        armed_at = loop.time()
        await ctl.write_dropin(marked)
        await asyncio.sleep(max(0.0, armed_at + rng.uniform(0.2, 2.8) - loop.time()))
        told = await guard.disarm(op_id)
        return told, marked, before, op_id


def test_confirm_and_the_timer_never_both_win(twin: TwinHost) -> None:
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    seen: set[Settled] = set()
    for i in range(20):
        assert wait_until(lambda: _settled(twin), 120), f"round {i}: the host did not settle"
        told, marked, before, op_id = asyncio.run(_race_once(twin, rng))
        seen.add(told)
        assert wait_until(lambda: _settled(twin), 120), f"round {i}: the host did not settle after the race"
        final = _dropin(twin)
        host_rolled = [e for e in _trail(twin) if e.get("op_id") == op_id and e.get("user") == "host"]
        if told is Settled.DISARMED:
            assert final == marked and not host_rolled, f"round {i}: confirmed, yet the host rolled back"
            # Put the drop-in before back, as a settled change would be undone by hand.
            asyncio.run(_put_back(twin, before))
        else:
            assert told is Settled.FIRED or told is Settled.NONE
            assert final == before and host_rolled, f"round {i}: told {told}, but the host kept the change"
    assert seen, "no round ran"


async def _put_back(twin: TwinHost, text: str | None) -> None:
    cfg = load_hosts(twin.hosts_toml).get(twin.name)
    assert cfg is not None
    async with Transport(cfg) as transport:
        ctl = ServiceController(cfg, transport)
        if text is None:
            await ctl._restore()
            if _dropin(twin) is not None:
                await ctl._restore()
        else:
            await ctl.write_dropin(text)


def test_confirm_reads_no_local_file_the_host_names(tmp_path: Path) -> None:
    """A record naming a local path as its profile: the target is the record's own, or 1 (ready)."""
    local = tmp_path / "secret.toml"
    local.write_text(profile_variant(tmp_path, "x").read_text().replace("200000", "999999"))
    common = {
        "unit": "sglang.service",
        "timer": "t",
        "deadline": "2026-01-01T00:00:00Z",
        "armed_at": "2026-01-01T00:00:00Z",
        "armed_by": "mallory",
        "confirm_within_s": 60,
    }
    assert HostChanger._target(PendingRollback.model_validate({**common, "profile": str(local)})) == 1
    assert HostChanger._target(PendingRollback.model_validate({**common, "profile": "../../x"})) == 1
    assert (
        HostChanger._target(
            PendingRollback.model_validate({**common, "profile": str(local), "target_context": 5000})
        )
        == 5000
    )


CONSOLE_SCRIPT = r"""
import asyncio, sys
from pathlib import Path
from console.sources.hosts import load_hosts
from console.sources.profile_store import ProfileStore, shipped_profile_dir
from console.tui.app import ConsoleApp, HostEntry
from console.tui.messages import ApplyRequested
from console.tui.screens import ApplyConfirmScreen
from console.sources.session_options import SessionOptions

hosts_toml, name, user_dir, state = sys.argv[1:5]  # and the deadline, sys.argv[5]

async def main() -> None:
    config = load_hosts(Path(hosts_toml)).get(name)
    entry = HostEntry(name, config=config, simulated=True,
                      session=SessionOptions(gpu_interval_s=0.5, server_interval_s=0.5),
                      restart_history_dir=Path(state), confirm_within_s=float(sys.argv[5]))
    store = ProfileStore([Path(user_dir), shipped_profile_dir()])
    app = ConsoleApp([entry], store=store, target=200_000, target_source="test")
    async with app.run_test(size=(160, 48)) as pilot:
        dash = app.dashboards[name]
        while app.hosts[name].link is None or dash.snap is None:
            await pilot.pause(0.1)
        app.post_message(ApplyRequested(name, "hot"))
        while not isinstance(app.screen, ApplyConfirmScreen):
            await pilot.pause(0.1)
        screen = app.screen
        if screen.name_gate is not None:
            await pilot.press(*screen.name_gate)
            await pilot.press("enter")
        else:
            await pilot.press("y" if screen.ok else "F")
        print("ANSWERED", flush=True)
        said = None
        while True:
            track = dash.track
            if track is not None and track.phase != said:
                said = track.phase
                print(f"PHASE {said}", flush=True)
            await pilot.pause(0.02)

asyncio.run(main())
"""


def test_the_consoles_own_apply_killed_mid_restart_is_rolled_back_by_the_host(
    twin: TwinHost, tmp_path: Path
) -> None:
    assert wait_until(lambda: _settled(twin), 120)
    _free_lock(twin, tmp_path)
    before_argv, before_dropin = _argv(twin), _dropin(twin)
    user = tmp_path / "profiles"
    user.mkdir()
    # The planner would refuse 0.97; 0.96 verifies on the twin, so only the kill stops it.
    profile_variant(user, "hot", fraction="0.96")
    env = operator_env(tmp_path)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CONSOLE_SCRIPT,
            str(twin.hosts_toml),
            twin.name,
            str(user),
            str(tmp_path / "ctl"),
            str(CONFIRM_S),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        while True:
            line = proc.stdout.readline()
            assert line, f"the console ended: {proc.stderr.read() if proc.stderr else ''}"
            if line.strip() in {
                f"PHASE {p}" for p in ("restart", "stopping", "launching", "loading_weights")
            }:
                break
            assert line.strip() not in ("PHASE verify", "PHASE done", "PHASE failed"), (
                "the restart was missed"
            )
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert (_state_dir(twin) / "lock").exists(), (
        "the killed console's lock should be there until the host acts"
    )
    assert wait_until(lambda: _settled(twin) and _dropin(twin) == before_dropin, CONFIRM_S + 90)
    assert _argv(twin) == before_argv
    assert wait_until(lambda: not (_state_dir(twin) / "lock").exists(), 30), "the console's lock stayed"
    trail = _trail(twin)
    assert any(
        e.get("user") == "host" and e.get("outcome") == "rolled_back" and e.get("profile") == "hot"
        for e in trail
    )


def test_a_refused_apply_leaves_no_presence_behind(twin: TwinHost, tmp_path: Path) -> None:
    """Exit 3 (another console holds the lock) takes its heartbeat with it: 5,000 refusals must not
    leave 5,000 files for every reader to judge."""
    cfg = load_hosts(twin.hosts_toml).get(twin.name)
    assert cfg is not None
    presence = _state_dir(twin) / "presence"

    async def hold_and_try() -> tuple[subprocess.CompletedProcess[str], list[str]]:
        async with Transport(cfg) as transport:
            state = HostStateDir(transport, cfg)
            async with state.locks.locked("apply held-by-test"):
                before = sorted(p.name for p in presence.glob("*.json"))
                loop = asyncio.get_running_loop()
                res = await loop.run_in_executor(
                    None,
                    lambda: run_cli(
                        tmp_path, "apply", "twin", "ctx-128k", "--yes", "--hosts", str(twin.hosts_toml)
                    ),
                )
                return res, before

    assert wait_until(lambda: _settled(twin), 120)
    _free_lock(twin, tmp_path)
    res, before = asyncio.run(hold_and_try())
    assert res.returncode == 3, (res.stdout, res.stderr)
    assert "holds the lock" in res.stderr
    after = sorted(p.name for p in presence.glob("*.json"))
    assert [n for n in after if n not in before] == [], after


@pytest.mark.parametrize("verifies", [True, False], ids=["verified", "not-verified"])
def test_an_apply_whose_reader_goes_away_ends_audited_and_says_how(
    twin: TwinHost, tmp_path: Path, verifies: bool
) -> None:
    """`apply ... | head -3`: the reader leaves at "loading weights"; the apply goes on to its end, its
    outcome is in the audit trail, stderr says how it ended, and the exit status says so too (0 only
    for a verified boot). Before, it exited 0 mid-restart with only its intent in the trail."""
    assert wait_until(lambda: _settled(twin), 120)
    _free_lock(twin, tmp_path)
    before_argv = _argv(twin)
    name = "piped-ok" if verifies else "piped-oom"  # each its own name: the two share the twin's trail
    profile = profile_variant(tmp_path, name, fraction="0.94" if verifies else "0.97")
    proc = subprocess.Popen(
        [
            *CLI,
            "apply",
            "twin",
            str(profile),
            "--yes",
            "--hosts",
            str(twin.hosts_toml),
            "--confirm-within",
            "120",
        ]
        + ([] if verifies else ["--rollback-on-failure"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=operator_env(tmp_path),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        while True:
            line = proc.stdout.readline()
            assert line, f"apply ended early: {proc.stderr.read()}"
            if "loading weights" in line:
                break
        proc.stdout.close()  # the reader goes: the apply's next line finds the pipe closed
        rc = proc.wait(240)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    assert "Traceback" not in err, err
    assert "was closed by its reader; the change went on to its end" in err, err
    ours = [e for e in _trail(twin) if e.get("profile") == name and e.get("action") == "apply"]
    assert [e["outcome"] for e in ours][:1] == ["started"] and len(ours) == 2, ours
    assert ours[0]["op_id"] == ours[1]["op_id"]
    assert not (_state_dir(twin) / PENDING_FILE).exists()  # settled: confirmed, or rolled back by us
    if verifies:
        assert rc == 0 and "and verified" in err and ours[1]["outcome"] == "ok"
        assert "0.94" in _argv(twin)
        undo = run_cli(
            tmp_path,
            "rollback",
            "twin",
            "--yes",
            "--to-unit-default",
            "--hosts",
            str(twin.hosts_toml),
            timeout=240,
        )
        assert undo.returncode == 0, (undo.stdout, undo.stderr)
    else:
        assert rc == 1 and "did NOT verify" in err and ours[1]["outcome"] != "ok"
        assert wait_until(lambda: _argv(twin) == before_argv, 60)
