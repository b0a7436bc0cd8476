"""A command run to its end with its own wall time and peak memory (the bounded-read tests and bench).

`os.wait4` gives the child's own rusage (its peak RSS, `ru_maxrss`, in KiB on Linux), where
`resource.getrusage(RUSAGE_CHILDREN)` would give the largest of every child this process ever waited for.
"""

from __future__ import annotations

import os
import subprocess
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
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env) if env is not None else None,
        cwd=cwd,
    )
    out: list[bytes] = []
    err: list[bytes] = []
    readers = [
        threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True),  # type: ignore[union-attr]
        threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True),  # type: ignore[union-attr]
    ]
    for t in readers:
        t.start()
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        killer.cancel()
    seconds = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in readers:
        t.join(10)
    return Measured(
        returncode=proc.returncode,
        stdout=b"".join(out).decode("utf-8", "replace"),
        stderr=b"".join(err).decode("utf-8", "replace"),
        seconds=seconds,
        peak_rss=usage.ru_maxrss * 1024,
    )
