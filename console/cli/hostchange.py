"""The command line's front end of a host change (`apply`, `restart`, `rollback`, `confirm`): connect,
hold the host's lock, print each phase as it comes and the outcome, and turn a signal into a clean stop.

The change itself (lock, intent, the host-side rollback, outcome, `interrupted`) is the one protocol of
console.sources.change, which the console's own screens run too. A signal (SIGINT, SIGHUP, SIGTERM)
cancels the change: the protocol writes the outcome `interrupted` with the phase it came in, and
whatever ends the command, the lock and this command's heartbeat are removed from the host (SIGKILL
aside: a host-side rollback it armed then fires, and frees the lock; otherwise its intent stays unpaired,
and readers show it as unfinished once its heartbeat is stale).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from console.cli.errors import EXIT_CHECK_FAILED, EXIT_OK, CheckFailed, CliError, HostBusy, UsageError
from console.cli.remote import connected
from console.cli.tables import styled
from console.core.apply import ApplyOutcome, ApplyProgress
from console.core.audit import AuditAction
from console.core.pairing import BreakRefused, LockHeld
from console.core.restart import PHASE_LABELS, Phase
from console.core.text import json_safe, terminal_safe

if TYPE_CHECKING:  # the SSH stack loads only when a command needs it
    from console.sources.change import ChangeResult, HostChange, HostChanger
    from console.sources.hosts import HostConfig
    from console.sources.service import ServiceController
    from console.sources.transport import Transport

T = TypeVar("T")
_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT)
"""What stops a change cleanly (audited `interrupted`, the lock released). SIGQUIT (Ctrl-\\) too: left to
its default it dumps core and leaves the lock, the heartbeat and no outcome, as SIGKILL does."""


class Interrupted(CliError):
    """A signal stopped the change; exits 128 + the signal's number, as a shell reports it."""

    def __init__(self, sentence: str, signum: int) -> None:
        super().__init__(sentence)
        self.exit_code = 128 + signum


@dataclass
class ChangeRequest:
    """What the command asks of the host, before the lock is taken: the change's audit action, how
    sentences name it, and the profile it applies."""

    action: AuditAction
    title: str
    profile: str | None = None


class _Output:
    """Where the change's lines go. A reader that goes away (`apply ... | head -3`, a `less` quit) must not
    stop a change half-way, nor let it end unaudited with exit 0: the first write that finds the pipe
    closed sends standard output to /dev/null from then on, and the change goes on to its end."""

    lost: bool = False

    def write(self, text: str) -> None:
        if self.lost:
            return
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:
            self.lose()

    def lose(self) -> None:
        self.lost = True
        # Onto the descriptor itself: what is still buffered then flushes into /dev/null at exit,
        # rather than ending the process with a BrokenPipeError of its own.
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)


OUTPUT = _Output()


def out(text: str = "") -> None:
    OUTPUT.write(text + "\n")


def json_line(kind: str, data: dict[str, Any]) -> None:
    # The preview and the outcome quote the host (its running ExecStart, the journal's reasons): what
    # json.dumps leaves raw (C1, DEL, bidi and zero-width characters) is written as escapes.
    out(json_safe(json.dumps({"type": kind, **data}, ensure_ascii=False)))


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
    """The outcome's lines, each drawn safe: the summary and the reasons quote the host."""
    return [terminal_safe(line) for line in _outcome_lines(o, indent)]


def _outcome_lines(o: ApplyOutcome, indent: str) -> list[str]:
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
        lines.extend(_outcome_lines(o.rollback, indent + "  "))
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


@contextlib.asynccontextmanager
async def held(
    changer: HostChanger, req: ChangeRequest, args: argparse.Namespace
) -> AsyncIterator[HostChange]:
    """The change under the host's lock, held until the block ends; exit 3 at once when another console
    holds it. A stale holder's lock is broken only with --break-stale-lock, after a confirmation (or
    --yes)."""
    async with contextlib.AsyncExitStack() as stack:
        try:
            change = await stack.enter_async_context(changer.begin(req.action, req.title, req.profile))
        except LockHeld as held_by:
            if not (held_by.stale and args.break_stale_lock):
                hint = " (--break-stale-lock breaks it)" if held_by.stale else ""
                raise HostBusy(f"{str(held_by).rstrip('.')}{hint}.") from None
            if not args.yes:
                await ask(_confirm_break, str(held_by))
            try:
                await changer.break_lock(reason=f"broken by k26-console to run {req.title}")
            except BreakRefused as exc:
                raise HostBusy(f"{str(exc).rstrip('.')}.") from None
            out(f"broke the stale lock: {held_by}")
            try:
                change = await stack.enter_async_context(changer.begin(req.action, req.title, req.profile))
            except LockHeld as again:
                raise HostBusy(f"{str(again).rstrip('.')}.") from None
        yield change


