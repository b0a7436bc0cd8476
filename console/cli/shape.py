"""The command line's shape: each command's one-line help, its options (and which take a value), and the
actions of `profiles`. `k26-console --help` and `completion bash|zsh` need only this, and reading it from
`console/data/cli-shape.json` spares them importing all nineteen command modules (and with them pydantic,
the event models and rich: ~400 ms, against ~60 ms). The file is made from the parser itself:

    python -m console.tools.cli_shape --write

and tests/test_cli_shape.py fails when it no longer says what the parser says (a new command, option or
help line without a regenerated file).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TypedDict

__all__ = ["CommandShape", "Shape", "load_shape", "shape_of"]

SHAPE_FILE = "cli-shape.json"


class CommandShape(TypedDict):
    help: str
    options: list[str]
    """Every option string of the command (and of its subcommands), sorted."""
    valued: list[str]
    """Those that take a value."""
    actions: list[str]
    """Its own subcommands (`profiles list|show|...`), in the parser's order."""


class Shape(TypedDict):
    commands: dict[str, CommandShape]
    """In the order `--help` lists them."""


def _children(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {
        name: choice
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, choice in action.choices.items()
    }


def _helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    return {
        choice.dest: str(choice.help or "")
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for choice in action._choices_actions
    }


def _options(parser: argparse.ArgumentParser) -> tuple[set[str], set[str]]:
    every: set[str] = set()
    valued: set[str] = set()
    for action in parser._actions:
        for option in action.option_strings:
            every.add(option)
            if action.nargs != 0:
                valued.add(option)
    for child in _children(parser).values():
        more, more_valued = _options(child)
        every |= more
        valued |= more_valued
    return every, valued


def shape_of(parser: argparse.ArgumentParser) -> Shape:
    """The shape of a built parser (the whole command line)."""
    helps = _helps(parser)
    commands: dict[str, CommandShape] = {}
    for name, child in _children(parser).items():
        every, valued = _options(child)
        commands[name] = CommandShape(
            help=helps.get(name, ""),
            options=sorted(every),
            valued=sorted(valued),
            actions=list(_children(child)),
        )
    return Shape(commands=commands)


def load_shape() -> Shape:
    """The shape shipped with the package (console/data/cli-shape.json)."""
    # Beside the package's modules, as every install puts it: importlib.resources cost `--help` ~10 ms to
    # import, an eighth of its start.
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", SHAPE_FILE)
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    shape: Shape = json.loads(text)
    return shape


def render(shape: Shape) -> str:
    return json.dumps(shape, indent=1, sort_keys=False, ensure_ascii=False) + "\n"
