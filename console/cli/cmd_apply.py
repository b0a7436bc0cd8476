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
import asyncio
import contextlib
import json
import signal
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from console.cli.cmd_plan import finite_float
from console.cli.errors import EXIT_CHECK_FAILED, EXIT_OK, CheckFailed, CliError, HostBusy, UsageError
from console.cli.remote import connected, inventory_host
from console.core.apply import DEFAULT_MIN_FREE_GIB, ApplyOutcome, ApplyPreview, ApplyProgress
from console.core.capacity import DEFAULT_MIN_HEADROOM_GIB
from console.core.confirm import default_confirm_within
from console.core.pairing import AuditEntry, BreakRefused, LockHeld
from console.core.profile_store import ProfileStore
from console.core.profiles import Profile, ProfileError, argv_lines
from console.core.restart import PHASE_LABELS, Phase

if TYPE_CHECKING:  # the SSH stack loads only when a command needs it
    from console.sources.hosts import HostConfig
    from console.sources.hoststate import HostStateDir, Lock
    from console.sources.transport import Transport

T = TypeVar("T")
_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)
_RECORD_TIMEOUT_S = 20.0
"""How long an interrupted apply tries to write its last audit entry before it lets go anyway."""


class Interrupted(CliError):
    """A signal stopped the apply; exits 128 + the signal's number, as a shell reports it."""

    def __init__(self, sentence: str, signum: int) -> None:
        super().__init__(sentence)
        self.exit_code = 128 + signum


class _Run:
    """What the apply has done so far: the phase it is in, and the intent written to the audit trail."""

    def __init__(self, profile: str) -> None:
        self.profile = profile
        self.phase: str = "lock"
        self.purpose: str = "apply"
        self.lock: Lock | None = None
        self.diff: list[str] = []
        self.intent: AuditEntry | None = None
        self.finished = False

    def saw(self, p: ApplyProgress) -> None:
        self.purpose = p.purpose
        self.phase = p.phase if p.purpose == "apply" else f"rollback {p.phase}"


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
    from console.sources.hoststate import HostStateDir, HostStateError
    from console.sources.service import ServiceError

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
    printer = _Printer(args.json)
    run_state = _Run(profile.name)

    async def body() -> int:
        transport = await connected(host)
        try:
            state = HostStateDir(transport, host)
            async with contextlib.AsyncExitStack() as stack:
                run_state.lock = await _take_lock(stack, state, f"apply {profile.name}", args)
                try:
                    outcome, unrecorded = await _preview_and_apply(
                        transport, host, state, profile, store, printer, args, run_state
                    )
                except asyncio.CancelledError:
                    if caught:
                        await _record_interruption(state, host.name, run_state, caught[0])
                    raise
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
        if unrecorded is not None:
            raise CheckFailed(unrecorded)
        return EXIT_OK if outcome.ok else EXIT_CHECK_FAILED

    caught: list[signal.Signals] = []

    async def main() -> int:
        # SIGINT, SIGHUP and SIGTERM cancel the apply: the cancellation unwinds through the controller
        # (the journal follower is closed), records the interruption and releases the lock on its way
        # out. A signal the shell set to be ignored (a background job's SIGINT, nohup's SIGHUP) stays
        # ignored. Later signals are not acted on: the clean-up is bounded by its own timeouts.
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_signal(sig: signal.Signals) -> None:
            if not caught:
                caught.append(sig)
                task.cancel()

        installed = []
        for sig in _SIGNALS:
            if signal.getsignal(sig) is signal.SIG_IGN:
                continue
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
        try:
            return await body()
        except asyncio.CancelledError:
            if not caught:
                raise
            task.uncancel()
            raise Interrupted(_interrupted_sentence(host.name, run_state, caught[0]), caught[0]) from None
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    return asyncio.run(main())


def _where(run_state: _Run) -> str:
    return run_state.phase.replace("_", " ")


def _interrupted_sentence(host: str, run_state: _Run, sig: signal.Signals) -> str:
    changed = (
        f"the host may be mid-change (look at {host}'s unit before applying again; a host-side rollback "
        f"this apply armed fires at its deadline unless settled with k26-console confirm {host})"
        if run_state.intent is not None
        else f"nothing on {host} had been changed"
    )
    recorded = (
        "the interruption is in the audit trail"
        if run_state.finished
        else "the interruption could not be written to the audit trail"
    )
    return (
        f"apply {run_state.profile} interrupted by {sig.name} in {_where(run_state)}: the lock is released, "
        f"{recorded}, and {changed}."
    )


async def _record_interruption(state: HostStateDir, host: str, run_state: _Run, sig: signal.Signals) -> None:
    """The `interrupted` outcome of the intent (or, before any change, an entry saying so), written
    within `_RECORD_TIMEOUT_S`: the lock is released after it either way."""
    from console.sources.hoststate import HostStateError
    from console.sources.transport import TransportError

    if run_state.intent is not None:
        entry = run_state.intent.interrupted(
            ts=state.now(),
            phase=run_state.phase,
            signal=sig.name,
            summary=f"interrupted by {sig.name} in {_where(run_state)}; the outcome of the change is unknown",
        )
    else:
        entry = AuditEntry.intent(
            state.me,
            ts=state.now(),
            host=host,
            action="apply",
            op_id=uuid.uuid4().hex,
            profile=run_state.profile,
            lock_id=run_state.lock.info.lock_id if run_state.lock else None,
        ).interrupted(
            ts=state.now(),
            phase=run_state.phase,
            signal=sig.name,
            summary=f"interrupted by {sig.name} in {_where(run_state)}, before anything was changed",
        )
    with contextlib.suppress(HostStateError, TransportError, TimeoutError):
        async with asyncio.timeout(_RECORD_TIMEOUT_S):
            await state.append_audit(entry)
            run_state.finished = True


