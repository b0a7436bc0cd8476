"""`k26-console apply HOST PROFILE`: validate, write the drop-in, restart, watch the phases, verify.

Exit 0 only when the new boot verifies (pool ≥ target, ready, no errors since this boot, memory free);
1 when the planner refuses the profile or the restart does not verify (rolled back or not), or when the
outcome could not be written to the host's audit trail; 2 for bad input (an unknown flag, bad TOML, an
unknown host, a drop-in directory the console cannot write, sudo that wants a password), with the host
left as it was; 128+N when signal N (SIGINT, SIGHUP, SIGTERM) interrupted it.

The audit trail gets the intent (outcome `started`) right before the first change and the outcome after
it, paired by `op_id`; a signal writes the outcome `interrupted` with the phase it came in. Whatever ends
the command, the lock and this command's heartbeat are removed from the host (SIGKILL aside: its intent
then stays unpaired, and readers show it as unfinished once its heartbeat is stale).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from console.cli.cmd_plan import finite_float
from console.cli.errors import CheckFailed, UsageError
from console.cli.hostchange import (
    ChangeRequest,
    Printer,
    add_lock_options,
    add_verify_options,
    ask,
    change_host,
    json_line,
    out,
)
from console.cli.remote import inventory_host
from console.core.apply import ApplyPreview, forced_reason
from console.core.capacity import DEFAULT_MIN_HEADROOM_GIB
from console.core.confirm import default_confirm_within
from console.core.profiles import Profile, ProfileError, argv_lines
from console.core.text import terminal_safe
from console.sources.profile_store import ProfileStore

if TYPE_CHECKING:  # the SSH stack loads only when a command needs it
    from console.sources.change import ChangeResult, HostChange, HostChanger
    from console.sources.service import ServiceController
    from console.sources.transport import Transport


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "apply",
        help="apply a flag profile to a host in one safe restart, watch it and verify it",
        description=(
            "Validate PROFILE (SGLang's flag list for its version, and the capacity planner calibrated on "
            "HOST's own journal), show the diff against the running ExecStart, write the systemd drop-in "
            "UNIT.service.d/50-k26-console.conf atomically (the previous one kept for the rollback), "
            "daemon-reload, restart, print the phases with their timings, and verify the new boot. "
            "Exit 0 when it verifies, 1 when the planner refuses or the boot does not verify, 2 on bad "
            "input (the host is then left as it was), 3 when another console holds the host."
        ),
        epilog=(
            "Forcing: a profile the planner refuses (the pool would not reach the target, or less headroom "
            "than --min-headroom-gib would be left) is applied only with --yes, which also skips the "
            "question; asked on a terminal instead, such a profile must be confirmed by typing its name. "
            "Flag errors (an unknown flag, a bad value) are never forced."
        ),
    )
    p.add_argument("host", metavar="HOST", help="a host from hosts.toml or an ssh alias")
    p.add_argument("profile", metavar="PROFILE", help="a profile name (user or shipped) or a .toml path")
    p.add_argument(
        "--yes",
        "-y",
        action="store_true",
        help="do not ask; also applies a profile the planner refuses (the only way to force one)",
    )
    p.add_argument(
        "--rollback-on-failure",
        action="store_true",
        help="when the new boot fails or does not verify, put the previous drop-in back, restart and verify that",
    )
    p.add_argument("--json", action="store_true", help="JSON lines: the preview, each phase, the outcome")
    add_lock_options(p)
    p.add_argument(
        "--min-headroom-gib",
        type=finite_float,
        default=DEFAULT_MIN_HEADROOM_GIB,
        metavar="G",
        help=f"least planned headroom for CUDA graphs and activations (default {DEFAULT_MIN_HEADROOM_GIB:g})",
    )
    add_verify_options(p)
    p.add_argument(
        "--confirm-within",
        type=finite_float,
        default=None,
        metavar="S",
        help=(
            "commit-confirmed: before the restart, arm a rollback on the host itself that fires unless the "
            "new boot is verified within S seconds (the console disarms it then); it survives this command "
            "being killed, its connection or its terminal lost. Default: twice this host's usual restart "
            "plus 2 minutes (at least 300 s; 1800 s without history); 0 arms none"
        ),
    )
    p.set_defaults(func=run)


def _load_profile(ref: str) -> tuple[Profile, ProfileStore]:
    """The profile and the store its verified numbers go back into: a profile named by its path is
    updated in place; a shipped one is copied into the user's profile directory with them."""
    looks_like_path = ref.endswith(".toml") or "/" in ref
    store = ProfileStore([Path(ref).parent]) if looks_like_path else ProfileStore()
    try:
        return store.load(ref), store
    except ProfileError as exc:
        raise UsageError(str(exc)) from None


