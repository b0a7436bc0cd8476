"""The mistakes a person makes on the command line: a mistyped command, a host nothing knows, a forgotten
HOST. Each is one sentence and exit 2, before any console opens or any connection is tried."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from console.cli.hostcheck import resolves
from tests.support.cli import one_sentence, run_cli, run_main

HOSTS = """
[hosts.gpu-a]
ssh = "127.0.0.1"
port = 1

[hosts.plans]
ssh = "127.0.0.1"
port = 1
"""


@pytest.fixture
def operator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An operator whose hosts.toml lists gpu-a and plans (a host whose name is close to `plan`)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "config" / "k26-console").mkdir(parents=True)
    (tmp_path / "config" / "k26-console" / "hosts.toml").write_text(HOSTS)
    return tmp_path


@pytest.mark.parametrize(
    ("argv", "meant"),
    [
        (["verfy"], "verify"),
        (["verfy", "twin", "--target-context", "1k"], "verify"),
        (["profile", "list"], "profiles"),
        (["aply", "gpu-a", "ctx-200k"], "apply"),
    ],
)
def test_a_mistyped_command_is_named_not_opened_as_a_host(
    operator: Path, capsys: pytest.CaptureFixture[str], argv: list[str], meant: str
) -> None:
    code, out, err = run_main(argv, capsys)
    assert code == 2
    assert out == ""
    line = one_sentence(err)
    assert f"did you mean `{meant}`?" in line, line
    assert f"k26-console open {argv[0]}" in line  # how to open a host that really has that name


def test_a_host_in_hosts_toml_close_to_a_command_still_opens(
    operator: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `plans` is a host in hosts.toml: it goes to the console (which, without a terminal, says so).
    code, _, err = run_main(["plans"], capsys)
    assert code == 2
    assert "needs a terminal" in one_sentence(err)


def test_a_host_nothing_knows_is_refused_with_the_known_hosts(
    operator: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main(["gpu-typo.invalid"], capsys)
    assert code == 2
    assert out == ""
    line = one_sentence(err)
    assert "'gpu-typo.invalid' is not a host in" in line
    assert "hosts.toml" in line
    assert "known hosts: gpu-a, plans" in line


def test_a_host_from_another_hosts_file_is_looked_up_there(
    operator: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.toml"
    other.write_text('[hosts.lab7]\nssh = "127.0.0.1"\nport = 1\n')
    code, _, err = run_main(["lab7", "--hosts", str(other)], capsys)
    assert "needs a terminal" in one_sentence(err)  # found there, handed to the console
    code, _, err = run_main(["lab8.invalid", "--hosts", str(other)], capsys)
    assert code == 2
    assert "known hosts: lab7" in one_sentence(err)


@pytest.mark.parametrize("name", ["127.0.0.1", "::1", "localhost"])
def test_a_loopback_address_or_name_is_tried(
    operator: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    code, _, err = run_main([name], capsys)
    assert code == 2
    assert "needs a terminal" in one_sentence(err)


def test_resolves_answers_from_the_system_resolver() -> None:
    assert resolves("127.0.0.1")
    assert resolves("localhost") == bool(socket.getaddrinfo("localhost", 22))
    assert not resolves("no-such-host.invalid")


def test_version(operator: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(["--version"], capsys)
    assert code == 0
    assert out.startswith("k26-console 0.")
    assert err == ""


def test_limit_names_the_flag_once(operator: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["audit", "gpu-a", "--limit", "0"], capsys)
    assert code == 2
    line = one_sentence(err)
    assert line == "k26-console: --limit must be at least 1, not 0."


def test_twin_with_an_unknown_scenario_lists_them_and_leaves_no_state_dir(
    operator: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "twin-state"
    code, _, err = run_main(["twin", "--scenario", "nosuch", "--state-dir", str(state)], capsys)
    assert code == 2
    line = one_sentence(err)
    assert "no twin scenario 'nosuch'" in line
    assert "kimi-k26-rtx6000" in line
    assert not state.exists()
    assert not (tmp_path / "state").exists()  # nor the default one


def test_probe_without_host_or_server_says_so_in_one_sentence(tmp_path: Path) -> None:
    # A port on loopback nobody listens on: bound and closed, so nothing answers there.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = run_cli(tmp_path, "probe", "--depth", "1k", "--url", f"http://127.0.0.1:{port}", timeout=60)
    assert res.returncode == 2, res.stderr
    assert one_sentence(res.stderr) == (
        f"k26-console: no SGLang server answers at http://127.0.0.1:{port}; check --url, or name a HOST."
    )
    assert res.stdout == ""


def test_probe_with_no_host_names_the_forgotten_host(
    operator: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # The default URL moved to a port nobody listens on: the test must not depend on port 30000.
    monkeypatch.setattr("console.sources.hosts.DEFAULT_SERVER_URL", f"http://127.0.0.1:{port}")
    code, out, err = run_main(["probe", "--depth", "1k"], capsys)
    assert code == 2
    assert out == ""
    assert one_sentence(err) == (
        f"k26-console: no HOST given and no SGLang server answers at http://127.0.0.1:{port} on this "
        "machine; name a HOST (from hosts.toml or an ssh alias) or give --url."
    )


def test_an_ssh_config_alias_is_tried_when_its_hostname_resolves(
    operator: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    home = operator / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        "Host lab-alias\n  HostName 127.0.0.1\n\nHost dead-alias\n  HostName gone.invalid\n"
    )
    monkeypatch.setenv("HOME", str(home))
    code, _, err = run_main(["lab-alias"], capsys)
    assert code == 2 and "needs a terminal" in one_sentence(err)  # handed to the console
    code, _, err = run_main(["dead-alias"], capsys)
    assert code == 2 and "'dead-alias' is not a host in" in one_sentence(err)


def test_host_with_a_profile_that_is_not_utf8_says_so(
    operator: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The profile is read before the host is reached: no connection is tried.
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b'name = "bad"\ncomment = "\xff\xfe"\n')
    code, out, err = run_main(["host", "gpu-a", "--profile", str(bad)], capsys)
    assert code == 2
    assert out == ""
    assert one_sentence(err) == f"k26-console: the profile {bad} is not UTF-8 text."


# ---- one host lookup: a mistyped host is named before any connection (issue 34) --------------------

TWIN_HOSTS = """
[hosts.twin]
ssh = "127.0.0.1"
port = 1
"""


@pytest.fixture
def twin_operator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An operator whose hosts.toml lists `twin`, and a transport that fails the test if it is made."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "config" / "k26-console").mkdir(parents=True)
    (tmp_path / "config" / "k26-console" / "hosts.toml").write_text(TWIN_HOSTS)

    def no_connection(*args: object, **kwargs: object) -> None:
        raise AssertionError("a connection was tried for a mistyped host")

    monkeypatch.setattr("console.sources.transport.Transport.__init__", no_connection)
    return tmp_path


@pytest.mark.parametrize(
    "argv",
    [
        ["verify", "twn", "--target-context", "1k"],
        ["apply", "twn", "ctx-200k", "--yes"],
        ["audit", "twn"],
        ["host", "twn"],
        ["probe", "twn", "--depth", "1k"],
        ["snapshot", "twn"],
        ["record", "twn", "--out", "REC"],
        ["restart", "twn", "--yes"],
        ["rollback", "twn", "--yes"],
        ["confirm", "twn"],
        ["parse", "twn", "--follow"],
        ["plan", "twn", "--target-context", "1k"],
        ["profiles", "validate", "ctx-200k", "--host", "twn"],
        ["export", "twn"],
        ["open", "twn"],
    ],
    ids=lambda argv: argv[0] if argv[0] != "profiles" else "profiles-validate",
)
def test_a_mistyped_host_is_named_by_every_command_before_any_connection(
    twin_operator: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """`verify twn` said "cannot resolve the host name of twn" after 1.8 s of retries while `open twn`
    named the host it was close to: every command looks the host up one way, first."""
    rec = twin_operator / "twn.k26rec"
    code, out, err = run_main([str(rec) if a == "REC" else a for a in argv], capsys)
    assert code == 2 and out == ""
    line = one_sentence(err)
    assert "'twn'" in line and "did you mean 'twin'?" in line, line
    assert not rec.exists()


def test_a_recording_that_never_reached_its_host_leaves_no_file(
    operator: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failed `record` left an empty 32 KB file behind; one it did not create (a recording it was
    to add to) is left alone."""
    out = operator / "gpu-a.k26rec"
    code, _, err = run_main(["record", "gpu-a", "--out", str(out)], capsys)
    assert code == 2 and "refused" in err.splitlines()[-1], err
    assert not out.exists() and not list(operator.glob("gpu-a.k26rec*"))
