"""`k26-console apply HOST PROFILE`: validate, write the drop-in, restart, watch the phases, verify.

Exit 0 only when the new boot verifies (pool ≥ target, ready, no errors since this boot, memory free);
1 when the planner refuses the profile or the restart does not verify (rolled back or not); 2 for bad
input (an unknown flag, bad TOML, an unknown host, a drop-in directory the console cannot write, sudo that
wants a password), with the host left as it was.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from console.cli.cmd_plan import finite_float
from console.cli.errors import EXIT_CHECK_FAILED, EXIT_OK, CheckFailed, HostBusy, UsageError
from console.core.apply import DEFAULT_MIN_FREE_GIB, ApplyOutcome, ApplyPreview, ApplyProgress
from console.core.capacity import DEFAULT_MIN_HEADROOM_GIB
from console.core.pairing import AuditEntry, BreakRefused, LockHeld
from console.core.profile_store import ProfileStore
from console.core.profiles import Profile, ProfileError, argv_lines
from console.core.restart import PHASE_LABELS, Phase

if TYPE_CHECKING:  # the SSH stack loads only when a command needs it
    from console.sources.hosts import HostConfig
    from console.sources.hoststate import HostStateDir
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
    p.add_argument(
        "--break-stale-lock",
        action="store_true",
        help=(
            "when the host's lock is held by a console whose heartbeat has stopped, break it (asks on a "
            "terminal unless --yes; the break goes into the audit trail). A live holder is never broken."
        ),
    )
    p.add_argument("--hosts", metavar="FILE", help="the hosts file (default: hosts.toml in the config dir)")
    p.add_argument(
        "--min-headroom-gib",
        type=finite_float,
        default=DEFAULT_MIN_HEADROOM_GIB,
        metavar="G",
        help=f"least planned headroom for CUDA graphs and activations (default {DEFAULT_MIN_HEADROOM_GIB:g})",
    )
    p.add_argument(
        "--min-free-gib",
        type=finite_float,
        default=DEFAULT_MIN_FREE_GIB,
        metavar="G",
        help=f"least GPU memory free at ready for the boot to verify (default {DEFAULT_MIN_FREE_GIB:g})",
    )
    p.add_argument(
        "--boot-timeout",
        type=finite_float,
        default=1800.0,
        metavar="S",
        help="seconds to wait for the new boot to be ready (default 1800)",
    )
    p.set_defaults(func=run)


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _json_line(kind: str, data: dict[str, Any]) -> None:
    _out(json.dumps({"type": kind, **data}, ensure_ascii=False))


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
    if pv.new_argv:
        lines.append("the new command:")
        lines.append("  " + " \\\n    ".join(argv_lines(pv.new_argv)))
    return lines


class _Printer:
    """Prints each phase as it starts, with how long the one before took and the ETA."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.last: tuple[str, str] | None = None

    def __call__(self, p: ApplyProgress) -> None:
        if self.as_json:
            _json_line("progress", p.model_dump(mode="json"))
            return
        key = (p.purpose, p.phase)
        if key != self.last:
            previous = self.last[1] if self.last and self.last[0] == p.purpose else None
            took = ""
            if previous is not None and previous in p.durations:
                took = f"  ({PHASE_LABELS[Phase(previous)]} took {p.durations[previous]:.1f} s)"
            eta = f"  ETA {p.eta_s:.0f} s" if p.eta_s is not None else ""
            tag = "rollback: " if p.purpose == "rollback" else ""
            if p.phase != Phase.DONE.value or p.message:
                _out(f"{p.elapsed_s:8.1f} s  {tag}{p.label}{took}{eta}")
            self.last = key
        if p.message:
            _out(f"            {p.message}")


def render_outcome(o: ApplyOutcome, indent: str = "") -> list[str]:
    lines = [f"{indent}{o.summary}"]
    timed = [(k, v) for k, v in o.durations.items() if k not in (Phase.DONE.value,)]
    if timed:
        lines.append(f"{indent}phase timings ({o.total_s:.1f} s in all):")
        for key, seconds in timed:
            label = PHASE_LABELS.get(Phase(key), key) if key in Phase._value2member_map_ else key
            lines.append(f"{indent}  {label:<16} {seconds:7.1f} s")
    lines.extend(f"{indent}  - {r}" for r in o.reasons[1:] if r)
    if o.rollback is not None:
        lines.append(f"{indent}rollback:")
        lines.extend(render_outcome(o.rollback, indent + "  "))
    return lines


