"""The host-side rollback timer of a commit-confirmed apply: arm, read, disarm (see console.core.confirm).

The timer is `systemd-run` on the host (through `sudo -n` where the host says so), run as the user that
restarts the service; its record and its script live in the host's state directory, next to the lock and
the audit trail (console.sources.hoststate owns that directory; a console watching the host reads the
record with the lock and the heartbeats).

It is armed before the new drop-in is written, holding the drop-in in force then: a console killed at any
point after arming leaves a host that converges by itself. The record is the token that `disarm` and the
timer's script race for (one rename on the host), so a confirmation and a firing timer cannot both win.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING

from console.core.audit import AuditEntry
from console.core.confirm import (
    PENDING_FILE,
    PendingRollback,
    rollback_audit_line,
    rollback_script,
    rollback_unit,
)
from console.core.systemd import DROPIN_NAME
from console.sources.hoststate import HostStateDir, HostStateError
from console.sources.transport import TransportError

if TYPE_CHECKING:
    from console.sources.unit_commands import UnitCommands


class RollbackTimerError(Exception):
    """The timer cannot be armed; one sentence."""


class Settled(StrEnum):
    """Who settled an armed rollback, as the host's record says."""

    DISARMED = "disarmed"
    """This console took the record first: the timer is stopped, the change stands."""
    FIRED = "fired"
    """The timer's script took it first: the host rolls back (or has rolled back) by itself."""
    NONE = "none"
    """There was no record of this apply's rollback to take."""


_DROPIN_LIMIT = 64 * 1024
"""The most of a drop-in the rollback carries: the console's own are a few hundred bytes."""

# $1 the drop-in directory, $2 its file name: "present" and the text, or "absent".
_READ_DROPIN = r"""
f=$1/$2
if [ -f "$f" ]; then echo present; cat -- "$f"; else echo absent; fi
"""

# $1 the state directory, $2 the op_id the record must hold. Prints `claimed`, `fired` or `none`.
# The claimed record is kept under the op_id's name until the timer is stopped, so that a retried
# disarm (a dropped connection) still reads as this console's.
_CLAIM = r"""
set -u
d=$1; op=$2
case $d in "~") d=$HOME ;; "~/"*) d=$HOME/${d#"~/"} ;; esac
printf 'now %s\n' "$(date +%s.%N 2>/dev/null || date +%s)"
c=$d/.pending-rollback.disarmed.$op
if [ -f "$c" ]; then echo claimed; exit 0; fi
if mv -f -- "$d/pending-rollback.json" "$c" 2>/dev/null; then
  if grep -qF "\"op_id\":\"$op\"" "$c"; then echo claimed; exit 0; fi
  ln -- "$c" "$d/pending-rollback.json" 2>/dev/null; rm -f -- "$c"; echo none; exit 0
fi
for f in "$d"/.pending-rollback.fired.*; do [ -e "$f" ] && { echo fired; exit 0; }; done
echo none
"""

# $1 the state directory, $2 the op_id, $3 the script's name: the claimed record and the script go.
_FORGET = r"""
set -u
d=$1
case $d in "~") d=$HOME ;; "~/"*) d=$HOME/${d#"~/"} ;; esac
printf 'now %s\n' "$(date +%s.%N 2>/dev/null || date +%s)"
rm -f -- "$d/.pending-rollback.disarmed.$2" "$d/$3"
"""


async def read_pending(state: HostStateDir, unit: str, *, sudo: bool = False) -> PendingRollback | None:
    """The armed rollback of `unit` on the host of `state`, if it has a record of one; `active` says
    whether its timer still waits (read with `systemctl is-active`)."""
    record = await state.board.pending_rollback()
    if record is None:
        return None
    argv = ["systemctl", "is-active", f"{rollback_unit(unit)}.timer"]
    res = await state.transport.run(["sudo", "-n", *argv] if sudo else argv, timeout=state.runner.timeout)
    record.active = res.stdout.strip() in ("active", "activating")
    return record


