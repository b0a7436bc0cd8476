"""What every remote command shares: its argv quoted for the remote shell, its result, and the errors
of the transport that runs it (sources/transport)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from console.core.text import split_lines

__all__ = ["CommandResult", "SetupError", "TransportError", "quote"]


class TransportError(Exception):
    """The host cannot be reached or a command could not run; `str()` is one sentence."""


class SetupError(TransportError):
    """The host's settings cannot work (a missing key file): retrying would not help."""


class CommandResult(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True, extra="forbid")

    argv: tuple[str, ...]
    exit_status: int | None
    """None when the command died of a signal or the channel closed before it said."""
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    def first_error_line(self) -> str:
        for line in split_lines(self.stderr + "\n" + self.stdout):
            if line.strip():
                return line.strip()
        return f"exit status {self.exit_status}"


def quote(argv: Sequence[str]) -> str:
    if not argv:
        raise ValueError("a remote command needs at least a program name")
    return shlex.join(str(a) for a in argv)
