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
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from console.core.hosttime import Count, HostTime, Seconds

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
    deadline: HostTime
    armed_at: HostTime
    armed_by: str
    profile: str | None = None
    op_id: str | None = None
    confirm_within_s: Seconds
    target_context: Count | None = None
    """What the applied boot must hold to be confirmed (the profile's target when it was applied): a
    later `confirm` reads it here, never from a file the record names."""
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


class JsonLine(Protocol):
    """An audit entry, as far as the host's rollback needs it (console.core.audit imports this module's
    record through core.pairing, so the entry's type is not imported here)."""

    def to_jsonl(self) -> str: ...


def rollback_audit_line(entry: JsonLine) -> str:
    """The audit line the host writes when it rolls back, its time left as `TS_PLACEHOLDER`."""
    data = json.loads(entry.to_jsonl())
    data["ts"] = TS_PLACEHOLDER
    return json.dumps(data, ensure_ascii=True, separators=(",", ":"))


# Run by the transient service, as root, when the deadline passes. The console writes it, with its values,
# to a file in the host's state directory and the timer runs `/bin/sh FILE`: systemd 252 writes a
# transient unit's ExecStart= with `;` escaped as `\;` and reads it back with the backslash after a
# daemon-reload (which the apply itself runs), so an inline script broke in a real manager.
#
# It is armed BEFORE the console writes its new drop-in, with the drop-in in force at that moment (its
# text, or "there was none") inside it: never a new drop-in without its timer, and a timer that fires
# before the write finds the drop-in unchanged and restarts nothing.
#
# The record is the token the console's `confirm` and this script race for: whoever renames
# `pending-rollback.json` first has settled the change, the other does nothing (and `confirm` reports
# what the host did). A record of another apply (another op_id) is put back untouched.
#
# Once the drop-in is back, the lock of the console that armed it (its lock_id) is released, with its
# heartbeat, so the host is free for the next change without anyone breaking a lock by hand.
_ROLLBACK_BODY = r"""
record=$state/pending-rollback.json
claimed=$state/.pending-rollback.fired.$$
mv -f -- "$record" "$claimed" 2>/dev/null || exit 0
if ! grep -qF "\"op_id\":\"$op\"" "$claimed"
then
  ln -- "$claimed" "$record" 2>/dev/null
  rm -f -- "$claimed"
  exit 0
fi
cur=$dir/$name
changed=1
if [ "$had" = 1 ]
then
  if [ -f "$cur" ] && [ "$(cat -- "$cur"; echo x)" = "${prev}x" ]; then changed=0; fi
else
  [ -e "$cur" ] || changed=0
fi
if [ "$changed" = 1 ]
then
  if [ "$had" = 1 ]
  then
    mkdir -p -- "$dir"
    t=$dir/.$name.rollback.$$
    printf '%s' "$prev" > "$t" && chmod 0644 "$t" && mv -f -- "$t" "$cur"
    # The apply kept this same text as .previous: the rollback consumes it, as the console's does.
    if [ -f "$cur.previous" ] && [ "$(cat -- "$cur.previous"; echo x)" = "${prev}x" ]; then rm -f -- "$cur.previous"; fi
  else
    rm -f -- "$cur" "$cur.previous"
    rmdir -- "$dir" 2>/dev/null
  fi
  systemctl daemon-reload
  line=$line_changed
else
  line=$line_same
fi
a=$state/audit.jsonl
append() {
  now=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)
  l=$(printf '%s' "$1" | sed "s/@K26_ROLLBACK_TS@/$now/")
  if [ -s "$a" ] && [ -n "$(tail -c 1 "$a")" ]; then echo >> "$a"; fi
  printf '%s\n' "$l" >> "$a"
}
append "$line"
if [ -n "$lock_id" ]
then
  # The lock operations' turn (console.sources.hoststate_scripts): flock on the state directory itself.
  if command -v flock >/dev/null 2>&1 && { command exec 8<"$state"; } 2>/dev/null; then flock -w 10 8; fi
  m=$state/.lock.rollback.$$
  if grep -qF "\"lock_id\":\"$lock_id\"" "$state/lock" 2>/dev/null && mv -- "$state/lock" "$m" 2>/dev/null
  then
    if grep -qF "\"lock_id\":\"$lock_id\"" "$m"
    then
      rm -f -- "$m" "$state/presence/$holder.json"
      append "$line_lock"
    else
      ln -- "$m" "$state/lock" 2>/dev/null
      rm -f -- "$m"
    fi
  fi
  exec 8<&-
fi
rm -f -- "$claimed" "$0"
if [ "$changed" = 1 ]; then systemctl restart --no-block -- "$unit"; fi
exit 0
"""


def rollback_script(
    *,
    dropin_dir: str,
    dropin_name: str,
    unit: str,
    state_dir: str,
    op_id: str,
    previous: str | None,
    line_changed: str,
    line_same: str,
    lock_id: str | None = None,
    holder: str | None = None,
    line_lock: str = "",
) -> str:
    """The whole script, its values quoted for sh. `previous` is the drop-in in force when it is armed
    (None: there was none); `line_changed` and `line_same` the audit lines for a rollback that put it
    back and for one that found it already there (the console never wrote its own); `line_lock` the line
    for releasing the lock `lock_id` of console `holder`."""
    values = {
        "dir": dropin_dir,
        "name": dropin_name,
        "unit": unit,
        "state": state_dir,
        "op": op_id,
        "had": "0" if previous is None else "1",
        "prev": previous or "",
        "line_changed": line_changed,
        "line_same": line_same,
        "lock_id": lock_id or "",
        "holder": holder or "",
        "line_lock": line_lock,
    }
    head = "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())
    return "# k26-console: the host-side rollback of a commit-confirmed apply.\n" + head + _ROLLBACK_BODY
