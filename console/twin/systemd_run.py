"""`systemd-run` of the simulated systemd, as far as the console uses it: a transient timer.

    systemd-run --unit=NAME --on-active=SECONDS [--description=TEXT] [--timer-property=...] [-p ...]
                [--quiet] [--collect] [--] COMMAND [ARG...]

Anything else is refused in one line. Under a real systemd manager the twin's `systemd-run` is systemd's.
"""

from __future__ import annotations

import re
import sys

from console.twin.layout import TwinLayout
from console.twin.timers import arm

_SPAN = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|sec|m|min|h)?$")
_UNITS = {None: 1.0, "s": 1.0, "sec": 1.0, "ms": 0.001, "m": 60.0, "min": 60.0, "h": 3600.0}


def _seconds(text: str) -> float | None:
    m = _SPAN.match(text.strip())
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def main(argv: list[str]) -> int:
    unit = description = None
    on_active: float | None = None
    quiet = False
    it = iter(argv)
    command: list[str] = []
    for arg in it:
        key, eq, value = arg.partition("=")
        if arg == "--":
            command = list(it)
            break
        if not arg.startswith("-"):
            command = [arg, *it]
            break
        if key in ("--timer-property", "--property", "-p") and not eq:
            next(it, None)
            continue
        if key in ("--timer-property", "--property", "--collect", "--no-block", "--system"):
            continue
        if arg in ("-q", "--quiet"):
            quiet = True
        elif key == "--unit" and eq:
            unit = value
        elif key == "--unit":
            unit = next(it, None)
        elif key == "--description":
            description = value if eq else next(it, None)
        elif key == "--on-active":
            on_active = _seconds(value if eq else next(it, "") or "")
            if on_active is None:
                sys.stderr.write(f"Failed to parse timer value: {value}\n")
                return 1
        else:
            sys.stderr.write(f"systemd-run: this host's systemd-run does not support {key}\n")
            return 1
    if not command:
        sys.stderr.write("Command line to execute required.\n")
        return 1
    if unit is None or on_active is None:
        sys.stderr.write("systemd-run: this host's systemd-run runs timers only (--unit and --on-active)\n")
        return 1
    name = unit.removesuffix(".service").removesuffix(".timer")
    problem = arm(TwinLayout.from_env(), name, on_active, description or "", command)
    if problem:
        sys.stderr.write(problem + "\n")
        return 1
    if not quiet:
        sys.stderr.write(f"Running timer as unit: {name}.timer\nWill run service as unit: {name}.service\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
