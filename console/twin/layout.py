"""Where a twin host keeps its things, and the settings every stand-in reads (`twin.json`).

A twin is rooted in one state directory; the stand-ins on the twin's PATH receive that directory in
`K26_TWIN_ROOT` (baked into their scripts), so they work from any shell, over SSH or not.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

ROOT_ENV = "K26_TWIN_ROOT"
REAL_JOURNALCTL = "/usr/bin/journalctl"
JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"
# systemd 252's default PATH for services (no /sbin:/bin on a merged-/usr system is added back here so
# that ExecStart names resolve the same on unmerged machines).
# The stand-ins' client (stdlib only: run with `python -I -S`).
STANDIN_CLIENT = Path(__file__).with_name("standin_client.py")
SERVICE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class GpuInventory(BaseModel):
    name: str
    count: int
    total_mib: int


class TwinConfig(BaseModel):
    """The twin's identity and settings, written once by the host, read by every stand-in."""

    name: str
    hostname: str
    unit: str
    scenario: str
    time_scale: float | None = None
    python: str
    pythonpath: str
    boot_id: str
    machine_id: str
    journal: Literal["native", "fallback"]
    systemd: Literal["real", "simulated"] = "simulated"
    """`real`: a real systemd manager in namespaces runs the unit (console.twin.realsd); `simulated`: the
    twin's own systemctl and supervisor do."""
    systemd_version: str | None = None
    sglang_host: str = "127.0.0.1"
    sglang_port: int
    ssh_port: int | None = None
    """The SSH port the twin served last (kept when it is started again on the same state directory)."""
    gpus: GpuInventory
    user: str
    uid: int
    nvml: bool = True
    """The twin's `python3` imports `pynvml` (console.twin.nvml_library), as a real SGLang host's does:
    SGLang requires nvidia-ml-py. False plays a host whose python3 has none (nvidia-smi is then the
    console's way to the GPUs)."""


class TwinLayout:
    """Paths inside a twin's state directory."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    @classmethod
    def from_env(cls) -> TwinLayout:
        root = os.environ.get(ROOT_ENV)
        if not root:
            sys.stderr.write(f"{ROOT_ENV} is not set: this command runs inside a k26 twin host only.\n")
            raise SystemExit(1)
        return cls(Path(root))

    @property
    def config_path(self) -> Path:
        return self.root / "twin.json"

    @property
    def owner_path(self) -> Path:
        """The pid of the process that runs this twin (`k26-console twin`/`demo`, a test); its service
        and journal writer end when it is gone, however it ended (a closed terminal, SIGKILL)."""
        return self.root / "owner.pid"

    @property
    def unit_dir(self) -> Path:
        return self.root / "etc" / "systemd" / "system"

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def pylib_dir(self) -> Path:
        return self.root / "lib" / "python"

    @property
    def nvml_dir(self) -> Path:
        """Where the twin's `python3` finds `pynvml`."""
        return self.root / "lib" / "nvml"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def systemd_dir(self) -> Path:
        return self.run_dir / "systemd"

    @property
    def gpu_dir(self) -> Path:
        """K26_TWIN_STATE_DIR of the simulated server: it writes gpus.json here."""
        return self.root / "gpu"

    @property
    def gpus_json(self) -> Path:
        return self.gpu_dir / "gpus.json"

    @property
    def journal_dir(self) -> Path:
        return self.root / "journal"

    @property
    def fallback_journal(self) -> Path:
        return self.journal_dir / "journal.jsonl"

    @property
    def ssh_dir(self) -> Path:
        return self.root / "ssh"

    @property
    def home_dir(self) -> Path:
        return self.root / "home"

    @property
    def sudo_nopasswd(self) -> Path:
        """While this file exists the twin's `sudo -n` runs commands as a NOPASSWD sudoers rule would;
        without it `sudo -n` answers "a password is required", as a host whose rule wants one."""
        return self.root / "etc" / "sudoers.d" / "k26-nopasswd"

    @property
    def hosts_toml(self) -> Path:
        return self.root / "hosts.toml"

    @property
    def journal_socket(self) -> str:
        """An abstract unix socket: state paths under pytest's tmp dirs overflow sun_path's 108 bytes."""
        digest = hashlib.sha1(str(self.root).encode()).hexdigest()[:20]
        return f"\0k26-twin-journal-{digest}"

    def load_config(self) -> TwinConfig:
        try:
            return TwinConfig.model_validate_json(self.config_path.read_text())
        except FileNotFoundError:
            sys.stderr.write(f"{self.config_path} is missing: the twin host was not set up.\n")
            raise SystemExit(1) from None


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Readers (stand-ins in other processes) never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: object) -> None:
    write_atomic(path, json.dumps(obj, indent=1) + "\n")


