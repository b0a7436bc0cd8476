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

from console.core.capacity import GIB, MemoryEstimate, PoolConfig, calibrate, pool_sizes
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
