"""Each pool of a hybrid, sliding-window, DeepSeek-V4 or speculative boot on screen (issue 32 item 3): the KV
gauge's pools line and the pool that bounds the target, the GPU bars' mamba and draft segments, the serving
panel's per-pool, KV-transfer, hicache and read-as lines, and `snapshot`'s text.

Inputs: the real public boots of tests/data/public-pools (INDEX.md there), MiMo-V2-Flash's pool lines of
corpus case-29, the scrapes of tests/data/metrics-generations (real, and reconstructed from a version's
collector source where INDEX.md says so), and a speculative (EAGLE3) boot printed by the twin's SGLang
stand-in: no public log of a whole boot with a draft model's lines was found. A classic boot (corpus
case-01, case-31) is the control: it draws as it always did."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

from console.cli.cmd_snapshot import ServiceReading, _lines, report_of
from console.core.events import Event, KvPoolAllocated, WeightsLoaded
from console.core.metrics import parse_prometheus
from console.core.parser import parse_lines
from console.core.serving import Scrape, ServingFigures, serving_figures
from console.core.snapshot import HostSnapshot
from console.core.state import fold_boots
from console.sources.alert_config import default_alert_config
from console.tui.app import ConsoleApp
from console.tui.serving_panel import serving_body
from console.tui.themes import palette
from console.tui.view import PoolGauge, gpu_rows, kv_gauge, rank_memory
from console.twin.scenarios import get_scenario
from console.twin.server_argspec import parse_argv
from console.twin.server_logs import LogWriter
from console.twin.sglang_server import SimulatedServer, TwinEnv
from tests.tui_support import NOW, corpus_events, gpu_sample, make_app, snapshot

HERE = Path(__file__).parent
POOLS = HERE / "data" / "public-pools"
SCRAPES = HERE / "data" / "metrics-generations"
GIB = 1024.0


def pool_events(name: str) -> list[Event]:
    return list(parse_lines((POOLS / name).read_text().splitlines(), host="gpu1"))


def qwen35() -> HostSnapshot:
    """Qwen3.5-397B on 2x RTX 4090 (TP2, ktransformers#1870): 3.63 GiB of 23.99 free at ready."""
    return snapshot(
        pool_events("qwen35-397b-hybrid-tp2.log"), gpu_sample([(23.99 - 3.63) * GIB] * 2, 23.99 * GIB)
    )


def dsv4() -> HostSnapshot:
    """DeepSeek-V4-Flash on 4x MI300X (TP4 DP4, sglang#25118), its pools allocated (192 GiB each)."""
    return snapshot(pool_events("dsv4-flash-mi300x-tp4dp4.log"), gpu_sample([170.0 * GIB] * 4, 192.0 * GIB))


def gemma4() -> HostSnapshot:
    """Gemma 4 on a GB10: the run journal's two wrapped SGLang lines rejoined (as test_capacity_pools does)."""
    text = (POOLS / "gemma4-26b-gb10-run-journal.txt").read_text()
    text = text.replace(",\navail mem", ", avail mem").replace("e2e=361.83,\n", "e2e=361.83, ")
    return snapshot(list(parse_lines(text.splitlines(), host="gpu1")), None)


@pytest.fixture(scope="module")
def draft_events() -> list[Event]:
    """Kimi K2.6 at TP8 with an EAGLE3 draft, as the twin's SGLang stand-in starts it (≤ v0.5.13 order:
    the target's weights, pool and graphs, then the draft's weights, pool and graphs)."""
    scenario = get_scenario("kimi-k26-rtx6000")
    argv = ["--model-path", scenario.model_path, "--tp", "8", "--trust-remote-code"]
    argv += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "draft"]
    argv += ["--mem-fraction-static", "0.85", "--context-length", "200000"]
    server = SimulatedServer(
        TwinEnv(scenario, time_scale=0.0, decode_scale=1.0, state_dir=None), parse_argv(argv, scenario)
    )
    out = io.StringIO()
    server.log = LogWriter(out, tp_size=server.tp)
    asyncio.run(server.launch())
    return list(parse_lines(out.getvalue().splitlines(), host="gpu1"))