# sudo(8) as far as the console uses it: `sudo -n CMD ...`. The twin's session already owns the twin's
# files, so the command runs as is; what the stand-in adds is sudo's refusal when no NOPASSWD rule exists.
SUDO_STANDIN = """interactive=1
while [ $# -gt 0 ]; do
  case $1 in
    -n|--non-interactive) interactive=; shift ;;
    --) shift; break ;;
    -*) echo "sudo: the twin's sudo does not support $1" >&2; exit 1 ;;
    *) break ;;
  esac
done
if [ $# -eq 0 ]; then
  echo "usage: sudo [-n] command [arg ...]" >&2; exit 1
fi
if [ ! -e "$K26_TWIN_ROOT/etc/sudoers.d/k26-nopasswd" ]; then
  if [ -z "$interactive" ]; then echo "sudo: a password is required" >&2; exit 1; fi
  echo "sudo: a terminal is required to read the password; either use the -S option to read from standard input or configure an askpass helper" >&2
  exit 1
fi
exec "$@"
"""


def _enter_manager(layout: TwinLayout, binary: str) -> str:
    """systemd's own program, run in the twin's real manager's namespaces (its private bus socket lives
    in the manager's /run). The pid on record must still be that manager: a reused pid is refused."""
    pid_file = shlex.quote(str(layout.root / "realsd" / "init.pid"))
    return (
        "#!/bin/sh\n# k26 twin stand-in: systemd's own program, inside the twin's real systemd manager.\n"
        f"pid=$(cat {pid_file} 2>/dev/null)\n"
        'if [ -z "$pid" ] || [ "$(cat /proc/$pid/comm 2>/dev/null)" != systemd ]; then\n'
        '  echo "System has not been booted with systemd as init system (PID 1). Can\'t operate." >&2\n'
        '  echo "Failed to connect to bus: Host is down" >&2\n'
        "  exit 1\n"
        "fi\n"
        f'exec nsenter -t "$pid" -m -p -- {binary} "$@"\n'
    )


GPU_TOOLS = ("nvidia-smi", "k26-nvml-agent", "amd-smi")


def gpu_vendor(cfg: TwinConfig) -> str:
    """Whose GPUs the twin's host has, by its scenario's card (`--gpu`): `nvidia` or `amd`."""
    from console.twin.scenarios import get_scenario

    try:
        return get_scenario(cfg.scenario).gpu_vendor
    except KeyError:
        return "nvidia"


def standin_modules(cfg: TwinConfig) -> dict[str, str]:
    """The twin's commands written in Python (name on the twin's PATH -> module with `main(argv)`), all
    served by the twin's stand-in server. An AMD host has amd-smi, and neither nvidia-smi nor NVML."""
    if gpu_vendor(cfg) == "amd":
        tools = {"amd-smi": "console.twin.amd_smi"}
    else:
        tools = {"nvidia-smi": "console.twin.nvidia_smi", "k26-nvml-agent": "console.twin.nvml_agent"}
    if cfg.systemd != "real":
        tools["systemctl"] = "console.twin.systemctl"
        tools["systemd-run"] = "console.twin.systemd_run"
    if cfg.journal != "native" and cfg.systemd != "real":
        tools["journalctl"] = "console.twin.journalctl"
    return tools


