"""`k26-console apply` takes the host's lock and writes the audit trail (issue 9), as two operators would
meet it: two processes on one twin over SSH.

- two applies started at the same instant: exactly one proceeds; the other exits 3 at once, naming the
  holder and its intent; the trail then holds one apply, by the winner;
- an apply killed mid-restart leaves a lock whose heartbeat goes stale: a second apply is refused (exit 3,
  told how to break it), refused again without a terminal to confirm on, and breaks it with
  `--break-stale-lock --yes`; the trail shows the break, then the apply.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

from console.core.pairing import LockInfo, Presence
from console.twin.host import TwinHost
from tests.support.cli import CLI, REPO, operator_env
from tests.support.twins import module_twin

TIME_SCALE = 0.004


twin = module_twin("pair-twin", time_scale=TIME_SCALE)


def _profile(tmp: Path, name: str, fraction: float) -> Path:
    text = (REPO / "profiles" / "ctx-128k.toml").read_text()
    text = text.replace('name = "ctx-128k"', f'name = "{name}"')
    lines = [
        f"mem-fraction-static = {fraction}" if line.startswith("mem-fraction-static") else line
        for line in text.splitlines()
    ]
    path = tmp / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


# These tests are about the lock: their applies arm no host-side rollback (--confirm-within 0), which a
# killed apply would leave armed for the next one to confirm (tests/test_commit_confirmed.py).
NO_CONFIRM = ("--confirm-within", "0")


def _start_apply(twin: TwinHost, home: Path, profile: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "apply", "twin", str(profile), "--hosts", str(twin.hosts_toml), "--yes", *NO_CONFIRM, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=operator_env(home),
    )


def _apply_now(
    twin: TwinHost, home: Path, profile: Path, *extra: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "apply", "twin", str(profile), "--hosts", str(twin.hosts_toml), *NO_CONFIRM, *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=operator_env(home),
        stdin=subprocess.DEVNULL,
    )


def _holder_is_stale(twin: TwinHost) -> bool:
    """Whether the twin's lock is held by a console whose heartbeat is stale (or gone), by the rule the
    consoles apply; read on the twin's filesystem (this machine's clock is the host's)."""
    state = twin.layout.home_dir / ".k26-console"
    try:
        lock = LockInfo.model_validate_json((state / "lock").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return False
    try:
        beat = (state / "presence" / f"{lock.holder.console_id}.json").read_text().split("\n", 1)[0]
    except FileNotFoundError:
        return True
    return Presence.model_validate_json(beat).stale(datetime.now(UTC))


def _audit(twin: TwinHost, home: Path) -> list[dict[str, object]]:
    res = subprocess.run(
        [*CLI, "audit", "twin", "--hosts", str(twin.hosts_toml), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=operator_env(home),
    )
    assert res.returncode == 0, res.stderr
    return list(json.loads(res.stdout)["entries"])


def test_two_applies_at_once_exactly_one_proceeds(twin: TwinHost, tmp_path: Path) -> None:
    before = len(_audit(twin, tmp_path))
    a = _start_apply(twin, tmp_path, _profile(tmp_path, "pair-a", 0.88))
    b = _start_apply(twin, tmp_path, _profile(tmp_path, "pair-b", 0.89))
    started = time.monotonic()
    done: dict[str, tuple[int, str, str, float]] = {}
    procs = {"pair-a": a, "pair-b": b}
    while len(done) < 2:
        for name, proc in procs.items():
            if name not in done and proc.poll() is not None:
                out, err = proc.communicate()
                done[name] = (proc.returncode, out, err, time.monotonic() - started)
        assert time.monotonic() - started < 240, "the applies did not finish"
        time.sleep(0.05)
    codes = sorted(code for code, *_ in done.values())
    assert codes == [0, 3], done
    (winner,) = [n for n, (code, *_) in done.items() if code == 0]
    (loser,) = [n for n, (code, *_) in done.items() if code == 3]
    _, _, err, loser_s = done[loser]
    _, _, _, winner_s = done[winner]
    sentence = err.strip()
    assert sentence.startswith("k26-console: ") and "Traceback" not in err
    assert f"holds the lock on twin: apply {winner}" in sentence, sentence
    assert loser_s < winner_s  # refused at once, not after the winner's restart
    entries = _audit(twin, tmp_path)[before:]
    applies = [e for e in entries if e["action"] == "apply"]
    assert len(applies) == 1 and applies[0]["profile"] == winner and applies[0]["outcome"] == "ok"
    assert applies[0]["pool_tokens"] and applies[0]["durations"]


def test_a_killed_apply_leaves_a_stale_lock_that_is_broken_only_on_purpose(
    twin: TwinHost, tmp_path: Path
) -> None:
    before = len(_audit(twin, tmp_path))
    victim = _start_apply(twin, tmp_path, _profile(tmp_path, "pair-killed", 0.90))
    assert victim.stdout is not None
    deadline = time.monotonic() + 120
    for line in victim.stdout:  # kill it once the restart is under way, as a closed laptop would
        if "restart" in line or time.monotonic() > deadline:
            break
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)

    profile = _profile(tmp_path, "pair-after", 0.91)
    res = _apply_now(twin, tmp_path, profile, "--yes", timeout=60)
    assert res.returncode == 3, (res.stdout, res.stderr)
    assert "apply pair-killed" in res.stderr

    # Three missed heartbeats of 2 s make it stale: wait for that, judged by the console's own rule.
    deadline = time.monotonic() + 30
    while not _holder_is_stale(twin):
        assert time.monotonic() < deadline, "the killed apply's lock never went stale"
        time.sleep(0.2)
    res = _apply_now(twin, tmp_path, profile, "--yes", timeout=60)
    assert res.returncode == 3 and "--break-stale-lock" in res.stderr, res.stderr

    res = _apply_now(twin, tmp_path, profile, "--break-stale-lock", timeout=60)
    assert res.returncode == 3 and "no terminal to confirm" in res.stderr, res.stderr

    res = _apply_now(twin, tmp_path, profile, "--break-stale-lock", "--yes", timeout=240)
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert "broke the stale lock" in res.stdout
    records = _audit(twin, tmp_path)[before:]
    actions = [(e["action"], e.get("profile"), e.get("status")) for e in records]
    # The killed apply wrote its intent before the change and never its outcome: it reads as unfinished.
    assert actions == [
        ("apply", "pair-killed", "unfinished"),
        ("lock_break", None, "finished"),
        ("apply", "pair-after", "finished"),
    ], actions
