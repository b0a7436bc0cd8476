"""The event feed: this boot's parsed events, coloured by kind, with errors pinned above until
acknowledged and earlier boots folded into one line each."""

from __future__ import annotations

import io
import itertools
import operator
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Self

from rich.cells import cell_len
from rich.console import Console
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.cache import LRUCache
from textual.containers import Vertical
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import Reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Input, Static

from console.core.events import Error, Event, GpuXid, HttpAccess
from console.core.snapshot import HostSnapshot
from console.core.state import Boot, HostState
from console.core.text import terminal_safe
from console.tui.themes import palette
from console.tui.view import (
    boot_name,
    clock_text,
    display_boot,
    event_text,
    feed_line,
    is_blank,
    kind_style,
    progress_key,
    rank_label,
    textual_text,
)

Pieces = list[tuple[str, Style | str]]
"""A feed row as (text, Rich style) pieces."""

HISTORY = 5000
"""Events kept per host (all boots together); older ones fall off."""
PINS_SHOWN = 3

SEGMENTS = Console(file=io.StringIO(), color_system="truecolor", width=10_000)
"""What a row's Rich text is cut into segments with: `Text.render` asks a console for nothing but the
styles named by a string, and a row's styles are `Style` objects, so the widget needs no app's console."""


@dataclass(frozen=True)
class FeedFilter:
    pattern: re.Pattern[str] | None = None
    invert: bool = False
    text: str = ""

    def matches(self, line: str) -> bool:
        if self.pattern is None:
            return True
        return (self.pattern.search(line) is not None) != self.invert


def parse_filter(text: str) -> FeedFilter:
    """`regex`, or `!regex` for the lines that do not match; case-insensitive. Raises `re.error`."""
    invert = text.startswith("!")
    body = text[1:] if invert else text
    if not body:
        return FeedFilter(text=text)
    return FeedFilter(re.compile(body, re.IGNORECASE), invert, text)


def _newest(recent: Sequence[Event] | deque[Event], n: int) -> list[Event]:
    """The `n` newest of `recent`, oldest first (a deque cannot be sliced; reading it from its right end
    costs `n`, not its length)."""
    if isinstance(recent, deque):
        return list(itertools.islice(reversed(recent), n))[::-1]
    return list(recent[-n:]) if n > 0 else []


def error_key(e: Error) -> str:
    return e.cursor or f"{e.ts}|{e.pid}|{e.category}|{e.message}"


