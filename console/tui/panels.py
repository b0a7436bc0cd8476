"""The dashboard's panels. Each keeps the last snapshot it was shown and draws from it in `render`, so a
burst of snapshots costs one repaint and nothing here waits on the host."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from dataclasses import replace

from rich.console import Group, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from console.core.restart import BOOT, Phase
from console.core.snapshot import HostSnapshot
from console.tui.bars import stacked_bar
from console.tui.themes import palette
from console.tui.track import CONTROLLER_AFTER, ApplyTrack
from console.tui.view import (
    SEGMENT_LABELS,
    GpuRow,
    KvGauge,
    Timeline,
    TimelineStep,
    fmt_duration,
    fmt_tokens,
    gpu_rows,
    kv_gauge,
    restart_timeline,
    textual_text,
)

SEGMENTS = ("reserved", "weights", "kv", "mamba", "draft", "graphs", "other", "procs", "used")
"""The memory segments of a GPU bar, left to right; each is coloured by the theme role of its name
(`SEGMENT_ROLES` where another role draws it)."""
SEGMENT_ROLES = {"reserved": "mark"}
"""The driver's reservation is no one's memory: drawn in the gauge marks' grey."""


def segment_role(name: str) -> str:
    return SEGMENT_ROLES.get(name, name)


FAULT_ROLES = {"critical": ("bad", True), "warning": ("warn", True)}
LEVEL_ROLES: dict[str, tuple[str, bool]] = {
    "ok": ("ok", False),
    "warn": ("warn", False),
    "critical": ("bad", True),
    "unknown": ("muted", False),
}


def level_style(level: str) -> Style:
    role, bold = LEVEL_ROLES[level]
    return palette().style(role, bold=bold)


class Panel(Static, can_focus=True):
    """A focusable panel; `HELP` is what F1 shows while it has focus.

    What the panel shows of a snapshot (`view_of`: its figures at the precision it prints them) is a
    reactive attribute, and so is what decides its height (`extent_of`): Textual repaints the panel when
    the first changes and lays the screen out again only when the second does. A snapshot that changes
    nothing the panel draws costs no repaint and no bytes to the terminal (over SSH to a jump host that
    is most of the console's idle cost); a full layout pass costs tens of milliseconds."""

    HELP = ""
    snap: HostSnapshot | None = None

    view: reactive[object] = reactive(None, init=False)
    """What the panel draws, comparable (`view_of`)."""
    extent: reactive[object] = reactive(None, layout=True, repaint=False, init=False)
    """What decides the panel's height (`extent_of`): auto-height panels grow when the host says more
    (the first GPU sample, a new phase)."""
    compact: reactive[bool] = reactive(False, layout=True, init=False)
    """Drawn for a short pane: fewer rows, the same figures."""

    def set_compact(self, compact: bool) -> None:
        self.compact = compact

    def watch_compact(self) -> None:
        if self.snap is not None:
            self.show(self.snap)  # what a panel draws may depend on its form

    def view_of(self, snap: HostSnapshot) -> object:
        """What the panel shows of `snap`, comparable."""
        return snap

    def extent_of(self, view: object) -> object:
        """What of `view` decides the panel's height."""
        return None

    def restyle(self) -> None:
        """Paint again in the app's new theme: the same figures, drawn in other colours."""
        self.refresh()

    def show(self, snap: HostSnapshot) -> None:
        self.snap = snap
        view = self.view_of(snap)
        self.extent = self.extent_of(view)
        self.view = view


