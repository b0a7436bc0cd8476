"""The suite's own guarantees (issue 19, point 6), checked as a test checks anything:

- a test's child gets the SIGINT/SIGHUP the test sends even when the suite was started with them ignored
  (`scripts/test &` ignores SIGINT, `nohup scripts/test` SIGHUP): shown on a pytest run in a subprocess
  started that way, with the suite's conftest and without it (then the child ignores the signal: the
  check would catch a conftest that lost its fix);
- the tests never see the operator's real config/state dirs;
- the test sshd comes up on another port when the one it was given is taken before sshd binds it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import platformdirs
import pytest

from tests import conftest
from tests.conftest import CHILD_SIGNALS, XDG_VARS
from tests.support import sshd as sshd_support
from tests.support.cli import REPO

PROBE = r"""
import os, signal, subprocess, sys

import pytest

WAIT_S = float(os.environ["PROBE_WAIT_S"])

CHILD = "import sys, time; print('ready', flush=True); time.sleep(60)"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_the_child_ends_on_the_signal(sig):
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        child.send_signal(sig)
        assert child.wait(WAIT_S) == -sig
    finally:
        child.kill()
        child.wait()
"""


def _ignoring(*sigs: signal.Signals) -> None:
    for sig in sigs:
        signal.signal(sig, signal.SIG_IGN)


def _run_probe(where: Path, wait_s: float, *plugin: str) -> subprocess.CompletedProcess[str]:
    """The probe under pytest, started as a background job under nohup would start it: SIGINT and
    SIGHUP ignored, inherited by everything it starts."""
    where.mkdir()
    (where / "test_probe.py").write_text(PROBE)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin],
        cwd=where,
        # No plugins but the one named: the probe needs none, and each costs start-up time.
        env={
            **os.environ,
            "PYTHONPATH": str(REPO),
            "PROBE_WAIT_S": str(wait_s),
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        },
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        preexec_fn=lambda: _ignoring(signal.SIGINT, signal.SIGHUP),
    )


def test_children_get_the_signals_a_background_suite_ignores(tmp_path: Path) -> None:
    # Without the conftest the probe's children inherit the ignored signals: both waits time out (a
    # short wait: the child would have ended within milliseconds).
    bare = _run_probe(tmp_path / "bare", 1.0)
    assert bare.returncode == 1 and "2 failed" in bare.stdout, bare.stdout + bare.stderr
    assert bare.stdout.count("TimeoutExpired") >= 2, bare.stdout
    ours = _run_probe(tmp_path / "fixed", 30.0, "-p", "tests.conftest")
    assert ours.returncode == 0 and "2 passed" in ours.stdout, ours.stdout + ours.stderr
    # The same in an xdist worker (a child of the suite's process, as scripts/test runs them).
    worker = _run_probe(tmp_path / "worker", 30.0, "-p", "tests.conftest", "-p", "xdist.plugin", "-n", "1")
    assert worker.returncode == 0 and "2 passed" in worker.stdout, worker.stdout + worker.stderr


def test_the_suite_itself_still_ignores_what_it_was_started_ignoring() -> None:
    """The conftest replaces SIG_IGN by a handler that does nothing: to the suite the signal is still
    ignored (a Ctrl-C in the shell that backgrounded it does not stop it), and no signal is left at
    SIG_IGN for a child to inherit."""
    started_ignoring = {int(n) for n in os.environ[conftest.IGNORED_ENV].split(",") if n}
    for sig in CHILD_SIGNALS:
        handler = signal.getsignal(sig)
        assert handler is not signal.SIG_IGN, sig
        assert (handler is conftest._still_ignored) == (sig in started_ignoring), (sig, handler)


def test_the_operators_config_and_state_are_out_of_reach() -> None:
    ours = conftest.xdg_root()
    for var in XDG_VARS:
        where = Path(os.environ[var])
        assert where.is_dir() and where.parent == ours, (var, where)
    # This process's own directory (each xdist worker makes its own), not the operator's.
    assert ours.name.startswith("k26-tests-xdg-") and ours.stat().st_uid == os.getuid()
    config = Path(platformdirs.user_config_dir("k26-console"))
    assert config.parent == Path(os.environ["XDG_CONFIG_HOME"])
    assert config != Path.home() / ".config" / "k26-console"


@pytest.mark.sshd
@pytest.mark.skipif(
    sshd_support.sshd_unavailable_reason() is not None,
    reason=f"real sshd: {sshd_support.sshd_unavailable_reason()}",
)
def test_sshd_moves_to_another_port_when_its_free_port_is_taken_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.2", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        # The port was free when picked, then something else bound it before sshd could (twice).
        picks = iter([taken, taken])
        real_free_port = sshd_support.free_port
        monkeypatch.setattr(sshd_support, "free_port", lambda host: next(picks, None) or real_free_port(host))
        handle = sshd_support.start_sshd(tmp_path / "sshd")
        try:
            assert handle.port != taken
            assert sshd_support.holds_socket(
                handle.process.pid, sshd_support.listening_inodes("127.0.0.2", handle.port)
            )
            res = subprocess.run(handle.ssh_argv("echo up"), capture_output=True, text=True, timeout=30)
            assert res.stdout == "up\n", res.stderr + handle.log()
        finally:
            handle.stop()
        # A port given explicitly is not replaced: the caller hears why sshd could not start.
        with pytest.raises(RuntimeError, match="Address already in use"):
            sshd_support.start_sshd(tmp_path / "sshd2", port=taken)
