"""`k26-console open [HOST]` (and the bare `k26-console HOST`): the full-screen console on real hosts."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from console.cli.cmd_plan import finite_float, human_int
from console.cli.cmd_record import add_record_option, check_record_path
from console.cli.errors import UsageError
from console.core.capacity import MAX_TOKENS, range_text
from console.core.text import terminal_safe

if TYPE_CHECKING:
    from textual.app import App


def add_target_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--read-only", action="store_true", help="hide and refuse every action that changes the host"
    )
    p.add_argument(
        "--target-context",
        type=human_int,
        metavar="N",
        help="the context the KV gauge measures the pool against",
    )
    p.add_argument("--profile", metavar="NAME", help="take the gauge's target from this saved profile")


THEME_NAMES = ("dark", "light", "high-contrast")
"""The console's themes (console/tui/themes.py, which tests/test_tui_themes.py holds to this list): named
here so that building the parser never imports Textual."""


def add_theme_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--theme",
        metavar="NAME",
        help=f"the console's colours: {', '.join(THEME_NAMES)} (default: [ui] theme in the hosts file, else dark)",
    )


def resolve_theme(choice: str | None, configured: str | None) -> str:
    """--theme, else the hosts file's `[ui] theme`, else dark; an unknown name is one sentence."""
    name = choice if choice is not None else configured
    if name is None:
        return THEME_NAMES[0]
    if name not in THEME_NAMES:
        where = "--theme" if choice is not None else "[ui] theme in the hosts file"
        raise UsageError(
            f"{where} names no theme {terminal_safe(repr(name))}: choose one of {', '.join(THEME_NAMES)}."
        )
    return name


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "open",
        help="the full-screen console for a host (bare `k26-console HOST` does the same)",
        description=(
            "Open the console on HOST from the hosts file (or an ssh alias); without HOST, on every host "
            "in the hosts file, one tab each."
        ),
    )
    p.add_argument("host", nargs="?", metavar="HOST", help="a host in hosts.toml or an ssh target")
    p.add_argument("--hosts", type=Path, metavar="FILE", help="the hosts file (default: the user config dir)")
    add_target_options(p)
    p.add_argument(
        "--confirm-within",
        type=finite_float,
        default=None,
        metavar="S",
        help=(
            "commit-confirmed, as `apply`: an apply from the console arms a rollback on the host that fires "
            "unless the new boot is verified within S seconds (default: twice the host's usual restart plus "
            "2 minutes, at least 300 s; 0 arms none)"
        ),
    )
    add_record_option(p)
    add_theme_option(p)
    p.set_defaults(func=run)


def require_terminal(command: str) -> None:
    """The console draws a full screen and reads keys: without a terminal on both ends it would write
    escape codes into a pipe or a file for ever. Refuse, pointing at the one-shot commands."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        side = "standard input" if not sys.stdin.isatty() else "standard output"
        raise UsageError(
            f"{command} is a full-screen console and needs a terminal, but {side} is not one "
            "(for a one-shot answer use parse, verify, probe or plan)."
        )


def resolve_target(args: argparse.Namespace) -> tuple[int | None, str | None]:
    """The gauge's target context: --target-context, else the named profile's target, else (None, None):
    each host's gauge then takes the target of the profile its audit trail says it was last applied with
    (`HostDashboard.learn_applied_target`, fed as the trail is read), as `snapshot` (`applied_target_of`)
    and `export` do. That needs the host's trail, so it is learned per host once connected, not here."""
    if args.target_context is not None:
        if not 0 < args.target_context <= MAX_TOKENS:
            raise UsageError(
                f"--target-context must be {range_text(1, MAX_TOKENS, 'tokens')}, not {args.target_context}."
            )
        return args.target_context, "--target-context"
    if args.profile:
        from console.core.profiles import ProfileError
        from console.sources.profile_store import ProfileStore

        try:
            profile = ProfileStore().load(args.profile)
        except (ProfileError, KeyError, LookupError, FileNotFoundError) as exc:
            sentence = str(exc).strip().strip("'\"") or f"there is no profile named {args.profile!r}"
            raise UsageError(sentence if sentence.endswith(".") else f"{sentence}.") from None
        return profile.target_context, f"profile {profile.name}"
    return None, None


