"""`pynvml` for a twin host: the calls of nvidia-ml-py that the console's GPU agent makes, answered with the
simulated GPUs' numbers (console.twin.gpustate, the same numbers the twin's `nvidia-smi` prints).

SGLang requires nvidia-ml-py (`Requires-Dist: nvidia-ml-py` in the 0.5.5 wheel), so the python3 of a real
SGLang host imports `pynvml` and the console reads its GPUs through one long-lived agent process rather
than two `nvidia-smi` runs a tick. The twin's `python3` (console.twin.layout) finds this module as
`pynvml`; a twin made with `nvml=False` plays a host whose python3 has no nvidia-ml-py, and the console
falls back to `nvidia-smi` there.

Each `nvmlDeviceGetCount()` reads the GPUs afresh, as the agent calls it once a sample; the per-device
calls that follow answer from that reading, so a sample is one consistent snapshot.

A GPU that fell off the bus (its XID 79, `GpuConditions.lost`) answers every call with NVMLError_GpuIsLost,
its handle's included, as NVML does. The driver it plays is the twin's `GpuConditions`
(console.twin.gpuhealth): v2 memory info (used without
the driver's reservation, `reserved` apart, as nvidia-smi reads it) or a driver before R510 that has v1
only (`nvmlDeviceGetMemoryInfo_v2` missing: NVMLError_FunctionNotFound; used includes the reservation);
the health calls; and XID critical-error events, delivered to an event set registered before they happen
(as NVML does: an event set never hears of what came before it).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from console.twin import gpustate
from console.twin.gpuhealth import GpuConditions, Health, health, lost_gpus, read_conditions, reserved_mib
from console.twin.gpustate import GpuSnapshot
from console.twin.layout import ROOT_ENV, TwinLayout
from console.twin.nvidia_smi import _mem_util

MIB = 1024 * 1024


# The names below are nvidia-ml-py's own (camelCase and all), as the agent calls them.

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_FUNCTION_NOT_FOUND = 13


class NVMLError(Exception):
    value = 999  # NVML_ERROR_UNKNOWN; each subclass its own code, as nvidia-ml-py's `value`


class NVMLError_Uninitialized(NVMLError):
    value = 1


class NVMLError_InvalidArgument(NVMLError):
    value = 2


class NVMLError_NotSupported(NVMLError):
    value = NVML_ERROR_NOT_SUPPORTED


class NVMLError_NotFound(NVMLError):
    value = 6


class NVMLError_LibraryNotFound(NVMLError):
    value = 12


class NVMLError_Timeout(NVMLError):
    value = NVML_ERROR_TIMEOUT


class NVMLError_FunctionNotFound(NVMLError):
    value = NVML_ERROR_FUNCTION_NOT_FOUND


class NVMLError_GpuIsLost(NVMLError):
    value = (
        15  # NVML_ERROR_GPU_IS_LOST: "The GPU has fallen off the bus or has otherwise become inaccessible"
    )


NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
nvmlEventTypeXidCriticalError = 0x8
nvmlMemory_v2 = 0x02000028


@dataclass(frozen=True)
class c_nvmlMemory_t:
    total: int
    free: int
    used: int


@dataclass(frozen=True)
class c_nvmlMemory_v2_t:
    version: int
    total: int
    reserved: int
    free: int
    used: int


@dataclass(frozen=True)
class c_nvmlEventData_t:
    device: _Handle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0
    computeInstanceId: int = 0


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


@dataclass
class _EventSet:
    since: float = field(default_factory=time.time)
    """Events before the set existed are not its to hear."""
    devices: set[int] = field(default_factory=set)
    heard: set[tuple[int, int, float]] = field(default_factory=set)


class _Library:
    def __init__(self) -> None:
        self.layout: TwinLayout | None = None
        self.snap: GpuSnapshot | None = None
        self.conditions = GpuConditions()
        self.health: dict[int, Health] = {}

    def read(self) -> GpuSnapshot:
        if self.layout is None:
            raise NVMLError_Uninitialized("Uninitialized")
        self.snap = gpustate.read(self.layout, self.layout.load_config())
        self.conditions = read_conditions(self.layout)
        self.health = {g.index: health(g, self.conditions) for g in self.snap.gpus}
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
    from console.twin.nvidia_smi import DRIVER_VERSION, V1_DRIVER_VERSION

    return DRIVER_VERSION if _lib.conditions.driver_memory == "v2" else V1_DRIVER_VERSION


def nvmlDeviceGetCount() -> int:
    return len(_lib.read().gpus)


def _gpu(handle: _Handle) -> gpustate.Gpu:
    if not isinstance(handle, _Handle):
        raise NVMLError_InvalidArgument("Invalid Argument")
    if handle.index in lost_gpus(_lib.conditions):
        raise NVMLError_GpuIsLost("GPU is lost")  # every call on it, its handle's included
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


def nvmlDeviceGetMemoryInfo(
    handle: _Handle, version: int | None = None
) -> c_nvmlMemory_t | c_nvmlMemory_v2_t:
    gpu = _gpu(handle)
    total, used, reserved = gpu.memory_total_mib * MIB, gpu.memory_used_mib * MIB, reserved_mib(gpu) * MIB
    free = max(0, total - used - reserved)
    if not version:
        # v1: the driver's reservation counted in used, as every driver's v1 answers
        return c_nvmlMemory_t(total=total, free=free, used=min(total, used + reserved))
    if _lib.conditions.driver_memory == "v1":
        raise NVMLError_FunctionNotFound("Function Not Found")  # no nvmlDeviceGetMemoryInfo_v2 before R510
    return c_nvmlMemory_v2_t(version=version, total=total, reserved=reserved, free=free, used=used)


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


def nvmlDeviceGetIndex(handle: _Handle) -> int:
    # what the event set's device says of itself: a lost GPU's XID still names it
    if not isinstance(handle, _Handle):
        raise NVMLError_InvalidArgument("Invalid Argument")
    return handle.index


def _health(handle: _Handle) -> Health:
    return _lib.health[_gpu(handle).index]


def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
    return _health(handle).temperature_c


def nvmlDeviceGetTemperatureThreshold(handle: _Handle, threshold: int) -> int:
    h = _health(handle)
    return h.slowdown_c if threshold == NVML_TEMPERATURE_THRESHOLD_SLOWDOWN else h.shutdown_c


def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
    return round(_health(handle).power_w * 1000)  # mW


def nvmlDeviceGetEnforcedPowerLimit(handle: _Handle) -> int:
    return round(_health(handle).power_limit_w * 1000)


def nvmlDeviceGetClockInfo(handle: _Handle, clock: int) -> int:
    h = _health(handle)
    return h.clock_sm_mhz if clock == NVML_CLOCK_SM else h.clock_mem_mhz


def nvmlDeviceGetMaxClockInfo(handle: _Handle, clock: int) -> int:
    h = _health(handle)
    return h.clock_sm_max_mhz if clock == NVML_CLOCK_SM else h.clock_mem_max_mhz


def nvmlDeviceGetMemoryBusWidth(handle: _Handle) -> int:
    return _health(handle).bus_width_bits


def nvmlDeviceGetCurrentClocksEventReasons(handle: _Handle) -> int:
    if _lib.conditions.driver_memory == "v1":
        raise NVMLError_FunctionNotFound("Function Not Found")  # the R535 name
    return _health(handle).reasons


def nvmlDeviceGetCurrentClocksThrottleReasons(handle: _Handle) -> int:
    return _health(handle).reasons


def nvmlDeviceGetPerformanceState(handle: _Handle) -> int:
    return _health(handle).pstate


def nvmlDeviceGetEccMode(handle: _Handle) -> tuple[int, int]:
    _gpu(handle)
    return (1, 1)  # current, pending: enabled


def nvmlDeviceGetTotalEccErrors(handle: _Handle, error_type: int, counter_type: int) -> int:
    h = _health(handle)
    return h.ecc_uncorrected if error_type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED else 0


def nvmlDeviceGetRemappedRows(handle: _Handle) -> tuple[int, int, int, int]:
    h = _health(handle)
    return (0, h.remapped_uncorrectable, int(h.remap_pending), int(h.remap_failed))


def nvmlDeviceGetCurrPcieLinkGeneration(handle: _Handle) -> int:
    return _health(handle).pcie_gen


def nvmlDeviceGetMaxPcieLinkGeneration(handle: _Handle) -> int:
    return _health(handle).pcie_gen_max


def nvmlDeviceGetCurrPcieLinkWidth(handle: _Handle) -> int:
    return _health(handle).pcie_width


def nvmlDeviceGetMaxPcieLinkWidth(handle: _Handle) -> int:
    return _health(handle).pcie_width_max


def nvmlDeviceGetFanSpeed(handle: _Handle) -> int:
    _gpu(handle)
    raise NVMLError_NotSupported("Not Supported")  # a passively cooled data-centre card, as the H200


# ---- XID events ------------------------------------------------------------------------------------

_POLL_S = 0.1
"""How often a waiting event set looks for a new XID in the twin's conditions."""


