"""The safe restart on a host: validate, diff, write the drop-in, reload, restart, watch, verify, roll back.

`ServiceController(host, transport)` does the work over SSH and tells a `RestartMachine` (core/restart)
what happened; the journal of the new invocation moves the machine through the boot phases. Every remote
command is an argv (the transport quotes it), and with `sudo = true` in hosts.toml the commands that
change the host run as `sudo -n ...`: a rule that wants a password is a clear refusal, never a prompt.

The drop-in `UNIT_DIR/UNIT.service.d/50-k26-console.conf` is written by one remote `sh` script that reads
the text from standard input: temp file in the same directory, then rename, so systemd never reads half
a file. The drop-in it replaces is kept beside it as `50-k26-console.conf.previous` (no `.conf` suffix:
systemd ignores it) for the rollback; when there was none, the rollback removes ours. Before the restart,
the unit is reloaded and read back: if systemd does not load it, or its ExecStart is not the argv
intended, the previous drop-in is put back at once and nothing restarts.

Phase durations of earlier restarts (per host, in the platform state dir) give the ETA of the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import platformdirs
from pydantic import BaseModel, ValidationError

from console.core.apply import (
    DEFAULT_MIN_FREE_GIB,
    ApplyOutcome,
    ApplyPreview,
    ApplyProgress,
    host_profile,
    judge,
    planner_verdict,
    why_not_running,
)
from console.core.capacity import DEFAULT_MIN_HEADROOM_GIB
from console.core.confirm import PendingRollback
from console.core.events import Event
from console.core.flags import FlagList, UnknownVersion, load_flag_list, split_command
from console.core.pairing import AuditEntry
from console.core.parser import JournalParser, parse_lines
from console.core.profiles import (
    Profile,
    ProfileError,
    Verified,
    diff_against_argv,
    is_sglang_launcher,
    profile_argv,
    validate_profile,
)
from console.core.restart import (
    PHASE_FACTOR,
    PHASE_LABELS,
    PHASE_MARGIN_S,
    Phase,
    RestartMachine,
    RestartRecord,
    median_durations,
)
from console.core.snapshot import FollowState
from console.core.state import Boot, fold_boots
from console.core.systemd import (
    DROPIN_NAME,
    ExecStartError,
    exec_start_lines,
    render_dropin,
    split_exec_start,
    validate_unit_name,
)
from console.core.text import split_lines
from console.sources.confirm import HostRollback, RollbackTimerError
from console.sources.hosts import HostConfig
from console.sources.hoststate import HostStateError
from console.sources.journal import JournalFollower, read_unit_journal
from console.sources.profile_store import ProfileStore
from console.sources.transport import CommandResult, Transport, TransportError

__all__ = [
    "ApplyOutcome",
    "ApplyPreview",
    "ApplyProgress",
    "ServiceController",
    "ServiceError",
    "UnitInfo",
    "history_path",
]

BACKUP_SUFFIX = ".previous"
BeforeChange = Callable[[], Awaitable[None]]
"""Called once, right before the first change to the host (the audit trail's intent is written there):
when it raises, nothing has changed and the operation stops."""
HISTORY_KEEP = 20
"""Earlier restarts whose phase durations make the ETA (the median of each phase)."""

# Exit codes of the write script, one per step, so the sentence names what failed.
_WRITE_STEPS = {
    10: "create the drop-in directory",
    11: "create a temporary file in the drop-in directory",
    12: "write the temporary file",
    13: "keep the previous drop-in as a backup",
    14: "rename the temporary file over the drop-in",
    15: "put the previous drop-in back",
    16: "remove the drop-in",
}

# $1 = the drop-in directory, $2 = the file name; the text arrives on stdin. Nothing is changed until the
# new text is safely in a temp file; a directory this script created is removed again on failure.
_WRITE_SCRIPT = r"""
dir=$1; name=$2; made=
fail() { code=$1; shift; rm -f -- "$tmp" "$bak"; [ -n "$made" ] && rmdir -- "$dir" 2>/dev/null; echo "$*" >&2; exit "$code"; }
tmp=; bak=
if [ ! -d "$dir" ]; then mkdir -p -- "$dir" 2>&1 >/dev/null | head -n 1 >&2; [ -d "$dir" ] || exit 10; made=1; fi
tmp=$(mktemp "$dir/.$name.XXXXXX" 2>/dev/null) || fail 11 "mktemp: cannot create a file in $dir: $(touch "$dir/.k26-probe" 2>&1 | sed 's/^touch: //' | head -n 1)"
err=$(cat 2>&1 > "$tmp") || fail 12 "cannot write $tmp: ${err#cat: }"
chmod 0644 "$tmp" || fail 12 "cannot chmod $tmp"
sync -- "$tmp" 2>/dev/null
if [ -f "$dir/$name" ]; then
  bak=$(mktemp "$dir/.$name.previous.XXXXXX") || fail 13 "cannot create a backup file in $dir"
  cp -p -- "$dir/$name" "$bak" && mv -f -- "$bak" "$dir/$name.previous" || fail 13 "cannot keep $dir/$name as $dir/$name.previous"
  bak=
else
  rm -f -- "$dir/$name.previous" || fail 13 "cannot remove the stale $dir/$name.previous"
fi
mv -f -- "$tmp" "$dir/$name" || fail 14 "cannot rename $tmp to $dir/$name"
"""

# $1 = the drop-in directory, $2 = the file name: put the backup back, or remove ours when there was none.
_RESTORE_SCRIPT = r"""
dir=$1; name=$2
if [ -f "$dir/$name.previous" ]; then
  mv -f -- "$dir/$name.previous" "$dir/$name" || exit 15
  echo restored
else
  rm -f -- "$dir/$name" || exit 16
  rmdir -- "$dir" 2>/dev/null
  echo removed
fi
"""

# $1 = the drop-in directory, $2 = the file name: what is there now.
_STATE_SCRIPT = r"""
dir=$1; name=$2
[ -f "$dir/$name" ] && echo dropin
[ -f "$dir/$name.previous" ] && echo previous
exit 0
"""


class ServiceError(Exception):
    """The apply cannot go on; `str()` is one sentence for the operator. `bad_input` marks what the
    operator must fix (a flag, the hosts file, sudo, the drop-in directory): the host was left as it was."""

    def __init__(self, sentence: str, *, bad_input: bool = False) -> None:
        super().__init__(sentence)
        self.bad_input = bad_input


class UnitInfo(BaseModel):
    """`systemctl show` of the unit, the properties the controller reads."""

    load_state: str = ""
    active_state: str = ""
    sub_state: str = ""
    invocation_id: str = ""
    fragment_path: str = ""
    dropin_paths: list[str] = []
    need_daemon_reload: bool = False
    exec_start: str = ""


def history_path(host: str, state_dir: Path | None = None) -> Path:
    """Where the phase durations of this host's earlier restarts are kept (JSON lines)."""
    base = state_dir or Path(platformdirs.user_state_dir("k26-console"))
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host) or "host"
    return base / "restarts" / f"{safe}.jsonl"


