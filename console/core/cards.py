"""GPU cards: peak memory bandwidth by the name nvidia-smi (or amd-smi) gives the card.

The probe sets the KV read bandwidth decode achieved against the card's peak, so the peak must be the
vendor's own figure for that exact part: an H100 PCIe (2.0 TB/s) is not an H100 SXM (3.35 TB/s). Every
figure and its source is in `docs/gpu-bandwidth.md`. A card this table does not name is reported as
unknown (None); nothing is guessed from a family name or from the memory size alone.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict


class GpuBandwidth(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True)

    name: str
    peak_gbs: float
    """Peak memory bandwidth of one card, decimal GB/s (vendor datasheet)."""
    memory: str = "HBM"
    source: str = ""
    """Where the figure comes from (the vendor page; docs/gpu-bandwidth.md has the details)."""


_NV_H100 = "NVIDIA H100 datasheet / product page (nvidia.com/en-us/data-center/h100)"
_NV_H200 = "NVIDIA H200 product page (nvidia.com/en-us/data-center/h200)"
_NV_HGX = "NVIDIA HGX platform specifications (nvidia.com/en-us/data-center/hgx)"
_NV_A100 = "NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100)"
_NV_L40S = "NVIDIA L40S datasheet (nvidia.com/en-us/data-center/l40s)"
_NV_RTXPRO = "NVIDIA RTX PRO 6000 Blackwell datasheet (nvidia.com, RTX PRO 6000 product pages)"
_NV_ADA = "NVIDIA Ada GPU architecture whitepaper (GeForce RTX 4090: 384-bit, 21 Gbps GDDR6X)"
_NV_RTXB = "NVIDIA RTX Blackwell GPU architecture whitepaper (GeForce RTX 5090: 512-bit, 28 Gbps GDDR7)"
_AMD_300 = "AMD Instinct MI300X product page and datasheet (amd.com)"
_AMD_355 = "AMD Instinct MI355X product page (amd.com)"

# The first pattern that matches the lower-cased name (with `-`/`_` as spaces) wins: the PCIe and NVL
# parts come before the plain SXM one, the 80 GB A100s before the 40 GB one. Word boundaries keep
# `h100` from matching `gh100` and `b200` from matching `gb200` (a Grace module, not in this table).
_CATALOGUE: tuple[tuple[str, GpuBandwidth], ...] = (
    (
        r"\brtx pro 6000 blackwell",
        GpuBandwidth(name="RTX PRO 6000 Blackwell", peak_gbs=1792.0, memory="GDDR7", source=_NV_RTXPRO),
    ),
    (r"\bh100\b.*\bpcie", GpuBandwidth(name="H100 PCIe", peak_gbs=2000.0, source=_NV_H100)),
    (r"\bh100\b.*\bnvl", GpuBandwidth(name="H100 NVL", peak_gbs=3900.0, source=_NV_H100)),
    (r"\bh100\b", GpuBandwidth(name="H100 SXM", peak_gbs=3350.0, source=_NV_H100)),
    (r"\bh200\b", GpuBandwidth(name="H200", peak_gbs=4800.0, source=_NV_H200)),
    (r"\bb200\b", GpuBandwidth(name="B200", peak_gbs=8000.0, source=_NV_HGX)),
    (r"\bb300\b", GpuBandwidth(name="B300", peak_gbs=8000.0, source=_NV_HGX)),
    (
        r"\ba100\b.*80\s*gb.*\bpcie|\ba100\b.*\bpcie.*80\s*gb",
        GpuBandwidth(name="A100 80GB PCIe", peak_gbs=1935.0, source=_NV_A100),
    ),
    (r"\ba100\b.*80\s*gb", GpuBandwidth(name="A100 80GB SXM", peak_gbs=2039.0, source=_NV_A100)),
    (r"\ba100\b.*40\s*gb", GpuBandwidth(name="A100 40GB", peak_gbs=1555.0, source=_NV_A100)),
    (r"\bl40s\b", GpuBandwidth(name="L40S", peak_gbs=864.0, memory="GDDR6", source=_NV_L40S)),
    (
        r"\brtx 4090\b",
        GpuBandwidth(name="GeForce RTX 4090", peak_gbs=1008.0, memory="GDDR6X", source=_NV_ADA),
    ),
    (
        r"\brtx 5090\b",
        GpuBandwidth(name="GeForce RTX 5090", peak_gbs=1792.0, memory="GDDR7", source=_NV_RTXB),
    ),
    (r"\bmi300x\b", GpuBandwidth(name="Instinct MI300X", peak_gbs=5300.0, source=_AMD_300)),
    (r"\bmi355x\b", GpuBandwidth(name="Instinct MI355X", peak_gbs=8000.0, source=_AMD_355)),
)

_A100_PLAIN = re.compile(r"\ba100\b")
_A100_80GB_MIN_MIB = 60 * 1024
"""An A100 whose name carries no size (some drivers print `NVIDIA A100-SXM4`): more than 60 GiB of
memory is the 80 GB part, less the 40 GB one. The only place memory decides, because both sizes
exist under one name; the form factor is still read from the name."""


def _key(name: str) -> str:
    return re.sub(r"[-_]", " ", name.lower())


def card_bandwidth(name: str | None, memory_mib: float | None = None) -> GpuBandwidth | None:
    """The table's entry for a card as the sampler names it (`NVIDIA H100 80GB HBM3`), None if unknown."""
    if not name or not name.strip():
        return None
    key = _key(name)
    for pattern, entry in _CATALOGUE:
        if re.search(pattern, key):
            return entry
    if _A100_PLAIN.search(key) and memory_mib is not None:
        sized = f"{key} {'80gb' if memory_mib > _A100_80GB_MIN_MIB else '40gb'}"
        for pattern, entry in _CATALOGUE:
            if re.search(pattern, sized):
                return entry
    return None


def known_cards() -> list[GpuBandwidth]:
    """Every card in the table, in matching order (for the docs and `host --json`)."""
    return [entry for _, entry in _CATALOGUE]


__all__ = ["GpuBandwidth", "card_bandwidth", "known_cards"]
