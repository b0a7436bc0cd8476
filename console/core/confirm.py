"""Commit-confirmed apply: a rollback armed on the host before the restart, disarmed once the boot verifies.

If the console that applied a profile dies, loses its connection or its operator's terminal in the middle
of a restart, nothing on the jump host can verify the new boot or roll back a failed one. So, as network
gear does ("commit confirmed"), `apply` arms a transient systemd timer on the host itself
(`systemd-run --on-active=S --unit=k26-rollback-UNIT`) right after writing the new drop-in. Unless the
console disarms it (the boot verified), it fires: it puts the previous drop-in back (or removes ours when
there was none), reloads systemd, appends an audit line saying the host rolled itself back and why, and
restarts the service. The host converges to its last good configuration by itself.

A record of the armed rollback (`pending-rollback.json` in the host's state directory, next to the lock
and the audit trail) lets a console that comes back, or a pairing partner, see it and its deadline.
This module holds the names, the record, the default deadline and the script; the commands that run them
are in `console.sources.service`.
"""

from __future__ import annotations

import json
import shlex
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:  # core.pairing carries a PendingRollback in its view: imported there, not here
    from console.core.audit import AuditEntry

TIMER_PREFIX = "k26-rollback-"
PENDING_FILE = "pending-rollback.json"
TS_PLACEHOLDER = "@K26_ROLLBACK_TS@"
"""Stands for the time the rollback fires in the audit line written at arming (the host's `date` fills it)."""

MIN_CONFIRM_S = 300.0
"""The shortest default deadline: a boot with no history may still load weights for minutes."""
NO_HISTORY_CONFIRM_S = 1800.0
"""The default deadline on a host with no restart history (the default boot timeout)."""


def rollback_unit(unit: str) -> str:
    """`k26-rollback-sglang`: the transient timer's and service's name (`.timer`, `.service`)."""
    return TIMER_PREFIX + unit.removesuffix(".service")


def default_confirm_within(expected_boot_s: float | None) -> float:
    """Twice this host's usual restart (its median phase durations) plus two minutes, never under
    `MIN_CONFIRM_S`; `NO_HISTORY_CONFIRM_S` where the host has no history to go by."""
    if expected_boot_s is None or expected_boot_s <= 0:
        return NO_HISTORY_CONFIRM_S
    return max(MIN_CONFIRM_S, 2.0 * expected_boot_s + 120.0)


class PendingRollback(BaseModel, defer_build=True):
    """An armed host-side rollback: what `verify --json` reports as `pending_rollback`."""

    model_config = ConfigDict(extra="ignore")

    unit: str
    timer: str
    deadline: datetime
    armed_at: datetime
    armed_by: str
    profile: str | None = None
    op_id: str | None = None
    confirm_within_s: float
    active: bool = True
    """False when the record is there but the timer is not (it fired, or the host rebooted)."""

    def seconds_left(self, now: datetime) -> float:
        return (self.deadline - now).total_seconds()

    def describe(self, now: datetime) -> str:
        """One sentence (without its full stop), for the command line and the console alike."""
        left = max(0, round(self.seconds_left(now)))
        what = f"profile {self.profile}" if self.profile else self.unit
        if not self.active:
            return (
                f"a host-side rollback of {what} was armed by {self.armed_by} but its timer is gone (it "
                "fired, or the host restarted): check the unit and the audit trail"
            )
        return (
            f"A host-side rollback of {what} is armed by {self.armed_by}: it fires at "
            f"{self.deadline.astimezone(UTC).strftime('%H:%M:%S')} UTC (in {left} s) unless confirmed"
        )


def rollback_audit_line(entry: AuditEntry) -> str:
    """The audit line the host writes when it rolls back, its time left as `TS_PLACEHOLDER`."""
    data = json.loads(entry.to_jsonl())
    data["ts"] = TS_PLACEHOLDER
    return json.dumps(data, ensure_ascii=True, separators=(",", ":"))


# Run by the transient service, as root, when the deadline passes unconfirmed. The console writes it, with
# its values, to a file in the host's state directory and the timer runs `/bin/sh FILE`: systemd 252
# writes a transient unit's ExecStart= with `;` escaped as `\;` and reads it back with the backslash
# after a daemon-reload (which the apply itself runs), so an inline script broke in a real manager.
# The previous drop-in comes back (or ours goes), systemd reloads, the audit line is appended (after a
# torn last line's newline), the record goes, and the service restarts.
_ROLLBACK_BODY = r"""
if [ -f "$dir/$name.previous" ]
then
  mv -f -- "$dir/$name.previous" "$dir/$name"
else
  rm -f -- "$dir/$name"
  rmdir -- "$dir" 2>/dev/null
fi
systemctl daemon-reload
now=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)
line=$(printf '%s' "$line" | sed "s/@K26_ROLLBACK_TS@/$now/")
a=$state/audit.jsonl
if [ -s "$a" ] && [ -n "$(tail -c 1 "$a")" ]
then
  echo >> "$a"
fi
printf '%s\n' "$line" >> "$a"
rm -f -- "$state/pending-rollback.json" "$0"
systemctl restart --no-block -- "$unit"
"""


def rollback_script(*, dropin_dir: str, dropin_name: str, unit: str, state_dir: str, audit_line: str) -> str:
    """The whole script, its values quoted for sh."""
    values = {"dir": dropin_dir, "name": dropin_name, "unit": unit, "state": state_dir, "line": audit_line}
    head = "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())
    return "# k26-console: the host-side rollback of a commit-confirmed apply.\n" + head + _ROLLBACK_BODY
