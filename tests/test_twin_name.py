"""`k26-console twin --name`: two users of one account each ran `twin`, and the second took over the
first's "twin" in the shared hosts.toml (issue 34 item 7). A name another running twin holds, by its
registration or by the state dir the name picks, is refused in one sentence naming --name. The other twin
is a state directory whose owner is a process this test started (a twin's owner.pid names its
`k26-console twin` process)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from console.cli.cmd_twin import name_taken
from console.twin.host_files import hosts_toml_text
from tests.support.cli import one_sentence, run_cli


@pytest.fixture
def other_owner() -> Iterator[int]:
    """The pid of a live process standing for the other user's running twin."""
    proc = subprocess.Popen(["sleep", "120"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(10)


def _twin_dir(root: Path, owner: int) -> Path:
    (root / "etc" / "systemd" / "system").mkdir(parents=True)
    (root / "owner.pid").write_text(f"{owner}\n")
    return root


def _register(hosts: Path, name: str, root: Path) -> None:
    """The entry `k26-console twin` writes, as `TwinHost.write_hosts_toml` words it."""
    entry = {
        "ssh": "bob@127.0.0.1",
        "port": 40022,
        "unit": "sglang.service",
        "identity_file": str(root / "ssh" / "client_key"),
        "unit_dir": str(root / "etc" / "systemd" / "system"),
    }
    hosts.parent.mkdir(parents=True, exist_ok=True)
    hosts.write_text(hosts_toml_text(name, entry, f"k26 twin '{name}'"))


def test_a_name_registered_to_another_running_twin_is_refused(tmp_path: Path, other_owner: int) -> None:
    home = tmp_path / "home"
    hosts = home / "config" / "k26-console" / "hosts.toml"
    theirs = _twin_dir(tmp_path / "bobs-twin", other_owner)
    _register(hosts, "twin", theirs)
    before = hosts.read_text()
    mine = tmp_path / "mine"
    res = run_cli(home, "twin", "--state-dir", str(mine), timeout=60)
    assert res.returncode == 2, (res.stdout, res.stderr)
    line = one_sentence(res.stderr)
    assert f"the host name 'twin' is taken: another running twin (pid {other_owner})" in line, line
    assert f"registered under it in {hosts}" in line and str(theirs) in line
    assert line.endswith("pick a name of your own with --name NAME."), line
    assert hosts.read_text() == before and not mine.exists()  # nothing written, nothing started


def test_the_default_state_dir_of_a_name_in_use_is_refused_too(tmp_path: Path, other_owner: int) -> None:
    """Without --state-dir the name picks the state dir (twins/NAME): `--no-register` does not make
    sharing it safe."""
    home = tmp_path / "home"
    theirs = _twin_dir(home / "state" / "k26-console" / "twins" / "twin", other_owner)
    res = run_cli(home, "twin", "--no-register", timeout=60)
    assert res.returncode == 2, (res.stdout, res.stderr)
    line = one_sentence(res.stderr)
    assert f"uses the state directory {theirs}" in line and "--name NAME" in line, line


def test_a_name_is_free_once_its_twin_is_gone_or_under_another_name(tmp_path: Path, other_owner: int) -> None:
    hosts = tmp_path / "hosts.toml"
    theirs = _twin_dir(tmp_path / "bobs-twin", other_owner)
    _register(hosts, "twin", theirs)
    mine = tmp_path / "mine"
    # The positive control: held.
    assert name_taken("twin", mine, default_dir=False, register=True, hosts_path=hosts) is not None
    # Another name, or not registering, is free.
    assert name_taken("alice-twin", mine, default_dir=False, register=True, hosts_path=hosts) is None
    assert name_taken("twin", mine, default_dir=False, register=False, hosts_path=hosts) is None
    # A twin that stopped (its owner gone) leaves its registration free to take over.
    gone = subprocess.Popen(["true"])
    gone.wait(10)
    (theirs / "owner.pid").write_text(f"{gone.pid}\n")
    assert name_taken("twin", mine, default_dir=False, register=True, hosts_path=hosts) is None
