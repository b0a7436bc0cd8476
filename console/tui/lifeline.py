"""The console's lifeline to its terminal: within two seconds of SIGHUP, SIGTERM or its terminal going away
(EOF or EIO), at any moment of start-up, running or quitting, the console has left its hosts (presence,
and a lock it holds) and is gone.

Why Textual's own Linux driver (8.2.8, `textual/drivers/linux_driver.py`) is not enough:

- A terminal that hangs up (tmux killed, an SSH session dropped) sends its session SIGHUP *and* SIGCONT.
  The driver's SIGCONT handler, installed for Ctrl+Z and never removed, calls `resume_application_mode`
  whatever state the app is in. Once a quit has stopped application mode, that starts a new
  `textual-input` thread (not a daemon) that nothing will stop again: on the hung-up terminal `select`
  says readable and `read` returns 0 for ever, so the thread spins at a core, and the interpreter's exit
  waits for it in `threading._shutdown` (the main thread's futex). The demo's SIGTERM handler asked an app
  that had already ended to exit, so only SIGKILL worked. Reproduced with `demo` in a pty: `q`, then the
  pty master closed 0.3 s later; faulthandler showed exactly those two threads.
- While the app runs, its input loop reads 0 bytes from the hung-up terminal, takes it for "no input this
  time" and selects again: the same spin until something else quits the app.
- The writer thread dies on the first EIO; the next 30 writes fill its queue and the 31st blocks the
  event loop for good.

`LifelineDriver` fixes those three; `Lifeline` turns SIGHUP, SIGTERM and a lost terminal into "leave the
hosts, then exit" on the app's loop, and guarantees the deadline with a watcher thread that ends the
process (after last-resort hooks such as stopping the demo's twin) when the orderly way has not.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import select
import selectors
import signal
import sys
import termios
import threading
import time
from codecs import getincrementaldecoder
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any, ClassVar, NoReturn, Protocol, TextIO, runtime_checkable

from textual._xterm_parser import XTermParser
from textual.app import App
from textual.drivers.linux_driver import LinuxDriver

__all__ = ["DEADLINE_S", "LEAVE_S", "LeavesHosts", "Lifeline", "LifelineDriver", "end_now"]

LEAVE_S = 0.8
"""How long leaving the hosts may take before the app exits anyway: one small SSH command per host
(0.03-0.15 s measured on loopback with the 2-core machine at load 8-9)."""
DEADLINE_S = 1.5
"""From the signal or the lost terminal to the last resort: the orderly exit (leave, Textual's shutdown,
the demo's twin) normally takes well under a second."""
OUTPUT_WAIT_S = 0.05
"""Once leaving, how long a write may wait for room in Textual's output queue before it is dropped."""
HOOK_S = 0.35
"""How long each last-resort hook may take; the process is gone within DEADLINE_S plus these."""

_HANGUP = 128 + signal.SIGHUP
"""The exit status of a console whose terminal went away, as if the hangup's SIGHUP had ended it."""


@runtime_checkable
class LeavesHosts(Protocol):
    """An app that can take its presence (and a lock it holds) off its hosts before it exits."""

    async def leave_hosts(self, timeout_s: float) -> None: ...


@dataclass(frozen=True)
class _Event:
    reason: str = ""
    code: int = 0
    lost_fd: int | None = None
    """The terminal fd that failed (its output fds are sent to /dev/null); None for a signal."""
    bound: bool = False
    """The app's loop is known now (not a reason to leave)."""
    closing: bool = False
    """The lifeline's block ended without a reason to leave: the watcher may stop."""


class Lifeline:
    """`with Lifeline(app) as life: app.run()`, then `life.exit_code(...)`: SIGHUP, SIGTERM and a lost
    terminal make the app leave its hosts and exit, and the process is gone within `deadline_s`."""

    def __init__(self, app: App[Any], *, leave_s: float = LEAVE_S, deadline_s: float = DEADLINE_S) -> None:
        self.app = app
        self.leave_s = leave_s
        self.deadline_s = deadline_s
        self.reason: str | None = None
        """Why the console ended early ("SIGTERM", "the terminal closed"), None when it was not made to."""
        self._code = 0
        self._hooks: list[Callable[[], object]] = []
        self._events: queue.SimpleQueue[_Event] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._driver: LifelineDriver | None = None
        self._previous: dict[int, Any] = {}
        self._watcher: threading.Thread | None = None
        self._quit_task: asyncio.Task[None] | None = None
        self._tty_rdev = {fd: _tty_rdev(fd) for fd in (0, 1, 2)}

    # ---- the block ---------------------------------------------------------------------------------

    def __enter__(self) -> Lifeline:
        for sig in (signal.SIGHUP, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        self.app.driver_class = type("LifelineDriver", (LifelineDriver,), {"lifeline": self})
        self._watcher = threading.Thread(target=self._watch, name="k26-lifeline", daemon=True)
        self._watcher.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        # Once fired, the watcher keeps its deadline until the process is gone, exit included (the
        # reported hang was in the interpreter's own exit).
        self._post(_Event(closing=True))

    def last_resort(self, hook: Callable[[], object]) -> None:
        """Run `hook` (from the watcher thread, bounded by HOOK_S) before the process is ended at the
        deadline: what must not outlive the console even when the orderly exit is stuck."""
        self._hooks.append(hook)

    def exit_code(self, app_code: int) -> int:
        """The process's exit status: 128 + the signal (129 for a lost terminal), else the app's own."""
        return self._code if self.reason is not None else app_code

    # ---- what reports to it ------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # A Python handler runs in the main thread, perhaps in the middle of the event loop or of a lock
        # wait: it only queues the event (SimpleQueue.put is reentrant) and wakes the watcher.
        self._post(_Event(reason=signal.Signals(signum).name, code=128 + signum))

    def terminal_lost(self, fd: int, how: str) -> None:
        """The terminal on `fd` is gone (read 0 bytes, EIO, a hangup): any thread may call this."""
        self._post(_Event(reason=f"the terminal closed ({how})", code=_HANGUP, lost_fd=fd))

    def bind(self, loop: asyncio.AbstractEventLoop, driver: LifelineDriver) -> None:
        """The app's loop and driver, from the driver as it starts application mode."""
        self._loop, self._driver = loop, driver
        self._post(_Event(bound=True))

    @property
    def fired(self) -> bool:
        return self.reason is not None

    def _post(self, event: _Event) -> None:
        self._events.put(event)
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"!")

    # ---- the watcher -------------------------------------------------------------------------------

    def _watch(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        watched: dict[int, int] = {}
        for fd in (0, 1):
            rdev = self._tty_rdev[fd]
            if rdev is not None and rdev not in watched.values():
                # No events asked for: poll reports only a hangup or an error on it, never its input.
                poller.register(fd, 0)
                watched[fd] = rdev
        deadline: float | None = None
        closing = False
        while True:
            timeout_ms = None if deadline is None else max(0.0, (deadline - time.monotonic()) * 1000)
            for fd, mask in poller.poll(timeout_ms):
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError, OSError):
                        os.read(self._wake_r, 4096)
                elif mask & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    # Reported for as long as it lasts: stop watching the fd, once is enough.
                    poller.unregister(fd)
                    watched.pop(fd, None)
                    self.terminal_lost(fd, "hangup")
            while True:
                try:
                    event = self._events.get_nowait()
                except queue.Empty:
                    break
                closing = closing or event.closing
                if event.lost_fd is not None:
                    self._silence(event.lost_fd)
                if event.reason and self.reason is None:
                    self.reason, self._code = event.reason, event.code
                    deadline = time.monotonic() + self.deadline_s
                if self.reason is not None:
                    if self._driver is not None:
                        self._driver.unblock_output()
                    self._schedule_quit()
            if deadline is not None and time.monotonic() >= deadline:
                self._last_resort()
            if closing and deadline is None:
                return

    def _silence(self, fd: int) -> None:
        """Send the output fds on the lost terminal to /dev/null: every later write (Textual's writer,
        a last sentence on stderr, the interpreter's final flush) succeeds instead of failing with EIO."""
        lost = self._tty_rdev.get(fd)
        targets = [out for out in (1, 2) if lost is not None and self._tty_rdev[out] == lost]
        if not targets:
            return
        with contextlib.suppress(OSError):
            null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            for out in targets:
                os.dup2(null, out)
            os.close(null)

    def _schedule_quit(self) -> None:
        loop = self._loop
        if loop is None or self._quit_task is not None:
            return
        # A closed loop: the app has ended already and the main thread is finishing; the deadline stands.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._start_quit)

    def _start_quit(self) -> None:
        if self._quit_task is None:
            self._quit_task = asyncio.get_running_loop().create_task(self._quit(), name="k26-lifeline-quit")

    async def _quit(self) -> None:
        app = self.app
        # Leave first, as `q` does: the other consoles see this one go at once, and its lock is free.
        if isinstance(app, LeavesHosts):
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.leave_s):
                    await app.leave_hosts(self.leave_s)
        app.exit(return_code=self._code)

    def _last_resort(self) -> None:
        for hook in self._hooks:
            runner = threading.Thread(target=_quietly, args=(hook,), name="k26-last-resort", daemon=True)
            runner.start()
            runner.join(HOOK_S)
        driver = self._driver
        if driver is not None and driver.attrs_before is not None:
            # The terminal may still be there (SIGTERM): give it back its modes, as Textual would have.
            with contextlib.suppress(termios.error, OSError):
                termios.tcsetattr(driver.fileno, termios.TCSANOW, driver.attrs_before)
        os._exit(self._code)


