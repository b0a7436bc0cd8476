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
        """The line that says what went wrong: stderr's first line that is not a warning (stdout's when
        stderr is empty). systemctl warns before its error ("Warning: The unit file, source configuration
        file or drop-ins of X changed on disk...", and `cat` repeats it as a `# Warning:` comment): a
        sentence quoting the warning would hide the error. A stream of warnings only gives its first."""
        for stream in (self.stderr, self.stdout):
            lines = [line.strip() for line in split_lines(stream) if line.strip()]
            for line in lines:
                if not line.removeprefix("#").lstrip().startswith("Warning:"):
                    return line
            if lines:
                return lines[0]
        return f"exit status {self.exit_status}"


def quote(argv: Sequence[str]) -> str:
    if not argv:
        raise ValueError("a remote command needs at least a program name")
    return shlex.join(str(a) for a in argv)
