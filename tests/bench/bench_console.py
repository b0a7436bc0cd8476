"""End-to-end benchmark of the console: the real app in a real terminal (a pty) on a twin over SSH.

    python tests/bench/bench_console.py                    # all figures, prints them and a JSON line
    python tests/bench/bench_console.py --seconds 10       # shorter windows

What it measures, each set against a baseline taken in the same run (these machines are noisy):

* **event → screen**: a twin host serves SSH on loopback; a load generator writes 2,000 journal lines/s
  (SGLang decode/prefill/access lines) into the twin's journal while the console samples 8 GPUs at 4 Hz.
  Every 250 ms one line carries a unique marker; the console's feed is filtered (`/`) to the markers,
  so the newest marker is on screen as soon as the console has drawn it. Latency = from the write into
  the journal to the marker's bytes arriving on the pty. Baseline: the same marker read by a bare
  `journalctl -f` over the same SSH path — what the transport alone costs.
* **key → repaint** under that load: F1 opens the help screen; latency = key written to the help text's
  bytes arriving on the pty (p50/p95 over the presses). Baseline: the same key in a bare Textual app
  with one static widget, in the same kind of pty. `m` likewise, with the bare app's answer in a toast or
  on a border; the bare app is measured idle before the load, busy (a frame every 1/60 s), and on the
  console's CPU while the same load runs (the console closed).
* **CPUs**: by default the console (and each baseline's client) runs on a CPU of its own and everything
  that stands in for the remote host (the twin's sshd, journal and journalctl, the load generator, this
  process) on the others. In production those run on the GPU host, not on the jump host beside the
  console; on a 2-core machine sharing them doubles key latency (see docs/performance.md).
  `--cpus shared` runs everything on every CPU, for comparison.
* **idle cost**: 8 GPUs at 1 Hz, a quiet journal: CPU (utime+stime from /proc over the window, as % of
  one core), RSS, and the bytes the console writes to the terminal per second. Before the window the
  child is fed a day of history quickly (86,400 decode lines through its session's parser and state,
  86,400 GPU samples), so RSS is the RSS after a day. Baseline: the bare Textual app.

Not a timed test: pytest ignores tests/bench. Figures go in docs/performance.md (by hand).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import pty
import random
import re
import select
import signal
import statistics
import string
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

COLS, ROWS = 160, 48
CSI = re.compile(rb"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>78]")
HELP_TEXT = b"Esc closes"
# (written, seen) of every F1 and m press, dumped next to the child's K26_BENCH_LOOPLOG when it is set
KEY_LOG: list[tuple[float, float]] = []


# ---------------------------------------------------------------------------------------------- child


def child_console(hosts: str, name: str, gpu_interval: float, preload_s: int) -> None:
    """The console as an operator runs it, with the GPU sampling rate set."""
    from console.sources.hosts import load_hosts
    from console.sources.session_options import SessionOptions
    from console.tui.app import ConsoleApp, HostEntry

    config = load_hosts(hosts).get(name)
    assert config is not None
    entry = HostEntry(name, config=config, session=SessionOptions(gpu_interval_s=gpu_interval))
    app = ConsoleApp([entry], target=200_000, target_source="--target-context")
    if preload_s:
        _preload_day(app, name, preload_s)
    gclog = os.environ.get("K26_BENCH_GCLOG")
    if gclog:
        _log_gc_pauses(gclog)
    looplog = os.environ.get("K26_BENCH_LOOPLOG")
    if looplog:
        _log_loop_stalls(looplog)
    spans = os.environ.get("K26_BENCH_SPANS")
    if spans:
        _log_marker_spans(spans)
    paints = os.environ.get("K26_BENCH_PAINTS")
    if paints:
        _log_paints(paints)
    profile = os.environ.get("K26_BENCH_PROFILE")
    if not profile:
        app.run()
        return
    import cProfile

    prof = cProfile.Profile()
    signal.signal(signal.SIGTERM, lambda *_: app.exit())
    after = float(os.environ.get("K26_BENCH_PROFILE_AFTER", "0"))
    try:
        if os.environ.get("K26_BENCH_PROFILE_WINDOW"):
            # The parent brackets its idle window: SIGUSR1 at its start, SIGUSR2 at its end (the key
            # presses after the window are not idle work). K26_BENCH_PROFILE_WINDOW=load brackets the `m`
            # presses under the filtered load instead.
            signal.signal(signal.SIGUSR1, lambda *_: prof.enable())
            signal.signal(signal.SIGUSR2, lambda *_: prof.disable())
            app.run()
        elif after <= 0:
            prof.runcall(app.run)
        else:
            # Only what follows the start-up and the day's preload (an idle window's profile): the
            # alarm's handler runs on the main thread, where the app's loop runs.
            signal.signal(signal.SIGALRM, lambda *_: prof.enable())
            signal.alarm(max(1, round(after)))
            app.run()
            prof.disable()
    finally:
        prof.dump_stats(profile)


def _log_gc_pauses(path: str) -> None:
    """Every collection's generation and pause, written at exit (to tell GC pauses from slow code)."""
    import atexit
    import gc

    pauses: list[tuple[int, float]] = []
    started: list[float] = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], (time.perf_counter() - started[0]) * 1000))

    gc.callbacks.append(callback)

    def dump() -> None:
        counts = {str(g): len(gc.get_objects(g)) for g in (0, 1, 2)}
        counts["frozen"] = gc.get_freeze_count()
        Path(path).write_text(json.dumps({"pauses": pauses, "objects": counts}))

    atexit.register(dump)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def _log_loop_stalls(path: str) -> None:
    """Every event-loop callback that held the loop ≥ 5 ms (K26_BENCH_LOOPLOG_MS sets another floor), one
    JSON line `[start, ms, what]` each, in `time.monotonic` seconds: the same clock as the parent's key
    timestamps. Written as they happen (the child may be killed at the end). Under 5 ms the log also
    follows a key's path: `KEY` when the driver's thread read it, `RESUME` when a repaint was asked of a
    paused screen, `DISPLAY` for every frame written."""
    import asyncio.events

    out = open(path, "w", buffering=1)  # noqa: SIM115 - open for the child's whole life
    run = asyncio.events.Handle._run

    floor = float(os.environ.get("K26_BENCH_LOOPLOG_MS", "5"))

    def timed(handle: asyncio.events.Handle) -> None:
        t0 = time.monotonic()
        run(handle)
        ms = (time.monotonic() - t0) * 1000
        if ms >= floor:
            out.write(json.dumps([t0, round(ms, 2), _handle_name(handle)]) + "\n")

    asyncio.events.Handle._run = timed  # type: ignore[method-assign]
    if floor >= 5:
        return
    # Below 5 ms the log is for one key's path: when the driver's thread read it, and every frame written.
    from textual import events
    from textual.app import App
    from textual.driver import Driver

    process = Driver.process_message

    def traced_process(self: Driver, message: object) -> None:
        if isinstance(message, events.Key):
            out.write(json.dumps([time.monotonic(), 0, f"KEY {message.key}"]) + "\n")
        process(self, message)  # type: ignore[arg-type]

    Driver.process_message = traced_process  # type: ignore[method-assign]
    display = App._display

    def traced_display(self: App[object], screen: object, renderable: object) -> None:
        t0 = time.monotonic()
        display(self, screen, renderable)  # type: ignore[arg-type]
        out.write(json.dumps([t0, round((time.monotonic() - t0) * 1000, 2), "DISPLAY"]) + "\n")

    App._display = traced_display  # type: ignore[method-assign]
    from textual.timer import Timer

    resume = Timer.resume

    def traced_resume(self: Timer) -> None:
        if self.name == "screen_update" and not self._active.is_set():
            out.write(json.dumps([time.monotonic(), 0, "RESUME"]) + "\n")
        resume(self)

    Timer.resume = traced_resume  # type: ignore[method-assign]


