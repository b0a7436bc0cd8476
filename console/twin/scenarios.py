"""Scenarios of the simulated SGLang server: the hardware, the model and the twin's hidden constants.

The twin sizes its KV pool the way SGLang v0.5.12.post1 does (`_profile_available_bytes`):

    T = floor(floor((post - pre * (1 - f)) * 2**30) / cell)

where `pre` is the free memory (GiB, min over ranks) after distributed init and `post` the free memory
after the weights are loaded. The console never sees the constants below: it only sees the log lines and
the numbers they carry, exactly as it would on a real host. `console.core.capacity` is deliberately not
used here, so that tests of the planner against the twin are not circular.

A scenario is calibrated for its `default_tp`; other TP sizes are simulated from the same constants
(weights sharded, distributed-init cost scaled with the number of peers) without a calibration promise.
"""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

GIB = 1 << 30
MIB = 1 << 20

DEFAULT_SCENARIO = "kimi-k26-rtx6000"


class DraftModel(BaseModel):
    """An EAGLE-style draft model, loaded after the target (SGLang ≤ v0.5.13 order)."""

    model_config = ConfigDict(frozen=True)

    architecture: str
    weights_bytes_per_rank: int
    k_cell_bytes: int
    """K bytes per token per rank of the draft pool (the V cell is the same; MHA form in the log)."""
    graph_bytes_base: int
    graph_bytes_per_bs: int
    load_s: float


class Scenario(BaseModel):
    """One simulated host: GPUs, model and the hidden memory/timing constants of the twin."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str

    # --- hardware (public: the host engineer shows these before the server starts) ---
    gpu_name: str
    gpu_count: int
    gpu_total_mib: int
    gpu_idle_used_mib: int = 0
    gpu_mem_bandwidth_bytes_s: float
    gpu_uuid_seed: str
    gpu_vendor: Literal["nvidia", "amd"] = "nvidia"
    """Whose tools the twin's host has: nvidia-smi and nvidia-ml-py, or amd-smi (console/twin/amd_smi.py)."""

    # --- model (public) ---
    model_path: str
    architecture: str
    model_type: str
    quant_str: str | None = None
    is_multimodal: bool = False
    attention: Literal["mla", "mha"]
    num_layers: int
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    model_context_len: int
    vocab_size: int
    num_weight_shards: int
    default_tp: int
    attention_backend: str
    eos_token_id: int

    # --- hidden memory constants (bytes) ---
    cuda_context_bytes: tuple[int, ...] = Field(description="per GPU, taken when the process touches it")
    pre_free_bytes: tuple[int, ...] = Field(
        description="per GPU free memory after distributed init at default_tp (the min rank decides)"
    )
    dist_init_extra_bytes_per_peer: int
    weights_replicated_bytes: int
    weights_sharded_bytes: int
    pool_misc_bytes: int
    """Allocator/metadata overhead allocated with the pool (besides the KV buffers and req_to_token)."""
    attn_workspace_bytes: int
    """Attention backend + cuBLAS workspaces allocated between the pool and graph capture."""
    graph_bytes_base: int
    graph_bytes_per_bs: int
    capture_activation_peak_bytes: int
    """Transient activation peak while capturing the largest batch size."""
    capture_reserve_bytes: int
    """Below this much free memory left after graphs + activations, capture runs out of memory."""
    draft: DraftModel | None = None

    # --- hidden timing constants (real seconds; startup timing is multiplied by the time scale) ---
    dist_init_s: float
    weight_load_s: float
    pool_init_s: float
    graph_capture_s_per_bs: float
    http_start_s: float
    prefill_tokens_per_s: float

    # --- hidden decode model (real time; bandwidth-bound attention) ---
    decode_base_s: float
    """Per decode step: weights/MoE reads and launch overhead, independent of depth."""
    kv_read_factor: float
    """How many times the attention kernel reads each KV byte per generated token."""
    attn_bandwidth_efficiency: float
    """Fraction of the memory bandwidth the attention kernel achieves while reading the KV cache."""

    # ------------------------------------------------------------------ derived values
    def kv_cell_bytes(self, tp_size: int, kv_dtype_bytes: int = 2) -> int:
        """KV bytes per token per GPU, as SGLang v0.5.12 computes it (MLA latent is not split by TP)."""
        if self.attention == "mla":
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.num_layers * kv_dtype_bytes
        heads = max(1, self.num_kv_heads // tp_size)
        return heads * (self.head_dim + self.head_dim) * self.num_layers * kv_dtype_bytes

    def gpu_total_bytes(self) -> int:
        return self.gpu_total_mib * MIB

    def weights_bytes_per_rank(self, tp_size: int) -> int:
        return self.weights_replicated_bytes + self.weights_sharded_bytes // tp_size

    def gpu_uuid(self, index: int) -> str:
        return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"k26-twin/{self.gpu_uuid_seed}/{index}"))

    def decode_step_seconds(self, depths: list[int] | tuple[int, ...], tp_size: int | None = None) -> float:
        """Real seconds of one decode step for a batch whose requests sit at these KV depths."""
        cell = self.kv_cell_bytes(tp_size or self.default_tp)
        bandwidth = self.gpu_mem_bandwidth_bytes_s * self.attn_bandwidth_efficiency
        return self.decode_base_s + sum(depths) * cell * self.kv_read_factor / bandwidth

    def decode_tokens_per_s(self, depth: int, tp_size: int | None = None) -> float:
        """Single-request decode speed at a given depth (tokens already in the KV cache)."""
        return 1.0 / self.decode_step_seconds([depth], tp_size)


