"""Transient timers of the simulated systemd: what `systemd-run --on-active=S --unit=NAME CMD...` makes.

Only under the simulated systemd (a real manager makes its own). A timer is a detached process that sleeps
until its deadline and then runs the command; `systemctl stop NAME.timer` kills it first, `systemctl
is-active NAME.timer` asks whether it still waits. Like every twin process, it ends with the twin's owner.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel

from console.twin.layout import TwinLayout, write_atomic
from console.twin.units import owner_alive, pid_alive


class TransientTimer(BaseModel):
    name: str
    pid: int = 0
    deadline: float
    description: str = ""
    argv: list[str]


def _path(layout: TwinLayout, name: str) -> Path:
    return layout.systemd_dir / "timers" / f"{name}.json"


def read(layout: TwinLayout, name: str) -> TransientTimer | None:
    try:
        timer = TransientTimer.model_validate_json(_path(layout, name).read_bytes())
    except (OSError, ValueError):
        return None
    return timer if pid_alive(timer.pid) else None


def arm(layout: TwinLayout, name: str, on_active_s: float, description: str, argv: list[str]) -> str | None:
    """Start the timer; None, or why not (one line, as systemd-run says it)."""
    if read(layout, name) is not None:
        return f"Failed to start transient timer unit: Unit {name}.timer was already loaded or has a fragment file."
    timer = TransientTimer(name=name, deadline=time.time() + on_active_s, description=description, argv=argv)
    write_atomic(_path(layout, name), timer.model_dump_json())
    proc = subprocess.Popen(
        [sys.executable, "-m", "console.twin.timers", "fire", str(layout.root), name],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    timer.pid = proc.pid
    write_atomic(_path(layout, name), timer.model_dump_json())
    return None


def stop(layout: TwinLayout, name: str) -> None:
    timer = read(layout, name)
    if timer is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(timer.pid, signal.SIGTERM)
    _path(layout, name).unlink(missing_ok=True)


def _fire(layout: TwinLayout, name: str) -> int:
    try:
        timer = TransientTimer.model_validate_json(_path(layout, name).read_bytes())
    except (OSError, ValueError):
        return 1
    while time.time() < timer.deadline:
        if not owner_alive(layout):
            return 0
        time.sleep(min(0.2, max(0.0, timer.deadline - time.time())))
    # The service runs: the timer has elapsed (a transient timer is gone once it has fired).
    _path(layout, name).unlink(missing_ok=True)
    return subprocess.run(timer.argv, stdin=subprocess.DEVNULL, check=False).returncode


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "fire":
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        raise SystemExit(_fire(TwinLayout(Path(sys.argv[2])), sys.argv[3]))
    sys.stderr.write("usage: python -m console.twin.timers fire STATE_DIR NAME\n")
    raise SystemExit(2)
