"""An NVML-style sampler: `k26-nvml-agent [--interval S] [--count N]` (or `python -m console.twin.nvml_agent`)
prints one JSON object per tick, `NvmlSample`, with the numbers NVML gives (bytes, percent).

On a twin host the numbers are the simulated GPUs'; a console source runs it over SSH as its "NVML agent"
back-end and reads the same shape a real agent built on pynvml would print.
"""

from __future__ import annotations

import argparse
import sys
import time

from pydantic import BaseModel

from console.twin import gpustate
from console.twin.layout import TwinLayout

MIB = 1024 * 1024


class NvmlProcess(BaseModel):
    pid: int
    name: str
    used_gpu_memory: int  # bytes, nvmlDeviceGetComputeRunningProcesses


class NvmlGpu(BaseModel):
    index: int
    name: str
    uuid: str
    memory_total: int  # bytes, nvmlDeviceGetMemoryInfo (v2: used without the driver's reservation)
    memory_used: int
    memory_reserved: int
    memory_free: int
    utilization_gpu: int  # percent, nvmlDeviceGetUtilizationRates
    utilization_memory: int
    processes: list[NvmlProcess]


class NvmlSample(BaseModel):
    ts: float
    driver_version: str
    gpus: list[NvmlGpu]


def sample(layout: TwinLayout) -> NvmlSample:
    from console.twin.gpuhealth import reserved_mib
    from console.twin.nvidia_smi import DRIVER_VERSION, _mem_util

    cfg = layout.load_config()
    snap = gpustate.read(layout, cfg)
    return NvmlSample(
        ts=time.time(),
        driver_version=DRIVER_VERSION,
        gpus=[
            NvmlGpu(
                index=g.index,
                name=g.name,
                uuid=g.uuid,
                memory_total=g.memory_total_mib * MIB,
                memory_used=g.memory_used_mib * MIB,
                memory_reserved=reserved_mib(g) * MIB,
                memory_free=max(0, g.memory_total_mib - g.memory_used_mib - reserved_mib(g)) * MIB,
                utilization_gpu=g.utilization_pct,
                utilization_memory=_mem_util(g),
                processes=[
                    NvmlProcess(pid=p.pid, name=p.name, used_gpu_memory=p.used_mib * MIB) for p in g.processes
                ],
            )
            for g in snap.gpus
        ],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="k26-nvml-agent")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--count", type=int, default=0, help="stop after N samples (0: run until killed)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    layout = TwinLayout.from_env()
    n = 0
    try:
        while True:
            sys.stdout.write(sample(layout).model_dump_json() + "\n")
            sys.stdout.flush()
            n += 1
            if args.count and n >= args.count:
                return 0
            time.sleep(max(args.interval, 0.01))
    except (BrokenPipeError, KeyboardInterrupt):
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