# ---------------------------------------------------------------------------- the incident host
# 8x RTX PRO 6000 Blackwell Server Edition, 97,887 MiB each. The min rank (GPU 3) has 91,626,680,320 B
# free after distributed init and 20,850,933,760 B after weights; with the MLA cell of 70,272 B that
# gives 101,134 / 192,406 / 218,484 tokens at f = 0.85 / 0.92 / 0.94, as the incident's journal did.
_KIMI_PRE_MIN = 91_626_680_320
_KIMI_WEIGHTS_TP8 = 70_775_746_560
_KIMI_REPLICATED = 3_221_225_472
_KIMI_RANK_EXTRA_FREE = (
    62 * MIB,
    110 * MIB,
    94 * MIB,
    0,
    76 * MIB,
    128 * MIB,
    88 * MIB,
    54 * MIB,
)
_KIMI_CTX = (534 * MIB, 520 * MIB, 520 * MIB, 522 * MIB, 520 * MIB, 520 * MIB, 520 * MIB, 520 * MIB)

_KIMI_COMMON = dict(
    gpu_name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
    gpu_count=8,
    gpu_total_mib=97_887,
    gpu_idle_used_mib=0,
    gpu_mem_bandwidth_bytes_s=1.8e12,
    gpu_uuid_seed="dflash-train",
    model_path="moonshotai/Kimi-K2.6",
    architecture="KimiK25ForConditionalGeneration",
    model_type="kimi_k25",
    quant_str="quant=compressed-tensors",
    is_multimodal=True,
    attention="mla",
    num_layers=61,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    model_context_len=262_144,
    vocab_size=163_840,
    num_weight_shards=64,
    default_tp=8,
    attention_backend="triton",
    eos_token_id=163_586,
    cuda_context_bytes=_KIMI_CTX,
    pre_free_bytes=tuple(_KIMI_PRE_MIN + extra for extra in _KIMI_RANK_EXTRA_FREE),
    dist_init_extra_bytes_per_peer=96 * MIB,
    weights_replicated_bytes=_KIMI_REPLICATED,
    weights_sharded_bytes=(_KIMI_WEIGHTS_TP8 - _KIMI_REPLICATED) * 8,
    pool_misc_bytes=46 * MIB,
    attn_workspace_bytes=362 * MIB,
    graph_bytes_base=82 * MIB,
    graph_bytes_per_bs=3_670_016,
    capture_activation_peak_bytes=int(1.9 * GIB),
    capture_reserve_bytes=512 * MIB,
    draft=DraftModel(
        architecture="LlamaForCausalLMEagle3",
        weights_bytes_per_rank=int(1.31 * GIB),
        k_cell_bytes=1536,
        graph_bytes_base=24 * MIB,
        graph_bytes_per_bs=1_048_576,
        load_s=9.0,
    ),
    dist_init_s=11.8,
    weight_load_s=276.0,
    pool_init_s=0.9,
    graph_capture_s_per_bs=0.55,
    http_start_s=2.5,
    prefill_tokens_per_s=9_000.0,
    decode_base_s=0.025,
    kv_read_factor=2.0,
)

