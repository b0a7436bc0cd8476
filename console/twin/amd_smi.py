"""`amd-smi` for a twin host that plays AMD GPUs (`k26-console twin --gpu mi300x`): `metric`, `static` and
`process` with `--json`, with the numbers of the simulated GPUs (console.twin.gpustate) and the faults of
the twin's `GpuConditions` (console.twin.gpuhealth), as the console's AMD back-end reads them.

The JSON follows AMD's own CLI (ROCm/amdsmi `amdsmi_cli/amdsmi_commands.py` at 0ceca28, ROCm 6.2): a list
with one object per GPU, each figure `{"value": …, "unit": …}` (ECC counts and PCIe width bare), "N/A"
for what a part cannot give, VRAM in "MB" that are MiB. Only `--json` output is played; any option the
stand-in does not know is refused as argparse refuses it (exit status 2).
"""

from __future__ import annotations

import json
import sys
import zlib
from collections.abc import Callable
from typing import Any

from console.twin import gpustate
from console.twin.gpuhealth import GpuConditions, Health, health, read_conditions
from console.twin.gpustate import Gpu
from console.twin.layout import TwinLayout

MIB = 1 << 20
GEN_GT_S = {1: 2.5, 2: 5, 3: 8, 4: 16, 5: 32, 6: 64}

_METRIC_OPTIONS = {
    "-u": "usage",
    "--usage": "usage",
    "-p": "power",
    "--power": "power",
    "-c": "clock",
    "--clock": "clock",
    "-t": "temperature",
    "--temperature": "temperature",
    "-P": "pcie",
    "--pcie": "pcie",
    "-e": "ecc",
    "--ecc": "ecc",
    "-m": "mem_usage",
    "--mem-usage": "mem_usage",
}
_STATIC_OPTIONS = {
    "-a": "asic",
    "--asic": "asic",
    "-b": "bus",
    "--bus": "bus",
    "-l": "limit",
    "--limit": "limit",
}


class _Refused(Exception):
    """What argparse says of a command line it does not take (exit status 2)."""


def _v(value: float | int, unit: str) -> dict[str, Any]:
    return {"value": value, "unit": unit}


def _throttled(c: GpuConditions, g: Gpu) -> str:
    return "THROTTLED" if g.index in c.thermal or g.index in c.power_cap else "UNTHROTTLED"


def _metric(g: Gpu, h: Health, c: GpuConditions) -> dict[str, Callable[[], Any]]:
    reserved = 0  # amd-smi counts the driver's own in used_vram: nothing apart
    return {
        "usage": lambda: {
            "gfx_activity": _v(g.utilization_pct, "%"),
            "umc_activity": _v(int(g.utilization_pct * 0.6), "%"),
            "mm_activity": "N/A",
        },
        "power": lambda: {
            "socket_power": _v(round(h.power_w), "W"),
            "gfx_voltage": "N/A",
            "soc_voltage": "N/A",
            "mem_voltage": "N/A",
            "throttle_status": _throttled(c, g),
            "power_management": "ENABLED",
        },
        "clock": lambda: {
            "gfx_0": {
                "clk": _v(h.clock_sm_mhz, "MHz"),
                "min_clk": _v(500, "MHz"),
                "max_clk": _v(h.clock_sm_max_mhz, "MHz"),
                "clk_locked": "N/A",
                "deep_sleep": "DISABLED" if g.processes else "ENABLED",
            },
            "mem_0": {
                "clk": _v(h.clock_mem_mhz, "MHz"),
                "min_clk": _v(900, "MHz"),
                "max_clk": _v(h.clock_mem_max_mhz, "MHz"),
                "clk_locked": "N/A",
                "deep_sleep": "DISABLED",
            },
        },
        "temperature": lambda: {
            "edge": _v(h.temperature_c - 12, "C"),
            "hotspot": _v(h.temperature_c, "C"),
            "mem": _v(h.temperature_c - 6, "C"),
        },
        "pcie": lambda: {
            "width": h.pcie_width,
            "speed": _v(GEN_GT_S[h.pcie_gen], "GT/s"),
            "bandwidth": "N/A",
            "replay_count": 0,
            "l0_to_recovery_count": 0,
            "replay_roll_over_count": 0,
            "nak_sent_count": 0,
            "nak_received_count": 0,
        },
        "ecc": lambda: {
            "total_correctable_count": 0,
            "total_uncorrectable_count": h.ecc_uncorrected,
            "total_deferred_count": 0,
            "cache_correctable_count": 0,
            "cache_uncorrectable_count": 0,
        },
        "mem_usage": lambda: {
            "total_vram": _v(g.memory_total_mib, "MB"),
            "used_vram": _v(g.memory_used_mib + reserved, "MB"),
            "free_vram": _v(max(0, g.memory_total_mib - g.memory_used_mib), "MB"),
            "total_visible_vram": _v(g.memory_total_mib, "MB"),
        },
    }


