"""`k26-console --help` and `completion bash|zsh` read the command line's shape from the package's data
(console/cli/shape.py) instead of importing every command module: the data must say what the parser
says, and those commands (and `parse`) must import no SSH, Textual or pydantic code."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from console.cli.main import build_parser
from console.cli.shape import load_shape, render, shape_of
from tests.support.cli import REPO

REGENERATE = "python -m console.tools.cli_shape --write"


def test_the_shipped_shape_is_the_parsers() -> None:
    live = shape_of(build_parser())
    assert load_shape() == live, f"console/data/cli-shape.json is out of date: run `{REGENERATE}`"
    assert render(live) == (REPO / "console" / "data" / "cli-shape.json").read_text(), REGENERATE


def test_the_outline_lists_every_command_with_its_help() -> None:
    outline = build_parser(outline=True).format_help()
    for name, command in shape_of(build_parser())["commands"].items():
        assert name in outline and command["help"].split()[0] in outline


# importlib.resources: ~10 ms of the ~70 ms `--help` took (the shape file is read beside the package).
HEAVY = (
    "asyncssh",
    "textual",
    "pydantic",
    "rich",
    "console.core.events",
    "console.sources",
    "importlib.resources",
)


def _modules_after(argv: list[str]) -> list[str]:
    """The modules a fresh interpreter holds once `k26-console ARGV` has run (its exit included)."""
    code = (
        "import sys, json\n"
        "from console.cli.main import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "sys.stderr.write('\\nMODULES ' + json.dumps(sorted(sys.modules)))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, input="", timeout=60, cwd=REPO
    )
    loaded: list[str] = json.loads(res.stderr.rsplit("MODULES ", 1)[1])
    return loaded


def _within(loaded: list[str], packages: tuple[str, ...]) -> list[str]:
    return sorted({m for m in loaded for h in packages if m == h or m.startswith(h + ".")})


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["completion", "bash"], ["completion", "zsh"], ["parse", "-", "--kinds", "pool_summary"]],
    ids=["help", "completion-bash", "completion-zsh", "parse"],
)
def test_light_commands_import_no_ssh_or_textual(argv: list[str]) -> None:
    heavy = HEAVY if argv[0] != "parse" else ("asyncssh", "textual", "console.sources.transport")
    found = _within(_modules_after(argv), heavy)
    assert found == [], f"{argv}: {found[:10]}"


@pytest.mark.parametrize(
    ("argv", "did"),
    [
        (
            [
                "verify",
                "--journal",
                str(REPO.parent / "shared/corpus/seed-restart-mfs094.journal"),
                "--target-context",
                "200k",
            ],
            "console.core.apply",
        ),
        (["profiles", "list"], "console.core.profiles"),
    ],
    ids=["verify", "profiles-list"],
)
def test_commands_that_write_no_profile_import_no_toml_writer_or_textual(argv: list[str], did: str) -> None:
    """tomlkit (10 ms of a start) loads where a profile is written; verify and a listing write none. Nor do
    they read a server's metrics (console.core.serving_metrics builds its table at import)."""
    loaded = _modules_after(argv)
    assert did in loaded, f"the control: {argv[0]} did its work ({did})"
    found = _within(loaded, ("tomlkit", "textual", "console.core.serving_metrics"))
    assert found == [], f"{argv}: {found[:10]}"


def test_every_event_class_says_what_it_is() -> None:
    """A dataclass without a docstring gets one made from `inspect.signature` at import: the 17 event classes
    without one cost every command that imports the events ~3 ms (console/core/events.py)."""
    from console.core import events

    made = [
        c.__name__
        for c in (events.EventBase, *events.EVENT_TYPES.values())
        if not c.__doc__ or c.__doc__.startswith(f"{c.__name__}(")
    ]
    assert made == []