def run(args: argparse.Namespace) -> int:
    from console.sources.hosts import HostsError, load_hosts, resolve_host
    from console.tui.app import ConsoleApp, HostEntry
    from console.tui.lifeline import Lifeline, end_now

    host = args.host or ""
    if not host.isprintable() or " " in host:
        # No host or ssh alias holds a control character or a space; such a name would be shown in
        # titles and messages (drawn safe) only to fail to resolve.
        raise UsageError(f"{terminal_safe(repr(args.host))} is not a host name.")
    try:
        hosts = load_hosts(args.hosts)
        if args.host:
            from console.cli.hostcheck import unknown_host

            refused = unknown_host(args.host, hosts)
            if refused is not None:  # a name nothing knows would retry for ever behind a full screen
                raise UsageError(refused)
        configs = [resolve_host(args.host, hosts)] if args.host else list(hosts.hosts.values())
    except HostsError as exc:
        raise UsageError(str(exc)) from None
    if not configs:
        where = hosts.path or "the hosts file"
        raise UsageError(f"no host given and {where} lists none; name a HOST or add [hosts.NAME] tables.")
    target, source = resolve_target(args)
    theme = resolve_theme(args.theme, hosts.ui.theme)
    confirm_within = getattr(args, "confirm_within", None)
    if confirm_within is not None and not 0 <= confirm_within <= 86_400:
        raise UsageError(f"--confirm-within must be between 0 and 86400 seconds, not {confirm_within:g}.")
    alerts = hosts.alerts  # the [alerts] table, read with the hosts (one file, one reading)
    check_record_path(args.record, [c.name for c in configs])
    require_terminal("k26-console open")
    app = ConsoleApp(
        [HostEntry(name=c.name, config=c, learn=True, confirm_within_s=confirm_within) for c in configs],
        read_only=args.read_only,
        target=target,
        target_source=source,
        profile=args.profile,
        alerts=alerts,
        record=args.record,
        theme=theme,
    )
    with Lifeline(app) as lifeline:
        code = run_console(app)
    if lifeline.fired:
        say_why_ended(lifeline.reason, "left the hosts")
        end_now(lifeline.exit_code(code))
    return code


def crash_log_dir() -> Path:
    """Where the console writes the traceback of an error it died of (the platform's user log dir)."""
    from platformdirs import user_log_path

    return user_log_path("k26-console")


def run_console(app: App[Any], log_dir: Path | None = None, *, headless: bool = False) -> int:
    """`app.run()` and the exit status it earns: the app's own, or 1 when it died of an exception. Textual
    prints the traceback on the terminal it restores; it also goes into a file under `log_dir` (default
    `crash_log_dir()`, read before a demo's sandbox hides the operator's), named in one sentence, since
    a tmux pane that closes takes the traceback with it."""
    result = app.run(headless=headless)
    error = getattr(app, "_exception", None)
    code = app.return_code
    if error is None and not code:
        return int(result or 0) if isinstance(result, int) else 0
    where = _write_crash_log(log_dir or crash_log_dir(), error)
    what = (
        f"{type(error).__name__}: {terminal_safe(str(error))[:200]}" if error is not None else f"exit {code}"
    )
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"k26-console: the console stopped on an error ({what}); {where}.\n")
    return code if isinstance(code, int) and code > 0 else 1


def _write_crash_log(directory: Path, error: BaseException | None) -> str:
    import time
    import traceback

    text = (
        "".join(traceback.format_exception(error)) if error is not None else "the console exited non-zero\n"
    )
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = directory / f"crash-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        return f"its traceback could not be written under {directory} ({exc.strerror or exc})"
    return f"the traceback is in {path}"


def say_why_ended(reason: str | None, done: str) -> None:
    """One line on stderr when a signal or the lost terminal ended the console (to /dev/null when the
    terminal is the one that went)."""
    if reason is not None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"k26-console: {reason}: {done} and quit.\n")
