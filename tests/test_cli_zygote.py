"""The suite's forked CLI runs (tests/support/cli_zygote.py) answer as a fresh `python -m console.cli.main`
does: the same exit status, stdout and stderr, the test's environment and working directory, and a run
past its timeout killed and reported as `subprocess.run` reports it."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.cli import CLI, _forked_cli, cli_process, operator_env, profile_variant, wait_until

CASES = [
    ["--version"],
    ["profiles", "list"],
    ["parse", "/nonexistent/boot.journal"],
    ["completion", "bash"],
    ["verify", "--target-context", "200k"],  # argparse's usage error
    ["no-such-host"],  # the first word neither a command nor a known host
]


def _fresh(home: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return cli_process(list(args), env=operator_env(home), cwd=cwd, timeout=60, fork=False)


def _forked(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    zygote = _forked_cli()
    if zygote is None:
        pytest.skip("K26_TEST_CLI_FORK=0: every run is a fresh process")
    result: subprocess.CompletedProcess[str] = zygote.run(
        [*CLI, *args], list(args), operator_env(home), timeout
    )
    return result


@pytest.mark.parametrize("args", CASES, ids=[" ".join(a) for a in CASES])
def test_a_forked_run_answers_as_a_fresh_process(tmp_path: Path, args: list[str]) -> None:
    fresh, forked = _fresh(tmp_path, *args), _forked(tmp_path, *args)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert "Traceback" not in forked.stderr


def test_a_forked_run_takes_the_tests_environment_and_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The zygote was started with this worker's environment; each run has the test's own, whole: the
    operator's profile under this test's XDG_CONFIG_HOME is listed, and a relative path is read from the
    test's working directory."""
    profiles = tmp_path / "config" / "k26-console" / "profiles"
    profiles.mkdir(parents=True)
    profile_variant(profiles, "mine-only-here", fraction="0.9")
    listed = _forked(tmp_path, "profiles", "list")
    assert listed.returncode == 0 and "mine-only-here" in listed.stdout, listed
    (tmp_path / "boot.journal").write_text("")
    monkeypatch.chdir(tmp_path)
    here, there = (
        _forked(tmp_path, "parse", "boot.journal"),
        _fresh(tmp_path, "parse", "boot.journal", cwd=tmp_path),
    )
    assert here.returncode == there.returncode == 0 and here.stdout == there.stdout, (here, there)


def test_a_forked_run_past_its_timeout_is_killed_and_reported(tmp_path: Path) -> None:
    """A host that accepts the TCP connection and never speaks SSH: the run outlives its timeout, is
    killed, and the test gets subprocess's TimeoutExpired; the zygote reaps it."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # never accepted: the kernel completes the handshake, no banner ever comes
        port = silent.getsockname()[1]
        hosts = tmp_path / "hosts.toml"
        hosts.write_text(f'[hosts.mute]\nssh = "127.0.0.1"\nport = {port}\n')
        started = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            _forked(tmp_path, "audit", "mute", "--hosts", str(hosts), timeout=1.5)
        # killed at its timeout, not left to its own connect timeout (10 s) with the test waiting on it
        assert time.monotonic() - started < 6
    zygote = _forked_cli()
    assert zygote is not None
    children = Path(f"/proc/{zygote.process.pid}/task/{zygote.process.pid}/children")
    assert wait_until(lambda: children.read_text().strip() == "", 10), children.read_text()
    assert os.path.exists(zygote.path)
