"""A console that loses its terminal, or gets SIGHUP or SIGTERM, at start-up, while running or while quitting,
is gone within GONE_S and has taken its presence (and its lock) off the host (issue 18, point 1).

Real terminals: a pty from `pty.fork` (the console is its session leader, as under sshd or tmux; closing
the master is the hangup a dropped SSH session is), and tmux on a socket of its own (`kill-server` is
the incident). One twin serves every `open` case; the demo cases start their own, as the demo does.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty
import random
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from console.core.confirm import PENDING_FILE, rollback_unit
from console.core.pairing import Identity
from console.sources.hosts import load_hosts
from console.sources.hoststate import HostStateDir, HostStateError
from console.sources.session_options import SessionOptions
from console.sources.transport import Transport
from console.tui.app import ConsoleApp, HostEntry
from console.tui.host_entry import PairingOptions
from console.twin.host import TwinHost
from tests.support.cli import CLI, operator_env, started_twin, wait_until
from tests.support.procs import processes_of
from tests.support.tmux import PANE_SIZE
from tests.support.twins import module_twin

REPO = Path(__file__).resolve().parent.parent
GONE_S = 2.0
"""The issue's bound, from the signal or the hangup to the process being gone. Measured on the shared
2-core machine at load 8-9: 0.02-1.0 s for `open` and the demo alike (the console's own deadline ends
it at 1.5 s plus 0.35 s of last-resort hooks if the orderly exit is stuck)."""
START_S = 60.0
"""From spawn to the first heartbeat on the host: imports, SSH, the first snapshot; slow on a loaded
machine."""
TIME_SCALE = 0.02

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("K26_TEST_SEED", str(random.randrange(1 << 30))))
"""The random points in start-up and quitting; set K26_TEST_SEED to replay a failed run."""


twin = module_twin("lifeline-twin", time_scale=TIME_SCALE)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    return random.Random(f"{SEED}-{request.node.name}")


def presence_dir(twin_root: Path) -> Path:
    return twin_root / "home" / ".k26-console" / "presence"


def presence_pids(twin_root: Path) -> list[int]:
    """The pids the heartbeat files in the twin's state dir name (a file being replaced is skipped)."""
    pids = []
    for path in presence_dir(twin_root).glob("*.json"):
        try:
            pids.append(int(json.loads(path.read_text())["pid"]))
        except (OSError, ValueError, KeyError):
            continue
    return pids


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to reap it is gone: it holds nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class PtyConsole:
    """`k26-console ARGS` on a pty of its own; the master is read all the time (a terminal that stops
    reading would block the console's output, which is another test)."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: exec at once, nothing else
            os.execve(sys.executable, [sys.executable, "-m", "console.cli.main", *args], env)
        self.pid, self.fd = pid, fd
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 48, 160, 0, 0))
        self.output = bytearray()
        self.status: int | None = None
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.fd], [], [], 0.05)
            if ready:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:
                    return
                if not chunk:
                    return
                self.output += chunk

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)

    def stop_reading(self) -> None:
        """A terminal that takes no more output (a frozen SSH session): the console's writes block."""
        self._stop.set()
        self._reader.join()

    def unread(self) -> int:
        return int(struct.unpack("i", fcntl.ioctl(self.fd, termios.FIONREAD, b"\0\0\0\0"))[0])

    def close_terminal(self) -> None:
        """Close the master: the pty hangs up, as when sshd's connection or tmux goes."""
        self._stop.set()
        self._reader.join()
        os.close(self.fd)
        self.fd = -1

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def gone_within(self, timeout_s: float) -> float | None:
        """Seconds until the process ended (reaped here), None when it was still running at `timeout_s`."""
        start = time.monotonic()
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                return time.monotonic() - start
            if time.monotonic() - start > timeout_s:
                return None
            time.sleep(0.01)

    def finish(self) -> None:
        """Whatever happened: the console (its own process group) is gone and the pty closed."""
        if self.status is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        if self.fd >= 0:
            self._stop.set()
            self._reader.join()
            os.close(self.fd)
            self.fd = -1


