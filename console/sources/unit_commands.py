"""The unit on a host, over SSH: its state (`systemctl show`), its ExecStart as an argv, its journal,
daemon-reload and the restart itself. The base of `ServiceController` (sources/service): each layer above
it (the drop-in, the followed restart, apply/restart/rollback) adds what it does, all on one object,
because the commit-confirmed timer (sources/confirm) and the CLI drive these commands on the controller.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from console.core.apply import DEFAULT_MIN_FREE_GIB
from console.core.capacity import DEFAULT_MIN_HEADROOM_GIB
from console.core.link import LINK_WAIT_S, LinkWatch
from console.core.parser import parse_lines
from console.core.restart import PHASE_FACTOR, PHASE_MARGIN_S
from console.core.state import Boot, fold_boots
from console.core.systemd import (
    DROPIN_NAME,
    ExecStartError,
    exec_start_lines,
    manager_gone,
    split_exec_start,
    validate_unit_name,
)
from console.core.text import split_lines
from console.sources.hosts import HostConfig
from console.sources.journal import read_unit_journal
from console.sources.transport import CommandResult, Transport, TransportError

__all__ = ["LinkLost", "ServiceError", "UnitCommands", "UnitInfo"]


class ServiceError(Exception):
    """The apply cannot go on; `str()` is one sentence for the operator. `bad_input` marks what the
    operator must fix (a flag, the hosts file, sudo, the drop-in directory): the host was left as it was."""

    def __init__(self, sentence: str, *, bad_input: bool = False) -> None:
        super().__init__(sentence)
        self.bad_input = bad_input


class LinkLost(ServiceError):
    """The SSH link to the host was lost and did not come back while the change could wait for it."""


class UnitInfo(BaseModel, defer_build=True):
    """`systemctl show` of the unit, the properties the controller reads."""

    load_state: str = ""
    active_state: str = ""
    sub_state: str = ""
    invocation_id: str = ""
    fragment_path: str = ""
    dropin_paths: list[str] = []
    need_daemon_reload: bool = False
    exec_start: str = ""


def _sentence(text: str) -> str:
    text = " ".join(text.split())
    return text if text.endswith((".", "!", "?")) else text + "."


class UnitCommands:
    """The remote commands on the unit, with the settings every layer of the controller reads."""

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
        link_wait_s: float = LINK_WAIT_S,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """`phase_factor` and `phase_margin_s` set each boot phase's deadline from this host's history
        (see `RestartMachine.phase_limit`); `boot_timeout_s` caps the whole boot. `link_wait_s`: how long
        a change with no host-side rollback armed waits for a lost SSH link (console.core.link)."""
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
        self.link_wait_s = link_wait_s
        self.wall_clock = wall_clock
        self.link = LinkWatch(host.name, wait_s=link_wait_s)
        self._say: Callable[[str], None] | None = None
        try:
            self.unit = validate_unit_name(host.unit)
        except ExecStartError as exc:
            raise ServiceError(f"{exc}.", bad_input=True) from None
        self.dropin_dir = f"{host.unit_dir.rstrip('/')}/{self.unit}.d"
        self.dropin_path = f"{self.dropin_dir}/{DROPIN_NAME}"
        self._boots: list[Boot] = []

    # ---- remote commands -----------------------------------------------------------------------

    def _privileged(self, argv: Sequence[str]) -> list[str]:
        return ["sudo", "-n", *argv] if self.host.sudo else list(argv)

    # ---- the link ------------------------------------------------------------------------------

    def _watch_link(self, say: Callable[[str], None] | None) -> None:
        """A change starts: a fresh watch of its link, and where to say what becomes of it."""
        self.link = LinkWatch(self.host.name, wait_s=self.link_wait_s)
        self._say = say

    def _link_seen(self) -> Literal["lost", "back"] | None:
        """Read the transport's state into the link watch; say when the link went or came back."""
        now = self.clock()
        change = self.link.update(self.transport.connection is not None, now, self.wall_clock())
        if change is not None and self._say is not None:
            self._say(
                self.link.lost_sentence(now)
                if change == "lost"
                else self.link.back_sentence(now, self.wall_clock())
            )
        return change

    def _give_up_link(self) -> str:
        """The link stayed lost as long as the change could wait: why it ends. Whatever the change still
        tries on its way out (its audit line, its lock) fails at once rather than waiting again."""
        reason = self.link.give_up(self.clock())
        self.transport.give_up_on_link()
        return reason

    async def _await_link(self) -> bool:
        """True once the link is up (at once when it is); False when the change gives up on it."""
        self._link_seen()
        if not self.link.lost:
            return True
        if self.link.gave_up:
            return False
        deadline = self.link.deadline()
        assert deadline is not None
        remaining = deadline - self.clock()
        if remaining > 0:
            with contextlib.suppress(TransportError, TimeoutError):
                await self.transport.wait_up(remaining)
        self._link_seen()
        if self.link.lost:
            self._give_up_link()
            return False
        return True

    async def _run(
        self,
        argv: Sequence[str],
        *,
        privileged: bool = False,
        input: str | None = None,
        retries: int = 3,
    ) -> CommandResult:
        """Run a command; a dropped connection is waited out and the command retried (every command
        run through here is safe to repeat): `retries` times for a connection that is up again at
        once, and for as long as the link watch lets the change wait for a lost one (`LinkLost` when it
        gives up). sudo's refusals become one sentence."""
        full = self._privileged(argv) if privileged else list(argv)
        attempt = 0
        while True:
            try:
                result = await self.transport.run(full, timeout=self.command_timeout_s, input=input)
                break
            except TransportError as exc:
                if self.link.gave_up:
                    raise LinkLost(_sentence(self.link.give_up(self.clock()))) from None
                self._link_seen()
                if not self.link.lost:
                    attempt += 1
                    if attempt > retries:
                        raise ServiceError(_sentence(str(exc))) from None
                    with contextlib.suppress(TransportError, TimeoutError):
                        await self.transport.wait_up(self.command_timeout_s)
                    continue
                if not await self._await_link():
                    raise LinkLost(_sentence(self.link.give_up(self.clock()))) from None
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
            self._raise_if_manager_gone(result)
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

    async def _daemon_reload(self) -> None:
        result = await self._run(["systemctl", "daemon-reload"], privileged=True)
        if not result.ok:
            raise ServiceError(
                f"systemctl daemon-reload failed on {self.host.name}: {result.first_error_line()}."
            )

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

    def _raise_if_manager_gone(self, result: CommandResult) -> None:
        """systemctl could not reach the service manager: one sentence naming that, not the command."""
        gone = manager_gone(result.stderr + "\n" + result.stdout)
        if gone is not None:
            raise ServiceError(
                f"the service manager on {self.host.name} is gone (systemctl: {gone.rstrip('.')})."
            )

    async def probe_manager(self) -> str | None:
        """Whether the host's service manager still answers, asked once with a short timeout: the
        sentence naming it gone, else None (an answer, or no answer at all: the link is another
        matter)."""
        if self.transport.connection is None:
            return None  # no link now: not a question for the manager, and no waiting for the link here
        try:
            result = await self.transport.run(
                ["systemctl", "show", "-p", "ActiveState", self.unit],
                timeout=min(5.0, self.command_timeout_s),
            )
        except TransportError:
            return None
        if result.ok:
            return None
        gone = manager_gone(result.stderr + "\n" + result.stdout)
        return (
            None
            if gone is None
            else f"the service manager on {self.host.name} is gone (systemctl: {gone.rstrip('.')})"
        )

    async def _restart(self, before: str) -> None:
        """`systemctl restart --no-block`; after a dropped connection, only again if it did not happen."""
        argv = self._privileged(["systemctl", "restart", "--no-block", self.unit])
        for attempt in range(4):
            try:
                result = await self.transport.run(argv, timeout=self.command_timeout_s)
            except TransportError as exc:
                if not await self._await_link():
                    raise LinkLost(_sentence(self.link.give_up(self.clock()))) from None
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
                self._raise_if_manager_gone(result)
                raise ServiceError(
                    f"systemctl restart {self.unit} failed on {self.host.name}: {result.first_error_line()}."
                )
            return
