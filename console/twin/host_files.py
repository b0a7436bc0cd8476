"""The files a twin writes for itself: its SSH keys, its unit file (the "packaged" fragment; an operator's
changes live in drop-ins, as on a real host), its entry in the console's hosts file and its known_hosts line.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import asyncssh
import tomlkit

from console.twin.layout import TwinConfig, TwinLayout, write_atomic
from console.twin.unitfile import render_environment, render_exec

DESCRIPTION = "SGLang Kimi K2.6"

# The incident's first flags (TP 8, f=0.85, 64 running requests, 200k context).
INITIAL_FLAGS = (
    "--model-path",
    "moonshotai/Kimi-K2.6",
    "--tp-size",
    "8",
    "--mem-fraction-static",
    "0.85",
    "--max-running-requests",
    "64",
    "--context-length",
    "200000",
    "--chunked-prefill-size",
    "8192",
)


def health_wait_script(host: str, port: int) -> str:
    """ExecStartPost=: `systemctl start` returns once /health answers 200, as a production unit that waits
    for readiness does. Plain bash (/dev/tcp), so a fresh machine needs no curl.

    It gives up when the main process is gone ($MAINPID): systemd does not end an ExecStartPost= when the
    main process dies, it waits for it until TimeoutStartSec= (the real manager showed it: a server killed
    by its CUDA OOM left the unit "activating (start-post)" for the whole 900 s)."""
    return (
        "until { printf 'GET /health HTTP/1.0\\r\\nHost: %s\\r\\n\\r\\n' "
        f'"{host}" >&3 && IFS= read -r line <&3 && [[ $line == *" 200 "* ]]; }} '
        f"2>/dev/null 3<>/dev/tcp/{host}/{port}; do "
        'if [ -n "$MAINPID" ] && ! kill -0 "$MAINPID" 2>/dev/null; then exit 1; fi; sleep 0.2; done'
    )


def write_keys(layout: TwinLayout, name: str, host_key: Path, client_key: Path) -> None:
    """The host key and the client key (made once, kept across starts) and the client's authorized_keys."""
    for path in (host_key, client_key):
        if not path.exists():
            key = asyncssh.generate_private_key("ssh-ed25519", comment=f"k26-twin-{name}")
            key.write_private_key(str(path))
            key.write_public_key(str(path) + ".pub")
            path.chmod(0o600)
    write_atomic(layout.ssh_dir / "authorized_keys", Path(str(client_key) + ".pub").read_text(), 0o600)


def unit_text(
    cfg: TwinConfig,
    layout: TwinLayout,
    command: list[str],
    *,
    hf_home: Path,
    extra: Mapping[str, str],
    wait_ready: bool,
) -> str:
    """The unit file that runs `command` with the incident's first flags on this run's port and scale."""
    argv = [
        *command,
        *INITIAL_FLAGS,
        "--host",
        cfg.sglang_host,
        "--port",
        str(cfg.sglang_port),
        "--enable-metrics",
    ]
    env = {
        "PYTHONPATH": f"{layout.pylib_dir}:{cfg.pythonpath}",
        "PYTHONUNBUFFERED": "1",
        "K26_TWIN_SCENARIO": cfg.scenario,
        "K26_TWIN_STATE_DIR": str(layout.gpu_dir),
        "HF_HOME": str(hf_home),
    }
    if cfg.time_scale is not None:
        env["K26_TWIN_TIME_SCALE"] = repr(cfg.time_scale)
    env.update(extra)
    lines = [
        "[Unit]",
        f"Description={DESCRIPTION}",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"Environment={render_environment(env)}",
        f"WorkingDirectory={layout.home_dir}".replace("%", "%%"),
        f"ExecStart={render_exec(argv)}",
    ]
    if wait_ready:
        script = health_wait_script(cfg.sglang_host, cfg.sglang_port)
        lines.append(f"ExecStartPost={render_exec(['/bin/bash', '-c', script])}")
    lines += [
        "TimeoutStartSec=900",
        "TimeoutStopSec=90",
        "KillSignal=SIGTERM",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)


def hosts_toml_text(name: str, entry: Mapping[str, str | int], heading: str) -> str:
    """One host's table in the console's hosts-file format (console.sources.hosts), under a comment."""
    doc = tomlkit.document()
    doc.add(tomlkit.comment(heading))
    hosts = tomlkit.table(is_super_table=True)
    table = tomlkit.table()
    for key, value in entry.items():
        table[key] = value
    hosts[name] = table
    doc["hosts"] = hosts
    return tomlkit.dumps(doc)


def known_hosts_line(host_key: Path, host: str, port: int) -> str:
    pub = Path(str(host_key) + ".pub").read_text().split()
    who = host if port == 22 else f"[{host}]:{port}"
    return f"{who} {pub[0]} {pub[1]}\n"