def nvmlEventSetCreate() -> _EventSet:
    if _lib.layout is None:
        raise NVMLError_Uninitialized("Uninitialized")
    return _EventSet()


def nvmlDeviceRegisterEvents(handle: _Handle, event_types: int, event_set: _EventSet) -> None:
    if event_types & nvmlEventTypeXidCriticalError:
        event_set.devices.add(_gpu(handle).index)


def nvmlEventSetWait_v2(event_set: _EventSet, timeoutms: int) -> c_nvmlEventData_t:
    """The next XID of a registered GPU raised since the set was made, within `timeoutms`; else
    NVMLError_Timeout, as NVML answers."""
    if _lib.layout is None:
        raise NVMLError_Uninitialized("Uninitialized")
    deadline = time.monotonic() + max(0, timeoutms) / 1000
    while True:
        now = time.time()
        for xid in read_conditions(_lib.layout).xids:
            key = (xid.gpu, xid.xid, xid.at)
            mine = xid.gpu in event_set.devices and key not in event_set.heard
            if mine and event_set.since <= xid.at <= now:
                event_set.heard.add(key)
                return c_nvmlEventData_t(
                    device=_Handle(xid.gpu), eventType=nvmlEventTypeXidCriticalError, eventData=xid.xid
                )
        left = deadline - time.monotonic()
        if left <= 0:
            raise NVMLError_Timeout("Timeout")
        time.sleep(min(_POLL_S, left))


def nvmlEventSetWait(event_set: _EventSet, timeoutms: int) -> c_nvmlEventData_t:
    return nvmlEventSetWait_v2(event_set, timeoutms)


def nvmlEventSetFree(event_set: _EventSet) -> None:
    event_set.devices.clear()
