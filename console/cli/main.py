"""Entry point of `k26-console`.

Each subcommand lives in its own module `console.cli.cmd_<name>` exposing
`register(subparsers: argparse._SubParsersAction) -> None`; `register` adds the subparser and sets
`func=handler` where `handler(args: argparse.Namespace) -> int` returns the exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

from console.cli.errors import EXIT_USAGE, CliError
from console.core.text import terminal_safe

# Order here is the order `--help` lists them.
_COMMAND_MODULES: tuple[str, ...] = (
    # one line per subcommand module `console/cli/cmd_<name>.py`
    "parse",
    "plan",
    "verify",
    "probe",
    "profiles",
    "apply",
    "confirm",
    "twin",
    "demo",
    "console",
    "audit",
    "host",
)


class _Parser(argparse.ArgumentParser):
    """argparse prints usage + a message and exits 2 on bad options; keep it to one sentence."""

    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse quotes the operator's own words back (an unknown choice, a bad number): drawn safe too.
        say(message if message.endswith(".") else f"{message}.")
        raise SystemExit(EXIT_USAGE)


def say(sentence: str) -> None:
    """One sentence on stderr. Sentences quote host names, file contents and argv, so every control
    character is drawn as its picture: an ESC or BEL from outside never reaches the terminal."""
    sentence = terminal_safe(sentence)
    sys.stderr.write(
        f"k26-console: {sentence}\n" if sentence.endswith(".") else f"k26-console: {sentence}.\n"
    )


def _empty_argument(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The sentence refusing the first empty argument (`''` or `--opt=`), or None. An empty path reads as
    the current directory (`parse ''` said "is a directory", `twin --state-dir ''` wrote its files into
    the working directory) and an empty host as no host at all: no option of any command means that."""
    current = parser
    positionals = [a for a in current._actions if not a.option_strings]
    index = 0
    expecting: str | None = None
    for token in argv:
        if expecting is not None:
            if token == "":
                return f"{expecting} needs a value, not an empty string."
            expecting = None
            continue
        if token.startswith("-") and token != "-":
            option, has_value, value = token.partition("=")
            if has_value and not value:
                return f"{option} needs a value, not an empty string."
            known = current._option_string_actions
            action = known.get(option)
            if action is None and option.startswith("--"):
                matches = [known[o] for o in known if o.startswith(option)]  # argparse's abbreviations
                action = matches[0] if len({id(a) for a in matches}) == 1 else None
            if action is not None and action.nargs != 0 and not has_value:
                expecting = option
            continue
        action = positionals[index] if index < len(positionals) else None
        if token == "":
            what = (action.metavar or action.dest.upper()) if action is not None else "an argument"
            return f"{what} must not be an empty string."
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(token)
            if chosen is None:
                return None  # argparse names the unknown command itself
            current = chosen
            positionals = [a for a in current._actions if not a.option_strings]
            index = 0
            continue
        if action is not None and action.nargs not in ("*", "+", argparse.REMAINDER):
            index += 1
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="k26-console",
        description="A full-screen console for SGLang inference servers on GPU hosts.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in _COMMAND_MODULES:
        module = importlib.import_module(f"console.cli.cmd_{name}")
        module.register(sub)
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> set[str]:
    return {name for a in parser._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # `k26-console HOST` is `k26-console open HOST`: a first word that is no subcommand names a host.
    if argv and not argv[0].startswith("-") and argv[0] not in _subcommands(parser):
        argv.insert(0, "open")
    empty = _empty_argument(parser, argv)
    if empty is not None:
        say(empty)
        return EXIT_USAGE
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(func(args))
    except CliError as exc:
        say(exc.sentence)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `k26-console parse big.journal | head` must not end in a traceback.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