def draft_boot(events: list[Event]) -> HostSnapshot:
    total = 97_887.0  # MiB: the scenario's RTX PRO 6000
    (boot,) = fold_boots(events)
    free = boot.pool.available_gpu_mem_gb
    assert free is not None
    return snapshot(events, gpu_sample([total - free * GIB] * 8, total))


def figures(*names: str, version: str) -> ServingFigures:
    scrapes = [
        Scrape(ts=NOW - 10.0 * (len(names) - i), metrics=parse_prometheus((SCRAPES / n).read_text()))
        for i, n in enumerate(names)
    ]
    return serving_figures(scrapes, version=version)


# ------------------------------------------------------------------ the memory split


def test_a_hybrid_boot_s_mamba_pool_is_its_own_segment() -> None:
    (row, _) = gpu_rows(qwen35())
    split = dict(row.parts)
    assert [name for name, _ in row.parts] == ["weights", "kv", "mamba", "graphs", "other", "procs"]
    # Load weight end: mem usage=3.76; K 4.15 + V 4.15; conv_state 0.13 + ssm_state 7.29 (--disable-cuda-graph)
    assert (split["weights"], split["kv"], split["mamba"], split["graphs"]) == pytest.approx(
        (3.76, 8.30, 7.42, 0)
    )
    assert split["other"] == pytest.approx(23.99 - 3.63 - 3.76 - 8.30 - 7.42)
    # control: a classic boot's split is what it always was, no empty mamba or draft segment
    classic = gpu_rows(snapshot(corpus_events("case-01"), gpu_sample([250.0 * GIB] * 8, 288 * GIB)))
    assert [name for name, _ in classic[0].parts] == ["weights", "kv", "graphs", "other", "procs"]


def test_sliding_window_and_deepseek_v4_pools_count_whole_in_the_kv_segment() -> None:
    # MiMo-V2-Flash (case-29): two KV lines per rank (full, SWA) and SWAKVPool's sum of both, 77.63 GB;
    # the excerpt shows one KV line of TP0 and TP3, both of TP1 and TP2.
    mimo = rank_memory(snapshot(corpus_events("case-29"), None).state.boots[-1])
    assert {rank: mem.kv for rank, mem in mimo.items()} == {0: 77.63, 1: 77.63, 2: 77.63, 3: 77.63}
    # DeepSeek-V4 prints no KV line: its pools are bytes_per_full_token x full_token (87.26 GB available)
    v4 = rank_memory(dsv4().state.boots[-1])
    assert set(v4) == {0, 1, 2, 3}
    assert all(
        m.kv == pytest.approx(176983.05 * 529408 / 1024**3) and m.weights == 73.43 for m in v4.values()
    )
    assert round(v4[0].kv or 0, 2) == 87.26


def test_a_draft_model_s_weights_and_pool_are_their_own_segment(draft_events: list[Event]) -> None:
    tp0 = [e for e in draft_events if e.tp_rank == 0]
    weights = [e.mem_usage_gb for e in tp0 if isinstance(e, WeightsLoaded)]
    kv = [
        (e.k_size_gb or 0) + (e.v_size_gb or 0) + (e.kv_size_gb or 0)
        for e in tp0
        if isinstance(e, KvPoolAllocated)
    ]
    assert len(weights) == 2 and len(kv) == 2  # the target's, then the draft's
    mem = rank_memory(fold_boots(draft_events)[-1])[0]
    assert mem.weights == weights[0] and mem.kv == kv[0]
    assert mem.draft == pytest.approx((weights[1] or 0) + kv[1])
    names = [name for name, _ in gpu_rows(draft_boot(draft_events))[0].parts]
    assert names == ["weights", "kv", "draft", "graphs", "other", "procs"]


# ------------------------------------------------------------------ the KV gauge


