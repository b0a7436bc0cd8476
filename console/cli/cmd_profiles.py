"""`k26-console profiles list|show|diff|validate`: the saved flag profiles.

- `list`: every profile (user profiles shadow the shipped examples), with target and last verified pool;
- `show NAME`: the profile, its argv and the systemd drop-in it would write;
- `diff A B`: what changes going from A to B, flags compared as SGLang reads them;
- `validate NAME [--sglang-version V] [--host HOST | --journal FILE]`: the profile against that version's
  real flag list and, calibrated on a journal's boots, the capacity planner (fits, headroom); exit 1 when
  it would not start or the planner refuses it, 0 otherwise (warnings are printed, not fatal).

A profile that is not there or does not parse is one sentence (with the TOML line number) and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from console.cli.cmd_plan import finite_float, ranged
from console.cli.errors import EXIT_CHECK_FAILED, EXIT_OK, UsageError
from console.cli.tables import cell, render, table
from console.core.apply import PlannerVerdict
from console.core.capacity import MAX_GPU_MEM_GIB
from console.core.flags import FlagList, UnknownVersion, available_versions, load_flag_list
from console.core.profiles import (
    Profile,
    ProfileError,
    argv_lines,
    diff_profiles,
    profile_argv,
    profile_dropin,
    validate_profile,
)
from console.core.systemd import DROPIN_NAME, ExecStartError, dropin_path, validate_unit_name
from console.core.text import json_safe, terminal_safe
from console.sources.profile_store import ProfileStore


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("profiles", help="list, show, diff and validate the saved flag profiles")
    p.add_argument(
        "--dir",
        dest="dirs",
        action="append",
        type=Path,
        metavar="DIR",
        help="look for profiles here instead of the user and shipped directories (repeatable)",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p))
    actions.required = True

    ls = actions.add_parser("list", help="every profile, with its target and last verified pool")
    ls.add_argument("--json", action="store_true")

    show = actions.add_parser("show", help="a profile, its argv and its systemd drop-in")
    show.add_argument("name", metavar="NAME")
    show.add_argument(
        "--unit",
        default=None,
        help=(
            "the unit whose drop-in path is shown (default: --host's unit, else the one unit the hosts in "
            "hosts.toml name, else sglang)"
        ),
    )
    show.add_argument("--host", metavar="HOST", help="show the drop-in as apply would write it on HOST")
    show.add_argument(
        "--hosts", metavar="FILE", help="the hosts file (default: hosts.toml in the config dir)"
    )
    show.add_argument("--json", action="store_true")

    diff = actions.add_parser("diff", help="what changes going from profile A to profile B")
    diff.add_argument("a", metavar="A")
    diff.add_argument("b", metavar="B")
    diff.add_argument("--json", action="store_true")

    val = actions.add_parser("validate", help="check a profile against SGLang's real flag list")
    val.add_argument("name", metavar="NAME")
    val.add_argument("--sglang-version", metavar="V", help="override the profile's sglang_version")
    planner = val.add_mutually_exclusive_group()
    planner.add_argument(
        "--journal", metavar="FILE", help="calibrate the capacity planner on this journal's boots"
    )
    planner.add_argument(
        "--host", metavar="HOST", help="calibrate the capacity planner on HOST's unit journal (over SSH)"
    )
    val.add_argument("--hosts", metavar="FILE", help="the hosts file for --host")
    val.add_argument(
        "--min-headroom-gib",
        type=ranged(finite_float, 0, MAX_GPU_MEM_GIB, "GiB"),
        default=None,
        metavar="G",
        help="least headroom the planner keeps (default 3)",
    )
    val.add_argument("--json", action="store_true")

    for q in (p, ls, show, diff, val):
        q.set_defaults(func=run)


def _store(args: argparse.Namespace) -> ProfileStore:
    return ProfileStore(args.dirs) if args.dirs else ProfileStore()


def _load(store: ProfileStore, name: str) -> Profile:
    try:
        return store.load(name)
    except ProfileError as exc:
        raise UsageError(str(exc)) from None


def _flag_list(version: str) -> FlagList:
    try:
        return load_flag_list(version)
    except UnknownVersion as exc:
        raise UsageError(f"{exc}.") from None


def _out(text: str) -> None:
    # Names, notes, flag values and paths come from profile files: every control character is drawn
    # as its picture (line breaks kept: the drop-in is printed as the file it would be).
    text = terminal_safe(text, keep_newlines=True)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _json(data: Any) -> None:
    sys.stdout.write(json_safe(json.dumps(data, indent=2, default=str, ensure_ascii=False)) + "\n")


def run(args: argparse.Namespace) -> int:
    store = _store(args)
    action = args.action
    if action == "list":
        return _list(store, args)
    if action == "show":
        return _show(store, args)
    if action == "diff":
        return _diff(store, args)
    return _validate(store, args)


def _list(store: ProfileStore, args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    for entry in store.entries():
        row: dict[str, Any] = {"name": entry.name, "origin": entry.origin, "path": str(entry.path)}
        try:
            prof = store.load(entry.name)
        except ProfileError as exc:
            row["error"] = str(exc)
        else:
            row |= {
                "target_context": prof.target_context,
                "sglang_version": prof.sglang_version,
                "verified_pool_tokens": prof.verified.pool_tokens if prof.verified else None,
                "verified_when": prof.verified.when.isoformat()
                if prof.verified and prof.verified.when
                else None,
            }
        rows.append(row)
    if args.json:
        _json(rows)
        return EXIT_OK
    if not rows:
        _out("no profiles in " + ", ".join(str(d) for d in store.dirs))
        return EXIT_OK
    listing = table("name", "target", "sglang", "verified pool", "verified", "origin", right=("target",))
    broken: list[dict[str, Any]] = []
    for r in rows:
        if "error" in r:
            broken.append(r)
            continue
        pool = f"{r['verified_pool_tokens']:,}" if r["verified_pool_tokens"] else "—"
        when = (r["verified_when"] or "")[:10] or ("?" if r["verified_pool_tokens"] else "never")
        listing.add_row(
            cell(r["name"], "bold"),
            f"{r['target_context']:,}",
            cell(r["sglang_version"]),
            cell(pool, "green" if r["verified_pool_tokens"] else "dim"),
            when,
            r["origin"],
        )
    if len(broken) < len(rows):
        sys.stdout.write(render(listing))
    for r in broken:
        _out(f"{r['name']}  unreadable: {r['error']}")
    return EXIT_OK


def _show(store: ProfileStore, args: argparse.Namespace) -> int:
    prof = _load(store, args.name)
    fl = _flag_list(prof.sglang_version)
    try:
        path = _dropin_path(args)
        dropin = profile_dropin(prof, fl)
    except ExecStartError as exc:
        raise UsageError(f"profile {prof.name} cannot be written as a systemd unit: {exc}.") from None
    argv = profile_argv(prof, fl)
    if args.json:
        _json({"profile": prof.model_dump(mode="json"), "argv": argv, "dropin_path": path, "dropin": dropin})
        return EXIT_OK
    _out(f"profile {prof.name}: target context {prof.target_context:,}, SGLang {prof.sglang_version}")
    if prof.notes:
        # On one line: split on whitespace, then any control character left is drawn, not sent.
        _out("notes: " + terminal_safe(" ".join(prof.notes.split())))
    v = prof.verified
    if v and v.pool_tokens is not None:
        when = v.when.isoformat() if v.when else "unknown time"
        _out(
            f"verified: pool {v.pool_tokens:,} tokens, headroom {v.headroom_gib} GiB, on {v.host or '?'} at {when}"
        )
        for depth, tps in sorted(v.tok_s_at_depth.items()):
            _out(f"  decode at depth {depth:,}: {tps} tok/s")
    else:
        _out("verified: never")
    _out("")
    _out("argv:")
    _out("  " + " \\\n    ".join(terminal_safe(line) for line in argv_lines(argv)))
    _out("")
    _out(f"drop-in {path}:")
    _out(dropin)
    return EXIT_OK


def _dropin_path(args: argparse.Namespace) -> str:
    """Where `apply` writes the drop-in: --unit (in /etc/systemd/system), else the unit and unit_dir of
    --host, else of the hosts in hosts.toml when they all name one, else the default unit's."""
    if args.unit is not None:
        return dropin_path(args.unit)
    from console.sources.hosts import DEFAULT_UNIT, HostsError, load_hosts, resolve_host

    try:
        hosts = load_hosts(args.hosts)
        if args.host is not None:
            if hosts.get(args.host) is None:
                from console.cli.hostcheck import did_you_mean

                known = ", ".join(sorted(hosts.hosts)) or "none"
                raise UsageError(
                    f"there is no host {args.host!r} in {hosts.path}{did_you_mean(args.host, hosts)} "
                    f"(known: {known})."
                )
            configs = [resolve_host(args.host, hosts)]
        else:
            configs = list(hosts.hosts.values())
    except HostsError as exc:
        raise UsageError(f"{str(exc).rstrip('.')}.") from None
    places = {(c.unit_dir.rstrip("/"), validate_unit_name(c.unit)) for c in configs}
    if len(places) != 1:
        return dropin_path(DEFAULT_UNIT)
    ((unit_dir, unit),) = places
    return f"{unit_dir}/{unit}.d/{DROPIN_NAME}"


