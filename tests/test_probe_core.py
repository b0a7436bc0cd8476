"""The probe's arithmetic: bandwidth catalogue, KV cell, refusals, TTFT/tok-s/ITL, diagnosis, history."""

from __future__ import annotations

import random
import statistics
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from console.core.models import get_model
from console.core.parser import parse_lines
from console.core.probe import (
    ProbeMeasurement,
    ProbeReport,
    ProbeResult,
    ProbeStatus,
    ProbeTarget,
    ProbeVerdict,
    ServerLimits,
    diagnose,
    failed_result,
    generate_payload,
    gpu_bandwidth,
    inter_token_latencies,
    kv_bytes_per_token,
    live_tok_s,
    parse_depths,
    percentile,
    random_prompt,
    refusal,
    summarize,
    sweep_fit,
)
from console.core.probe_history import ProbeRecord, curves_from_history, throughput_points, tok_s_by_depth
from console.sources.probe import limits_from_info, limits_from_journal

KIMI_CELL = 70_272  # 576 latent elements x 61 layers x 2 bytes (sglang.md §7)
RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def kimi_target(gpu: str | None = RTX) -> ProbeTarget:
    bw = gpu_bandwidth(gpu)
    return ProbeTarget(
        host="gpu1",
        gpu_name=gpu,
        gpu_count=8,
        model="kimi-k2.6",
        tp_size=8,
        kv_bytes_per_token_per_gpu=kv_bytes_per_token(get_model("kimi-k2.6"), 8, "auto"),
        peak_bandwidth_gbs=bw.peak_gbs if bw else None,
    )


def steady(depth: int, ttft: float, tok_s: float, n: int) -> ProbeMeasurement:
    """A stream that delivers its first token after `ttft` and one token every 1/tok_s after that."""
    arrivals = [(ttft + i / tok_s, i + 1) for i in range(n)]
    return ProbeMeasurement(
        depth=depth, requested_tokens=n, arrivals=arrivals, prompt_tokens=depth, cached_tokens=0
    )


# ---- catalogue and cell -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("smi_name", "card", "peak"),
    [
        (RTX, "RTX PRO 6000 Blackwell", 1792.0),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX PRO 6000 Blackwell", 1792.0),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 3350.0),
        ("NVIDIA H100 PCIe", "H100 PCIe", 2000.0),
        ("NVIDIA H200", "H200", 4800.0),
        ("NVIDIA B200", "B200", 8000.0),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB", 1555.0),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB", 1555.0),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 2039.0),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 1935.0),
        ("NVIDIA L40S", "L40S", 864.0),
    ],
)
def test_catalogue_matches_nvidia_smi_names(smi_name: str, card: str, peak: float) -> None:
    entry = gpu_bandwidth(smi_name)
    assert entry is not None and (entry.name, entry.peak_gbs) == (card, peak)


def test_unknown_cards_are_unknown() -> None:
    assert gpu_bandwidth("NVIDIA RTX 6000 Ada Generation") is None  # not in the table: unknown, not guessed
    assert gpu_bandwidth(None) is None
    assert gpu_bandwidth("") is None


def test_kv_cell_comes_from_the_model_catalogue() -> None:
    assert kv_bytes_per_token(get_model("kimi-k2.6"), 8, "auto") == KIMI_CELL
    # MLA keeps the whole latent on every rank: TP does not divide it.
    assert kv_bytes_per_token(get_model("kimi-k2.6"), 1, None) == KIMI_CELL
    assert kv_bytes_per_token(get_model("kimi-k2.6"), 8, "fp8_e4m3") == KIMI_CELL // 2
    # Llama-3.1-8B: 8 KV heads x (128 + 128) x 32 layers x 2 bytes at TP 1; halved at TP 2.
    assert kv_bytes_per_token(get_model("llama-3.1-8b"), 1, "auto") == 131_072
    assert kv_bytes_per_token(get_model("llama-3.1-8b"), 2, "auto") == 65_536
    assert kv_bytes_per_token(None, 8, "auto") is None
    assert kv_bytes_per_token(get_model("kimi-k2.6"), 8, "int3") is None


# ---- limits and refusals ----------------------------------------------------------------------------


