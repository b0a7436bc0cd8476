"""Every panel's key figure on screen at 80x24, 100x30, 120x40 and 160x48, in each theme (issue 34 item 8:
at 80x24 the GPU bars were 9 cells with 9 blank beside them, the KV level wrapped off its line, the serving
panel lost running/KV and the restart panel was out of view; at 120 columns the header wrapped).

The dashboard is driven by a recorded state, no twin: the Qwen3 boot of corpus case-31, eight GPUs and a
window of /metrics scrapes written by the twin's SGLang stand-in (`serving_snapshot`), with the pairing
bar and a failed apply's banner taking their rows (the busiest the top gets). What is asserted is the
text the terminal shows, row by row."""

from __future__ import annotations

import re

import pytest

from console.core.hostfacts import FlagsFacts, HostFacts, ModelFacts, ModelShape, SglangFacts
from console.tui.app import ConsoleApp
from console.tui.themes import THEMES
from tests.test_tui_serving import serving_snapshot
from tests.tui_support import make_app

SIZES = [(80, 24), (100, 30), (120, 40), (160, 48)]


def screen_rows(app: ConsoleApp) -> list[str]:
    return [strip.text for strip in app.screen._compositor.render_strips()]


def _row_with(rows: list[str], needle: str) -> str:
    found = [row for row in rows if needle in row]
    assert found, (needle, "\n".join(rows))
    return found[0]


async def _dashboard(app: ConsoleApp, pilot, *, busy: bool) -> list[str]:
    app.post_snapshot(serving_snapshot())
    await pilot.pause()
    dash = app.dashboards["gpu1"]
    if busy:
        dash.show_pairing()
        dash.begin_track("apply ctx-200k")
        dash.finish_track(False, "the server failed to start", (), can_roll_back=True)
    for _ in range(3):
        await pilot.pause()
    return screen_rows(app)


def _gpu_rows_fill_their_panel(rows: list[str]) -> None:
    """Each GPU row's figures end at the panel's edge: the bar took the room (9 blank cells were left)."""
    for i in range(8):
        row = _row_with(rows, f"GPU{i} ")
        inner = row[row.index(f"GPU{i} ") :].split("│", 1)[0]
        assert inner.rstrip().endswith("60.0/80.0 GiB  87%"), (i, row)
        assert len(inner) - len(inner.rstrip()) <= 1, (i, row)
        bar = inner[len(f"GPU{i} ") :].split(" 60.0/80.0")[0]
        assert len(bar) >= 15, (i, row)


async def _resized(app: ConsoleApp, pilot, size: tuple[int, int]) -> list[str]:
    await pilot.resize_terminal(*size)
    for _ in range(4):
        await pilot.pause()
    rows = screen_rows(app)
    assert len(rows) == size[1] and len(rows[0]) == size[0], (size, len(rows), len(rows[0]))
    return rows


@pytest.mark.parametrize("theme", sorted(THEMES))
async def test_every_panels_key_figure_is_on_screen(theme: str) -> None:
    """One console per theme, its terminal resized through the four sizes (as an operator's is)."""
    app = make_app(theme=theme)
    async with app.run_test(size=SIZES[-1]) as pilot:
        await _dashboard(app, pilot, busy=True)
        for size in SIZES:
            rows = await _resized(app, pilot, size)
            text = "\n".join(rows)
            said = f"{size} {theme}:\n{text}"
            # header: the host, its service, the link and how fresh the figures are, on its two rows
            assert "gpu1" in rows[0] and "service ready" in rows[0] and "link up" in rows[0], said
            assert "< 5s ago" in rows[1], said
            # the GPUs: every one, its figures, its bar as wide as the panel allows
            _gpu_rows_fill_their_panel(rows)
            # the generation chart, or its latest figure under the bars
            dash = app.dashboards["gpu1"]
            assert dash.throughput.display or "gen tok/s now 240.00" in text, said
            # KV capacity: the pool and its level on one row, the target
            assert "[critical]" in _row_with(rows, "pool 15,387"), said
            assert "T 200k" in text or "200,000 (--target-context)" in text, said
            # serving: a latency, the requests running and the KV used
            assert "320ms" in _row_with(rows, "TTFT"), said
            assert re.search(r"running 12( / 64 max|/64)  queued 3", text), said
            assert re.search(r"KV (used )?2\.4k / 400k", text), said
            # the restart panel's first line, and the banner
            assert "apply ctx-200k failed" in text and "R: roll back" in text, said
            # the newest event
            assert "The server is fired up and ready to roll!" in text, said


async def test_an_idle_restart_panel_shows_the_boot() -> None:
    """No change in flight or finished: the restart panel's first line is the boot and its state."""
    app = make_app()
    async with app.run_test(size=SIZES[0]) as pilot:
        await _dashboard(app, pilot, busy=False)
        for size in SIZES:
            rows = await _resized(app, pilot, size)
            assert "boot 16:13:35 ready" in "\n".join(rows), (size, "\n".join(rows))
            assert re.search(r"running 12( / 64 max|/64)", "\n".join(rows)), size


def _facts() -> HostFacts:
    """A host's facts as `k26-console host` learns them: its SGLang and the model's KV cell."""
    shape = ModelShape(
        attention="mha", layers=28, num_kv_heads=8, head_dim=128, kv_dtype_bytes=2, cell_bytes=114_688
    )
    return HostFacts(
        host="gpu1",
        unit="sglang.service",
        interpreter_source="the unit's ExecStart",
        sglang=SglangFacts(version="0.5.12.post1", source="the host's site-packages"),
        flags=FlagsFacts(
            flags_from="host", version="0.5.12.post1", source="the host's server_args.py", count=312
        ),
        model=ModelFacts(config_from="host", source="the host's config.json", shape=shape),
    )


@pytest.mark.parametrize("width", [120, 160])
async def test_the_header_stays_on_its_two_rows(width: int) -> None:
    """At 120 columns the wide second line (SGLang, model, KV cell, boot, age) wrapped: the age went off
    the header's two rows. Too long for the pane, it takes the narrow form, the age first."""
    app = make_app()
    async with app.run_test(size=(width, 40)) as pilot:
        await _dashboard(app, pilot, busy=False)
        app.dashboards["gpu1"].header.show_facts(_facts())
        await pilot.pause()
        rows = screen_rows(app)
        assert "< 5s ago" in rows[1], "\n".join(rows[:3])
        assert "pairing" not in rows[2] and "GPUs" in rows[2], "\n".join(rows[:3])
        if width >= 160:  # the positive control: room for the wide form, with the KV cell
            assert "114,688 B/token (host)" in rows[1] and "freshest sample" in rows[1], rows[1]
        else:
            assert rows[1].startswith(" fresh < 5s ago"), rows[1]