class GpuPanel(Panel):
    HELP = """\
[b]GPU memory[/b] — one bar per GPU, in eighths of a cell.

When this boot's journal said how much each tensor-parallel rank loaded, the bar is split into
[theme.weights]weights[/] (Load weight end: mem usage), [theme.kv]KV pool[/] (KV Cache is allocated: size),
[theme.mamba]mamba pool[/] (a hybrid model's state pool: Mamba Cache is allocated), [theme.draft]draft model[/]
(a speculative draft's weights and KV pool: a rank's second weights line, and its pools after Memory pool
end), [theme.graphs]CUDA graphs[/] (Capture cuda graph end: mem usage), [theme.other]other[/] (the rest of the
server's own memory: activations, NCCL buffers, the CUDA context) and [theme.procs]other processes[/]
(memory of processes that are not this server). The dim rest is free. First, in grey, what the
driver reserves for itself (NVML v2 / nvidia-smi; an old driver counts it in used).
GPU i is taken to hold TP rank i. Without those journal lines the bar is plain used/total.
Right of each bar: used / total GiB, the utilization the sampler reported and, on a wide panel, the
temperature and power draw; then the GPU's faults: [b]THERMAL[/b] or [b]PWR CAP[/b] (clocks held down by
heat or the power limit while it works), [b]PCIe x8[/b] (a link below its maximum), [b]ECC[/b],
[b]REMAP[/b] (a row remap waits for a reset), [b]XID n[/b] (a critical error the driver reported).
A GPU that fell off the bus (its driver cannot reach it: XID 79, NVML's GPU is lost) reads [b]LOST[/b]
where its bar was. The alerts say each in words."""

    _rows: tuple[object, object, tuple[GpuRow, ...]] | None = None

    def _gpu_rows(self, snap: HostSnapshot) -> tuple[GpuRow, ...]:
        # Made from the sample and the boots alone: a snapshot that brings a server reading only (every
        # other snapshot at idle) reuses them.
        made = self._rows
        gpus = snap.gpus.gpus if snap.gpus is not None else None
        if made is None or made[1] is not snap.state or (made[0] is not gpus and made[0] != gpus):
            # A new sample whose GPUs read the same (an idle host, every second) keeps the rows too.
            made = self._rows = (gpus, snap.state, tuple(gpu_rows(snap)))
        return made[2]

    def view_of(self, snap: HostSnapshot) -> object:
        sample = snap.gpus
        if sample is None:
            return ("none",)
        if sample.state.value != "ok":
            return (sample.state, sample.detail)
        # At the precision the panel prints: a sampler's noise in the last digit is not a repaint.
        return (
            sample.state,
            tuple(
                (
                    r.index,
                    r.name,
                    None if r.total_gib is None else round(r.total_gib, 1),
                    None if r.used_gib is None else round(r.used_gib, 1),
                    None if r.util_pct is None else round(r.util_pct),
                    tuple((name, round(v, 2)) for name, v in r.parts),
                    None if r.reserved_gib is None else round(r.reserved_gib, 1),
                    _health_cell(r),
                    r.faults,
                )
                for r in self._gpu_rows(snap)
            ),
        )

    def extent_of(self, view: object) -> object:
        assert isinstance(view, tuple)
        rows = view[1] if len(view) == 2 and isinstance(view[1], tuple) else ()
        return (view[0], len(rows), any(row[5] for row in rows))

    def render(self) -> RenderableType:
        snap = self.snap
        if snap is None or snap.gpus is None:
            return Text("GPUs: waiting for the first sample…", palette().muted)
        sample = snap.gpus
        if sample.state.value != "ok":
            return Text(f"GPUs: {sample.detail or sample.state.value}", palette().warn)
        rows = self._gpu_rows(snap)
        # The faults always; the health cell where the bar keeps 24 cells beside it. The bar takes what
        # the row's words leave, measured (a fixed 34 left 9 blank cells beside a 9-cell bar at 80x24).
        tags = max((len(" ".join(t for t, _ in r.faults)) + 1 for r in rows if r.faults), default=0)
        words = max(len(_gpu_label(r)) + len(_used_total(r)) + 4 for r in rows)
        width = max(10, self.content_region.width - words - min(tags, 24))
        cell = 11 if width - 11 >= 24 and any(_health_cell(r) for r in rows) else 0
        width -= cell
        legend = Text(" ", no_wrap=True, overflow="ellipsis")
        shown = {name for r in rows for name, v in r.parts if v > 0} or {"used"}
        if any(r.reserved_gib for r in rows):
            shown.add("reserved")
        for name in SEGMENTS:
            if name in shown:
                legend.append("█", palette().style(segment_role(name)))
                legend.append(f" {SEGMENT_LABELS[name]}  ")
        legend.append(" ", Style(bgcolor=palette().colour("bar-empty")))
        legend.append(" free")
        lines: list[RenderableType] = []
        if self.compact:
            # One row per GPU and nothing else: the colours' names go into the border (F1 explains).
            self.border_title = textual_text(compact_legend(shown))
        else:
            self.border_title = "GPUs"
            lines.append(legend)
        for r in rows:
            line = Text(no_wrap=True, overflow="ellipsis")  # one row, whatever the width measured
            line.append(_gpu_label(r), "bold")
            total = r.total_gib or 0.0
            if r.detailed:
                parts = [(v, palette().colour(n)) for n, v in r.parts]
            else:
                parts = [(r.used_gib or 0.0, palette().colour("used"))]
            if r.reserved_gib:
                parts.insert(0, (r.reserved_gib, palette().colour(segment_role("reserved"))))
            lost = bool(r.health and r.health.get("lost"))
            if lost:
                # no bar: a GPU that does not answer holds nothing we know of (never "0 MiB")
                said = " LOST: the driver cannot reach it"[:width].ljust(width)
                line.append(said, palette().style("bad", bold=True))
            else:
                line.append_text(stacked_bar(parts, total, width))
            line.append(_used_total(r))
            util = "  —" if r.util_pct is None else f"{r.util_pct:3.0f}%"
            line.append(util, "bold" if (r.util_pct or 0) >= 50 else palette().muted)
            if cell:
                line.append(f" {_health_cell(r):>10}", palette().muted)
            for tag, severity in r.faults:
                if lost and tag == "LOST":
                    continue  # said where the bar was
                role, bold = FAULT_ROLES.get(severity, ("warn", True))
                line.append(" ")
                line.append(tag, palette().style(role, bold=bold))
            lines.append(line)
        if rows and not any(r.detailed for r in rows) and not self.compact:
            lines.append(
                Text(
                    " used/total only: this boot's journal has not reported per-rank memory",
                    palette().faint,
                )
            )
        return textual_text(Group(*lines))

    def rows_needed(self) -> int:
        """The panel's height with every GPU in view, border included."""
        snap = self.snap
        rows = self._gpu_rows(snap) if snap is not None and snap.gpus is not None else ()
        if not rows:
            return 3
        extra = 0 if self.compact else 1 + (0 if any(r.detailed for r in rows) else 1)
        return len(rows) + extra + 2