def _log_paints(path: str) -> None:
    """How often each widget asks for a repaint (`refresh`) and is drawn again (its `render`, or its
    rows for a line widget), counted since the start and written every half second as one JSON line
    `{"t": monotonic, "refresh": {widget: n}, "render": {widget: n}}`: the parent diffs the lines
    around its idle window (`paints_between`)."""
    from textual.widget import Widget

    from console.tui.feed import FeedLog

    refreshes: dict[str, int] = {}
    renders: dict[str, int] = {}

    def name(widget: Widget) -> str:
        return f"{type(widget).__name__}#{widget.id}" if widget.id else type(widget).__name__

    refresh = Widget.refresh

    def counted_refresh(self: Widget, *regions: object, **kw: object) -> Widget:
        if kw.get("repaint", True) or kw.get("layout"):
            key = name(self)
            refreshes[key] = refreshes.get(key, 0) + 1
        return refresh(self, *regions, **kw)  # type: ignore[arg-type]

    render = Widget._render

    def counted_render(self: Widget) -> object:
        if self._layout_cache.get("_render.visual") is None:
            key = name(self)
            renders[key] = renders.get(key, 0) + 1
        return render(self)

    render_lines = FeedLog.render_lines

    def counted_lines(self: FeedLog, crop: object) -> object:
        key = name(self)
        renders[key] = renders.get(key, 0) + 1
        return render_lines(self, crop)  # type: ignore[arg-type]

    Widget.refresh = counted_refresh  # type: ignore[method-assign,assignment]
    Widget._render = counted_render  # type: ignore[method-assign,assignment]
    FeedLog.render_lines = counted_lines  # type: ignore[method-assign,assignment]
    out = open(path, "w", buffering=1)  # noqa: SIM115 - open for the child's whole life

    def dump() -> None:
        while True:
            line = {"t": time.monotonic(), "refresh": dict(refreshes), "render": dict(renders)}
            out.write(json.dumps(line) + "\n")
            time.sleep(0.5)

    threading.Thread(target=dump, daemon=True).start()