async def _take_lock(
    stack: contextlib.AsyncExitStack, state: HostStateDir, intent: str, args: argparse.Namespace
) -> Lock:
    """The host's lock, held until `stack` closes (which also removes this command's heartbeat); exit 3
    at once when another console holds it. A stale holder's lock is broken only with
    --break-stale-lock, after a confirmation (or --yes)."""
    try:
        return await stack.enter_async_context(state.locked(intent, leave=True))
    except LockHeld as held:
        if not (held.stale and args.break_stale_lock):
            hint = " (--break-stale-lock breaks it)" if held.stale else ""
            raise HostBusy(f"{str(held).rstrip('.')}{hint}.") from None
        if not args.yes:
            await _ask(_confirm_break, str(held))
        try:
            await state.break_lock(True, reason=f"broken by apply to run {intent}")
        except BreakRefused as exc:
            raise HostBusy(f"{str(exc).rstrip('.')}.") from None
        _out(f"broke the stale lock: {held}")
    try:
        return await stack.enter_async_context(state.locked(intent, leave=True))
    except LockHeld as again:
        raise HostBusy(f"{str(again).rstrip('.')}.") from None


async def _ask(fn: Callable[..., T], *args: Any) -> T:
    """`fn` (a prompt) in a daemon thread: a signal during the prompt cancels the apply, and a thread
    still blocked in input() must not keep the process from exiting (asyncio.to_thread's would)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():  # the apply was cancelled meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # handed to the awaiting task, raised there
            outcome: tuple[T | None, BaseException | None] = (None, exc)
        else:
            outcome = (result, None)
        with contextlib.suppress(RuntimeError):  # the loop closed while the prompt waited: nobody to tell
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=work, name="k26-apply-prompt", daemon=True).start()
    return await future


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
    run_state: _Run,
) -> tuple[ApplyOutcome, str | None]:
    """The outcome, and the sentence to exit 1 with when it could not be written to the audit trail."""
    from console.sources.hoststate import HostStateError
    from console.sources.service import ServiceController, ServiceError
    from console.sources.transport import TransportError

    controller = ServiceController(
        host,
        transport,
        min_headroom_gib=args.min_headroom_gib,
        min_free_gib=args.min_free_gib,
        boot_timeout_s=args.boot_timeout,
    )
    run_state.phase = "validate"
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
    run_state.phase = "confirm"
    if not args.yes:
        await _ask(_confirm, pv)
    elif pv.needs_name and not args.json:
        why = "the planner refuses it" if pv.planner_refused else "the unit will run another program"
        _out(f"forced with --yes: applying {pv.profile} although {why}.")

    op_id = uuid.uuid4().hex
    confirm_within = args.confirm_within
    if confirm_within is None:
        confirm_within = default_confirm_within(controller.expected_boot_s())

    async def write_intent() -> None:
        # Before the drop-in is written: a trail that cannot take the intent stops the apply with the
        # host unchanged, and one that can always shows what was being done, whatever happens next.
        intent = AuditEntry.intent(
            state.me,
            ts=state.now(),
            host=host.name,
            action="apply",
            op_id=op_id,
            profile=profile.name,
            diff=pv.diff,
            lock_id=run_state.lock.info.lock_id if run_state.lock else None,
        )
        try:
            await state.append_audit(intent)
        except (HostStateError, TransportError) as exc:
            raise ServiceError(
                f"{str(exc).rstrip('.')}; the intent could not be written to the audit trail, so nothing was "
                f"changed on {host.name}"
            ) from None
        run_state.intent = intent

    def progress(p: ApplyProgress) -> None:
        run_state.saw(p)
        printer(p)

    try:
        outcome = await controller.apply(
            profile,
            force=True,
            rollback_on_failure=args.rollback_on_failure,
            progress=progress,
            store=store,
            preview=pv,
            before_change=write_intent,
            confirm_within_s=confirm_within or None,
            armed_by=state.me.user + (f"@{state.me.jump_host}" if state.me.jump_host else ""),
            op_id=op_id,
        )
    except ServiceError as exc:
        if run_state.intent is not None:
            # Failed after the change began: the intent gets its outcome before the error is reported.
            failed = run_state.intent.model_copy(
                update={"ts": state.now(), "outcome": "failed", "phase": run_state.phase, "summary": str(exc)}
            )
            with contextlib.suppress(HostStateError, TransportError):
                await state.append_audit(failed)
                run_state.finished = True
        raise
    if run_state.intent is None and not (pv.diff or outcome.durations):
        return outcome, None
    entry = AuditEntry.from_outcome(
        outcome, me=state.me, host=host.name, ts=state.now(), started=run_state.intent
    )
    try:
        await state.append_audit(entry)
        run_state.finished = True
    except (HostStateError, TransportError) as exc:
        done = "verified" if outcome.ok else "ended without verifying"
        return outcome, (
            f"the apply of {profile.name} {done} on {host.name}, but its outcome is NOT in the audit trail: "
            f"{str(exc).rstrip('.')}; the trail shows the apply as started and unfinished."
        )
    return outcome, None
