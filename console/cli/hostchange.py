"""What `apply`, `restart` and `rollback` share: the host's lock, the phases printed as they come, the
audit trail's intent before the first change and outcome after it, and a signal that stops the change
cleanly.

A signal (SIGINT, SIGHUP, SIGTERM) writes the outcome `interrupted` with the phase it came in. Whatever
ends the command, the lock and this command's heartbeat are removed from the host (SIGKILL aside: its
intent then stays unpaired, and readers show it as unfinished once its heartbeat is stale).
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
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from console.cli.errors import EXIT_CHECK_FAILED, EXIT_OK, CheckFailed, CliError, HostBusy, UsageError
from console.cli.remote import connected
from console.cli.tables import styled
from console.core.apply import ApplyOutcome, ApplyProgress
from console.core.audit import AuditAction, AuditEntry
from console.core.pairing import BreakRefused, LockHeld
from console.core.restart import PHASE_LABELS, Phase
from console.core.text import terminal_safe

if TYPE_CHECKING:  # the SSH stack loads only when a command needs it
    from console.sources.hosts import HostConfig
    from console.sources.hoststate import HostStateDir, Lock
    from console.sources.transport import Transport

T = TypeVar("T")
_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)
_RECORD_TIMEOUT_S = 20.0
"""How long an interrupted change tries to write its last audit entry before it lets go anyway."""

BeforeChange = Callable[[], Awaitable[None]]


class Interrupted(CliError):
    """A signal stopped the change; exits 128 + the signal's number, as a shell reports it."""

    def __init__(self, sentence: str, signum: int) -> None:
        super().__init__(sentence)
        self.exit_code = 128 + signum


class ChangeRun:
    """One change of a host (an apply, a restart, a rollback): the phase it is in, the intent written
    to the audit trail, and the signal that stopped it, if one did."""

    def __init__(self, action: AuditAction, title: str, profile: str | None = None) -> None:
        self.action = action
        self.title = title
        """How sentences name it: "apply ctx-200k", "restart of sglang.service", "rollback"."""
        self.profile = profile
        self.phase: str = "lock"
        self.purpose: str = action
        self.lock: Lock | None = None
        self.intent: AuditEntry | None = None
        self.finished = False
        self.forced: str | None = None
        """Why the operator had to force the change (with --yes), for the audit trail."""
        self.caught: signal.Signals | None = None

    def saw(self, p: ApplyProgress) -> None:
        # A rollback's phases are its own; after an apply they are the rollback of that apply.
        own = "rollback" if self.action == "rollback" else "apply"
        self.purpose = p.purpose
        self.phase = p.phase if p.purpose == own else f"rollback {p.phase}"

    def where(self) -> str:
        return self.phase.replace("_", " ")


def out(text: str = "") -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def json_line(kind: str, data: dict[str, Any]) -> None:
    out(json.dumps({"type": kind, **data}, ensure_ascii=False))


_PHASE_STYLE = {
    Phase.FAILED.value: "bold red",
    Phase.READY.value: "bold green",
}


class Printer:
    """Prints each phase as it starts, with how long the one before took and the ETA. `tag_rollback`
    marks the phases of a rollback that follows an apply (a rollback on its own needs no tag)."""

    def __init__(self, as_json: bool, *, tag_rollback: bool = True) -> None:
        self.as_json = as_json
        self.tag_rollback = tag_rollback
        self.last: tuple[str, str] | None = None

    def __call__(self, p: ApplyProgress) -> None:
        if self.as_json:
            json_line("progress", p.model_dump(mode="json"))
            return
        key = (p.purpose, p.phase)
        if key != self.last:
            previous = self.last[1] if self.last and self.last[0] == p.purpose else None
            took = ""
            if previous is not None and previous in p.durations:
                took = f"  ({PHASE_LABELS[Phase(previous)]} took {p.durations[previous]:.1f} s)"
            eta = f"  ETA {p.eta_s:.0f} s" if p.eta_s is not None else ""
            tag = "rollback: " if p.purpose == "rollback" and self.tag_rollback else ""
            if p.phase != Phase.DONE.value or p.message:
                label = styled(f"{tag}{p.label}", _PHASE_STYLE.get(p.phase, "bold cyan"))
                out(f"{p.elapsed_s:8.1f} s  {label}{took}{eta}")
            self.last = key
        if p.message:
            # Messages quote the host (paths, the journal's reasons): drawn safe, dim on a terminal.
            out(f"            {styled(p.message, 'dim')}")


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


