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
from collections.abc import Callable
from typing import Any

from console.cli.errors import EXIT_CHECK_FAILED, EXIT_USAGE, CliError
from console.core.text import terminal_safe

# Each subcommand and the module `console/cli/cmd_<module>.py` that registers it; the order here is the
# order `--help` lists them. A command line that names its command imports that module alone: each start
# of the CLI (a completion, a `snapshot` in a loop) pays for one command's imports, not all nineteen.
_COMMANDS: dict[str, str] = {
    "parse": "parse",
    "plan": "plan",
    "verify": "verify",
    "probe": "probe",
    "profiles": "profiles",
    "apply": "apply",
    "restart": "restart",
    "rollback": "rollback",
    "confirm": "confirm",
    "twin": "twin",
    "demo": "demo",
    "open": "console",
    "audit": "audit",
    "host": "host",
    "completion": "completion",
    "export": "export",
    "snapshot": "snapshot",
    "record": "record",
    "replay": "replay",
}


def _not_empty(convert: Callable[[str], Any] | None, name: str, positional: bool) -> Callable[[str], Any]:
    """`convert`, refusing an empty string first: an empty path reads as the current directory (`parse ''`
    said "is a directory", `twin --state-dir ''` wrote its files into the working directory) and an empty
    host as no host at all; no argument of any command means that."""

    def check(text: str) -> Any:
        if text == "":
            raise argparse.ArgumentTypeError(
                f"{name} must not be an empty string"
                if positional
                else f"{name} needs a value, not an empty string"
            )
        return convert(text) if convert is not None else text

    # argparse names a conversion that failed by its function's name ("invalid int value: 'x'").
    check.__name__ = getattr(convert, "__name__", "str")
    return check


class _Parser(argparse.ArgumentParser):
    """argparse prints usage + a message and exits 2 on bad options; keep it to one sentence."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if action.nargs != 0:  # every argument that takes a value, of every command
            longest = max(action.option_strings, key=len, default=None)
            name = longest or action.metavar or action.dest.upper()
            action.type = _not_empty(action.type, str(name), positional=longest is None)  # type: ignore[arg-type]
        return action

    def error(self, message: str) -> None:  # type: ignore[override]
        # "argument --limit: --limit must be at least 1": the option's name once is enough.
        head, sep, rest = message.partition(": ")
        if (
            sep
            and head.startswith("argument ")
            and rest.lower().startswith(head.removeprefix("argument ").split("/")[0].lower())
        ):
            message = rest
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


_CHANGES = frozenset({"apply", "restart", "rollback", "confirm", "probe"})
"""Commands whose outcome a closed output must not turn into exit 0."""


class _Version(argparse.Action):
    """`--version`: the installed version, read only when asked (importlib.metadata costs ~30 ms)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kw: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        sys.stdout.write(f"k26-console {_version()}\n")
        parser.exit()


def build_parser(only: str | None = None, *, outline: bool = False) -> argparse.ArgumentParser:
    """The whole command line, or with `only` (a command's name) that command alone. `outline`: every
    command named with its one-line help from the shipped shape (console/cli/shape.py) and no module
    imported, for `k26-console --help` (its options are each command's own --help)."""
    parser = _Parser(
        prog="k26-console",
        description="A full-screen console for SGLang inference servers on GPU hosts.",
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    if outline:
        from console.cli.shape import load_shape

        for name, command in load_shape()["commands"].items():
            sub.add_parser(name, help=command["help"], add_help=False)
        return parser
    for name, module_name in _COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(f"console.cli.cmd_{module_name}").register(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("k26-console")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _option_value(argv: list[str], option: str) -> str | None:
    """The value of `option` in `argv` (`--opt V` or `--opt=V`), read before argparse runs."""
    for i, token in enumerate(argv):
        if token == option and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith(option + "="):
            return token.partition("=")[2]
    return None


def _not_a_host(word: str, argv: list[str], commands: set[str]) -> str | None:
    """Why the first word of `k26-console WORD ...` is refused before a console opens on it: a typo of a
    command (unless hosts.toml names such a host), or a host name known to nothing. None lets it open."""
    from console.cli.hostcheck import close_command, unknown_host
    from console.sources.hosts import HostsError, load_hosts

    try:
        hosts = load_hosts(_option_value(argv, "--hosts"))
    except HostsError:
        hosts = None  # `open` reads the file again and says what is wrong with it
    if hosts is not None and hosts.get(word) is not None:
        return None
    command = close_command(word, commands - {"open"})
    if command is not None:
        return (
            f"{word!r} is not a command; did you mean `{command}`? "
            f"(`k26-console open {word}` opens the console on a host of that name)"
        )
    if hosts is None or not word.isprintable() or " " in word:
        return None  # `open` refuses such a name itself, in its own words
    return unknown_host(word, hosts)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `k26-console HOST` is `k26-console open HOST`: a first word that is no subcommand names a host.
    commands = set(_COMMANDS)
    if argv and not argv[0].startswith("-") and argv[0] not in commands:
        refused = _not_a_host(argv[0], argv, commands) if argv[0] else None
        if refused is not None:
            say(refused)
            return EXIT_USAGE
        argv.insert(0, "open")
    named = argv[0] if argv and argv[0] in commands else None
    # No command named (`--help`, `--version`, nothing): the outline, with no command module imported.
    parser = build_parser(named, outline=named is None)
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
        # `k26-console parse big.journal | head` must not end in a traceback, and a reader that has read
        # what it wanted is no failure of a command that only reads. A command that changes or measures
        # the host is another matter: its outcome did not reach the reader.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        if args.command in _CHANGES:
            say(f"the output of {args.command} was closed by its reader before its outcome was written.")
            return EXIT_CHECK_FAILED
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