def test_the_gauge_gives_each_pool_and_the_one_that_bounds_the_target() -> None:
    g = kv_gauge(qwen35(), target=200_000)
    assert g.pools == (PoolGauge("full", 580_364, "tokens", 8.3), PoolGauge("mamba", 82, "slots", 7.42))
    # 82 slots, 3 per request with the radix cache (SGLang's MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO)
    assert g.limit == ("mamba", "mamba: ≤ 27 running (82 slots, 3 each); full holds T")
    assert g.level == "ok"
    assert kv_gauge(qwen35(), target=1_000_000).limit == ("full", "full 580,364 < T 1,000,000")
    assert kv_gauge(qwen35()).limit == (
        "mamba",
        "mamba: ≤ 27 running (82 slots, 3 each); full holds --context-length",
    )
    v4 = kv_gauge(dsv4(), target=200_000)
    assert [(p.name, p.size) for p in v4.pools] == [
        ("full", 529_408),
        ("swa", 423_424),
        ("dsv4_c4", 132_352),
        ("dsv4_c128", 4_136),
    ]
    assert v4.limit == ("full", "full holds T; SWA 423k holds the running windows")
    gemma = kv_gauge(gemma4(), target=262_144)
    assert [(p.name, p.size) for p in gemma.pools] == [("full", 213_761), ("swa", 171_008)]
    assert gemma.limit == ("full", "full 213,761 < T 262,144") and gemma.level == "critical"
    # control: a boot with one pool has no pools line and no limit
    classic = kv_gauge(snapshot(corpus_events("case-31"), None), target=32_768)
    assert classic.pools == () and classic.limit is None and classic.pool_tokens == 15387


def test_each_pool_s_use_and_a_full_mamba_pool_warns() -> None:
    # One DeepSeek-V4 NPU log (read_file id 57615238133): its budget and pool lines, then a decode line.
    later = (POOLS / "dsv4-and-draft-lines.log").read_text().splitlines()
    decode = (POOLS / "swa-lines.log").read_text().splitlines()[8]
    events = list(parse_lines([later[0], later[1], decode], host="gpu1"))
    g = kv_gauge(snapshot(events, None))
    assert [(p.name, p.usage) for p in g.pools][:2] == [("full", 0.0), ("swa", 0.04)]
    assert g.pools[1].words() == "SWA 21k 4%" and g.level == "ok"
    # The one public line of a full mamba pool (MiniCPM-SALA, mamba-runtime.log line 3: mamba usage 1.00,
    # 6 requests queued) read after the Qwen3.5 boot: the pool that holds requests back is named.
    full = (POOLS / "mamba-runtime.log").read_text().splitlines()[2]
    hybrid = qwen35()
    hybrid = snapshot([*hybrid.recent, *parse_lines([full], host="gpu1")], None)
    g = kv_gauge(hybrid)
    assert g.pools[1].usage == 1.0 and g.pools[1].words() == "mamba 82 slots (7.42 GiB) 100%"
    assert g.level == "critical" and "mamba pool 100% in use" in g.reasons
    # /metrics first: the 0.5.9 scrape's mamba_usage 0.42 over the batch line's
    served = hybrid.model_copy(
        update={"serving": figures("recon-0.5.9-cache-config-info.prom", version="0.5.9")}
    )
    assert kv_gauge(served).pools[1].usage == 0.42 and kv_gauge(served).level == "ok"


# ------------------------------------------------------------------ on screen


def screen(app: ConsoleApp) -> list[str]:
    return [strip.text for strip in app.screen._compositor.render_strips()]


def row_with(rows: list[str], needle: str) -> str:
    found = [row for row in rows if needle in row]
    assert found, (needle, "\n".join(rows))
    return found[0]


async def shown(app: ConsoleApp, pilot, snap: HostSnapshot) -> list[str]:
    app.post_snapshot(snap)
    for _ in range(3):
        await pilot.pause()
    return screen(app)


