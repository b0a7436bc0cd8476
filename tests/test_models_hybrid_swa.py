"""Which architectures keep their sliding-window layers in a pool of their own (`HYBRID_SWA_ARCHITECTURES`,
SGLang's `is_hybrid_swa_model`), held against the wheel's own list where it is cached."""

from __future__ import annotations

import json
from pathlib import Path

from console.core.models import HYBRID_SWA_ARCHITECTURES, model_from_hf_config

CONFIGS = Path(__file__).parent / "data" / "hf-configs"


def gemma4_as(architecture: str):  # type: ignore[no-untyped-def]
    data = json.loads((CONFIGS / "google--gemma-4-26B-A4B-it.json").read_text())
    return model_from_hf_config({**data, "architectures": [architecture]}, "gemma-4")


def test_gemma4_s_unified_form_keeps_its_sliding_layers_in_the_swa_pool() -> None:
    # SGLang 0.5.23 configs/model_config.py: is_hybrid_swa_model (line 2670) and is_hybrid_swa_compress
    # (line 1254) list Gemma4UnifiedForConditionalGeneration beside Gemma4ForConditionalGeneration.
    assert "Gemma4UnifiedForConditionalGeneration" in HYBRID_SWA_ARCHITECTURES
    unified = gemma4_as("Gemma4UnifiedForConditionalGeneration")
    gemma4 = gemma4_as("Gemma4ForConditionalGeneration")
    assert unified.swa_layers == gemma4.swa_layers > 0
    assert unified.num_layers == gemma4.num_layers
    assert unified.swa_layer_bytes() == gemma4.swa_layer_bytes() > 0
    # control: an architecture SGLang does not list keeps its sliding layers in the one full pool
    other = gemma4_as("Gemma3ForConditionalGeneration")
    assert other.swa_layers == 0 and other.num_layers == gemma4.num_layers + gemma4.swa_layers