class HostRollback:
    def __init__(self, controller: UnitCommands, state: HostStateDir | None = None) -> None:
        self.ctl = controller
        self.state = state or HostStateDir(controller.transport, controller.host)
        self.name = rollback_unit(controller.unit)
        self.timer = f"{self.name}.timer"
        self.script = f"{self.name}.sh"

    async def timer_waiting(self) -> bool:
        res = await self.ctl._run(["systemctl", "is-active", self.timer], privileged=True)
        return res.stdout.strip() in ("active", "activating")

    async def pending(self) -> PendingRollback | None:
        return await read_pending(self.state, self.ctl.unit, sudo=self.ctl.host.sudo)

    async def dropin_in_force(self) -> str | None:
        """The text of the console's drop-in on the host now, None when there is none."""
        res = await self.ctl._run(
            ["sh", "-c", _READ_DROPIN, "sh", self.ctl.dropin_dir, DROPIN_NAME], privileged=True
        )
        head, _, text = res.stdout.partition("\n")
        if not res.ok or head.strip() not in ("present", "absent"):
            raise RollbackTimerError(
                f"the drop-in in force on {self.ctl.host.name} could not be read "
                f"({res.first_error_line().rstrip('.') or 'no answer'}), so no rollback to it can be armed"
            )
        if head.strip() == "absent":
            return None
        if len(text.encode()) > _DROPIN_LIMIT or "\ufffd" in text or "\x00" in text:
            raise RollbackTimerError(
                f"the drop-in in force on {self.ctl.host.name} ({self.ctl.dropin_path}) is not a text the "
                "console wrote (binary or over 64 KiB), so no rollback to it can be armed"
            )
        return text

    async def arm(
        self,
        within_s: float,
        *,
        armed_by: str,
        profile: str | None,
        op_id: str,
        target_context: int | None,
        lock_id: str | None,
        holder: str | None,
        audit: AuditEntry,
    ) -> PendingRollback:
        """Arm the rollback to the drop-in in force now; the record is written before the timer, so a
        console killed in between leaves a record whose timer is gone (readers say so), never a timer
        with no record to fire on."""
        previous = await self.dropin_in_force()
        now = datetime.now(UTC).replace(microsecond=0)
        record = PendingRollback(
            unit=self.ctl.unit,
            timer=self.timer,
            deadline=now + timedelta(seconds=within_s),
            armed_at=now,
            armed_by=armed_by,
            profile=profile,
            op_id=op_id,
            confirm_within_s=within_s,
            target_context=target_context,
        )
        same = audit.model_copy(
            update={
                "outcome": "ok",
                "summary": (
                    f"the host's rollback timer fired before {profile or 'the change'} reached the unit "
                    f"(applied by {armed_by}, not confirmed within {within_s:g} s): the drop-in in force was "
                    "never changed, so nothing was restarted"
                ),
            }
        )
        released = AuditEntry(
            ts=audit.ts,
            user="host",
            host=audit.host,
            action="lock_break",
            profile=profile,
            outcome="ok",
            summary=(
                f"the host's rollback released the lock of {armed_by} (apply {profile}), whose console did "
                "not confirm its change"
            ),
            op_id=op_id,
            lock_id=lock_id,
            phase="commit-confirmed",
        )
        try:
            state_dir = await self.state.files.absolute_path()
            script = await self.state.files.put(
                self.script,
                rollback_script(
                    dropin_dir=self.ctl.dropin_dir,
                    dropin_name=DROPIN_NAME,
                    unit=self.ctl.unit,
                    state_dir=state_dir,
                    op_id=op_id,
                    previous=previous,
                    line_changed=rollback_audit_line(audit),
                    line_same=rollback_audit_line(same),
                    lock_id=lock_id,
                    holder=holder,
                    line_lock=rollback_audit_line(released),
                ),
                mode="700",
            )
            await self.state.files.put(PENDING_FILE, record.model_dump_json(), mode="644")
        except (HostStateError, TransportError) as exc:
            raise RollbackTimerError(f"the host-side rollback could not be prepared: {exc}") from None
        description = f"k26-console commit-confirmed rollback of {self.ctl.unit} ({armed_by}" + (
            f", profile {profile})" if profile else ")"
        )
        res = await self.ctl._run(
            [
                "systemd-run",
                f"--unit={self.name}",
                f"--on-active={max(1, round(within_s))}s",
                "--timer-property=AccuracySec=1s",
                f"--description={description}",
                "--quiet",
                "--",
                "/bin/sh",
                script,
            ],
            privileged=True,
        )
        if not res.ok:
            await self._forget(op_id, claim=True)
            raise RollbackTimerError(
                f"the host-side rollback could not be armed on {self.ctl.host.name} "
                f"({res.first_error_line().rstrip('.')})"
            )
        return record

    async def disarm(self, op_id: str | None) -> Settled:
        """Settle the armed rollback of apply `op_id` on the console's side: take its record (then stop
        the timer and remove its script), or learn that the host's timer took it first."""
        if op_id is None:
            return Settled.NONE
        _, lines = await self.state.runner.run(_CLAIM, op_id, what="settle the host-side rollback")
        said = next((ln.strip() for ln in lines if ln.strip() in ("claimed", "fired", "none")), "none")
        if said != "claimed":
            return Settled(said if said == "fired" else "none")
        await self.ctl._run(["systemctl", "stop", self.timer], privileged=True)
        await self._forget(op_id, claim=False)
        return Settled.DISARMED

    async def clear_stale(self) -> None:
        """A record whose timer is gone (the host restarted, or the record outlived a killed arm): gone."""
        await self.state.files.remove(PENDING_FILE)
        await self.state.files.remove(self.script)

    async def _forget(self, op_id: str, *, claim: bool) -> None:
        if claim:
            await self.state.runner.run(_CLAIM, op_id, what="settle the host-side rollback")
        await self.state.runner.run(_FORGET, op_id, self.script, what="remove the host-side rollback")