async def test_each_pool_on_the_dashboard_at_160x48(draft_events: list[Event]) -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        rows = await shown(app, pilot, qwen35())
        row_with(rows, "full 580,364 (8.30 GiB) · mamba 82 slots (7.42 GiB)")
        row_with(rows, "limit mamba: ≤ 27 running (82 slots, 3 each); full holds T")
        assert "█ weights  █ KV pool  █ mamba pool  █ other (SGLang)" in row_with(rows, "█ mamba pool")
        rows = await shown(app, pilot, dsv4())
        row_with(rows, "full 529,408 · SWA 423k · c4 132k · c128 4.1k")
        row_with(rows, "limit full holds T; SWA 423k holds the running windows")
        rows = await shown(app, pilot, draft_boot(draft_events))
        assert "█ draft model  █ CUDA graphs" in row_with(rows, "█ weights  █ KV pool  █ draft model")
        draft = row_with(rows, "· draft 101k")
        assert "full 101,134 (6.62 GiB) · draft 101k (0.28 GiB)" in draft
        row_with(rows, "limit full 101,134 < T 200,000")
        # control: a classic boot draws as it did, no pools line, no limit, no new segment
        rows = await shown(app, pilot, snapshot(corpus_events("case-31"), gpu_sample([20500.0], 22.4 * GIB)))
        text = "\n".join(rows[: rows.index(row_with(rows, "─ events ─"))])  # the panels, not the feed
        assert "pool 15,387 tokens" in text and "█ KV pool" in text
        assert "limit " not in text and "mamba" not in text and "draft" not in text and "full 15" not in text


async def test_each_pool_on_the_dashboard_at_100x30(draft_events: list[Event]) -> None:
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        rows = await shown(app, pilot, qwen35())
        row_with(rows, "full 580k · mamba 82 slots ◂limit")
        assert "█mamba" in row_with(rows, "GPUs █weights █KV █mamba")
        rows = await shown(app, pilot, dsv4())
        row_with(rows, "full 529k·SWA 423k·c4 132k·c128 4.1k")
        rows = await shown(app, pilot, draft_boot(draft_events))
        row_with(rows, "full 101k ◂limit · draft 101k")
        row_with(rows, "GPUs █weights █KV █draft █graphs")
        rows = await shown(app, pilot, snapshot(corpus_events("case-31"), gpu_sample([20500.0], 22.4 * GIB)))
        text = "\n".join(rows[: rows.index(row_with(rows, "─ events ─"))])  # the panels, not the feed
        assert "pool 15,387 tokens" in text and "GPUs █weights █KV █other" in text
        assert "◂limit" not in text and "█mamba" not in text and "█draft" not in text


def serving_snap(fig: ServingFigures) -> HostSnapshot:
    snap = snapshot(corpus_events("case-31"), gpu_sample([60.0 * GIB] * 8, 80 * GIB, util=87.0))
    return snap.model_copy(update={"serving": fig})


@pytest.mark.parametrize("size", [(160, 48), (100, 30)])
async def test_the_serving_panel_s_pools_transfers_hicache_and_read_as(size: tuple[int, int]) -> None:
    compact = size[1] < 40
    app = make_app()
    async with app.run_test(size=size) as pilot:
        # 0.5.23, DP attention 2 x TP2: the SWA pool of both DP ranks, the hierarchical cache's host pool
        rows = await shown(
            app,
            pilot,
            serving_snap(
                figures("recon-0.5.23-dp2-swa-t0.prom", "recon-0.5.23-dp2-swa-t1.prom", version="0.5.23")
            ),
        )
        row_with(rows, "SWA 20k / 342k (5.8%)" if compact else "SWA used 20k / 342k (5.8%)")
        row_with(rows, "hicache host 240k / 2.00M (12%)")
        # a PD prefill engine: 3 transfers in the window, their p99 from the histogram
        rows = await shown(
            app,
            pilot,
            serving_snap(
                figures(
                    "recon-0.5.23-pd-prefill-t0.prom", "recon-0.5.23-pd-prefill-t1.prom", version="0.5.23"
                )
            ),
        )
        line = row_with(rows, "KV xfer p99 ")
        assert "13.33 GB/s" in line and ("(3 in the window)" in line or compact)
        # 0.5.9: mamba usage only (a fraction), the last transfer's gauges, cache_config_info's labels
        rows = await shown(
            app, pilot, serving_snap(figures("recon-0.5.9-cache-config-info.prom", version="0.5.9"))
        )
        row_with(rows, "mamba 42.0%" if compact else "mamba used 42.0%")
        row_with(rows, "KV xfer last 11.5ms · 18.25 GB/s")
        row_with(
            rows,
            "read as: cache_config_info" if compact else "read as: cache_config_info{page_size} → page_size",
        )
        # the first generation's names, and a gRPC sidecar's sglang_ re-export as one item
        rows = await shown(
            app, pilot, serving_snap(figures("2024-09-pr1461-name-label.prom", version="0.3.5"))
        )
        row_with(rows, "read as: name= → model_name=")
        rows = await shown(
            app, pilot, serving_snap(figures("2026-smg813-underscore-reexport.prom", version="0.5.9"))
        )
        row_with(rows, "read as: sglang_* → sglang:*" + ("" if compact else " (4 families)"))
        # control: a server of today's names with one pool shows none of these lines
        text = "\n".join(
            await shown(app, pilot, serving_snap(figures("2025-11-issue13485-v0.5.1.prom", version="0.5.1")))
        )
        assert "running " in text and not any(
            w in text for w in ("SWA ", "mamba", "KV xfer", "hicache", "read as")
        )