COMPACT_LABELS = {
    "reserved": "rsvd",
    "weights": "weights",
    "kv": "KV",
    "mamba": "mamba",
    "draft": "draft",
    "graphs": "graphs",
    "other": "other",
    "procs": "procs",
}


def _gpu_label(row: GpuRow) -> str:
    return f"GPU{row.index:<2} "


def _used_total(row: GpuRow) -> str:
    """` 60.0/80.0 GiB `: what the bar stands for, in figures."""
    used = "—" if row.used_gib is None else f"{row.used_gib:5.1f}"
    total = "—" if row.total_gib is None else f"{row.total_gib:.1f}"
    return f" {used}/{total} GiB "


def _health_cell(row: GpuRow) -> str:
    """`91° 600W`: the temperature and power draw the back-end read ("" when it read neither)."""
    health = row.health or {}
    temp, power = health.get("temperature_c"), health.get("power_w")
    said = []
    if isinstance(temp, int | float):
        said.append(f"{temp:.0f}°")
    if isinstance(power, int | float):
        said.append(f"{power:.0f}W")
    return " ".join(said)


def compact_legend(shown: set[str]) -> Text:
    title = Text("GPUs ")
    for name in SEGMENTS:
        if name in shown:
            title.append("█", palette().style(segment_role(name)))
            title.append(f"{COMPACT_LABELS.get(name, name)} ", palette().muted)
    title.append("█", palette().style("bar-empty"))
    title.append("free", palette().muted)
    return title


