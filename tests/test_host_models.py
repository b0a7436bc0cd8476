"""Capacity from a model's own config.json: GQA, MLA, hybrid linear attention, fp8 KV and draft pools,
checked against the `KV Cache is allocated` lines of real public logs (shared/corpus/public)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from console.core.capacity import GIB
from console.core.models import (
    ModelConfigError,
    ModelSpec,
    draft_cell_bytes,
    get_model,
    model_from_hf_config,
    parse_hf_config,
)

HERE = Path(__file__).resolve().parent
CONFIGS = HERE / "data" / "hf-configs"
TWIN_KIMI = HERE.parent / "console" / "twin" / "data" / "hf-kimi-k2.6" / "config.json"
_KV_LINE = re.compile(
    r"KV Cache is allocated\. (?:dtype: \S+, )?#tokens: (\d+), "
    r"(?:K size: ([\d.]+) GB, V size: ([\d.]+) GB|KV size: ([\d.]+) GB)"
)


def config(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def logged_pool(corpus_dir: Path, case: str) -> tuple[int, float]:
    """(#tokens, K+V GiB) from the case's first `KV Cache is allocated` line."""
    for line in (corpus_dir / "public" / f"{case}.log").read_text().split("\n"):
        m = _KV_LINE.search(line)
        if m:
            tokens = int(m.group(1))
            gib = float(m.group(4)) if m.group(4) else float(m.group(2)) + float(m.group(3))
            return tokens, gib
    raise AssertionError(f"no KV line in {case}")


# case -> (config.json, TP of the attention, INDEX.md's model); each one the model INDEX.md names.
CASES = {
    "case-03": ("meta-llama--Llama-3.1-8B-Instruct", 1, "GQA, 8 KV heads"),
    "case-19": ("Qwen--Qwen3-32B", 4, "GQA, 8 KV heads over TP4"),
    "case-30": ("Qwen--Qwen3-235B-A22B-FP8", 4, "GQA, 4 KV heads at TP4; FP8 weights, bf16 KV"),
    "case-31": ("Qwen--Qwen3-0.6B", 1, "GQA, 8 KV heads"),
    "case-25": ("deepseek-ai--DeepSeek-V3", 2, "MLA, TP not dividing the latent"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_pool_a_config_sizes_is_the_pool_the_log_shows(corpus_dir: Path, case: str) -> None:
    name, tp, _ = CASES[case]
    spec = model_from_hf_config(config(name), name)
    tokens, logged_gib = logged_pool(corpus_dir, case)
    predicted_gib = tokens * spec.cell_bytes(tp=tp) / GIB
    # The log prints each buffer with two decimals: within that rounding, and within 0.5 % wherever the
    # rounding itself is smaller than that (every pool here but case-25's 0.65 GB).
    assert abs(predicted_gib - logged_gib) <= 0.01
    if logged_gib > 2.0:
        assert abs(predicted_gib - logged_gib) / logged_gib < 0.005


def test_kimi_k25_on_mi355x_from_the_nested_text_config(corpus_dir: Path) -> None:
    spec = parse_hf_config(TWIN_KIMI.read_text(), "moonshotai/Kimi-K2.6")
    assert spec.attention == "mla" and spec.num_layers == 61 and spec.context_length == 262144
    assert spec.architectures == ("KimiK25ForConditionalGeneration",) and spec.model_type == "kimi_k25"
    assert spec.cell_bytes(tp=8) == get_model("kimi-k2.6").cell_bytes(tp=8) == 70_272
    tokens, logged_gib = logged_pool(corpus_dir, "case-01")  # Kimi K2.5, TP8: KV size 160.63 GB
    assert abs(tokens * spec.cell_bytes(tp=8) / GIB - logged_gib) / logged_gib < 0.005


def test_fp8_kv_halves_the_cell_whether_asked_or_declared() -> None:
    v3 = model_from_hf_config(config("deepseek-ai--DeepSeek-V3"))
    assert v3.cell_bytes(tp=8) == 70_272 and v3.cell_bytes(tp=8, kv_cache_dtype="fp8_e4m3") == 35_136
    # FP8 *weights* (quant_method fp8) leave the KV in bf16; only kv_cache_quant_algo makes it FP8.
    declared = config("deepseek-ai--DeepSeek-V3")
    declared["quantization_config"]["kv_cache_quant_algo"] = "FP8"
    assert model_from_hf_config(declared).cell_bytes(tp=8) == 35_136
    qwen = model_from_hf_config(config("Qwen--Qwen3-235B-A22B-FP8"))
    assert qwen.kv_dtype_bytes is None and qwen.cell_bytes(tp=4) == 128 * 2 * 94 * 2


def test_hybrid_linear_attention_counts_only_full_layers_and_sizes_the_state() -> None:
    spec = model_from_hf_config(config("Qwen--Qwen3-Next-80B-A3B-Instruct"))
    # full_attention_interval 4 over 48 layers: layers 3, 7, ..., 47 hold KV; 36 keep a state.
    assert (spec.num_layers, spec.linear_layers) == (12, 36) and spec.hybrid
    # 2 KV heads at TP4 -> SGLang keeps max(1, 2 // 4) = 1 per rank; head_dim 256 for K and V.
    assert spec.cell_bytes(tp=4) == 1 * (256 + 256) * 12 * 2
    # SGLang's Mamba2StateShape (srt/configs/mamba_utils.py): conv (conv_dim/tp, kernel-1) in bf16,
    # temporal (heads/tp, head_dim, state) in float32; conv_dim = 128*32 + 2*16*128 = 8192.
    per_layer_tp4 = (8192 // 4) * 3 * 2 + (32 // 4) * 128 * 128 * 4
    assert spec.state_bytes_per_request(tp=4) == per_layer_tp4 * 36
    per_layer_tp1 = 8192 * 3 * 2 + 32 * 128 * 128 * 4
    assert spec.state_bytes_per_request(tp=1) == per_layer_tp1 * 36
    bf16_state = {**config("Qwen--Qwen3-Next-80B-A3B-Instruct"), "mamba_ssm_dtype": "bfloat16"}
    assert (
        model_from_hf_config(bf16_state).state_bytes_per_request(tp=1)
        == (8192 * 3 * 2 + 32 * 128 * 128 * 2) * 36
    )


def test_hybrid_from_layer_types_as_granite_4_h_writes_them() -> None:
    # GraniteMoeHybrid's keys (SGLang srt/configs/granitemoehybrid.py): layer_types of "mamba" and
    # "attention", the mamba_* shape, intermediate = mamba_expand * hidden_size.
    layer_types = ["mamba"] * 40
    for i in (5, 15, 25, 35):
        layer_types[i] = "attention"
    cfg = {
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "model_type": "granitemoehybrid",
        "hidden_size": 1536,
        "num_hidden_layers": 40,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "layer_types": layer_types,
        "mamba_n_heads": 48,
        "mamba_d_head": 64,
        "mamba_d_state": 128,
        "mamba_n_groups": 1,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
    }
    spec = model_from_hf_config(cfg)
    assert (spec.num_layers, spec.linear_layers) == (4, 36)
    assert spec.cell_bytes(tp=1) == 4 * (128 + 128) * 4 * 2
    # n_groups 1 at TP2 is replicated to 2 groups: conv_dim = 3072 + 2*2*128 = 3584
    assert spec.state_bytes_per_request(tp=2) == ((3584 // 2) * 3 * 2 + 24 * 64 * 128 * 4) * 36


def test_sliding_layers_are_a_pool_of_their_own_only_where_sglang_keeps_one() -> None:
    # SGLang keeps sliding-window layers apart only for the hybrid-SWA architectures (GPT-OSS, MiMo-V2,
    # Step-3.5, Gemma 4); any other model's sliding layers sit in the one full pool.
    cfg = {**config("Qwen--Qwen3-32B"), "layer_types": ["sliding_attention", "full_attention"] * 32}
    plain = model_from_hf_config(cfg)
    assert (plain.num_layers, plain.swa_layers) == (64, 0)
    swa = model_from_hf_config({**cfg, "architectures": ["GptOssForCausalLM"]})
    assert (swa.num_layers, swa.swa_layers, swa.sliding_window) == (32, 32, True)
    assert swa.swa_layer_bytes(tp=1) == swa.layer_bytes(tp=1) == 8 * (128 + 128) * 2


def test_layers_the_model_does_not_size_are_refused_in_one_sentence() -> None:
    cfg = {**config("Qwen--Qwen3-32B"), "layer_types": ["chunked_attention", "full_attention"] * 32}
    with pytest.raises(ModelConfigError, match=r"chunked_attention layers, which SGLang keeps in a pool"):
        model_from_hf_config(cfg)
    with pytest.raises(ModelConfigError, match="no 'num_hidden_layers'"):
        model_from_hf_config({"architectures": ["X"]})
    with pytest.raises(ModelConfigError, match="not valid JSON"):
        parse_hf_config('{"num_hidden_layers": ')
    with pytest.raises(ModelConfigError, match="nests too deeply"):
        parse_hf_config("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ModelConfigError, match="num_hidden_layers=-1"):
        model_from_hf_config({**config("Qwen--Qwen3-0.6B"), "num_hidden_layers": -1})


def test_plain_layer_types_all_full_attention_are_a_plain_model() -> None:
    cfg = {**config("Qwen--Qwen3-0.6B"), "layer_types": ["full_attention"] * 28}
    assert model_from_hf_config(cfg) == model_from_hf_config(config("Qwen--Qwen3-0.6B"))


def test_draft_pools() -> None:
    v3 = model_from_hf_config(config("deepseek-ai--DeepSeek-V3"))
    # NEXTN without a draft path: the target's own MLA layer, num_nextn_predict_layers (1) of them.
    assert draft_cell_bytes(v3, None, "NEXTN", tp=8) == 1_152
    assert draft_cell_bytes(v3, None, "nextn", tp=8, kv_cache_dtype="fp8_e4m3") == 576
    # A Llama-style EAGLE3 head for Kimi (TorchSpec kimi_k25_eagle3.json, sglang.md §7): 1 layer, 64 KV
    # heads of 128 -> 8 per rank at TP8 -> 8 * 256 * 2 = 4,096 B/token/rank.
    eagle = ModelSpec(
        name="eagle3", attention="mha", num_layers=1, num_kv_heads=64, head_dim=128, v_head_dim=128
    )
    kimi = get_model("kimi-k2.6")
    assert draft_cell_bytes(kimi, eagle, "EAGLE3", tp=8) == 4_096
    assert draft_cell_bytes(kimi, None, None, tp=8) == 0
    assert draft_cell_bytes(kimi, None, "NGRAM", tp=8) == 0
    with pytest.raises(ModelConfigError, match=r"needs its own config\.json"):
        draft_cell_bytes(kimi, None, "EAGLE3", tp=8)