def _static(g: Gpu, h: Health) -> dict[str, Callable[[], Any]]:
    return {
        "asic": lambda: {
            "market_name": g.name,
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "device_id": "0x74a1",
            "rev_id": "0x00",
            "asic_serial": f"0x{zlib.crc32(g.uuid.encode()):016X}",
            "oam_id": g.index,
        },
        "bus": lambda: {
            "bdf": f"0000:{0x0C + g.index * 0x10:02x}:00.0",
            "max_pcie_width": h.pcie_width_max,
            "max_pcie_speed": _v(GEN_GT_S[h.pcie_gen_max], "GT/s"),
            "pcie_interface_version": f"Gen {h.pcie_gen_max}",
            "slot_type": "OAM",
        },
        "limit": lambda: {
            "max_power": _v(round(h.power_limit_w), "W"),
            "min_power": _v(0, "W"),
            "socket_power": _v(round(h.power_limit_w), "W"),
            "slowdown_edge_temperature": "N/A",
            "slowdown_hotspot_temperature": _v(h.slowdown_c, "C"),
            "slowdown_vram_temperature": _v(h.slowdown_c - 5, "C"),
            "shutdown_edge_temperature": "N/A",
            "shutdown_hotspot_temperature": _v(h.shutdown_c, "C"),
            "shutdown_vram_temperature": _v(h.shutdown_c - 5, "C"),
        },
    }


def _process(g: Gpu) -> list[dict[str, Any]]:
    if not g.processes:
        return [{"process_info": "No running processes detected"}]
    return [
        {
            "process_info": {
                "name": p.name,
                "pid": p.pid,
                "memory_usage": {
                    "gtt_mem": _v(0, "B"),
                    "cpu_mem": _v(0, "B"),
                    "vram_mem": _v(p.used_mib * MIB, "B"),
                },
                "mem_usage": _v(p.used_mib * MIB, "B"),
                "usage": {"gfx": _v(0, "ns"), "enc": _v(0, "ns")},
            }
        }
        for p in g.processes
    ]


def _sections(options: list[str], known: dict[str, str]) -> list[str]:
    wanted: list[str] = []
    for option in options:
        if option not in known:
            raise _Refused(f"unrecognized arguments: {option}")
        if known[option] not in wanted:
            wanted.append(known[option])
    return wanted


def render(argv: list[str], snap: gpustate.GpuSnapshot, conditions: GpuConditions) -> str:
    """The JSON `amd-smi ARGV` prints for these GPUs."""
    if not argv:
        raise _Refused("the following arguments are required: command")
    command, rest = argv[0], [a for a in argv[1:] if a != "--json"]
    if "--json" not in argv:
        raise _Refused("the twin's amd-smi answers --json only")
    out: list[dict[str, Any]] = []
    for g in snap.gpus:
        h = health(g, conditions)
        entry: dict[str, Any] = {"gpu": g.index}
        if command == "metric":
            table = _metric(g, h, conditions)
            for name in _sections(rest, _METRIC_OPTIONS) or list(table):
                entry[name] = table[name]()
        elif command == "static":
            table = _static(g, h)
            for name in _sections(rest, _STATIC_OPTIONS) or list(table):
                entry[name] = table[name]()
        elif command == "process":
            _sections(rest, {"-G": "general", "--general": "general"})
            entry["process_list"] = _process(g)
        else:
            raise _Refused(f"argument command: invalid choice: '{command}'")
        out.append(entry)
    return json.dumps(out, indent=4) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    layout = TwinLayout.from_env()
    cfg = layout.load_config()
    try:
        sys.stdout.write(render(args, gpustate.read(layout, cfg), read_conditions(layout)))
    except _Refused as exc:
        sys.stderr.write(f"usage: amd-smi [-h] ...\namd-smi: error: {exc}\n")
        return 2
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