class FeedLog(ScrollView, can_focus=True):
    """The feed's rows, drawn on demand: a row is an event, rendered only when it is on screen.

    RichLog renders every line as it is written (~1 ms each) and asks for a layout of the whole screen
    per write; at 2,000 journal lines a second that took 60% of a core and delayed keys by seconds.
    Here a new row costs a deque append, and a frame renders the rows in view (cached per row)."""

    # No tint on focus (RichLog's has one): the feed's border already shows it, and a tint is a colour
    # filter over every cell of the feed at every frame.
    DEFAULT_CSS = """
    FeedLog {
        background: $surface;
        color: $foreground;
        overflow-y: scroll;
    }
    """
    HELP = """\
[b]Event feed[/b] — what the server said in this boot, parsed, one line per event:
time, rank, kind, text. Colours: [bold theme.bad]errors[/], [theme.info]systemd[/], [theme.step]start-up[/],
[theme.kv]KV pool[/], [theme.graphs]CUDA graphs[/], [theme.muted]batch statistics and access lines[/].
A progress bar's redraws (loading shards, capturing CUDA graphs) are one row with the newest count;
blank lines are left out. Errors of this boot are pinned above the feed until acknowledged (a).
Earlier boots are folded into one line each (z shows them). / filters with a regular expression (case-insensitive);
start it with ! to show the lines that do NOT match; Esc clears it. f follows the tail.
Monitoring polls (GET /health, /metrics, /server_info ...: this console's own, a scraper's) are hidden:
every console on the host adds two every few seconds and they would bury real traffic; m shows them."""

    # Textual's widgets ask for a layout of the whole screen when their virtual size changes (one
    # pass is 20-30 ms at 160x48); the feed's box never depends on how many rows it holds, so a new
    # row needs only the scrollbars updated. A scrollbar appearing still asks for a layout (its own
    # reactive does).
    virtual_size: Reactive[Size] = Reactive(Size(0, 0), layout=False)

    def __init__(
        self,
        pieces: Callable[[Event], Pieces],
        *,
        max_lines: int,
        same_row: Callable[[Event], object] | None = None,
        id: str | None = None,
    ) -> None:
        super().__init__(id=id)
        self._pieces = pieces
        # Two rows in a row with the same key (not None) are one row showing the newer event.
        self._same_row = same_row
        self._last_key: object = None
        self._row_style: Style | None = None
        self._rows: deque[Event] = deque(maxlen=max_lines)
        # A row's strip is keyed by its event (events are frozen) and width, not by its place: rows that
        # stay across a rebuild (m, z, a filter) are not drawn again; those moved by a drop from the
        # front either. The entry holds its event, so an id is not reused while it is cached.
        self._strips: LRUCache[tuple[int, int], tuple[Event, Strip]] = LRUCache(1024)
        self.follow = True
        """Keep the newest row in view: off when the operator scrolls up (or presses f), on again at
        the tail."""

    @property
    def row_count(self) -> int:
        return len(self._rows)

    @property
    def rows(self) -> list[Event]:
        return list(self._rows)

    def rows_iter(self) -> Iterator[Event]:
        """The rows, oldest first, without a copy (not to be held across a change of rows)."""
        return iter(self._rows)

    def append_rows(self, rows: Iterable[Event]) -> None:
        """Rows at the end, scrolled to in the same frame when following. Each row past `max_lines` pushes
        the oldest off the top: an operator scrolled up saw the rows move under them, one a line (at
        2,000 lines a second, a blur); the view moves with them instead, so what they read stays put
        until it reaches the top."""
        before = len(self._rows)
        changed, added = self._extend(rows)
        if not changed:
            return
        pushed_off = before + added - len(self._rows)
        if pushed_off > 0 and not self.follow:
            self.scroll_to(y=max(0, self.scroll_offset.y - pushed_off), animate=False, immediate=True)
        self._resized()

    def replace_rows(self, rows: Iterable[Event]) -> None:
        old = self._rows
        self._rows = deque(maxlen=old.maxlen)
        self._last_key = None
        self._extend(rows)
        # A view change that hides or shows none of the rows (`m` under a filter no poll matches) leaves
        # the box as it was: repainting it anyway cost the key's frame 3-7 ms under load.
        if len(old) != len(self._rows) or not all(map(operator.is_, old, self._rows)):
            self._resized()

    def _extend(self, rows: Iterable[Event]) -> tuple[bool, int]:
        """(whether any row came, how many new rows: a redraw of the last row is not one)"""
        changed = False
        added = 0
        same_row = self._same_row
        for event in rows:
            changed = True
            key = same_row(event) if same_row is not None else None
            if key is not None and key == self._last_key and self._rows:
                self._rows[-1] = event
                continue
            self._last_key = key
            self._rows.append(event)
            added += 1
        return changed, added

    def _resized(self) -> None:
        # Lines are cut to the feed's width with an ellipsis (the pinned errors show a message in
        # full), so there is nothing to scroll sideways.
        self.virtual_size = Size(0, len(self._rows))
        if self.follow:
            self.scroll_end(animate=False, immediate=True, x_axis=False)
        self.refresh()

    def on_resize(self) -> None:
        # The box shrinks when a bar, a pin or a banner appears above it; the offset stays, so the
        # newest rows would sink below the bottom edge (4-5 of them, with the scrollbar at its end).
        if self.follow:
            self.scroll_end(animate=False, immediate=True, x_axis=False)

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        # Only a scroll moves the offset up (a new row or a smaller box never does): the operator
        # wants to read back. Back at the tail, following resumes.
        if new_value >= self.max_scroll_y:
            self.follow = True
        elif new_value < old_value:
            self.follow = False

    def watch_virtual_size(self, size: Size) -> None:
        if self.is_mounted:
            self._scroll_update(size)

    def render_lines(self, crop: Region) -> list[Strip]:
        # `rich_style` walks the ancestors' styles: once per frame, not once per row
        self._row_style = self.rich_style
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        index = self.scroll_offset.y + y
        style = self._row_style if self._row_style is not None else self.rich_style
        if index >= len(self._rows):
            return Strip.blank(width, style)
        event = self._rows[index]
        key = (id(event), width)
        cached = self._strips.get(key)
        if cached is not None and cached[0] is event:
            strip = cached[1]
        else:
            strip = self._strip(event, width)
            self._strips[key] = (event, strip)
        return strip.apply_style(style)

    def _strip(self, event: Event, width: int) -> Strip:
        """One row, cut to `width` with an ellipsis as RichLog cut it."""
        line = Text(no_wrap=True, overflow="ellipsis")
        for text, style in self._pieces(event):
            line.append(terminal_safe(text), style)
        cut_between_words(line, width)
        return Strip(list(line.render(SEGMENTS)), width)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()

    def restyle(self) -> None:
        """Draw the rows again in the app's new theme (a row's strip is cached with its colours)."""
        self._strips.clear()
        self.refresh()


