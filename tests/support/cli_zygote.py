"""`k26-console` runs for the tests, forked from a process that has already imported the console.

Each `python -m console.cli.main` the suite started spent 0.4–0.6 s of CPU importing asyncssh, pydantic
and the console before it did anything (302 such runs in one parallel pass). The zygote imports them once
per pytest worker and forks a child for each run. The child is a process of its own: its own stdin,
stdout and stderr (pipes the test reads), its own environment (the test's, whole, not the zygote's), its
working directory, and `console.cli.main` run as `__main__` by runpy as `python -m` runs it; it exits as
Python exits (atexit, flushed streams, a traceback and 1 for an uncaught exception, SystemExit's code).

What differs from a fresh `python -m console.cli.main`: what was imported before the environment was
set (nothing in those modules reads the environment at import), and the start itself (the CLI's own import
costs are measured by tests/bench/bench_cli_start.py, never through here). `K26_TEST_CLI_FORK=0` turns it
off: every run is then a fresh process.

Protocol (one SOCK_SEQPACKET connection per run): the client sends a JSON request {argv, env, cwd} with
three descriptors (stdin, stdout, stderr); the zygote answers `pid N`, and `exit N` or `signal N` once it
has reaped the child. The zygote ends when its stdin closes (the worker that started it has gone).
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import runpy
import select
import socket
import sys
import time
from typing import Any

MAX_REQUEST = 1 << 20


def _preload() -> None:
    """What a command run imports before it does anything, imported once here."""
    import asyncssh  # noqa: F401
    import pydantic  # noqa: F401

    from console.cli import main

    main.build_parser()  # every command's module
    for name in (
        "console.sources.transport",
        "console.sources.hosts",
        "console.sources.hoststate",
        "console.core.events",
        "console.core.parser",
    ):
        __import__(name)


def _recv_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    fds = array.array("i")
    msg, ancdata, _flags, _addr = conn.recvmsg(MAX_REQUEST, socket.CMSG_LEN(3 * fds.itemsize))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    return json.loads(msg), list(fds)


def _serve(listener: socket.socket) -> dict[str, Any] | None:
    """The zygote's loop. Returns the request a forked child is to run (in the child); None when the
    worker has gone (in the zygote)."""
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, the run's connection)
    while True:
        readable, _, _ = select.select([sys.stdin.fileno(), listener.fileno(), *children], [], [])
        for fd in readable:
            if fd == sys.stdin.fileno():
                if not os.read(fd, 4096):
                    return None
            elif fd == listener.fileno():
                conn, _ = listener.accept()
                try:
                    request, fds = _recv_request(conn)
                except (OSError, ValueError):
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    conn.close()
                    for pidfd, (_pid, other) in children.items():
                        os.close(pidfd)
                        other.close()
                    for target, fd_in in enumerate(fds):
                        os.dup2(fd_in, target)
                        if fd_in > 2:
                            os.close(fd_in)
                    return request
                for fd_in in fds:
                    os.close(fd_in)
                children[os.pidfd_open(pid)] = (pid, conn)
                with contextlib.suppress(OSError):
                    conn.send(f"pid {pid}".encode())
            else:
                pid, conn = children.pop(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                answer = (
                    f"signal {os.WTERMSIG(status)}"
                    if os.WIFSIGNALED(status)
                    else f"exit {os.waitstatus_to_exitcode(status)}"
                )
                with contextlib.suppress(OSError):
                    conn.send(answer.encode())
                conn.close()


def _run_child(request: dict[str, Any]) -> None:
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()
    os.chdir(request["cwd"])
    sys.argv = ["console.cli.main", *request["argv"]]
    # As `python -m` does: the module runs as __main__, not as the `console.cli.main` preloaded here.
    sys.modules.pop("console.cli.main", None)
    try:
        runpy.run_module("console.cli.main", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    _finish(code)


def _exit_code(exc: SystemExit) -> int:
    """The status Python exits with for `exc` (a message that is not a number is printed, status 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    with contextlib.suppress(Exception):
        sys.stderr.write(f"{exc.code}\n")
    return 1


def _finish(code: int) -> None:
    """Python's exit without freeing the zygote's heap, which a child inherited whole (tearing down every
    preloaded module cost a forked `--version` more than a fresh one): the non-daemon threads joined, the
    atexit handlers run, the streams flushed, as Python's own finalisation does, then `_exit`."""
    import atexit
    import threading

    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            code = code or 120  # Python's status when flushing stdout at exit fails
    os._exit(code)


def main() -> None:
    path = sys.argv[1]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    _preload()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    request = _serve(listener)
    if request is None:
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    _run_child(request)


class Zygote:
    """The test side: starts the zygote (once per worker process) and runs commands through it."""

    def __init__(self, directory: str) -> None:
        import subprocess

        self.directory = directory
        self.path = os.path.join(directory, "cli-zygote.sock")
        self.owner = os.getpid()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.cli_zygote", self.path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        )
        assert self.process.stdout is not None
        if self.process.stdout.readline() != b"ready\n":
            self.process.kill()
            raise RuntimeError("the CLI zygote did not start")

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.process.poll() is None

    def close(self) -> None:
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        with contextlib.suppress(Exception):
            self.process.wait(5)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self.directory)

    def run(
        self, cmd: list[str], argv: list[str], env: dict[str, str], timeout: float, *, cwd: Any = None
    ) -> Any:
        """Like `subprocess.run(cmd, capture_output=True, text=True, stdin=DEVNULL, env=env,
        timeout=timeout)`, the child forked from the zygote."""
        import locale
        import signal
        import subprocess

        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        devnull = os.open(os.devnull, os.O_RDONLY)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect(self.path)
            request = json.dumps({"argv": argv, "env": env, "cwd": str(cwd or os.getcwd())}).encode()
            fds = array.array("i", [devnull, out_w, err_w])
            conn.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        finally:
            for fd in (devnull, out_w, err_w):
                os.close(fd)
        deadline = time.monotonic() + timeout
        chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
        open_fds = {out_r, err_r}
        pid: int | None = None
        returncode: int | None = None
        timed_out = False
        try:
            while open_fds or returncode is None:
                left = deadline - time.monotonic()
                if left <= 0 and not timed_out:
                    timed_out = True
                    if pid is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    deadline = time.monotonic() + 10  # its status, and the pipes' end
                    continue
                if left <= 0:
                    break
                watched = [*open_fds, *([conn.fileno()] if returncode is None else [])]
                readable, _, _ = select.select(watched, [], [], left)
                for item in readable:
                    if item == conn.fileno():
                        answer = conn.recv(64).decode()
                        if not answer:
                            raise RuntimeError("the CLI zygote went away during a run")
                        kind, _, value = answer.partition(" ")
                        if kind == "pid":
                            pid = int(value)
                        else:
                            returncode = -int(value) if kind == "signal" else int(value)
                    else:
                        data = os.read(item, 1 << 16)
                        if data:
                            chunks[item].append(data)
                        else:
                            open_fds.discard(item)
        finally:
            conn.close()
            os.close(out_r)
            os.close(err_r)
        encoding = locale.getpreferredencoding(False)

        def text(fd: int) -> str:
            # text=True reads with universal newlines
            return b"".join(chunks[fd]).decode(encoding).replace("\r\n", "\n").replace("\r", "\n")

        if timed_out:
            raise subprocess.TimeoutExpired(cmd, timeout, text(out_r), text(err_r))
        assert returncode is not None
        return subprocess.CompletedProcess(cmd, returncode, text(out_r), text(err_r))


if __name__ == "__main__":
    main()
