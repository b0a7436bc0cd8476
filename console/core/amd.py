"""AMD GPUs: what `amd-smi` (ROCm 6 on) and `rocm-smi` (older ROCm) print as JSON, read into the same
`GpuSample` the NVIDIA back-ends give (memory, utilisation, temperature, power, the card's name).

The formats, from AMD's own CLI source (ROCm/amdsmi `amdsmi_cli/amdsmi_commands.py` and its logger) and
published output (tests/data/amd/INDEX.md):

- `amd-smi metric --usage --mem-usage --power --temperature --json`: a list with one object per GPU,
  `{"gpu": 0, "usage": {"gfx_activity": {"value": 42, "unit": "%"}, …}, "mem_usage": {"total_vram":
  {"value": 196592, "unit": "MB"}, "used_vram": …}, "power": {"socket_power": …}, "temperature":
  {"edge": …, "hotspot": …, "mem": …}}`; ROCm 7 wraps the list as `{"gpu_data": [...]}`. A figure the
  card cannot give is the string "N/A". amd-smi's "MB" are MiB (the CLI divides bytes by 1024 × 1024).
- `amd-smi static --asic --json`: the same list, `{"gpu": 0, "asic": {"market_name": "…", …}}`.
- `rocm-smi --showproductname --showuse --showmeminfo vram --showtemp --showpower --json`: an object per
  card, `{"card0": {"GPU use (%)": "0", "VRAM Total Memory (B)": "21458059264", "VRAM Total Used Memory
  (B)": "27856896", "Card Series": "Radeon RX 7900 XT", …}}`, every value a string.

Pure: the sampler that runs the commands is `console.sources.gpus.AmdSmiSampler`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from console.core.gpus import GpuSample

AMD_SMI_METRIC_ARGV: tuple[str, ...] = (
    "amd-smi",
    "metric",
    "--usage",
    "--mem-usage",
    "--power",
    "--temperature",
    "--json",
)
AMD_SMI_STATIC_ARGV: tuple[str, ...] = ("amd-smi", "static", "--asic", "--json")
ROCM_SMI_ARGV: tuple[str, ...] = (
    "rocm-smi",
    "--showproductname",
    "--showuse",
    "--showmeminfo",
    "vram",
    "--showtemp",
    "--showpower",
    "--json",
)

_TO_MIB = {
    "B": 1 / 2**20,
    "KB": 1 / 1024,
    "KIB": 1 / 1024,
    "MB": 1.0,
    "MIB": 1.0,
    "GB": 1024.0,
    "GIB": 1024.0,
}


class AmdFormatError(ValueError):
    """What a tool printed is not its JSON; `str()` is one sentence."""


def _number(value: Any) -> float | None:
    """A value as amd-smi writes it (`{"value": 42, "unit": "%"}`, a bare number, a numeric string); None
    for "N/A" and anything else."""
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _mib(value: Any) -> float | None:
    number = _number(value)
    if number is None:
        return None
    unit = value.get("unit") if isinstance(value, dict) else None
    scale = _TO_MIB.get(str(unit).strip().upper()) if unit is not None else 1.0
    return number * scale if scale is not None else None


def _load(text: str, tool: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        first = text.strip().splitlines()[0][:120] if text.strip() else "nothing"
        raise AmdFormatError(f"{tool} printed something that is not its JSON ({first}).") from None


def _gpu_list(doc: Any) -> list[dict[str, Any]]:
    """amd-smi's list of GPUs, bare (ROCm 6) or as `{"gpu_data": [...]}` (ROCm 7)."""
    if isinstance(doc, dict) and isinstance(doc.get("gpu_data"), list):
        doc = doc["gpu_data"]
    if not isinstance(doc, list):
        raise AmdFormatError("amd-smi's JSON holds no list of GPUs.")
    return [g for g in doc if isinstance(g, dict)]


def _section(gpu: dict[str, Any], name: str) -> dict[str, Any]:
    value = gpu.get(name)
    return value if isinstance(value, dict) else {}  # "N/A" when the whole section failed


def parse_amd_smi(metric_text: str, static_text: str = "") -> list[GpuSample]:
    """`amd-smi metric … --json` (and `static --asic --json` for the names) → one sample per GPU."""
    names: dict[int, str] = {}
    if static_text.strip():
        for gpu in _gpu_list(_load(static_text, "amd-smi static")):
            name = _section(gpu, "asic").get("market_name")
            if isinstance(gpu.get("gpu"), int) and isinstance(name, str) and name.strip():
                names[gpu["gpu"]] = name.strip()
    out: list[GpuSample] = []
    for pos, gpu in enumerate(_gpu_list(_load(metric_text, "amd-smi metric"))):
        said = gpu.get("gpu")
        index = said if isinstance(said, int) and not isinstance(said, bool) else pos
        usage, memory = _section(gpu, "usage"), _section(gpu, "mem_usage")
        power, temperature = _section(gpu, "power"), _section(gpu, "temperature")
        # the hottest point (junction) is what slows the part down; the edge where there is no hotspot
        temp = _number(temperature.get("hotspot"))
        out.append(
            GpuSample(
                index=index,
                name=names.get(index),
                utilization_pct=_number(usage.get("gfx_activity")),
                memory_used_mib=_mib(memory.get("used_vram")),
                memory_total_mib=_mib(memory.get("total_vram")),
                temperature_c=temp if temp is not None else _number(temperature.get("edge")),
                power_w=_number(power.get("socket_power")),
            )
        )
    return out


def parse_rocm_smi(text: str) -> list[GpuSample]:
    """`rocm-smi --showproductname --showuse --showmeminfo vram --showtemp --showpower --json` → one
    sample per card, in card order."""
    doc = _load(text, "rocm-smi")
    if not isinstance(doc, dict):
        raise AmdFormatError("rocm-smi's JSON holds no cards.")
    cards = sorted(
        ((int(m.group(1)), value) for key, value in doc.items() if (m := re.fullmatch(r"card(\d+)", key))),
        key=lambda c: c[0],
    )
    out: list[GpuSample] = []
    for index, card in cards:
        if not isinstance(card, dict):
            continue
        total, used = (
            _number(card.get("VRAM Total Memory (B)")),
            _number(card.get("VRAM Total Used Memory (B)")),
        )
        name = next(
            (
                card[k].strip()
                for k in ("Card Series", "Device Name", "Card Model")
                if isinstance(card.get(k), str)
            ),
            None,
        )
        temp = next(
            (
                _number(card.get(k))
                for k in ("Temperature (Sensor junction) (C)", "Temperature (Sensor edge) (C)")
                if _number(card.get(k)) is not None
            ),
            None,
        )
        power = next(
            (
                _number(card.get(k))
                for k in ("Current Socket Graphics Package Power (W)", "Average Graphics Package Power (W)")
                if _number(card.get(k)) is not None
            ),
            None,
        )
        out.append(
            GpuSample(
                index=index,
                name=name,
                utilization_pct=_number(card.get("GPU use (%)")),
                memory_used_mib=used / 2**20 if used is not None else None,
                memory_total_mib=total / 2**20 if total is not None else None,
                temperature_c=temp,
                power_w=power,
            )
        )
    return out


__all__ = [
    "AMD_SMI_METRIC_ARGV",
    "AMD_SMI_STATIC_ARGV",
    "ROCM_SMI_ARGV",
    "AmdFormatError",
    "parse_amd_smi",
    "parse_rocm_smi",
]