WORD_BACKTRACK = 24
"""How far back (cells) a cut row looks for the end of a word before it cuts one anyway."""
_WORD = re.compile(r"[\w.=:/+-]")
_DIGIT = re.compile(r"[\d.,]")


def cut_between_words(line: Text, width: int) -> None:
    """`line` cut to `width` cells with an ellipsis, padded, never in the middle of a word or number:
    `context_len=200000` cut after five digits read `context_len=20000…`, another number. A word longer
    than `WORD_BACKTRACK` cells is cut where it must be."""
    plain = line.plain
    if cell_len(plain) <= width:
        line.truncate(width, pad=True)
        return
    room = max(width - 1, 0)
    n = cells = 0
    for ch in plain:
        cells += cell_len(ch)
        if cells > room:
            break
        n += 1
    if 0 < n < len(plain) and _WORD.match(plain[n]) and _WORD.match(plain[n - 1]):
        start = n
        while start > 0 and _WORD.match(plain[start - 1]) and n - start < WORD_BACKTRACK:
            start -= 1
        if start > 0 and not _WORD.match(plain[start - 1]):
            n = start
    while 0 < n < len(plain) and _DIGIT.match(plain[n]) and _DIGIT.match(plain[n - 1]):
        n -= 1  # a number is never cut: a long word is cut before its number
    line.right_crop(len(plain) - n)
    line.append("…")
    line.truncate(width, pad=True)


POLL_PATHS = frozenset(
    {
        "/health",
        "/health_generate",
        "/metrics",
        "/server_info",
        "/get_server_info",
        "/get_model_info",
        "/model_info",
        "/v1/models",
    }
)


def is_poll(event: Event) -> bool:
    """A monitoring GET (a console's or a scraper's), not traffic anybody asked the model for."""
    if not isinstance(event, HttpAccess) or event.method != "GET":
        return False
    return event.path.split("?", 1)[0] in POLL_PATHS


class FeedEntry:
    """An event in the feed's history, with the boot it belongs to and its line as the operator reads
    it (what a filter matches), made once on demand: a filter or `m` re-judges all 5,000. The filter's
    verdict is kept too, for the filter it was given under: `m` or `z` under a filter re-judged every
    line with the regex (20 ms of the key's time for 5,000 lines here)."""

    __slots__ = ("_judged", "_text", "blank", "boot", "event", "poll")

    def __init__(self, boot: int, event: Event) -> None:
        self.boot = boot
        self.event = event
        # Judged once: `m` and `z` re-read all 5,000 rows on the key's turn of the loop, under load.
        self.blank = is_blank(event)
        self.poll = is_poll(event)
        self._text: str | None = None
        self._judged: tuple[FeedFilter, bool] | None = None

    def text(self) -> str:
        if self._text is None:
            self._text = feed_line(self.event)
        return self._text

    def matches(self, flt: FeedFilter) -> bool:
        judged = self._judged
        if judged is not None and judged[0] is flt:
            return judged[1]
        verdict = flt.matches(self.text())
        self._judged = (flt, verdict)
        return verdict