class KvPanel(Panel):
    HELP = """\
[b]KV capacity[/b] — the KV pool (max_total_num_tokens) of this boot against the context you aim for.

[b]target[/b] comes from the active profile (--profile) or --target-context; [b]--context-length[/b] is the
longest request the server accepts now: a pool smaller than either cannot hold one request that long.
[b]headroom[/b] is the free GPU memory the scheduler reported when it became ready
(available_gpu_mem); under 3 GiB is a warning, under 1.5 GiB critical (CUDA OOM under load).
[b]in use[/b] is live token usage from /metrics, else from the last decode batch line.
A hybrid, sliding-window, DeepSeek-V4 or speculative boot has more than one pool: the line under the bar
gives each with its use ([b]full[/b] the context pool, [b]SWA[/b] the sliding-window pool, [b]mamba[/b] its
state slots and GiB, [b]c4[/b]/[b]c128[/b] DeepSeek-V4's compressed pools, [b]draft[/b] the draft model's),
the one that bounds the target in bold; [b]limit[/b] says why (a request's whole context lives in the
full pool; a hybrid model's mamba slots cap how many run at once). Over 90% of any pool in use warns."""

    def __init__(self, *, target: int | None, target_source: str | None, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.target = target
        self.target_source = target_source

    _gauge: KvGauge | None = None

    def view_of(self, snap: HostSnapshot) -> object:
        g = self._gauge = kv_gauge(snap, target=self.target, target_source=self.target_source)
        # Live usage moves with every decode batch: it repaints only when the printed figures change.
        used = (fmt_tokens(g.used_tokens), None if g.usage is None else f"{g.usage:.1%}")
        return (replace(g, used_tokens=None, usage=None), used, g.usage is None and g.used_tokens is None)

    def extent_of(self, view: object) -> object:
        assert isinstance(view, tuple) and isinstance(view[0], KvGauge)
        g = view[0]
        fields = (g.pool_tokens, g.target, g.context_length, g.headroom_gib)
        return (*(v is None for v in fields), view[2], len(g.reasons), bool(g.pools), g.limit is None)

    def render(self) -> RenderableType:
        snap = self.snap
        if snap is None:
            return Text("KV pool: no data yet", palette().muted)
        g = (
            self._gauge
            if self._gauge is not None
            else kv_gauge(snap, target=self.target, target_source=self.target_source)
        )
        colour = level_style(g.level)
        width = max(10, self.content_region.width - 2)
        lines: list[RenderableType] = []
        head = Text(no_wrap=True, overflow="ellipsis")
        head.append("pool ", palette().muted)
        pool = f"{g.pool_tokens:,} tokens" if g.pool_tokens is not None else "not allocated yet"
        if self.compact and len(f"pool {pool}  [{g.level}]") > self.content_region.width:
            pool = pool.removesuffix(" tokens")  # the level must stay on the line in a narrow column
        head.append(pool, colour)
        if g.level != "unknown":
            head.append(f"  [{g.level}]", colour)
        lines.append(head)
        scale = max(v for v in (g.pool_tokens, g.target, g.context_length, 1) if v is not None)
        if g.pool_tokens is not None:
            bar_colour = palette().colour(LEVEL_ROLES.get(g.level, ("muted", False))[0])
            bar = stacked_bar([(g.pool_tokens, bar_colour)], scale, width)
            marks = Text(" " * width)
            for value, ch in ((g.context_length, "c"), (g.target, "T")):
                if value is not None:
                    pos = min(
                        width - 1,
                        int(value / scale * width) - 1 if value >= scale else int(value / scale * width),
                    )
                    marks = marks[:pos] + Text(ch, "bold") + marks[pos + 1 :]
                    if self.compact:  # on the bar itself: one row fewer
                        bar = bar[:pos] + Text(ch, palette().badge("mark")) + bar[pos + 1 :]
            bar.no_wrap = True  # one row, whatever the width measured (see GpuPanel)
            lines.append(bar)
            if not self.compact:
                marks.no_wrap = True
                lines.append(marks)
        if g.pools:
            lines.append(pools_line(g, self.content_region.width, compact=self.compact))
            if g.limit is not None and not self.compact:
                lines.append(
                    Text.assemble(("limit ", palette().muted), g.limit[1], no_wrap=True, overflow="ellipsis")
                )
        if self.compact:
            lines.append(compact_targets(g))
            return textual_text(Group(*lines))
        tbl = Table.grid(padding=(0, 2))
        tbl.add_column(style=palette().muted)
        tbl.add_column()
        if g.target is not None:
            src = f" ({g.target_source})" if g.target_source else ""
            ok = g.pool_tokens is not None and g.pool_tokens >= g.target
            tbl.add_row(
                "T target",
                Text(f"{g.target:,}{src}", palette().ok if ok else palette().style("bad", bold=True)),
            )
        else:
            tbl.add_row("T target", Text("none (pass --profile or --target-context)", palette().faint))
        if g.context_length is not None:
            ok = g.pool_tokens is not None and g.pool_tokens >= g.context_length
            tbl.add_row(
                "c --context-length", Text(f"{g.context_length:,}", palette().ok if ok else palette().warn)
            )
        if g.headroom_gib is not None:
            tbl.add_row(
                "headroom",
                Text(f"{g.headroom_gib:.2f} GiB", colour if "headroom" in " ".join(g.reasons) else ""),
            )
        if g.usage is not None or g.used_tokens is not None:
            pct = f"{g.usage:.1%}" if g.usage is not None else "—"
            tbl.add_row("in use", f"{fmt_tokens(g.used_tokens)} tokens ({pct}, {g.usage_source})")
        lines.append(tbl)
        for why in g.reasons:
            lines.append(Text(f"⚠ {why}", colour))
        return textual_text(Group(*lines))


def pools_line(g: KvGauge, width: int, *, compact: bool) -> Text:
    """`full 580,364 · mamba 82 slots (7.42 GiB) 100% · SWA 423k`: each pool with its use, the one that
    bounds the target in bold. A narrow column gets the short form (`full 580k·mamba 82 slots`) and, in a
    short pane that has no limit line, `◂limit` after the bounding pool where the line has room."""
    limiting = g.limit[0] if g.limit is not None else None
    mark = " ◂limit" if compact and limiting is not None else ""
    forms = [(False, " · "), (True, " · "), (True, "·")]
    for short, sep in forms:  # the widest form that fits, the limit's mark with it if it can
        said = sep.join(p.words(short=short) for p in g.pools)
        if len(said) + len(mark) <= width:
            break
    else:
        mark = ""
        for short, sep in forms:
            if len(sep.join(p.words(short=short) for p in g.pools)) <= width:
                break
    line = Text(no_wrap=True, overflow="ellipsis")
    for i, p in enumerate(g.pools):
        if i:
            line.append(sep, palette().muted)
        line.append(p.words(short=short), "bold" if p.name == limiting else "")
        if mark and p.name == limiting:
            line.append(mark, palette().muted)
    return line


def compact_targets(g: KvGauge) -> Text:
    """Target, context length, headroom and the first worry on one line (a short pane)."""
    line = Text(overflow="ellipsis", no_wrap=True)
    ok = palette().ok
    if g.target is not None:
        fits = g.pool_tokens is not None and g.pool_tokens >= g.target
        line.append("T ", palette().muted)
        line.append(f"{fmt_tokens(g.target)}  ", ok if fits else palette().style("bad", bold=True))
    if g.context_length is not None:
        fits = g.pool_tokens is not None and g.pool_tokens >= g.context_length
        line.append("c ", palette().muted)
        line.append(f"{fmt_tokens(g.context_length)}  ", ok if fits else palette().warn)
    if g.headroom_gib is not None:
        line.append(f"{g.headroom_gib:.1f} GiB free  ", level_style(g.level) if g.reasons else "")
    if g.usage is not None:
        line.append(f"in use {g.usage:.0%}  ")
    if g.reasons:
        line.append(f"⚠ {g.reasons[0]}", level_style(g.level))
    return line


class TimelinePanel(Panel):
    HELP = """\
[b]Restart timeline[/b] — the phases of the current (or last) boot of the service, followed from the
journal: stopping, launching, loading weights, KV pool, CUDA graphs, ready (or failed).
Each phase shows how long it took (the running one counts up). The ETA is the median of the same
phases in earlier boots seen by this console; it appears from the second restart on.

When the console itself applies a profile, rolls back or restarts, the controller's own steps are
merged in: validate, diff, write drop-in, daemon-reload and restart before the boot, verify and record
after it, and the timeline ends in the verification verdict (R rolls back after a failure)."""

    track: ApplyTrack | None = None
    track_boot: int | None = None
    """The boot shown when the controller's restart began: the journal's steps count once a newer one opens."""

    note: reactive[Text | None] = reactive(None, layout=True, init=False, always_update=True)
    """A line under the timeline from the host's pairing state: who holds the lock and for what, or the
    audit trail's last word on the restart ("alice applied ctx-200k; restart 5m12s; verified ...").
    `always_update`: Rich's Text compares its words and spans, not its own style, so the same words in a
    new theme's colour would otherwise be dropped as no change (the dashboard sets it only on a change)."""

    def set_note(self, note: Text | str | None) -> None:
        self.note = Text(note, palette().info) if isinstance(note, str) else note

    def set_track(self, track: ApplyTrack | None, boot_index: int | None = None) -> None:
        self.track = track
        self.track_boot = boot_index
        if self.snap is not None:
            self.show(self.snap)
        self.refresh(layout=True)

    def render(self) -> RenderableType:
        body = self._render_body()
        # The note quotes the host (a lock's holder, an audit line), the body a failure's reasons.
        return textual_text(body if self.note is None else Group(body, self.note))

    _tl: tuple[object, float, Timeline | None] | None = None

    def _timeline(self, snap: HostSnapshot) -> Timeline | None:
        # Made from the boots and, while a phase runs, the snapshot's time: the boots of a quiet host
        # are the same object from one snapshot to the next, and a finished boot's timeline stands.
        made = self._tl
        if (
            made is None
            or made[0] is not snap.state
            or (made[1] != snap.ts and made[2] is not None and made[2].outcome == "running")
        ):
            made = self._tl = (snap.state, snap.ts, restart_timeline(snap.state, snap.ts))
        return made[2]

    def view_of(self, snap: HostSnapshot) -> object:
        tl = self._timeline(snap)
        if self.track is None:
            return tl
        # The controller's own steps, as they stand now (the track changes in place as it runs).
        return (copy.copy(self.track), self.track_boot, tl)

    def extent_of(self, view: object) -> object:
        if isinstance(view, Timeline):
            return (len(view.steps), view.reason is not None)
        if isinstance(view, tuple) and isinstance(view[0], ApplyTrack):
            body = self._render_track(view[0], view[2])
            return len(body.renderables) if isinstance(body, Group) else 1
        return None

    def _render_body(self) -> RenderableType:
        snap = self.snap
        tl = self._timeline(snap) if snap is not None else None
        if self.track is not None:
            return self._render_track(self.track, tl)
        if snap is None:
            return Text("restart: no boot seen", palette().muted)
        if tl is None:
            return Text("restart: no boot with timestamps yet", palette().muted)
        role, bold = OUTCOME_ROLES[tl.outcome]
        colour = palette().style(role, bold=bold)
        head = Text()
        head.append(f"{tl.name or f'boot #{tl.boot_index}'} ", "bold")
        head.append(tl.outcome, colour)
        head.append(f"  elapsed {fmt_duration(tl.elapsed)}", palette().muted)
        if tl.eta is not None:
            head.append(f"  ETA {fmt_duration(tl.eta)}", palette().style("warn", bold=True))
        lines: list[RenderableType] = [head]
        lines.extend(_step_line(step) for step in tl.steps)
        if tl.reason:
            lines.append(Text(tl.reason, palette().bad))
        return Group(*lines)

    def _render_track(self, track: ApplyTrack, tl: Timeline | None) -> RenderableType:
        head = Text()
        head.append(f"{track.action} ", "bold")
        if not track.done:
            head.append("running", palette().warn)
        elif track.ok:
            head.append("verified", palette().style("ok", bold=True))
        else:
            head.append("failed", palette().style("bad", bold=True))
        head.append(f"  elapsed {fmt_duration(track.elapsed_s)}", palette().muted)
        if not track.done and track.eta_s is not None:
            head.append(f"  ETA {fmt_duration(track.eta_s)}", palette().style("warn", bold=True))
        lines: list[RenderableType] = [head]
        journal_live = (
            tl is not None and track.booting and (self.track_boot is None or tl.boot_index > self.track_boot)
        )
        boot = tl.steps if journal_live and tl is not None else track.steps((*BOOT, Phase.READY))
        # The controller's runs of steps in one state share a line (its five quick steps, the checks
        # still to come); the boot's phases keep one each. One per line, 12 of them did not fit the side
        # column, which cut off KV pool, CUDA graphs and ready (issue 34).
        lines.extend(_merged_lines(track.steps(track.before())))
        lines.extend(_step_line(step) for step in boot)
        lines.extend(_merged_lines(track.steps(CONTROLLER_AFTER)))
        if track.done and track.summary:
            mark, style = (
                ("✔", palette().style("ok", bold=True))
                if track.ok
                else ("✘", palette().style("bad", bold=True))
            )
            lines.append(Text(f"{mark} {track.summary}", style))
            for why in [r for r in track.reasons if r not in track.summary][:4]:
                lines.append(Text(f"  {why}", palette().bad))
            if track.can_roll_back:
                lines.append(Text("R rolls back to the previous drop-in", palette().style("warn", bold=True)))
        elif track.message:
            lines.append(Text(track.message, palette().muted, overflow="ellipsis", no_wrap=True))
        return Group(*lines)


OUTCOME_ROLES: dict[str, tuple[str, bool]] = {
    "ready": ("ok", False),
    "failed": ("bad", True),
    "running": ("warn", False),
    "stopped": ("muted", False),
}
STEP_MARKS: dict[str, tuple[str, str, bool]] = {
    "done": ("✔", "ok", False),
    "active": ("▶", "warn", True),
    "pending": ("·", "faint", False),
    "failed": ("✘", "bad", True),
}


def _merged_lines(steps: Sequence[TimelineStep]) -> list[Text]:
    """Steps in order, a run of finished (or of pending) ones on one line: `✔ validate … restart (5
    steps) 1.3s`, `· verify, record`; the active and the failed one each on their own."""
    out: list[Text] = []
    for state, run in itertools.groupby(steps, key=lambda s: s.state):
        group = list(run)
        if len(group) == 1 or state not in ("done", "pending"):
            out.extend(_step_line(step) for step in group)
            continue
        mark, role, bold = STEP_MARKS[state]
        style = palette().style(role, bold=bold)
        line = Text()
        line.append(f" {mark} ", style)
        said = (
            ", ".join(step.label for step in group)
            if len(group) == 2
            else f"{group[0].label} … {group[-1].label} ({len(group)} steps)"
        )
        line.append(said, style if state != "done" else "")
        took = [step.seconds for step in group if step.seconds is not None]
        if took:
            line.append(f" {fmt_duration(sum(took))}", palette().muted)
        out.append(line)
    return out


def _step_line(step: TimelineStep) -> Text:
    mark, role, bold = STEP_MARKS[step.state]
    style = palette().style(role, bold=bold)
    line = Text()
    line.append(f" {mark} ", style)
    line.append(f"{step.label:<16}", style if step.state != "done" else "")
    if step.seconds is not None:
        line.append(fmt_duration(step.seconds), palette().muted if step.state == "done" else style)
    return line


class VerdictBanner(Static):
    """The verdict of the last apply / rollback / restart the console ran, until the next one."""

    DEFAULT_CLASSES = "verdict"
    _shown: tuple[bool, str, bool] | None = None

    def restyle(self) -> None:
        if self._shown is not None and self.display:
            ok, text, can_roll_back = self._shown
            self.show_verdict(ok, text, can_roll_back=can_roll_back)

    def show_verdict(self, ok: bool, text: str, *, can_roll_back: bool) -> None:
        self._shown = (ok, text, can_roll_back)
        line = Text()
        if ok:
            line.append(" ✔ ", palette().badge("ok"))
            line.append(f" {text}", palette().style("ok", bold=True))
        else:
            line.append(" ✘ ", palette().badge("bad"))
            if can_roll_back:
                # First, so a long reason cannot push the way out off the line.
                line.append(" R: roll back ", palette().badge("warn"))
            line.append(f" {text}", palette().style("bad", bold=True))
        self.set_class(ok, "ok")
        self.set_class(not ok, "failed")
        self.update(textual_text(line))
        self.display = True

    def clear(self) -> None:
        self.display = False
