"""The simulated GPUs as the simulated server publishes them (`<root>/gpu/gpus.json`).

When no server has written the file yet, or its writer is gone without resetting it (killed), the GPUs
are idle: the inventory comes from the twin's scenario, recorded in twin.json when the twin was made.
"""

from __future__ import annotations

import hashlib
import time

from pydantic import BaseModel, ValidationError

from console.twin.layout import TwinConfig, TwinLayout
from console.twin.scenarios import get_scenario
from console.twin.server_memory import gpus_held
from console.twin.units import pid_alive

# A driver reports this much used on an idle GPU (context-less): what nvidia-smi shows with no process.
IDLE_USED_MIB = 0


class GpuProcess(BaseModel):
    pid: int
    name: str
    used_mib: int


class Gpu(BaseModel):
    index: int
    name: str
    uuid: str
    memory_total_mib: int
    memory_used_mib: int
    utilization_pct: int = 0
    processes: list[GpuProcess] = []
    breakdown_mib: dict[str, float] = {}


class GpuSnapshot(BaseModel):
    updated: float
    pid: int = 0
    gpus: list[Gpu]


def gpu_uuid(cfg: TwinConfig, index: int) -> str:
    """The same UUID the simulated server reports for this GPU, so a GPU keeps its identity across boots."""
    try:
        return get_scenario(cfg.scenario).gpu_uuid(index)
    except KeyError:
        h = hashlib.sha1(f"{cfg.machine_id}-{index}".encode()).hexdigest()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def idle(cfg: TwinConfig) -> GpuSnapshot:
    inv = cfg.gpus
    return GpuSnapshot(
        updated=time.time(),
        gpus=[
            Gpu(
                index=i,
                name=inv.name,
                uuid=gpu_uuid(cfg, i),
                memory_total_mib=inv.total_mib,
                memory_used_mib=IDLE_USED_MIB,
            )
            for i in range(inv.count)
        ],
    )


def read(layout: TwinLayout, cfg: TwinConfig) -> GpuSnapshot:
    try:
        snap = GpuSnapshot.model_validate_json(layout.gpus_json.read_bytes())
    except (FileNotFoundError, ValidationError, ValueError):
        return idle(cfg)
    held = gpus_held(layout.gpu_dir)
    if held is False or (held is None and snap.pid and not pid_alive(snap.pid)):
        return idle(cfg)
    return snap
