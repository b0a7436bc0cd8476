"""AMD GPUs: what `amd-smi` (ROCm 6 on) and `rocm-smi` (older ROCm) print as JSON, read into the same
`GpuSample` the NVIDIA back-ends give (memory, utilisation, temperature, power, the card's name).

The formats, from AMD's own CLI source (ROCm/amdsmi `amdsmi_cli/amdsmi_commands.py` and its logger) and
published output (tests/data/amd/INDEX.md):

- `amd-smi metric --usage --mem-usage --power --temperature --json`: a list with one object per GPU,
  `{"gpu": 0, "usage": {"gfx_activity": {"value": 42, "unit": "%"}, …}, "mem_usage": {"total_vram":
  {"value": 196592, "unit": "MB"}, "used_vram": …}, "power": {"socket_power": …}, "temperature":
  {"edge": …, "hotspot": …, "mem": …}}`; ROCm 7 wraps the list as `{"gpu_data": [...]}`. A figure the
  card cannot give is the string "N/A". amd-smi's "MB" are MiB (the CLI divides bytes by 1024 × 1024).
- `amd-smi static --asic --json`: the same list, `{"gpu": 0, "asic": {"market_name": "…", …}}`; with
  `--bus --limit`, also `"bus": {"max_pcie_width": 16, "max_pcie_speed": {"value": 32, "unit": "GT/s"},
  "pcie_interface_version": "Gen 5"}` and `"limit": {"socket_power": {"value": 750, "unit": "W"},
  "slowdown_hotspot_temperature": {"value": 100, "unit": "C"}, …}`.
- `amd-smi metric … --ecc --pcie --clock --json` adds `"ecc": {"total_correctable_count": 0,
  "total_uncorrectable_count": 0, …}` (bare counts), `"pcie": {"width": 16, "speed": {"value": 32,
  "unit": "GT/s"}, …}`, `"clock": {"gfx_0": {"clk": …, "max_clk": …}, "mem_0": {…}}`, and `"power"`'s
  `"throttle_status": "THROTTLED" | "UNTHROTTLED" | "N/A"` (a flag without its cause).
- `amd-smi process --json`: per GPU `{"gpu": 0, "process_list": [{"process_info": {"name": "python3",
  "pid": 4242, "memory_usage": {"vram_mem": {"value": 10846208000, "unit": "B"}, …}, "mem_usage": …}}]}`,
  or `"process_info": "No running processes detected"` (AMD's CHANGELOG shows the `-G` form, tests/data/amd).
- `rocm-smi --showproductname --showuse --showmeminfo vram --showtemp --showpower --json`: an object per
  card, `{"card0": {"GPU use (%)": "0", "VRAM Total Memory (B)": "21458059264", "VRAM Total Used Memory
  (B)": "27856896", "Card Series": "Radeon RX 7900 XT", …}}`, every value a string.

Pure: the sampler that runs the commands is `console.sources.gpus.AmdSmiSampler`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from console.core.gpus import GpuProcess, GpuSample

AMD_SMI_METRIC_ARGV: tuple[str, ...] = (
    "amd-smi",
    "metric",
    "--usage",
    "--mem-usage",
    "--power",
    "--temperature",
    "--json",
)
AMD_SMI_HEALTH_ARGV: tuple[str, ...] = (*AMD_SMI_METRIC_ARGV[:-1], "--ecc", "--pcie", "--clock", "--json")
"""What the sampler asks first: the metric command with the health sections. An amd-smi that refuses
them (exit status 2, argparse's) is asked `AMD_SMI_METRIC_ARGV` from then on."""
AMD_SMI_STATIC_ARGV: tuple[str, ...] = ("amd-smi", "static", "--asic", "--json")
AMD_SMI_STATIC_HEALTH_ARGV: tuple[str, ...] = ("amd-smi", "static", "--asic", "--bus", "--limit", "--json")
"""The static facts read once: the names, the PCIe link's maximum, the power cap, the slowdown points."""
AMD_SMI_PROCESS_ARGV: tuple[str, ...] = ("amd-smi", "process", "--json")
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


_GT_S_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
"""PCIe generation by its transfer rate (GT/s)."""


def _pcie_gen(speed: Any) -> int | None:
    """A PCIe generation from amd-smi's speed: GT/s (`{"value": 32, "unit": "GT/s"}`), or MT/s where a
    version forgot to divide (`16000`: ROCm/rocm-systems#5200)."""
    number = _number(speed)
    if number is None or number <= 0:
        return None
    if number >= 1000:
        number /= 1000
    return _GT_S_GEN.get(round(number * 2) / 2)


def _whole(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number.is_integer() and number >= 0 else None


def _static_facts(static_text: str) -> dict[int, dict[str, Any]]:
    """GPU index → what `amd-smi static --asic [--bus --limit] --json` says of it, as sample fields."""
    facts: dict[int, dict[str, Any]] = {}
    if not static_text.strip():
        return facts
    for gpu in _gpu_list(_load(static_text, "amd-smi static")):
        index = gpu.get("gpu")
        if not isinstance(index, int) or isinstance(index, bool):
            continue
        said: dict[str, Any] = {}
        name = _section(gpu, "asic").get("market_name")
        if isinstance(name, str) and name.strip():
            said["name"] = name.strip()
        bus, limit = _section(gpu, "bus"), _section(gpu, "limit")
        said["pcie_width_max"] = _whole(bus.get("max_pcie_width"))
        version = bus.get("pcie_interface_version")
        gen = re.fullmatch(r"\s*Gen\s*(\d{1,2})\s*", version) if isinstance(version, str) else None
        said["pcie_gen_max"] = int(gen.group(1)) if gen else _pcie_gen(bus.get("max_pcie_speed"))
        # the cap in force (`socket_power`), else the most it may be set to
        cap = _number(limit.get("socket_power"))
        said["power_limit_w"] = cap if cap is not None else _number(limit.get("max_power"))
        for which in ("hotspot", "edge"):
            slowdown = _number(limit.get(f"slowdown_{which}_temperature"))
            if slowdown is not None:
                said[f"slowdown_{which}"] = slowdown
                said[f"shutdown_{which}"] = _number(limit.get(f"shutdown_{which}_temperature"))
        facts[index] = said
    return facts


def _processes(process_text: str) -> dict[int, list[GpuProcess]]:
    """GPU index → its processes, from `amd-smi process --json`: PID, name, VRAM (`memory_usage.vram_mem`,
    bytes; else `mem_usage`). amd-smi says `N/A` for a name it may not read (another user's process)."""
    out: dict[int, list[GpuProcess]] = {}
    if not process_text.strip():
        return out
    for gpu in _gpu_list(_load(process_text, "amd-smi process")):
        index = gpu.get("gpu")
        listed = gpu.get("process_list")
        if not isinstance(index, int) or isinstance(index, bool) or not isinstance(listed, list):
            continue
        for entry in listed:
            info = entry.get("process_info") if isinstance(entry, dict) else None
            if not isinstance(info, dict):
                continue  # "No running processes detected"
            memory = info.get("memory_usage")
            vram = memory.get("vram_mem") if isinstance(memory, dict) else None
            used = _mib(vram) if vram is not None else _mib(info.get("mem_usage"))
            name = info.get("name")
            out.setdefault(index, []).append(
                GpuProcess(
                    pid=_whole(info.get("pid")),
                    name=name.strip() if isinstance(name, str) and name.strip() not in ("", "N/A") else None,
                    used_memory_mib=used,
                )
            )
    return out


def _throttled(value: Any) -> bool | None:
    if not isinstance(value, str):
        return None
    return {"THROTTLED": True, "UNTHROTTLED": False}.get(value.strip().upper())


def parse_amd_smi(metric_text: str, static_text: str = "", process_text: str = "") -> list[GpuSample]:
    """`amd-smi metric … --json` (with `static --asic [--bus --limit] --json` for the names and limits, and
    `process --json` for the processes) → one sample per GPU."""
    facts = _static_facts(static_text)
    processes = _processes(process_text)
    out: list[GpuSample] = []
    for pos, gpu in enumerate(_gpu_list(_load(metric_text, "amd-smi metric"))):
        said = gpu.get("gpu")
        index = said if isinstance(said, int) and not isinstance(said, bool) else pos
        usage, memory = _section(gpu, "usage"), _section(gpu, "mem_usage")
        power, temperature = _section(gpu, "power"), _section(gpu, "temperature")
        ecc, pcie, clock = _section(gpu, "ecc"), _section(gpu, "pcie"), _section(gpu, "clock")
        static = facts.get(index, {})
        # the hottest point (junction) is what slows the part down; the edge where there is no hotspot,
        # each held to its own slowdown point
        which = "hotspot" if _number(temperature.get("hotspot")) is not None else "edge"
        gfx, mem = clock.get("gfx_0"), clock.get("mem_0")
        gfx = gfx if isinstance(gfx, dict) else {}
        mem = mem if isinstance(mem, dict) else {}
        out.append(
            GpuSample.model_validate(
                {
                    "index": index,
                    "name": static.get("name"),
                    "utilization_pct": _number(usage.get("gfx_activity")),
                    "memory_used_mib": _mib(memory.get("used_vram")),
                    "memory_total_mib": _mib(memory.get("total_vram")),
                    "processes": processes.get(index, ()),
                    "temperature_c": _number(temperature.get(which)),
                    "temperature_slowdown_c": static.get(f"slowdown_{which}"),
                    "temperature_shutdown_c": static.get(f"shutdown_{which}"),
                    "power_w": _number(power.get("socket_power")),
                    "power_limit_w": static.get("power_limit_w"),
                    "throttled": _throttled(power.get("throttle_status")),
                    "clock_sm_mhz": _number(gfx.get("clk")),
                    "clock_sm_max_mhz": _number(gfx.get("max_clk")),
                    "clock_mem_mhz": _number(mem.get("clk")),
                    "clock_mem_max_mhz": _number(mem.get("max_clk")),
                    "ecc_corrected_volatile": _whole(ecc.get("total_correctable_count")),
                    "ecc_uncorrected_volatile": _whole(ecc.get("total_uncorrectable_count")),
                    "pcie_width": _whole(pcie.get("width")),
                    "pcie_gen": _pcie_gen(pcie.get("speed")),
                    "pcie_width_max": static.get("pcie_width_max"),
                    "pcie_gen_max": static.get("pcie_gen_max"),
                }
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
    "AMD_SMI_HEALTH_ARGV",
    "AMD_SMI_METRIC_ARGV",
    "AMD_SMI_PROCESS_ARGV",
    "AMD_SMI_STATIC_ARGV",
    "AMD_SMI_STATIC_HEALTH_ARGV",
    "ROCM_SMI_ARGV",
    "AmdFormatError",
    "parse_amd_smi",
    "parse_rocm_smi",
]
