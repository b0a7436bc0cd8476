"""The twin's GPU health and driver: what its `nvidia-smi` and `pynvml` stand-ins answer beyond memory and
utilisation, and the faults a test (or `GPU_SCENARIOS`) makes them play.

One function (`health`) gives every figure of one simulated GPU, so the stand-ins agree as a real driver's
NVML and nvidia-smi do. The figures follow the card (clocks, bus width, power limit from `CARDS`) and what
the GPU does (a GPU holding a server runs at P0 with its boost clock; an empty one idles). The conditions
(`<root>/gpu/conditions.json`, `write_conditions`) are the driver's age (v2 memory info or v1 only) and the
faults: thermal slowdown, a power cap, a degraded PCIe link, ECC errors, row remaps, XID events.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ValidationError

from console.twin.gpustate import Gpu
from console.twin.layout import TwinLayout, write_atomic

RESERVED_SHARE = 615.0625 / 143_771
"""The driver's reservation as a share of the card's memory: what a real H200 reserves (615 MiB of
143,771: shared/reference/real-gpu-h200)."""


@dataclass(frozen=True)
class Card:
    sm_max_mhz: int
    mem_max_mhz: int
    """NVML's maximum memory clock: half the data rate (HBM and GDDR alike move data on both edges)."""
    bus_width_bits: int
    power_limit_w: float
    idle_power_w: float
    pcie_gen_max: int = 5
    pcie_width_max: int = 16
    slowdown_c: int = 89
    shutdown_c: int = 95


CARDS: dict[str, Card] = {
    # 2 × 14,001 MHz × 512 bits / 8 = 1,792 GB/s, the card table's figure
    "RTX PRO 6000": Card(2430, 14_001, 512, 600.0, 32.0, slowdown_c=90, shutdown_c=98),
    # 2 × 2,619 × 5,120 / 8 = 3,352 GB/s
    "H100": Card(1980, 2619, 5120, 700.0, 70.0),
    # the real H200's own figures: 2 × 3,201 × 6,016 / 8 = 4,814 GB/s
    "H200": Card(1980, 3201, 6016, 700.0, 79.0),
    # the twin's own figures for an MI300X (750 W OAM, 2,100 MHz peak engine clock, PCIe gen 5 x16); the
    # slowdown and shutdown points are the hotspot's, as amd-smi's limits give them
    "MI300X": Card(2100, 1300, 8192, 750.0, 140.0, slowdown_c=100, shutdown_c=105),
}
DEFAULT_CARD = CARDS["H100"]


def card_of(name: str) -> Card:
    for key, card in CARDS.items():
        if key in name:
            return card
    return DEFAULT_CARD


class XidFault(BaseModel):
    gpu: int
    xid: int
    at: float
    """When the driver raises it (Unix time): an event set registered before then receives it."""


class GpuConditions(BaseModel):
    """The twin's driver and the faults its GPUs play (`<root>/gpu/conditions.json`)."""

    driver_memory: Literal["v2", "v1"] = "v2"
    """`v1`: a driver before R510, whose NVML has no v2 memory info and whose nvidia-smi counts the
    reservation in used and has no `memory.reserved` (nor the R535 name `clocks_event_reasons`)."""
    thermal: list[int] = []
    """GPUs in thermal slowdown: past their slowdown temperature, SM clock held down."""
    power_cap: list[int] = []
    """GPUs held at their power limit (SW power cap)."""
    pcie_degraded: list[int] = []
    """GPUs whose PCIe link trained at gen 4 x8 instead of its maximum."""
    ecc_uncorrected: dict[int, int] = {}
    """GPU → uncorrectable ECC errors since the driver loaded."""
    remap_pending: list[int] = []
    remap_failed: list[int] = []
    xids: list[XidFault] = []
    lost: list[int] = []
    """GPUs that no longer answer their driver; a GPU also does from its XID 79 on (`lost_gpus`)."""


GPU_SCENARIOS: dict[str, GpuConditions] = {
    "thermal": GpuConditions(thermal=[3]),
    "power-cap": GpuConditions(power_cap=[0, 1, 2, 3, 4, 5, 6, 7]),
    "pcie-degraded": GpuConditions(pcie_degraded=[5]),
    "ecc": GpuConditions(ecc_uncorrected={2: 1}, remap_pending=[2]),
    "v1-driver": GpuConditions(driver_memory="v1"),
}
"""Named faults for tests and demos; an XID is `xid_now` (it must come after an event set exists)."""


def xid_now(gpu: int = 3, xid: int = 79, at: float | None = None) -> GpuConditions:
    """An XID raised now (79: the GPU fell off the bus), for consoles already watching; or at `at`."""
    return GpuConditions(xids=[XidFault(gpu=gpu, xid=xid, at=time.time() if at is None else at)])


