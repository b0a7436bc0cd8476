"""Send one native journal entry, as `logger --journald=FILE` does (a sealed memfd passed to journald's
socket), then stay alive until journald has stored it.

`logger` exits as soon as it has sent: journald reads the sender's unit from /proc/PID/cgroup when it
takes the datagram, and a sender already gone leaves the entry without `_SYSTEMD_UNIT` (systemd 252), so
`journalctl -u UNIT` never shows it. Run from a unit's ExecStartPre=: `python3 journal_native.py FIELDS`.
"""

from __future__ import annotations

import array
import fcntl
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

SOCKET = "/run/systemd/journal/socket"
WAIT_S = 20.0


def main(fields_file: str) -> int:
    data = Path(fields_file).read_bytes()
    tag = next(line.split(b"=", 1)[1] for line in data.split(b"\n") if line.startswith(b"SYSLOG_IDENTIFIER="))
    fd = os.memfd_create("entry", os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    fcntl.fcntl(
        fd,
        fcntl.F_ADD_SEALS,
        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL,
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendmsg([], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))], 0, SOCKET)
    os.close(fd)
    deadline = time.monotonic() + WAIT_S
    query = ["journalctl", "--no-pager", "-q", "-o", "cat", "-n", "1", f"SYSLOG_IDENTIFIER={tag.decode()}"]
    while time.monotonic() < deadline:
        if subprocess.run(query, capture_output=True).stdout:
            return 0
        time.sleep(0.05)
    print(f"journald did not store the entry within {WAIT_S:g} s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