def open_console(twin: TwinHost, home: Path) -> PtyConsole:
    env = {**operator_env(home), "TERM": "xterm-256color"}
    return PtyConsole(["open", "twin", "--hosts", str(twin.hosts_toml)], env)


def wait_running(console: PtyConsole, twin_root: Path) -> None:
    """Running: its heartbeat is on the host."""
    assert wait_until(lambda: console.pid in presence_pids(twin_root) or not alive(console.pid), START_S)
    assert console.pid in presence_pids(twin_root), f"never beat; it said:\n{bytes(console.output[-2000:])!r}"


def assert_gone_and_left(console: PtyConsole, twin_root: Path, what: str) -> float:
    took = console.gone_within(GONE_S + 3)
    assert took is not None, f"{what}: the console was still running {GONE_S + 3:.0f} s later"
    assert took <= GONE_S, f"{what}: gone only after {took:.2f} s"
    assert console.pid not in presence_pids(twin_root), f"{what}: its presence is still on the host"
    print(f"{what}: gone in {took:.2f} s, exit {console.status}")
    return took


ENDINGS = {
    "SIGHUP": lambda c: c.signal(signal.SIGHUP),
    "SIGTERM": lambda c: c.signal(signal.SIGTERM),
    "hangup": PtyConsole.close_terminal,
}
STATUS = {"SIGHUP": 129, "SIGTERM": 143, "hangup": 129}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_running_console_ends_on_signal_or_hangup(twin: TwinHost, tmp_path: Path, ending: str) -> None:
    console = open_console(twin, tmp_path)
    try:
        wait_running(console, twin.layout.root)
        ENDINGS[ending](console)
        assert_gone_and_left(console, twin.layout.root, f"running, {ending}")
        assert console.status == STATUS[ending]
    finally:
        console.finish()


@pytest.mark.parametrize("ending", ["SIGTERM", "hangup"])
def test_quitting_console_ends_on_signal_or_hangup(
    twin: TwinHost, tmp_path: Path, ending: str, rng: random.Random
) -> None:
    console = open_console(twin, tmp_path)
    try:
        wait_running(console, twin.layout.root)
        console.send(b"q")
        delay = rng.uniform(0.0, 0.4)
        time.sleep(delay)  # the random point of the quit, not a synchronisation
        ENDINGS[ending](console)
        assert_gone_and_left(
            console, twin.layout.root, f"quitting, {ending} {delay:.2f} s after q (seed {SEED})"
        )
        # Whichever came first: the quit (0), the console taking the ending (128 + signal), or, once the
        # console has ended and given the signal back its default, the signal itself.
        assert console.status in (0, STATUS[ending], 128 - STATUS[ending])
    finally:
        console.finish()


def test_console_on_a_frozen_terminal_ends_on_sigterm(twin: TwinHost, tmp_path: Path) -> None:
    """Its terminal takes no output (the console's writer thread blocks in write(2), then the event loop
    on the writer's full queue, and Textual's exit with them): SIGTERM still leaves the host and ends the
    process within the bound, by the deadline."""
    console = open_console(twin, tmp_path)
    try:
        wait_running(console, twin.layout.root)
        console.stop_reading()
        # The pty's buffer towards the terminal is full (4 KiB unread): the next frames block the writer
        # thread; resizes make frames until its queue is full and the event loop blocks putting into it.
        assert wait_until(lambda: console.unread() >= 4095, 30), console.unread()
        sizes = iter([(48, 160), (40, 120)] * 200)

        def loop_blocked() -> bool:
            fcntl.ioctl(console.fd, termios.TIOCSWINSZ, struct.pack("HHHH", *next(sizes), 0, 0))
            return "futex" in Path(f"/proc/{console.pid}/wchan").read_text()

        assert wait_until(loop_blocked, 30, interval_s=0.1), "the console's event loop never blocked"
        console.signal(signal.SIGTERM)
        assert_gone_and_left(console, twin.layout.root, "frozen terminal, SIGTERM")
        assert console.status == STATUS["SIGTERM"]
    finally:
        console.finish()


