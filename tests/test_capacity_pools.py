"""The capacity model and planner for hybrid models (issue 32 item 2), held against real public boots
(tests/data/public-pools/INDEX.md): the mamba state pool taken from the KV budget as SGLang's own
`handle_max_mamba_cache` does, the sliding-window split by `--swa-full-tokens-ratio`, DeepSeek-V4's bytes
per full token, and a plan that names the pool that bounds it and the flags that reach its target.

Figures (per GPU, predicted from each boot's own weights lines and fraction, against what it printed):
- Qwen3.5-397B-A17B, TP2, f=0.85 (kvcache-ai/ktransformers#1870): 581,629 tokens vs 580,364 (+0.22%),
  mamba 82 slots vs 82;
- DeepSeek-V4-Flash, TP4 DP4, f=0.88, MI300X (sgl-project/sglang#25118): 529,408 vs 529,408, SWA 423,424 vs
  423,424.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from console.core.capacity import (
    GIB,
    MemoryEstimate,
    Observation,
    PoolConfig,
    SizingRule,
    calibrate,
    pool_sizes,
    sizing_rule_for,
)
from console.core.capacity_multimodal import mm_reserve_gib
from console.core.capacity_plan import plan
from console.core.models import get_model, model_from_hf_config
from console.core.parser import parse_text
from console.core.planning import command_line_source, plan_restart
from console.core.state import fold_boots
from tests.support.cli import run_main

HERE = Path(__file__).parent
POOLS = HERE / "data" / "public-pools"
CONFIGS = HERE / "data" / "hf-configs"


def qwen35():  # type: ignore[no-untyped-def]
    return model_from_hf_config(
        json.loads((CONFIGS / "Qwen--Qwen3.5-397B-A17B.json").read_text()), "qwen3.5-397b"
    )


def boots(name: str):  # type: ignore[no-untyped-def]
    return fold_boots(parse_text((POOLS / name).read_text()))


# ------------------------------------------------------------------ a hybrid linear-attention boot


def test_the_mamba_slot_is_sglangs_mamba_cache_per_req_on_the_boots_own_lines() -> None:
    (boot,) = boots("qwen35-397b-hybrid-tp2.log")
    per_slot = qwen35().state_bytes_per_request(tp=2)
    assert per_slot == 45 * ((64 * 128 + 2 * 16 * 128) // 2 * 3 * 2 + 32 * 128 * 128 * 4)
    # SGLang allocates one padded slot more than max_mamba_cache_size (slot 0 takes padded tokens).
    assert round((boot.pool.mamba_slots + 1) * per_slot / GIB, 2) == pytest.approx(
        boot.pool.mamba_gb, abs=0.01
    )


def test_a_hybrid_boots_pools_are_predicted_from_its_weights_line_within_one_percent() -> None:
    (boot,) = boots("qwen35-397b-hybrid-tp2.log")
    cfg = PoolConfig(model=qwen35(), tp=2, max_running_requests=1, context_length=8192)
    sizes = pool_sizes(MemoryEstimate(pre_gib=boot.pre_gib, post_gib=boot.post_gib), 0.85, cfg)
    assert sizes.mamba_slots == boot.pool.mamba_slots == 82
    observed = boot.pool.max_total_num_tokens
    assert observed == 580_364
    assert abs(sizes.full_tokens - observed) / observed < 0.01, sizes.full_tokens  # 581,629: +0.22%
    # Without the mamba share the same budget would be read as twice the pool: the state is not free.
    plain = pool_sizes(
        MemoryEstimate(pre_gib=boot.pre_gib, post_gib=boot.post_gib),
        0.85,
        cfg.model_copy(
            update={"model": qwen35().model_copy(update={"linear_layers": 0, "linear_state": None})}
        ),
    )
    assert plain.full_tokens > 1.8 * observed


def test_the_mamba_flags_split_the_budget_as_sglang_does() -> None:
    mem = MemoryEstimate(pre_gib=22.84, post_gib=19.08)
    base = PoolConfig(model=qwen35(), tp=2, max_running_requests=1, context_length=8192)
    fixed = pool_sizes(mem, 0.85, base.model_copy(update={"max_mamba_cache_size": 12}))
    assert fixed.mamba_slots == 12 and fixed.full_tokens > pool_sizes(mem, 0.85, base).full_tokens
    no_radix = pool_sizes(mem, 0.85, base.model_copy(update={"disable_radix_cache": True}))
    assert no_radix.mamba_slots == 1  # --disable-radix-cache with --max-running-requests 1
    leaner = pool_sizes(mem, 0.85, base.model_copy(update={"mamba_full_memory_ratio": 0.5}))
    assert leaner.mamba_slots < 82 and leaner.full_tokens > 580_364


def test_plan_on_the_hybrid_journal_names_the_mamba_pool_and_recommends_its_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [
        "plan",
        "--journal",
        str(POOLS / "qwen35-397b-hybrid-tp2.log"),
        "--model-config",
        str(CONFIGS / "Qwen--Qwen3.5-397B-A17B.json"),
        "--tp",
        "2",
        "--journal-mem-fraction-static",
        "0.85",
        "--max-running-requests",
        "1",
        "--json",
    ]
    code, out, err = run_main([*args, "--target-context", "8192"], capsys)
    assert code == 0, err
    result = json.loads(out)
    assert result["calibration"] == "exact"
    assert abs(result["predicted_max_total_num_tokens"] - 580_364) / 580_364 < 0.01
    assert "mamba state pool" in result["limiting_pool"]
    pools = {p["pool"]: p for p in result["pools"]}
    assert pools["mamba"]["slots"] >= 3  # never a plan whose one request has no mamba slots
    # 800k tokens do not fit at the default ratio with 1 GiB kept; a leaner mamba share does.
    code, out, err = run_main([*args, "--target-context", "800000", "--min-headroom-gib", "1"], capsys)
    assert code == 0, err
    result = json.loads(out)
    assert result["recommended_flags"]["--mamba-full-memory-ratio"] == "0.5"
    assert result["predicted_tokens_at_recommended"] >= 800_000
    assert (
        float(result["recommended_flags"]["--mem-fraction-static"])
        == result["recommended_mem_fraction_static"]
    )


# ------------------------------------------------------------------ a DeepSeek-V4 (sliding-window) boot


def test_a_deepseek_v4_boots_pools_are_predicted_from_its_weights_line() -> None:
    (boot,) = boots("dsv4-flash-mi300x-tp4dp4.log")
    cfg = PoolConfig(
        model=get_model("deepseek-v4-flash"),
        tp=4,
        page_size=256,
        dsv4_bytes_per_full_token=boot.pool.dsv4_bytes_per_full_token,
        max_running_requests=256,
    )
    sizes = pool_sizes(MemoryEstimate(pre_gib=boot.pre_gib, post_gib=boot.post_gib), 0.88, cfg)
    assert sizes.rest_gib == pytest.approx(boot.pool.dsv4_available_gb, abs=0.01)  # 87.27 vs 87.26 printed
    assert abs(sizes.full_tokens - boot.pool.full_tokens) / boot.pool.full_tokens < 0.01
    assert (sizes.full_tokens, sizes.swa_tokens) == (529_408, boot.pool.swa_tokens) == (529_408, 423_424)


def test_plan_on_the_deepseek_v4_journal(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(
        [
            "plan",
            "--journal",
            str(POOLS / "dsv4-flash-mi300x-tp4dp4.log"),
            "--model",
            "deepseek-v4-flash",
            "--tp",
            "4",
            "--page-size",
            "256",
            "--journal-mem-fraction-static",
            "0.88",
            "--max-running-requests",
            "256",
            "--target-context",
            "400000",
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["predicted_max_total_num_tokens"] == 529_408
    assert result["cell_bytes"] == 176_983  # the bytes per full token the boot printed
    pools = {p["pool"]: p["tokens"] for p in result["pools"]}
    assert pools["swa"] == int(pools["full"] * 0.8) // 256 * 256
    assert result["limiting_pool"].startswith("the full-attention pool")
    assert not any("fp8_e4m3 halves" in n for n in result["notes"])  # DSv4's KV is fp8 already


def test_deepseek_v4_without_its_journal_line_is_one_sentence() -> None:
    cfg = PoolConfig(model=get_model("deepseek-v4-flash"), tp=4, page_size=256)
    with pytest.raises(ValueError, match="DSv4 memory calculation"):
        pool_sizes(MemoryEstimate(pre_gib=182.61, post_gib=109.18), 0.88, cfg)


# ------------------------------------------------------------------ sliding-window pools


def gemma4():  # type: ignore[no-untyped-def]
    return model_from_hf_config(
        json.loads((CONFIGS / "google--gemma-4-26B-A4B-it.json").read_text()), "gemma-4"
    )


def test_the_sliding_window_split_matches_a_real_swakvpool_line() -> None:
    (line,) = [e for e in parse_text((POOLS / "swa-lines.log").read_text()) if e.kind == "swa_pool_allocated"]
    cfg = PoolConfig(model=gemma4())
    full = line.full_tokens
    # SGLang's split (HybridSWAPoolConfigurator._solve_pool_sizes): swa = int(full · r), page-aligned.
    assert int(full * cfg.swa_full_tokens_ratio) == line.swa_tokens == 171_008
    full_bytes = gemma4().layer_bytes() * gemma4().num_layers
    swa_bytes = gemma4().swa_layer_bytes() * gemma4().swa_layers
    assert round((full * full_bytes + line.swa_tokens * swa_bytes) / GIB, 2) == line.mem_usage_gb == 36.69
    # And the budget that split came from costs F·n_full + r·S·n_swa per full token.
    assert cfg.cost_per_full_token == full_bytes + 0.8 * swa_bytes == 184_320


def test_plan_gives_a_sliding_window_model_a_smaller_swa_share_when_the_fraction_cannot() -> None:
    # The Gemma 4 boot's own memory (its run journal: `avail mem=66.05 GB, mem usage=47.23 GB`).
    mem = MemoryEstimate(pre_gib=66.05 + 47.23, post_gib=66.05)
    cal = calibrate([], PoolConfig(model=gemma4()))
    cal = cal.model_copy(update={"kind": "exact", "scenarios": (mem,)})
    cfg = PoolConfig(model=gemma4(), max_running_requests=4, context_length=262_144)
    at_default = plan(300_000, cfg, cal, min_headroom_gib=3)
    assert at_default.fits and at_default.recommended_flags == {"--mem-fraction-static": "0.875"}
    # At the default ratio the most the full pool holds with 3 GiB kept is 364,972 tokens (f=0.97).
    assert at_default.predicted_tokens_at_max_safe == 364_972
    far = plan(450_000, cfg, cal, min_headroom_gib=3)
    assert far.fits, far.reasons
    ratio = float(far.recommended_flags["--swa-full-tokens-ratio"])
    assert ratio == 0.6  # the nearest smaller share that reaches it
    swa = {p.pool: p.tokens for p in far.pools}["swa"]
    assert swa == int(far.predicted_tokens_at_recommended * ratio)
    assert "sliding-window pool" in (far.limiting_pool or "")


def test_the_planner_reads_pool_flags_from_a_boots_dump_and_the_command_line() -> None:
    (boot,) = boots("dsv4-flash-mi300x-tp4dp4.log")
    result = plan_restart(
        300_000,
        [command_line_source({"tp_size": 4, "page_size": 256, "swa_full_tokens_ratio": 0.5})],
        [boot],
        model=get_model("deepseek-v4-flash"),
        sglang_version=None,
        latest_fraction=0.88,
    )
    pools = {p.pool: p.tokens for p in result.pools}
    assert pools["swa"] == int(pools["full"] * 0.5) // 256 * 256


# ------------------------------------------------------------------ the 1% target on a classic SWA boot


def gb10_boot():  # type: ignore[no-untyped-def]
    """The Gemma 4 boot on a GB10, its two SGLang lines that its journal's author wrapped rejoined."""
    text = (POOLS / "gemma4-26b-gb10-run-journal.txt").read_text()
    text = text.replace(",\navail mem", ", avail mem").replace("e2e=361.83,\n", "e2e=361.83, ")
    events = parse_text(text)
    (weights,) = [e for e in events if e.kind == "weights_loaded"]
    (pools,) = [e for e in events if e.kind == "swa_pool_allocated"]
    return weights, pools


