"""docs/exit-codes.md is the table scripts rely on: it must say what the code says (console/cli/
exit_codes.py), name every command, and each command must exit 2, in one sentence, on an option it does
not know. The other codes of each command are exercised by that command's own tests."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from console.cli.exit_codes import EXIT_CODES
from console.cli.main import _COMMANDS
from tests.support.cli import REPO, run_main

ROW = re.compile(r"^\| `(?P<cmd>[a-z]+)` \| (?P<code>[0-9+N]+) \| (?P<means>.+) \|$")


def _doc_table() -> dict[str, dict[str, str]]:
    table: dict[str, dict[str, str]] = {}
    for line in (REPO / "docs" / "exit-codes.md").read_text().splitlines():
        m = ROW.match(line)
        if m:
            table.setdefault(m["cmd"], {})[m["code"]] = m["means"]
    return table


def test_the_doc_says_what_the_code_says() -> None:
    assert _doc_table() == EXIT_CODES


def test_every_command_has_its_codes() -> None:
    assert set(EXIT_CODES) == set(_COMMANDS)
    for cmd, codes in EXIT_CODES.items():
        assert "2" in codes, f"{cmd}: bad input exits 2 everywhere"
        assert "0" in codes, cmd


@pytest.mark.parametrize("cmd", sorted(_COMMANDS))
def test_an_unknown_option_exits_2_in_one_sentence(cmd: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = run_main([cmd, "--no-such-option"], capsys)
    assert code == 2, (cmd, err)
    assert err.startswith("k26-console") and "Traceback" not in err, err


def test_the_readme_points_at_the_table() -> None:
    assert "docs/exit-codes.md" in (REPO / "README.md").read_text()


def test_busy_is_3_only_where_a_lock_is_taken() -> None:
    # A command that takes the host's lock says what exit 3 means; the others never exit 3.
    locking = {"apply", "restart", "rollback", "confirm"}
    assert {c for c, codes in EXIT_CODES.items() if "3" in codes} == locking
    assert all(Path(REPO / "console" / "cli" / f"cmd_{_COMMANDS[c]}.py").exists() for c in locking)
