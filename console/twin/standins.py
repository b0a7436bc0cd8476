"""The server behind the twin's stand-in commands: one warm process that forks each command.

`python -m console.twin.standins serve ROOT MODULE...` imports the stand-in modules once, prints `ready`,
and listens on the twin's abstract unix socket (`standin_client.socket_name`). For each connection from a
stand-in client (`console/twin/standin_client.py`) it forks a session; the session forks the command,
which takes the client's stdin, stdout and stderr, argv, environment, working directory and umask, and
runs the module's `main(argv)`. The session passes on the signals the client relays, kills the command
when the client is gone, and reports how the command ended: `exit N` or `signal N`.

Only processes of this server's own user are served (SO_PEERCRED): the socket is abstract, so any local
user can connect to it, and a command runs with this server's rights.

Commands end with the twin: the server stops when its owner is gone, and sessions and commands are in
its process group, which the twin kills when it stops.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from console.twin.layout import TwinLayout
from console.twin.standin_client import socket_name
from console.twin.units import owner_alive

MAX_REQUEST = 1 << 20  # argv and environment of one command

Main = Callable[[list[str]], "int | None"]


def _peer_uid(conn: socket.socket) -> int:
    pid_uid_gid = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", pid_uid_gid)[1])


class Request(NamedTuple):
    module: str
    cwd: bytes
    umask: int
    argv: list[str]
    env: list[bytes]


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(n - len(buf), 1 << 16))
        if not chunk:
            raise ValueError("short request")
        buf += chunk
    return bytes(buf)


def _read_request(conn: socket.socket) -> tuple[list[int], Request]:
    """The client's three descriptors, then its request (`standin_client.encode_request`)."""
    _, fds, _, _ = socket.recv_fds(conn, 1, 3)
    if len(fds) != 3:
        raise ValueError("a request without stdin, stdout and stderr")
    size = int.from_bytes(_recv_exactly(conn, 8), "little")
    if size > MAX_REQUEST:
        raise ValueError("oversized request")
    fields = _recv_exactly(conn, size).split(b"\0")
    module, cwd, umask, count = fields[0].decode(), fields[1], int(fields[2]), int(fields[3])
    argv = [os.fsdecode(a) for a in fields[4 : 4 + count]]
    return fds, Request(module, cwd, umask, argv, fields[4 + count :])


def _exit_code(code: object) -> int:
    """What the interpreter makes of `raise SystemExit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        sys.stderr.write(f"{code}\n")
    return 1


def _run_command(fds: list[int], request: Request, main: Main) -> None:
    """In the command's process: become the client's command, run it, and exit with its status."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    os.umask(request.umask)
    try:
        os.chdir(request.cwd)
    except OSError:
        os.chdir("/")
    os.environb.clear()
    for item in request.env:
        key, eq, value = item.partition(b"=")
        if eq and key:
            os.environb[key] = value
    args = request.argv
    spec = importlib.util.find_spec(request.module)
    sys.argv = [spec.origin if spec is not None and spec.origin else request.module, *args]
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.reconfigure(line_buffering=stream.isatty())  # type: ignore[union-attr]
    code = 1
    try:
        code = _exit_code(main(args))
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _session(conn: socket.socket, mains: dict[str, Main]) -> None:
    """In a child of the server: fork the command, relay signals to it, report how it ended."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    fds, request = _read_request(conn)
    main = mains.get(request.module)
    if main is None:
        os.write(fds[2], f"k26 twin: {request.module!r} is not a stand-in this twin serves\n".encode())
        conn.sendall(b"exit 127\n")
        return
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run_command(fds, request, main)
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    pending = b""
    client_gone = False
    while True:
        watched: list[int | socket.socket] = [pidfd] if client_gone else [pidfd, conn]
        ready, _, _ = select.select(watched, [], [])
        if pidfd in ready:
            _, status = os.waitpid(pid, 0)
            if os.WIFSIGNALED(status):
                report = f"signal {os.WTERMSIG(status)}\n"
            else:
                report = f"exit {os.waitstatus_to_exitcode(status)}\n"
            with contextlib.suppress(OSError):
                conn.sendall(report.encode())
            return
        data = b""
        with contextlib.suppress(OSError):
            data = conn.recv(256)
        if not data:
            # The client was killed (or its session closed): the command goes too.
            client_gone = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            continue
        pending += data
        while b"\n" in pending:
            line, _, pending = pending.partition(b"\n")
            kind, _, value = line.decode(errors="replace").partition(" ")
            if kind == "sig" and value.isdigit():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, int(value))


def serve(root: Path, modules: list[str]) -> None:
    layout = TwinLayout(root)
    mains: dict[str, Main] = {m: importlib.import_module(m).main for m in modules}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_name(str(layout.root)))
    listener.listen(128)
    listener.settimeout(1.0)
    # Sessions report to their clients, not to the server: let the kernel reap them.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    uid = os.getuid()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)  # the twin's pipe closes; commands get the client's stdout
    os.close(devnull)
    while owner_alive(layout):
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        pid = -1
        with contextlib.suppress(OSError):
            if _peer_uid(conn) == uid:
                pid = os.fork()
        if pid == 0:
            listener.close()
            code = 0
            try:
                _session(conn, mains)
            except BaseException:  # a session must never return into the server's loop
                with contextlib.suppress(Exception):
                    traceback.print_exc()
                code = 1
            os._exit(code)
        conn.close()


class StandinServer:
    """The twin's handle on its server: started before the stand-ins are needed, stopped after the
    service, with the commands it is running (its process group)."""

    def __init__(self, layout: TwinLayout) -> None:
        self.layout = layout
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self, python: str, pythonpath: str, modules: list[str]) -> bool:
        """Start the server and wait for its `ready`; False (and nothing left running) when it fails."""
        self.proc = subprocess.Popen(
            [python, "-m", "console.twin.standins", "serve", str(self.layout.root), *modules],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=dict(os.environ, PYTHONPATH=pythonpath),
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.proc.stdout.close()
        if line.strip() == b"ready":
            return True
        self.proc.kill()
        self.proc.wait()
        self.proc = None
        return False

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(5)
                return
            except subprocess.TimeoutExpired:
                continue


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "serve":
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        serve(Path(argv[1]), argv[2:])
        return 0
    sys.stderr.write("usage: python -m console.twin.standins serve STATE_DIR MODULE...\n")
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
