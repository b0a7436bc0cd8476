"""Issue 30 item 9: a hosts file or a profile nested ~500 deep (arrays, inline tables, or dotted keys that nest
as deep without recursing in the reader) was a RecursionError traceback in every command that reads it,
in the profile editor a crash, and the exporter died of it on SIGHUP though a bad reload must change
nothing. Now one sentence and exit 2, a line in the editor's checks, and "hosts not reloaded".
"""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from console.sources.alerts import AlertConfigError, load_alert_config
from console.sources.profile_store import ProfileStore, shipped_profile_dir
from console.tui.profiles import ProfilesScreen
from console.twin.host import free_port
from tests.support.cli import CLI, CTX200K, one_sentence, operator_env, run_cli, run_main, wait_until
from tests.tui_support import make_app

DEPTH = 600
DEEP = {
    "arrays": "model = " + "[" * DEPTH + "]" * DEPTH,
    "inline tables": "model = " + "{a = " * DEPTH + "1" + "}" * DEPTH,
    "dotted keys": "a." * DEPTH + "b = 1",
}
SAYS = "nests tables or arrays more than 32 levels deep"


def _hosts(tmp: Path, deep: str) -> Path:
    path = tmp / "hosts.toml"
    path.write_text(f'[hosts.gpu1]\nssh = "127.0.0.1"\nport = {free_port()}\n{deep}\n')
    return path


def _profile(tmp: Path, deep: str) -> Path:
    path = tmp / "deep.toml"
    path.write_text(
        CTX200K.replace('name = "ctx-200k"', 'name = "deep"').replace("[flags]\n", f"[flags]\n{deep}\n")
    )
    return path


@pytest.mark.parametrize("shape", ["arrays", "inline tables"])  # dotted keys: "not a known setting"
def test_a_deep_hosts_file_is_one_sentence_for_every_command(
    shape: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = _hosts(tmp_path, DEEP[shape])
    for argv in (
        ["verify", "gpu1", "--target-context", "1k", "--hosts", str(hosts)],
        ["snapshot", "gpu1", "--hosts", str(hosts)],
        ["audit", "gpu1", "--hosts", str(hosts)],
        ["restart", "gpu1", "--yes", "--hosts", str(hosts)],
        ["export", "gpu1", "--hosts", str(hosts)],
    ):
        code, out, err = run_main(argv, capsys)
        assert code == 2 and out == "", (argv, err)
        assert f"{hosts} {SAYS}" in one_sentence(err), argv
    with pytest.raises(AlertConfigError, match=SAYS):
        load_alert_config(hosts)


def test_a_deep_hosts_file_in_the_config_dir_is_one_sentence(tmp_path: Path) -> None:
    # The file a command reads when it names none (in a process of its own: the config dir is the
    # operator's of `tmp_path`).
    config = tmp_path / "config" / "k26-console"
    config.mkdir(parents=True)
    _hosts(config, DEEP["arrays"])
    res = run_cli(tmp_path, "verify", "gpu1", "--target-context", "1k", timeout=60)
    assert res.returncode == 2 and SAYS in one_sentence(res.stderr)


@pytest.mark.parametrize("shape", sorted(DEEP))
def test_a_deep_profile_is_one_sentence(
    shape: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = _profile(tmp_path, DEEP[shape].replace("model = ", "served-model-name = "))
    for argv in (["profiles", "validate", str(profile)], ["profiles", "show", str(profile)]):
        code, out, err = run_main(argv, capsys)
        assert code == 2 and out == "", (argv, err)
        assert f"{profile} {SAYS}" in one_sentence(err)


async def test_a_deep_profile_in_the_editor_is_a_check_not_a_crash(tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    shipped = shipped_profile_dir()
    assert shipped is not None
    app = make_app(store=ProfileStore([user, shipped]), profile="ctx-200k")
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("p")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ProfilesScreen)
        screen.editor.load_text(screen.editor.text + "\n" + DEEP["arrays"].replace("model", "x") + "\n")
        for _ in range(200):  # the check runs once typing pauses
            await pilot.pause(0.05)
            if screen.check is not None and any(SAYS in i.message for i in screen.check.errors):
                break
        else:
            raise AssertionError(f"no check says the profile is too deep: {screen.check}")
        assert app.is_running


def test_the_exporter_keeps_its_hosts_when_a_reload_finds_a_deep_file(tmp_path: Path) -> None:
    hosts = _hosts(tmp_path, "")
    port = free_port()
    log = tmp_path / "export.log"
    proc = subprocess.Popen(
        [*CLI, "export", "--hosts", str(hosts), "--listen", f"127.0.0.1:{port}", "--poll", "1"],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=operator_env(tmp_path),
        start_new_session=True,
    )

    def down() -> bool:
        # gpu1 is a port nobody listens on: up 0, and exported all the same.
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as res:
                return (
                    'k26_up{host="gpu1",' in (text := res.read().decode())
                    and "} 0.0" in text.split('k26_up{host="gpu1",')[1].split("\n")[0]
                )
        except OSError:
            return False

    try:
        assert wait_until(down, 60), log.read_text()
        hosts.write_text(hosts.read_text() + DEEP["arrays"] + "\n")
        proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: "hosts not reloaded" in log.read_text(), 30), log.read_text()
        assert SAYS in log.read_text() and "Traceback" not in log.read_text(), log.read_text()
        assert proc.poll() is None and down()  # still serving, gpu1 still exported
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    assert proc.returncode == 0, log.read_text()
