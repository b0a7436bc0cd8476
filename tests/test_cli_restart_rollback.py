"""`k26-console restart HOST` and `k26-console rollback HOST` as an operator runs them against a twin over
SSH on loopback: the lock, the phases, the verification and the audit trail of `apply`."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

from console.core.pairing import Identity
from console.sources.hosts import load_hosts
from console.sources.hoststate import HostStateDir
from console.sources.transport import Transport
from console.twin.host import TwinHost
from tests.support.cli import one_sentence, profile_variant, run_cli, started_twin, wait_until
from tests.support.twins import module_twin

TIME_SCALE = 0.002


twin = module_twin("restart-twin", time_scale=TIME_SCALE)


def _cli(twin: TwinHost, home: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return run_cli(home, *args, "--hosts", str(twin.hosts_toml), timeout=timeout)


def _unit(twin: TwinHost) -> dict[str, str]:
    """InvocationID, ActiveState and the ExecStart's argv (without the start time and pid systemd adds)."""
    out = twin.systemctl("show", "-p", "InvocationID,ActiveState,ExecStart", twin.unit).stdout
    props = dict(line.partition("=")[::2] for line in out.splitlines() if "=" in line)
    props["ExecStart"] = props["ExecStart"].partition("argv[]=")[2].partition(" ;")[0]
    return props


def _settled_unit(twin: TwinHost) -> dict[str, str]:
    """`_unit` once systemd has finished a start or stop in progress. The restart an earlier test made is
    verified on the server's own answers, which can come while systemd still runs the unit's ExecStartPost
    (ActiveState `activating`): a test that snapshots the unit to show it was left alone waits that out."""
    settled = wait_until(
        lambda: _unit(twin)["ActiveState"] not in ("activating", "deactivating", "reloading"), 60
    )
    assert settled, _unit(twin)
    return _unit(twin)


def _dropins(twin: TwinHost) -> dict[str, str]:
    d = twin.layout.unit_dir / f"{twin.unit}.d"
    return {p.name: p.read_text() for p in sorted(d.iterdir())} if d.is_dir() else {}


