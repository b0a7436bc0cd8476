"""The KV budget SGLang keeps back for a multimodal model's runtime allocations (0.5.19 on).

SGLang 0.5.19+ `mem_cache/kv_cache_configurator.py` `mm_runtime_reservation_gb` (sgl-project/sglang
#34141, 2026-08-12), called from `_profile_available_bytes`: for a model `is_multimodal_model` names,
`rest = available − pre·(1−f) − reservation`, with the reservation `SGLANG_VLM_CACHE_SIZE_MB` (100 MiB,
the embedding cache) plus `SGLANG_MM_FEATURE_CACHE_MB` (1024 MiB) when `--mm-feature-transport` is
`cuda_ipc` or `cuda_vmm` (a GPU feature-transport pool). SGLang logs it as "Reserving X GB of the KV
budget for post-sizing multimodal allocations". Unset, the transport resolves to `cpu` on one node
(main from 2026-08-13, #34662; 0.5.19, 0.5.23); main of 2026-08-04 to 2026-08-12 resolved it to
`cuda_ipc` for every single-node multimodal model.
"""

from __future__ import annotations

from collections.abc import Iterable

from console.core.versions import version_tuple

VLM_CACHE_MIB = 100
"""`SGLANG_VLM_CACHE_SIZE_MB`'s default."""
MM_FEATURE_CACHE_MIB = 1024
"""`SGLANG_MM_FEATURE_CACHE_MB`'s default, reserved for a GPU feature transport."""
GPU_TRANSPORTS = frozenset({"cuda_ipc", "cuda_vmm"})
FIRST_RELEASE = (0, 5, 19)
"""The first release read that reserves it (0.5.16 does not)."""

MULTIMODAL_ARCHITECTURES = frozenset(
    {
        "CLIPModel",
        "Cohere2VisionForConditionalGeneration",
        "Cosmos3EdgeForConditionalGeneration",
        "DeepseekVL2ForCausalLM",
        "Ernie4_5_VLMoeForConditionalGeneration",
        "MiniMaxM3SparseForConditionalGeneration",
        "Gemma3ForConditionalGeneration",
        "Gemma3nForConditionalGeneration",
        "Gemma4ForConditionalGeneration",
        "EmbeddingGemma2Model",
        "Gemma4UnifiedForConditionalGeneration",
        "DiffusionGemmaForBlockDiffusion",
        "Glm4vForConditionalGeneration",
        "Glm4vMoeForConditionalGeneration",
        "Glm5NextForConditionalGeneration",
        "GlmOcrForConditionalGeneration",
        "GlmAsrForConditionalGeneration",
        "GlmImageForConditionalGeneration",
        "Grok1VForCausalLM",
        "Grok1AForCausalLM",
        "LlavaLlamaForCausalLM",
        "Llama4ForConditionalGeneration",
        "LlavaMistralForCausalLM",
        "LlavaQwenForCausalLM",
        "LlavaForConditionalGeneration",
        "LlavaVidForCausalLM",
        "Lfm2VlForConditionalGeneration",
        "LightOnOCRForConditionalGeneration",
        "MiMoV2ASRForCausalLM",
        "MiniCPMO",
        "MiniCPMV",
        "Mistral3ForConditionalGeneration",
        "MultiModalityCausalLM",
        "MllamaForConditionalGeneration",
        "MossVLForConditionalGeneration",
        "NemotronH_Nano_VL_V2",
        "NemotronH_Nano_Omni_Reasoning_V3",
        "NemotronH_Omni_Reasoning_V3",
        "MuseGlimmerForConditionalGeneration",
        "MuseSparkForConditionalGeneration",
        "PixtralForConditionalGeneration",
        "Qwen2AudioForConditionalGeneration",
        "Qwen2VLForConditionalGeneration",
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen3VLForConditionalGeneration",
        "Qwen3VLMoeForConditionalGeneration",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen4ExpForConditionalGeneration",
        "InternS2PreviewForConditionalGeneration",
        "InternS2MobiusForConditionalGeneration",
        "Qwen3ASRForConditionalGeneration",
        "Qwen3OmniMoeForConditionalGeneration",
        "KimiVLForConditionalGeneration",
        "LocateAnythingForConditionalGeneration",
        "InternVLChatModel",
        "InternS1ForConditionalGeneration",
        "InternS1ProForConditionalGeneration",
        "Phi4MMForCausalLM",
        "VoxtralForConditionalGeneration",
        "WhisperForConditionalGeneration",
        "Step3VLForConditionalGeneration",
        "POINTSV15ChatModel",
        "DotsVLMForCausalLM",
        "Dots3NoteForCausalLM",
        "DotsOCRForCausalLM",
        "Sarashina2VisionForCausalLM",
        "NVILAForConditionalGeneration",
        "NVILALiteForConditionalGeneration",
        "DeepseekOCRForCausalLM",
        "UnlimitedOCRForCausalLM",
        "JetVLMForConditionalGeneration",
        "PaddleOCRVLForConditionalGeneration",
        "MiDashengLMModel",
        "StepVLForConditionalGeneration",
        "Step3p7ForConditionalGeneration",
        "KimiK25ForConditionalGeneration",
        "BailingMMNativeForConditionalGeneration",
        "BailingMM2NativeForConditionalGeneration",
        "BailingMoeV3VLForConditionalGeneration",
    }
)
"""SGLang 0.5.23 `configs/model_config.py` `multimodal_model_archs` (80 names)."""


def is_dev_build(version: str | None) -> bool:
    """A build from source (`0.0.0.dev1+g5f55db35e`): its version says nothing of its date."""
    return bool(version) and (version_tuple(version) or (1,))[:3] == (0, 0, 0)


def multimodal(architectures: Iterable[str]) -> bool:
    return any(a in MULTIMODAL_ARCHITECTURES for a in architectures)


def mm_reserve_gib(architectures: Iterable[str], version: str | None, transport: str | None) -> float:
    """GiB SGLang keeps out of the KV budget for this model, version and `--mm-feature-transport`: 0 before
    0.5.19 or for a text model; a dev build is taken as a main build after the change (#34141)."""
    have = version_tuple(version)
    if have is None or (not is_dev_build(version) and have < FIRST_RELEASE):
        return 0.0
    return reservation_gib(architectures, transport)


def reservation_gib(architectures: Iterable[str], transport: str | None) -> float:
    """`mm_runtime_reservation_gb` itself, for a version that has it."""
    if not multimodal(architectures):
        return 0.0
    mib = VLM_CACHE_MIB + (MM_FEATURE_CACHE_MIB if transport in GPU_TRANSPORTS else 0)
    return mib / 1024