def _interrupted_sentence(
    host: str, req: ChangeRequest, change: HostChange | None, sig: signal.Signals
) -> str:
    if change is None or change.intent is None:
        changed = f"nothing on {host} had been changed"
    elif change.armed is not None:
        changed = (
            f"the host may be mid-change; the host-side rollback this apply armed fires at "
            f"{change.armed.deadline:%H:%M:%S} UTC unless settled with k26-console confirm {host}"
        )
    else:
        changed = f"the host may be mid-change (look at {host}'s unit before changing it again)"
    where = change.where() if change is not None else "connect"
    if change is None:
        recorded = "nothing was written to the audit trail"
    elif change.finished:
        recorded = "the interruption is in the audit trail"
    else:
        recorded = "the interruption could not be written to the audit trail"
    return (
        f"{req.title} interrupted by {sig.name} in {where}: the lock is released, {recorded}, and {changed}."
    )


Operate = Callable[["HostChanger", "HostChange"], Awaitable["ChangeResult"]]
"""The change itself, inside the lock, run through the protocol: its result."""


def change_host(
    host: HostConfig,
    req: ChangeRequest,
    args: argparse.Namespace,
    controller: Callable[[Transport], ServiceController],
    operate: Operate,
) -> int:
    """Connect, take the lock, run `operate`, print its outcome: exit 0 when it verified, 1 when not.
    SIGINT, SIGHUP and SIGTERM cancel the change: the cancellation unwinds through the controller (the
    journal follower is closed), the protocol records the interruption and releases the lock."""
    current: list[HostChange] = []
    caught: list[signal.Signals] = []

    async def body() -> int:
        from console.sources.change import HostChanger
        from console.sources.hoststate import HostStateDir, HostStateError
        from console.sources.service import ServiceError

        transport = await connected(host)
        try:
            changer = HostChanger(HostStateDir(transport, host), controller(transport), leave=True)
            async with held(changer, req, args) as change:
                current.append(change)
                if caught:
                    change.signal = caught[0].name
                result = await operate(changer, change)
        except ServiceError as exc:
            sentence = f"{str(exc).rstrip('.')}."
            raise (UsageError(sentence) if exc.bad_input else CheckFailed(sentence)) from None
        except HostStateError as exc:
            raise UsageError(f"{str(exc).rstrip('.')}.") from None
        finally:
            await transport.close()
        outcome = result.outcome
        if args.json:
            json_line("outcome", outcome.model_dump(mode="json"))
        else:
            summary, *rest = render_outcome(outcome)
            out(styled(summary, "bold green" if outcome.ok else "bold red"))
            for line in rest:
                out(terminal_safe(line))
        if result.lock_lost:
            out(
                f"warning: the lock on {host.name} was taken from this command while the change ran "
                "(another console broke it, or the host's rollback freed it); see k26-console audit."
            )
        if result.unrecorded is not None:
            raise CheckFailed(result.unrecorded)
        if OUTPUT.lost:
            # Its reader has gone: the one place left to say how the change ended is standard error.
            done = "verified" if outcome.ok else "did NOT verify"
            with contextlib.suppress(OSError):
                sys.stderr.write(
                    f"k26-console: the output of {req.title} was closed by its reader; the change went on to "
                    f"its end and {done} (in the audit trail): {terminal_safe(outcome.summary)}\n"
                )
        return EXIT_OK if outcome.ok else EXIT_CHECK_FAILED

    async def main() -> int:
        # A signal the shell set to be ignored (a background job's SIGINT, nohup's SIGHUP) stays
        # ignored. Later signals are not acted on: the clean-up is bounded by its own timeouts.
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_signal(sig: signal.Signals) -> None:
            if not caught:
                caught.append(sig)
                if current:
                    current[0].signal = sig.name
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
            change = current[0] if current else None
            raise Interrupted(_interrupted_sentence(host.name, req, change, caught[0]), caught[0]) from None
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    return asyncio.run(main())


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
