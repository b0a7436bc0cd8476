"""Model architecture facts that size the KV cache: a Hugging Face `config.json` reader and a small
bundled catalogue (the fallback when the host's own config.json cannot be read).

Only what enters SGLang's bytes-per-token ("cell") and its per-request state is kept: the attention
kind, the layers that hold KV, and either the MLA latent widths (`kv_lora_rank`, `qk_rope_head_dim`) or
the MHA/GQA head shape (`num_key_value_heads`, `head_dim`, `v_head_dim`); for hybrid models (Qwen3-Next
/ Qwen3.5 linear attention, granite-4.0-h mamba layers) the layers that keep a recurrent state instead
and that state's shape. See `docs/capacity-model.md`.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

KvCacheDtype = Literal["auto", "bf16", "bfloat16", "float16", "fp16", "fp8_e4m3", "fp8_e5m2", "mxfp8"]
KV_CACHE_DTYPES: tuple[str, ...] = (
    "auto",
    "bf16",
    "bfloat16",
    "float16",
    "fp16",
    "fp8_e4m3",
    "fp8_e5m2",
    "mxfp8",
)
_KV_DTYPE_BYTES = {
    "bf16": 2,
    "bfloat16": 2,
    "float16": 2,
    "fp16": 2,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "mxfp8": 1,
    # The torch names SGLang prints in its KV lines; MI300X's fp8 is the `fnuz` variant, one byte too.
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "torch.float8_e4m3fn": 1,
    "torch.float8_e4m3fnuz": 1,
    "torch.float8_e5m2": 1,
    "torch.bfloat16": 2,
}
_TORCH_DTYPE_BYTES = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 4,
    "float": 4,
    "float8_e4m3fn": 1,
}


class ModelConfigError(ValueError):
    """A model name or config.json the console cannot use; the message is one sentence."""


_STATE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_FULL_LAYER_TYPES = frozenset({"full_attention", "attention"})
_LINEAR_LAYER_TYPES = frozenset({"linear_attention", "mamba", "mamba2"})
_SWA_LAYER_TYPES = frozenset({"sliding_attention", "sliding_window_attention", "swa"})
HYBRID_SWA_ARCHITECTURES = frozenset(
    {
        "GptOssForCausalLM",
        "MiMoV2FlashForCausalLM",
        "Step3p5ForCausalLM",
        "Gemma4ForCausalLM",
        "Gemma4ForConditionalGeneration",
        "Gemma4UnifiedForConditionalGeneration",
    }
)
"""The architectures whose sliding-window layers SGLang keeps in a pool of their own (v0.5.9
`configs/model_config.py` `is_hybrid_swa_model`; Gemma 4 joined later, and its unified form is in 0.5.23's
list). Any other model's sliding layers sit in the one full pool (SGLang sets `disable_hybrid_swa_memory`
for Gemma 2/3 and Olmo), so they are counted as full layers here."""


class LinearStateShape(BaseModel, defer_build=True):
    """The recurrent state one linear-attention/mamba layer keeps per request: SGLang's
    `Mamba2StateShape` (srt/configs/mamba_utils.py), a conv window and an SSM state."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    intermediate_size: int
    n_groups: int
    num_heads: int
    head_dim: int
    state_size: int
    conv_kernel: int
    conv_dtype_bytes: int = 2
    """bf16 unless SGLANG_MAMBA_CONV_DTYPE says otherwise."""
    ssm_dtype_bytes: int = 4
    """float32 unless the config's `mamba_ssm_dtype` (or SGLANG_MAMBA_SSM_DTYPE) says otherwise."""

    def bytes_per_layer(self, tp: int = 1) -> int:
        """One layer's state for one request on one GPU (`mamba_cache_per_req / len(layers)`)."""
        tp = max(1, tp)
        groups = self.n_groups
        if groups % tp:
            groups += tp - groups  # SGLang replicates the groups so each head shard keeps its own
        conv_dim = self.intermediate_size + 2 * groups * self.state_size
        conv = (conv_dim // tp) * (self.conv_kernel - 1) * self.conv_dtype_bytes
        ssm = (self.num_heads // tp) * self.head_dim * self.state_size * self.ssm_dtype_bytes
        return conv + ssm


class ModelSpec(BaseModel, defer_build=True):
    """The architecture facts that size SGLang's KV pool for one model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    attention: Literal["mla", "mha"]
    num_layers: int
    """Layers that hold KV in the target model (`num_hidden_layers`)."""
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    v_head_dim: int | None = None
    dtype_bytes: int = 2
    """Bytes per element of the model dtype; `--kv-cache-dtype auto` stores KV in it."""
    kv_dtype_bytes: int | None = None
    """Set when the checkpoint declares its own KV quantisation (`kv_cache_quant_algo: FP8`)."""
    nextn_layers: int = 0
    """`num_nextn_predict_layers`: the MTP draft layers the checkpoint ships (DeepSeek-V3: 1)."""
    hf_ids: tuple[str, ...] = ()
    architectures: tuple[str, ...] = ()
    model_type: str | None = None
    linear_layers: int = 0
    """Hybrid models: the layers that keep a recurrent state instead of KV (they are not in `num_layers`)."""
    linear_state: LinearStateShape | None = None
    context_length: int | None = None
    """`max_position_embeddings`: what SGLang takes as the context length when none is given."""
    swa_layers: int = 0
    """Sliding-window layers SGLang keeps in a pool of their own (not in `num_layers`)."""
    swa_num_kv_heads: int | None = None
    swa_head_dim: int | None = None
    swa_v_head_dim: int | None = None
    dsv4: bool = False
    """DeepSeek-V4: its pools (full, SWA, c4, c128, their states, the indexer) cost `bytes_per_full_token`,
    which SGLang prints and the capacity model takes from the journal (it differs by build: fp8 or bf16
    unified KV, speculative draft)."""

    @property
    def hybrid(self) -> bool:
        return self.linear_layers > 0

    @property
    def sliding_window(self) -> bool:
        return self.swa_layers > 0

    def swa_layer_bytes(self, *, tp: int = 1, kv_cache_dtype: str = "auto") -> int:
        """KV bytes per token for ONE sliding-window layer on one GPU (SGLang's `_swa_per_token`)."""
        elem = self.kv_element_bytes(kv_cache_dtype)
        heads = max(1, (self.swa_num_kv_heads or self.num_kv_heads or 1) // max(1, tp))
        head_dim = self.swa_head_dim or self.head_dim or 0
        v_head_dim = self.swa_v_head_dim or head_dim
        return heads * (head_dim + v_head_dim) * elem

    def state_bytes_per_request(self, tp: int = 1) -> int:
        """The recurrent state of one request on one GPU (SGLang's `mamba_cache_per_req`); 0 without one."""
        if self.linear_state is None:
            return 0
        return self.linear_state.bytes_per_layer(tp) * self.linear_layers

    @model_validator(mode="after")
    def _complete(self) -> ModelSpec:
        if self.num_layers <= 0:
            raise ValueError("num_layers must be positive")
        if self.attention == "mla":
            if not self.kv_lora_rank or self.qk_rope_head_dim is None:
                raise ValueError("an MLA model needs kv_lora_rank and qk_rope_head_dim")
        elif not self.num_kv_heads or not self.head_dim:
            raise ValueError("an MHA model needs num_kv_heads and head_dim")
        if self.linear_layers and self.linear_state is None:
            raise ValueError("a hybrid model needs the shape of its linear-attention state")
        return self

    def kv_element_bytes(self, kv_cache_dtype: str = "auto") -> int:
        if kv_cache_dtype == "auto":
            return self.kv_dtype_bytes or self.dtype_bytes
        try:
            return _KV_DTYPE_BYTES[kv_cache_dtype]
        except KeyError:
            raise ModelConfigError(
                f"the KV cache dtype {kv_cache_dtype!r} is not modelled; use one of {', '.join(KV_CACHE_DTYPES)}."
            ) from None

    def kv_heads_per_rank(self, tp: int) -> int:
        """SGLang's `get_num_kv_heads(tp) = max(1, total_kv_heads // tp)`."""
        return max(1, (self.num_kv_heads or 1) // max(1, tp))

    def layer_bytes(self, *, tp: int = 1, kv_cache_dtype: str = "auto") -> int:
        """KV bytes per token for ONE layer on one GPU."""
        elem = self.kv_element_bytes(kv_cache_dtype)
        if self.attention == "mla":
            # MLA keeps the whole latent on every TP rank: not divided by TP.
            return ((self.kv_lora_rank or 0) + (self.qk_rope_head_dim or 0)) * elem
        head_dim = self.head_dim or 0
        v_head_dim = self.v_head_dim if self.v_head_dim is not None else head_dim
        return self.kv_heads_per_rank(tp) * (head_dim + v_head_dim) * elem

    def cell_bytes(self, *, tp: int = 1, kv_cache_dtype: str = "auto", layers: int | None = None) -> int:
        """KV bytes per token per GPU of the target model (SGLang's cell size, without draft layers)."""
        return self.layer_bytes(tp=tp, kv_cache_dtype=kv_cache_dtype) * (layers or self.num_layers)


_DRAFT_POOL_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE"})
"""The speculative algorithms whose draft worker keeps a KV pool of its own (capacity.EAGLE_FAMILY)."""


def draft_cell_bytes(
    target: ModelSpec,
    draft: ModelSpec | None,
    algorithm: str | None,
    *,
    tp: int = 1,
    kv_cache_dtype: str = "auto",
) -> int:
    """KV bytes per token per GPU of the draft worker's own pool (same token count as the target's).

    An EAGLE/EAGLE3/STANDALONE draft with a config of its own sizes its pool from that config (a
    Llama-style EAGLE3 head is MHA, `kimi-k2.5-eagle3-mla` is MLA); NEXTN (MTP) without a draft path uses
    the target's own per-layer shape for its `num_nextn_predict_layers` (1 when the config says 0). No
    algorithm, or one without a KV pool of its own (NGRAM), costs nothing.
    """
    algo = (algorithm or "").upper()
    if algo not in _DRAFT_POOL_ALGORITHMS:
        return 0
    if draft is not None:
        layers = draft.nextn_layers if draft.nextn_layers and algo == "NEXTN" else None
        return draft.cell_bytes(tp=tp, kv_cache_dtype=kv_cache_dtype, layers=layers)
    if algo == "NEXTN":
        return target.layer_bytes(tp=tp, kv_cache_dtype=kv_cache_dtype) * (target.nextn_layers or 1)
    raise ModelConfigError(
        f"a {algo} draft needs its own config.json (--speculative-draft-model-path) to size its KV pool."
    )


def _entry(**fields: Any) -> ModelSpec:
    """A catalogue entry, built without validation: validating the first one built `ModelSpec`'s schema
    (~8 ms) in every command that imports the catalogue, `verify HOST` included, which validates no other
    model spec. The entries are this file's constants; tests/test_capacity.py validates each one."""
    return ModelSpec.model_construct(**fields)


def _mla(name: str, layers: int, nextn: int, hf_ids: tuple[str, ...], archs: tuple[str, ...]) -> ModelSpec:
    return _entry(
        name=name,
        attention="mla",
        num_layers=layers,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        nextn_layers=nextn,
        hf_ids=hf_ids,
        architectures=archs,
    )


def _dsv4(name: str, layers: int, hf_ids: tuple[str, ...]) -> ModelSpec:
    """DeepSeek-V4: a 512-wide latent (448 + 64 rope) per layer; its pools' bytes per full token come
    from the journal's `DSv4 memory calculation` line (see `ModelSpec.dsv4`)."""
    return _entry(
        name=name,
        attention="mla",
        num_layers=layers,
        kv_lora_rank=448,
        qk_rope_head_dim=64,
        hf_ids=hf_ids,
        architectures=("DeepseekV4ForCausalLM",),
        model_type="deepseek_v4",
        dsv4=True,
    )


def _gqa(name: str, layers: int, kv_heads: int, head_dim: int, hf_ids: tuple[str, ...]) -> ModelSpec:
    return _entry(
        name=name,
        attention="mha",
        num_layers=layers,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        v_head_dim=head_dim,
        hf_ids=hf_ids,
    )


# Facts from shared/reference/sglang.md §7 and the models' published config.json files; each MHA entry
# is cross-checked in the tests against a public `KV Cache is allocated` line (K size = tokens · cell / 2).
CATALOGUE: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        _mla("kimi-k2.6", 61, 0, ("moonshotai/Kimi-K2.6",), ("KimiK25ForConditionalGeneration",)),
        _mla("kimi-k2.5", 61, 0, ("moonshotai/Kimi-K2.5",), ("KimiK25ForConditionalGeneration",)),
        _mla(
            "kimi-k2",
            61,
            0,
            (
                "moonshotai/Kimi-K2-Instruct",
                "moonshotai/Kimi-K2-Instruct-0905",
                "moonshotai/Kimi-K2-Thinking",
            ),
            (),
        ),
        _mla("deepseek-v3", 61, 1, ("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3-0324"), ()),
        _mla("deepseek-r1", 61, 1, ("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-R1-0528"), ()),
        # 43 layers: llama.cpp's `n_layer = 43` for "DeepSeek V4 Flash" (ggml-org/llama.cpp#22319).
        _dsv4(
            "deepseek-v4-flash", 43, ("deepseek-ai/DeepSeek-V4-Flash", "deepseek-ai/DeepSeek-V4-Flash-FP8")
        ),
        _gqa("llama-3.1-8b", 32, 8, 128, ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B")),
        _gqa("llama-3.1-70b", 80, 8, 128, ("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-70B")),
        _gqa("qwen3-32b", 64, 8, 128, ("Qwen/Qwen3-32B",)),
        _gqa("qwen3-8b", 36, 8, 128, ("Qwen/Qwen3-8B",)),
        _gqa("qwen3-0.6b", 28, 8, 128, ("Qwen/Qwen3-0.6B",)),
    )
}
_ALIASES = {"kimi-k26": "kimi-k2.6", "kimi-k25": "kimi-k2.5", "deepseek-v3.1": "deepseek-v3"}


def get_model(name: str) -> ModelSpec:
    """A catalogue entry by its short name, alias or Hugging Face id (case-insensitive)."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key in CATALOGUE:
        return CATALOGUE[key]
    for spec in CATALOGUE.values():
        if any(key == hf.lower() or key == hf.lower().rsplit("/", 1)[-1] for hf in spec.hf_ids):
            return spec
    raise ModelConfigError(
        f"unknown model {name!r}; known models are {', '.join(CATALOGUE)} (or give --model-config config.json)."
    )


def find_model(model_path: str | None) -> ModelSpec | None:
    """The catalogue entry for a `--model-path` seen in a journal (`org/name` or a local path), if any."""
    if not model_path:
        return None
    tail = model_path.rstrip("/").rsplit("/", 1)[-1].lower()
    for spec in CATALOGUE.values():
        if any(tail == hf.lower().rsplit("/", 1)[-1] for hf in spec.hf_ids):
            return spec
    return None


def _int(cfg: dict[str, Any], key: str, *, required: bool = True) -> int | None:
    value = cfg.get(key)
    if value is None:
        if required:
            raise ModelConfigError(f"config.json has no {key!r}, which sizes the KV cache.")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelConfigError(f"config.json has {key}={value!r}; a non-negative integer is needed.")
    return value


def _text_config(data: dict[str, Any]) -> dict[str, Any]:
    """The language model's keys: a multimodal config (Kimi K2.5/K2.6, Qwen3.5) nests them in
    `text_config`; its own keys win over the wrapper's."""
    text = data.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" in text:
        return {**{k: v for k, v in data.items() if k != "text_config"}, **text}
    return data


def _layer_kinds(cfg: dict[str, Any], layers: int, *, swa_pool: bool = False) -> tuple[int, int, int]:
    """(full-attention, linear/mamba, sliding-window) layers as SGLang counts them for its pools. The
    sliding-window layers count only when SGLang keeps them apart (`swa_pool`); otherwise they are full."""
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        kinds = [str(t) for t in types[:layers]]
        if len(kinds) != layers:
            raise ModelConfigError(
                f"config.json lists {len(types)} layer_types for {layers} layers; the KV layers cannot be told."
            )
        known = _FULL_LAYER_TYPES | _LINEAR_LAYER_TYPES | _SWA_LAYER_TYPES
        other = sorted({k for k in kinds if k not in known})
        if other:
            raise ModelConfigError(
                f"config.json has {', '.join(other)} layers, which SGLang keeps in a pool of their own that "
                "this model does not size."
            )
        linear = sum(1 for k in kinds if k in _LINEAR_LAYER_TYPES)
        swa = sum(1 for k in kinds if k in _SWA_LAYER_TYPES) if swa_pool else 0
        return layers - linear - swa, linear, swa
    interval = _int(cfg, "full_attention_interval", required=False)
    if interval:
        full = sum(1 for i in range(layers) if (i + 1) % interval == 0)
        return full, layers - full, 0
    return layers, 0, 0


def _linear_state(cfg: dict[str, Any]) -> LinearStateShape:
    ssm = _STATE_DTYPE_BYTES.get(str(cfg.get("mamba_ssm_dtype") or "float32"), 4)
    if cfg.get("linear_num_value_heads") is not None:  # Qwen3-Next / Qwen3.5 gated delta net
        heads = _int(cfg, "linear_num_value_heads") or 0
        value_dim = _int(cfg, "linear_value_head_dim") or 0
        return LinearStateShape(
            intermediate_size=value_dim * heads,
            n_groups=_int(cfg, "linear_num_key_heads") or 0,
            num_heads=heads,
            head_dim=value_dim,
            state_size=_int(cfg, "linear_key_head_dim") or 0,
            conv_kernel=_int(cfg, "linear_conv_kernel_dim") or 0,
            ssm_dtype_bytes=ssm,
        )
    if cfg.get("mamba_n_heads") is not None:  # granite-4.0-h (GraniteMoeHybrid)
        hidden = _int(cfg, "hidden_size") or 0
        return LinearStateShape(
            intermediate_size=(_int(cfg, "mamba_expand", required=False) or 2) * hidden,
            n_groups=_int(cfg, "mamba_n_groups", required=False) or 1,
            num_heads=_int(cfg, "mamba_n_heads") or 0,
            head_dim=_int(cfg, "mamba_d_head") or 0,
            state_size=_int(cfg, "mamba_d_state") or 0,
            conv_kernel=_int(cfg, "mamba_d_conv", required=False) or 4,
            ssm_dtype_bytes=ssm,
        )
    raise ModelConfigError(
        "config.json has linear-attention layers but no linear_* or mamba_* shape to size their state."
    )


def _kv_fp8(cfg: dict[str, Any]) -> bool:
    """The checkpoint declares FP8 KV (`kv_cache_quant_algo: FP8`, as SGLang's model runner reads it)."""
    quant = cfg.get("quantization_config")
    return isinstance(quant, dict) and str(quant.get("kv_cache_quant_algo") or "").upper() == "FP8"


def model_from_hf_config(data: Any, name: str = "config.json") -> ModelSpec:
    """A `ModelSpec` from a parsed Hugging Face `config.json`: MHA/GQA, MLA, hybrid linear attention."""
    if not isinstance(data, dict):
        raise ModelConfigError("config.json must hold a JSON object.")
    cfg = _text_config(data)
    layers = _int(cfg, "num_hidden_layers") or 0
    dtype_name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").removeprefix("torch.")
    dtype_bytes = _TORCH_DTYPE_BYTES.get(dtype_name, 2)
    archs = data.get("architectures") or cfg.get("architectures") or ()
    arch_names = {str(a) for a in archs} if isinstance(archs, list) else set()
    full, linear, swa = _layer_kinds(cfg, layers, swa_pool=bool(arch_names & HYBRID_SWA_ARCHITECTURES))
    model_type = data.get("model_type") or cfg.get("model_type")
    common: dict[str, Any] = {
        "name": name,
        "num_layers": full,
        "dtype_bytes": dtype_bytes,
        "kv_dtype_bytes": 1 if _kv_fp8(cfg) or _kv_fp8(data) else None,
        "nextn_layers": _int(cfg, "num_nextn_predict_layers", required=False) or 0,
        "architectures": tuple(str(a) for a in archs) if isinstance(archs, list) else (),
        "model_type": str(model_type) if isinstance(model_type, str) else None,
        "linear_layers": linear,
        "linear_state": _linear_state(cfg) if linear else None,
        "context_length": _int(cfg, "max_position_embeddings", required=False),
        "swa_layers": swa,
        "dsv4": model_type == "deepseek_v4",
    }
    if swa:
        # SGLang's `get_swa_num_kv_heads` / `swa_head_dim` / `swa_v_head_dim` (configs/model_config.py):
        # the `swa_*` keys when the config has them (MiMo-V2), else the layers share the full shape.
        common["swa_num_kv_heads"] = _int(cfg, "swa_num_key_value_heads", required=False)
        common["swa_head_dim"] = _int(cfg, "swa_head_dim", required=False)
        common["swa_v_head_dim"] = _int(cfg, "swa_v_head_dim", required=False)
    try:
        if cfg.get("kv_lora_rank"):
            return ModelSpec(
                attention="mla",
                kv_lora_rank=_int(cfg, "kv_lora_rank"),
                qk_rope_head_dim=_int(cfg, "qk_rope_head_dim"),
                **common,
            )
        heads = _int(cfg, "num_attention_heads")
        kv_heads = _int(cfg, "num_key_value_heads", required=False) or heads
        head_dim = _int(cfg, "head_dim", required=False)
        if not head_dim:
            hidden = _int(cfg, "hidden_size")
            if not heads or not hidden:
                raise ModelConfigError(
                    "config.json has no usable head_dim, hidden_size or num_attention_heads."
                )
            head_dim = hidden // heads
        v_head_dim = _int(cfg, "v_head_dim", required=False) or head_dim
        global_head_dim = _int(cfg, "global_head_dim", required=False)
        if swa and global_head_dim:
            # Gemma 4: the sliding layers have the plain heads, the full ones `num_global_key_value_heads`
            # of `global_head_dim`.
            common["swa_num_kv_heads"] = common["swa_num_kv_heads"] or kv_heads
            common["swa_head_dim"] = common["swa_head_dim"] or head_dim
            kv_heads = _int(cfg, "num_global_key_value_heads", required=False) or kv_heads
            head_dim = v_head_dim = global_head_dim
        return ModelSpec(
            attention="mha", num_kv_heads=kv_heads, head_dim=head_dim, v_head_dim=v_head_dim, **common
        )
    except ModelConfigError:
        raise
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise ModelConfigError(
            f"config.json does not describe a usable model ({_first_error(exc)})."
        ) from None


def parse_hf_config(text: str, name: str = "config.json") -> ModelSpec:
    """`model_from_hf_config` on the text of a `config.json` file."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{name} is not valid JSON (line {exc.lineno}: {exc.msg}).") from None
    except RecursionError:
        # A hostile file nests brackets until the decoder gives up: still one sentence, not a traceback.
        raise ModelConfigError(f"{name} nests too deeply to be a model config.") from None
    return model_from_hf_config(data, name)


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        items = errors()
        if items:
            return str(items[0].get("msg", exc))
    return str(exc).splitlines()[0]
