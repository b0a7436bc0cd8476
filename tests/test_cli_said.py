"""The command line says what happened, exactly (issue 18 point 8): where a probe's results went, and the
drop-in path of the unit hosts.toml names rather than a default one."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.twin.host import TwinHost
from tests.support.cli import one_sentence, run_cli, run_main
from tests.support.twins import module_twin

TIME_SCALE = 0.002


twin = module_twin("said-twin", time_scale=TIME_SCALE)


def test_a_probe_without_profile_says_where_its_results_went(twin: TwinHost, tmp_path: Path) -> None:
    hosts = str(twin.hosts_toml)
    res = run_cli(tmp_path, "probe", "twin", "--depth", "2k", "--tokens", "3", "--hosts", hosts)
    assert res.returncode == 0, res.stderr
    history = tmp_path / "state" / "k26-console" / "probes.jsonl"
    # The twin runs its incident flags, no saved profile: the history is the only place.
    assert res.stdout.splitlines()[-1] == f"results kept in the probe history ({history})."

    applied = run_cli(
        tmp_path, "apply", "twin", "ctx-200k", "--yes", "--confirm-within", "0", "--hosts", hosts
    )
    assert applied.returncode == 0, (applied.stdout, applied.stderr)
    try:
        res = run_cli(tmp_path, "probe", "twin", "--depth", "2k", "--tokens", "3", "--hosts", hosts)
        assert res.returncode == 0, res.stderr
        assert res.stdout.splitlines()[-1] == (
            f"results kept in the probe history only ({history}); twin runs profile ctx-200k, whose "
            "[verified] is left as it was (--profile ctx-200k records them there)."
        )
        saved = tmp_path / "config" / "k26-console" / "profiles" / "ctx-200k.toml"
        before = saved.read_text()  # apply recorded its verified pool there
        assert "tok_s_at_depth" not in before

        res = run_cli(
            tmp_path,
            "probe",
            "twin",
            "--depth",
            "2k",
            "--tokens",
            "3",
            "--profile",
            "ctx-200k",
            "--hosts",
            hosts,
        )
        assert res.returncode == 0, res.stderr
        assert res.stdout.splitlines()[-1] == (
            f"results kept in ctx-200k's [verified] ({saved}) and in the probe history ({history})."
        )
        assert "tok_s_at_depth" in saved.read_text()
    finally:
        back = run_cli(tmp_path, "rollback", "twin", "--yes", "--to-unit-default", "--hosts", hosts)
        assert back.returncode == 0, (back.stdout, back.stderr)


HOSTS = """
[hosts.gpu-a]
ssh = "127.0.0.1"
unit = "sglang-k26-ddtree"

[hosts.gpu-b]
ssh = "127.0.0.1"
unit = "sglang-k26-ddtree"
unit_dir = "/run/systemd/system"
"""


@pytest.fixture
def operator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "config" / "k26-console").mkdir(parents=True)
    return tmp_path / "config" / "k26-console" / "hosts.toml"


def _dropin_line(out: str) -> str:
    (line,) = [line for line in out.splitlines() if line.startswith("drop-in ")]
    return line


def test_profiles_show_uses_the_unit_hosts_toml_names(
    operator: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    operator.write_text(HOSTS)
    code, out, _ = run_main(["profiles", "show", "ctx-200k", "--host", "gpu-a"], capsys)
    assert code == 0
    assert _dropin_line(out) == "drop-in /etc/systemd/system/sglang-k26-ddtree.service.d/50-k26-console.conf:"
    code, out, _ = run_main(["profiles", "show", "ctx-200k", "--host", "gpu-b"], capsys)
    assert _dropin_line(out) == "drop-in /run/systemd/system/sglang-k26-ddtree.service.d/50-k26-console.conf:"
    # Two hosts that disagree and no --host: the default; --unit always wins.
    code, out, _ = run_main(["profiles", "show", "ctx-200k"], capsys)
    assert _dropin_line(out) == "drop-in /etc/systemd/system/sglang.service.d/50-k26-console.conf:"
    code, out, _ = run_main(["profiles", "show", "ctx-200k", "--unit", "llm", "--host", "gpu-a"], capsys)
    assert _dropin_line(out) == "drop-in /etc/systemd/system/llm.service.d/50-k26-console.conf:"
    code, _, err = run_main(["profiles", "show", "ctx-200k", "--host", "nope"], capsys)
    assert code == 2 and "there is no host 'nope'" in one_sentence(err) and "gpu-a, gpu-b" in err


def test_profiles_show_takes_the_one_unit_of_hosts_toml(
    operator: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    operator.write_text(HOSTS.partition("[hosts.gpu-b]")[0])
    code, out, _ = run_main(["profiles", "show", "ctx-200k"], capsys)
    assert code == 0
    assert _dropin_line(out) == "drop-in /etc/systemd/system/sglang-k26-ddtree.service.d/50-k26-console.conf:"