def _trail(twin: TwinHost, home: Path) -> list[dict[str, Any]]:
    res = _cli(twin, home, "audit", "twin", "--json", timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["trail"]


def _lock_file(twin: TwinHost) -> Path:
    return twin.layout.home_dir / ".k26-console" / "lock.json"


def _live_phases_are_the_timed_phases(stdout: str) -> None:
    """Every phase the summary times was shown as it came (a rollback listed "diff 0.4 s" it never
    showed), and none the summary leaves out."""
    head, _, tail = stdout.partition("phase timings (")
    live = [m.group(1) for m in re.finditer(r"(?m)^ *[\d.]+ s  (?:rollback: )?(.+?)(?:  \(|  ETA|$)", head)]
    timed = [m.group(1) for m in re.finditer(r"(?m)^  (\S.*?) +[\d.]+ s$", tail)]
    assert timed and live, stdout
    assert set(timed) <= set(live), (timed, live)


def test_restart_needs_yes_without_a_terminal_and_leaves_the_host_alone(
    twin: TwinHost, tmp_path: Path
) -> None:
    before = _settled_unit(twin)
    res = _cli(twin, tmp_path, "restart", "twin")
    assert res.returncode == 2
    assert "there is no terminal to confirm on; run it with --yes" in one_sentence(res.stderr)
    assert _unit(twin) == before


def test_restart_restarts_verifies_and_is_audited(twin: TwinHost, tmp_path: Path) -> None:
    before_unit, before_dropins = _settled_unit(twin), _dropins(twin)
    trail_before = len(_trail(twin, tmp_path))
    res = _cli(twin, tmp_path, "restart", "twin", "--yes")
    assert res.returncode == 0, (res.stdout, res.stderr)
    # The verdict reads the server (ready, its pool); systemd calls the unit active once the unit's
    # ExecStartPost= (its /health wait, polling every 0.2 s) has seen it too: a moment later.
    assert wait_until(lambda: _unit(twin)["ActiveState"] == "active", 30), _unit(twin)
    after = _unit(twin)
    assert after["InvocationID"] != before_unit["InvocationID"]
    assert after["ExecStart"] == before_unit["ExecStart"]
    assert _dropins(twin) == before_dropins  # nothing written
    # The phases as they come, then the verdict and the timings.
    for label in ("restart", "ready", "verify"):
        assert f"  {label}" in res.stdout, res.stdout
    assert "nothing written: the drop-in in force stays" in res.stdout
    _live_phases_are_the_timed_phases(res.stdout)
    assert "verified: pool " in res.stdout and "phase timings (" in res.stdout
    new = _trail(twin, tmp_path)[trail_before:]
    assert [(e["action"], e["outcome"]) for e in new] == [("restart", "started"), ("restart", "ok")], new
    assert new[0]["op_id"] == new[1]["op_id"] and new[1]["pool_tokens"]
    assert new[1]["durations"]["restart"] >= 0
    assert not _lock_file(twin).exists()  # released


def test_restart_json_is_progress_lines_then_the_outcome(twin: TwinHost, tmp_path: Path) -> None:
    res = _cli(twin, tmp_path, "restart", "twin", "--yes", "--json")
    assert res.returncode == 0, res.stderr
    docs = [json.loads(line) for line in res.stdout.splitlines()]
    assert {d["type"] for d in docs[:-1]} == {"progress"}
    assert docs[-1]["type"] == "outcome" and docs[-1]["ok"] is True


def test_a_restart_is_refused_while_another_console_holds_the_lock(twin: TwinHost, tmp_path: Path) -> None:
    before = _settled_unit(twin)
    other = Identity(user="alice", jump_host="jump1", pid=4242, console_id="alice-held")

    async def held() -> subprocess.CompletedProcess[str]:
        config = load_hosts(twin.hosts_toml).hosts[twin.name]
        async with (
            Transport(config, ssh_config=[]) as t,
            HostStateDir(t, config, other).locks.locked("apply ctx-256k"),
        ):
            return await asyncio.to_thread(_cli, twin, tmp_path, "restart", "twin", "--yes", timeout=60)

    res = asyncio.run(held())
    assert res.returncode == 3, (res.stdout, res.stderr)
    assert "holds the lock on twin: apply ctx-256k" in one_sentence(res.stderr)
    assert _unit(twin) == before


def test_rollback_with_nothing_to_roll_back_is_exit_2(tmp_path: Path) -> None:
    with started_twin(tmp_path / "fresh", time_scale=TIME_SCALE) as fresh:
        before = _unit(fresh)
        res = _cli(fresh, tmp_path, "rollback", "twin", "--yes")
        assert res.returncode == 2, (res.stdout, res.stderr)
        assert "there is no drop-in by k26-console" in one_sentence(res.stderr)
        assert _unit(fresh) == before
        assert not _lock_file(fresh).exists()


def test_rollback_puts_the_flags_before_the_apply_back(twin: TwinHost, tmp_path: Path) -> None:
    original = _unit(twin)["ExecStart"]
    profile = profile_variant(tmp_path, "rb-094", fraction="0.94")
    res = _cli(twin, tmp_path, "apply", "twin", str(profile), "--yes", "--confirm-within", "0")
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert "0.94" in _unit(twin)["ExecStart"]
    applied_dropins = _dropins(twin)
    trail_before = len(_trail(twin, tmp_path))

    # --to-unit-default: whether this apply's drop-in is the console's first here depends on the tests
    # before it; the rollback goes to the drop-in kept, or (none kept) removes this one.
    res = _cli(twin, tmp_path, "rollback", "twin", "--yes", "--to-unit-default")
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert "rollback of " in res.stdout and "- --mem-fraction-static 0.94" in res.stdout  # the preview
    assert _unit(twin)["ExecStart"] == original
    assert _dropins(twin) != applied_dropins
    assert "verified: " in res.stdout
    _live_phases_are_the_timed_phases(res.stdout)
    # A rollback on its own: its phase lines are not tagged as an apply's rollback.
    assert "rollback: " not in res.stdout
    new = _trail(twin, tmp_path)[trail_before:]
    assert [(e["action"], e["outcome"]) for e in new] == [("rollback", "started"), ("rollback", "ok")], new
    # Where it went (the profile put back, or the unit's own ExecStart), never "rolled back to rollback".
    went = new[1]["profile"]
    assert went == "the unit's own ExecStart" or re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", went or ""), new[1]
    assert went != "rollback"
    assert any("0.94" in line for line in new[1]["diff"]), new[1]["diff"]
    assert not _lock_file(twin).exists()


def test_audit_text_shows_the_flag_diff_and_that_an_apply_was_forced(twin: TwinHost, tmp_path: Path) -> None:
    # 0.91 is refused by the planner (the pool falls short of 200k): applied only because of --yes.
    profile = profile_variant(tmp_path, "forced-091", fraction="0.91")
    res = _cli(
        twin,
        tmp_path,
        "apply",
        "twin",
        str(profile),
        "--yes",
        "--confirm-within",
        "0",
        "--rollback-on-failure",
    )
    assert res.returncode == 1, (res.stdout, res.stderr)  # not verified, rolled back
    assert "forced with --yes" in res.stdout
    trail = _cli(twin, tmp_path, "audit", "twin", timeout=60)
    assert trail.returncode == 0, trail.stderr
    lines = trail.stdout.splitlines()
    (at,) = [i for i, line in enumerate(lines) if re.search(r"  apply +forced-091  ", line)]
    detail = [line.strip() for line in lines[at + 1 : at + 4]]
    assert detail[0] == "FORCED: the planner refused it; forced with --yes", detail
    assert any(d.startswith("~ --mem-fraction-static ") and d.endswith(" → 0.91") for d in detail), detail
    entry = [e for e in _trail(twin, tmp_path) if e.get("profile") == "forced-091"]
    assert [e["forced"] for e in entry] == ["the planner refused it; forced with --yes"] * 2


def test_restart_and_rollback_wait_for_an_armed_host_side_rollback_to_be_settled(
    twin: TwinHost, tmp_path: Path
) -> None:
    # Not verified (0.91 falls short of 200k) and no console rollback: the host-side one stays armed.
    profile = profile_variant(tmp_path, "armed-091", fraction="0.91")
    res = _cli(twin, tmp_path, "apply", "twin", str(profile), "--yes", "--confirm-within", "600")
    assert res.returncode == 1, (res.stdout, res.stderr)
    try:
        before = _settled_unit(twin)
        for command in ("restart", "rollback"):
            res = _cli(twin, tmp_path, command, "twin", "--yes", timeout=60)
            assert res.returncode == 2, (command, res.stdout, res.stderr)
            line = one_sentence(res.stderr)
            assert "settle it first with k26-console confirm twin" in line and "the host is unchanged" in line
            assert _unit(twin) == before
            assert not _lock_file(twin).exists()
    finally:
        settled = _cli(twin, tmp_path, "confirm", "twin", "--rollback-now")
        assert settled.returncode == 0, (settled.stdout, settled.stderr)