def _confirm(pv: ApplyPreview) -> None:
    if not sys.stdin.isatty():
        raise UsageError(
            f"apply restarts {pv.unit} on {pv.host} and there is no terminal to confirm on; run it with --yes."
        )
    if pv.planner_refused:
        answer = input(f"The planner refuses {pv.profile}. Type its name to apply it anyway: ")
        if answer.strip() != pv.profile:
            raise CheckFailed(f"not applied: {pv.profile} was not confirmed.")
        return
    answer = input(f"Restart {pv.unit} on {pv.host} with {pv.profile}? [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        raise CheckFailed(f"not applied: {pv.profile} was not confirmed.")


def run(args: argparse.Namespace) -> int:
    from console.sources.hosts import HostsError, load_hosts, resolve_host
    from console.sources.hoststate import HostStateDir, HostStateError
    from console.sources.service import ServiceError
    from console.sources.transport import Backoff, Transport, TransportError

    if args.min_headroom_gib < 0 or args.min_free_gib < 0 or args.boot_timeout <= 0:
        raise UsageError(
            "--min-headroom-gib and --min-free-gib must not be negative, --boot-timeout must be positive."
        )
    try:
        hosts = load_hosts(args.hosts)
        if args.hosts and hosts.get(args.host) is None:
            # A hosts file named on the command line is the inventory: a name outside it is a typo, not
            # an ssh alias to try (apply changes the host it reaches).
            known = ", ".join(sorted(hosts.hosts)) or "none"
            raise UsageError(f"there is no host {args.host!r} in {args.hosts} (known: {known}).")
        host = resolve_host(args.host, hosts)
    except HostsError as exc:
        raise UsageError(f"{str(exc).rstrip('.')}.") from None
    profile, store = _load_profile(args.profile)
    printer = _Printer(args.json)

    async def main() -> int:
        transport = Transport(host, backoff=Backoff(max_attempts=3))
        transport.start()
        try:
            try:
                await transport.wait_up(30)
            except (TransportError, TimeoutError) as exc:
                raise UsageError(f"{str(exc).rstrip('.') or 'no connection to ' + host.name}.") from None
            # From here on a lost connection is waited out rather than given up on.
            transport.backoff = Backoff()
            state = HostStateDir(transport, host)
            async with contextlib.AsyncExitStack() as stack:
                await _take_lock(stack, state, f"apply {profile.name}", args)
                outcome = await _preview_and_apply(transport, host, state, profile, store, printer, args)
        except ServiceError as exc:
            sentence = f"{str(exc).rstrip('.')}."
            raise (UsageError(sentence) if exc.bad_input else CheckFailed(sentence)) from None
        except HostStateError as exc:
            raise UsageError(f"{str(exc).rstrip('.')}.") from None
        finally:
            await transport.close()
        if args.json:
            _json_line("outcome", outcome.model_dump(mode="json"))
        else:
            for line in render_outcome(outcome):
                _out(line)
        return EXIT_OK if outcome.ok else EXIT_CHECK_FAILED

    return asyncio.run(main())


async def _take_lock(
    stack: contextlib.AsyncExitStack, state: HostStateDir, intent: str, args: argparse.Namespace
) -> None:
    """The host's lock, held until `stack` closes; exit 3 at once when another console holds it. A
    stale holder's lock is broken only with --break-stale-lock, after a confirmation (or --yes)."""
    try:
        await stack.enter_async_context(state.locked(intent))
        return
    except LockHeld as held:
        if not (held.stale and args.break_stale_lock):
            hint = " (--break-stale-lock breaks it)" if held.stale else ""
            raise HostBusy(f"{str(held).rstrip('.')}{hint}.") from None
        if not args.yes:
            await asyncio.to_thread(_confirm_break, str(held))
        try:
            await state.break_lock(True, reason=f"broken by apply to run {intent}")
        except BreakRefused as exc:
            raise HostBusy(f"{str(exc).rstrip('.')}.") from None
        _out(f"broke the stale lock: {held}")
    try:
        await stack.enter_async_context(state.locked(intent))
    except LockHeld as again:
        raise HostBusy(f"{str(again).rstrip('.')}.") from None


def _confirm_break(sentence: str) -> None:
    if not sys.stdin.isatty():
        raise HostBusy(f"{sentence.rstrip('.')}; there is no terminal to confirm the break on, add --yes.")
    answer = input(f"{sentence}.\nBreak it? Type 'break' to confirm: ")
    if answer.strip() != "break":
        raise HostBusy("the lock was not broken.")


async def _preview_and_apply(
    transport: Transport,
    host: HostConfig,
    state: HostStateDir,
    profile: Profile,
    store: ProfileStore,
    printer: _Printer,
    args: argparse.Namespace,
) -> ApplyOutcome:
    from console.sources.hoststate import HostStateError
    from console.sources.service import ServiceController
    from console.sources.transport import TransportError

    controller = ServiceController(
        host,
        transport,
        min_headroom_gib=args.min_headroom_gib,
        min_free_gib=args.min_free_gib,
        boot_timeout_s=args.boot_timeout,
    )
    pv = await controller.preview(profile)
    if args.json:
        _json_line("preview", pv.model_dump(mode="json"))
    else:
        for line in render_preview(pv):
            _out(line)
    if not pv.valid:
        raise UsageError(
            f"profile {pv.profile} is not valid for SGLang {profile.sglang_version}: {pv.errors[0]}"
        )
    if pv.planner_refused and not args.yes and not sys.stdin.isatty():
        raise CheckFailed(
            f"the planner refuses {pv.profile}: {pv.errors[0].rstrip('.')}; --yes applies it anyway."
        )
    if not args.yes:
        await asyncio.to_thread(_confirm, pv)
    elif pv.planner_refused and not args.json:
        _out(f"forced with --yes: applying {pv.profile} although the planner refuses it.")
    outcome = await controller.apply(
        profile,
        force=True,
        rollback_on_failure=args.rollback_on_failure,
        progress=printer,
        store=store,
        preview=pv,
    )
    if pv.diff or outcome.durations:
        entry = AuditEntry.from_outcome(outcome, me=state.me, host=host.name, ts=state.now())
        try:
            await state.append_audit(entry)
        except (HostStateError, TransportError) as exc:
            _out(f"warning: the audit entry could not be written on {host.name}: {exc}")
    return outcome