def _sentence(text: str) -> str:
    text = " ".join(text.split())
    return text if text.endswith((".", "!", "?")) else text + "."


class ServiceController:
    def __init__(
        self,
        host: HostConfig,
        transport: Transport,
        *,
        clock: Callable[[], float] = time.monotonic,
        state_dir: Path | None = None,
        min_headroom_gib: float = DEFAULT_MIN_HEADROOM_GIB,
        min_free_gib: float = DEFAULT_MIN_FREE_GIB,
        boot_timeout_s: float = 1800.0,
        command_timeout_s: float = 120.0,
        phase_factor: float = PHASE_FACTOR,
        phase_margin_s: float = PHASE_MARGIN_S,
    ) -> None:
        """`phase_factor` and `phase_margin_s` set each boot phase's deadline from this host's history
        (see `RestartMachine.phase_limit`); `boot_timeout_s` caps the whole boot."""
        self.host = host
        self.transport = transport
        self.clock = clock
        self.state_dir = state_dir
        self.min_headroom_gib = min_headroom_gib
        self.min_free_gib = min_free_gib
        self.boot_timeout_s = boot_timeout_s
        self.command_timeout_s = command_timeout_s
        self.phase_factor = phase_factor
        self.phase_margin_s = phase_margin_s
        try:
            self.unit = validate_unit_name(host.unit)
        except ExecStartError as exc:
            raise ServiceError(f"{exc}.", bad_input=True) from None
        self.dropin_dir = f"{host.unit_dir.rstrip('/')}/{self.unit}.d"
        self.dropin_path = f"{self.dropin_dir}/{DROPIN_NAME}"
        self._boots: list[Boot] = []

    def _machine(self, name: str, purpose: Literal["apply", "rollback"] = "apply") -> RestartMachine:
        return RestartMachine(
            name,
            now=self.clock(),
            host=self.host.name,
            purpose=purpose,
            history=self._history(),
            phase_factor=self.phase_factor,
            phase_margin_s=self.phase_margin_s,
        )

    # ---- remote commands -----------------------------------------------------------------------

    def _privileged(self, argv: Sequence[str]) -> list[str]:
        return ["sudo", "-n", *argv] if self.host.sudo else list(argv)

    async def _run(
        self,
        argv: Sequence[str],
        *,
        privileged: bool = False,
        input: str | None = None,
        retries: int = 3,
    ) -> CommandResult:
        """Run a command; a dropped connection is waited out and the command retried (every command
        run through here is safe to repeat). sudo's refusals become one sentence."""
        full = self._privileged(argv) if privileged else list(argv)
        for attempt in range(retries + 1):
            try:
                result = await self.transport.run(full, timeout=self.command_timeout_s, input=input)
                break
            except TransportError as exc:
                if attempt >= retries:
                    raise ServiceError(_sentence(str(exc))) from None
                with contextlib.suppress(TransportError, TimeoutError):
                    await self.transport.wait_up(self.command_timeout_s)
        if privileged and self.host.sudo and not result.ok:
            err = result.stderr.lower()
            if "password is required" in err or "a terminal is required" in err:
                raise ServiceError(
                    f"sudo on {self.host.name} needs a password, and the console never types one: allow "
                    f"{self.host.ssh_user or 'this user'} to run systemctl and write {self.dropin_dir} "
                    "without a password (a NOPASSWD sudoers rule), or set sudo = false for this host.",
                    bad_input=True,
                )
            if result.exit_status == 127 and "sudo" in err:
                raise ServiceError(f"sudo is not installed on {self.host.name}.", bad_input=True)
            if "not in the sudoers" in err or "not allowed to execute" in err:
                raise ServiceError(
                    f"sudo on {self.host.name} refuses {argv[0]}: {result.first_error_line()}", bad_input=True
                )
        return result

    async def unit_info(self) -> UnitInfo:
        props = (
            "LoadState,ActiveState,SubState,InvocationID,FragmentPath,DropInPaths,NeedDaemonReload,ExecStart"
        )
        result = await self._run(["systemctl", "show", "-p", props, self.unit])
        if not result.ok:
            raise ServiceError(
                f"systemctl show {self.unit} failed on {self.host.name}: {result.first_error_line()}."
            )
        values: dict[str, str] = {}
        for line in split_lines(result.stdout):
            key, sep, value = line.partition("=")
            if sep and key not in values:
                values[key] = value
        return UnitInfo(
            load_state=values.get("LoadState", ""),
            active_state=values.get("ActiveState", ""),
            sub_state=values.get("SubState", ""),
            invocation_id=values.get("InvocationID", ""),
            fragment_path=values.get("FragmentPath", ""),
            dropin_paths=values.get("DropInPaths", "").split(),
            need_daemon_reload=values.get("NeedDaemonReload", "no") == "yes",
            exec_start=values.get("ExecStart", ""),
        )

    async def running_argv(self) -> list[str]:
        """The unit's effective ExecStart as an argv, read from `systemctl cat` with systemd's own
        quoting rules (`systemctl show` joins argv[] with spaces, which loses quoted words)."""
        info = await self.unit_info()
        if info.load_state == "not-found" or not info.fragment_path:
            raise ServiceError(
                f'there is no unit {self.unit} on {self.host.name}; set unit = "..." for this host in '
                "hosts.toml.",
                bad_input=True,
            )
        result = await self._run(["systemctl", "cat", self.unit])
        if not result.ok:
            raise ServiceError(
                f"systemctl cat {self.unit} failed on {self.host.name}: {result.first_error_line()}."
            )
        lines = exec_start_lines(result.stdout)
        if not lines:
            raise ServiceError(
                f"the unit {self.unit} on {self.host.name} has no ExecStart= to change.", bad_input=True
            )
        try:
            return split_exec_start(lines[-1])
        except ExecStartError as exc:
            raise ServiceError(
                f"the ExecStart= of {self.unit} on {self.host.name} cannot be read ({exc}).", bad_input=True
            ) from None

    async def _journal_boots(self) -> list[Boot]:
        try:
            lines = await read_unit_journal(self.transport, self.unit, lines=20_000)
        except TransportError as exc:
            raise ServiceError(_sentence(str(exc))) from None
        return fold_boots(parse_lines(lines))

    async def _dropin_state(self) -> set[str]:
        result = await self._run(["sh", "-c", _STATE_SCRIPT, "sh", self.dropin_dir, DROPIN_NAME])
        return set(result.stdout.split())

    # ---- preview -------------------------------------------------------------------------------

    def _flag_list(self, profile: Profile) -> FlagList:
        try:
            return load_flag_list(profile.sglang_version)
        except UnknownVersion as exc:
            raise ServiceError(f"{exc}.", bad_input=True) from None

    async def why_not_running(self, profile: Profile) -> str | None:
        """None when the unit runs `profile` as `apply` writes it; otherwise why not, in words (the flags
        that differ, or why they could not be read). Read fresh: another console, or systemctl by hand,
        may have restarted the unit since the last look."""
        try:
            running = await self.running_argv()
        except (ServiceError, TransportError) as exc:
            return f"its running flags could not be read ({str(exc).rstrip('.')})"
        return why_not_running(profile, running)

    async def preview(self, profile: Profile) -> ApplyPreview:
        """Validate the profile (flags for its SGLang version, the planner calibrated on this host's
        journal) and diff it against the running ExecStart. Reads the host; changes nothing."""
        fl = self._flag_list(profile)
        validation = validate_profile(profile, fl)
        running = await self.running_argv()
        adjusted, notes = host_profile(profile, fl, running)
        self._boots = await self._journal_boots()
        verdict = planner_verdict(
            profile, fl, self._boots, model=self.host.model, min_headroom_gib=self.min_headroom_gib
        )
        errors = [i.message for i in validation.errors]
        warnings = [i.message for i in validation.warnings]
        if not verdict.checked:
            warnings.append(verdict.summary())
        planner_refused = verdict.checked and verdict.fits is False
        if planner_refused:
            errors.extend(verdict.reasons)
        new_argv: list[str] = []
        diff: list[str] = []
        if validation.ok:
            new_argv = profile_argv(adjusted, fl)
            d = diff_against_argv(running, adjusted, fl)
            diff = d.lines()
            warnings.extend(f"the running ExecStart: {p}" for p in d.problems)
            if not diff and new_argv != running:
                diff = ["~ the same flags, written in another order or spelling"]
        program_changed = False
        if running and new_argv:
            before_cmd, after_cmd = split_command(running)[0], split_command(new_argv)[0]
            if before_cmd != after_cmd:
                program_changed = True
                warnings.append(
                    f"the unit would run another program: {shlex.join(before_cmd)} → {shlex.join(after_cmd)}"
                    + (
                        ""
                        if is_sglang_launcher(after_cmd)
                        else " (not SGLang's launcher, so nothing the console checks applies to it)"
                    )
                    + "; type the profile's name to confirm (or pass --yes)"
                )
        return ApplyPreview(
            profile=profile.name,
            host=self.host.name,
            unit=self.unit,
            ok=validation.ok and not planner_refused,
            valid=validation.ok,
            planner_refused=planner_refused,
            errors=errors,
            warnings=warnings,
            notes=notes,
            diff=diff,
            predicted_pool_tokens=verdict.predicted_pool_tokens,
            headroom_gib=verdict.headroom_gib,
            fits=verdict.fits,
            planner=verdict,
            running_argv=running,
            new_argv=new_argv,
            dropin_path=self.dropin_path,
            program_changed=program_changed,
        )

    # ---- history (ETA) -------------------------------------------------------------------------

    def _history(self) -> list[dict[str, float]]:
        path = history_path(self.host.name, self.state_dir)
        try:
            text = path.read_text(encoding="utf-8")
        except (FileNotFoundError, OSError, UnicodeDecodeError):
            return []
        out: list[dict[str, float]] = []
        for line in text.split("\n")[-HISTORY_KEEP * 2 :]:
            with contextlib.suppress(ValueError, ValidationError):
                rec = RestartRecord.model_validate_json(line)
                if rec.outcome == "verified":
                    out.append({str(k): v for k, v in rec.durations.items()})
        return out[-HISTORY_KEEP:]

    def _remember(self, record: RestartRecord) -> None:
        path = history_path(self.host.name, self.state_dir)
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as fh:
                fh.write(record.model_dump_json() + "\n")

    # ---- apply ---------------------------------------------------------------------------------

    async def apply(
        self,
        profile: Profile,
        *,
        force: bool = False,
        rollback_on_failure: bool = False,
        progress: Callable[[ApplyProgress], None] | None = None,
        store: ProfileStore | None = None,
        preview: ApplyPreview | None = None,
        before_change: BeforeChange | None = None,
        confirm_within_s: float | None = None,
        armed_by: str = "k26-console",
        op_id: str | None = None,
    ) -> ApplyOutcome:
        """Apply `profile` in one restart and verify it. A profile with invalid flags raises ServiceError
        (bad_input) before anything is touched; one the planner refuses ends `refused` unless `force`.
        `before_change` runs right before the drop-in is written (not at all when nothing changes)."""
        m = self._machine(profile.name)
        report = _Reporter(m, self.clock, progress)
        report.emit()
        pv = preview or await self.preview(profile)
        if not pv.valid:
            m.step_done(Phase.VALIDATE, self.clock(), ok=False, reason=pv.errors[0] if pv.errors else None)
            raise ServiceError(
                f"profile {profile.name} is not valid for SGLang {profile.sglang_version}: "
                f"{pv.errors[0] if pv.errors else 'see profiles validate'}",
                bad_input=True,
            )
        if pv.planner_refused and not force:
            m.step_done(Phase.VALIDATE, self.clock(), ok=False, reason=" ".join(pv.errors))
            return self._outcome(m, profile, pv, ok=False, summary=f"refused by the planner: {pv.errors[0]}")
        m.step_done(Phase.VALIDATE, self.clock())
        report.emit("forced past the planner's refusal" if pv.planner_refused else None)
        if pv.unchanged:
            m.step_done(Phase.DIFF, self.clock(), ok=False)
            boots = self._boots or await self._journal_boots()
            if not boots:
                return self._outcome(
                    m, profile, pv, ok=False, summary="unchanged, and the journal shows no boot to verify."
                )
            verdict = judge(boots, profile.target_context)
            return self._outcome(
                m,
                profile,
                pv,
                ok=verdict.ok,
                summary=f"unchanged: {self.unit} already runs this profile; {verdict.summary}",
                reasons=verdict.reasons,
            )
        report.emit(f"{len(pv.diff)} change(s) to the running ExecStart")
        m.step_done(Phase.DIFF, self.clock())
        report.emit()
        before_pool = self._boots[-1].pool.tokens if self._boots else None

        try:
            text = render_dropin(
                pv.new_argv,
                header=[
                    f"Written by k26-console: profile {profile.name} (target context "
                    f"{profile.target_context:,} tokens, SGLang {profile.sglang_version}), "
                    f"{datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}.",
                    f"The previous drop-in, if any, is kept as {DROPIN_NAME}{BACKUP_SUFFIX} for the rollback.",
                ],
            )
        except ExecStartError as exc:
            raise ServiceError(
                f"the command cannot be written as a systemd unit: {exc}; the host is unchanged.",
                bad_input=True,
            ) from None
        guard = HostRollback(self) if confirm_within_s else None
        if guard is not None:
            armed_before = await guard.pending()
            if armed_before is not None and armed_before.active:
                raise ServiceError(
                    f"{armed_before.describe(datetime.now(UTC))}; confirm or roll back that change first "
                    "(the host is unchanged)",
                    bad_input=True,
                )
        if before_change is not None:
            await before_change()
        await self.write_dropin(text)
        report.emit(
            f"drop-in written to {self.dropin_path}"
            + (
                f"; the previous one kept as {DROPIN_NAME}{BACKUP_SUFFIX}"
                if await self._had_previous()
                else " (there was none before: a rollback removes it)"
            )
        )
        armed: PendingRollback | None = None
        if guard is not None and confirm_within_s:
            # Right after the write, so that what the timer restores is the drop-in that ran until now.
            try:
                armed = await guard.arm(
                    confirm_within_s,
                    armed_by=armed_by,
                    profile=profile.name,
                    op_id=op_id,
                    audit=self._host_rollback_entry(profile.name, armed_by, confirm_within_s, op_id),
                )
            except RollbackTimerError as exc:
                await self._restore()
                with contextlib.suppress(ServiceError):
                    await self._daemon_reload()
                raise ServiceError(
                    f"{exc}; the previous drop-in is back and the service was not restarted "
                    "(--confirm-within 0 applies without a host-side rollback)"
                ) from None
            report.emit(armed.describe(datetime.now(UTC)))
        m.step_done(Phase.WRITE_DROPIN, self.clock())
        report.emit()
        try:
            await self._reload_and_check(pv.new_argv)
        except ServiceError:
            if guard is not None and armed is not None:
                await guard.disarm()
            raise
        m.step_done(Phase.DAEMON_RELOAD, self.clock())
        report.emit()

        events = await self._restart_guarded(m, report)
        outcome = await self._finish(
            m, report, profile, pv, events, target=profile.target_context, store=store
        )
        if guard is not None and armed is not None:
            await self._settle_rollback(guard, armed, outcome, report, rollback_on_failure)
        if not outcome.ok and rollback_on_failure:
            # The intent written above covers the rollback too: its outcome is this apply's outcome.
            outcome.rollback = await self.rollback(progress=progress, expect_pool=before_pool)
            outcome.rolled_back = True
            tail = "verified" if outcome.rollback.ok else "NOT verified"
            outcome.summary += f" Rolled back to the previous drop-in: {tail}."
        return outcome

    def expected_boot_s(self) -> float | None:
        """A usual restart on this host (the sum of its median phase durations); None without history."""
        medians = median_durations(self._history())
        return sum(medians.values()) if medians else None

    def _host_rollback_entry(
        self, profile: str, armed_by: str, within_s: float, op_id: str | None
    ) -> AuditEntry:
        return AuditEntry(
            ts=datetime.now(UTC),
            user="host",
            host=self.host.name,
            action="rollback",
            profile=profile,
            outcome="rolled_back",
            summary=(
                f"the host rolled itself back: {profile} (applied by {armed_by}) was not confirmed within "
                f"{within_s:g} s, so the previous drop-in of {self.unit} is back and the service restarts"
            ),
            op_id=op_id,
            phase="commit-confirmed",
        )

    async def _settle_rollback(
        self,
        guard: HostRollback,
        armed: PendingRollback,
        outcome: ApplyOutcome,
        report: _Reporter,
        rollback_on_failure: bool,
    ) -> None:
        """A verified boot confirms the change (the timer is stopped); a failed one is left to the timer,
        unless the console rolls back itself (then the timer is stopped first, the console takes over)."""
        if not outcome.ok and not rollback_on_failure:
            try:
                waiting = await guard.timer_waiting()
            except (ServiceError, TransportError):
                waiting = True  # unknown: say what was armed
            if not waiting:
                outcome.summary += (
                    " The host-side rollback has fired (the deadline passed before the console could "
                    "confirm): the host runs the previous drop-in again."
                )
                report.emit("the host-side rollback has fired: the previous drop-in is back")
                return
            outcome.pending_rollback = armed
            sentence = armed.describe(datetime.now(UTC))
            outcome.summary += f" {sentence}."
            report.emit(sentence)
            return
        try:
            was_waiting = await guard.disarm()
        except (ServiceError, TransportError, HostStateError) as exc:
            outcome.ok = False
            outcome.pending_rollback = armed
            outcome.summary += (
                f" The host-side rollback could NOT be disarmed ({str(exc).rstrip('.')}): it fires at "
                f"{armed.deadline.strftime('%H:%M:%S')} UTC unless stopped."
            )
            return
        if not was_waiting:
            outcome.ok = False
            outcome.summary += (
                " But the host-side rollback had already fired (its deadline passed before the boot was "
                "verified): the host runs the previous drop-in again."
            )
        elif outcome.ok:
            report.emit("confirmed: the host-side rollback is disarmed")

    async def _had_previous(self) -> bool:
        return "previous" in await self._dropin_state()

    async def install(self, argv: Sequence[str], *, header: Sequence[str] = ()) -> None:
        """Write the drop-in that makes the unit run `argv`, reload, and check systemd reads it back as
        exactly `argv` (else the previous drop-in is put back). Does not restart."""
        try:
            text = render_dropin(argv, header=header)
        except ExecStartError as exc:
            raise ServiceError(
                f"the command cannot be written as a systemd unit: {exc}.", bad_input=True
            ) from None
        await self.write_dropin(text)
        await self._reload_and_check(list(argv))

    async def write_dropin(self, text: str) -> None:
        """Temp file + rename on the host, the previous drop-in kept; a failure changes nothing."""
        result = await self._run(
            ["sh", "-c", _WRITE_SCRIPT, "sh", self.dropin_dir, DROPIN_NAME], privileged=True, input=text
        )
        if not result.ok:
            step = _WRITE_STEPS.get(result.exit_status or 0, "write the drop-in")
            detail = result.first_error_line()
            raise ServiceError(
                f"cannot {step} {self.dropin_dir} on {self.host.name}: {detail.rstrip('.')}"
                f"{self._write_hint(result.stderr)}; the host is unchanged.",
                bad_input=True,
            )

    def _write_hint(self, stderr: str) -> str:
        """What the operator can do about a failed write: root only helps against a permission refusal
        (a full disk or a read-only file system is not fixed by sudo)."""
        err = stderr.lower()
        if "no space left" in err or "disk quota exceeded" in err:
            return (
                f" (ENOSPC: the file system holding {self.dropin_dir} is full; free space there and run "
                "the apply again)"
            )
        if "read-only file system" in err:
            return f" (EROFS: {self.dropin_dir} is on a read-only file system)"
        if self.host.sudo or not ("permission denied" in err or "operation not permitted" in err):
            return ""
        return " (set sudo = true for this host in hosts.toml if it needs root)"

    async def _reload_and_check(self, intended: list[str]) -> None:
        """daemon-reload and read the unit back; on any doubt, put the previous drop-in back and reload."""
        try:
            await self._daemon_reload()
            info = await self.unit_info()
            problem = None
            if info.load_state != "loaded":
                problem = f"systemd does not load {self.unit} with it (LoadState={info.load_state})"
            else:
                reads = await self.running_argv()
                if reads != intended:
                    problem = "systemd reads its ExecStart= differently from the argv intended"
        except ServiceError as exc:
            problem = str(exc).rstrip(".")
        if problem is not None:
            await self._restore()
            with contextlib.suppress(ServiceError):
                await self._daemon_reload()
            raise ServiceError(
                f"the new drop-in was not accepted on {self.host.name}: {problem}; the previous drop-in is back "
                "and the service was not restarted."
            )

    async def _daemon_reload(self) -> None:
        result = await self._run(["systemctl", "daemon-reload"], privileged=True)
        if not result.ok:
            raise ServiceError(
                f"systemctl daemon-reload failed on {self.host.name}: {result.first_error_line()}."
            )

    async def _restore(self) -> str:
        result = await self._run(
            ["sh", "-c", _RESTORE_SCRIPT, "sh", self.dropin_dir, DROPIN_NAME], privileged=True
        )
        if not result.ok:
            step = _WRITE_STEPS.get(result.exit_status or 0, "restore the drop-in")
            raise ServiceError(
                f"cannot {step} in {self.dropin_dir} on {self.host.name}: {result.first_error_line()}."
            )
        return result.stdout.strip()

    async def _journal_cursor(self) -> str | None:
        """The cursor of the unit's last journal entry: the new invocation's lines are what follows it."""
        result = await self._run(["journalctl", "-u", self.unit, "-o", "json", "--no-pager", "-n", "1"])
        for line in reversed(result.stdout.split("\n")):
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                cursor = entry.get("__CURSOR") if isinstance(entry, dict) else None
                if isinstance(cursor, str) and cursor:
                    return cursor
        return None

    async def _restart(self, before: str) -> None:
        """`systemctl restart --no-block`; after a dropped connection, only again if it did not happen."""
        argv = self._privileged(["systemctl", "restart", "--no-block", self.unit])
        for attempt in range(4):
            try:
                result = await self.transport.run(argv, timeout=self.command_timeout_s)
            except TransportError as exc:
                with contextlib.suppress(TransportError, TimeoutError):
                    await self.transport.wait_up(self.command_timeout_s)
                info = await self.unit_info()
                if info.invocation_id != before or info.active_state in (
                    "activating",
                    "deactivating",
                    "failed",
                ):
                    return
                if attempt == 3:
                    raise ServiceError(_sentence(str(exc))) from None
                continue
            if not result.ok:
                raise ServiceError(
                    f"systemctl restart {self.unit} failed on {self.host.name}: {result.first_error_line()}."
                )
            return

    async def _restart_guarded(self, m: RestartMachine, report: _Reporter) -> list[Event]:
        """The restart; a host that cannot be restarted or followed ends the restart as failed (the
        caller may still roll back) instead of leaving it half-reported."""
        try:
            return await self._restart_and_follow(m, report)
        except ServiceError as exc:
            if m.phase == Phase.RESTART:
                m.step_done(Phase.RESTART, self.clock(), ok=False, reason=str(exc).rstrip("."))
            else:
                m.timed_out(self.clock(), str(exc).rstrip("."))
            return []

    async def _restart_and_follow(self, m: RestartMachine, report: _Reporter) -> list[Event]:
        """Issue the restart and follow the journal from just before it until ready or failed. The
        follower resumes from its cursor after a dropped connection, so the verdict sees every line."""
        info = await self.unit_info()
        m.replaced_invocation = info.invocation_id or None
        cursor = await self._journal_cursor()
        follower = JournalFollower(
            self.transport,
            self.unit,
            cursor=cursor,
            scope_to_invocation=False,
            backlog=0,
            restart_delay_s=0.2,
        )
        parser = JournalParser(host=self.host.name)
        events: list[Event] = []
        follower.start()
        try:
            await self._restart(info.invocation_id)
            m.step_done(Phase.RESTART, self.clock())
            report.emit()
            deadline = self.clock() + self.boot_timeout_s
            while m.phase not in (Phase.READY, Phase.FAILED):
                if follower.status.state is FollowState.FAILED:
                    m.timed_out(
                        self.clock(), f"the journal can no longer be followed: {follower.status.detail}"
                    )
                    report.emit()
                    break
                if self.clock() > deadline:
                    m.timed_out(
                        self.clock(), f"no ready line within {self.boot_timeout_s:g} s of the restart"
                    )
                    report.emit()
                    break
                overdue = m.overdue(self.clock())
                if overdue is not None:
                    # A boot that stopped making progress (an exec that failed without a journal line,
                    # a server whose lines no longer reach the journal) ends here, not at the boot timeout.
                    m.timed_out(self.clock(), overdue)
                    report.emit()
                    break
                try:
                    async with asyncio.timeout(1.0):
                        batch = await follower.next_batch()
                except TimeoutError:
                    # Quiet: release a traceback the parser holds (the OOM's last lines).
                    self._feed(m, report, parser.flush(), events)
                    continue
                fresh: list[Event] = []
                for entry in batch:
                    fresh.extend(parser.feed(entry))
                self._feed(m, report, fresh, events)
            if m.phase == Phase.FAILED:
                # The lines right after the failure (the rest of a traceback, the unit's own end).
                with contextlib.suppress(TimeoutError):
                    while True:
                        async with asyncio.timeout(1.0):
                            batch = await follower.next_batch()
                        for entry in batch:
                            events.extend(parser.feed(entry))
                events.extend(parser.flush())
        finally:
            await follower.close()
        return events

    def _feed(self, m: RestartMachine, report: _Reporter, fresh: list[Event], events: list[Event]) -> None:
        for event in fresh:
            events.append(event)
            before = m.phase
            m.feed(event, self.clock())
            if m.phase != before:
                report.emit()

    async def _finish(
        self,
        m: RestartMachine,
        report: _Reporter,
        profile: Profile | None,
        pv: ApplyPreview | None,
        events: list[Event],
        *,
        target: int | None,
        store: ProfileStore | None,
        name: str | None = None,
    ) -> ApplyOutcome:
        name = name or (profile.name if profile else "rollback")
        boots = fold_boots(events)
        if m.finished or m.phase == Phase.FAILED or not boots:
            if not m.finished:
                if m.phase != Phase.FAILED:
                    m.timed_out(self.clock(), "the journal showed no boot after the restart")
                m.finish_failed(self.clock())
            report.emit(m.reason)
            reasons = [r for r in [m.reason, *m.errors] if r]
            reasons = list(dict.fromkeys(reasons))
            self._remember(m.record())
            return self._outcome(
                m,
                profile,
                pv,
                ok=False,
                summary=f"failed: {_short(reasons[0]) if reasons else 'the boot failed'}.",
                reasons=reasons,
                name=name,
            )
        m.begin_verify(self.clock())
        report.emit()
        verdict = judge(boots, target or 1)
        reasons = list(verdict.reasons)
        free = verdict.available_gpu_mem_gb
        if free is not None and free < self.min_free_gib:
            reasons.append(
                f"only {free:.2f} GiB of GPU memory is free at ready, under the {self.min_free_gib:g} GiB a long "
                "prefill needs"
            )
        ok = not reasons
        m.step_done(Phase.VERIFY, self.clock(), ok=ok, reason="; ".join(reasons) or None)
        report.emit()
        recorded: str | None = None
        if ok and store is not None and profile is not None:
            try:
                path = store.record_verified(
                    profile.name,
                    Verified(
                        pool_tokens=verdict.max_total_num_tokens,
                        headroom_gib=round(free, 2) if free is not None else None,
                        when=datetime.now(UTC).replace(microsecond=0),
                        host=self.host.name,
                        sglang_version=profile.sglang_version,
                    ),
                )
                recorded = str(path)
            except (ProfileError, OSError) as exc:
                reasons.append(f"the verified numbers could not be recorded in the profile: {exc}")
        if recorded:
            report.emit(f"verified numbers recorded in {recorded}")
        m.step_done(Phase.RECORD, self.clock())
        report.emit()
        self._remember(m.record())
        tokens = verdict.max_total_num_tokens
        if ok:
            parts = [f"verified: pool {tokens:,} tokens"]
            if target and target > 1:
                parts[0] += f" ≥ {target:,}"
            parts += ["ready", "no errors since this boot"]
            if free is not None:
                parts.append(f"{free:.2f} GiB free at ready")
            summary = ", ".join(parts) + f"; {m.elapsed(self.clock()):.1f} s in all."
        else:
            summary = "not verified: " + "; ".join(reasons) + "."
        out = self._outcome(m, profile, pv, ok=ok, summary=summary, reasons=reasons, name=name)
        out.pool_tokens = tokens
        out.headroom_gib = free
        out.recorded_in = recorded
        return out

    def _outcome(
        self,
        m: RestartMachine,
        profile: Profile | None,
        pv: ApplyPreview | None,
        *,
        ok: bool,
        summary: str,
        reasons: list[str] | None = None,
        name: str | None = None,
    ) -> ApplyOutcome:
        now = self.clock()
        return ApplyOutcome(
            ok=ok,
            profile=name or (profile.name if profile else "rollback"),
            summary=summary,
            outcome=m.outcome or "",
            pool_tokens=m.pool_tokens,
            headroom_gib=m.available_gpu_mem_gb,
            durations={str(k): round(v, 3) for k, v in m.durations(now).items()},
            total_s=round(m.elapsed(now), 3),
            reasons=reasons if reasons is not None else ([m.reason] if m.reason else []),
            diff=list(pv.diff) if pv else [],
        )

    # ---- plain restart -------------------------------------------------------------------------

    async def restart(
        self,
        *,
        progress: Callable[[ApplyProgress], None] | None = None,
        expect_pool: int | None = None,
        before_change: BeforeChange | None = None,
    ) -> ApplyOutcome:
        """Restart the unit with the flags in force (nothing written, no profile recorded), follow the
        boot and verify it as an apply is verified: ready, no errors since this boot, free memory at
        ready, and a pool of at least `expect_pool` tokens when given. The outcome is named after the
        unit, so an audit line reads "alice restarted sglang.service"."""
        m = self._machine(self.unit)
        report = _Reporter(m, self.clock, progress)
        report.emit()
        argv = await self.running_argv()  # the unit exists and has an ExecStart to restart
        m.step_done(Phase.VALIDATE, self.clock())
        report.emit(f"{self.unit} restarts as it is: {len(argv)} argument(s) in its ExecStart")
        m.step_done(Phase.DIFF, self.clock())
        # No drop-in is written and systemd is not reloaded: a plain restart must not pick up unit
        # edits someone left on the host without reviewing them. Each phase is still reported, so the
        # live lines list the phases the outcome's timings list.
        report.emit("nothing written: the drop-in in force stays")
        m.step_done(Phase.WRITE_DROPIN, self.clock())
        report.emit("no daemon-reload: unit edits left on the host are not picked up")
        m.step_done(Phase.DAEMON_RELOAD, self.clock())
        report.emit()
        if before_change is not None:
            await before_change()
        events = await self._restart_guarded(m, report)
        return await self._finish(
            m, report, None, None, events, target=expect_pool, store=None, name=self.unit
        )

    # ---- rollback ------------------------------------------------------------------------------

    async def rollback(
        self,
        *,
        progress: Callable[[ApplyProgress], None] | None = None,
        expect_pool: int | None = None,
        before_change: BeforeChange | None = None,
    ) -> ApplyOutcome:
        """Put the previous drop-in back (or remove ours when there was none), reload, restart, verify:
        ready, no errors since this boot, and, when `expect_pool` is given, the pool it had before."""
        m = self._machine("rollback", "rollback")
        report = _Reporter(m, self.clock, progress)
        report.emit()
        state = await self._dropin_state()
        if "dropin" not in state and "previous" not in state:
            m.step_done(Phase.VALIDATE, self.clock(), ok=False, reason="nothing to roll back")
            raise ServiceError(
                f"there is no drop-in by k26-console in {self.dropin_dir} on {self.host.name} to roll back.",
                bad_input=True,
            )
        m.step_done(Phase.VALIDATE, self.clock())
        report.emit()  # the diff phase (reading the ExecStart in force) is timed, so it is shown live
        before = await self.running_argv()
        m.step_done(Phase.DIFF, self.clock())
        report.emit()
        if before_change is not None:
            await before_change()
        what = await self._restore()
        report.emit(
            f"the previous drop-in is back at {self.dropin_path}"
            if what == "restored"
            else f"{self.dropin_path} removed (there was none before)"
        )
        m.step_done(Phase.WRITE_DROPIN, self.clock())
        report.emit()
        await self._daemon_reload()
        m.step_done(Phase.DAEMON_RELOAD, self.clock())
        report.emit()
        after = await self.running_argv()
        events = await self._restart_guarded(m, report)
        out = await self._finish(m, report, None, None, events, target=expect_pool, store=None)
        out.diff = _argv_diff(before, after)
        return out


