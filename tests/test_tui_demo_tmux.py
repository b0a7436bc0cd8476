"""`k26-console demo` driven in tmux as a person would: the screen fills in, and q quits cleanly."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.tmux import PANE_SIZE

REPO = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


def _tmux(sock: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, check=False).stdout


def _wait_for(sock: str, predicate, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = _tmux(sock, "capture-pane", "-p")
        if predicate(screen):
            return screen
        time.sleep(0.3)
    raise AssertionError(f"the screen never showed what was expected:\n{screen}")


def test_demo_in_tmux(tmp_path: Path) -> None:
    sock = f"k26-test-{os.getpid()}"
    rc_file = tmp_path / "rc"
    cmd = (
        PANE_SIZE
        + f"cd {REPO} && {sys.executable} -m console.cli.main demo --state-dir {tmp_path / 'twin'}; "
        f"echo $? > {rc_file}; sleep 5"
    )
    _tmux(sock, "new", "-d", "-x", "160", "-y", "48", cmd)
    try:
        screen = _wait_for(sock, lambda s: "SIMULATED HOST" in s and "GPU7" in s, 20)
        # Within seconds: GPU bars split by the journal, the gauge with the pool, the events, a ready boot.
        kinds = (
            "cuda_graph",
            "pool_summary",
            "server_ready",
            "http_access",
            "prefill_batch",
            "kv_pool_allocated",
        )
        screen = _wait_for(
            sock,
            # ("tokens" after the pool only where the column has room for it beside the level)
            lambda s: "KV pool" in s and "pool 101,134" in s and any(k in s for k in kinds),
            30,
        )
        assert "█" in screen
        assert "r Restart" in screen
        _tmux(sock, "send-keys", "q")
        deadline = time.monotonic() + 20
        while not rc_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert rc_file.read_text().strip() == "0"
    finally:
        _tmux(sock, "kill-server")
