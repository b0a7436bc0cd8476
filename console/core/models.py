"""Model architecture facts that size the KV cache: a small bundled catalogue and a Hugging Face reader.

Only what enters SGLang's bytes-per-token ("cell") is kept: the attention kind, the layer count, and
either the MLA latent widths (`kv_lora_rank`, `qk_rope_head_dim`) or the MHA/GQA head shape
(`num_key_value_heads`, `head_dim`, `v_head_dim`). See `docs/capacity-model.md`.
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


class ModelSpec(BaseModel):
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

    @model_validator(mode="after")
    def _complete(self) -> ModelSpec:
        if self.num_layers <= 0:
            raise ValueError("num_layers must be positive")
        if self.attention == "mla":
            if not self.kv_lora_rank or self.qk_rope_head_dim is None:
                raise ValueError("an MLA model needs kv_lora_rank and qk_rope_head_dim")
        elif not self.num_kv_heads or not self.head_dim:
            raise ValueError("an MHA model needs num_kv_heads and head_dim")
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


def _mla(name: str, layers: int, nextn: int, hf_ids: tuple[str, ...], archs: tuple[str, ...]) -> ModelSpec:
    return ModelSpec(
        name=name,
        attention="mla",
        num_layers=layers,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        nextn_layers=nextn,
        hf_ids=hf_ids,
        architectures=archs,
    )


def _gqa(name: str, layers: int, kv_heads: int, head_dim: int, hf_ids: tuple[str, ...]) -> ModelSpec:
    return ModelSpec(
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


def model_from_hf_config(data: Any, name: str = "config.json") -> ModelSpec:
    """A `ModelSpec` from a parsed Hugging Face `config.json` (nested `text_config` as in Kimi K2.5/K2.6)."""
    if not isinstance(data, dict):
        raise ModelConfigError("config.json must hold a JSON object.")
    cfg: dict[str, Any] = data
    text = data.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" in text:
        cfg = {**{k: v for k, v in data.items() if k != "text_config"}, **text}
    layers = _int(cfg, "num_hidden_layers")
    dtype_name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").removeprefix("torch.")
    dtype_bytes = _TORCH_DTYPE_BYTES.get(dtype_name, 2)
    kv_bytes = None
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict) and str(quant.get("kv_cache_quant_algo") or "").upper() == "FP8":
        kv_bytes = 1
    archs = cfg.get("architectures") or data.get("architectures") or ()
    common: dict[str, Any] = {
        "name": name,
        "num_layers": layers,
        "dtype_bytes": dtype_bytes,
        "kv_dtype_bytes": kv_bytes,
        "nextn_layers": _int(cfg, "num_nextn_predict_layers", required=False) or 0,
        "architectures": tuple(str(a) for a in archs) if isinstance(archs, list) else (),
    }
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
    return model_from_hf_config(data, name)


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        items = errors()
        if items:
            return str(items[0].get("msg", exc))
    return str(exc).splitlines()[0]
