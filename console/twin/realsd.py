"""A real systemd service manager for the twin, started beside the machine's own PID 1.

systemd runs as PID 1 of fresh pid + mount + uts + cgroup namespaces ("container" mode, system scope),
with the real `systemd-journald`, a curated unit set (targets, slices, journald, the shutdown services)
and the twin's unit directory as its unit path (`SYSTEMD_UNIT_PATH`, so that `FragmentPath` and
`DropInPaths` name the very files the console writes). journald keeps its volatile journal in the twin's
journal directory (bound over `/run/log/journal`), so the host's own `journalctl --directory=...` reads
what the manager and the service wrote, with their real `_SYSTEMD_INVOCATION_ID`.

The twin's `systemctl` and `systemd-run` stand-ins enter the manager's namespaces (`nsenter -m -p`); they
are systemd's own programs, talking to the manager over its private socket.

Nothing outlives the twin: the manager is powered off (SIGRTMIN+4) on stop, killed with its whole pid
namespace if that takes too long, and its cgroup is emptied and removed. A watchdog process does the same
when the twin's owner dies without stopping it (SIGKILL), and a twin started again on the same state
directory first clears what a crashed one left. The recipe and its measurements:
`shared/reference/real-systemd/` (manager up in 0.08-0.19 s on 2 cores).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from console.twin.layout import TwinLayout, write_atomic

SYSTEMD_BINARIES = ("/usr/lib/systemd/systemd", "/lib/systemd/systemd")
SYSTEM_UNITS = ("/usr/lib/systemd/system", "/lib/systemd/system")
SYSTEMCTL = "/usr/bin/systemctl"
SYSTEMD_RUN = "/usr/bin/systemd-run"
# systemd's poweroff request for a manager running as PID 1 (systemd(1), "Signals").
POWEROFF = signal.SIGRTMIN + 4
# Host-side bookkeeping of one manager, under the twin's state directory.
_DIR = "realsd"

# The namespace's PID 1 is set up by this script, then replaced by systemd. /proc/sys and /sys read-only
# so that the manager cannot change the machine's settings; a tmpfs /run; the generators silenced; the
# console device is a file; /dev/kmsg is /dev/null (the kernel log is the machine's, not ours).
_INNER = r"""
set -e
S=$1 JOURNAL=$2 UNIT_PATH=$3 SYSTEMD=$4 NAME=$5
hostname "$NAME"
# systemd sets the hostname from /etc/hostname at boot: the twin's name, not the machine's.
printf '%s\n' "$NAME" > "$S/hostname"
[ -f /etc/hostname ] && mount --bind "$S/hostname" /etc/hostname
mount --make-rprivate /
mount --bind /proc/sys /proc/sys; mount -o remount,bind,ro /proc/sys
mount -o remount,bind,ro /sys
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/systemd/journald.conf.d /run/log/journal
printf '[Journal]\nStorage=volatile\nReadKMsg=no\nForwardToSyslog=no\nForwardToWall=no\nForwardToConsole=no\nRateLimitIntervalSec=0\nRuntimeMaxUse=256M\n' >/run/systemd/journald.conf.d/k26-twin.conf
mount --bind "$JOURNAL" /run/log/journal
for g in /usr/lib/systemd/system-generators /lib/systemd/system-generators /etc/systemd/system-generators; do
  [ -d "$g" ] && mount -t tmpfs tmpfs "$g"
