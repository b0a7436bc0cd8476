"""What PID 1 does for one started service: `python -m console.twin.supervisor ROOT UNIT`.

Started detached by the `systemctl` stand-in, it runs the loaded ExecStartPre=/ExecStart=/ExecStartPost=
commands in their own process group, pipes their output into the journal with the fields journald gives a
service's stdout, logs systemd's own lines about the unit (Starting/Started/Stopping/Stopped, exit status,
result, CPU time) and keeps the unit's state file. SIGTERM means `systemctl stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path

from console.twin.journal import JournalClient
from console.twin.layout import SERVICE_PATH, TwinLayout
from console.twin.unitfile import ExecCommand
from console.twin.unitload import ServiceConfig
from console.twin.units import EXIT_STATUS_NAMES, MESSAGE_IDS, ServiceManager, stop_when_owner_gone

_CLEAN_SIGNALS = {signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE}


def now_us() -> int:
    return time.time_ns() // 1000


def format_cpu(usec: int) -> str:
    """format_timespan(..., USEC_PER_MSEC) as in `Consumed 7min 38.455s CPU time.`"""
    ms = max(usec // 1000, 1)
    parts = []
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    if hours:
        parts.append(f"{hours}h")
    if minutes:
        parts.append(f"{minutes}min")
    secs, msec = divmod(rest, 1000)
    if secs or not parts:
        parts.append(f"{secs}.{msec:03d}s" if msec else f"{secs}s")
    elif msec:
        parts.append(f"{msec}ms")
    return " ".join(parts)


def describe_exit(returncode: int) -> tuple[str, int, str]:
    """(code, status, `status=...` text) the way systemd words a process exit."""
    if returncode < 0:
        sig = signal.Signals(-returncode)
        return "killed", -returncode, f"status={-returncode}/{sig.name.removeprefix('SIG')}"
    name = EXIT_STATUS_NAMES.get(returncode)
    return "exited", returncode, f"status={returncode}/{name}" if name else f"status={returncode}"


class Supervisor:
    def __init__(self, layout: TwinLayout, unit: str) -> None:
        self.layout = layout
        self.cfg = layout.load_config()
        self.unit = unit
        self.manager = ServiceManager(layout, self.cfg)
        self.svc: ServiceConfig = self.manager.loaded(unit)
        self.journal = JournalClient(layout)
        self.state = self.manager.state(unit)
        self.invocation = uuid.uuid4().hex
        self.stop_requested = asyncio.Event()
        self.description = self.svc.description or unit
        self.cpu_usec = 0

    # --- journal ---------------------------------------------------------------------------------

    def systemd_line(self, message: str, kind: str | None = None, priority: int = 6, **extra: str) -> None:
        fields = {
            "MESSAGE": message,
            "PRIORITY": str(priority),
            "SYSLOG_FACILITY": "3",
            "SYSLOG_IDENTIFIER": "systemd",
            "_PID": "1",
            "_UID": "0",
            "_GID": "0",
            "_COMM": "systemd",
            "_EXE": "/usr/lib/systemd/systemd",
            "_CMDLINE": "/sbin/init",
            "_TRANSPORT": "journal",
            "_SYSTEMD_CGROUP": "/init.scope",
            "_SYSTEMD_UNIT": "init.scope",
            "_SYSTEMD_SLICE": "-.slice",
            "UNIT": self.unit,
            "INVOCATION_ID": self.invocation,
        }
        if kind:
            fields["MESSAGE_ID"] = MESSAGE_IDS[kind]
        fields.update(extra)
        self.journal.send(fields, wait=True)

    def output_line(self, line: str, pid: int, path: str, argv: list[str], stream_id: str) -> None:
        comm = Path(path).name[:15]
        self.journal.send(
            {
                "MESSAGE": line,
                "PRIORITY": "6",
                "SYSLOG_FACILITY": "3",
                "SYSLOG_IDENTIFIER": self.svc.syslog_identifier or Path(path).name,
                "_PID": str(pid),
                "_UID": str(os.getuid()),
                "_GID": str(os.getgid()),
                "_COMM": comm,
                "_EXE": os.path.realpath(path),
                "_CMDLINE": " ".join(argv),
                "_TRANSPORT": "stdout",
                "_STREAM_ID": stream_id,
                "_SYSTEMD_CGROUP": f"/system.slice/{self.unit}",
                "_SYSTEMD_UNIT": self.unit,
                "_SYSTEMD_SLICE": "system.slice",
                "_SYSTEMD_INVOCATION_ID": self.invocation,
            }
        )

    # --- state -----------------------------------------------------------------------------------

    def set_state(self, active: str, sub: str, **changes: object) -> None:
        st = self.state
        ts = now_us()
        if active != st.active_state:
            if active == "active":
                st.active_enter_us = ts
            if active in ("inactive", "failed"):
                st.inactive_enter_us = ts
        st.active_state, st.sub_state, st.state_change_us = active, sub, ts
        for k, v in changes.items():
            setattr(st, k, v)
        self.manager.save_state(self.unit, st)

    # --- processes -------------------------------------------------------------------------------

    def environment(self) -> dict[str, str]:
        env = {
            "PATH": SERVICE_PATH,
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "INVOCATION_ID": self.invocation,
            "SYSTEMD_EXEC_PID": "0",
        }
        env.update(self.svc.environment)
        return env

    async def spawn(self, cmd: ExecCommand, env: dict[str, str]) -> asyncio.subprocess.Process | None:
        argv = cmd.expanded_argv(env)
        path = cmd.path if cmd.path.startswith("/") else shutil.which(cmd.path, path=SERVICE_PATH)
        if not path or not os.access(path, os.X_OK):
            self.systemd_line(
                f"{self.unit}: Failed to locate executable {cmd.path}: No such file or directory", priority=3
            )
            self.systemd_line(
                f"{self.unit}: Failed at step EXEC spawning {cmd.path}: No such file or directory", priority=3
            )
            return None
        proc = await asyncio.create_subprocess_exec(
            argv[0] if argv else path,
            *argv[1:],
            executable=path,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            cwd=self.svc.working_directory or "/",
            start_new_session=True,
            limit=1 << 20,
        )
        stream_id = uuid.uuid4().hex
        assert proc.stdout is not None
        proc_argv = [path, *argv[1:]]
        reader = asyncio.ensure_future(self.pump(proc.stdout, proc.pid, path, proc_argv, stream_id))
        proc._k26_reader = reader  # type: ignore[attr-defined]
        return proc

    async def pump(
        self, stream: asyncio.StreamReader, pid: int, path: str, argv: list[str], stream_id: str
    ) -> None:
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line longer than the limit: journald splits it too
                raw = await stream.read(1 << 20)
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.output_line(line, pid, path, argv, stream_id)

    async def wait_exit(self, proc: asyncio.subprocess.Process) -> int:
        rc = await proc.wait()
        reader = getattr(proc, "_k26_reader", None)
        if reader is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    await reader
        # Whatever the service left in its process group goes with it (KillMode=control-group).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu_usec = int((usage.ru_utime + usage.ru_stime) * 1e6)
        return rc

    def kill(self, proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    async def run_control(
        self, cmd: ExecCommand, env: dict[str, str], main: asyncio.subprocess.Process | None
    ) -> str:
        """Run an ExecStartPre=/Post= command; returns "" on success or the failing result."""
        proc = await self.spawn(cmd, env)
        if proc is None:
            return "" if cmd.ignore_failure else "exit-code"
        self.set_state(self.state.active_state, self.state.sub_state, control_pid=proc.pid)
        waits = {
            asyncio.ensure_future(self.wait_exit(proc)),
            asyncio.ensure_future(self.stop_requested.wait()),
        }
        main_wait = None
        if main is not None:
            main_wait = asyncio.ensure_future(main.wait())
            waits.add(main_wait)
        _done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        # The main process's end comes first in the journal even when the control process (which
        # watches $MAINPID) ended in the same turn, as systemd logs them.
        main_exited = main_wait is not None and main_wait.done() and not self.stop_requested.is_set()
        if main_exited:
            # systemd does not end an ExecStartPost= whose main process died: it logs the main exit and
            # waits for the control process (until TimeoutStartSec=, which the caller enforces). The real
            # manager showed this; the twin used to kill the control process at once.
            assert main is not None
            self.log_main_exit(main.returncode)
            if proc.returncode is None:
                waits = {w for w in waits if w is not main_wait}
                _done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            if t is not main_wait:
                t.cancel()
        if main_wait is not None and not main_wait.done():
            main_wait.cancel()
        rc = proc.returncode
        if rc is None:
            self.kill(proc, signal.SIGTERM)
            await self.wait_exit(proc)
            self.set_state(self.state.active_state, self.state.sub_state, control_pid=0)
            return "stopped" if self.stop_requested.is_set() else "main-exited"
        self.set_state(self.state.active_state, self.state.sub_state, control_pid=0)
        if (rc == 0 or cmd.ignore_failure) and not main_exited:
            return ""
        if rc != 0:
            code, _, text = describe_exit(rc)
            self.systemd_line(
                f"{self.unit}: Control process exited, code={code}, {text}", "process_exit", priority=5
            )
        if main_exited:
            return "main-exited"
        return "exit-code" if code == "exited" else "signal"

    async def stop_main(self, main: asyncio.subprocess.Process) -> int:
        sig = getattr(signal, self.svc.kill_signal, signal.SIGTERM)
        self.kill(main, sig)
        try:
            async with asyncio.timeout(self.svc.timeout_stop_sec):
                return await self.wait_exit(main)
        except TimeoutError:
            self.systemd_line(f"{self.unit}: State 'stop-sigterm' timed out. Killing.", priority=4)
            self.systemd_line(
                f"{self.unit}: Killing process {main.pid} ({Path(self.state.exec_path).name}) with signal SIGKILL.",
                priority=4,
            )
            self.kill(main, signal.SIGKILL)
            return await self.wait_exit(main)

    def log_main_exit(self, rc: int | None) -> None:
        """ "Main process exited, ..." for an unclean exit, once (a start-post may log it first)."""
        if rc is None or getattr(self, "_main_exit_logged", False):
            return
        code, _status, text = describe_exit(rc)
        if rc == 0 or (rc < 0 and signal.Signals(-rc) in _CLEAN_SIGNALS):
            return
        self._main_exit_logged = True
        self.systemd_line(
            f"{self.unit}: Main process exited, code={code}, {text}",
            "process_exit",
            priority=5 if code == "exited" else 4,
        )

    def finish(self, rc: int | None, result: str, *, stopping: bool, starting: bool) -> None:
        """systemd's lines when the main process is gone, and the final state."""
        code = ""
        status = 0
        if rc is not None:
            code, status, _text = describe_exit(rc)
            clean = rc == 0 or (rc < 0 and signal.Signals(-rc) in _CLEAN_SIGNALS)
            if not clean:
                self.log_main_exit(rc)
                if not result:
                    result = "exit-code" if code == "exited" else "signal"
        failed = bool(result)
        if failed:
            self.systemd_line(f"{self.unit}: Failed with result '{result}'.", "result", priority=4)
            if starting:
                self.systemd_line(
                    f"Failed to start {self.unit} - {self.description}.",
                    "failed",
                    priority=3,
                    JOB_TYPE="start",
                    JOB_RESULT="failed",
                )
        else:
            self.systemd_line(f"{self.unit}: Deactivated successfully.", "success")
        if stopping:
            self.systemd_line(
                f"Stopped {self.unit} - {self.description}.", "stopped", JOB_TYPE="stop", JOB_RESULT="done"
            )
        if self.cpu_usec:
            self.systemd_line(
                f"{self.unit}: Consumed {format_cpu(self.cpu_usec)} CPU time.",
                "resources",
                CPU_USAGE_NSEC=str(self.cpu_usec * 1000),
            )
        self.set_state(
            "failed" if failed else "inactive",
            "failed" if failed else "dead",
            result=result or "success",
            main_pid=0,
            control_pid=0,
            exec_main_code=code,
            exec_main_status=status,
            exec_main_exit_us=now_us() if rc is not None else 0,
            cpu_usec=self.cpu_usec,
        )

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stop_requested.set)
        loop.add_signal_handler(signal.SIGINT, self.stop_requested.set)
        watchdog = asyncio.ensure_future(stop_when_owner_gone(self.layout, self.stop_requested.set))
        try:
            return await self._run()
        finally:
            watchdog.cancel()

    async def _run(self) -> int:
        env = self.environment()
        main_cmd = self.svc.exec_start[0]
        self.set_state(
            "activating",
            "start-pre" if self.svc.exec_start_pre else "start",
            supervisor_pid=os.getpid(),
            invocation_id=self.invocation,
            result="success",
            main_pid=0,
            control_pid=0,
            argv=list(main_cmd.argv),
            exec_path=main_cmd.path,
            exec_main_code="",
            exec_main_status=0,
            exec_main_exit_us=0,
            cpu_usec=0,
        )
        if self.svc.exec_start_pre or self.svc.exec_start_post or self.svc.service_type != "simple":
            # systemd logs "Starting" only for a unit with an activating phase: a Type=simple unit with
            # no ExecStartPre=/Post= goes from inactive to active in one step and logs "Started" alone
            # (job.c; seen on the real manager).
            self.systemd_line(f"Starting {self.unit} - {self.description}...", "starting", JOB_TYPE="start")
        for cmd in self.svc.exec_start_pre:
            result = await self.run_control(cmd, env, None)
            if result:
                return self.end_without_main(result)
        main = await self.spawn(main_cmd, env)
        if main is None:
            self.systemd_line(
                f"{self.unit}: Main process exited, code=exited, status=203/EXEC", "process_exit", priority=5
            )
            self.finish(None, "exit-code", stopping=False, starting=True)
            return 0
        started = now_us()
        self.set_state(
            "activating",
            "start-post" if self.svc.exec_start_post else "running",
            main_pid=main.pid,
            exec_main_pid=main.pid,
            exec_main_start_us=started,
        )
        for cmd in self.svc.exec_start_post:
            try:
                async with asyncio.timeout(self.svc.timeout_start_sec):
                    # systemd passes the main process's pid to ExecStartPost= as $MAINPID.
                    result = await self.run_control(cmd, {**env, "MAINPID": str(main.pid)}, main)
            except TimeoutError:
                self.systemd_line(f"{self.unit}: start-post operation timed out. Terminating.", priority=4)
                result = "timeout"
            if result == "main-exited":
                rc = await self.wait_exit(main)
                self.finish(rc, "", stopping=False, starting=True)
                return 0
            if result == "stopped":
                return await self.stop(main, starting=True)
            if result:
                self.set_state("deactivating", "stop-sigterm")
                rc = await self.stop_main(main)
                self.finish(rc, result, stopping=False, starting=True)
                return 0
        self.set_state("active", "running")
        self.systemd_line(
            f"Started {self.unit} - {self.description}.", "started", JOB_TYPE="start", JOB_RESULT="done"
        )
        exit_wait = asyncio.ensure_future(self.wait_exit(main))
        stop_wait = asyncio.ensure_future(self.stop_requested.wait())
        await asyncio.wait({exit_wait, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if exit_wait.done():
            stop_wait.cancel()
            self.finish(exit_wait.result(), "", stopping=False, starting=False)
            return 0
        exit_wait.cancel()
        return await self.stop(main, starting=False)

    async def stop(self, main: asyncio.subprocess.Process, *, starting: bool) -> int:
        self.set_state("deactivating", "stop-sigterm")
        self.systemd_line(f"Stopping {self.unit} - {self.description}...", "stopping", JOB_TYPE="stop")
        rc = await self.stop_main(main)
        self.finish(rc, "", stopping=True, starting=False)
        return 0

    def end_without_main(self, result: str) -> int:
        self.finish(None, result, stopping=False, starting=True)
        return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: python -m console.twin.supervisor ROOT UNIT\n")
        return 2
    sup = Supervisor(TwinLayout(Path(args[0])), args[1])
    try:
        return asyncio.run(sup.run())
    finally:
        sup.journal.close()


if __name__ == "__main__":
    raise SystemExit(main())