def paints_between(path: str, t0: float, t1: float) -> dict[str, dict[str, int]]:
    """Per widget, the repaints asked for and the renders done between `t0` and `t1` (`_log_paints`)."""
    lines = [json.loads(raw) for raw in Path(path).read_text().splitlines() if raw.strip()]
    before = max((x for x in lines if x["t"] <= t0), key=lambda x: x["t"], default=None)
    after = min((x for x in lines if x["t"] >= t1), key=lambda x: x["t"], default=None)
    if before is None or after is None:
        return {}
    out: dict[str, dict[str, int]] = {}
    for kind in ("refresh", "render"):
        for widget, n in after[kind].items():
            done = n - before[kind].get(widget, 0)
            if done:
                out.setdefault(widget, {"refresh": 0, "render": 0})[kind] = done
    return out


MARKER = re.compile(r"benchmark-[a-z]{10}")


def _log_marker_spans(path: str) -> None:
    """Where each marker line's time goes inside the console, one JSON line per marker
    `[marker, folded, published, shown, drawn]` in `time.monotonic` seconds (the parent's clock, which
    has when it was written and when its bytes arrived): the session folds the journal batch that holds
    it, a snapshot that holds it is published, the app hands that snapshot (or the line alone) to the
    feed, and the next frame is written to the terminal."""
    from textual.app import App

    import console.sources.session as session_mod
    from console.core.hostfold import HostFold
    from console.tui.feed import FeedLog
    from console.tui.view import feed_line

    out = open(path, "w", buffering=1)  # noqa: SIM115 - open for the child's whole life
    folded: list[tuple[str, float]] = []
    published: list[tuple[str, float, float]] = []
    shown: list[tuple[str, float, float, float]] = []

    journal = HostFold.journal

    def traced_journal(self: HostFold, entries: list[dict[str, object]]) -> list[object]:
        result = journal(self, entries)
        now = time.monotonic()
        for entry in entries:
            found = MARKER.search(str(entry.get("MESSAGE", "")))
            if found:
                folded.append((found.group(0), now))
        return result  # type: ignore[return-value]

    publish = session_mod.HostSession._publish_now

    def traced_publish(self: session_mod.HostSession) -> None:
        publish(self)
        now = time.monotonic()
        published.extend((m, t, now) for m, t in folded)
        folded.clear()

    append = FeedLog.append_rows

    def traced_append(self: FeedLog, rows: object) -> None:
        rows = list(rows)  # type: ignore[call-overload]
        append(self, rows)
        now = time.monotonic()
        texts = " ".join(feed_line(e) for e in rows)
        for item in [p for p in published if p[0] in texts]:
            published.remove(item)
            shown.append((*item, now))
        # a marker folded straight to the feed, before any snapshot holds it
        for item in [f for f in folded if f[0] in texts]:
            folded.remove(item)
            shown.append((item[0], item[1], float("nan"), now))

    display = App._display

    def traced_display(self: App[object], screen: object, renderable: object) -> None:
        display(self, screen, renderable)  # type: ignore[arg-type]
        if shown:
            now = time.monotonic()
            for item in shown:
                out.write(json.dumps([*item, now]) + "\n")
            shown.clear()

    HostFold.journal = traced_journal  # type: ignore[method-assign,assignment]
    session_mod.HostSession._publish_now = traced_publish  # type: ignore[method-assign]
    FeedLog.append_rows = traced_append  # type: ignore[method-assign]
    App._display = traced_display  # type: ignore[method-assign]


def _handle_name(handle: object) -> str:
    """The task behind a loop callback (its name and coroutine) where there is one."""
    import asyncio
    import gc

    callback = getattr(handle, "_callback", None)
    owners = [getattr(callback, "__self__", None), *gc.get_referents(callback)]
    for owner in owners:
        if isinstance(owner, asyncio.Task):
            coro = owner.get_coro()
            return f"task {owner.get_name()} {getattr(coro, '__qualname__', coro)}"[:300]
    return repr(handle)[:300]


def _preload_day(app: object, name: str, seconds: int = 86_400) -> None:
    """A day of a quiet server (`seconds` of it), pushed through the session's parser and state before
    the app runs: one decode line a second and one 8-GPU sample a second, 86,400 of each for a day."""
    import console.sources.session as session_mod
    from console.core.gpus import GpuSample, HostGpuSample, SamplerState

    original_start = session_mod.HostSession.start

    async def start(self: session_mod.HostSession) -> None:
        base = time.time() - seconds
        lines = [
            f"[{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(base + i))} TP0] Decode batch, #running-req: 1, "
            f"#token: {1000 + i % 5000}, token usage: 0.01, cuda graph: True, gen throughput (token/s): 20.{i % 10}, "
            "#queue-req: 0, "
            for i in range(seconds)
        ]
        for start_i in range(0, len(lines), 2000):
            self.fold.journal(lines[start_i : start_i + 2000])
        for i in range(seconds):
            sample = HostGpuSample(
                state=SamplerState.OK,
                backend="nvml",
                host=name,
                ts=base + i,
                gpus=tuple(
                    GpuSample(
                        index=g,
                        name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
                        utilization_pct=float(i % 100),
                        memory_used_mib=90_000.0,
                        memory_total_mib=97_887.0,
                    )
                    for g in range(8)
                ),
            )
            self.fold.gpu(sample)
        await original_start(self)

    session_mod.HostSession.start = start  # type: ignore[method-assign]