def test_a_multimodal_boot_keeps_sglang_s_reservation_out_of_the_kv_budget() -> None:
    # 0.5.19+ `mm_runtime_reservation_gb`: 100 MiB, and 1 GiB more for a GPU feature transport
    arch = gemma4().architectures
    assert mm_reserve_gib(arch, "0.5.16", None) == 0.0
    assert mm_reserve_gib(arch, "0.5.23", None) == 100 / 1024
    assert mm_reserve_gib(arch, "0.5.23", "cuda_ipc") == 1124 / 1024
    assert mm_reserve_gib(arch, "0.0.0.dev1+g5f55db35e", "cpu") == 100 / 1024  # a build of main
    assert mm_reserve_gib(qwen35().architectures, "0.5.23", None) == 100 / 1024  # Qwen3.5 is a VLM
    assert mm_reserve_gib(("LlamaForCausalLM",), "0.5.23", "cuda_ipc") == 0.0
    assert sizing_rule_for("0.0.0.dev1+g5f55db35e") == SizingRule.V0_5_14  # was refused as < v0.4
    # a boot's own pool, read back by the calibration, gives the same pool again with the reservation
    cfg = PoolConfig(model=gemma4(), mm_reserve_gib=1124 / 1024)
    mem = MemoryEstimate(pre_gib=113.28, post_gib=66.05)
    sizes = pool_sizes(mem, 0.75, cfg)
    obs = Observation(tokens=sizes.full_tokens, mem_fraction_static=0.75)
    two = calibrate(
        [obs, Observation(tokens=pool_sizes(mem, 0.85, cfg).full_tokens, mem_fraction_static=0.85)], cfg
    )
    assert two.kind == "two_point" and two.predict(0.75, cfg) == sizes.full_tokens