def _diff(store: ProfileStore, args: argparse.Namespace) -> int:
    a = _load(store, args.a)
    b = _load(store, args.b)
    fl = _flag_list(b.sglang_version)
    d = diff_profiles(a, b, fl)
    if args.json:
        _json(d.model_dump(mode="json"))
        return EXIT_OK
    if d.empty:
        _out(f"{a.name} and {b.name} run the same server.")
    for line in d.lines():
        _out(line)
    for problem in d.problems:
        _out(f"! {problem}")
    return EXIT_OK


def _validate(store: ProfileStore, args: argparse.Namespace) -> int:
    prof = _load(store, args.name)
    version = args.sglang_version or prof.sglang_version
    fl = _flag_list(version)
    result = validate_profile(prof, fl)
    verdict = _planner(prof, fl, args)
    refused = verdict.checked and verdict.fits is False
    if args.json:
        data = result.model_dump(mode="json")
        data["ok"] = result.ok and not refused
        data["known_versions"] = available_versions()
        data["planner"] = verdict.model_dump(mode="json")
        _json(data)
    else:
        for issue in result.issues:
            _out(f"{issue.level}: {issue.message}")
        if args.journal or args.host:
            _out(verdict.summary() if refused or verdict.checked else f"note: {verdict.summary()}")
        n_err, n_warn = len(result.errors), len(result.warnings)
        if result.ok and refused:
            # Its flags are fine, the profile is not: "is valid" under the planner's refusal read as a yes.
            where = args.host or args.journal
            _out(
                f"{prof.name} is refused: its flags are valid for SGLang {fl.sglang_version}, but the planner "
                f"says it does not fit on {where} (apply takes it only with --yes)."
            )
        elif result.ok:
            extra = f" ({n_warn} warning{'s' if n_warn != 1 else ''})" if n_warn else ""
            _out(f"{prof.name} is valid for SGLang {fl.sglang_version}{extra}.")
        else:
            _out(
                f"{prof.name} would not start on SGLang {fl.sglang_version}: {n_err} error{'s' if n_err != 1 else ''}."
            )
    return EXIT_OK if result.ok and not refused else EXIT_CHECK_FAILED


def _planner(prof: Profile, fl: FlagList, args: argparse.Namespace) -> PlannerVerdict:
    """The planner's verdict, calibrated on a journal (a file or a host's); without one it says so."""
    from console.core.apply import planner_verdict
    from console.core.capacity import DEFAULT_MIN_HEADROOM_GIB

    floor = DEFAULT_MIN_HEADROOM_GIB if args.min_headroom_gib is None else args.min_headroom_gib
    model = None
    if args.journal:
        from console.cli.cmd_plan import read_boots

        boots = read_boots(args.journal)
    elif args.host:
        from console.cli.remote import inventory_host
        from console.cli.remote_journal import remote_boots
        from console.sources.hosts import HostsError

        try:
            model = inventory_host(args.host, args.hosts, strict=False).model  # a typo: no connection
        except HostsError as exc:
            raise UsageError(f"{str(exc).rstrip('.')}.") from None
        boots, _ = remote_boots(args.host, args.hosts)
    else:
        return PlannerVerdict(
            checked=False,
            target_context=prof.target_context,
            min_headroom_gib=floor,
            reasons=["give --host HOST or --journal FILE to calibrate the capacity planner on real boots"],
        )
    return planner_verdict(prof, fl, boots, model=model, min_headroom_gib=floor)
