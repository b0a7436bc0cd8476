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

# Order here is the order `--help` lists them.
_COMMAND_MODULES: tuple[str, ...] = (
    # one line per subcommand module `console/cli/cmd_<name>.py`
    "parse",
    "plan",
    "verify",
    "probe",
    "profiles",
    "apply",
    "twin",
    "demo",
    "console",
    "audit",
)


class _Parser(argparse.ArgumentParser):
    """argparse prints usage + a message and exits 2 on bad options; keep it to one sentence."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(
            f"k26-console: {message}.\n" if not message.endswith(".") else f"k26-console: {message}\n"
        )
        raise SystemExit(EXIT_USAGE)


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
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(func(args))
    except CliError as exc:
        sys.stderr.write(f"k26-console: {exc.sentence}\n")
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
