"""The processes a test started, found by what only they carry: the test's own twin state directory (unique
per test, in `K26_TWIN_ROOT` of every twin session and in the command lines of the twin's processes).
Never by a program's name machine-wide: another console or test on the machine must not be counted."""

from __future__ import annotations

import os
from pathlib import Path


def _read(pid: str) -> tuple[str, str] | None:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return None
    return cmdline, environ


def processes_of(root: Path | str, *, cmdline_has: str = "") -> list[str]:
    """`PID: command line` of each live process whose command line or environment names `root` (and whose
    command line contains `cmdline_has`)."""
    root = str(root)
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        got = _read(pid)
        if got is None:
            continue
        cmdline, environ = got
        if (root in cmdline or root in environ) and cmdline_has in cmdline:
            found.append(f"{pid}: {cmdline[:200]}")
    return found
