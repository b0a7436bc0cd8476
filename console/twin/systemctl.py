"""`systemctl` for a twin host: start, stop, restart, status, is-active, is-failed, show, cat, daemon-reload.

Output and exit codes follow systemd 252 (Debian 12): `is-active` prints the state and exits 3 unless
active; a unit changed on disk keeps its loaded command until `daemon-reload` and commands warn about it;
`show -p ExecStart` prints systemd's `{ path=... ; argv[]=... ; ... }` record of the loaded command.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from console.twin import timers
from console.twin.journal import JournalClient
from console.twin.layout import TwinLayout
from console.twin.unitload import ServiceConfig
from console.twin.units import ServiceManager, UnitState, normalize_unit, pid_alive

EXIT_NOT_ACTIVE = 3
EXIT_NO_UNIT = 4
EXIT_NOT_LOADED = 5


class _Usage(Exception):
    pass


def _ts(us: int) -> str:
    if not us:
        return "n/a"
    return datetime.fromtimestamp(us / 1e6).astimezone().strftime("%a %Y-%m-%d %H:%M:%S %Z")


def _ago(us: int) -> str:
    delta = max(0.0, time.time() - us / 1e6)
    if delta < 1:
        return f"{int(delta * 1000)}ms ago"
    secs = int(delta)
    days, rest = divmod(secs, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days} day{'s' if days > 1 else ''} {hours}h ago"
    if hours:
        return f"{hours}h {minutes}min ago"
    if minutes:
        return f"{minutes}min {seconds}s ago" if seconds else f"{minutes}min ago"
    return f"{seconds}s ago"


class Systemctl:
    def __init__(self, layout: TwinLayout) -> None:
        self.layout = layout
        self.cfg = layout.load_config()
        self.mgr = ServiceManager(layout, self.cfg)
        self.quiet = False
        self.no_block = False
        self.value_only = False
        self.properties: list[str] = []
        self.lines = 10

    # --- helpers ---------------------------------------------------------------------------------

    def warn_reload(self, svc: ServiceConfig) -> None:
        if svc.load_state != "not-found" and self.mgr.need_daemon_reload(svc):
            sys.stderr.write(
                f"Warning: The unit file, source configuration file or drop-ins of {svc.name} changed on "
                "disk. Run 'systemctl daemon-reload' to reload units.\n"
            )

    def wait_job(self, name: str, done: set[str], previous_invocation: str, timeout: float) -> UnitState:
        deadline = time.monotonic() + timeout
        while True:
            st = self.mgr.state(name)
            if st.invocation_id != previous_invocation and st.active_state in done:
                return st
            if time.monotonic() > deadline:
                return st
            time.sleep(0.01)

    def spawn_supervisor(self, name: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = self.cfg.pythonpath
        subprocess.Popen(
            [self.cfg.python, "-m", "console.twin.supervisor", str(self.layout.root), name],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,
            env=env,
            cwd="/",
        )

    # --- jobs ------------------------------------------------------------------------------------

    def start(self, name: str, verb: str = "start") -> int:
        svc = self.mgr.loaded(name)
        if svc.load_state == "not-found":
            sys.stderr.write(f"Failed to {verb} {name}: Unit {name} not found.\n")
            return EXIT_NOT_LOADED
        if svc.load_state != "loaded":
            sys.stderr.write(f"Failed to {verb} {name}: Unit {name} has a bad unit file setting.\n")
            sys.stderr.write(f"See system logs and 'systemctl status {name}' for details.\n")
            return 1
        st = self.mgr.state(name)
        if st.active_state in ("active", "activating"):
            return 0
        before = st.invocation_id
        self.spawn_supervisor(name)
        if self.no_block:
            self.wait_job(name, {"activating", "active", "failed", "inactive"}, before, 10)
            return 0
        timeout = svc.timeout_start_sec + 10 if svc.timeout_start_sec != float("inf") else 1e9
        st = self.wait_job(name, {"active", "failed", "inactive"}, before, timeout)
        if st.active_state != "active":
            # systemctl's wording per service result (src/systemctl/systemctl-util.c, 252).
            reason = {
                "exit-code": "the control process exited with error code",
                "signal": "a fatal signal was delivered to the control process",
                "core-dump": "a fatal signal was delivered causing the control process to dump core",
                "timeout": "a timeout was exceeded",
            }.get(st.result, "the service did not take the steps required by its unit configuration")
            sys.stderr.write(
                f"Job for {name} failed because {reason}.\n"
                f'See "systemctl status {name}" and "journalctl -xeu {name}" for details.\n'
            )
            return 1
        return 0

    def stop(self, name: str) -> int:
        svc = self.mgr.loaded(name)
        st = self.mgr.state(name)
        if svc.load_state == "not-found" and st.active_state in ("inactive", "failed"):
            sys.stderr.write(f"Failed to stop {name}: Unit {name} not loaded.\n")
            return EXIT_NOT_LOADED
        if st.active_state not in ("active", "activating", "deactivating"):
            return 0
        try:
            os.kill(st.supervisor_pid, 15)
        except ProcessLookupError:
            return 0
        deadline = time.monotonic() + svc.timeout_stop_sec + 10
        while pid_alive(st.supervisor_pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        return 0

    def run_job(self, verb: str, names: list[str]) -> int:
        if not names:
            raise _Usage("Too few arguments.")
        rc = 0
        for raw in names:
            if raw.endswith(".timer"):
                # Transient timers (systemd-run --on-active): stopping one is all the console does.
                if verb == "stop":
                    timers.stop(self.layout, raw.removesuffix(".timer"))
                    continue
                sys.stderr.write(f"Failed to {verb} {raw}: this host's systemctl only stops timers.\n")
                rc = rc or 1
                continue
            name = normalize_unit(raw)
            svc = self.mgr.loaded(name)
            self.warn_reload(svc)
            with self.mgr.lock(name):
                if verb == "start":
                    r = self.start(name)
                elif verb == "stop":
                    r = self.stop(name)
                else:
                    if svc.load_state == "not-found":
                        sys.stderr.write(f"Failed to {verb} {name}: Unit {name} not found.\n")
                        r = EXIT_NOT_LOADED
                    else:
                        r = self.stop(name) or self.start(name, verb)
            rc = rc or r
        return rc

    def daemon_reload(self) -> int:
        self.mgr.daemon_reload()
        JournalClient(self.layout).send(
            {
                "MESSAGE": "Reloading.",
                "PRIORITY": "6",
                "SYSLOG_FACILITY": "3",
                "SYSLOG_IDENTIFIER": "systemd",
                "_PID": "1",
                "_UID": "0",
                "_GID": "0",
                "_COMM": "systemd",
                "_TRANSPORT": "journal",
                "_SYSTEMD_CGROUP": "/init.scope",
                "_SYSTEMD_UNIT": "init.scope",
            },
            wait=True,
        )
        return 0

    # --- queries ---------------------------------------------------------------------------------

    def is_active(self, names: list[str]) -> int:
        rc = EXIT_NOT_ACTIVE
        all_active = True
        for raw in names:
            if raw.endswith(".timer"):
                state = "active" if timers.read(self.layout, raw.removesuffix(".timer")) else "inactive"
            else:
                state = self.mgr.state(normalize_unit(raw)).active_state
            if not self.quiet:
                print(state)
            all_active = all_active and state == "active"
        if names and all_active:
            rc = 0
        return rc

    def is_failed(self, names: list[str]) -> int:
        any_failed = False
        for raw in names:
            st = self.mgr.state(normalize_unit(raw))
            if not self.quiet:
                print(st.active_state)
            any_failed = any_failed or st.active_state == "failed"
        return 0 if any_failed else 1

    def exec_record(self, svc: ServiceConfig, st: UnitState) -> str:
        if not svc.exec_start:
            return ""
        cmd = svc.exec_start[0]
        running = st.main_pid and st.active_state in ("active", "activating", "deactivating")
        ran = bool(st.exec_main_start_us) and st.argv == list(cmd.argv)
        if ran:
            code = "(null)" if running else (st.exec_main_code or "(null)")
            status = "0/0" if running else str(st.exec_main_status)
            times = f"start_time=[{_ts(st.exec_main_start_us)}] ; stop_time=[{_ts(st.exec_main_exit_us)}] ; pid={st.exec_main_pid}"
        else:
            code, status = "(null)", "0/0"
            times = "start_time=[n/a] ; stop_time=[n/a] ; pid=0"
        ignore = "yes" if cmd.ignore_failure else "no"
        return (
            f"{{ path={cmd.path} ; argv[]={' '.join(cmd.argv)} ; ignore_errors={ignore} ; {times} ; "
            f"code={code} ; status={status} }}"
        )

    def all_properties(self, name: str) -> dict[str, str]:
        svc = self.mgr.loaded(name)
        st = self.mgr.state(name)
        running = st.active_state in ("active", "activating", "deactivating")
        return {
            "Type": svc.service_type,
            "Result": st.result,
            "MainPID": str(st.main_pid if running else 0),
            "ControlPID": str(st.control_pid if running else 0),
            "ExecMainStartTimestamp": _ts(st.exec_main_start_us) if st.exec_main_start_us else "",
            "ExecMainExitTimestamp": _ts(st.exec_main_exit_us) if st.exec_main_exit_us else "",
            "ExecMainPID": str(st.exec_main_pid),
            "ExecMainCode": "1"
            if st.exec_main_code == "exited"
            else "2"
            if st.exec_main_code == "killed"
            else "0",
            "ExecMainStatus": str(st.exec_main_status),
            "ExecStart": self.exec_record(svc, st),
            "Environment": " ".join(f"{k}={v}" for k, v in svc.environment.items()),
            "Id": name,
            "Names": name,
            "Description": svc.description or name,
            "LoadState": svc.load_state,
            "ActiveState": st.active_state,
            "SubState": st.sub_state,
            "FragmentPath": svc.fragment_path if svc.load_state != "not-found" else "",
            "DropInPaths": " ".join(svc.dropin_paths),
            "UnitFileState": "enabled" if svc.load_state != "not-found" else "",
            "InvocationID": st.invocation_id if running or st.active_state == "failed" else "",
            "StateChangeTimestamp": _ts(st.state_change_us) if st.state_change_us else "",
            "ActiveEnterTimestamp": _ts(st.active_enter_us) if st.active_enter_us else "",
            "InactiveEnterTimestamp": _ts(st.inactive_enter_us) if st.inactive_enter_us else "",
            "NRestarts": "0",
            "NeedDaemonReload": "yes"
            if svc.load_state != "not-found" and self.mgr.need_daemon_reload(svc)
            else "no",
            "CPUUsageNSec": str(st.cpu_usec * 1000) if st.cpu_usec else "[not set]",
        }

    def show(self, names: list[str]) -> int:
        if not names:
            raise _Usage("show without a unit is not supported by this host")
        first = True
        for raw in names:
            props = self.all_properties(normalize_unit(raw))
            if not first:
                print()
            first = False
            wanted = self.properties or list(props)
            for key in wanted:
                if key not in props:
                    continue
                print(props[key] if self.value_only else f"{key}={props[key]}")
        return 0

    def cat(self, names: list[str]) -> int:
        rc = 0
        for raw in names:
            name = normalize_unit(raw)
            svc = self.mgr.loaded(name)
            disk = self.mgr.load_from_disk(name)
            if disk.load_state == "not-found":
                sys.stderr.write(f"No files found for {name}.\n")
                rc = 1
                continue
            if svc.load_state != "not-found" and self.mgr.need_daemon_reload(svc):
                print(
                    f"# Warning: {name} changed on disk, the version systemd has loaded is outdated.\n"
                    "# This output shows the current version of the unit's original fragment and drop-in files.\n"
                    "# If fragments or drop-ins were added or removed, they are not properly reflected in this output.\n"
                    "# Run 'systemctl daemon-reload' to reload units."
                )
            for i, path in enumerate([disk.fragment_path, *disk.dropin_paths]):
                if i:
                    print()
                print(f"# {path}")
                sys.stdout.write(Path(path).read_text(encoding="utf-8", errors="replace").rstrip("\n") + "\n")
        return rc

    def status(self, names: list[str]) -> int:
        rc = 0
        for idx, raw in enumerate(names):
            name = normalize_unit(raw)
            svc = self.mgr.loaded(name)
            st = self.mgr.state(name)
            if svc.load_state == "not-found" and not st.invocation_id:
                sys.stderr.write(f"Unit {name} could not be found.\n")
                rc = rc or EXIT_NO_UNIT
                continue
            if idx:
                print()
            dot = {"active": "●", "failed": "×", "activating": "●", "deactivating": "●"}.get(
                st.active_state, "○"
            )
            print(f"{dot} {name} - {svc.description or name}")
            if svc.load_state == "loaded":
                print(f"     Loaded: loaded ({svc.fragment_path}; enabled; preset: enabled)")
            else:
                print(f"     Loaded: {svc.load_state} (Reason: Unit {name} has a bad unit file setting.)")
            if svc.dropin_paths:
                print(f"    Drop-In: {Path(svc.dropin_paths[0]).parent}")
                print(f"             └─{', '.join(Path(p).name for p in svc.dropin_paths)}")
            sub = st.sub_state
            if st.active_state == "failed":
                state_text = f"failed (Result: {st.result})"
            else:
                state_text = f"{st.active_state} ({sub})"
            if st.state_change_us:
                print(
                    f"     Active: {state_text} since {_ts(st.state_change_us)}; {_ago(st.state_change_us)}"
                )
            else:
                print(f"     Active: {state_text}")
            running = st.active_state in ("active", "activating", "deactivating")
            if st.exec_main_pid and not running:
                _, _, text = _exit_text(st)
                print(
                    f"    Process: {st.exec_main_pid} ExecStart={' '.join(st.argv)} (code={st.exec_main_code}, {text})"
                )
                print(f"   Main PID: {st.exec_main_pid} (code={st.exec_main_code}, {text})")
            elif running and st.main_pid:
                print(f"   Main PID: {st.main_pid} ({Path(st.exec_path).name[:15]})")
                if st.control_pid:
                    print(f"      Cntrl PID: {st.control_pid}")
                print(f"     CGroup: /system.slice/{name}")
                print(f"             └─{st.main_pid} {' '.join(st.argv)}")
            if st.cpu_usec and not running:
                from console.twin.supervisor import format_cpu

                print(f"        CPU: {format_cpu(st.cpu_usec)}")
            if svc.load_state != "not-found" and self.mgr.need_daemon_reload(svc):
                # On stderr, as systemd 252 prints it (the real manager showed the twin printed it on stdout).
                print(
                    f"Warning: The unit file, source configuration file or drop-ins of {name} changed on disk. "
                    "Run 'systemctl daemon-reload' to reload units.",
                    file=sys.stderr,
                )
            if self.lines > 0:
                journal = subprocess.run(
                    [
                        str(self.layout.bin_dir / "journalctl"),
                        "-u",
                        name,
                        "-n",
                        str(self.lines),
                        "--no-pager",
                        "-q",
                    ],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if journal.stdout.strip():
                    print()
                    sys.stdout.write(journal.stdout)
            if st.active_state != "active":
                rc = rc or EXIT_NOT_ACTIVE
        return rc

    # --- entry -----------------------------------------------------------------------------------

    def main(self, argv: list[str]) -> int:
        words: list[str] = []
        it = iter(argv)
        for arg in it:
            if arg == "--":
                # The end of the options, as in systemctl(1): every word after it is a verb or a unit.
                words.extend(it)
                break
            if arg in ("-p", "--property", "-P"):
                value = next(it, None)
                if value is None:
                    raise _Usage(f"option '{arg}' requires an argument")
                self.properties.extend(value.split(","))
                self.value_only = self.value_only or arg == "-P"
            elif arg.startswith("--property="):
                self.properties.extend(arg.split("=", 1)[1].split(","))
            elif arg.startswith("-p") and len(arg) > 2:
                self.properties.extend(arg[2:].split(","))
            elif arg == "--value":
                self.value_only = True
            elif arg in ("-q", "--quiet"):
                self.quiet = True
            elif arg == "--no-block":
                self.no_block = True
            elif arg in ("-n", "--lines"):
                self.lines = int(next(it, "10"))
            elif arg.startswith("--lines="):
                self.lines = int(arg.split("=", 1)[1])
            elif arg in (
                "--no-pager",
                "--system",
                "-l",
                "--full",
                "--no-legend",
                "--no-ask-password",
                "-a",
                "--all",
            ):
                continue
            elif arg.startswith("-") and arg != "-":
                raise _Usage(f"unrecognized option '{arg}'")
            else:
                words.append(arg)
        if not words:
            raise _Usage(
                "this host's systemctl needs a command (start, stop, restart, status, is-active, ...)"
            )
        verb, names = words[0], words[1:]
        if verb == "try-restart":
            names = [
                n for n in names if self.mgr.state(normalize_unit(n)).active_state in ("active", "activating")
            ]
            return self.run_job("restart", names) if names else 0
        if verb in ("start", "stop", "restart", "reload-or-restart"):
            return self.run_job("restart" if verb == "reload-or-restart" else verb, names)
        if verb == "daemon-reload":
            return self.daemon_reload()
        if verb == "is-active":
            return self.is_active(names)
        if verb == "is-failed":
            return self.is_failed(names)
        if verb == "show":
            return self.show(names)
        if verb == "cat":
            return self.cat(names)
        if verb == "status":
            return self.status(names)
        raise _Usage(f"Unknown command verb '{verb}'.")


def _exit_text(st: UnitState) -> tuple[str, int, str]:
    from console.twin.supervisor import describe_exit

    rc = -st.exec_main_status if st.exec_main_code == "killed" else st.exec_main_status
    return describe_exit(rc)


def main(argv: list[str] | None = None) -> int:
    layout = TwinLayout.from_env()
    try:
        return Systemctl(layout).main(sys.argv[1:] if argv is None else argv)
    except _Usage as exc:
        sys.stderr.write(f"systemctl: {exc}\n")
        return 1
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