ALT_SCREEN = b"\x1b[?1049h"
"""Textual entering application mode: the console's own handling is in place from here on."""


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_starting_console_ends_on_signal_or_hangup(
    twin: TwinHost, tmp_path: Path, ending: str, rng: random.Random
) -> None:
    """Between the first frame and the first heartbeat: connecting, the first snapshot, pairing."""
    console = open_console(twin, tmp_path)
    try:
        assert wait_until(lambda: ALT_SCREEN in console.output, START_S), "never drew a frame"
        delay = rng.uniform(0.0, 1.5)
        time.sleep(delay)  # the random point of the start-up, not a synchronisation
        ENDINGS[ending](console)
        what = f"starting, {ending} {delay:.2f} s after the first frame (seed {SEED})"
        assert_gone_and_left(console, twin.layout.root, what)
        assert console.status == STATUS[ending]
    finally:
        console.finish()


def test_console_still_importing_ends_on_hangup(twin: TwinHost, tmp_path: Path, rng: random.Random) -> None:
    """Before its first frame (imports, the hosts file): the hangup's SIGHUP ends it as any program."""
    console = open_console(twin, tmp_path)
    try:
        delay = rng.uniform(0.0, 0.8)
        time.sleep(delay)  # the random point of the start-up, not a synchronisation
        console.close_terminal()
        assert_gone_and_left(console, twin.layout.root, f"importing, hangup at {delay:.2f} s (seed {SEED})")
        assert console.status in (STATUS["hangup"], -signal.SIGHUP)
    finally:
        console.finish()


# ---- tmux ------------------------------------------------------------------------------------------


def _tmux(sock: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["tmux", "-S", sock, *args], capture_output=True, text=True, check=False, timeout=30
    )


def _pane_pid(sock: str) -> int:
    return int(_tmux(sock, "display-message", "-p", "#{pane_pid}").stdout.strip())


@pytest.fixture
def tmux_sock(tmp_path: Path) -> Iterator[str]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    # A server of its own, its socket in the test's directory (nothing left in the user's tmux dir).
    sock = str(tmp_path / "tmux.sock")
    try:
        yield sock
    finally:
        _tmux(sock, "kill-server")


def _in_tmux(sock: str, home: Path, args: str) -> int:
    env = " ".join(f"{k}={v}" for k, v in operator_env(home).items() if k.startswith(("XDG_", "PYTHONPATH")))
    # `exec`: the pane's process is the console itself, as it is when an operator's shell execs it.
    cmd = (
        PANE_SIZE
        + f"cd {REPO} && exec env {env} TERM=xterm-256color {sys.executable} -m console.cli.main {args}"
    )
    res = _tmux(sock, "new", "-d", "-x", "160", "-y", "48", cmd)
    assert res.returncode == 0, res.stderr
    return _pane_pid(sock)


def _gone_within(pid: int, timeout_s: float) -> float | None:
    start = time.monotonic()
    if wait_until(lambda: not alive(pid), timeout_s, interval_s=0.01, max_interval_s=0.01):  # a measurement
        return time.monotonic() - start
    return None


def test_tmux_killed_under_a_running_console(twin: TwinHost, tmp_path: Path, tmux_sock: str) -> None:
    pid = _in_tmux(tmux_sock, tmp_path, f"open twin --hosts {twin.hosts_toml}")
    try:
        assert wait_until(lambda: pid in presence_pids(twin.layout.root), START_S), "never beat"
        _tmux(tmux_sock, "kill-server")
        took = _gone_within(pid, GONE_S + 3)
        assert took is not None and took <= GONE_S, f"gone after {took} s"
        assert pid not in presence_pids(twin.layout.root), "its presence is still on the host"
        print(f"tmux killed under open: gone in {took:.2f} s")
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("when", ["running", "quitting"])
def test_tmux_killed_under_the_demo(tmp_path: Path, tmux_sock: str, when: str, rng: random.Random) -> None:
    """The incident: `demo`, `q`, and the tmux server killed a moment later; the console, its twin and
    their presence are gone within the bound (it spun at a core for 50 minutes)."""
    root = tmp_path / "demo-twin"
    pid = _in_tmux(tmux_sock, tmp_path, f"demo --state-dir {root} --time-scale {TIME_SCALE}")
    try:
        assert wait_until(lambda: pid in presence_pids(root), START_S), "the demo never beat"
        if when == "quitting":
            _tmux(tmux_sock, "send-keys", "q")
            time.sleep(rng.uniform(0.0, 0.5))  # the random point of the quit, not a synchronisation
        _tmux(tmux_sock, "kill-server")
        took = _gone_within(pid, GONE_S + 3)
        assert took is not None and took <= GONE_S, f"gone after {took} s (seed {SEED})"
        assert pid not in presence_pids(root), "its presence is still on the host"
        assert processes_of(root) == [], "the demo's twin outlived it"
        print(f"tmux killed under the demo, {when}: gone in {took:.2f} s")
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
        for line in processes_of(root):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(line.split(":")[0]), signal.SIGKILL)


