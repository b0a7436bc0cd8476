"""What the CLI and twin tests share: the operator's own config/state dirs in the test's tree, the
command line run as an operator runs it, profile variants of the shipped ctx-200k, a started twin, and
waiting on a condition with a deadline."""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from console.cli.main import main
from console.core.pairing import LockInfo, Presence
from console.twin.host import TwinHost
from tests.support.cli_zygote import Zygote

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "console.cli.main"]
CTX200K = (REPO / "profiles" / "ctx-200k.toml").read_text()


def operator_env(home: Path) -> dict[str, str]:
    """The environment of an operator whose config and state dirs are under `home` (never the real ones)."""
    return {
        **os.environ,
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_STATE_HOME": str(home / "state"),
        "PYTHONPATH": str(REPO),
    }


_zygote: Zygote | None = None


def _forked_cli() -> Zygote | None:
    """This worker's CLI zygote (tests/support/cli_zygote.py), started on first use; None when
    K26_TEST_CLI_FORK=0."""
    global _zygote
    if os.environ.get("K26_TEST_CLI_FORK", "1") == "0":
        return None
    if _zygote is None or not _zygote.alive():
        directory = tempfile.mkdtemp(prefix="k26-zygote-")
        _zygote = Zygote(directory)
        atexit.register(_zygote.close)
    return _zygote


def run_cli(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`k26-console ARGS` in a process of its own, no terminal, as the operator of `home`."""
    return cli_process(list(args), env=operator_env(home), timeout=timeout)


def cli_process(
    args: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
    fork: bool = True,
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run([*CLI, *args], capture_output=True, text=True, stdin=DEVNULL, ...)`: forked from this
    worker's zygote (the imports done once), a fresh process with `fork=False` or K26_TEST_CLI_FORK=0."""
    zygote = _forked_cli() if fork else None
    if zygote is not None:
        result: subprocess.CompletedProcess[str] = zygote.run(
            [*CLI, *args], args, dict(os.environ) if env is None else env, timeout, cwd=cwd
        )
        return result
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`k26-console ARGV` in this process: (exit code, stdout, stderr)."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def one_sentence(err: str) -> str:
    """The one line of an error: `k26-console: ...`, no traceback."""
    assert "Traceback" not in err, err
    lines = err.strip().split("\n")
    assert len(lines) == 1, err
    assert lines[0].startswith("k26-console: "), err
    return lines[0]


def profile_variant(
    tmp: Path, name: str, *, fraction: str | float | None = None, command: str | None = None
) -> Path:
    """The shipped ctx-200k under another name, with another --mem-fraction-static or command."""
    text = CTX200K.replace('name = "ctx-200k"', f'name = "{name}"')
    if fraction is not None:
        text = text.replace("mem-fraction-static = 0.93", f"mem-fraction-static = {fraction}")
    if command is not None:
        text = text.replace('command = ["python3", "-m", "sglang.launch_server"]', f"command = {command}")
    path = tmp / f"{name}.toml"
    path.write_text(text)
    return path


@contextlib.contextmanager
def started_twin(state: Path, **kw: Any) -> Iterator[TwinHost]:
    host = TwinHost(state, **kw)
    host.start_sync()
    try:
        yield host
    finally:
        host.stop_sync()


def slow_boots(twin: TwinHost, scale: float) -> Path:
    """A drop-in that runs the twin's next boots at `scale` from the next daemon-reload on; the caller
    removes it (and reloads) when done."""
    dropins = twin.layout.unit_dir / f"{twin.unit}.d"
    dropins.mkdir(parents=True, exist_ok=True)
    path = dropins / "90-test-slow-boot.conf"
    path.write_text(f"[Service]\nEnvironment=K26_TWIN_TIME_SCALE={scale!r}\n")
    return path


def wait_until(
    cond: Callable[[], object], timeout_s: float, interval_s: float = 0.05, max_interval_s: float = 0.5
) -> bool:
    """Poll `cond` until it is true or `timeout_s` has passed; its last answer. The pause between polls
    starts at `interval_s` and grows to `max_interval_s`: a condition that holds soon is seen soon, and
    one that takes a restart is not asked twenty times a second (a poll that runs the simulated
    systemctl costs 0.16 s of CPU)."""
    deadline = time.monotonic() + timeout_s
    pause = interval_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(max(pause, max_interval_s), pause * 1.5)
    return bool(cond())


def lock_looks_stale(twin: TwinHost) -> bool:
    """No lock on the twin, or its holder's heartbeat gone or stale by the consoles' own rule, read from the
    twin's files (on this machine, on this clock); anything unreadable counts as stale. A cheap wait before
    a command that judges the lock on the host: polling with the command costs a CLI start (~1 s of CPU)
    every poll through the 6 s a killed console's lock takes to go stale."""
    state = twin.layout.home_dir / ".k26-console"
    try:
        lock = LockInfo.model_validate_json((state / "lock").read_text().split("\n", 1)[0])
        beat = (state / "presence" / f"{lock.holder.console_id}.json").read_text().split("\n", 1)[0]
        return Presence.model_validate_json(beat).stale(datetime.now(UTC))
    except (OSError, ValueError):  # ValidationError is a ValueError
        return True
