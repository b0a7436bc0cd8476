"""A twin killed without warning leaves nothing behind, and starts again on its state directory.

`k26-console twin` runs in its own session; the test SIGKILLs it (no cleanup runs), then checks that the
real systemd manager, its namespaces and its cgroup are gone (the watchdog's work) or, on the simulated
systemd, that the supervisors and the journal writer ended with their owner. A second twin on the same
state directory must come up on the same ports (the console's drop-ins pin the SGLang port) and stop on
SIGTERM and on SIGHUP.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from console.twin.layout import TwinConfig, TwinLayout
from console.twin.realsd import RealManager, why_unavailable
from tests.support.cli import wait_until
from tests.support.procs import processes_of

TIME_SCALE = "0.002"
MODES = ["simulated", *(["real"] if why_unavailable() is None else [])]


def _start(state: Path, mode: str) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "console.cli.main",
            "twin",
            "--state-dir",
            str(state),
            "--time-scale",
            TIME_SCALE,
            "--systemd",
            mode,
            "--no-register",  # never into the hosts.toml of whoever runs the tests
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    lines = [proc.stdout.readline().strip() for _ in range(3)]
    assert lines[2].startswith("systemd: "), (lines, proc.stderr.read() if proc.poll() is not None else "")
    return proc, lines


@pytest.fixture
def reap() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize("mode", MODES)
def test_sigkill_leaves_nothing_and_a_restart_keeps_its_ports(
    tmp_path: Path, mode: str, reap: list[subprocess.Popen[str]]
) -> None:
    state = tmp_path / "state"
    layout = TwinLayout(state)
    proc, lines = _start(state, mode)
    reap.append(proc)
    assert lines[2] == (
        "systemd: simulated" if mode == "simulated" else f"systemd: real (systemd {_version()})"
    )
    first = TwinConfig.model_validate_json(layout.config_path.read_text())
    manager = RealManager(layout)
    init = manager.init_pid()
    if mode == "real":
        assert init is not None and manager.cgroup.is_dir()

    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert wait_until(lambda: not processes_of(layout.root), 15), processes_of(layout.root)
    if mode == "real":
        assert init is not None
        assert wait_until(lambda: not Path(f"/proc/{init}").exists(), 5), "the manager outlived its twin"
        assert wait_until(lambda: not manager.cgroup.exists(), 5), f"{manager.cgroup} was left behind"

    # The same state directory, again: same SGLang and SSH ports, a running service.
    again, lines = _start(state, mode)
    reap.append(again)
    second = TwinConfig.model_validate_json(layout.config_path.read_text())
    assert (second.sglang_port, second.ssh_port) == (first.sglang_port, first.ssh_port)
    active = subprocess.run(
        [str(layout.bin_dir / "systemctl"), "is-active", second.unit],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": f"{layout.bin_dir}:/usr/bin:/bin", "K26_TWIN_ROOT": str(layout.root)},
    )
    assert active.stdout == "active\n", active.stderr

    # It stops on SIGTERM, and nothing of it is left.
    os.kill(again.pid, signal.SIGTERM)
    assert again.wait(30) == 0
    assert wait_until(lambda: not processes_of(layout.root), 10), processes_of(layout.root)
    if mode == "real":
        assert not manager.cgroup.exists()


@pytest.mark.parametrize("mode", MODES)
def test_sighup_stops_the_twin(tmp_path: Path, mode: str, reap: list[subprocess.Popen[str]]) -> None:
    state = tmp_path / "state"
    proc, _ = _start(state, mode)
    reap.append(proc)
    os.kill(proc.pid, signal.SIGHUP)
    assert proc.wait(30) == 0
    assert wait_until(lambda: not processes_of(TwinLayout(state).root), 10)


def test_a_second_twin_on_a_state_dir_in_use_is_refused(
    tmp_path: Path, reap: list[subprocess.Popen[str]]
) -> None:
    state = tmp_path / "state"
    proc, _ = _start(state, MODES[-1])
    reap.append(proc)
    second = subprocess.run(
        [sys.executable, "-m", "console.cli.main", "twin", "--state-dir", str(state), "--no-register"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert second.returncode == 2
    assert f"in use by another twin (pid {proc.pid})" in second.stderr
    assert "Traceback" not in second.stderr
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == 0


def _version() -> str:
    from console.twin.realsd import systemd_version

    return systemd_version()
