"""`sources.hosts`: the hosts file, and a name that is only an ssh alias."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.sources.hosts import (
    DEFAULT_SERVER_URL,
    HostsError,
    default_hosts_path,
    load_hosts,
    parse_hosts,
    resolve_host,
)

GOOD = """
[hosts.gpu1]
ssh = "gpu1"
unit = "sglang"
server_url = "http://127.0.0.1:30000/"
model = "kimi-k2.6"
gpu = "RTX PRO 6000 Blackwell"
gpu_count = 8

[hosts.twin]
ssh = "k26@127.0.0.2"
port = 2222
unit = "sglang-twin.service"
identity_file = "~/twin/id_ed25519"
known_hosts = "/tmp/twin/known_hosts"
"""


def test_a_good_file_reads_every_field() -> None:
    hosts = parse_hosts(GOOD)
    gpu1 = hosts.hosts["gpu1"]
    assert gpu1.ssh_host == "gpu1" and gpu1.ssh_user is None and gpu1.port is None
    assert gpu1.server_url == "http://127.0.0.1:30000"  # trailing slash dropped
    assert (gpu1.server_host, gpu1.server_port) == ("127.0.0.1", 30000)
    assert gpu1.unit_name == "sglang.service"
    assert (gpu1.model, gpu1.gpu, gpu1.gpu_count) == ("kimi-k2.6", "RTX PRO 6000 Blackwell", 8)
    twin = hosts.hosts["twin"]
    assert (twin.ssh_user, twin.ssh_host, twin.port) == ("k26", "127.0.0.2", 2222)
    assert twin.unit_name == "sglang-twin.service"
    assert twin.identity_file == Path("~/twin/id_ed25519").expanduser()
    assert twin.known_hosts == Path("/tmp/twin/known_hosts")
    assert twin.describe() == "k26@127.0.0.2:2222"


def test_an_unlisted_name_is_an_ssh_alias_with_defaults() -> None:
    hosts = parse_hosts("")
    host = resolve_host("gpu7", hosts)
    assert (host.name, host.ssh, host.unit_name, host.server_url) == (
        "gpu7",
        "gpu7",
        "sglang.service",
        DEFAULT_SERVER_URL,
    )
    assert resolve_host("ops@gpu7", hosts).ssh_user == "ops"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[hosts.a\nssh='x'", "is not valid TOML"),
        ("[hostz.a]\nssh='x'", "unknown top-level key 'hostz'"),
        ("[hosts.a]\nunit='sglang'", "hosts.a.ssh is missing"),
        ("[hosts.a]\nssh='x'\nport='twenty-two'", "hosts.a.port"),
        ("[hosts.a]\nssh='x'\nport=70000", "hosts.a.port"),
        ("[hosts.a]\nssh='x'\nflavour='mint'", "hosts.a.flavour is not a known setting"),
        ("[hosts.a]\nssh='-oProxyCommand=evil'", "must not start with '-'"),
        ("[hosts.a]\nssh='x y'", "must be one word"),
        ("[hosts.a]\nssh='x'\nunit='sglang; reboot'", "systemd unit name"),
        ("[hosts.a]\nssh='x'\nserver_url='127.0.0.1:30000'", "http://127.0.0.1:30000"),
        ("hosts = 3", "tables"),
    ],
)
def test_a_bad_file_is_one_clear_sentence(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "hosts.toml"
    path.write_text(text)
    with pytest.raises(HostsError) as err:
        load_hosts(path)
    sentence = str(err.value)
    assert expected in sentence
    assert str(path) in sentence
    assert sentence.endswith(".") and "\n" not in sentence and "Traceback" not in sentence


def test_missing_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(HostsError, match="does not exist"):
        load_hosts(tmp_path / "nope.toml")
    # The default file may be absent: no hosts yet, every name is an ssh alias.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert default_hosts_path() == tmp_path / "k26-console" / "hosts.toml"
    assert load_hosts().hosts == {}
    (tmp_path / "k26-console").mkdir()
    default_hosts_path().write_text(GOOD)
    assert sorted(load_hosts().hosts) == ["gpu1", "twin"]
    assert resolve_host("twin").port == 2222