class EventFeed(Vertical):
    _edge_only = False
    """Set while the border's words change: the repaint they ask for is the bottom edge's row only."""

    class ChromeChanged(Message):
        """The rows above and below the feed's lines (pins, folded boots, the filter) changed."""

    BINDINGS = [  # noqa: RUF012 - Textual reads it as a class attribute
        Binding("slash", "filter", "Filter"),
        # Follow and fold stay off the footer so that an 80-column pane keeps the keys that matter
        # (F1 help and the palette list them).
        Binding("f", "follow", "Follow", show=False),
        Binding("a", "ack", "Ack"),
        Binding("z", "fold", "Fold boots", show=False),
        Binding("m", "polls", "Monitoring polls", show=False),
    ]

    def __init__(self, *, history: int = HISTORY, id: str | None = None) -> None:
        super().__init__(id=id)
        self.history = history
        self._events: deque[FeedEntry] = deque(maxlen=history)
        self._seen_total = 0
        self._state: HostState | None = None
        self._boot_index: int | None = None
        self._boots: tuple[Boot, ...] = ()
        self._acked: set[str] = set()
        self._errors: tuple[Error, ...] = ()
        self._static_keys: dict[str, object] = {}
        self._static_rows: dict[str, int] = {}
        self.filter = FeedFilter()
        self._log = FeedLog(self._pieces, max_lines=history, same_row=progress_key, id="log")
        self.compact = False
        """A short pane: one pinned error, on one line."""
        self._chrome: int = 0
        self.folded = True
        self.show_polls = False
        self._view_said: Text | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="pins", classes="pins")
        yield Static(id="folded", classes="folded")
        yield self._log
        yield Input(placeholder="regex (start with ! to invert), Enter keeps, Esc clears", id="filter")

    @property
    def log_widget(self) -> FeedLog:
        return self._log

    @property
    def follow(self) -> bool:
        return self._log.follow

    # ---- data --------------------------------------------------------------------------------------

    def show(self, snap: HostSnapshot) -> None:
        self.take(snap.state, snap.recent, snap.events_total)

    def take(self, state: HostState, recent: Sequence[Event] | deque[Event], events_total: int) -> None:
        """The events a host's fold holds (`recent`, the newest last, `events_total` made so far), from a
        snapshot or straight from the fold as each journal batch is folded: a line is drawn in the
        frame after it is read, not after the session's next snapshot (up to 100 ms later). The two
        paths meet here; a snapshot older than what the feed holds brings nothing."""
        new = events_total - self._seen_total
        if new < 0 or (new == 0 and state is self._state):
            return
        boot = display_boot(state)
        index = boot.index if boot is not None else 0
        fresh: list[FeedEntry] = []
        if new > 0:
            # only the events that can be on screen: a burst larger than the history would fall off
            tail = _newest(recent, min(new, self.history))
            ids = {id(e): b.index for b in state.boots[-3:] for e in b.events}
            fresh = [FeedEntry(ids.get(id(e), index), e) for e in tail]
            self._seen_total = events_total
        self._state = state
        self._boots = state.boots
        self._errors = boot.errors if boot is not None else ()
        rebuilt = index != self._boot_index
        self._boot_index = index
        self._events.extend(fresh)
        if rebuilt:
            self._rebuild()
        else:
            shown = self._shown()
            self.log_widget.append_rows(r.event for r in fresh if shown(r))
        self._update_pins()
        self._update_folded()

    def take_until(self, snap: HostSnapshot, events_total: int) -> None:
        """The events of `snap` up to the `events_total`-th the host made (nothing when the feed has
        them already): lines from outside the journal go after them, in the order they were read."""
        upto = min(events_total, snap.events_total)
        if upto <= self._seen_total:
            return
        base = snap.events_total - len(snap.recent)
        self.take(snap.state, snap.recent[: max(0, upto - base)], upto)

    def on_mount(self) -> None:
        self._show_view()

    def restyle(self) -> None:
        """The rows, the pins, the folded line and the border's words in the app's new theme."""
        self._log.restyle()
        self._update_pins()
        self._update_folded()
        self._show_view()

    def add_external(self, events: list[Event]) -> None:
        """Events that come from outside the journal (the host's audit trail): placed in the current
        boot's stream where they arrive, never counted against the journal's own totals."""
        index = self._boot_index if self._boot_index is not None else 0
        rows = [FeedEntry(index, e) for e in events]
        self._events.extend(rows)
        shown = self._shown()
        self.log_widget.append_rows(r.event for r in rows if shown(r))

    def _shown(self) -> Callable[[FeedEntry], bool]:
        """Whether a row is on the feed under the view in force (boots folded, polls, the filter): the
        view read once, for a rebuild's 5,000 rows on a key's turn (m, z, a filter's keystroke) as for
        a batch appended."""
        boot, folded, polls = self._boot_index, self.folded, self.show_polls
        flt = self.filter if self.filter.pattern is not None else None

        def shown(r: FeedEntry) -> bool:
            return (
                not r.blank
                and (polls or not r.poll)
                and (not folded or r.boot == boot)
                and (flt is None or r.matches(flt))
            )

        return shown

    @staticmethod
    def _pieces(event: Event) -> Pieces:
        """A feed row as (text, style) pieces: time, rank, kind, what the server said."""
        style = kind_style(event.kind)
        if isinstance(event, GpuXid):
            # the XID's own severity: an application's page fault warns, a GPU off the bus is an error
            style = palette().style("bad" if event.severity == "critical" else "warn", bold=True)
        return [
            (clock_text(event), palette().faint),
            (f" {rank_label(event):4} ", palette().faint),
            (f"{event.kind:17} ", style),
            (event_text(event), style if event.kind in ("error", "server_ready", "gpu_xid") else ""),
        ]

    def _rebuild(self, kept: Sequence[Event] = ()) -> None:
        """The log's rows from the history under the view in force, after `kept`: rows whose lines fell
        off the history (under a filter they stay in the log) that the caller keeps; the others go."""
        shown = self._shown()
        self.log_widget.replace_rows([*kept, *(r.event for r in self._events if shown(r))])

    def _fallen(self, was_shown: Callable[[FeedEntry], bool]) -> list[Event]:
        """The log's rows whose lines fell off the history, oldest first; `was_shown` is the view the log
        was built under. The log starts with the history's first row under it unless rows fell off before
        it: that is checked first, as the set of 5,000 ids costs ~0.5 ms."""
        first = next(self.log_widget.rows_iter(), None)
        head = next((r.event for r in self._events if was_shown(r)), None)
        if first is None or first is head:
            return []
        inside = {id(r.event) for r in self._events}
        return list(itertools.takewhile(lambda e: id(e) not in inside, self.log_widget.rows_iter()))

    def set_compact(self, compact: bool) -> None:
        if compact != self.compact:
            self.compact = compact
            self._static_keys.pop("pins", None)
            self._update_pins()

    def chrome_rows(self) -> int:
        """Rows the pins, the folded boots' line and the filter take from the feed's lines."""
        rows = 0
        for widget_id in ("pins", "folded"):
            widget = self.query_one(f"#{widget_id}", Static)
            if widget.display:
                rows += self._static_rows.get(widget_id, 1)
        if self.query_one("#filter", Input).display:
            rows += 3
        return rows

    def reserved_rows(self, lines: int) -> int:
        """The feed's height for `lines` event rows under its chrome: the border, pins, folded, filter."""
        return 2 + lines + self.chrome_rows()

    def _chrome_changed(self) -> None:
        rows = self.chrome_rows()
        if rows != self._chrome:
            self._chrome = rows
            self.post_message(self.ChromeChanged())

    def _set_static(self, widget_id: str, text: Text | None) -> None:
        """Update a pinned line only when it changes: an update re-measures the feed's layout."""
        key = (text.plain, tuple(text.spans)) if text is not None else None
        if self._static_keys.get(widget_id, ()) == key:
            return
        self._static_keys[widget_id] = key
        widget = self.query_one(f"#{widget_id}", Static)
        widget.display = text is not None
        if text is not None:
            widget.update(textual_text(text))
            # Pins wrap on a roomy pane (up to their max-height of 6); one line each when compact.
            width = max(1, self.size.width - 4)
            wrapped = sum(max(1, -(-len(line) // width)) for line in text.plain.split("\n"))
            self._static_rows[widget_id] = 1 if self.compact else min(6, wrapped)
        self._chrome_changed()

    def _update_pins(self) -> None:
        open_errors = [e for e in self._errors if error_key(e) not in self._acked]
        if not open_errors:
            self._set_static("pins", None)
            return
        text = Text()
        text.append(
            f"⚠ {len(open_errors)} error{'s' if len(open_errors) > 1 else ''} in this boot",
            palette().style("bad", bold=True),
        )
        if self.compact:
            # One line on a short pane: the count and the newest error, cut to the width.
            e = open_errors[-1]
            text.append("  newest: ", palette().muted)
            text.append(f"{e.category}: ", palette().style("bad", bold=True))
            text.append(e.message[:300])
            text.append("  (a)", palette().muted)
            self._set_static("pins", text)
            return
        text.append("  (a acknowledges)\n", palette().muted)
        for e in open_errors[-PINS_SHOWN:]:
            text.append(
                f"{clock_text(e)} {rank_label(e):4} {e.category}: ", palette().style("bad", bold=True)
            )
            text.append(e.message[:300] + "\n")
        if len(open_errors) > PINS_SHOWN:
            text.append(f"… and {len(open_errors) - PINS_SHOWN} earlier\n", palette().muted)
        text.rstrip()
        self._set_static("pins", text)

    def _update_folded(self) -> None:
        earlier = [b for b in self._boots if self._boot_index is not None and b.index < self._boot_index]
        if not earlier:
            self._set_static("folded", None)
            return
        text = Text()
        verb = "folded" if self.folded else "shown"
        text.append(
            f"▸ {len(earlier)} earlier boot{'s' if len(earlier) > 1 else ''} {verb} (z): ", palette().muted
        )
        parts = []
        for b in earlier[-4:]:
            errs = f", {len(b.errors)} errors" if b.errors else ""
            lines = len(b.events) + b.traffic_events + b.log_lines
            parts.append(f"{boot_name(b).removeprefix('boot ')} {b.phase} {lines} lines{errs}")
        text.append(" · ".join(parts), palette().muted)
        self._set_static("folded", text)

    def reset(self) -> None:
        """Forget every line: a replay that seeks starts the feed again from where it lands."""
        self._events.clear()
        self._seen_total = 0
        self._state = None
        self._boot_index = None
        self._boots = ()
        self._errors = ()
        self.log_widget.replace_rows([])

    @property
    def open_errors(self) -> list[Error]:
        return [e for e in self._errors if error_key(e) not in self._acked]

    def visible_lines(self) -> list[str]:
        """The feed's lines as shown (for tests and for the status line)."""
        return [feed_line(e) for e in self.log_widget.rows]

    def events(self) -> list[Event]:
        """Every event the feed holds (shown or not), oldest first."""
        return [r.event for r in self._events]

    # ---- actions -----------------------------------------------------------------------------------

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        self._chrome_changed()
        box.value = self.filter.text
        box.focus()

    def action_follow(self) -> None:
        self._log.follow = not self._log.follow
        if self.follow:
            self.log_widget.scroll_end(animate=False, x_axis=False)
        self.notify("following the tail" if self.follow else "tail not followed", timeout=2)

    def action_ack(self) -> None:
        n = len(self.open_errors)
        self._acked.update(error_key(e) for e in self._errors)
        self._update_pins()
        if n:
            self.notify(f"{n} error{'s' if n > 1 else ''} acknowledged", timeout=2)

    def action_polls(self) -> None:
        was_shown = self._shown()
        self.show_polls = not self.show_polls
        # `m` is about polls: the filter's rows older than the history (at 2,000 lines a second it is
        # 2.5 s long) stay, as they would have without the key; they went, and the log repainted, at
        # every press under the bench's load.
        fallen = self._fallen(was_shown)
        self._rebuild([e for e in fallen if self.show_polls or not is_poll(e)])
        self._show_view()

    def action_fold(self) -> None:
        self.folded = not self.folded
        self._rebuild()
        self._update_folded()

    def set_filter(self, text: str) -> bool:
        """Apply a filter; False (and the previous filter kept) when the regex does not compile."""
        try:
            flt = parse_filter(text)
        except re.error:
            return False
        self.filter = flt
        self._rebuild()
        self._show_view()
        return True

    def _show_view(self) -> None:
        """What the feed leaves out, on its border: a filter in force (once its box closed it was
        invisible, the feed silently short of lines), and whether monitoring polls are hidden (m). The
        border answers m: a toast took two frames to appear, 55-72 ms p95 under load."""
        said = Text()
        flt = self.filter
        if flt.pattern is not None:
            said.append(" filtered: ", palette().style("warn", bold=True))
            said.append(("not " if flt.invert else "") + "/")
            said.append(terminal_safe(flt.pattern.pattern)[:60])
            said.append("/  Esc clears ·", palette().muted)
        said.append(f" polls {'shown' if self.show_polls else 'hidden'} (m) ", palette().muted)
        if said == self._view_said:
            return
        self._view_said = said
        self._edge_only = True
        try:
            self.border_subtitle = said
        finally:
            self._edge_only = False

    def refresh(
        self, *regions: Region, repaint: bool = True, layout: bool = False, recompose: bool = False
    ) -> Self:
        edge = self._bottom_edge() if self._edge_only and not (regions or layout or recompose) else None
        # Textual repaints the whole box for new words on its border: the feed's ~40 rows, 3-7 ms of
        # the key's frame under load for `m`. The words are on the bottom edge, one row.
        if edge is not None:
            regions = (edge,)
        return super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)

    def _bottom_edge(self) -> Region | None:
        """The box's bottom row (its border, where the subtitle is) in the content's coordinates, which
        `refresh` takes; None before the box is laid out or when it has no bottom border."""
        outer = self.outer_size
        if not self.is_mounted or not outer or self.styles.border_bottom[0] in ("", "none", "hidden"):
            return None
        offset = self.content_offset
        return Region(-offset.x, outer.height - 1 - offset.y, outer.width, 1)

    def clear_filter(self) -> bool:
        """Esc on the dashboard: the filter goes (its box too); False when there was none."""
        box = self.query_one("#filter", Input)
        if self.filter.pattern is None and not box.display:
            return False
        box.value = ""
        self.set_filter("")
        if box.display:
            box.display = False
            self._chrome_changed()
        return True

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id != "filter":
            return
        ok = self.set_filter(event.value)
        event.input.set_class(not ok, "invalid")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "filter":
            return
        event.input.display = False
        self._chrome_changed()
        self.log_widget.focus()

    def on_key(self, event: object) -> None:
        key = getattr(event, "key", None)
        box = self.query_one("#filter", Input)
        if key == "escape" and box.has_focus:
            box.value = ""
            self.set_filter("")
            box.display = False
            self._chrome_changed()
            self.log_widget.focus()
            getattr(event, "stop", lambda: None)()