def install_standins(layout: TwinLayout, cfg: TwinConfig) -> None:
    """`<root>/bin/{systemctl,nvidia-smi,journalctl,k26-nvml-agent,sudo,python3}`, the `sglang.launch_server`
    shim and `pynvml` (for `python3`, unless the twin plays a host without nvidia-ml-py).

    The shim lets the unit say `python3 -m sglang.launch_server ...` as production units do, so that what
    `systemctl show -p ExecStart` prints cannot tell the twin from a real host.
    """
    layout.bin_dir.mkdir(parents=True, exist_ok=True)
    root_q = shlex.quote(str(layout.root))
    py_q = shlex.quote(cfg.python)
    pypath_q = shlex.quote(cfg.pythonpath)
    header = (
        "#!/bin/sh\n"
        "# k26 twin stand-in: generated, rewritten at every twin start.\n"
        f"{ROOT_ENV}={root_q}\nexport {ROOT_ENV}\n"
        f"PYTHONPATH={pypath_q}${{PYTHONPATH:+:$PYTHONPATH}}\nexport PYTHONPATH\n"
    )
    if cfg.systemd == "real":
        for name, binary in (("systemctl", "/usr/bin/systemctl"), ("systemd-run", "/usr/bin/systemd-run")):
            write_atomic(layout.bin_dir / name, _enter_manager(layout, binary), mode=0o755)
    # Each runs its module in the twin's stand-in server (console.twin.standins): a client of ~10 ms
    # rather than a Python importing the twin's modules (0.14-0.25 s a call).
    client_q = shlex.quote(str(STANDIN_CLIENT))
    modules = standin_modules(cfg)
    for name in GPU_TOOLS:
        if name not in modules:
            (layout.bin_dir / name).unlink(missing_ok=True)  # a state directory that played the other vendor
    for name, module in modules.items():
        write_atomic(
            layout.bin_dir / name, header + f'exec {py_q} -I -S {client_q} {module} "$@"\n', mode=0o755
        )
    if cfg.journal == "native" or cfg.systemd == "real":
        journalctl = (
            "#!/bin/sh\n# k26 twin stand-in: the real journalctl over the twin's journal files.\n"
            f'exec {REAL_JOURNALCTL} --directory={shlex.quote(str(layout.journal_dir))} "$@"\n'
        )
        write_atomic(layout.bin_dir / "journalctl", journalctl, mode=0o755)
    write_atomic(layout.bin_dir / "sudo", header + SUDO_STANDIN, mode=0o755)
    python3, pynvml = layout.bin_dir / "python3", layout.nvml_dir / "pynvml.py"
    if cfg.nvml and gpu_vendor(cfg) == "nvidia":
        # The python SGLang runs on, with nvidia-ml-py: the console's GPU agent runs `python3 -c ...`.
        nvml_q = shlex.quote(str(layout.nvml_dir))
        write_atomic(python3, header + f'PYTHONPATH={nvml_q}:$PYTHONPATH\nexec {py_q} "$@"\n', mode=0o755)
        write_atomic(
            pynvml, '"""k26 twin: nvidia-ml-py."""\nfrom console.twin.nvml_library import *  # noqa: F403\n'
        )
    else:
        python3.unlink(missing_ok=True)
        pynvml.unlink(missing_ok=True)
    if not layout.sudo_nopasswd.parent.is_dir():
        layout.sudo_nopasswd.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(layout.sudo_nopasswd, "# present: this twin's user may sudo without a password\n")

    pkg = layout.pylib_dir / "sglang"
    write_atomic(pkg / "__init__.py", '"""k26 twin: stands in for the sglang package."""\n')
    write_atomic(
        pkg / "launch_server.py",
        '"""k26 twin: `python -m sglang.launch_server` runs the simulated server."""\n'
        "import runpy\n\n"
        'runpy.run_module("console.twin.sglang_server", run_name="__main__", alter_sys=True)\n',
    )
