"""A twin host: state directory, unit file, stand-ins, journal writer, SSH endpoint and the running service.

    async with TwinHost(state_dir, time_scale=0.01) as twin:
        print(twin.ssh_command())          # ssh -i ... -p ... -o UserKnownHostsFile=... user@127.0.0.1
        rc, out, err = await twin.sh("systemctl is-active sglang-k26-ddtree")

or, without an event loop of one's own, `twin = TwinHost(...); twin.start_sync(); ...; twin.stop_sync()`.
`stop` stops the service (its supervisor and the server's process group), the journal writer and the SSH
server; nothing the twin started outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from console.twin.host_files import hosts_toml_text, known_hosts_line, unit_text, write_keys
from console.twin.layout import (
    JOURNAL_REMOTE,
    REAL_JOURNALCTL,
    GpuInventory,
    TwinConfig,
    TwinLayout,
    install_standins,
    standin_modules,
    write_atomic,
)
from console.twin.realsd import RealManager, RealSystemdError, systemd_version, why_unavailable
from console.twin.sglang_tree import install_hf_cache, install_sglang_tree
from console.twin.ssh_server import TwinSSHServer
from console.twin.standins import StandinServer
from console.twin.units import ServiceManager, pid_alive

DEFAULT_UNIT = "sglang-k26-ddtree"
DEFAULT_SCENARIO = "kimi-k26-rtx6000"
REPO_ROOT = Path(__file__).resolve().parents[2]


class TwinError(Exception):
    """A twin cannot be set up as asked (unknown scenario, port taken); one sentence for the operator."""


def gpu_inventory(scenario: str) -> GpuInventory:
    try:
        from console.twin.scenarios import get_scenario
    except ImportError as exc:
        raise TwinError(
            "the simulated server's scenarios (console.twin.scenarios) are not installed"
        ) from exc
    try:
        sc = get_scenario(scenario)
    except (KeyError, ValueError, LookupError) as exc:
        raise TwinError(f"unknown twin scenario '{scenario}'") from exc
    return GpuInventory(name=sc.gpu_name, count=sc.gpu_count, total_mib=sc.gpu_total_mib)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]  # (host, port) for AF_INET, typed Any by the socket module
        return port


def machine_boot_id() -> str:
    # Entries need this machine's boot ID or `journalctl -f` finds no current boot.
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")


def native_journal_available() -> bool:
    return os.access(JOURNAL_REMOTE, os.X_OK) and os.access(REAL_JOURNALCTL, os.X_OK)


class TwinHost:
    def __init__(
        self,
        state_dir: Path | str,
        *,
        name: str = "twin",
        scenario: str = DEFAULT_SCENARIO,
        time_scale: float | None = None,
        ssh_host: str = "127.0.0.1",
        ssh_port: int = 0,
        ssh: bool = True,
        unit: str = DEFAULT_UNIT,
        journal: Literal["auto", "native", "fallback"] = "auto",
        server_command: list[str] | None = None,
        extra_environment: Mapping[str, str] | None = None,
        start_service: bool = True,
        wait_ready: bool = True,
        gpus: GpuInventory | None = None,
        systemd: Literal["auto", "real", "simulated"] = "auto",
        nvml: bool = True,
    ) -> None:
        """`server_command` replaces `python -m sglang.launch_server` (tests use a small fake server);
        `wait_ready=False` leaves out the ExecStartPost= readiness wait; `ssh=False` serves no SSH (a
        test serving the twin through the real sshd uses `session_env()` instead); `gpus` overrides the
        scenario's GPU inventory (for a fake server that has no scenario); `systemd` chooses a real
        systemd manager in namespaces (`auto`: where this machine allows one) or the simulated one.
        `K26_TWIN_SYSTEMD=real|simulated` in the environment overrides `auto`. `nvml=False` plays a host
        whose python3 has no nvidia-ml-py (the console then reads the GPUs with nvidia-smi)."""
        self.nvml = nvml
        self.gpus = gpus
        self.systemd_mode = systemd
        self.systemd_note: str | None = None
        self._manager: RealManager | None = None
        self.layout = TwinLayout(Path(state_dir))
        self.name = name
        self.scenario = scenario
        self.time_scale = time_scale
        self.ssh_host = ssh_host
        self.ssh_port = ssh_port
        self.serve_ssh = ssh
        self.unit = unit if unit.endswith(".service") else f"{unit}.service"
        self.journal_mode = journal
        self.server_command = server_command
        self.extra_environment = dict(extra_environment or {})
        self.start_service = start_service
        self.wait_ready = wait_ready
        self.cfg: TwinConfig | None = None
        self._journal_proc: subprocess.Popen[bytes] | None = None
        self._standins = StandinServer(self.layout)
        self._ssh: TwinSSHServer | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- paths and facts -------------------------------------------------------------------------

    @property
    def unit_name(self) -> str:
        return self.unit.removesuffix(".service")

    @property
    def client_key(self) -> Path:
        return self.layout.ssh_dir / "client_ed25519"

    @property
    def host_key(self) -> Path:
        return self.layout.ssh_dir / "host_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.layout.ssh_dir / "known_hosts"

    @property
    def hosts_toml(self) -> Path:
        return self.layout.hosts_toml

    @property
    def user(self) -> str:
        return getpass.getuser()

    @property
    def hf_home(self) -> Path:
        """The unit's HF_HOME: the Hugging Face cache that holds the served model's config.json."""
        return self.layout.root / "hf"

    @property
    def sglang_url(self) -> str:
        assert self.cfg is not None
        return f"http://{self.cfg.sglang_host}:{self.cfg.sglang_port}"

    def session_env(self) -> dict[str, str]:
        """The environment of a login on this twin: stand-ins first on PATH, a clean HOME."""
        home = str(self.layout.home_dir)
        return {
            "PATH": f"{self.layout.bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": home,
            "USER": self.user,
            "LOGNAME": self.user,
            "SHELL": "/bin/bash",
            "LANG": "C.UTF-8",
            "K26_TWIN_ROOT": str(self.layout.root),
        }

    def ssh_command(self) -> str:
        port = f" -p {self.ssh_port}" if self.ssh_port != 22 else ""
        return (
            f"ssh -i {self.client_key}{port} -o UserKnownHostsFile={self.known_hosts} "
            f"-o IdentitiesOnly=yes {self.user}@{self.ssh_host}"
        )

    # --- setup -----------------------------------------------------------------------------------

    def _journal_choice(self) -> Literal["native", "fallback"]:
        if self.journal_mode == "fallback":
            return "fallback"
        if native_journal_available():
            return "native"
        if self.journal_mode == "native":
            raise TwinError(f"a native journal needs {JOURNAL_REMOTE} and {REAL_JOURNALCTL}")
        sys.stderr.write(
            "k26 twin: systemd-journal-remote or journalctl is missing (Debian packages "
            "systemd-journal-remote, systemd); the twin keeps its own journal and serves it through its "
            "journalctl stand-in.\n"
        )
        return "fallback"

    def _systemd_choice(self) -> tuple[Literal["real", "simulated"], str | None]:
        mode = self.systemd_mode
        if mode == "auto":
            forced = os.environ.get("K26_TWIN_SYSTEMD", "")
            if forced in ("real", "simulated"):
                mode = forced  # type: ignore[assignment]
        if mode == "simulated":
            return "simulated", None
        why = why_unavailable()
        if why is None:
            return "real", systemd_version()
        if mode == "real":
            raise TwinError(f"a real systemd manager cannot run here: {why}")
        self.systemd_note = f"a real systemd manager cannot run here ({why}); the twin simulates systemd"
        return "simulated", None

    @property
    def systemd_description(self) -> str:
        """What runs the unit, for the operator: `systemd: real (systemd 252)` or `systemd: simulated`."""
        cfg = self.cfg
        if cfg is not None and cfg.systemd == "real":
            return f"systemd: real (systemd {cfg.systemd_version or 'unknown'})"
        return "systemd: simulated"

    def prepare(self) -> TwinConfig:
        """Create or refresh the state directory; idempotent, keys are kept across runs."""
        lay = self.layout
        for d in (
            lay.root,
            lay.unit_dir,
            lay.bin_dir,
            lay.run_dir,
            lay.gpu_dir,
            lay.journal_dir,
            lay.ssh_dir,
            lay.home_dir,
        ):
            d.mkdir(parents=True, exist_ok=True)
        lay.ssh_dir.chmod(0o700)
        inventory = self.gpus or gpu_inventory(self.scenario)
        previous = None
        with contextlib.suppress(Exception):
            previous = TwinConfig.model_validate_json(lay.config_path.read_text())
        self._refuse_if_owned()
        if previous is not None:
            # The console's drop-ins pin the port the unit had (`--port` in their ExecStart=): a twin
            # restarted on its state dir keeps it. A crashed twin's server may still be letting it go.
            sglang_port = previous.sglang_port
            if not _wait_port_free(sglang_port, 10.0):
                raise TwinError(
                    f"port {sglang_port} on 127.0.0.1, which this twin's unit and drop-ins name, is in use "
                    "by another process"
                )
            if self.ssh_port == 0 and previous.ssh_port and _port_free(previous.ssh_port):
                self.ssh_port = previous.ssh_port
        else:
            sglang_port = free_port()
        systemd, systemd_ver = self._systemd_choice()
        cfg = TwinConfig(
            name=self.name,
            hostname=previous.hostname if previous else self.name,
            unit=self.unit,
            scenario=self.scenario,
            time_scale=self.time_scale,
            python=sys.executable,
            pythonpath=str(REPO_ROOT),
            boot_id=machine_boot_id(),
            machine_id=previous.machine_id if previous else uuid.uuid4().hex,
            journal="native" if systemd == "real" else self._journal_choice(),
            systemd=systemd,
            systemd_version=systemd_ver,
            sglang_port=sglang_port,
            ssh_port=self.ssh_port or (previous.ssh_port if previous else None),
            gpus=inventory,
            user=self.user,
            uid=os.getuid(),
            nvml=self.nvml,
        )
        write_atomic(lay.config_path, cfg.model_dump_json(indent=1) + "\n")
        write_atomic(lay.owner_path, f"{os.getpid()}\n")
        install_standins(lay, cfg)
        # A real SGLang's files and the model's config.json in the HF cache layout, so that what the
        # console learns about a host (console.sources.hostinfo) it learns here from real files.
        install_sglang_tree(lay.pylib_dir)
        install_hf_cache(self.hf_home)
        self._write_keys()
        self._write_unit(cfg)
        self.cfg = cfg
        return cfg

    def _refuse_if_owned(self) -> None:
        """Two twins on one state directory would share a unit, a journal and ports: refuse the second."""
        try:
            owner = int(self.layout.owner_path.read_text().strip())
        except (OSError, ValueError):
            return
        if owner != os.getpid() and pid_alive(owner):
            raise TwinError(f"the state directory {self.layout.root} is in use by another twin (pid {owner})")

    def _write_keys(self) -> None:
        write_keys(self.layout, self.name, self.host_key, self.client_key)

    def _write_unit(self, cfg: TwinConfig) -> None:
        # The fragment is the twin's "packaged" unit, rewritten at every start so that it names this run's
        # port, scale and server; an operator's changes live in drop-ins, as on a real host.
        command = self.server_command or [cfg.python, "-m", "sglang.launch_server"]
        text = unit_text(
            cfg,
            self.layout,
            command,
            hf_home=self.hf_home,
            extra=self.extra_environment,
            wait_ready=self.wait_ready,
        )
        write_atomic(self.layout.unit_dir / self.unit, text)

    def write_hosts_toml(self) -> None:
        """This twin's entry in the console's hosts-file format (console.sources.hosts)."""
        assert self.cfg is not None
        entry: dict[str, str | int] = {
            "ssh": f"{self.user}@{self.ssh_host}",
            "port": self.ssh_port,
            "user": self.user,
            "unit": self.unit_name,
            "server_url": self.sglang_url,
            "identity_file": str(self.client_key),
            "known_hosts": str(self.known_hosts),
            # The twin's /etc/systemd/system: where `apply` puts its drop-in.
            "unit_dir": str(self.layout.unit_dir),
        }
        heading = f"k26 twin '{self.name}' (scenario {self.scenario}), written by `k26-console twin`."
        write_atomic(self.hosts_toml, hosts_toml_text(self.name, entry, heading))

    def set_ssh_endpoint(self, host: str, port: int) -> None:
        """Record where the twin is reached when something else serves its SSH (the real sshd in
        tests/support/sshd.py, started with this twin's host key, client key and `session_env()`)."""
        self.ssh_host, self.ssh_port = host, port
        self.write_known_hosts(host, port)
        if self.cfg is not None:
            self.write_hosts_toml()

    def write_known_hosts(self, host: str, port: int) -> None:
        write_atomic(self.known_hosts, known_hosts_line(self.host_key, host, port))

    # --- lifecycle -------------------------------------------------------------------------------

    def _start_journal(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(
            [sys.executable, "-m", "console.twin.journal", "serve", str(self.layout.root)],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != b"ready":
            proc.kill()
            proc.wait()
            raise TwinError("the twin's journal writer did not start")
        self._journal_proc = proc

    def _stop_journal(self) -> None:
        proc = self._journal_proc
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        self._journal_proc = None

    def main_pid(self) -> int | None:
        """The unit's main process as this machine numbers it (under the real manager, MainPID is a pid
        of the manager's own namespace), or None when it has none."""
        shown = self.systemctl("show", "-P", "MainPID", self.unit, check=False).stdout.strip()
        pid = int(shown) if shown.isdigit() else 0
        if pid <= 0:
            return None
        if self._manager is not None:
            return self._manager.host_pid(pid)
        return pid

    def manager_pid(self) -> int | None:
        """The PID, as this machine numbers it, of the real systemd manager this twin started (its
        namespace's PID 1); None under the simulated manager or once it is gone. A test that kills the
        host's service manager kills this one, by this PID, and nothing else."""
        return self._manager.init_pid() if self._manager is not None else None

    def systemctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the twin's systemctl locally (what a session would run)."""
        res = subprocess.run(
            [str(self.layout.bin_dir / "systemctl"), *args],
            env=self.session_env(),
            capture_output=True,
            text=True,
            check=False,
        )
        if check and res.returncode != 0:
            raise TwinError(f"systemctl {' '.join(args)} failed: {res.stderr.strip() or res.stdout.strip()}")
        return res

    def start_blocking(self) -> None:
        """Everything but the SSH server (which needs an event loop)."""
        cfg = self.prepare()
        try:
            if not self._standins.start(
                cfg.python, cfg.pythonpath, sorted(set(standin_modules(cfg).values()))
            ):
                raise TwinError("the twin's stand-in server did not start")
            if cfg.systemd == "real":
                self._manager = RealManager(self.layout)
                try:
                    self._manager.start(hostname=cfg.hostname)
                except RealSystemdError as exc:
                    raise TwinError(str(exc)) from None
            else:
                self._start_journal()
                ServiceManager(self.layout, cfg).daemon_reload()
            if self.start_service:
                self.systemctl("start", self.unit)
        except BaseException:
            self.stop_blocking()
            raise

    def _cfg(self) -> TwinConfig:
        assert self.cfg is not None
        return self.cfg

    def stop_blocking(self) -> None:
        if self._manager is not None:
            # Stop the unit first, as a shutdown would, so its last lines reach the journal; then the
            # manager, its namespaces and its cgroup go.
            with contextlib.suppress(subprocess.SubprocessError, OSError, RealSystemdError):
                self._manager.systemctl("stop", self.unit, timeout=120)
            self._manager.stop()
            self._manager = None
            self._standins.stop()
            return
        if self.cfg is not None and self._journal_proc is not None:
            self.systemctl("stop", self.unit, check=False)
            self._reap_units()
        self._stop_journal()
        self._standins.stop()

    def _reap_units(self) -> None:
        """A supervisor that did not end on `systemctl stop` is killed with its service's group."""
        mgr = ServiceManager(self.layout, self._cfg())
        for path in mgr.state_dir.glob("*.json"):
            st = mgr.state(path.stem)
            for pid in (st.main_pid, st.control_pid):
                if pid_alive(pid):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pid, signal.SIGKILL)
            if pid_alive(st.supervisor_pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(st.supervisor_pid, signal.SIGKILL)
                deadline = time.monotonic() + 5
                while pid_alive(st.supervisor_pid) and time.monotonic() < deadline:
                    time.sleep(0.01)

    async def start(self) -> TwinHost:
        if self.serve_ssh:
            # Keys and port first, so hosts.toml and known_hosts name the bound port.
            await asyncio.to_thread(self.prepare)
            self._ssh = TwinSSHServer(
                host=self.ssh_host,
                port=self.ssh_port,
                host_key=self.host_key,
                client_public_key=Path(str(self.client_key) + ".pub"),
                user=self.user,
                env=self.session_env(),
                cwd=self.layout.home_dir,
            )
            try:
                self.ssh_port = await self._ssh.start()
            except OSError as exc:
                raise TwinError(f"cannot listen on {self.ssh_host}:{self.ssh_port}: {exc.strerror}") from exc
            self.write_known_hosts(self.ssh_host, self.ssh_port)
            if self.cfg is not None and self.cfg.ssh_port != self.ssh_port:
                self.cfg.ssh_port = self.ssh_port
                write_atomic(self.layout.config_path, self.cfg.model_dump_json(indent=1) + "\n")
        try:
            await asyncio.to_thread(self.start_blocking)
        except BaseException:
            await self._close_ssh()
            raise
        self.write_hosts_toml()
        return self

    async def _close_ssh(self) -> None:
        if self._ssh is not None:
            await self._ssh.close()
            self._ssh = None

    async def stop(self) -> None:
        await self._close_ssh()
        await asyncio.to_thread(self.stop_blocking)

    async def __aenter__(self) -> TwinHost:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def sh(self, command: str) -> tuple[int, str, str]:
        """Run a command as a session on this twin would, without SSH."""
        proc = await asyncio.create_subprocess_exec(
            "/bin/bash",
            "-c",
            command,
            env=self.session_env(),
            cwd=self.layout.home_dir,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        return proc.returncode or 0, out.decode(), err.decode()

    # --- sync API (a loop in a thread serves SSH) ------------------------------------------------

    def start_sync(self) -> TwinHost:
        failure: list[BaseException] = []
        started = threading.Event()
        self._stop_event: asyncio.Event | None = None

        async def main() -> None:
            self._stop_event = asyncio.Event()
            try:
                await self.start()
            except BaseException as exc:
                failure.append(exc)
                started.set()
                return
            started.set()
            await self._stop_event.wait()
            await self.stop()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(main())
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name=f"k26-twin-{self.name}", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            self._thread.join()
            raise failure[0]
        return self

    def cut_ssh(self) -> None:
        """As a network failure would: close the SSH endpoint and every connection to it; the host (its
        service, systemd, its timers) runs on. `restore_ssh` opens it again on the same port."""
        if self._loop is None or self._ssh is None:
            raise TwinError("the twin serves no SSH of its own (or was not started with start_sync)")
        asyncio.run_coroutine_threadsafe(self._ssh.close(), self._loop).result(30)

    def restore_ssh(self) -> None:
        if self._loop is None or self._ssh is None:
            raise TwinError("the twin serves no SSH of its own (or was not started with start_sync)")
        asyncio.run_coroutine_threadsafe(self._ssh.start(), self._loop).result(30)

    def stop_sync(self) -> None:
        if self._thread is None or self._loop is None or self._stop_event is None:
            return
        self._loop.call_soon_threadsafe(self._stop_event.set)
        self._thread.join()
        self._thread = None


def _wait_port_free(port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not _port_free(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _port_free(port: int) -> bool:
    """Free for a server that listens as servers do (SO_REUSEADDR): the connections a killed server leaves
    in TIME_WAIT for a minute do not count, a listener does."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def remove_state(state_dir: Path) -> None:
    shutil.rmtree(state_dir, ignore_errors=True)
