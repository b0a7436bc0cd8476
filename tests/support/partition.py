"""What the partition tests share (tests/test_partition_*.py): a twin whose boots take a few seconds, the
black-holing proxy in front of its SSH (tests/support/blackhole.py), the operator's hosts file and ssh
config reaching the twin through it, and `apply --json` run as a process whose lines are timed.

The operator's ssh config (ServerAliveInterval 1, ServerAliveCountMax 1) makes the keepalives notice the
silence in ~2 s instead of ~20 s: what the console does with it is the same. The twin runs under the REAL
systemd manager where this machine allows one (else the simulated one).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from console.core.confirm import PENDING_FILE, rollback_unit
from console.twin.host import TwinHost
from console.twin.host_files import known_hosts_line
from console.twin.realsd import why_unavailable
from tests.support.blackhole import BlackHole
from tests.support.cli import CLI, operator_env, slow_boots

__all__ = ["Apply", "argv_of", "hole", "operator", "serving", "settled", "state_dir", "twin"]

TIME_SCALE = 0.002
SLOW = 0.02
"""The applies' boots at this scale (a few seconds): the partition lands inside the phase it aims at."""
MODE = "real" if why_unavailable() is None else "simulated"


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwinHost]:
    host = TwinHost(tmp_path_factory.mktemp("partition-twin") / "state", time_scale=TIME_SCALE, systemd=MODE)
    host.start_sync()
    try:
        slow_boots(host, SLOW)
        host.systemctl("daemon-reload")
        host.systemctl("restart", host.unit)
        yield host
    finally:
        host.stop_sync()


@pytest.fixture(scope="module")
def hole(twin: TwinHost) -> Iterator[BlackHole]:
    with BlackHole(("127.0.0.1", twin.ssh_port)) as proxy:
        yield proxy


def state_dir(twin: TwinHost) -> Path:
    return twin.layout.home_dir / ".k26-console"


def argv_of(twin: TwinHost) -> str:
    out = twin.systemctl("show", "-p", "ExecStart", twin.unit).stdout
    return out.split("; argv[]=", 1)[1].split(" ;", 1)[0]


def settled(twin: TwinHost) -> bool:
    timer = twin.systemctl("is-active", f"{rollback_unit(twin.unit)}.timer", check=False).stdout.strip()
    return (
        not (state_dir(twin) / PENDING_FILE).exists()
        and not list(state_dir(twin).glob(".pending-rollback.fired.*"))
        and timer not in ("active", "activating")
        and not (state_dir(twin) / "lock").exists()
        and twin.systemctl("is-active", twin.unit, check=False).stdout.strip() == "active"
    )


def serving(twin: TwinHost) -> bool:
    """The twin's server answers /health (on loopback, as the host itself sees it): a boot is ready."""
    try:
        with urllib.request.urlopen(f"{twin.sglang_url}/health", timeout=1) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def operator(twin: TwinHost, hole: BlackHole, home: Path) -> tuple[Path, dict[str, str]]:
    """The operator's hosts file reaching the twin through the proxy, and an environment whose ssh config
    sends a keepalive after 1 s of silence and gives up after one unanswered."""
    known = home / "known_hosts"
    known.write_text(known_hosts_line(twin.host_key, "127.0.0.1", hole.port))
    text = twin.hosts_toml.read_text()
    text = re.sub(r"(?m)^port = \d+$", f"port = {hole.port}", text)
    text = re.sub(r'(?m)^known_hosts = ".*"$', f'known_hosts = "{known}"', text)
    assert f"port = {hole.port}" in text and str(known) in text, text
    hosts = home / "hosts.toml"
    hosts.write_text(text)
    (home / "home" / ".ssh").mkdir(parents=True)
    (home / "home" / ".ssh" / "config").write_text(
        "Host *\n  ServerAliveInterval 1\n  ServerAliveCountMax 1\n"
    )
    return hosts, {**operator_env(home), "HOME": str(home / "home")}


class Apply:
    """`apply PROFILE --json` in a process of its own; its lines as they come, with when they came."""

    def __init__(self, hosts: Path, env: dict[str, str], profile: Path, confirm_within: int) -> None:
        self.proc = subprocess.Popen(
            [
                *CLI,
                "apply",
                "twin",
                str(profile),
                "--yes",
                "--json",
                "--hosts",
                str(hosts),
                "--confirm-within",
                str(confirm_within),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.docs: list[tuple[float, dict[str, object]]] = []
        self.ended = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip():
                self.docs.append((time.monotonic(), json.loads(line)))
        self.ended.set()

    def reached(self, phase: str, timeout: float) -> float:
        """When the apply reported `phase` first."""
        return self._wait(lambda doc: doc.get("phase") == phase, phase, timeout)

    def saying(self, words: str, timeout: float) -> float:
        """When the apply first said `words` in a progress message."""
        return self._wait(lambda doc: words in str(doc.get("message") or ""), words, timeout)

    def _wait(self, match: Callable[[dict[str, object]], bool], what: str, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, doc in list(self.docs):
                if doc.get("type") == "progress" and doc.get("purpose") == "apply" and match(doc):
                    return at
            assert not self.ended.is_set(), f"the apply ended before {what!r}: {self.said()}"
            time.sleep(0.02)
        raise AssertionError(f"the apply never got to {what!r}: {self.said()}")

    def finish(self, timeout: float) -> tuple[int, dict[str, object], str]:
        assert self.ended.wait(timeout), f"the apply did not end: {self.said()}"
        rc = self.proc.wait(10)
        outcome = next(doc for _, doc in self.docs if doc.get("type") == "outcome")
        assert self.proc.stderr is not None
        return rc, outcome, self.proc.stderr.read()

    def said(self) -> str:
        return "\n".join(json.dumps(doc) for _, doc in self.docs)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._reader.join(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
