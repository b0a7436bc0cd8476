"""`snapshot --json` of a server with DP attention: the KV tokens of each data-parallel rank, pinned.

The twin serves no DP attention (its /metrics carry no `dp_rank`), so the scrapes are SGLang-shaped text:
two scheduler ranks (tp_rank 0 and 4 heading DP groups 0 and 1) labelled as SGLang 0.5.12's multiprocess
registry writes them, read through the same `serving_figures` and report model as the command."""

from __future__ import annotations

import json

from console.cli.cmd_snapshot import ServiceReading, SnapshotReport, _lines
from console.core.metrics import parse_prometheus
from console.core.serving import Scrape, serving_figures
from tests.test_sources_metrics import MODEL, SCRAPE


def _kv(used0: float, used1: float) -> str:
    return (
        "# HELP sglang:kv_used_tokens The number of used KV cache tokens.\n"
        "# TYPE sglang:kv_used_tokens gauge\n"
        f'sglang:kv_used_tokens{{{MODEL},tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="0"}} {used0}\n'
        f'sglang:kv_used_tokens{{{MODEL},tp_rank="4",pp_rank="0",moe_ep_rank="4",dp_rank="1"}} {used1}\n'
    )


def test_snapshot_json_pins_the_kv_tokens_of_each_dp_rank() -> None:
    scrapes = [
        Scrape(ts=100.0, metrics=parse_prometheus(SCRAPE + _kv(50_000.0, 20_000.0))),
        Scrape(ts=102.0, metrics=parse_prometheus(SCRAPE + _kv(59_207.0, 25_374.0))),
    ]
    figures = serving_figures(scrapes, window_s=300.0, version="0.5.12.post1", max_running=64)
    report = SnapshotReport(host="gpu1", taken_at=103.0, service=ServiceReading(), serving=figures)
    printed = json.loads(json.dumps(report.model_dump(mode="json")))  # what `--json` prints
    serving = printed["serving"]
    assert serving["kv_ranks"] == [
        {"dp_rank": 0, "used": 59207.0, "pool": 211456.0, "engine_type": None},
        {"dp_rank": 1, "used": 25374.0, "pool": 211456.0, "engine_type": None},
    ]  # the newest scrape's, per rank; the pool of each rank, not the sum (one engine: no engine_type)
    assert serving["kv_used"] == 84581.0 and serving["kv_pool"] == 422912.0
    assert serving["running"] == 5.0 and serving["queued"] == 1.0
    assert serving["as_of"] == 102.0
    text = "\n".join(_lines(report))
    assert "    DP0: 59,207 of 211,456" in text and "    DP1: 25,374 of 211,456" in text