def test_the_read_as_note_is_faint() -> None:
    body = serving_body(figures("2024-09-pr1461-name-label.prom", version="0.3.5"), (), 100, compact=False)
    note = next(line for line in body.renderables if getattr(line, "plain", "").startswith("read as: "))
    assert note.style == palette().faint


# ------------------------------------------------------------------ snapshot's text


def report_lines(snap: HostSnapshot, fig: ServingFigures) -> tuple[list[str], dict]:
    report = report_of(
        "gpu1",
        snap,
        ServiceReading(active_state="active", sub_state="running"),
        None,
        fig,
        (200_000, "--target-context"),
        default_alert_config(),
        [],
        taken_at=NOW,
    )
    return _lines(report), report.model_dump(mode="json")


def test_snapshot_prints_the_pools_and_the_newer_serving_families() -> None:
    lines, report = report_lines(
        qwen35(), figures("recon-0.5.23-dp2-swa-t0.prom", "recon-0.5.23-dp2-swa-t1.prom", version="0.5.23")
    )
    assert "pools: full 580,364 tokens (8.30 GiB) · mamba 82 slots (7.42 GiB)" in lines
    assert "  limit (mamba): mamba: ≤ 27 running (82 slots, 3 each); full holds T" in lines
    assert "  pools: kv 95,000 of 427,520, usage 0.28; swa 20,000 of 342,016, usage 0.07" in lines
    assert "  page size 64, 6,680 pages" in lines
    assert any(line.startswith("  hicache: host 240,000 of 2,000,000 tokens;") for line in lines)
    assert any("GPU0: " in line and "mamba 7.4" in line for line in lines)
    # --json: the pools once (`pools`), the gauge with the pool that bounds the target
    assert [p["pool"] for p in report["pools"]] == ["full", "mamba"]
    assert report["pool"]["limit"][0] == "mamba" and "pools" not in report["pool"]

    lines, _ = report_lines(
        qwen35(),
        figures("recon-0.5.23-pd-prefill-t0.prom", "recon-0.5.23-pd-prefill-t1.prom", version="0.5.23"),
    )
    transfer = next(line for line in lines if line.startswith("  KV transfer (over the window): "))
    assert "13.33 GB/s" in transfer and "3 transfers" in transfer
    assert "  engines: prefill" in lines
    lines, _ = report_lines(qwen35(), figures("2024-09-pr1461-name-label.prom", version="0.3.5"))
    read = next(line for line in lines if line.startswith("  read as today's: "))
    assert "sglang:num_requests_running -> sglang:num_running_reqs" in read

    # control: a classic boot and a server of today's names print none of these
    lines, _ = report_lines(
        snapshot(corpus_events("case-31"), None), figures("2025-11-issue13485-v0.5.1.prom", version="0.5.1")
    )
    text = "\n".join(lines)
    assert "KV pool: 15,387 tokens" in text
    for said in ("pools:", "limit", "KV transfer", "hicache", "read as", "engines", "page size"):
        assert said not in text, said
