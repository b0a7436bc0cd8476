"""The `[alerts]` table of the config file and the hook runner (console/sources/alerts.py), with real
hook scripts."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from console.core.alerts import DEFAULT_RULES, Alert, Severity, TransitionKind, parse_rule
from console.sources.alerts import (
    MAX_OUTPUT,
    AlertConfigError,
    HookRunner,
    load_alert_config,
    parse_alert_config,
    run_hook,
)
from console.sources.hosts import HostsError, load_hosts

ALERT = Alert(
    host="gpu1",
    rule="queue > 16",
    severity=Severity.WARNING,
    state=TransitionKind.FIRED,
    value=23.0,
    message="queue = 23 (queue > 16)",
    ts=1_780_000_000.0,
)


def script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / name
    path.write_text("import sys, time\n" + body)
    return [sys.executable, str(path)]


def test_the_hosts_file_holds_the_alerts_table(tmp_path: Path) -> None:
    file = tmp_path / "hosts.toml"
    file.write_text(
        '[hosts.gpu1]\nssh = "gpu1"\n\n[alerts]\nrules = ["queue > 16", { when = "kv_used_pct > 90", '
        'severity = "critical" }]\nbell = false\ncommand = ["~/bin/page", "--team", "ops"]\n'
        "command_timeout_s = 3\n"
    )
    assert set(load_hosts(file).hosts) == {"gpu1"}
    config = load_alert_config(file)
    assert [(r.key, r.severity) for r in config.rules] == [
        ("queue > 16", Severity.WARNING),
        ("kv_used_pct > 90", Severity.CRITICAL),
    ]
    assert config.bell is False and config.command_timeout_s == 3.0
    assert config.command == (str(Path.home() / "bin/page"), "--team", "ops")
    # No table, or no file at the default place: the default set, bell on, no hook.
    bare = tmp_path / "bare.toml"
    bare.write_text('[hosts.gpu1]\nssh = "gpu1"\n')
    defaults = load_alert_config(bare)
    assert [r.key for r in defaults.rules] == [parse_rule(r).key for r in DEFAULT_RULES]
    assert defaults.bell is True and defaults.command is None
    assert parse_alert_config({"rules": []}).rules == ()


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"rules": ["queue >> 16"]}, "[alerts]: the alert rule 'queue >> 16' is not `metric op number`"),
        ({"rules": "queue > 16"}, "rules must be a list"),
        ({"rule": ["queue > 16"]}, "unknown key 'rule'"),
        ({"bell": "yes"}, "bell must be true or false"),
        ({"command": "page --team ops"}, "command must be a non-empty list of strings"),
        ({"command": []}, "command must be a non-empty list of strings"),
        ({"command_timeout_s": 0}, "command_timeout_s must be a number of seconds"),
        ("on", "must be a table"),
    ],
)
def test_a_bad_alerts_table_is_one_sentence(table: object, says: str) -> None:
    with pytest.raises(AlertConfigError) as err:
        parse_alert_config({"alerts": table}["alerts"])
    text = str(err.value)
    assert says in text, text
    assert "\n" not in text and text.endswith(".")


def test_a_missing_named_config_file_is_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(AlertConfigError, match=r"^the hosts file .*nope.toml does not exist\.$"):
        load_alert_config(tmp_path / "nope.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[alerts\n")
    with pytest.raises(AlertConfigError, match="is not valid TOML"):
        load_alert_config(broken)


def test_one_reading_of_the_config_file_holds_hosts_ui_and_alerts(tmp_path: Path) -> None:
    # One model, one error path: a bad [alerts] table is the hosts file's error for every command.
    file = tmp_path / "hosts.toml"
    file.write_text(
        '[hosts.gpu1]\nssh = "gpu1"\n\n[ui]\ntheme = "light"\n\n[alerts]\nrules = ["queue > 3"]\n'
    )
    config = load_hosts(file)
    assert set(config.hosts) == {"gpu1"} and config.ui.theme == "light"
    assert [r.key for r in config.alerts.rules] == ["queue > 3"] and config.alerts.path == file
    file.write_text('[hosts.gpu1]\nssh = "gpu1"\n\n[alerts]\nbell = "yes"\n')
    with pytest.raises(HostsError, match=r"\[alerts\] bell must be true or false"):
        load_hosts(file)


async def test_the_hook_gets_the_alert_as_json_on_stdin(tmp_path: Path) -> None:
    saved = tmp_path / "saved.json"
    argv = script(
        tmp_path, "hook.py", "open(sys.argv[1], 'wb').write(sys.stdin.buffer.read()); print('paged')\n"
    )
    result = await run_hook([*argv, str(saved)], ALERT, timeout_s=30)
    assert result.ok and result.returncode == 0 and result.output == "paged\n"
    assert json.loads(saved.read_text()) == ALERT.model_dump(mode="json")
    assert json.loads(saved.read_text())["state"] == "fired"


async def test_hook_failures_are_sentences_and_reported_once(tmp_path: Path) -> None:
    failing = script(tmp_path, "fail.py", "sys.stdin.read(); print('no route to pager'); sys.exit(3)\n")
    result = await run_hook(failing, ALERT)
    assert not result.ok and result.returncode == 3
    assert result.problem == f"the alert command {sys.executable} exited with status 3: no route to pager."

    missing = await run_hook([str(tmp_path / "no-such-hook")], ALERT)
    assert missing.problem is not None and "could not start: No such file or directory." in missing.problem

    slow = script(tmp_path, "slow.py", "time.sleep(60)\n")
    started = time.monotonic()
    timed_out = await run_hook(slow, ALERT, timeout_s=0.5)
    assert time.monotonic() - started < 10
    assert timed_out.problem is not None and "did not finish within 0.5s and was killed" in timed_out.problem

    loud = script(tmp_path, "loud.py", "sys.stdout.write('x' * 1_000_000)\n")
    big = await run_hook(loud, ALERT)
    assert big.ok and big.truncated and len(big.output) == MAX_OUTPUT

    from console.sources.alerts import AlertConfig

    runner = HookRunner(AlertConfig(rules=(), command=tuple(failing)))
    assert (await runner.deliver(ALERT)) == result.problem
    assert (await runner.deliver(ALERT)) is None  # the same failure again: said once
    runner.config = AlertConfig(rules=(), command=tuple(script(tmp_path, "ok.py", "sys.stdin.read()\n")))
    assert (await runner.deliver(ALERT)) is None
    runner.config = AlertConfig(rules=(), command=tuple(failing))
    assert (await runner.deliver(ALERT)) == result.problem  # failing again after a success: said again


def test_open_with_a_bad_alerts_table_is_one_sentence_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.cli import one_sentence, run_main

    file = tmp_path / "hosts.toml"
    file.write_text('[hosts.gpu1]\nssh = "gpu1"\n\n[alerts]\nrules = ["kv_used > 95"]\n')
    code, out, err = run_main(["open", "gpu1", "--hosts", str(file)], capsys)
    assert code == 2 and out == ""
    assert "the alert rule 'kv_used > 95' names an unknown metric 'kv_used'" in one_sentence(err)
