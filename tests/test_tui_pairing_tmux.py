"""Two `k26-console open twin` processes side by side in one tmux window (80 columns each), as two
operators on their jump hosts would run them (issue 9): each shows the other; alice applies ctx-200k from
the palette and bob's console shows her lock; alice's console is killed mid-restart, her lock goes
stale in bob's console, and bob breaks it from the palette only after confirming; the trail shows the
break.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from console.twin.host import TwinHost
from tests.support.cli import slow_boots
from tests.support.tmux import PANE_SIZE
from tests.support.twins import module_twin

REPO = Path(__file__).resolve().parent.parent
TIME_SCALE = 0.002  # the module's first boot; alice's restart runs at SLOW_SCALE
SLOW_SCALE = 0.05  # the incident's boot in about fifty seconds: alice's console is killed well within it

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


twin = module_twin("pair-tmux-twin", time_scale=TIME_SCALE)


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, check=False).stdout


def _screen(sock: str, pane: str) -> str:
    return _tmux(sock, "capture-pane", "-p", "-t", pane)


def _wait_for(sock: str, pane: str, predicate: Callable[[str], bool], timeout: float, what: str) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = _screen(sock, pane)
        if predicate(screen):
            return screen
        time.sleep(0.2)
    raise AssertionError(f"pane {pane} never showed {what}:\n{screen}")


def _console(twin: TwinHost, home: Path, user: str, rc: Path) -> str:
    # getpass reads LOGNAME first: each pane is its own operator.
    env = (
        f"LOGNAME={user} USER={user} XDG_CONFIG_HOME={home / 'config'} XDG_STATE_HOME={home / 'state'} "
        f"PYTHONPATH={REPO}"
    )
    return (
        PANE_SIZE
        + f"cd {REPO} && env {env} {sys.executable} -m console.cli.main open twin --hosts {twin.hosts_toml}; "
        f"echo $? > {rc}; sleep 60"
    )


def _console_pid(sock: str, pane: str) -> int:
    shell = int(_tmux(sock, "display-message", "-p", "-t", pane, "#{pane_pid}").strip())
    # The children of this pane's own shell, from the kernel (no process search by name or parent).
    children = Path(f"/proc/{shell}/task/{shell}/children").read_text()
    (pid,) = [int(p) for p in children.split()]
    return pid


def _trail(twin: TwinHost, home: Path) -> list[dict[str, object]]:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "console.cli.main",
            "audit",
            "twin",
            "--hosts",
            str(twin.hosts_toml),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "XDG_CONFIG_HOME": str(home / "config"), "PYTHONPATH": str(REPO)},
    )
    assert res.returncode == 0, res.stderr
    return list(json.loads(res.stdout)["entries"])


def _palette(sock: str, pane: str, command: str) -> None:
    """Run a palette command as a person does: open the palette, type, and press Enter once the command
    is listed (typed in the input and shown as a hit: twice on the screen)."""
    before = _screen(sock, pane).count(command)
    _tmux(sock, "send-keys", "-t", pane, "C-p")
    _wait_for(sock, pane, lambda s: "Search for commands" in s, 20, "the command palette")
    _tmux(sock, "send-keys", "-t", pane, "-l", command)
    _wait_for(sock, pane, lambda s: s.count(command) >= before + 2, 20, f"{command!r} listed")
    _tmux(sock, "send-keys", "-t", pane, "Enter")


def test_two_consoles_side_by_side_one_killed_mid_restart(twin: TwinHost, tmp_path: Path) -> None:
    sock = f"k26-pair-{os.getpid()}"
    rc_a, rc_b = tmp_path / "rc-a", tmp_path / "rc-b"
    _tmux(sock, "new", "-d", "-x", "161", "-y", "48", _console(twin, tmp_path / "a", "alice", rc_a))
    _tmux(sock, "split-window", "-h", "-t", "0", _console(twin, tmp_path / "b", "bob", rc_b))
    a, b = "0.0", "0.1"
    try:
        assert _tmux(sock, "display-message", "-p", "-t", a, "#{pane_width}").strip() == "80"
        # Each console shows the other in the bar under its header, the GPU bars, the gauge and events.
        _wait_for(sock, a, lambda s: "with bob@" in s, 40, "bob")
        screen = _wait_for(
            sock, b, lambda s: "with alice@" in s and "pool 101,134" in s, 40, "alice and the pool"
        )
        assert "lock free" in screen and "GPU7" in screen and "█" in screen and "events" in screen

        # Alice's restart runs slowly (her apply reloads the unit, which reads this drop-in): however loaded
        # the machine, bob's refusal and the kill land within it (a run at the module's pace of ten seconds
        # a boot saw her apply finish, and her lock go free, before the kill).
        slow_boots(twin, SLOW_SCALE)
        _palette(sock, a, "Apply profile ctx-200k to twin")
        _wait_for(sock, a, lambda s: "Apply ctx-200k to twin?" in s, 40, "the apply confirmation")
        _tmux(sock, "send-keys", "-t", a, "y")
        screen = _wait_for(sock, b, lambda s: "locked by alice@" in s, 30, "alice's lock")
        assert "apply ctx-200k" in screen
        # Bob's r is refused at once, naming alice and her intent.
        _tmux(sock, "send-keys", "-t", b, "r")
        _wait_for(sock, b, lambda s: "a restart is refused" in s, 10, "the refusal")

        # Kill alice's console once her restart is under way: her drop-in is on the host.
        dropin = twin.layout.unit_dir / f"{twin.unit}.d" / "50-k26-console.conf"
        deadline = time.monotonic() + 60
        while not dropin.exists():
            assert time.monotonic() < deadline, "alice's apply never wrote its drop-in"
            time.sleep(0.05)
        os.kill(_console_pid(sock, a), signal.SIGKILL)
        screen = _wait_for(sock, b, lambda s: "STALE lock alice@" in s, 30, "the stale lock")
        assert "with alice@" not in screen  # her heartbeat is gone too

        # Break it: the confirmation names holder and intent; "n" keeps it, "y" breaks it.
        _palette(sock, b, "Break the stale lock on twin")
        screen = _wait_for(sock, b, lambda s: "Break the stale lock on twin?" in s, 20, "the confirmation")
        assert "alice@" in screen and "apply ctx-200k" in screen
        _tmux(sock, "send-keys", "-t", b, "n")
        screen = _wait_for(sock, b, lambda s: "Break the stale lock on twin?" not in s, 20, "the answer")
        assert "STALE lock alice@" in screen
        _palette(sock, b, "Break the stale lock on twin")
        _wait_for(sock, b, lambda s: "Break the stale lock on twin?" in s, 20, "the confirmation again")
        _tmux(sock, "send-keys", "-t", b, "y")
        # The feed scrolls on with the server's access lines; the bar and the trail keep the break.
        _wait_for(sock, b, lambda s: "lock free" in s and "Break the stale" not in s, 20, "the lock free")

        trail = _trail(twin, tmp_path)
        broke = [e for e in trail if e["action"] == "lock_break"]
        assert len(broke) == 1 and broke[0]["user"] == "bob"
        assert "alice@" in str(broke[0]["summary"]) and "apply ctx-200k" in str(broke[0]["summary"])
        # Alice's console wrote its intent before the change and was killed before the outcome.
        applies = [e for e in trail if e["action"] == "apply"]
        assert [(e["user"], e["outcome"], e["profile"]) for e in applies] == [
            ("alice", "started", "ctx-200k")
        ]

        _tmux(sock, "send-keys", "-t", b, "q")
        deadline = time.monotonic() + 20
        while not rc_b.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert rc_b.read_text().strip() == "0"
    except AssertionError:
        print("--- pane a ---", _screen(sock, a), "--- pane b ---", _screen(sock, b), sep="\n")
        raise
    finally:
        _tmux(sock, "kill-server")