def test_the_incident_pool_refuses_185k_and_names_the_knob() -> None:
    at_085 = ServerLimits(context_len=200_000, pool_tokens=101_134, max_req_input_len=101_128)
    reason = refusal(185_000, 32, at_085)
    assert reason is not None and "KV pool of 101,134" in reason and "--mem-fraction-static" in reason
    at_094 = ServerLimits(context_len=200_000, pool_tokens=218_484, max_req_input_len=199_994)
    assert refusal(185_000, 32, at_094) is None
    ctx = refusal(199_990, 32, at_094)
    assert ctx is not None and "context length of 200,000" in ctx
    assert refusal(199_995, 4, at_094) is not None  # fits the context, not the longest input
    assert refusal(10**9, 1, ServerLimits()) is None  # nothing known: nothing to refuse on


def test_limits_from_the_real_journal_pool_summary() -> None:
    corpus = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "seed-restart-mfs094.journal"
    limits = limits_from_journal(corpus.read_text().splitlines())
    assert limits is not None
    assert (limits.pool_tokens, limits.context_len, limits.source) == (218_484, 200_000, "journal")


def test_limits_from_server_info_fall_back_to_token_capacity() -> None:
    info = {
        "context_length": None,
        "context_len": 131_072,
        "max_req_input_len": 131_066,
        "internal_states": [{"memory_usage": {"token_capacity": 500_000}}],
    }
    assert limits_from_info(info) == ServerLimits(
        context_len=131_072, pool_tokens=500_000, max_req_input_len=131_066, source="server_info"
    )


