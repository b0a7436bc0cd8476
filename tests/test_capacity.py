"""The capacity model on the incident's numbers and on the arithmetic of SGLang's sizing code."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from console.core.capacity import (
    GIB,
    CapacityError,
    MemoryEstimate,
    Observation,
    PoolConfig,
    SizingRule,
    Speculative,
    calibrate,
    default_max_running_requests,
    pool_tokens,
    req_to_token_bytes,
    resolve_max_running_requests,
    sizing_rule_for,
)
from console.core.capacity_plan import plan
from console.core.models import (
    CATALOGUE,
    ModelConfigError,
    ModelSpec,
    get_model,
    model_from_hf_config,
    parse_hf_config,
)

# The incident: 8x RTX PRO 6000 Blackwell (97,887 MiB), Kimi K2.6, TP8, ctx 200,000.
INCIDENT = [(0.85, 101_134), (0.92, 192_406), (0.94, 218_484)]
GPU_GIB = 97_887 / 1024
KIMI = PoolConfig(model=get_model("kimi-k2.6"), tp=8)


def lsq_line(points: list[tuple[float, int]]) -> tuple[float, float]:
    n = len(points)
    mx = sum(f for f, _ in points) / n
    my = sum(t for _, t in points) / n
    slope = sum((f - mx) * (t - my) for f, t in points) / sum((f - mx) ** 2 for f, _ in points)
    return slope, my - slope * mx


def obs(f: float, tokens: int, **kw: object) -> Observation:
    return Observation(tokens=tokens, mem_fraction_static=f, **kw)


# ---------------------------------------------------------------- cell bytes


def test_mla_cell_is_70272_bytes_and_not_divided_by_tp() -> None:
    for name in ("kimi-k2.6", "kimi-k2.5", "kimi-k2", "deepseek-v3", "deepseek-r1"):
        spec = get_model(name)
        assert spec.cell_bytes(tp=1) == 70_272
        assert spec.cell_bytes(tp=8) == 70_272
        assert spec.cell_bytes(tp=8, kv_cache_dtype="fp8_e4m3") == 35_136


@pytest.mark.parametrize(
    ("name", "tp", "tokens", "k_size_gb"),
    [
        # public `KV Cache is allocated` lines: K size = tokens · (kv_heads/tp · head_dim · layers · 2 B)
        ("llama-3.1-8b", 1, 38_141, 2.33),  # case-03
        ("llama-3.1-70b", 8, 2_795_207, 53.31),  # case-17
        ("qwen3-32b", 4, 2_206_208, 67.33),  # case-19
        ("qwen3-0.6b", 1, 15_387, 0.82),  # case-31
    ],
)
def test_mha_cell_matches_public_kv_lines(name: str, tp: int, tokens: int, k_size_gb: float) -> None:
    cell = get_model(name).cell_bytes(tp=tp)
    assert round(tokens * (cell / 2) / GIB, 2) == k_size_gb


def test_mha_kv_heads_per_rank_floor_at_one() -> None:
    spec = get_model("llama-3.1-8b")  # 8 KV heads
    assert spec.kv_heads_per_rank(16) == 1
    assert spec.cell_bytes(tp=16) == spec.cell_bytes(tp=8) == 1 * 256 * 32 * 2


def test_v0_5_14_adds_draft_layers_to_the_cell_for_eagle_only() -> None:
    spec = get_model("kimi-k2.6")
    eagle = Speculative(algorithm="EAGLE3", draft_layers=1)
    new = PoolConfig(model=spec, rule=SizingRule.V0_5_14, speculative=eagle)
    old = PoolConfig(model=spec, rule=SizingRule.V0_5_7, speculative=eagle)
    assert new.cell_bytes == 70_272 + int(70_272 / 61) == 71_424
    assert old.cell_bytes == 70_272
    ngram = PoolConfig(model=spec, rule=SizingRule.V0_5_14, speculative=Speculative(algorithm="NGRAM"))
    assert ngram.cell_bytes == 70_272


@pytest.mark.parametrize(
    ("version", "rule"),
    [
        ("0.4.6.post2", SizingRule.LEGACY),
        ("v0.5.6", SizingRule.LEGACY),
        ("0.5.7", SizingRule.V0_5_7),
        ("0.5.12.post1", SizingRule.V0_5_7),
        ("v0.5.13.post2", SizingRule.V0_5_7),
        ("0.5.14", SizingRule.V0_5_14),
        ("0.5.23", SizingRule.V0_5_14),
        (None, SizingRule.V0_5_7),
    ],
)
def test_sizing_rule_by_version(version: str | None, rule: SizingRule) -> None:
    assert sizing_rule_for(version) is rule


def test_unreadable_or_too_old_version_is_refused() -> None:
    with pytest.raises(CapacityError):
        sizing_rule_for("latest")
    with pytest.raises(CapacityError):
        sizing_rule_for("0.3.0")


# ---------------------------------------------------------------- the pool formula


def test_pool_formula_floors_aligns_and_caps() -> None:
    mem = MemoryEstimate(pre_gib=85.0, post_gib=20.0)
    rest = 20.0 - 85.0 * 0.1
    expected = int(rest * GIB) // 70_272
    assert pool_tokens(mem, 0.9, KIMI) == expected
    paged = KIMI.model_copy(update={"page_size": 64})
    assert pool_tokens(mem, 0.9, paged) == expected // 64 * 64
    capped = KIMI.model_copy(update={"max_total_tokens": 10_000})
    assert pool_tokens(mem, 0.9, capped) == 10_000
    assert pool_tokens(mem, 0.2, KIMI) == 0  # post < pre·(1−f): nothing fits


def test_context_length_and_max_running_requests_do_not_enter_the_pool() -> None:
    mem = MemoryEstimate(pre_gib=85.33, post_gib=19.42)
    base = pool_tokens(mem, 0.85, KIMI)
    for update in ({"context_length": 8_192}, {"context_length": 262_144}, {"max_running_requests": 8}):
        assert pool_tokens(mem, 0.85, KIMI.model_copy(update=update)) == base


def test_legacy_rule_adds_the_eagle_headroom_tokens() -> None:
    spec = Speculative(algorithm="EAGLE", num_steps=3, eagle_topk=1, num_draft_tokens=4)
    mem = MemoryEstimate(pre_gib=85.33, post_gib=19.42)
    legacy = PoolConfig(
        model=get_model("kimi-k2.6"),
        rule=SizingRule.LEGACY,
        speculative=spec,
        max_running_requests=64,
        context_length=200_000,
    )
    current = legacy.model_copy(update={"rule": SizingRule.V0_5_7})
    assert pool_tokens(mem, 0.85, legacy) - pool_tokens(mem, 0.85, current) == 64 * 3 + 64 * 4 + 100


def test_req_to_token_table_and_default_request_slots() -> None:
    assert req_to_token_bytes(8, 200_000) == 9 * 200_004 * 4
    assert req_to_token_bytes(4096, 200_000, draft_tokens=5) == 4097 * 200_009 * 4
    assert default_max_running_requests(200_000, 200_000) == 2048
    assert default_max_running_requests(10_000_000, 8_192) == 4096
    cfg = KIMI.model_copy(update={"context_length": 200_000})
    assert resolve_max_running_requests(218_484, cfg) == 2048
    assert resolve_max_running_requests(218_484, cfg.model_copy(update={"max_running_requests": 8})) == 8
    assert resolve_max_running_requests(3_000, cfg) == 1_500  # never more slots than T // 2


# ---------------------------------------------------------------- the incident


def test_two_point_calibration_predicts_the_third_boot_within_0_1_percent() -> None:
    cal = calibrate([obs(*INCIDENT[0]), obs(*INCIDENT[1])], KIMI)
    assert cal.kind == "two_point"
    predicted = cal.predict(0.94, KIMI)
    assert predicted is not None
    assert abs(predicted - 218_484) / 218_484 < 0.001
    # the fit recovers the memory the line implies (reference §4.6: pre ≈ 85.33 GiB, post ≈ 19.42 GiB)
    (mem,) = cal.scenarios
    assert mem.pre_gib == pytest.approx(85.33, abs=0.02)
    assert mem.post_gib == pytest.approx(19.42, abs=0.02)


def test_three_boots_reproduce_the_observations_to_one_token() -> None:
    cal = calibrate([obs(f, t) for f, t in INCIDENT], KIMI)
    for f, tokens in INCIDENT:
        assert abs((cal.predict(f, KIMI) or 0) - tokens) <= 1


def test_one_boot_band_plan_holds_200k_by_the_line_with_3_gib_headroom() -> None:
    cal = calibrate([obs(*INCIDENT[0])], KIMI, gpu_mem_gib=GPU_GIB)
    assert cal.kind == "band"
    assert cal.pre_range_gib == pytest.approx((0.8 * GPU_GIB, GPU_GIB))
    result = plan(200_000, KIMI, cal, mem_fraction_static=0.85)
    assert result.fits
    assert result.predicted_max_total_num_tokens == 101_134
    f = result.recommended_mem_fraction_static
    assert f is not None
    assert round(f / 0.005, 9).is_integer()

    # Judge the recommendation by the line through all three real boots, not by the plan's own model.
    slope, intercept = lsq_line(INCIDENT)
    assert slope * f + intercept >= 200_000
    pre_by_line = slope * KIMI.cell_bytes / GIB
    table = result.req_to_token_gib_at_recommended
    assert table is not None
    assert pre_by_line * (1 - f) - table >= 3.0
    # ... and it is one restart: the smallest such fraction on the grid is not far below the recommendation.
    assert slope * (f - 0.015) + intercept < 200_000
    assert result.headroom_gib_at_recommended is not None and result.headroom_gib_at_recommended >= 3.0


def test_band_predicts_pessimistically_below_the_observed_fraction_too() -> None:
    cal = calibrate([obs(*INCIDENT[0])], KIMI, gpu_mem_gib=GPU_GIB)
    lo, hi = cal.scenarios
    # below f0 the larger pre shrinks the pool faster, so the pessimistic answer switches scenario
    assert cal.predict(0.80, KIMI) == pool_tokens(hi, 0.80, KIMI) < pool_tokens(lo, 0.80, KIMI)
    assert cal.predict(0.94, KIMI) == pool_tokens(lo, 0.94, KIMI) < pool_tokens(hi, 0.94, KIMI)


def test_two_point_plan_on_the_incident() -> None:
    cal = calibrate([obs(*INCIDENT[0]), obs(*INCIDENT[1])], KIMI)
    result = plan(200_000, KIMI.model_copy(update={"max_running_requests": 8}), cal, mem_fraction_static=0.92)
    assert result.fits and result.calibration == "two_point"
    assert result.recommended_mem_fraction_static == 0.93  # 0.925 gives 199,0xx
    assert result.predicted_tokens_at_recommended is not None
    assert 200_000 <= result.predicted_tokens_at_recommended < 206_000
    assert result.predicted_max_total_num_tokens == 192_406


def test_capped_boots_do_not_calibrate() -> None:
    cal = calibrate([obs(0.9, 10_000, capped=True)], KIMI, gpu_mem_gib=47.0)
    assert cal.kind == "none"
    result = plan(200_000, KIMI, cal)
    assert not result.fits and result.recommended_mem_fraction_static is None and result.reasons


def test_exact_calibration_wins_and_checks_itself() -> None:
    o = obs(0.85, 101_134, pre_gib=85.33, post_gib=19.42, available_gpu_mem_gb=10.0)
    cal = calibrate([obs(0.5, 1), o], KIMI)
    assert cal.kind == "exact"
    result = plan(200_000, KIMI, cal, mem_fraction_static=0.85)
    assert any(n.startswith("check: at the boot's f=0.85") for n in result.notes)
    assert any("took about" in n for n in result.notes)


# ---------------------------------------------------------------- the planner's refusals


def test_planner_refuses_when_the_headroom_would_be_too_thin() -> None:
    cal = calibrate([obs(*INCIDENT[0]), obs(*INCIDENT[1])], KIMI)
    result = plan(250_000, KIMI, cal, mem_fraction_static=0.94)
    assert not result.fits
    assert result.recommended_mem_fraction_static is None
    assert result.max_safe_mem_fraction_static is not None
    assert result.predicted_tokens_at_max_safe is not None and result.predicted_tokens_at_max_safe < 250_000
    text = " ".join(result.alternatives)
    assert "fp8" in text and "more GPUs" in text and "layers per GPU" in text
    # a laxer headroom accepts what the default refuses
    lax = plan(250_000, KIMI.model_copy(update={"max_running_requests": 8}), cal, min_headroom_gib=0.5)
    assert lax.fits and lax.headroom_gib_at_recommended is not None and lax.headroom_gib_at_recommended >= 0.5


def test_planner_refuses_a_max_total_tokens_cap_below_the_target() -> None:
    cal = calibrate([obs(*INCIDENT[0]), obs(*INCIDENT[1])], KIMI)
    result = plan(200_000, KIMI.model_copy(update={"max_total_tokens": 150_000}), cal)
    assert not result.fits
    assert any("--max-total-tokens 150,000 caps" in r for r in result.reasons)


def test_planner_explains_the_knobs() -> None:
    cal = calibrate([obs(*INCIDENT[0]), obs(*INCIDENT[1])], KIMI)
    notes = plan(200_000, KIMI, cal).notes
    assert any("--context-length" in n and "does not grow the pool" in n for n in notes)
    assert any("--max-running-requests does not enter the pool size" in n for n in notes)
    assert any("--mem-fraction-static: every +0.01" in n for n in notes)


@pytest.mark.parametrize("f", [0.0, 1.0, -0.2, 1.5, float("nan")])
def test_fraction_outside_0_1_is_refused(f: float) -> None:
    cal = calibrate([obs(*INCIDENT[0]), obs(*INCIDENT[1])], KIMI)
    with pytest.raises(CapacityError, match="strictly between 0 and 1"):
        plan(200_000, KIMI, cal, mem_fraction_static=f)


# ---------------------------------------------------------------- models and config.json


def test_unknown_model_is_one_sentence() -> None:
    with pytest.raises(ModelConfigError) as info:
        get_model("gpt-5")
    message = str(info.value)
    assert "unknown model 'gpt-5'" in message and "\n" not in message
    assert "kimi-k2.6" in message


def test_catalogue_lookup_by_alias_and_hf_id() -> None:
    assert get_model("Kimi-K2.6").name == "kimi-k2.6"
    assert get_model("moonshotai/Kimi-K2.6").name == "kimi-k2.6"
    assert get_model("deepseek-ai/DeepSeek-R1").name == "deepseek-r1"
    assert {"kimi-k2.6", "deepseek-v3", "deepseek-r1", "llama-3.1-8b", "llama-3.1-70b", "qwen3-32b"} <= set(
        CATALOGUE
    )


KIMI_K26_CONFIG = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "vision_config": {"num_hidden_layers": 27, "hidden_size": 1152},
    "text_config": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        "num_hidden_layers": 61,
        "hidden_size": 7168,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "compressed-tensors"},
    },
}


def test_hf_config_with_nested_text_config_is_mla() -> None:
    spec = parse_hf_config(json.dumps(KIMI_K26_CONFIG))
    assert spec.attention == "mla"
    assert spec.cell_bytes(tp=8) == 70_272


def test_hf_config_mha_uses_tp() -> None:
    qwen3_32b = {
        "architectures": ["Qwen3ForCausalLM"],
        "num_hidden_layers": 64,
        "hidden_size": 5120,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "torch_dtype": "bfloat16",
    }
    spec = model_from_hf_config(qwen3_32b)
    assert spec.cell_bytes(tp=4) == get_model("qwen3-32b").cell_bytes(tp=4) == 2 * 256 * 64 * 2
    llama_like = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32}
    assert model_from_hf_config(llama_like).cell_bytes(tp=1) == 32 * 256 * 32 * 2  # no GQA, derived head_dim


def test_hf_config_declaring_fp8_kv_halves_the_auto_cell() -> None:
    cfg = json.loads(json.dumps(KIMI_K26_CONFIG))
    cfg["text_config"]["quantization_config"]["kv_cache_quant_algo"] = "FP8"
    assert parse_hf_config(json.dumps(cfg)).cell_bytes() == 35_136


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[1, 2]",
        json.dumps({"hidden_size": 4096}),
        json.dumps({"num_hidden_layers": "many", "num_attention_heads": 8}),
        json.dumps({"num_hidden_layers": 0, "kv_lora_rank": 512, "qk_rope_head_dim": 64}),
        json.dumps({"num_hidden_layers": 4, "kv_lora_rank": 512}),
    ],
)
def test_malformed_config_json_is_one_sentence(text: str) -> None:
    with pytest.raises(ModelConfigError) as info:
        parse_hf_config(text)
    assert "\n" not in str(info.value)
    assert str(info.value).endswith(".") or str(info.value).endswith(").")


def test_unknown_kv_dtype_is_refused() -> None:
    with pytest.raises(ModelConfigError, match="not modelled"):
        get_model("kimi-k2.6").cell_bytes(kv_cache_dtype="fp4_e2m1")


def test_every_catalogue_entry_is_a_valid_model_spec() -> None:
    """The catalogue's entries are built without validation (validating them built `ModelSpec`'s schema in
    every command that imports the catalogue): each one validates as it stands, to the same spec. The
    control: an entry with no layers is refused."""
    for name, spec in CATALOGUE.items():
        assert ModelSpec.model_validate(spec.model_dump()) == spec, name
    with pytest.raises(ValueError, match="num_layers must be positive"):
        ModelSpec.model_validate({**CATALOGUE["kimi-k2.6"].model_dump(), "num_layers": 0})


def test_importing_the_catalogue_builds_no_schema() -> None:
    """`verify HOST` validates no model spec of its own: importing the catalogue must not build the schema."""
    code = "import console.core.models as m; print(m.ModelSpec.__pydantic_complete__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