done
mount --bind "$S/console" /dev/console
mount --bind /dev/null /dev/kmsg
exec env -i container=k26-twin SYSTEMD_UNIT_PATH="$UNIT_PATH" PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$SYSTEMD" --show-status=no --log-target=journal-or-kmsg
"""


class RealSystemdError(Exception):
    """The real manager cannot be started or stopped; one sentence."""


def _systemd_binary() -> str | None:
    return next((p for p in SYSTEMD_BINARIES if os.access(p, os.X_OK)), None)


def cgroup2_root() -> Path | None:
    """Where the machine mounts the unified (v2) cgroup hierarchy: /sys/fs/cgroup/unified on a hybrid
    layout, /sys/fs/cgroup on a pure cgroup2 one."""
    found: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().split("\n"):
            parts = line.split()
            if len(parts) >= 3:
                found[parts[1]] = parts[2]
    for path in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        if found.get(path) == "cgroup2":
            return Path(path)
    return None


def why_unavailable() -> str | None:
    """None where a real manager can run here; else why not, in a few words."""
    if os.geteuid() != 0:
        return "it needs root (mount, pid and cgroup namespaces)"
    if not sys.platform.startswith("linux"):
        return "it needs Linux"
    if _systemd_binary() is None:
        return "systemd is not installed (Debian package systemd)"
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (Debian package util-linux)"
    if not os.access(SYSTEMCTL, os.X_OK):
        return f"{SYSTEMCTL} is missing"
    for ns in ("pid", "mnt", "uts", "cgroup"):
        if not Path(f"/proc/self/ns/{ns}").exists():
            return f"the kernel has no {ns} namespaces"
    root = cgroup2_root()
    if root is None:
        return "no cgroup2 hierarchy is mounted"
    if not os.access(root, os.W_OK):
        return f"{root} is not writable"
    return None


def systemd_version() -> str:
    """'252' from `systemctl --version` ("systemd 252 (252.39-1~deb12u2)")."""
    try:
        out = subprocess.run([SYSTEMCTL, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    first = out.split("\n", 1)[0].split()
    return first[1] if len(first) >= 2 and first[0] == "systemd" else "unknown"


def _curated_units(dest: Path) -> None:
    """Targets and slices (without their .wants), journald and the shutdown services: nothing else
    boots, so the manager is up in a tenth of a second and touches nothing of the machine's."""
    src = next((Path(p) for p in SYSTEM_UNITS if Path(p, "systemd-journald.service").is_file()), None)
    if src is None:
        raise RealSystemdError("systemd-journald.service is not installed")
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "sockets.target.wants").mkdir(parents=True)
    (dest / "sysinit.target.wants").mkdir(parents=True)
    names = [p.name for p in src.iterdir() if p.suffix in (".target", ".slice")]
    names += [
        "systemd-journald.service",
        "systemd-journald.socket",
        "systemd-journald-dev-log.socket",
        *(f"systemd-{x}.service" for x in ("poweroff", "halt", "reboot", "exit")),
    ]
    for name in names:
        path = src / name
        if path.is_file() and not path.is_symlink():
            shutil.copy2(path, dest / name)
        elif path.is_symlink() and (src / os.readlink(path)).is_file():
            shutil.copy2(src / os.readlink(path), dest / name)
    for sock in ("systemd-journald.socket", "systemd-journald-dev-log.socket"):
        (dest / "sockets.target.wants" / sock).symlink_to(f"../{sock}")
    (dest / "sysinit.target.wants" / "systemd-journald.service").symlink_to("../systemd-journald.service")
    default = dest / "default.target"
    default.unlink(missing_ok=True)
    default.symlink_to("multi-user.target")