SCENARIO_TABLE: dict[str, Scenario] = {
    "kimi-k26-rtx6000": Scenario(
        name="kimi-k26-rtx6000",
        description=(
            "The incident: Kimi K2.6 at TP 8 on 8x RTX PRO 6000 Blackwell; the MLA decode kernel reads the "
            "KV cache at ~1% of the memory bandwidth, so decode falls to ~0.7 tok/s at 185k depth."
        ),
        attn_bandwidth_efficiency=0.0103,
        **_KIMI_COMMON,  # type: ignore[arg-type]
    ),
    "kimi-k26-rtx6000-healthy": Scenario(
        name="kimi-k26-rtx6000-healthy",
        description="The same host with a healthy attention kernel: tens of tok/s at 185k depth.",
        attn_bandwidth_efficiency=0.6,
        **_KIMI_COMMON,  # type: ignore[arg-type]
    ),
    "llama31-8b-h100": Scenario(
        name="llama31-8b-h100",
        description="Llama-3.1-8B-Instruct (MHA, GQA 8 KV heads) on one H100 80GB HBM3.",
        gpu_name="NVIDIA H100 80GB HBM3",
        gpu_count=1,
        gpu_total_mib=81_559,
        gpu_idle_used_mib=0,
        gpu_mem_bandwidth_bytes_s=3.35e12,
        gpu_uuid_seed="h100-single",
        model_path="meta-llama/Llama-3.1-8B-Instruct",
        architecture="LlamaForCausalLM",
        model_type="llama",
        quant_str=None,
        is_multimodal=False,
        attention="mha",
        num_layers=32,
        num_kv_heads=8,
        head_dim=128,
        model_context_len=131_072,
        vocab_size=128_256,
        num_weight_shards=4,
        default_tp=1,
        attention_backend="fa3",
        eos_token_id=128_009,
        cuda_context_bytes=(512 * MIB,),
        pre_free_bytes=(84_934_574_080,),
        dist_init_extra_bytes_per_peer=64 * MIB,
        weights_replicated_bytes=16_060_522_496,
        weights_sharded_bytes=0,
        pool_misc_bytes=24 * MIB,
        attn_workspace_bytes=288 * MIB,
        graph_bytes_base=64 * MIB,
        graph_bytes_per_bs=2_097_152,
        capture_activation_peak_bytes=int(1.1 * GIB),
        capture_reserve_bytes=384 * MIB,
        draft=None,
        dist_init_s=0.4,
        weight_load_s=7.5,
        pool_init_s=0.3,
        graph_capture_s_per_bs=0.09,
        http_start_s=1.5,
        prefill_tokens_per_s=40_000.0,
        decode_base_s=0.0062,
        kv_read_factor=1.0,
        attn_bandwidth_efficiency=0.7,
    ),
}

ALIASES: dict[str, str] = {"healthy": "kimi-k26-rtx6000-healthy", "llama": "llama31-8b-h100"}

SCENARIOS: tuple[str, ...] = tuple(SCENARIO_TABLE)


class GpuCard(BaseModel):
    """Another card for a scenario's host (`k26-console twin --gpu NAME`): the same model and server on it."""

    model_config = ConfigDict(frozen=True)

    name: str
    """What the vendor's tool names it."""
    vendor: Literal["nvidia", "amd"]
    total_mib: int
    """Memory as the vendor's tool counts it (amd-smi's `total_vram`, MB that are MiB)."""
    bandwidth_bytes_s: float


GPU_CARDS: dict[str, GpuCard] = {
    # 192 GB of HBM3 at 5.3 TB/s (AMD's product page; the card table's figure); 196,592 MiB as amd-smi's
    # total_vram counts it (the MI300X reading of tests/test_gpu_amd.py)
    "mi300x": GpuCard(
        name="AMD Instinct MI300X OAM", vendor="amd", total_mib=196_592, bandwidth_bytes_s=5.3e12
    ),
}
"""The cards `--gpu` may name."""

CARD_SEP = "@"
"""`kimi-k26-rtx6000@mi300x`: a scenario on another card, as the twin's config and the server name it."""


def on_card(scenario: Scenario, card_name: str) -> Scenario:
    """`scenario` on another card: the same model, server and timings; the card's name, memory and
    bandwidth, the free memory after distributed init moved by the difference in memory (the weights, pool
    and graphs then fit as SGLang would size them on the larger card). Not calibrated to a real boot."""
    card = GPU_CARDS[card_name]
    extra = (card.total_mib - scenario.gpu_total_mib) * MIB
    return scenario.model_copy(
        update={
            "name": f"{scenario.name}{CARD_SEP}{card_name}",
            "description": f"{scenario.description} On {card.name} GPUs instead (not calibrated).",
            "gpu_name": card.name,
            "gpu_total_mib": card.total_mib,
            "gpu_mem_bandwidth_bytes_s": card.bandwidth_bytes_s,
            "gpu_uuid_seed": f"{scenario.gpu_uuid_seed}-{card_name}",
            "gpu_vendor": card.vendor,
            "pre_free_bytes": tuple(b + extra for b in scenario.pre_free_bytes),
        }
    )


def get_scenario(name: str | None = None) -> Scenario:
    """The scenario called `name` (or an alias such as `healthy`); the default when None or empty.
    `NAME@CARD` is the scenario on another card (`GPU_CARDS`)."""
    key = name or DEFAULT_SCENARIO
    key, _, card = key.partition(CARD_SEP)
    key = ALIASES.get(key, key) or DEFAULT_SCENARIO
    try:
        scenario = SCENARIO_TABLE[key]
    except KeyError:
        known = ", ".join(list(SCENARIOS) + sorted(ALIASES))
        raise KeyError(f"unknown twin scenario {name!r} (known: {known})") from None
    if not card:
        return scenario
    if card not in GPU_CARDS:
        raise KeyError(f"unknown twin GPU {card!r} (known: {', '.join(GPU_CARDS)})")
    return on_card(scenario, card)
