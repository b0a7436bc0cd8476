"""Alerts' settings (the `[alerts]` table of the console's config file) and the hook that tells a pager.

The config file is the hosts file: `hosts.toml` in the platform config dir
(`platformdirs.user_config_dir("k26-console")`, e.g. `~/.config/k26-console/hosts.toml` on Linux), or the
file `--hosts FILE` names. Its `[alerts]` table:

    [alerts]
    rules = ["service_not_active", "error", "ttft_p99_s > 5", "queue > 16"]  # replaces the default set
    bell = true                         # ring the terminal bell once per firing (the console)
    command = ["/usr/local/bin/page", "--team", "inference"]  # run locally on each firing and clearing
    command_timeout_s = 10

A rule is a string (`metric op number`, `error`, `service_not_active`; `console/core/alerts.py` has the
names) or a table `{ when = "queue > 16", severity = "critical" }`. Without `rules` the default set
(`core/alerts.DEFAULT_RULES`) applies; `rules = []` turns alerts off.

The hook's argv runs on this machine, never through a shell, with the alert as one JSON document on its
stdin (`core/alerts.Alert`: host, rule, severity, state fired|cleared, value, message, ts). It has
`command_timeout_s` to finish (then it is killed); its output is kept up to `MAX_OUTPUT` bytes for the
report. Every problem with the table is an `AlertConfigError` carrying one sentence.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from console.core.alerts import Alert
from console.core.text import terminal_safe
from console.sources.alert_config import (
    DEFAULT_TIMEOUT_S,
    AlertConfig,
    AlertConfigError,
    default_alert_config,
    parse_alert_config,
)

__all__ = [
    "AlertConfig",
    "AlertConfigError",
    "HookResult",
    "HookRunner",
    "default_alert_config",
    "load_alert_config",
    "parse_alert_config",
    "run_hook",
]

MAX_OUTPUT = 4096
"""Bytes of the hook's output (stdout and stderr together) kept for the report."""


def load_alert_config(path: Path | str | None = None) -> AlertConfig:
    """The `[alerts]` table of the hosts file (`--hosts FILE`, else the default one), as `load_hosts` reads
    it with the rest of the file: a missing default file, or a file without the table, is the default set."""
    from console.sources.hosts import HostsError, load_hosts

    try:
        return load_hosts(path).alerts
    except HostsError as exc:
        raise AlertConfigError(str(exc)) from None


# ---------------------------------------------------------------------------------------------- hook


class HookResult(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True, extra="forbid")

    ok: bool
    returncode: int | None = None
    output: str = ""
    """What the hook printed (stdout and stderr), at most `MAX_OUTPUT` bytes, terminal-safe."""
    truncated: bool = False
    problem: str | None = None
    """Why it failed, in one sentence (not found, timed out, exit status)."""


async def _drain(stream: asyncio.StreamReader, limit: int) -> tuple[bytes, bool]:
    """Everything the stream says until EOF, keeping the first `limit` bytes."""
    kept = bytearray()
    truncated = False
    while chunk := await stream.read(65536):
        room = limit - len(kept)
        if room > 0:
            kept += chunk[:room]
        if len(chunk) > room:
            truncated = True
    return bytes(kept), truncated


async def run_hook(
    argv: Sequence[str], alert: Alert, *, timeout_s: float = DEFAULT_TIMEOUT_S, limit: int = MAX_OUTPUT
) -> HookResult:
    """Run `argv` here (no shell) with the alert as JSON on stdin; kill it after `timeout_s`."""
    name = terminal_safe(argv[0])
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        reason = exc.strerror or str(exc)
        return HookResult(
            ok=False, problem=f"the alert command {name} could not start: {terminal_safe(reason)}."
        )
    assert proc.stdin is not None and proc.stdout is not None
    payload = alert.model_dump_json().encode() + b"\n"
    try:
        async with asyncio.timeout(timeout_s):

            async def feed() -> None:
                assert proc.stdin is not None
                # A hook that does not read its stdin is not an error.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    proc.stdin.write(payload)
                    await proc.stdin.drain()
                    proc.stdin.close()
                    await proc.stdin.wait_closed()

            _, (out, truncated), rc = await asyncio.gather(feed(), _drain(proc.stdout, limit), proc.wait())
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return HookResult(
            ok=False,
            returncode=proc.returncode,
            problem=f"the alert command {name} did not finish within {timeout_s:g}s and was killed.",
        )
    output = terminal_safe(out.decode("utf-8", "replace"), keep_newlines=True)
    if rc != 0:
        last = output.strip().split("\n")[-1][:200] if output.strip() else ""
        said = f": {last}" if last else ""
        return HookResult(
            ok=False,
            returncode=rc,
            output=output,
            truncated=truncated,
            problem=f"the alert command {name} exited with status {rc}{said.rstrip('.')}.",
        )
    return HookResult(ok=True, returncode=rc, output=output, truncated=truncated)


class HookRunner:
    """Runs the configured hook for each transition, one at a time and in order, and says what went
    wrong once: a failure is reported when it differs from the last one reported, and reporting starts
    again after a success."""

    def __init__(self, config: AlertConfig) -> None:
        self.config = config
        self._lock = asyncio.Lock()
        self._reported: str | None = None

    async def deliver(self, alert: Alert) -> str | None:
        """Run the hook for `alert`; a sentence to show when it failed and has not been said yet."""
        if self.config.command is None:
            return None
        async with self._lock:
            result = await run_hook(self.config.command, alert, timeout_s=self.config.command_timeout_s)
        if result.ok:
            self._reported = None
            return None
        if result.problem == self._reported:
            return None
        self._reported = result.problem
        return result.problem
