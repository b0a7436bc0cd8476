"""The `[alerts]` table of the config file (the hosts file: console/sources/hosts.py reads it, once, with its
other tables) as a model, and its validation: every problem with the table is an `AlertConfigError`
carrying one sentence. The hook that tells a pager is console/sources/alerts.py."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from console.core.alerts import AlertError, Rule, default_rules, parse_rules

DEFAULT_TIMEOUT_S = 10.0
MAX_TIMEOUT_S = 300.0
_KEYS = ("rules", "bell", "command", "command_timeout_s")


class AlertConfigError(ValueError):
    """An `[alerts]` table the console cannot use; `str()` is one sentence for the operator."""


class AlertConfig(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True, extra="forbid")

    rules: tuple[Rule, ...]
    bell: bool = True
    command: tuple[str, ...] | None = None
    command_timeout_s: float = DEFAULT_TIMEOUT_S
    path: Path | None = None
    """The file read, for messages (None: the defaults, no file)."""


def default_alert_config() -> AlertConfig:
    return AlertConfig(rules=default_rules())


def parse_alert_config(table: object, path: Path | None = None) -> AlertConfig:
    """The `[alerts]` table (already read from TOML); a missing table is the defaults."""
    label = f"{path}: [alerts]" if path is not None else "[alerts]"
    if table is None:
        return AlertConfig(rules=default_rules(), path=path)
    if not isinstance(table, dict):
        raise AlertConfigError(f"{label} must be a table, such as [alerts] with rules = [...].")
    unknown = sorted(set(table) - set(_KEYS))
    if unknown:
        raise AlertConfigError(f"{label} has an unknown key {unknown[0]!r} (known: {', '.join(_KEYS)}).")
    rules: tuple[Rule, ...] = default_rules()
    if "rules" in table:
        if not isinstance(table["rules"], list):
            raise AlertConfigError(f'{label} rules must be a list, such as ["queue > 16", "error"].')
        try:
            rules = parse_rules(table["rules"])
        except AlertError as exc:
            raise AlertConfigError(f"{label}: {str(exc).rstrip('.')}.") from None
    bell = table.get("bell", True)
    if not isinstance(bell, bool):
        raise AlertConfigError(f"{label} bell must be true or false, not {bell!r}.")
    command = table.get("command")
    argv: tuple[str, ...] | None = None
    if command is not None:
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(a, str) and a and "\0" not in a for a in command)
        ):
            raise AlertConfigError(
                f"{label} command must be a non-empty list of strings (the argv, run without a shell), "
                'such as ["/usr/local/bin/page", "--team", "ops"].'
            )
        argv = (os.path.expanduser(command[0]), *command[1:])
    timeout = table.get("command_timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= MAX_TIMEOUT_S:
        raise AlertConfigError(
            f"{label} command_timeout_s must be a number of seconds from 0 to {MAX_TIMEOUT_S:g}."
        )
    return AlertConfig(rules=rules, bell=bell, command=argv, command_timeout_s=float(timeout), path=path)