def confirm_restart(question: str, refused: str, no_terminal: str) -> None:
    """A y/N question on the terminal (run in `ask`'s thread); no terminal means --yes is needed."""
    if not sys.stdin.isatty():
        raise UsageError(no_terminal)
    answer = input(f"{question} [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        raise CheckFailed(refused)


async def ask(fn: Callable[..., T], *args: Any) -> T:
    """`fn` (a prompt) in a daemon thread: a signal during the prompt cancels the change, and a thread
    still blocked in input() must not keep the process from exiting (asyncio.to_thread's would)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():  # the change was cancelled meanwhile
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

    threading.Thread(target=work, name="k26-change-prompt", daemon=True).start()
    return await future


def _confirm_break(sentence: str) -> None:
    if not sys.stdin.isatty():
        raise HostBusy(f"{sentence.rstrip('.')}; there is no terminal to confirm the break on, add --yes.")
    answer = input(f"{sentence}.\nBreak it? Type 'break' to confirm: ")
    if answer.strip() != "break":
        raise HostBusy("the lock was not broken.")


async def take_lock(
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
            await ask(_confirm_break, str(held))
        try:
            await state.break_lock(True, reason=f"broken by k26-console to run {intent}")
        except BreakRefused as exc:
            raise HostBusy(f"{str(exc).rstrip('.')}.") from None
        out(f"broke the stale lock: {held}")
    try:
        return await stack.enter_async_context(state.locked(intent, leave=True))
    except LockHeld as again:
        raise HostBusy(f"{str(again).rstrip('.')}.") from None


def _interrupted_sentence(host: str, run: ChangeRun, sig: signal.Signals) -> str:
    if run.intent is None:
        changed = f"nothing on {host} had been changed"
    else:
        armed = (
            f"; a host-side rollback this apply armed fires at its deadline unless settled with "
            f"k26-console confirm {host}"
            if run.action == "apply"
            else ""
        )
        changed = f"the host may be mid-change (look at {host}'s unit before changing it again{armed})"
    recorded = (
        "the interruption is in the audit trail"
        if run.finished
        else "the interruption could not be written to the audit trail"
    )
    return (
        f"{run.title} interrupted by {sig.name} in {run.where()}: the lock is released, "
        f"{recorded}, and {changed}."
    )


async def _record_interruption(state: HostStateDir, host: str, run: ChangeRun, sig: signal.Signals) -> None:
    """The `interrupted` outcome of the intent (or, before any change, an entry saying so), written
    within `_RECORD_TIMEOUT_S`: the lock is released after it either way."""
    from console.sources.hoststate import HostStateError
    from console.sources.transport import TransportError

    if run.intent is not None:
        entry = run.intent.interrupted(
            ts=state.now(),
            phase=run.phase,
            signal=sig.name,
            summary=f"interrupted by {sig.name} in {run.where()}; the outcome of the change is unknown",
        )
    else:
        entry = AuditEntry.intent(
            state.me,
            ts=state.now(),
            host=host,
            action=run.action,
            op_id=uuid.uuid4().hex,
            profile=run.profile,
            lock_id=run.lock.info.lock_id if run.lock else None,
        ).interrupted(
            ts=state.now(),
            phase=run.phase,
            signal=sig.name,
            summary=f"interrupted by {sig.name} in {run.where()}, before anything was changed",
        )
    with contextlib.suppress(HostStateError, TransportError, TimeoutError):
        async with asyncio.timeout(_RECORD_TIMEOUT_S):
            await state.append_audit(entry)
            run.finished = True


Operate = Callable[["Transport", "HostStateDir"], Awaitable[tuple[ApplyOutcome, str | None]]]
"""The change itself, inside the lock: its outcome and the sentence to exit 1 with when that outcome
could not be written to the audit trail."""


def change_host(host: HostConfig, run: ChangeRun, args: argparse.Namespace, operate: Operate) -> int:
    """Connect, take the lock, run `operate`, print its outcome: exit 0 when it verified, 1 when not.
    SIGINT, SIGHUP and SIGTERM cancel the change: the cancellation unwinds through the controller (the
    journal follower is closed), records the interruption and releases the lock on its way out."""

    async def body() -> int:
        from console.sources.hoststate import HostStateDir, HostStateError
        from console.sources.service import ServiceError

        transport = await connected(host)
        try:
            state = HostStateDir(transport, host)
            async with contextlib.AsyncExitStack() as stack:
                run.lock = await take_lock(stack, state, run.title, args)
                try:
                    outcome, unrecorded = await operate(transport, state)
                except asyncio.CancelledError:
                    if run.caught is not None:
                        await _record_interruption(state, host.name, run, run.caught)
                    raise
        except ServiceError as exc:
            sentence = f"{str(exc).rstrip('.')}."
            raise (UsageError(sentence) if exc.bad_input else CheckFailed(sentence)) from None
        except HostStateError as exc:
            raise UsageError(f"{str(exc).rstrip('.')}.") from None
        finally:
            await transport.close()
        if args.json:
            json_line("outcome", outcome.model_dump(mode="json"))
        else:
            summary, *rest = render_outcome(outcome)
            out(styled(summary, "bold green" if outcome.ok else "bold red"))
            for line in rest:
                out(terminal_safe(line))
        if unrecorded is not None:
            raise CheckFailed(unrecorded)
        return EXIT_OK if outcome.ok else EXIT_CHECK_FAILED

    async def main() -> int:
        # A signal the shell set to be ignored (a background job's SIGINT, nohup's SIGHUP) stays
        # ignored. Later signals are not acted on: the clean-up is bounded by its own timeouts.
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_signal(sig: signal.Signals) -> None:
            if run.caught is None:
                run.caught = sig
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
            if run.caught is None:
                raise
            task.uncancel()
            raise Interrupted(_interrupted_sentence(host.name, run, run.caught), run.caught) from None
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    return asyncio.run(main())


async def audited(
    state: HostStateDir,
    host: HostConfig,
    run: ChangeRun,
    change: Callable[[BeforeChange], Awaitable[ApplyOutcome]],
    *,
    diff: list[str] | None = None,
    op_id: str | None = None,
) -> tuple[ApplyOutcome, str | None]:
    """Run `change`, handing it the callback that writes the intent right before the host is first
    changed; then write the outcome, paired with the intent. A trail that cannot take the intent stops
    the change with the host unchanged. Returns the outcome and the sentence to exit 1 with when it
    could not be written."""
    from console.sources.hoststate import HostStateError
    from console.sources.service import ServiceError
    from console.sources.transport import TransportError

    op_id = op_id or uuid.uuid4().hex

    async def write_intent() -> None:
        intent = AuditEntry.intent(
            state.me,
            ts=state.now(),
            host=host.name,
            action=run.action,
            op_id=op_id,
            profile=run.profile,
            diff=diff,
            lock_id=run.lock.info.lock_id if run.lock else None,
            forced=run.forced,
        )
        try:
            await state.append_audit(intent)
        except (HostStateError, TransportError) as exc:
            raise ServiceError(
                f"{str(exc).rstrip('.')}; the intent could not be written to the audit trail, so nothing was "
                f"changed on {host.name}"
            ) from None
        run.intent = intent

    try:
        outcome = await change(write_intent)
    except ServiceError as exc:
        if run.intent is not None:
            # Failed after the change began: the intent gets its outcome before the error is reported.
            failed = run.intent.model_copy(
                update={"ts": state.now(), "outcome": "failed", "phase": run.phase, "summary": str(exc)}
            )
            with contextlib.suppress(HostStateError, TransportError):
                await state.append_audit(failed)
                run.finished = True
        raise
    if run.intent is None and not (diff or outcome.durations):
        return outcome, None
    entry = AuditEntry.from_outcome(
        outcome, me=state.me, host=host.name, ts=state.now(), action=run.action, started=run.intent
    )
    # A rollback's outcome is named "rollback" by the controller: the trail says "rolled back" alone.
    entry = entry.model_copy(
        update={"forced": run.forced, **({"profile": run.profile} if run.action == "rollback" else {})}
    )
    try:
        await state.append_audit(entry)
        run.finished = True
    except (HostStateError, TransportError) as exc:
        done = "verified" if outcome.ok else "ended without verifying"
        return outcome, (
            f"the {run.title} {done} on {host.name}, but its outcome is NOT in the audit trail: "
            f"{str(exc).rstrip('.')}; the trail shows it as started and unfinished."
        )
    return outcome, None


def add_lock_options(p: argparse.ArgumentParser) -> None:
    """`--break-stale-lock` and `--hosts`: what every command that changes a host takes."""
    p.add_argument(
        "--break-stale-lock",
        action="store_true",
        help=(
            "when the host's lock is held by a console whose heartbeat has stopped, break it (asks on a "
            "terminal unless --yes; the break goes into the audit trail). A live holder is never broken."
        ),
    )
    p.add_argument("--hosts", metavar="FILE", help="the hosts file (default: hosts.toml in the config dir)")


def add_verify_options(p: argparse.ArgumentParser) -> None:
    """`--min-free-gib` and `--boot-timeout`: how the new boot is waited for and verified."""
    from console.cli.cmd_plan import finite_float
    from console.core.apply import DEFAULT_MIN_FREE_GIB

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
