"""`pynvml` for a twin host: the calls of nvidia-ml-py that the console's GPU agent makes, answered with the
simulated GPUs' numbers (console.twin.gpustate, the same numbers the twin's `nvidia-smi` prints).

SGLang requires nvidia-ml-py (`Requires-Dist: nvidia-ml-py` in the 0.5.5 wheel), so the python3 of a real
SGLang host imports `pynvml` and the console reads its GPUs through one long-lived agent process rather
than two `nvidia-smi` runs a tick. The twin's `python3` (console.twin.layout) finds this module as
`pynvml`; a twin made with `nvml=False` plays a host whose python3 has no nvidia-ml-py, and the console
falls back to `nvidia-smi` there.

Each `nvmlDeviceGetCount()` reads the GPUs afresh, as the agent calls it once a sample; the per-device
calls that follow answer from that reading, so a sample is one consistent snapshot.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from console.twin import gpustate
from console.twin.gpustate import GpuSnapshot
from console.twin.layout import ROOT_ENV, TwinLayout
from console.twin.nvidia_smi import _mem_util

MIB = 1024 * 1024


# The names below are nvidia-ml-py's own (camelCase and all), as the agent calls them.


class NVMLError(Exception):
    pass


class NVMLError_Uninitialized(NVMLError):
    pass


class NVMLError_InvalidArgument(NVMLError):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_NotFound(NVMLError):
    pass


@dataclass(frozen=True)
class c_nvmlMemory_t:
    total: int
    free: int
    used: int


@dataclass(frozen=True)
class c_nvmlUtilization_t:
    gpu: int
    memory: int


@dataclass(frozen=True)
class c_nvmlProcessInfo_t:
    pid: int
    usedGpuMemory: int


@dataclass(frozen=True)
class _Handle:
    index: int


class _Library:
    def __init__(self) -> None:
        self.layout: TwinLayout | None = None
        self.snap: GpuSnapshot | None = None

    def read(self) -> GpuSnapshot:
        if self.layout is None:
            raise NVMLError_Uninitialized("Uninitialized")
        self.snap = gpustate.read(self.layout, self.layout.load_config())
        return self.snap

    def current(self) -> GpuSnapshot:
        return self.snap if self.snap is not None else self.read()


_lib = _Library()


def nvmlInit() -> None:
    # Outside a twin session there is no GPU to read: as a machine without the driver's library.
    root = os.environ.get(ROOT_ENV)
    if not root:
        raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")
    _lib.layout = TwinLayout(Path(root))
    _lib.read()


def nvmlShutdown() -> None:
    _lib.layout = None
    _lib.snap = None


def nvmlSystemGetDriverVersion() -> str:
    from console.twin.nvidia_smi import DRIVER_VERSION

    return DRIVER_VERSION


def nvmlDeviceGetCount() -> int:
    return len(_lib.read().gpus)


def _gpu(handle: _Handle) -> gpustate.Gpu:
    if not isinstance(handle, _Handle):
        raise NVMLError_InvalidArgument("Invalid Argument")
    for gpu in _lib.current().gpus:
        if gpu.index == handle.index:
            return gpu
    raise NVMLError_NotFound("Not Found")


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    handle = _Handle(index)
    _gpu(handle)
    return handle


def nvmlDeviceGetName(handle: _Handle) -> str:
    return _gpu(handle).name


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    return _gpu(handle).uuid


def nvmlDeviceGetMemoryInfo(handle: _Handle) -> c_nvmlMemory_t:
    gpu = _gpu(handle)
    total, used = gpu.memory_total_mib * MIB, gpu.memory_used_mib * MIB
    return c_nvmlMemory_t(total=total, free=max(0, total - used), used=used)


def nvmlDeviceGetUtilizationRates(handle: _Handle) -> c_nvmlUtilization_t:
    gpu = _gpu(handle)
    return c_nvmlUtilization_t(gpu=gpu.utilization_pct, memory=_mem_util(gpu))


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[c_nvmlProcessInfo_t]:
    return [c_nvmlProcessInfo_t(pid=p.pid, usedGpuMemory=p.used_mib * MIB) for p in _gpu(handle).processes]


def nvmlSystemGetProcessName(pid: int) -> str:
    for gpu in _lib.current().gpus:
        for proc in gpu.processes:
            if proc.pid == pid:
                return proc.name
    raise NVMLError_NotFound("Not Found")
