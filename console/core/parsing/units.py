"""systemd's own lines about the unit (`systemd[1]: sglang.service: Failed with result 'exit-code'.`)."""

from __future__ import annotations

import re
from typing import Any

UNIT_NAME = re.compile(r"[\w@:.\\-]+\.(?:service|scope|socket|target|timer|mount|slice|path)", re.ASCII)
_RESULT = re.compile(r"Failed with result '([^']+)'", re.ASCII)
_EXITED = re.compile(r"Main process exited, code=(\w+), status=(\d+)", re.ASCII)
_RESTART = re.compile(r"Scheduled restart job, restart counter is at (\d+)", re.ASCII)
_EXIT_RESULT = {"exited": "exit-code", "killed": "signal", "dumped": "core-dump"}
_JOB_WORDS = (
    ("Starting ", "starting"),
    ("Started ", "started"),
    ("Stopping ", "stopping"),
    ("Stopped ", "stopped"),
    ("Failed to start ", "failed"),
)


def unit_fields(msg: str, meta: dict[str, Any]) -> dict[str, Any] | None:
    """A `unit` event's fields (with `systemd_unit` when the line names it and the journal did not);
    None for the lines that carry no state (`Consumed …`)."""
    m = UNIT_NAME.match(msg)
    if m is not None and msg.startswith(": ", m.end()):
        unit = {} if "systemd_unit" in meta else {"systemd_unit": m.group(0)}
        rest = msg[m.end() + 2 :]
        if rest.startswith("Main process exited"):
            e = _EXITED.match(rest)
            if e is None:
                return None
            code, status = e.group(1), int(e.group(2))
            if code == "exited" and status == 0:
                return {**unit, "kind": "unit", "state": "stopped", "message": msg}
            result = _EXIT_RESULT.get(code, code)
            return {**unit, "kind": "unit", "state": "failed", "result": result, "message": msg}
        r = _RESULT.match(rest)
        if r is not None:
            return {**unit, "kind": "unit", "state": "failed", "result": r.group(1), "message": msg}
        if rest.startswith(("Deactivated successfully", "Succeeded")):
            return {**unit, "kind": "unit", "state": "stopped", "result": "success", "message": msg}
        s = _RESTART.match(rest)
        if s is not None:
            counter = int(s.group(1))
            return {**unit, "kind": "unit", "state": "starting", "message": msg, "restart_counter": counter}
        return None
    for word, state in _JOB_WORDS:
        if msg.startswith(word):
            unit = {}
            if "systemd_unit" not in meta:
                name = UNIT_NAME.match(msg, len(word))
                if name is not None:
                    unit["systemd_unit"] = name.group(0)
            return {**unit, "kind": "unit", "state": state, "message": msg}
    return None