def lost_gpus(conditions: GpuConditions, now: float | None = None) -> set[int]:
    """The GPUs the driver cannot reach at `now`: those said lost, and each from its XID 79 on."""
    now = time.time() if now is None else now
    return set(conditions.lost) | {x.gpu for x in conditions.xids if x.xid == 79 and x.at <= now}


GPU_FAULTS: tuple[str, ...] = ("thermal", "power", "xid79", "pcie")
"""What `k26-console twin --gpu-fault` plays."""
XID79_AFTER_S = 60.0
"""`--gpu-fault xid79`: GPU 3 falls off the bus this long after the twin is up, so that a console opened
meanwhile watches it happen mid-decode (NVML tells only the event sets made before an XID)."""


def fault_conditions(
    fault: str, *, now: float | None = None, after_s: float = XID79_AFTER_S
) -> GpuConditions:
    """The conditions of one `--gpu-fault`: GPU 3 in thermal slowdown, all eight at their power cap, GPU 5's
    PCIe link at gen 4 x8, or GPU 3's XID 79 `after_s` from `now` (lost from then on)."""
    if fault == "thermal":
        return GPU_SCENARIOS["thermal"]
    if fault == "power":
        return GPU_SCENARIOS["power-cap"]
    if fault == "pcie":
        return GPU_SCENARIOS["pcie-degraded"]
    if fault == "xid79":
        return xid_now(gpu=3, xid=79, at=(time.time() if now is None else now) + after_s)
    raise ValueError(f"unknown GPU fault {fault!r} (known: {', '.join(GPU_FAULTS)})")


def read_conditions(layout: TwinLayout) -> GpuConditions:
    try:
        return GpuConditions.model_validate_json((layout.gpu_dir / "conditions.json").read_bytes())
    except (FileNotFoundError, ValidationError, ValueError):
        return GpuConditions()


def write_conditions(layout: TwinLayout, conditions: GpuConditions) -> None:
    layout.gpu_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(layout.gpu_dir / "conditions.json", conditions.model_dump_json())


def reserved_mib(gpu: Gpu) -> int:
    return round(gpu.memory_total_mib * RESERVED_SHARE)


@dataclass(frozen=True)
class Health:
    temperature_c: int
    slowdown_c: int
    shutdown_c: int
    power_w: float
    power_limit_w: float
    clock_sm_mhz: int
    clock_sm_max_mhz: int
    clock_mem_mhz: int
    clock_mem_max_mhz: int
    bus_width_bits: int
    reasons: int
    pstate: int
    ecc_uncorrected: int
    remapped_uncorrectable: int
    remap_pending: bool
    remap_failed: bool
    pcie_gen: int
    pcie_gen_max: int
    pcie_width: int
    pcie_width_max: int


def health(gpu: Gpu, conditions: GpuConditions) -> Health:
    """Every health figure of one simulated GPU: a GPU that holds a server works (P0, boost clock, its
    power by its utilization); one that holds nothing idles (P8, low clocks, the idle reason)."""
    card = card_of(gpu.name)
    working = bool(gpu.processes)
    i = gpu.index
    temperature = 34 + gpu.utilization_pct * 40 // 100
    power = card.idle_power_w + (card.power_limit_w - card.idle_power_w) * gpu.utilization_pct / 100
    sm = card.sm_max_mhz if working else 180
    reasons = 0x0 if working else 0x1  # GPU idle
    if i in conditions.thermal:
        # past the slowdown point: the driver's SW thermal slowdown, then the hardware's own
        temperature = card.slowdown_c + 2
        sm = card.sm_max_mhz * 6 // 10
        reasons |= 0x20 | 0x40 | 0x08
    if i in conditions.power_cap:
        power = card.power_limit_w
        sm = min(sm, card.sm_max_mhz * 8 // 10)
        reasons |= 0x04
    gen, width = card.pcie_gen_max, card.pcie_width_max
    if i in conditions.pcie_degraded:
        gen, width = max(1, card.pcie_gen_max - 1), card.pcie_width_max // 2
    ecc = conditions.ecc_uncorrected.get(i, 0)
    return Health(
        temperature_c=temperature,
        slowdown_c=card.slowdown_c,
        shutdown_c=card.shutdown_c,
        power_w=round(power, 2),
        power_limit_w=card.power_limit_w,
        clock_sm_mhz=sm,
        clock_sm_max_mhz=card.sm_max_mhz,
        clock_mem_mhz=card.mem_max_mhz if working else 405,
        clock_mem_max_mhz=card.mem_max_mhz,
        bus_width_bits=card.bus_width_bits,
        reasons=reasons,
        pstate=0 if working else 8,
        ecc_uncorrected=ecc,
        remapped_uncorrectable=ecc,
        remap_pending=i in conditions.remap_pending,
        remap_failed=i in conditions.remap_failed,
        pcie_gen=gen,
        pcie_gen_max=card.pcie_gen_max,
        pcie_width=width,
        pcie_width_max=card.pcie_width_max,
    )
