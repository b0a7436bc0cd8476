"""The host's service manager dies mid-restart (issue 37): `restart` names it within 5 s instead of
waiting out the phase deadline to say "stuck in loading weights".

The twin's unit runs under a REAL systemd manager (console.twin.realsd) started for this test alone; the
test kills that manager, by the PID its twin started, with SIGKILL (as PID 1 of its namespace it takes
the service with it, as a host whose init dies would). Skipped where no real manager can run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from console.twin.host import TwinHost
from console.twin.realsd import why_unavailable
from tests.support.cli import CLI, operator_env, slow_boots, started_twin

pytestmark = pytest.mark.skipif(why_unavailable() is not None, reason=f"no real systemd: {why_unavailable()}")

TIME_SCALE = 0.002
SLOW = 0.05
"""The restart's boot at this scale: loading weights lasts seconds, time enough to kill the manager in it."""


@pytest.fixture
def twin(tmp_path: Path) -> Iterator[TwinHost]:
    with started_twin(tmp_path / "twin", time_scale=TIME_SCALE, systemd="real") as host:
        slow_boots(host, SLOW)
        host.systemctl("daemon-reload")
        yield host


def test_a_dead_service_manager_is_named_within_5_s_not_a_stuck_phase(twin: TwinHost, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*CLI, "restart", "twin", "--yes", "--hosts", str(twin.hosts_toml)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=operator_env(tmp_path),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    lines: list[tuple[float, str]] = []
    ended = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))
        ended.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    killed_at = None
    try:
        deadline = time.monotonic() + 90
        while killed_at is None:
            assert time.monotonic() < deadline and not ended.is_set(), "\n".join(t for _, t in lines)
            if any("loading weights" in text for _, text in lines):
                pid = twin.manager_pid()
                assert pid is not None
                os.kill(pid, signal.SIGKILL)
                killed_at = time.monotonic()
            else:
                ended.wait(0.05)
        # Named within 5 s of the kill (the restart's loading weights phase may take an hour).
        assert ended.wait(30), "the restart did not end after its host's service manager died"
        assert proc.wait(10) == 1
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(10)
        if proc.stdout is not None:
            proc.stdout.close()
    said = "\n".join(text for _, text in lines)
    assert "stuck in" not in said, said
    named = [at for at, text in lines if "the service manager on twin is gone" in text]
    assert named, said
    assert named[0] - killed_at <= 5.0, (named[0] - killed_at, said)
    assert "Traceback" not in said, said
