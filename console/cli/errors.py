"""Exit codes and the errors that carry them.

0 ok, 1 the check said no, 2 bad input or usage, 3 the host is busy (another console holds its lock).
A command raises one of these with ONE clear sentence; `main` prints it to stderr and exits with the code.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_BUSY = 3


class CliError(Exception):
    exit_code = EXIT_USAGE

    def __init__(self, sentence: str) -> None:
        super().__init__(sentence)
        self.sentence = sentence


class UsageError(CliError):
    """Bad input: a missing file, a malformed option, an unknown host or model."""

    exit_code = EXIT_USAGE


class CheckFailed(CliError):
    """The command ran and its check said no (e.g. `verify` found the pool too small)."""

    exit_code = EXIT_CHECK_FAILED


class HostBusy(CliError):
    """Another console holds the host's lock."""

    exit_code = EXIT_BUSY
