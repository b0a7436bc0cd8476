"""`k26-console demo --hosts N`: N twins in the demo's sandbox, the console opened on the fleet overview,
every twin stopped on `q`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import one_sentence, operator_env, run_main, wait_until
from tests.support.tmux import PANE_SIZE

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("hosts", ["0", "33"])
def test_a_fleet_the_demo_cannot_hold_is_one_sentence(hosts: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(["demo", "--hosts", hosts], capsys)
    assert code == 2 and out == ""
    assert f"--hosts must be a whole number from 1 to 32, not {hosts}." in one_sentence(err)


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(
        ["tmux", "-S", sock, *args], capture_output=True, text=True, check=False, timeout=30
    ).stdout


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_demo_with_four_hosts_opens_on_the_overview_and_stops_every_twin(tmp_path: Path) -> None:
    home = tmp_path / "operator"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    state = tmp_path / "twins"
    rc = tmp_path / "rc"
    env = " ".join(f"{k}={v}" for k, v in operator_env(home).items() if k.startswith(("XDG_", "PYTHONPATH")))
    cmd = (
        PANE_SIZE
        + f"cd {REPO} && env {env} TMPDIR={scratch} TERM=xterm-256color {sys.executable} -m console.cli.main "
        f"demo --hosts 4 --state-dir {state} --time-scale 0.02; echo $? > {rc}; sleep 30"
    )
    sock = str(tmp_path / "tmux.sock")
    _tmux(sock, "new", "-d", "-x", "160", "-y", "48", cmd)
    screen = ""

    def every_host_ready() -> bool:
        nonlocal screen
        screen = _tmux(sock, "capture-pane", "-p")
        rows = [line for line in screen.split("\n") if line.strip("│ ").startswith("twin-")]
        return len(rows) == 4 and all(" ready " in row and "101k / 200k" in row for row in rows)

    try:
        assert wait_until(every_host_ready, 120, interval_s=0.5), screen
        assert "fleet · 4 hosts" in screen, screen
        # Enter opens the first host's dashboard (its header names it), `o` comes back.
        _tmux(sock, "send-keys", "Enter")
        assert wait_until(lambda: "SIMULATED HOST" in _tmux(sock, "capture-pane", "-p"), 20)
        _tmux(sock, "send-keys", "o")
        assert wait_until(lambda: "fleet · 4 hosts" in _tmux(sock, "capture-pane", "-p"), 20)
        _tmux(sock, "send-keys", "q")
        assert wait_until(rc.exists, 60), _tmux(sock, "capture-pane", "-p")
        assert rc.read_text().strip() == "0"
    finally:
        _tmux(sock, "kill-server")
    # Each twin had its own state directory under --state-dir, and nothing started there runs on.
    assert sorted(p.name for p in state.iterdir()) == ["twin-1", "twin-2", "twin-3", "twin-4"]
    assert wait_until(lambda: not _running_under(state), 30), _running_under(state)
    assert list(scratch.iterdir()) == [], "the demo left its sandbox behind"


def _running_under(root: Path) -> list[str]:
    """The command lines of live processes that name a path under `root` (this test's own directory:
    only what the demo started there can match)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = " ".join(a.decode("utf-8", "replace") for a in argv)
        if str(root) in text:
            found.append(f"{proc.name}: {text[:200]}")
    return found