class RealManager:
    """One real systemd manager serving one twin (its state directory)."""

    def __init__(self, layout: TwinLayout) -> None:
        self.layout = layout
        self.dir = layout.root / _DIR
        digest = hashlib.sha1(str(layout.root).encode()).hexdigest()[:16]
        root = cgroup2_root() or Path("/sys/fs/cgroup")
        self.cgroup = root / f"k26-twin-{digest}"
        self._outer: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None

    # --- facts -----------------------------------------------------------------------------------

    @property
    def init_pid_path(self) -> Path:
        return self.dir / "init.pid"

    @property
    def units_dir(self) -> Path:
        return self.dir / "units"

    def init_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            pid = int(self.init_pid_path.read_text().strip())
            if _is_manager(pid):
                return pid
        return None

    def host_pid(self, ns_pid: int) -> int | None:
        """The machine's pid of the process the manager knows as `ns_pid` (what `systemctl show -P MainPID`
        prints is a pid of the manager's namespace: signalling that number here would hit another
        process). Read from /proc/PID/status `NSpid:` of the processes in the manager's pid namespace."""
        init = self.init_pid()
        if init is None or ns_pid <= 0:
            return None
        try:
            ns = os.readlink(f"/proc/{init}/ns/pid")
        except OSError:
            return None
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") != ns:
                    continue
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            for line in status.split("\n"):
                if line.startswith("NSpid:"):
                    ids = line.split()[1:]
                    if len(ids) >= 2 and int(ids[-1]) == ns_pid:
                        return int(ids[0])
        return None

    def enter(self) -> list[str]:
        pid = self.init_pid()
        if pid is None:
            raise RealSystemdError("the twin's systemd manager is not running")
        return ["nsenter", "-t", str(pid), "-m", "-p", "--"]

    def systemctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.enter(), SYSTEMCTL, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self, *, hostname: str = "twin", timeout_s: float = 30.0) -> float:
        """Start the manager and wait until it runs; returns the seconds it took."""
        self.clear_leftovers()
        self.dir.mkdir(parents=True, exist_ok=True)
        _curated_units(self.units_dir)
        (self.dir / "console").write_bytes(b"")
        self.layout.journal_dir.mkdir(parents=True, exist_ok=True)
        self.cgroup.mkdir(exist_ok=True)
        systemd = _systemd_binary()
        assert systemd is not None
        # The twin's units first (the admin's /etc/systemd/system), then the transient units that
        # systemd-run makes, then the curated system units.
        unit_path = ":".join([str(self.layout.unit_dir), "/run/systemd/transient", str(self.units_dir)])
        script = (
            f"echo $$ > {shlex.quote(str(self.cgroup / 'cgroup.procs'))} && exec unshare --pid --fork "
            "--kill-child=SIGKILL --mount --mount-proc --uts --cgroup --propagation private "
            f'bash -c "$0" k26-realsd "$@"'
        )
        t0 = time.monotonic()
        log = (self.dir / "unshare.log").open("wb")
        try:
            self._outer = subprocess.Popen(
                [
                    "sh",
                    "-c",
                    script,
                    _INNER,
                    str(self.dir),
                    str(self.layout.journal_dir),
                    unit_path,
                    systemd,
                    hostname,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        deadline = t0 + timeout_s
        pid = None
        while pid is None:
            pid = self._child_manager(self._outer.pid)
            if pid is None:
                if self._outer.poll() is not None or time.monotonic() > deadline:
                    self._fail("did not start")
                time.sleep(0.01)
        write_atomic(self.init_pid_path, f"{pid}\n")
        self._start_watchdog()
        state = ""
        while time.monotonic() < deadline:
            res = self.systemctl("is-system-running", timeout=10)
            state = res.stdout.strip()
            if state in ("running", "degraded"):
                break
            if self._outer.poll() is not None:
                break
            time.sleep(0.02)
        if state not in ("running", "degraded"):
            self._fail(f"did not come up (state {state or 'unknown'})")
        return time.monotonic() - t0

    def _fail(self, what: str) -> None:
        log = ""
        with contextlib.suppress(OSError):
            log = (self.dir / "unshare.log").read_text(errors="replace").strip().split("\n")[-1]
        self.stop()
        raise RealSystemdError(f"the real systemd manager {what}" + (f": {log}" if log else ""))

    @staticmethod
    def _child_manager(outer: int) -> int | None:
        """unshare's forked child once it has become systemd (PID 1 of the new namespace)."""
        with contextlib.suppress(OSError, ValueError):
            for child in Path(f"/proc/{outer}/task/{outer}/children").read_text().split():
                if _is_manager(int(child)):
                    return int(child)
        return None

    def _start_watchdog(self) -> None:
        owner = os.getpid()
        with contextlib.suppress(OSError, ValueError):
            owner = int(self.layout.owner_path.read_text().strip())
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "console.twin.realsd", "watch", str(self.layout.root), str(owner)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

    def stop(self, *, grace_s: float = 10.0) -> None:
        """Power the manager off (its units stop as on a real shutdown), kill what is left, remove the
        cgroup. Safe to call twice, and on a manager that a crashed twin left."""
        pid = self.init_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, POWEROFF)
            if not _wait_gone(pid, grace_s):
                # SIGKILL of a namespace's PID 1 kills every process of the namespace.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                _wait_gone(pid, 5)
        if self._outer is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._outer.wait(5)
            if self._outer.poll() is None:
                self._outer.kill()
                self._outer.wait()
            self._outer = None
        self._remove_cgroup()
        self.init_pid_path.unlink(missing_ok=True)
        if self._watchdog is not None:
            if self._watchdog.poll() is None:
                self._watchdog.kill()
            self._watchdog.wait()
            self._watchdog = None

    def clear_leftovers(self) -> None:
        """What a twin killed on this state directory left: its manager and cgroup."""
        self.stop(grace_s=3.0)

    def _remove_cgroup(self) -> None:
        cg = self.cgroup
        if not cg.is_dir():
            return
        if not _wait_unpopulated(cg, 3.0):
            with contextlib.suppress(OSError):
                (cg / "cgroup.kill").write_text("1")
            _wait_unpopulated(cg, 5.0)
        for sub in sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                sub.rmdir()
        with contextlib.suppress(OSError):
            cg.rmdir()


def _is_manager(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "systemd"
    except OSError:
        return False


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _is_manager(pid):
            return True
        time.sleep(0.02)
    return not _is_manager(pid)


def _wait_unpopulated(cg: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if "populated 0" in (cg / "cgroup.events").read_text():
                return True
        except OSError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def _watch(root: Path, owner: int) -> None:
    """Tear the manager down as soon as the owner dies; end quietly when the manager ends first."""
    layout = TwinLayout(root)
    manager = RealManager(layout)
    init = manager.init_pid()
    if init is None:
        return
    fds = []
    for pid in (owner, init):
        try:
            fds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            manager.stop(grace_s=3.0)
            return
    try:
        ready, _, _ = select.select(fds, [], [])
        if fds[0] in ready:
            manager.stop(grace_s=3.0)
    finally:
        for fd in fds:
            os.close(fd)


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "watch":
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        _watch(Path(argv[1]), int(argv[2]))
        return 0
    sys.stderr.write("usage: python -m console.twin.realsd watch STATE_DIR OWNER_PID\n")
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