def end_now(code: int) -> NoReturn:
    """End the process once a console ended by a signal or a lost terminal has left its hosts and cleaned
    up: what remains is the interpreter's teardown, measured at 1.0-1.3 s (from the last atexit handler to
    the process gone) on the 2-core machine at load 8-9, which took the demo past its two seconds.
    Nothing in it is ours (no atexit handler of ours or of our libraries)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    os._exit(code)


def _quietly(hook: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):
        hook()


def _tty_rdev(fd: int) -> int | None:
    """Which terminal `fd` is (its device number), or None when it is not one."""
    try:
        return os.fstat(fd).st_rdev if os.isatty(fd) else None
    except OSError:
        return None


class _TerminalOut:
    """What Textual's writer thread writes to: a failed write (EIO on a hung-up terminal) reports the loss
    once and turns every later write into a no-op, so the thread lives on and its queue never fills."""

    def __init__(self, out: TextIO, lost: Callable[[str], None]) -> None:
        self._out = out
        self._lost = lost
        self._dead = False

    def write(self, text: str) -> None:
        if not self._dead:
            try:
                self._out.write(text)
            except (OSError, ValueError) as exc:
                self._die(exc)

    def flush(self) -> None:
        if not self._dead:
            try:
                self._out.flush()
            except (OSError, ValueError) as exc:
                self._die(exc)

    def fileno(self) -> int:
        return self._out.fileno()

    def _die(self, exc: BaseException) -> None:
        self._dead = True
        self._lost(f"output failed: {exc}")


class LifelineDriver(LinuxDriver):
    """Textual's Linux driver made safe on a terminal that goes away (see the module's docstring)."""

    lifeline: ClassVar[Lifeline]

    def __init__(
        self, app: App[Any], *, debug: bool = False, mouse: bool = True, size: tuple[int, int] | None = None
    ) -> None:
        super().__init__(app, debug=debug, mouse=mouse, size=size)
        out = self._file
        assert out is not None
        fd = out.fileno()
        guarded = _TerminalOut(out, lambda how: self.lifeline.terminal_lost(fd, how))
        # Textual declares `_file` as sys.__stderr__'s type, but only hands it to its WriterThread, which
        # calls write, flush and fileno: the three that _TerminalOut has.
        self._file = guarded  # type: ignore[assignment]
        self._suspended = False

    def start_application_mode(self) -> None:
        super().start_application_mode()  # type: ignore[no-untyped-call]  # unannotated in Textual
        self.lifeline.bind(asyncio.get_running_loop(), self)

    def write(self, data: str) -> None:
        writer = self._writer_thread
        if writer is None or not self.lifeline.fired:
            super().write(data)
            return
        # Leaving: a terminal that takes no output (a frozen SSH session) must not hold the event loop in
        # the writer's bounded queue (WriterThread._queue, 30 writes) before it has left the hosts. A live
        # terminal drains a write in well under this wait; a frozen one loses frames nobody sees.
        with contextlib.suppress(queue.Full):
            writer._queue.put(data, timeout=OUTPUT_WAIT_S)

    def unblock_output(self) -> None:
        """From the lifeline's watcher: if the writer's queue is full, the loop may be blocked putting into
        it on a frozen terminal; empty it, so the loop runs on and leaves the hosts."""
        writer = self._writer_thread
        if writer is not None and writer._queue.full():
            with contextlib.suppress(queue.Empty):
                while True:
                    writer._queue.get_nowait()

    def _sigtstp_application(self, *args: object) -> None:
        self._suspended = self._auto_restart
        super()._sigtstp_application(*args)

    def _sigcont_application(self, *args: object) -> None:
        # Resume only what a Ctrl+Z suspended, never after a quit (the hangup's SIGCONT) nor on a
        # terminal that is gone.
        if not self._suspended or self.lifeline.fired:
            return
        self._suspended = False
        super()._sigcont_application(*args)

    def close(self) -> None:
        super().close()
        # The handlers were this driver's; left in place they would act on a driver that is closed.
        for sig in (signal.SIGTSTP, signal.SIGCONT):
            signal.signal(sig, signal.SIG_DFL)

    def run_input_thread(self) -> None:
        # Textual's loop, except that reading 0 bytes or failing means the terminal is gone: report it
        # and stop reading rather than select again (a hung-up terminal is always "readable").
        fd = self.fileno
        selector = selectors.SelectSelector()
        selector.register(fd, selectors.EVENT_READ)
        parser = XTermParser(self._debug)
        decode = getincrementaldecoder("utf-8")().decode
        try:
            while not self.exit_event.is_set():
                if selector.select(0.1):
                    try:
                        data = os.read(fd, 4096)
                    except OSError as exc:
                        self.lifeline.terminal_lost(fd, f"read failed: {exc.strerror or exc}")
                        return
                    if not data:
                        self.lifeline.terminal_lost(fd, "end of input")
                        return
                    for event in parser.feed(decode(data)):
                        self.process_message(event)
                for event in parser.tick():
                    self.process_message(event)
        finally:
            selector.close()
