"""The host-side rollback timer of a commit-confirmed apply: arm, read, disarm (see console.core.confirm).

The timer is `systemd-run` on the host (through `sudo -n` where the host says so), run as the user that
restarts the service; its record and its script live in the host's state directory, next to the lock and
the audit trail (console.sources.hoststate owns that directory; a console watching the host reads the
record with the lock and the heartbeats).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
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

if TYPE_CHECKING:
    from console.sources.service import ServiceController


class RollbackTimerError(Exception):
    """The timer cannot be armed; one sentence."""


async def read_pending(state: HostStateDir, unit: str, *, sudo: bool = False) -> PendingRollback | None:
    """The armed rollback of `unit` on the host of `state`, if it has a record of one; `active` says
    whether its timer still waits (read with `systemctl is-active`)."""
    record = (await state.view()).pending_rollback
    if record is None:
        return None
    argv = ["systemctl", "is-active", f"{rollback_unit(unit)}.timer"]
    res = await state.transport.run(["sudo", "-n", *argv] if sudo else argv, timeout=state.timeout)
    record.active = res.stdout.strip() in ("active", "activating")
    return record


class HostRollback:
    def __init__(self, controller: ServiceController, state: HostStateDir | None = None) -> None:
        self.ctl = controller
        self.state = state or HostStateDir(controller.transport, controller.host)
        self.name = rollback_unit(controller.unit)
        self.timer = f"{self.name}.timer"

    async def timer_waiting(self) -> bool:
        res = await self.ctl._run(["systemctl", "is-active", self.timer], privileged=True)
        return res.stdout.strip() in ("active", "activating")

    async def pending(self) -> PendingRollback | None:
        return await read_pending(self.state, self.ctl.unit, sudo=self.ctl.host.sudo)

    async def arm(
        self, within_s: float, *, armed_by: str, profile: str | None, op_id: str | None, audit: AuditEntry
    ) -> PendingRollback:
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
        )
        try:
            state_dir = await self.state.absolute_path()
            script = await self.state.put_file(
                f"{self.name}.sh",
                rollback_script(
                    dropin_dir=self.ctl.dropin_dir,
                    dropin_name=DROPIN_NAME,
                    unit=self.ctl.unit,
                    state_dir=state_dir,
                    audit_line=rollback_audit_line(audit),
                ),
                mode="700",
            )
        except HostStateError as exc:
            raise RollbackTimerError(f"the host-side rollback's script could not be written: {exc}") from None
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
            raise RollbackTimerError(
                f"the host-side rollback could not be armed on {self.ctl.host.name} "
                f"({res.first_error_line().rstrip('.')})"
            )
        try:
            await self.state.put_file(PENDING_FILE, record.model_dump_json(), mode="644")
        except HostStateError as exc:
            await self.disarm()
            raise RollbackTimerError(f"the host-side rollback's record could not be written: {exc}") from None
        return record

    async def disarm(self) -> bool:
        """Stop the timer and remove the record and the script; True when the timer was still waiting."""
        was = await self.timer_waiting()
        await self.ctl._run(["systemctl", "stop", self.timer], privileged=True)
        for name in (PENDING_FILE, f"{self.name}.sh"):
            await self.state.remove_file(name)
        return was
