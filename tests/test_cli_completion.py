"""`k26-console completion bash|zsh`: the script, sourced in a real bash, completes commands, options,
host names from hosts.toml and profile names from the profile directories."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import CTX200K, REPO, one_sentence, run_main


@pytest.fixture
def home(tmp_path: Path) -> Path:
    config = tmp_path / "config" / "k26-console"
    (config / "profiles").mkdir(parents=True)
    (config / "hosts.toml").write_text(
        '[hosts.gpu-a]\nssh = "127.0.0.1"\n\n[hosts.gpu-b]\nssh = "127.0.0.1"\n'
    )
    (config / "profiles" / "mine.toml").write_text(CTX200K.replace('name = "ctx-200k"', 'name = "mine"'))
    # `k26-console` on PATH as an installed one is: this interpreter running the package.
    (tmp_path / "bin").mkdir()
    launcher = tmp_path / "bin" / "k26-console"
    launcher.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m console.cli.main "$@"\n')
    launcher.chmod(0o755)
    return tmp_path


def _complete(home: Path, *words: str) -> list[str]:
    """COMPREPLY after Tab with the cursor at the end of the last word ("" for a new word)."""
    array = " ".join(f"'{w}'" for w in words)
    script = (
        "source <(k26-console completion bash) || exit 9\n"
        f"COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}\n"
        '_k26_console\nprintf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = {
        **os.environ,
        "PATH": f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_STATE_HOME": str(home / "state"),
        "PYTHONPATH": str(REPO),
    }
    res = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=home,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, res.stderr
    return sorted(line for line in res.stdout.splitlines() if line)


def test_bash_completes_commands_hosts_profiles_and_options(home: Path) -> None:
    assert _complete(home, "k26-console", "ap") == ["apply"]
    assert _complete(home, "k26-console", "ro") == ["rollback"]
    assert _complete(home, "k26-console", "gpu") == ["gpu-a", "gpu-b"]  # `k26-console HOST`
    assert _complete(home, "k26-console", "restart", "") == ["gpu-a", "gpu-b"]
    assert _complete(home, "k26-console", "apply", "gpu-a", "ctx-2") == ["ctx-200k", "ctx-256k"]
    # --hosts takes a value: the positional after it is still the host, then the profile.
    assert _complete(home, "k26-console", "apply", "--hosts", "h.toml", "gpu-a", "mi") == ["mine"]
    # The hosts come from the file --hosts names, wherever it stands on the line.
    (home / "lab.toml").write_text('[hosts.lab7]\nssh = "127.0.0.1"\n')
    assert _complete(home, "k26-console", "restart", "--hosts", "lab.toml", "") == ["lab7"]
    assert _complete(home, "k26-console", "rollback", "--hosts=lab.toml", "l") == ["lab7"]
    assert _complete(home, "k26-console", "probe", "gpu-a", "--profile", "m") == ["mine"]
    assert _complete(home, "k26-console", "profiles", "s") == ["show"]
    assert _complete(home, "k26-console", "profiles", "show", "mi") == ["mine"]
    assert {"--yes", "--break-stale-lock", "--json"} <= set(_complete(home, "k26-console", "rollback", "--"))
    assert _complete(home, "k26-console", "--v") == ["--version"]


def test_names_print_hosts_and_profiles_one_a_line(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "config"))
    assert run_main(["completion", "--names", "hosts"], capsys) == (0, "gpu-a\ngpu-b\n", "")
    code, out, _ = run_main(["completion", "--names", "profiles"], capsys)
    assert code == 0 and {"mine", "ctx-200k"} <= set(out.splitlines())
    # A hosts file that does not parse: no names, and no error in the middle of a command line.
    (home / "config" / "k26-console" / "hosts.toml").write_text("[hosts\n")
    assert run_main(["completion", "--names", "hosts"], capsys) == (0, "", "")


def test_zsh_script_runs_the_same_function_through_bashcompinit(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(["completion", "zsh"], capsys)
    assert code == 0
    assert "bashcompinit" in out and "_k26_console()" in out and "complete -o default -F _k26_console" in out
    code, _, err = run_main(["completion"], capsys)
    assert code == 2 and "name the shell" in one_sentence(err)
    code, _, err = run_main(["completion", "fish"], capsys)
    assert code == 2 and "fish" in one_sentence(err)