def child_bare() -> None:
    """The baseline: a bare Textual app with one static widget and the same help key."""
    from textual.app import App, ComposeResult
    from textual.binding import Binding
    from textual.screen import ModalScreen
    from textual.widgets import Footer, Static

    class Help(ModalScreen[None]):
        BINDINGS = [Binding("escape", "dismiss", "Close")]  # noqa: RUF012

        def compose(self) -> ComposeResult:
            yield Static("help\nEsc closes")

        def action_dismiss(self) -> None:  # type: ignore[override]
            self.dismiss(None)

    class Bare(App[None]):
        # m answers with a toast, as the console did; b with the words on a widget's border, as the
        # console's m does now (its feed says whether polls are hidden): both baselines are reported.
        # t makes it busy: a one-line widget redrawn 60 times a second, so a key always finds the frame
        # timer running and waits for its turn: the waiting alone, as a console under load waits behind
        # its loop's work.
        CSS = "#body { border: round $accent; height: 1fr; } #tick { height: 1; }"
        BINDINGS = [  # noqa: RUF012
            Binding("f1", "help", "Help"),
            Binding("q", "quit", "Quit"),
            Binding("m", "toggle"),
            Binding("b", "border"),
            Binding("t", "busy"),
        ]
        shown = False
        on_border = False
        ticks = 0

        def action_busy(self) -> None:
            self.set_interval(1 / 60, self.tick)

        def tick(self) -> None:
            self.ticks += 1
            self.query_one("#tick", Static).update(f"tick {self.ticks}")

        def action_toggle(self) -> None:
            self.shown = not self.shown
            self.notify("polls shown" if self.shown else "polls hidden", timeout=2)

        def action_border(self) -> None:
            self.on_border = not self.on_border
            said = "polls shown (m)" if self.on_border else "polls hidden (m)"
            self.query_one("#body", Static).border_subtitle = said

        def compose(self) -> ComposeResult:
            yield Static("k26 baseline " * 40, id="body")
            yield Static("", id="tick")
            yield Footer()

        def action_help(self) -> None:
            self.push_screen(Help())

    Bare().run()


# ---------------------------------------------------------------------------------------------- pty


class Terminal:
    """A child process on a pty; a reader thread timestamps every chunk it writes."""

    def __init__(self, argv: list[str], cpus: set[int] | None = None) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child
            os.environ.update({"TERM": "xterm-256color", "COLUMNS": str(COLS), "LINES": str(ROWS)})
            os.environ.pop("TEXTUAL", None)
            if cpus:
                os.sched_setaffinity(0, cpus)
            os.execv(sys.executable, [sys.executable, *argv])
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
        self.pid = pid
        self.fd = fd
        self.chunks: list[tuple[float, bytes]] = []
        self.total = 0
        # Presses of each toggle key so far: the words the next press brings follow from it, whatever
        # number of presses a phase made (an odd --presses left the next phase waiting for the wrong ones).
        self.toggled: dict[bytes, int] = {}
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop:
            ready, _, _ = select.select([self.fd], [], [], 0.2)
            if not ready:
                continue
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                return
            if not data:
                return
            now = time.monotonic()
            with self._lock:
                self.chunks.append((now, data))
                self.total += len(data)

    def write(self, data: bytes) -> float:
        t = time.monotonic()
        os.write(self.fd, data)
        return t

    def mark(self) -> int:
        with self._lock:
            return len(self.chunks)

    def wait_for(self, needle: bytes, since: int, timeout: float) -> float | None:
        """Arrival time of the first chunk after index `since` whose text (escapes removed, joined with
        what came before it) completes `needle`."""
        deadline = time.monotonic() + timeout
        seen = since
        text = b""
        while time.monotonic() < deadline:
            with self._lock:
                new = self.chunks[seen:]
            for t, data in new:
                text = (text + CSI.sub(b"", data))[-65536:]
                if needle in text:
                    return t
            seen += len(new)
            time.sleep(0.002)
        return None

    def bytes_between(self, t0: float, t1: float) -> int:
        with self._lock:
            return sum(len(d) for t, d in self.chunks if t0 <= t < t1)

    def trim(self) -> None:
        with self._lock:
            self.chunks.clear()

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks

    def tail(self, chars: int = 3000) -> str:
        """The end of what the child wrote, its escapes removed (a traceback, when it died)."""
        with self._lock:
            data = b"".join(d for _, d in self.chunks)
        return re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", data).decode("utf-8", "replace")[-chars:]

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def close(self) -> None:
        if self._stop:
            return  # reaped already: its pid may be another process's by now
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGTERM)
        for _ in range(50):
            pid, _status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        self._stop = True
        self._thread.join(2)
        with contextlib.suppress(OSError):
            os.close(self.fd)


# ---------------------------------------------------------------------------------------------- load


def _marker() -> str:
    return "benchmark-" + "".join(random.choice(string.ascii_lowercase) for _ in range(10))