# ---- leaving is final ------------------------------------------------------------------------------


async def test_a_heartbeat_due_as_the_console_leaves_does_not_put_its_presence_back(twin: TwinHost) -> None:
    """A console leaves, then exits: its heartbeat task runs until the exit cancels it, and a beat that
    falls due in between (or is already under way) must not write back the presence leaving removed."""
    config = (
        load_hosts(twin.hosts_toml).hosts[twin.name].model_copy(update={"state_dir": "~/.k26-leave-final"})
    )
    presence = twin.layout.home_dir / ".k26-leave-final" / "presence"
    me = Identity(user="carol", jump_host="jump3", pid=6161, console_id="carol3")
    transport = Transport(config, ssh_config=[])
    try:
        await transport.wait_up(15)
        state = HostStateDir(transport, config, me, heartbeat_s=0.5)
        await state.board.heartbeat("dashboard")
        assert (presence / "carol3.json").exists()
        # A beat under way as the console leaves, and the next one due after it.
        beat = asyncio.get_running_loop().create_task(state.board.heartbeat())
        await state.board.leave()
        await beat
        await state.board.heartbeat()
        assert not (presence / "carol3.json").exists()
    finally:
        await transport.close()


def test_console_holding_the_lock_releases_it_as_its_terminal_goes(twin: TwinHost, tmp_path: Path) -> None:
    """Mid-restart, under its lock: the hangup leaves the host unlocked (the restart goes on under systemd;
    the trail says the console's part was interrupted)."""
    lock = twin.layout.home_dir / ".k26-console" / "lock"
    console = open_console(twin, tmp_path)
    try:
        wait_running(console, twin.layout.root)
        assert not lock.exists()
        console.send(b"r")
        assert wait_until(lambda: b"Yes (y)" in console.output, 30), "no restart confirmation"
        console.send(b"y")
        assert wait_until(lock.exists, 30), "the restart never took the lock"
        assert f'"pid":{console.pid}' in lock.read_text()
        console.close_terminal()
        assert_gone_and_left(console, twin.layout.root, "restarting under the lock, hangup")
        assert not lock.exists(), "the lock outlived its console"
    finally:
        console.finish()