def render_preview(pv: ApplyPreview) -> list[str]:
    """The preview's lines, each drawn safe: the diff quotes the host's running ExecStart, whose words
    may hold anything (an OSC sequence, a bidi override) that must not reach the terminal raw."""
    lines = [f"apply {pv.profile} to {pv.host} ({pv.unit}); drop-in {pv.dropin_path}"]
    if pv.diff:
        lines.append("changes to the running ExecStart:")
        lines.extend(f"  {d}" for d in pv.diff)
    else:
        lines.append(f"no change: {pv.unit} already runs this profile.")
    lines.extend(f"  note: {n}" for n in pv.notes)
    if pv.planner is not None:
        lines.append(pv.planner.summary())
    lines.extend(f"warning: {w}" for w in pv.warnings)
    lines = [terminal_safe(line) for line in lines]
    if pv.new_argv:
        lines.append("the new command:")
        # One line a flag, continued with a backslash: only the line breaks put here are kept.
        lines.append("  " + " \\\n    ".join(terminal_safe(a) for a in argv_lines(pv.new_argv)))
    return lines


def _confirm(pv: ApplyPreview) -> None:
    if not sys.stdin.isatty():
        raise UsageError(
            f"apply restarts {pv.unit} on {pv.host} and there is no terminal to confirm on; run it with --yes."
        )
    if pv.needs_name:
        why = "The planner refuses" if pv.planner_refused else "The unit would run another program with"
        answer = input(f"{why} {pv.profile}. Type its name to apply it anyway: ")
        if answer.strip() != pv.profile:
            raise CheckFailed(f"not applied: {pv.profile} was not confirmed.")
        return
    answer = input(f"Restart {pv.unit} on {pv.host} with {pv.profile}? [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        raise CheckFailed(f"not applied: {pv.profile} was not confirmed.")


def run(args: argparse.Namespace) -> int:
    if args.confirm_within is not None and not 0 <= args.confirm_within <= 86_400:
        raise UsageError(
            f"--confirm-within must be between 0 and 86400 seconds, not {args.confirm_within:g}."
        )
    if args.min_headroom_gib < 0 or args.min_free_gib < 0 or args.boot_timeout <= 0:
        raise UsageError(
            "--min-headroom-gib and --min-free-gib must not be negative, --boot-timeout must be positive."
        )
    host = inventory_host(args.host, args.hosts)
    profile, store = _load_profile(args.profile)
    printer = Printer(args.json)

    def controller(transport: Transport) -> ServiceController:
        from console.sources.service import ServiceController

        return ServiceController(
            host,
            transport,
            min_headroom_gib=args.min_headroom_gib,
            min_free_gib=args.min_free_gib,
            boot_timeout_s=args.boot_timeout,
        )

    async def operate(changer: HostChanger, change: HostChange) -> ChangeResult:
        return await _preview_and_apply(changer, change, profile, store, printer, args)

    return change_host(
        host, ChangeRequest("apply", f"apply {profile.name}", profile.name), args, controller, operate
    )


async def _preview_and_apply(
    changer: HostChanger,
    change: HostChange,
    profile: Profile,
    store: ProfileStore,
    printer: Printer,
    args: argparse.Namespace,
) -> ChangeResult:
    from console.sources.change import ChangePolicy

    controller = changer.ctl
    change.phase = "validate"
    await controller.learn_host_flags()  # the flags are checked against the SGLang the host runs
    pv = await controller.preview(profile)
    if args.json:
        json_line("preview", pv.model_dump(mode="json"))
    else:
        for line in render_preview(pv):
            out(line)
    if not pv.valid:
        raise UsageError(
            f"profile {pv.profile} is not valid for SGLang {profile.sglang_version}: {pv.errors[0]}"
        )
    if pv.planner_refused and not args.yes and not sys.stdin.isatty():
        raise CheckFailed(
            f"the planner refuses {pv.profile}: {pv.errors[0].rstrip('.')}; --yes applies it anyway."
        )
    change.phase = "confirm"
    if not args.yes:
        await ask(_confirm, pv)
    elif pv.needs_name and not args.json:
        why = "the planner refuses it" if pv.planner_refused else "the unit will run another program"
        out(f"forced with --yes: applying {pv.profile} although {why}.")
    confirm_within = args.confirm_within
    if confirm_within is None:
        confirm_within = default_confirm_within(controller.expected_boot_s())
    policy = ChangePolicy(
        confirm_within_s=confirm_within or None,
        rollback_on_failure=args.rollback_on_failure,
        forced=forced_reason(pv, "forced with --yes" if args.yes else "confirmed by typing its name"),
    )
    return await changer.apply(change, profile, pv, policy, store=store, progress=printer)