def test_the_gb10_sliding_window_boot_measured_against_its_weights_line() -> None:
    """The Gemma 4 boot on a GB10 (unified memory), predicted from its own weights line and fraction:

    | model | full pool | vs 213,761 |
    |---|---|---|
    | no multimodal reservation (before) | 219,793 | +2.82% |
    | the reservation of this build's default transport (cpu, main from 2026-08-13) | 219,224 | +2.56% |
    | the reservation with the cuda_ipc transport (main's default 2026-08-04..13) | 213,398 | -0.17% |

    The split and bytes are exact (`test_the_sliding_window_split_matches_a_real_swakvpool_line`); what
    the weights line cannot give is the free memory at the moment SGLang sized the pool: on an integrated
    GPU SGLang reads it as the OS's MemAvailable (`get_available_gpu_memory`: `props.is_integrated` →
    `psutil.virtual_memory().available`), so the host's own use between the two lines is taken from the
    budget. The pool implies 65.11 GiB free at sizing where the weights line said 66.05 (0.94 GiB, with
    the 0.10 GiB reservation); which build and transport it ran is not in the published journal."""
    weights, pools = gb10_boot()
    pre, post = weights.avail_mem_gb + weights.mem_usage_gb, weights.avail_mem_gb
    mem = MemoryEstimate(pre_gib=pre, post_gib=post)
    real = pools.full_tokens
    arch = gemma4().architectures
    version = "0.0.0.dev1+g5f55db35e"

    def predicted(transport: str | None, reserve: bool = True) -> int:
        cfg = PoolConfig(
            model=gemma4(), mm_reserve_gib=mm_reserve_gib(arch, version, transport) if reserve else 0.0
        )
        sizes = pool_sizes(mem, 0.75, cfg)
        assert sizes.swa_tokens == int(sizes.full_tokens * 0.8)
        return sizes.full_tokens

    assert predicted(None, reserve=False) == 219_793
    assert predicted(None) == 219_224 and (219_224 - real) / real > 0.01  # outside the target
    assert predicted("cuda_ipc") == 213_398 and abs(213_398 - real) / real < 0.002
    at_sizing = real * gemma4_cost() / GIB + pre * 0.25 + 100 / 1024
    assert round(at_sizing, 2) == 65.11 and round(post - at_sizing, 2) == 0.94


def gemma4_cost() -> float:
    return PoolConfig(model=gemma4()).cost_per_full_token
