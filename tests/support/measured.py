"""A command run to its end with its own wall time and peak memory (the bounded-read tests and bench).

The peak RSS is the command's own `ru_maxrss` (KiB on Linux), read by a small launcher that forks it and
waits for it with `os.wait4`. Not by this process: Linux carries a process's high-water mark across
`exec`, and a child forked from a test worker of 360 MB reported 360 MB for a command that used 90.
`resource.getrusage(RUSAGE_CHILDREN)` would give the largest of every child ever waited for.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Measured:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    peak_rss: int
    """Bytes."""


def run_measured(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
) -> Measured:
    """Run `argv` (stdin closed) and wait for it; killed past `timeout` (then its figures say so)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _LAUNCHER, *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        start_new_session=True,  # a command past its timeout is killed with its launcher
    )
    out: list[bytes] = []
    err: list[bytes] = []
    readers = [
        threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True),  # type: ignore[union-attr]
        threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True),  # type: ignore[union-attr]
    ]
    for t in readers:
        t.start()
    killer = threading.Timer(timeout, lambda: os.killpg(proc.pid, 9))
    killer.start()
    try:
        proc.wait()
    finally:
        killer.cancel()
    seconds = time.monotonic() - started
    for t in readers:
        t.join(10)
    stderr = b"".join(err).decode("utf-8", "replace")
    # The launcher's last stderr line: the command's exit status and peak RSS.
    head, _, last = stderr.rstrip("\n").rpartition("\n")
    fields = last.split()
    if len(fields) != 3 or fields[0] != _MARK:
        raise RuntimeError(f"the launcher did not report (killed after {timeout:g} s?): {stderr[-500:]}")
    return Measured(
        returncode=int(fields[1]),
        stdout=b"".join(out).decode("utf-8", "replace"),
        stderr=head.removesuffix("\n") + "\n" if head.strip() else "",  # less the launcher's own newline
        seconds=seconds,
        peak_rss=int(fields[2]) * 1024,
    )


_MARK = "k26-measured:"
_LAUNCHER = f"""
import os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
sys.stderr.write("\\n{_MARK} %d %d\\n" % (os.waitstatus_to_exitcode(status), usage.ru_maxrss))
"""