def test_an_armed_commit_confirmed_rollback_stays_armed_as_a_console_goes(tmp_path: Path) -> None:
    """The console only leaves: a host-side rollback armed by `apply --confirm-within` (whose command was
    then stopped) is the host's to fire or someone's to confirm, not undone by a console going away."""
    with started_twin(tmp_path / "twin", time_scale=TIME_SCALE) as host:
        pending = host.layout.home_dir / ".k26-console" / PENDING_FILE
        timer = f"{rollback_unit(host.unit)}.timer"
        apply = subprocess.Popen(
            [
                *CLI,
                "apply",
                "twin",
                "ctx-128k",
                "--yes",
                "--hosts",
                str(host.hosts_toml),
                "--confirm-within",
                "600",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=operator_env(tmp_path / "applier"),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            assert apply.stdout is not None
            for line in apply.stdout:
                if "host-side rollback of profile ctx-128k is armed" in line:
                    break
            apply.send_signal(signal.SIGTERM)
            apply.wait(30)
        finally:
            if apply.poll() is None:
                apply.kill()
                apply.wait()
            if apply.stdout is not None:
                apply.stdout.close()
        assert pending.exists() and host.systemctl("is-active", timer, check=False).stdout.strip() == "active"

        console = open_console(host, tmp_path / "operator")
        try:
            wait_running(console, host.layout.root)
            console.close_terminal()
            assert_gone_and_left(console, host.layout.root, "with a rollback armed, hangup")
        finally:
            console.finish()
        assert pending.exists(), "the armed rollback's record went with the console"
        assert host.systemctl("is-active", timer, check=False).stdout.strip() == "active"


async def test_a_lock_being_taken_as_the_console_leaves_is_released_by_the_leaving(twin: TwinHost) -> None:
    """The hangup lands while `r` is taking the lock: leaving waits for the lock to be taken, then
    releases it with the presence; a lock asked for after leaving is refused."""
    config = (
        load_hosts(twin.hosts_toml).hosts[twin.name].model_copy(update={"state_dir": "~/.k26-leave-lock"})
    )
    state_dir = twin.layout.home_dir / ".k26-leave-lock"
    me = Identity(user="dave", jump_host="jump4", pid=7171, console_id="dave4")
    transport = Transport(config, ssh_config=[])
    try:
        await transport.wait_up(15)
        state = HostStateDir(transport, config, me, heartbeat_s=0.5)
        await state.board.heartbeat("dashboard")
        taking = asyncio.get_running_loop().create_task(state.locks.acquire("restart"))
        await asyncio.sleep(0)  # the acquire is under way (its SSH command sent), not finished
        await state.board.leave()
        lock = await taking
        assert lock.released
        assert not (state_dir / "lock").exists(), "the lock outlived the console's leaving"
        assert not (state_dir / "presence" / "dave4.json").exists()
        with pytest.raises(HostStateError, match="has left"):
            await state.locks.acquire("restart")
        assert not (state_dir / "lock").exists()
    finally:
        await transport.close()


async def test_a_session_that_comes_up_after_the_console_left_writes_no_presence(
    twin: TwinHost, tmp_path: Path
) -> None:
    """The signal lands while the SSH session is still connecting: the console leaves (nothing yet), and
    the session that comes up in the moment before the exit must not start beating."""
    config = load_hosts(twin.hosts_toml).get(twin.name)
    assert config is not None
    me = Identity(user="erin", jump_host="jump5", pid=8181, console_id="erin5")

    def console_app(state_dir: str, who: Identity) -> ConsoleApp:
        entry = HostEntry(
            twin.name,
            config=config.model_copy(update={"state_dir": f"~/{state_dir}"}),
            session=SessionOptions(gpu_interval_s=0.5, server_interval_s=0.5),
            restart_history_dir=tmp_path / who.console_id,
            pairing=PairingOptions(heartbeat_s=0.5, poll_s=0.5),
        )
        return ConsoleApp([entry], identity=who)

    async def presence_after_first_snapshot(app: ConsoleApp, presence: Path) -> list[Path]:
        """The presence files on the host 1.5 s (three heartbeat intervals) after the console's first
        snapshot: a console that pairs has beaten by then."""
        async with app.run_test(size=(120, 40)) as pilot:
            deadline = time.monotonic() + 60
            while app.dashboards[twin.name].snap is None:  # the session is up and delivering
                assert time.monotonic() < deadline, "the session never came up"
                await pilot.pause(0.05)
            await pilot.pause(1.5)
            found = list(presence.glob("*.json")) if presence.exists() else []
            link = app.hosts[twin.name].link
        return found if link is None else [*found, Path("paired")]

    # The control: a console that has not left beats within that window (else the check below proves nothing).
    control = Identity(user="erin", jump_host="jump5", pid=8182, console_id="erin5-control")
    seen = await presence_after_first_snapshot(
        console_app(".k26-left-early-control", control),
        twin.layout.home_dir / ".k26-left-early-control" / "presence",
    )
    assert seen, "a console that had not left wrote no presence within 1.5 s of its first snapshot"

    app = console_app(".k26-left-early", me)
    # As the lifeline does when the signal comes first: leave, with no session up yet to leave.
    await app.leave_hosts(1.0)
    assert (
        await presence_after_first_snapshot(app, twin.layout.home_dir / ".k26-left-early" / "presence") == []
    )