class JournalLoad:
    """Writes SGLang-looking lines into the twin's journal at a fixed rate, from a thread."""

    def __init__(self, twin: object, rate: float) -> None:
        from console.twin.journal import JournalClient

        self.twin = twin
        self.client = JournalClient(twin.layout)  # type: ignore[attr-defined]
        self.rate = rate
        self.unit = twin.unit  # type: ignore[attr-defined]
        show = twin.systemctl("show", "-p", "InvocationID", "-p", "MainPID", twin.unit)  # type: ignore[attr-defined]
        props = dict(line.split("=", 1) for line in show.stdout.splitlines() if "=" in line)
        self.invocation = props.get("InvocationID", "")
        self.pid = props.get("MainPID", "4242")
        self.written = 0
        self.markers: list[tuple[str, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.marker_every = 0.25

    def fields(self, message: str) -> dict[str, str]:
        return {
            "MESSAGE": message,
            "PRIORITY": "6",
            "SYSLOG_IDENTIFIER": "python3",
            "_PID": self.pid,
            "_COMM": "python3",
            "_SYSTEMD_UNIT": self.unit,
            "_SYSTEMD_INVOCATION_ID": self.invocation,
            "_TRANSPORT": "stdout",
        }

    def line(self, i: int) -> str:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        kind = i % 10
        if kind < 7:
            return (
                f"[{stamp} TP{i % 8}] Decode batch, #running-req: 3, #token: {180000 + i % 997}, "
                f"token usage: 0.83, cuda graph: True, gen throughput (token/s): 2.{i % 10}, #queue-req: 0, "
            )
        if kind < 9:
            return (
                f"[{stamp} TP0] Prefill batch, #new-seq: 1, #new-token: 8192, #cached-token: 0, "
                "token usage: 0.80, #running-req: 2, #queue-req: 0, "
            )
        return f'INFO:     127.0.0.1:{40000 + i % 20000} - "POST /generate HTTP/1.1" 200 OK'

    def run(self) -> None:
        i = 0
        start = time.monotonic()
        next_marker = start
        while not self._stop.is_set():
            due = int((time.monotonic() - start) * self.rate)
            while i < due:
                self.client.send(self.fields(self.line(i)))
                i += 1
            now = time.monotonic()
            if now >= next_marker:
                m = _marker()
                self.client.send(self.fields(f"[{time.strftime('%Y-%m-%d %H:%M:%S')} TP0] {m}"))
                self.markers.append((m, time.monotonic()))
                next_marker = now + self.marker_every
            self.written = i
            time.sleep(0.004)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(5)
        self.client.close()


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def marker_latencies(term: Terminal, load: JournalLoad, since_marker: int, timeout: float) -> list[float]:
    out: list[float] = []
    arrived: dict[str, tuple[float, float]] = {}
    for m, t_written in load.markers[since_marker:]:
        t = term.wait_for(m.encode(), 0, timeout)
        if t is not None:
            out.append(max(0.0, t - t_written))
            arrived[m] = (t_written, t)
    spans = os.environ.get("K26_BENCH_SPANS")
    if spans:
        span_report(spans, arrived)
    return out


def span_report(path: str, arrived: dict[str, tuple[float, float]]) -> None:
    """Each marker's time split by stage (the child's `_log_marker_spans` and the parent's times)."""
    stages: dict[str, list[float]] = {k: [] for k in ("read", "publish", "show", "frame", "write", "total")}
    for raw in Path(path).read_text().splitlines():
        marker, folded, published, shown, drawn = json.loads(raw)
        if marker not in arrived:
            continue
        written, seen = arrived[marker]
        stages["read"].append(folded - written)
        if published == published:  # not NaN: the line went through a snapshot
            stages["publish"].append(published - folded)
            stages["show"].append(shown - published)
        else:
            stages["show"].append(shown - folded)
        stages["frame"].append(drawn - shown)
        stages["write"].append(seen - drawn)
        stages["total"].append(seen - written)
    for name, values in stages.items():
        ms = _ms(values)
        _say(f"span {name:8} n {ms['n']}  p50 {ms['p50']} ms  p95 {ms['p95']} ms  max {ms['max']} ms")


def journal_baseline(twin: object, load: JournalLoad, seconds: float, cpus: set[int] | None) -> list[float]:
    """The transport floor: `journalctl -f` for the unit over the same SSH, markers timed the same way.
    The ssh client stands where the console stood, so it gets the console's CPUs."""
    argv = [*twin.ssh_command().split(), "journalctl", "-f", "-n", "0", "-u", twin.unit, "-o", "cat"]  # type: ignore[attr-defined]
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0, preexec_fn=pin
    )
    arrivals: dict[str, float] = {}

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            t = time.monotonic()
            for m in re.findall(rb"benchmark-[a-z]{10}", raw):
                arrivals.setdefault(m.decode(), t)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(1.5)
    first = len(load.markers)
    time.sleep(seconds)
    time.sleep(1.0)
    proc.terminate()
    proc.wait(5)
    return [arrivals[m] - t for m, t in load.markers[first:] if m in arrivals]


def key_latencies(term: Terminal, presses: int) -> list[float]:
    out: list[float] = []
    for _ in range(presses):
        mark = term.mark()
        t0 = term.write(b"\x1bOP")  # F1
        t = term.wait_for(HELP_TEXT, mark, 5.0)
        if t is not None:
            out.append(t - t0)
            KEY_LOG.append((t0, t))
        time.sleep(0.15)
        term.write(b"\x1b")  # Esc closes
        time.sleep(0.35)
    return out


def toggle_latencies(term: Terminal, presses: int, key: bytes = b"m") -> list[float]:
    """`m` (monitoring polls shown / hidden in the feed): a light key, answered by words unique to each
    state (the console's on the feed's border, the bare app's in a toast, or on a border with `b`)."""
    out: list[float] = []
    for _ in range(presses):
        n = term.toggled.get(key, 0)
        term.toggled[key] = n + 1
        want = b"polls shown" if n % 2 == 0 else b"polls hidden"
        mark = term.mark()
        t0 = term.write(key)
        t = term.wait_for(want, mark, 5.0)
        if t is not None:
            out.append(t - t0)
            KEY_LOG.append((t0, t))
        time.sleep(0.4)
    return out


def bare_toggle_latencies(term: Terminal, presses: int) -> list[float]:
    return toggle_latencies(term, presses)


def bare_border_latencies(term: Terminal, presses: int) -> list[float]:
    return toggle_latencies(term, presses, b"b")


def settle(term: Terminal, seconds: float) -> None:
    time.sleep(seconds)
    term.trim()


def idle_window(term: Terminal, seconds: float) -> dict[str, float]:
    bracket = os.environ.get("K26_BENCH_PROFILE_WINDOW", "") not in ("", "load")
    if bracket:
        os.kill(term.pid, signal.SIGUSR1)
    cpu0, t0 = term.cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    cpu1, t1 = term.cpu_seconds(), time.monotonic()
    if bracket:
        os.kill(term.pid, signal.SIGUSR2)
    paints = os.environ.get("K26_BENCH_PAINTS")
    if paints:
        time.sleep(0.6)  # the child writes its counts every half second
        for widget, n in sorted(paints_between(paints, t0, t1).items()):
            said = f"refresh {n['refresh']:4}  render {n['render']:4}  in {t1 - t0:.0f} s"
            _say(f"idle paints {widget:28} {said}")
    return {
        "cpu_pct": 100 * (cpu1 - cpu0) / (t1 - t0),
        "rss_mb": term.rss_mb(),
        "bytes_per_s": term.bytes_between(t0, t1) / (t1 - t0),
    }


# ---------------------------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each measuring window")
    ap.add_argument("--presses", type=int, default=30)
    ap.add_argument(
        "--idle-settle",
        type=float,
        default=12.0,
        help="seconds the idle console runs before its window (310: the serving panel's 5-minute window "
        "of /metrics scrapes is full)",
    )
    ap.add_argument("--rate", type=float, default=2000.0, help="journal lines per second under load")
    ap.add_argument(
        "--only",
        choices=["load", "idle"],
        help="run only that phase (quicker, for profiling with K26_BENCH_*)",
    )
    ap.add_argument(
        "--cpus",
        choices=["split", "shared"],
        default="split",
        help="split (default): the console on a CPU of its own, the stand-in remote host on the rest; "
        "shared: everything on every CPU",
    )
    ap.add_argument("--child", choices=["console", "bare"], help=argparse.SUPPRESS)
    ap.add_argument("--hosts", help=argparse.SUPPRESS)
    ap.add_argument("--name", help=argparse.SUPPRESS)
    ap.add_argument("--gpu-interval", type=float, default=1.0, help=argparse.SUPPRESS)
    ap.add_argument(
        "--history-s",
        type=int,
        default=86_400,
        help="seconds of a quiet server's history the idle console folds before it runs (default: a day; "
        "the smoke run folds a few minutes: the day is ~15 s of CPU)",
    )
    ap.add_argument("--preload-s", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "console":
        child_console(args.hosts, args.name, args.gpu_interval, args.preload_s)
        return 0
    if args.child == "bare":
        child_bare()
        return 0

    from console.twin.host import TwinHost

    me = str(Path(__file__).resolve())
    figures: dict[str, object] = {}
    console_cpus = split_cpus() if args.cpus == "split" else None
    figures["cpus"] = (
        f"console on CPU {sorted(console_cpus)}, the twin and load on CPU {sorted(os.sched_getaffinity(0))}"
        if console_cpus
        else f"shared: everything on CPU {sorted(os.sched_getaffinity(0))}"
    )
    with tempfile.TemporaryDirectory(prefix="k26-bench-") as tmp:
        twin = TwinHost(
            Path(tmp) / "twin", name="bench", time_scale=0.02, systemd="simulated"
        )  # its load writes the simulated journal
        twin.start_sync()
        try:
            hosts = str(twin.hosts_toml)
            say = _say

            if args.only is None:
                # -- baseline process: a bare Textual app
                say("baseline: bare Textual app")
                bare = Terminal([me, "--child", "bare"], console_cpus)
                try:
                    settle(bare, 3.0)
                    figures["bare_idle"] = idle_window(bare, args.seconds / 2)
                    figures["bare_key_ms"] = _ms(key_latencies(bare, args.presses))
                    figures["bare_toggle_ms"] = _ms(bare_toggle_latencies(bare, args.presses))
                    figures["bare_border_ms"] = _ms(bare_border_latencies(bare, args.presses))
                    bare.write(b"t")  # busy from now on: a frame every slot
                    settle(bare, 1.0)
                    figures["bare_busy_toggle_ms"] = _ms(bare_toggle_latencies(bare, args.presses))
                    figures["bare_busy_border_ms"] = _ms(bare_border_latencies(bare, args.presses))
                finally:
                    bare.close()

            if args.only in (None, "idle"):
                # -- idle: 8 GPUs at 1 Hz, quiet journal, after a day of history
                say(f"idle console after {args.history_s} s of history (8 GPUs at 1 Hz, quiet journal)")
                figures["history_s"] = args.history_s
                term = Terminal(
                    [
                        me,
                        "--child",
                        "console",
                        "--hosts",
                        hosts,
                        "--name",
                        "bench",
                        "--gpu-interval",
                        "1.0",
                        "--preload-s",
                        str(args.history_s),
                    ],
                    console_cpus,
                )
                try:
                    # the serving panel's figures are on screen (its p50 header) before the window
                    figures["idle_serving_panel"] = term.wait_for(b"p50", 0, 60.0) is not None
                    if not figures["idle_serving_panel"]:
                        # A console that died (a traceback on its terminal) must not read as 0% idle.
                        raise SystemExit(f"bench: the console never showed its serving panel:\n{term.tail()}")
                    settle(term, args.idle_settle)
                    figures["idle"] = idle_window(term, args.seconds)
                    figures["idle_key_ms"] = _ms(key_latencies(term, args.presses))
                    figures["idle_toggle_ms"] = _ms(toggle_latencies(term, args.presses))
                finally:
                    term.close()

            if args.only in (None, "load"):
                # -- load: 2,000 lines/s, 8 GPUs at 4 Hz
                say(f"under load: {args.rate:.0f} journal lines/s, 8 GPUs at 4 Hz")
                load = JournalLoad(twin, args.rate)
                term = Terminal(
                    [me, "--child", "console", "--hosts", hosts, "--name", "bench", "--gpu-interval", "0.25"],
                    console_cpus,
                )
                try:
                    settle(term, 8.0)
                    term.write(b"/")
                    time.sleep(0.3)
                    term.write(b"benchmark-\r")
                    time.sleep(0.5)
                    load.start()
                    settle(term, 3.0)
                    first = len(load.markers)
                    cpu0, t0 = term.cpu_seconds(), time.monotonic()
                    time.sleep(args.seconds)
                    cpu1, t1 = term.cpu_seconds(), time.monotonic()
                    figures["load_cpu_pct"] = 100 * (cpu1 - cpu0) / (t1 - t0)
                    figures["load_bytes_per_s"] = term.bytes_between(t0, t1) / (t1 - t0)
                    figures["load_rss_mb"] = term.rss_mb()
                    # Counted before waiting: markers written while it waits are not waited for.
                    sent = len(load.markers) - first
                    lat = marker_latencies(term, load, first, 2.0)
                    figures["event_to_screen_ms"] = _ms(lat) | {"markers": sent, "seen": len(lat)}
                    figures["key_ms"] = _ms(key_latencies(term, args.presses))
                    bracket = os.environ.get("K26_BENCH_PROFILE_WINDOW") == "load"
                    if bracket:
                        os.kill(term.pid, signal.SIGUSR1)
                    figures["toggle_ms"] = _ms(toggle_latencies(term, args.presses))
                    if bracket:
                        os.kill(term.pid, signal.SIGUSR2)
                    # The same keys with the feed unfiltered, as an operator usually has it: every line
                    # of the 2,000 a second is written to the feed.
                    term.write(b"/")
                    time.sleep(0.3)
                    term.write(b"\x1b")  # Esc in the filter box clears the filter
                    settle(term, 2.0)
                    cpu0, t0u = term.cpu_seconds(), time.monotonic()
                    figures["key_unfiltered_ms"] = _ms(key_latencies(term, args.presses))
                    cpu1, t1u = term.cpu_seconds(), time.monotonic()
                    figures["load_unfiltered_cpu_pct"] = 100 * (cpu1 - cpu0) / (t1u - t0u)
                    figures["journal_lines_per_s"] = load.written / max(1e-9, time.monotonic() - t0 + 3.0)
                    say("baseline: the same markers through a bare journalctl -f over the same SSH")
                    figures["journalctl_ms"] = _ms(
                        journal_baseline(twin, load, args.seconds / 2, console_cpus)
                    )
                    # The keys' baseline under the same load: the bare app on the console's CPU (closed
                    # first, so the app has it to itself as the console had), while the twin's sshd,
                    # journal and load keep the other CPU, and this process's reader, as busy as they were
                    # for the console's presses. The idle baselines above ran before any load.
                    term.close()
                    say("baseline: the bare app on the console's CPU, the same load running")
                    bare = Terminal([me, "--child", "bare"], console_cpus)
                    try:
                        settle(bare, 3.0)
                        figures["bare_loaded_toggle_ms"] = _ms(bare_toggle_latencies(bare, args.presses))
                        figures["bare_loaded_border_ms"] = _ms(bare_border_latencies(bare, args.presses))
                    finally:
                        bare.close()
                finally:
                    load.stop()
                    term.close()
        finally:
            twin.stop_sync()

    looplog = os.environ.get("K26_BENCH_LOOPLOG")
    if looplog:
        Path(looplog + ".keys").write_text(json.dumps(KEY_LOG))
    report(figures)
    return 0


def split_cpus() -> set[int] | None:
    """Give the console the last CPU this process may use and keep the rest for this process and what it
    starts (the twin's sshd, journal writer and journalctl inherit it). None on a single CPU."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None
    os.sched_setaffinity(0, set(allowed[:-1]))
    return {allowed[-1]}


def _ms(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {
        "n": len(ms),
        "p50": round(_percentile(ms, 50), 1),
        "p95": round(_percentile(ms, 95), 1),
        "max": round(max(ms), 1) if ms else float("nan"),
        "mean": round(statistics.fmean(ms), 1) if ms else float("nan"),
    }


def _say(text: str) -> None:
    sys.stderr.write(f"bench: {text}\n")
    sys.stderr.flush()


def report(f: dict[str, object]) -> None:
    g: Callable[[str], dict[str, float]] = lambda k: f.get(k) or {}  # type: ignore[assignment,return-value]  # noqa: E731
    ev, base, key, bkey, idle, bidle = (
        g("event_to_screen_ms"),
        g("journalctl_ms"),
        g("key_ms"),
        g("bare_key_ms"),
        g("idle"),
        g("bare_idle"),
    )
    print(f"CPUs             {f.get('cpus')}")
    print(
        f"event → screen   p50 {ev.get('p50')} ms  p95 {ev.get('p95')} ms  max {ev.get('max')} ms  "
        f"({ev.get('seen')}/{ev.get('markers')} markers)   target ≤ 250 ms"
    )
    print(f"  baseline journalctl -f over SSH: p50 {base.get('p50')} ms  p95 {base.get('p95')} ms")
    print(f"key → repaint    p50 {key.get('p50')} ms  p95 {key.get('p95')} ms   target p95 ≤ 50 ms")
    print(f"  baseline bare Textual app: p50 {bkey.get('p50')} ms  p95 {bkey.get('p95')} ms")
    ukey = g("key_unfiltered_ms")
    print(
        f"  the same, feed unfiltered: p50 {ukey.get('p50')} ms  p95 {ukey.get('p95')} ms  "
        f"(CPU {f.get('load_unfiltered_cpu_pct', float('nan')):.1f}% of a core)"
    )
    tog, btog, ikey, itog = g("toggle_ms"), g("bare_toggle_ms"), g("idle_key_ms"), g("idle_toggle_ms")
    print(
        f"light key (m)    p50 {tog.get('p50')} ms  p95 {tog.get('p95')} ms under load; "
        f"idle p50 {itog.get('p50')} / p95 {itog.get('p95')} ms; bare app p50 {btog.get('p50')} / p95 {btog.get('p95')} ms"
    )
    bb = g("bare_border_ms")
    print(
        f"  bare app answering on a border instead of a toast: p50 {bb.get('p50')} ms  p95 {bb.get('p95')} ms"
    )
    lt, lb = g("bare_loaded_toggle_ms"), g("bare_loaded_border_ms")
    print(
        f"  bare app while the same load runs: toast p50 {lt.get('p50')} / p95 {lt.get('p95')} ms, "
        f"border p50 {lb.get('p50')} / p95 {lb.get('p95')} ms"
    )
    bt, bbb = g("bare_busy_toggle_ms"), g("bare_busy_border_ms")
    print(
        f"  bare app busy (a frame every 1/60 s): toast p50 {bt.get('p50')} / p95 {bt.get('p95')} ms, "
        f"border p50 {bbb.get('p50')} / p95 {bbb.get('p95')} ms"
    )
    print(f"F1 when idle     p50 {ikey.get('p50')} ms  p95 {ikey.get('p95')} ms")
    print(
        f"under load       CPU {f.get('load_cpu_pct', float('nan')):.1f}% of a core  RSS {f.get('load_rss_mb', float('nan')):.0f} MB  "
        f"terminal {f.get('load_bytes_per_s', 0) / 1024:.1f} KiB/s  journal {f.get('journal_lines_per_s', 0):.0f} lines/s"
    )
    print(
        f"idle (after {f.get('history_s', 86_400)} s of history) CPU {idle.get('cpu_pct', float('nan')):.2f}% of a core  RSS {idle.get('rss_mb', float('nan')):.0f} MB  "
        f"terminal {idle.get('bytes_per_s', 0) / 1024:.2f} KiB/s   targets ≤ 2%, ≤ 150 MB"
    )
    print(
        f"  baseline bare Textual app: CPU {bidle.get('cpu_pct', float('nan')):.2f}%  RSS {bidle.get('rss_mb', float('nan')):.0f} MB  "
        f"terminal {bidle.get('bytes_per_s', 0) / 1024:.2f} KiB/s"
    )
    print(json.dumps(f))


if __name__ == "__main__":
    raise SystemExit(main())
