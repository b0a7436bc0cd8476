"""The host-side rollback timer of a commit-confirmed apply: arm, read, disarm (see console.core.confirm).

Arming runs `systemd-run` on the host (through `sudo -n` where the host says so), as the same user that
restarts the service; reading and disarming are `systemctl is-active/stop` of the timer and the record
`pending-rollback.json` in the host's state directory.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from pydantic import ValidationError

from console.core.confirm import (
    PENDING_FILE,
    PendingRollback,
    rollback_audit_line,
    rollback_script,
    rollback_unit,
)
from console.core.pairing import AuditEntry
from console.core.systemd import DROPIN_NAME

if TYPE_CHECKING:
    from console.sources.service import ServiceController

# $1 the state dir as hosts.toml says it ("~" is the SSH user's home): its absolute path; the record, if any.
_READ = r"""
d=$1
case $d in "~") d=$HOME ;; "~/"*) d=$HOME/${d#"~/"} ;; esac
printf '%s\n' "$d"
cat -- "$d/pending-rollback.json" 2>/dev/null
exit 0
"""

# $1 the absolute state dir, $2 a file name in it, $3 its text: written atomically, mode 700.
_WRITE = r"""
mkdir -p -- "$1" || exit 70
t=$1/.$2.$$
printf '%s\n' "$3" > "$t" && chmod 700 "$t" && mv -f -- "$t" "$1/$2" || { rm -f -- "$t"; exit 71; }
"""


class RollbackTimerError(Exception):
    """The timer cannot be armed or read; one sentence."""


class HostRollback:
    def __init__(self, controller: ServiceController) -> None:
        self.ctl = controller
        self.name = rollback_unit(controller.unit)
        self.timer = f"{self.name}.timer"

    async def _state_dir_and_record(self) -> tuple[str, str]:
        res = await self.ctl._run(["sh", "-c", _READ, "sh", self.ctl.host.state_dir])
        head, _, rest = res.stdout.partition("\n")
        return head, rest.strip()

    async def pending(self) -> PendingRollback | None:
        """The armed rollback, if the host has a record of one; `active` says whether its timer waits."""
        _, text = await self._state_dir_and_record()
        if not text:
            return None
        try:
            record = PendingRollback.model_validate_json(text.split("\n", 1)[0])
        except (ValidationError, ValueError):
            return None
        res = await self.ctl._run(["systemctl", "is-active", self.timer], privileged=True)
        record.active = res.stdout.strip() in ("active", "activating")
        return record

    async def arm(
        self, within_s: float, *, armed_by: str, profile: str | None, op_id: str | None, audit: AuditEntry
    ) -> PendingRollback:
        state_dir, _ = await self._state_dir_and_record()
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
        description = (
            f"k26-console commit-confirmed rollback of {self.ctl.unit} ({armed_by}"
            + (f", profile {profile}" if profile else "")
            + ")"
        )
        script = f"{state_dir}/{self.name}.sh"
        text = rollback_script(
            dropin_dir=self.ctl.dropin_dir,
            dropin_name=DROPIN_NAME,
            unit=self.ctl.unit,
            state_dir=state_dir,
            audit_line=rollback_audit_line(audit),
        )
        wrote = await self.ctl._run(["sh", "-c", _WRITE, "sh", state_dir, f"{self.name}.sh", text])
        if not wrote.ok:
            raise RollbackTimerError(
                f"the host-side rollback's script could not be written in {state_dir} on "
                f"{self.ctl.host.name} ({wrote.first_error_line().rstrip('.')})"
            )
        argv = [
            "systemd-run",
            f"--unit={self.name}",
            f"--on-active={max(1, round(within_s))}s",
            "--timer-property=AccuracySec=1s",
            f"--description={description}",
            "--quiet",
            "--",
            "/bin/sh",
            script,
        ]
        res = await self.ctl._run(argv, privileged=True)
        if not res.ok:
            raise RollbackTimerError(
                f"the host-side rollback could not be armed on {self.ctl.host.name} "
                f"({res.first_error_line().rstrip('.')})"
            )
        wrote = await self.ctl._run(
            ["sh", "-c", _WRITE, "sh", state_dir, PENDING_FILE, record.model_dump_json()]
        )
        if not wrote.ok:
            await self.disarm()
            raise RollbackTimerError(
                f"the host-side rollback's record could not be written in {state_dir} on "
                f"{self.ctl.host.name} ({wrote.first_error_line().rstrip('.')})"
            )
        return record

    async def disarm(self) -> bool:
        """Stop the timer and remove the record; True when a timer was waiting."""
        was = await self.ctl._run(["systemctl", "is-active", self.timer], privileged=True)
        await self.ctl._run(["systemctl", "stop", self.timer], privileged=True)
        state_dir, _ = await self._state_dir_and_record()
        await self.ctl._run(["rm", "-f", "--", f"{state_dir}/{PENDING_FILE}"])
        return was.stdout.strip() in ("active", "activating")