def _short(reason: str, limit: int = 160) -> str:
    """A reason cut for the one-line summary (a CUDA OOM message runs to 600 characters)."""
    reason = " ".join(reason.split()).rstrip(".")
    return reason if len(reason) <= limit else reason[: limit - 1].rstrip() + "…"


def _argv_diff(before: list[str], after: list[str]) -> list[str]:
    """A plain word diff for the rollback (no profile to read the flags with)."""
    if before == after:
        return []
    return [f"- {' '.join(before)}", f"+ {' '.join(after)}"]


class _Reporter:
    """Sends an ApplyProgress when the phase changes (or a message comes with it)."""

    def __init__(
        self, m: RestartMachine, clock: Callable[[], float], callback: Callable[[ApplyProgress], None] | None
    ) -> None:
        self.m = m
        self.clock = clock
        self.callback = callback
        self._last: Phase | None = None

    def emit(self, message: str | None = None) -> None:
        phase = self.m.phase
        if self.callback is None or (phase == self._last and message is None):
            return
        self._last = phase
        now = self.clock()
        self.callback(
            ApplyProgress(
                phase=phase.value,
                label=PHASE_LABELS[phase],
                message=message,
                elapsed_s=round(self.m.elapsed(now), 3),
                durations={str(k): round(v, 3) for k, v in self.m.durations(now).items()},
                eta_s=None if (eta := self.m.eta(now)) is None else round(eta, 1),
                purpose=self.m.purpose,
            )
        )
