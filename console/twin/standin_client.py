"""The twin's stand-in commands (`systemctl`, `nvidia-smi`, ...) as thin clients of one warm server.

Each stand-in used to be a new Python importing pydantic and the twin's modules: 0.14-0.25 s of CPU a
call, ~95 CPU-s in one run of the test suite. The twin now keeps one process with those modules imported
(`console.twin.standins`); a stand-in script runs this file with `python -I -S` (stdlib only, ~10 ms),
hands the server its stdin, stdout and stderr (SCM_RIGHTS), then its argv, environment, working directory and
umask, and exits as the command did: with its exit status, or killed by the same signal. The signals a
session sends (SIGHUP when the connection goes, SIGINT, SIGTERM, ...) are passed on to the command; if
this client is killed outright, the server sees the connection close and kills the command.

Where no server answers (not started, stopped, or another network namespace, whose abstract sockets are
its own), the client runs the command itself: `python -m MODULE ARGS`, as before.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import zlib

# Passed on to the command. SIGKILL and SIGSTOP cannot be caught: a killed client closes the connection
# and the server kills the command.
RELAYED = (
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGTERM,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGWINCH,
)


PREFIX = "\0k26-twin-standins-"
MAX_NAME = 107  # sun_path's 108 bytes, less nothing: an abstract name needs no terminating NUL


def socket_name(root: str) -> str:
    """The server's abstract unix socket: the state directory's path, or its checksum and tail when the
    path is too long (pytest's tmp paths overflow sun_path). No hashlib: it costs the client 6 ms."""
    name = PREFIX + root
    if len(name.encode()) <= MAX_NAME:
        return name
    tail = root.encode()[-(MAX_NAME - len(PREFIX) - 12) :].decode(errors="replace")
    return f"{PREFIX}{zlib.crc32(root.encode()):08x}-{tail}"[:MAX_NAME]


def encode_request(module: str, args: list[str], cwd: str, umask: int, env: dict[bytes, bytes]) -> bytes:
    """Length, then NUL-separated fields (no field of argv or the environment can hold a NUL)."""
    fields = [module.encode(), os.fsencode(cwd), str(umask).encode(), str(len(args)).encode()]
    fields += [os.fsencode(a) for a in args]
    fields += [k + b"=" + v for k, v in env.items()]
    body = b"\0".join(fields)
    return len(body).to_bytes(8, "little") + body


def _run_here(module: str, args: list[str]) -> None:
    # PYTHONPATH and K26_TWIN_ROOT are in the environment the stand-in script exported.
    os.execv(sys.executable, [sys.executable, "-m", module, *args])


def _read_line(sock: socket.socket, buf: bytearray) -> bytes | None:
    while b"\n" not in buf:
        chunk = sock.recv(256)  # a relayed signal's handler runs; recv resumes (PEP 475)
        if not chunk:
            return None
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write("usage: standin_client.py MODULE [ARGS...]\n")
        return 2
    module, args = argv[0], argv[1:]
    root = os.environ.get("K26_TWIN_ROOT", "")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(socket_name(root))
    except OSError:
        sock.close()
        _run_here(module, args)
    umask = os.umask(0o022)
    os.umask(umask)
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = "/"
    request = encode_request(module, args, cwd, umask, dict(os.environb))

    def relay(signum: int, _frame: object) -> None:
        with contextlib.suppress(OSError):
            sock.sendall(f"sig {signum}\n".encode())

    try:
        socket.send_fds(sock, [b"F"], [0, 1, 2])
        sock.sendall(request)
    except OSError:
        # The server went away before it took the command: nothing has run yet.
        sock.close()
        _run_here(module, args)
    # After the request: a relayed signal is a line of its own on the same connection.
    for sig in RELAYED:
        signal.signal(sig, relay)
    buf = bytearray()
    line = _read_line(sock, buf)
    if line is None:
        sys.stderr.write(f"{module}: the twin's stand-in server went away\n")
        return 1
    kind, _, value = line.decode().partition(" ")
    if kind == "signal":
        signum = int(value)
        for sig in RELAYED:
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return 128 + signum
    return int(value) if kind == "exit" else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
