"""The twin's Python stand-ins run in its stand-in server: same output, status and signals as before.

Each `systemctl`, `systemd-run`, `nvidia-smi` and fallback `journalctl` of a twin is a thin client
(console/twin/standin_client.py) that hands the command to the twin's warm server
(console/twin/standins.py). What a caller sees must not change: stdout, stderr, exit status, death by the
signal it was sent; a client killed outright takes its command with it; with no server the client runs
the command itself.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from console.twin.host import TwinHost
from console.twin.standin_client import encode_request, socket_name
from console.twin.standins import _read_request
from tests.support.cli import wait_until


def _twin(root: Path) -> TwinHost:
    # Simulated manager and fallback journal: every Python stand-in the twin has is served.
    return TwinHost(root, time_scale=0.002, systemd="simulated", journal="fallback", ssh=False)


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwinHost]:
    host = _twin(tmp_path_factory.mktemp("standins") / "state")
    host.start_sync()
    try:
        yield host
    finally:
        host.stop_sync()


def _run(twin: TwinHost, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(twin.layout.bin_dir / argv[0]), *argv[1:]],
        env=twin.session_env(),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def _server_pid(twin: TwinHost) -> int:
    pid = twin._standins.pid
    assert pid is not None, "the twin started no stand-in server"
    return pid


def _server_children(twin: TwinHost) -> list[str]:
    pid = _server_pid(twin)
    return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()


def _loop(twin: TwinHost) -> subprocess.Popen[str]:
    """`nvidia-smi -l 1`: a stand-in that runs until it is stopped, once it has printed its first line."""
    proc = subprocess.Popen(
        [str(twin.layout.bin_dir / "nvidia-smi"), "--query-gpu=index", "--format=csv,noheader", "-l", "1"],
        env=twin.session_env(),
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "0"
    return proc


def test_commands_print_and_exit_as_they_did(twin: TwinHost) -> None:
    active = _run(twin, "systemctl", "is-active", twin.unit)
    assert (active.returncode, active.stdout, active.stderr) == (0, "active\n", "")
    shown = _run(twin, "systemctl", "show", "-p", "ExecStart", "--value", twin.unit)
    assert shown.returncode == 0 and "sglang.launch_server" in shown.stdout
    wrong = _run(twin, "systemctl", "no-such-verb")
    assert wrong.returncode == 1 and wrong.stdout == ""
    assert wrong.stderr == "systemctl: Unknown command verb 'no-such-verb'.\n"
    gpus = _run(twin, "nvidia-smi", "--query-gpu=index,memory.total", "--format=csv,noheader,nounits")
    assert gpus.returncode == 0 and len(gpus.stdout.splitlines()) == 8, gpus
    journal = _run(twin, "journalctl", "-u", twin.unit, "-n", "3", "--no-pager", "-o", "cat")
    assert journal.returncode == 0 and len(journal.stdout.splitlines()) == 3, journal


def test_a_command_runs_in_the_server_and_signals_reach_it(twin: TwinHost) -> None:
    proc = _loop(twin)
    try:
        # The command is the server's (a session it forked), not a Python of the client's own.
        assert len(_server_children(twin)) == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    assert wait_until(lambda: not _server_children(twin), 10)
    proc = _loop(twin)
    try:
        proc.send_signal(signal.SIGHUP)  # what a closed SSH session sends
        assert proc.wait(10) == -signal.SIGHUP
    finally:
        proc.kill()
        proc.wait()


def test_a_client_killed_outright_takes_its_command_with_it(twin: TwinHost) -> None:
    proc = _loop(twin)
    assert wait_until(lambda: len(_server_children(twin)) == 1, 10)
    proc.kill()
    proc.wait()
    assert wait_until(lambda: not _server_children(twin), 10), "the command outlived its client"


def test_the_request_keeps_every_byte_of_argv_and_the_environment() -> None:
    args = ["", "two words", "--x=a=b", "caf\u00e9", os.fsdecode(b"\xff\xfe-not-utf8"), "line\nbreak"]
    env = {b"K26_TWIN_ROOT": b"/tmp/x", b"WEIRD": b"a=b=c", b"EMPTY": b"", b"BYTES": b"\xff"}
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        socket.send_fds(left, [b"F"], [0, 1, 2])
        left.sendall(encode_request("console.twin.systemctl", args, "/tmp", 0o027, env))
        fds, request = _read_request(right)
        for fd in fds:
            os.close(fd)
    assert len(fds) == 3
    assert request.module == "console.twin.systemctl" and request.cwd == b"/tmp" and request.umask == 0o027
    assert request.argv == args
    assert request.env == [b"K26_TWIN_ROOT=/tmp/x", b"WEIRD=a=b=c", b"EMPTY=", b"BYTES=\xff"]


def test_a_long_state_path_still_names_a_socket() -> None:
    short, long_ = "/tmp/state", "/tmp/" + "d" * 300 + "/state"
    assert socket_name(short) == "\0k26-twin-standins-/tmp/state"
    name = socket_name(long_)
    assert len(name.encode()) <= 107 and name != socket_name(long_ + "2") and name.endswith("/state")


def test_without_the_server_each_command_runs_in_its_own_python(tmp_path: Path) -> None:
    host = _twin(tmp_path / "state")
    host.start_sync()
    try:
        host._standins.stop()
        active = _run(host, "systemctl", "is-active", host.unit)
        assert (active.returncode, active.stdout) == (0, "active\n"), active
        wrong = _run(host, "systemctl", "no-such-verb")
        assert wrong.returncode == 1 and "Unknown command verb" in wrong.stderr
    finally:
        host.stop_sync()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another user")
def test_another_user_is_not_served(twin: TwinHost) -> None:
    """The socket is abstract, so any local user can connect: the server must close on them unserved."""
    script = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "s.connect(bytes.fromhex(sys.argv[1]).decode())\n"
        "try:\n"
        "    socket.send_fds(s, [b'F'], [0, 1, 2])\n"
        "    s.sendall(bytes.fromhex(sys.argv[2]))\n"
        "    print('answer', s.recv(64))\n"
        "except OSError as exc:\n"
        "    print('closed', type(exc).__name__)\n"
    )
    request = encode_request("console.twin.systemctl", ["is-active", twin.unit], "/", 0o022, {})
    name = socket_name(str(twin.layout.root)).encode().hex()
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    res = subprocess.run(
        [python, "-I", "-S", "-c", script, name, request.hex()],
        user=65534,
        group=65534,
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() in {"answer b''", "closed ConnectionResetError", "closed BrokenPipeError"}, res
