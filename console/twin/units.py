"""The twin service manager's state: what `daemon-reload` loaded, and each unit's runtime state.

Both live under `<root>/run/systemd/` as JSON written atomically; the supervisor of a running unit is the
only writer of that unit's runtime state, `systemctl` only reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import getpass
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, TypeAdapter

from console.twin.layout import TwinConfig, TwinLayout, write_atomic
from console.twin.unitfile import specifier_table
from console.twin.unitload import ServiceConfig, fingerprint, load_service, unit_files

_SERVICE = TypeAdapter(ServiceConfig)

# systemd's exit status names (systemd.exec(5) "Process Exit Codes") for the codes a service produces.
EXIT_STATUS_NAMES = {
    0: "SUCCESS",
    1: "FAILURE",
    2: "INVALIDARGUMENT",
    3: "NOTIMPLEMENTED",
    4: "NOPERMISSION",
    5: "NOTINSTALLED",
    6: "NOTCONFIGURED",
    7: "NOTRUNNING",
    200: "CHDIR",
    203: "EXEC",
}

MESSAGE_IDS = {
    "starting": "7d4958e842da4a758f6c1cdc7b36dcc5",
    "started": "39f53479d3a045ac8e11786248231fbf",
    "failed": "be02cf6855d2428ba40df7e9d022f03d",
    "stopping": "de5b426a63be47a7b6ac3eaac82e2f6f",
    "stopped": "9d1aaa27d60140bd96365438aad20286",
    "success": "7ad2d189f7e94e70a38c781354912448",
    "result": "d9b373ed55a64feb8242e02dbe79a49c",
    "process_exit": "98e322203f7a4ed290d09fe03c09fe15",
    "resources": "ae8f7b866b0347b9af31fe1c80b127c0",
}


class UnitState(BaseModel):
    """Runtime state of one unit (systemd's ActiveState/SubState/Result and the main process)."""

    active_state: str = "inactive"
    sub_state: str = "dead"
    result: str = "success"
    main_pid: int = 0
    control_pid: int = 0
    supervisor_pid: int = 0
    invocation_id: str = ""
    argv: list[str] = []
    exec_path: str = ""
    exec_main_pid: int = 0
    exec_main_code: str = ""
    exec_main_status: int = 0
    exec_main_start_us: int = 0
    exec_main_exit_us: int = 0
    state_change_us: int = 0
    active_enter_us: int = 0
    inactive_enter_us: int = 0
    cpu_usec: int = 0


def normalize_unit(name: str) -> str:
    return name if "." in name else f"{name}.service"


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes; its parent has not reaped it yet.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


class ServiceManager:
    """Loaded unit configurations and unit state files of one twin."""

    def __init__(self, layout: TwinLayout, cfg: TwinConfig) -> None:
        self.layout = layout
        self.cfg = cfg
        self.loaded_dir = layout.systemd_dir / "loaded"
        self.state_dir = layout.systemd_dir / "units"

    def _table(self, name: str, fragment: str) -> dict[str, str]:
        return specifier_table(
            name,
            fragment,
            hostname=self.cfg.hostname,
            machine_id=self.cfg.machine_id,
            boot_id=self.cfg.boot_id,
            user=self.cfg.user or getpass.getuser(),
            uid=self.cfg.uid,
            home=str(self.layout.home_dir),
        )

    def load_from_disk(self, name: str) -> ServiceConfig:
        return load_service(self.layout.unit_dir, name, self._table)

    def daemon_reload(self) -> None:
        names = {p.name for p in self.layout.unit_dir.glob("*.service")}
        names |= {p.stem for p in self.loaded_dir.glob("*.json")}
        for name in sorted(names):
            self.save_loaded(self.load_from_disk(name))

    def save_loaded(self, svc: ServiceConfig) -> None:
        write_atomic(self.loaded_dir / f"{svc.name}.json", _SERVICE.dump_json(svc, indent=1))

    def loaded(self, name: str) -> ServiceConfig:
        """The configuration systemd has in memory: loaded on first use, then only by daemon-reload."""
        path = self.loaded_dir / f"{name}.json"
        try:
            return _SERVICE.validate_json(path.read_bytes())
        except FileNotFoundError:
            svc = self.load_from_disk(name)
            if svc.load_state != "not-found":
                self.save_loaded(svc)
            return svc

    def need_daemon_reload(self, svc: ServiceConfig) -> bool:
        fragment, dropins = unit_files(self.layout.unit_dir, svc.name)
        now = fingerprint([fragment, *dropins, fragment.parent / f"{svc.name}.d"])
        return [tuple(x) for x in now] != [tuple(x) for x in svc.fingerprint]

    def state(self, name: str) -> UnitState:
        try:
            st = UnitState.model_validate_json((self.state_dir / f"{name}.json").read_bytes())
        except FileNotFoundError:
            return UnitState()
        if st.active_state in ("active", "activating", "deactivating") and not pid_alive(st.supervisor_pid):
            # The supervisor died without recording an end (killed): systemd would see the cgroup empty.
            st.active_state, st.sub_state, st.result = "failed", "failed", "signal"
        return st

    def save_state(self, name: str, st: UnitState) -> None:
        write_atomic(self.state_dir / f"{name}.json", st.model_dump_json(indent=1))

    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """One job at a time per unit, as systemd's job queue does."""
        path = self.layout.systemd_dir / f"{name}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


def owner_alive(layout: TwinLayout) -> bool:
    """False once the twin's owning process has gone; True when there is none on record."""
    if not layout.root.is_dir():
        return False  # the owner removed the whole twin (a demo's temporary directory)
    try:
        pid = int(layout.owner_path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return True
    return pid_alive(pid)


async def stop_when_owner_gone(layout: TwinLayout, stop: Callable[[], None], interval_s: float = 1.0) -> None:
    """Call `stop` once the owner is gone, so an owner killed without cleanup leaves no process behind."""
    while owner_alive(layout):
        await asyncio.sleep(interval_s)
    stop()