def test_random_prompt_is_fresh_each_run_and_in_vocabulary() -> None:
    a = random_prompt(5000, random.Random(1))
    b = random_prompt(5000, random.Random(2))
    assert len(a) == 5000 and a[0] != b[0] and a != b
    assert all(100 <= t < 30_000 for t in a + b)
    payload = generate_payload(a, 16)
    assert payload["sampling_params"] == {
        "max_new_tokens": 16,
        "min_new_tokens": 16,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    assert payload["input_ids"] is a and payload["stream"] is True


# ---- measurement -------------------------------------------------------------------------------------


def test_incident_at_185k_is_attention_bound() -> None:
    result = summarize(steady(185_000, 21.0, 0.70, 8), kimi_target())
    assert result.status is ProbeStatus.OK
    assert result.ttft_s == pytest.approx(21.0)
    assert result.decode_tok_s == pytest.approx(0.70)
    assert result.itl_p50_s == pytest.approx(1 / 0.70) and result.itl_p99_s == pytest.approx(1 / 0.70)
    # 185,000 tokens x 70,272 B x 0.70 tok/s = 9.1 GB/s per GPU, 0.51% of 1,792 GB/s.
    assert result.effective_kv_bandwidth_gbs == pytest.approx(185_000 * KIMI_CELL * 0.70 / 1e9)
    assert result.bandwidth_pct == pytest.approx(100 * 9.1002 / 1792, rel=1e-3)
    assert result.verdict is ProbeVerdict.ATTENTION_BOUND
    assert result.diagnosis == (
        "decode reads KV at 0.51% of GDDR7 bandwidth at 185k depth: attention is the bottleneck "
        "(check --attention-backend and --page-size)"
    )


def test_healthy_decode_at_185k_is_not_blamed_on_attention() -> None:
    result = summarize(steady(185_000, 21.0, 20.4, 16), kimi_target())
    assert result.verdict is ProbeVerdict.ATTENTION_OK
    assert "bottleneck" not in result.diagnosis and "keeps up" in result.diagnosis
    assert result.bandwidth_pct == pytest.approx(100 * 185_000 * KIMI_CELL * 20.4 / 1e9 / 1792)


def test_a_shallow_probe_does_not_judge_attention() -> None:
    result = summarize(steady(8_000, 0.9, 11.5, 8), kimi_target())
    assert result.verdict is ProbeVerdict.TOO_SHALLOW
    assert "too shallow" in result.diagnosis and "probe 29k or deeper" in result.diagnosis


def test_unknown_card_or_model_says_so() -> None:
    result = summarize(steady(185_000, 21.0, 0.7, 4), kimi_target("NVIDIA RTX 6000 Ada Generation"))
    assert result.peak_bandwidth_gbs is None and result.bandwidth_pct is None
    assert result.effective_kv_bandwidth_gbs == pytest.approx(9.1, abs=0.01)
    assert "NVIDIA RTX 6000 Ada Generation is not in the bandwidth catalogue" in result.diagnosis
    assert result.verdict is ProbeVerdict.UNKNOWN
    no_model = ProbeTarget(host="gpu1", model="mystery-7b", peak_bandwidth_gbs=3350.0)
    verdict, line, effective, pct = diagnose(100_000, 3.0, no_model)
    assert verdict is ProbeVerdict.UNKNOWN and effective is None and pct is None
    assert "KV bytes per token of mystery-7b are not known" in line


def test_chunks_of_several_tokens_spread_their_wait() -> None:
    # --stream-interval 4: tokens arrive four at a time, every 0.4 s.
    arrivals = [(1.0, 1), (1.4, 5), (1.8, 9)]
    assert inter_token_latencies(arrivals) == pytest.approx([0.1] * 8)
    m = ProbeMeasurement(depth=1000, requested_tokens=9, arrivals=arrivals)
    result = summarize(m, kimi_target())
    assert result.decode_tok_s == pytest.approx(8 / 0.8) and result.output_tokens == 9


def test_percentiles_match_the_inclusive_method() -> None:
    rng = random.Random(7)
    values = [rng.expovariate(2.0) for _ in range(101)]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    assert percentile(values, 50) == pytest.approx(cuts[49])
    assert percentile(values, 99) == pytest.approx(cuts[98])
    assert percentile([], 50) is None and percentile([3.0], 99) == 3.0


def test_live_tok_s_leaves_out_the_prefill_wait() -> None:
    arrivals = [(20.0, 1), (20.5, 2), (21.0, 3), (21.5, 4)]
    assert live_tok_s(arrivals) == pytest.approx(2.0)
    assert live_tok_s(arrivals[:2]) is None


def test_one_token_gives_ttft_but_no_speed() -> None:
    result = summarize(steady(1000, 0.3, 10.0, 1), kimi_target())
    assert result.ttft_s == pytest.approx(0.3) and result.decode_tok_s is None
    assert "fewer than two tokens" in result.diagnosis


def test_a_stream_cut_short_keeps_what_it_measured() -> None:
    m = steady(185_000, 21.0, 0.7, 3)
    m.requested_tokens = 50
    result = failed_result(m, kimi_target(), "the stream ended without finishing")
    assert result.status is ProbeStatus.FAILED and result.output_tokens == 3
    assert result.ttft_s == pytest.approx(21.0) and result.error == "the stream ended without finishing"
    assert result.diagnosis.startswith("failed: ") and result.verdict is ProbeVerdict.UNKNOWN
    empty = failed_result(ProbeMeasurement(depth=5, requested_tokens=4), kimi_target(), "x", cancelled=True)
    assert empty.status is ProbeStatus.CANCELLED and empty.output_tokens == 0


# ---- sweeps and history ------------------------------------------------------------------------------


def test_parse_depths() -> None:
    assert parse_depths("1k,8k,32k,64k,128k,185k,200k") == [
        1000,
        8000,
        32_000,
        64_000,
        128_000,
        185_000,
        200_000,
    ]
    assert parse_depths("128Ki, 1.5k,200_000") == [131_072, 1500, 200_000]
    for bad in ("", "8k,x", "0", "-5k"):
        with pytest.raises(ValueError):
            parse_depths(bad)


def _result(depth: int, tok_s: float) -> ProbeResult:
    return summarize(steady(depth, 1.0, tok_s, 4), kimi_target())


def test_sweep_fit_separates_attention_from_the_fixed_step_cost() -> None:
    # The incident: 25 ms a step plus depth x 140,544 B read at 18.5 GB/s.
    def tok_s(depth: int) -> float:
        return 1 / (0.025 + depth * KIMI_CELL * 2 / (1.8e12 * 0.0103))

    results = [_result(d, tok_s(d)) for d in (8_000, 64_000, 185_000)]
    fit = sweep_fit(results, kimi_target())
    assert fit is not None and fit.verdict is ProbeVerdict.ATTENTION_BOUND
    assert fit.attention_kv_bandwidth_gbs == pytest.approx(1.8e12 * 0.0103 / 2 / 1e9, rel=1e-6)
    assert "attention is the bottleneck" in fit.diagnosis
    flat = sweep_fit([_result(8_000, 30.0), _result(64_000, 30.5)], kimi_target())
    assert flat is not None and flat.verdict is ProbeVerdict.ATTENTION_OK
    assert sweep_fit([_result(8_000, 30.0)], kimi_target()) is None
    assert sweep_fit([_result(8_000, 30.0), _result(9_000, 29.0)], kimi_target()) is None


def _report(
    run: str, when: datetime, pairs: list[tuple[int, float]], profile: str | None = None
) -> ProbeReport:
    return ProbeReport(
        host="gpu1",
        profile=profile,
        run_id=run,
        started_at=when,
        target=kimi_target(),
        limits=ServerLimits(),
        requested_tokens=4,
        results=[_result(d, v) for d, v in pairs],
    )


def test_history_curves_group_runs_and_skip_this_one() -> None:
    from console.core.probe_history import records_of

    t0 = datetime(2026, 5, 30, 22, 0, tzinfo=UTC)
    records: list[ProbeRecord] = []
    for i in range(5):
        rep = _report(f"run{i}", t0 + timedelta(hours=i), [(8000, 11.0 + i), (185_000, 0.7 + i)], "ctx-200k")
        records += records_of(rep)
    other = _report("elsewhere", t0, [(8000, 99.0)])
    records += [r.model_copy(update={"host": "gpu2"}) for r in records_of(other)]
    curves = curves_from_history(records, "gpu1", exclude_run="run4", limit=3)
    assert [c.run_id for c in curves] == ["run1", "run2", "run3"]
    assert curves[0].label == "05-30 23:00 ctx-200k"
    assert curves[2].points == [(8000, pytest.approx(14.0)), (185_000, pytest.approx(3.7))]
    assert tok_s_by_depth(_report("r", t0, [(8000, 11.234), (185_000, 0.6996)])) == {
        8000: 11.23,
        185_000: 0.7,
    }


def test_throughput_points_from_real_decode_batch_lines(corpus_dir: Path) -> None:
    lines = (corpus_dir / "public" / "case-26.log").read_text().splitlines()
    points = throughput_points(parse_lines(lines))
    assert [v for _, v in points] == [53.58, 86.63, 86.65]
    times = [t for t, _ in points]
    assert times[1] - times[0] == 2.0 and times[2] - times[1] == 2.0


def test_the_probe_takes_the_card_s_own_peak_from_nvml_and_names_where_it_came_from() -> None:
    """Issue 31: the peak from NVML where the GPU sample carries it (the real H200's clocks and bus,
    tests/data/real-gpu-h200), else the table's for the name (nvidia-smi has no bus width); a card the
    hosts file names is the table's."""
    from console.core.gpus import GpuSample
    from console.core.probe import card_peak
    from console.sources.hosts import HostConfig
    from console.sources.probe import target_from

    h200 = GpuSample(
        name="NVIDIA H200", memory_total_mib=143_771, clock_mem_max_mhz=3201, memory_bus_width_bits=6016
    )
    assert card_peak(h200) == (4814.3, "nvml", "NVML: 2 × max memory clock 3,201 MHz × 6,016-bit bus / 8")
    smi = h200.model_copy(update={"memory_bus_width_bits": None})
    peak, source, words = card_peak(smi)
    assert (
        (peak, source) == (4800.0, "table")
        and words is not None
        and words.startswith("the bandwidth table (H200:")
    )
    assert card_peak(GpuSample(name="Mystery GPU 9000")) == (None, None, None)

    host = HostConfig(name="gpu1", ssh="gpu1")
    target = target_from(host, {}, "NVIDIA H200", 8, h200)
    assert (target.peak_bandwidth_gbs, target.peak_from) == (4814.3, "nvml")
    # The probe screen says where the peak came from.
    from console.tui.probe import target_line

    def said(t: object) -> str:
        return target_line(ProbeReport.model_construct(target=t))

    assert "(4,814 GB/s peak from NVML)" in said(target)
    assert "peak from the bandwidth table" in said(target.model_copy(update={"peak_from": "table"}))
    named = target_from(host.model_copy(update={"gpu": "NVIDIA H100 80GB HBM3"}), {}, "NVIDIA H200", 8, h200)
    assert (named.gpu_name, named.peak_bandwidth_gbs, named.peak_from) == (
        "NVIDIA H100 80GB HBM3",
        3350.0,
        "table",
    )
