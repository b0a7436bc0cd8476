"""What runs on the GPU host to read its GPUs: the NVML reading (sent to remote hosts as source text, so it
uses only its `nvml` argument and builtins, in Python 3.6-compatible syntax: the host's python3 is whatever
SGLang runs on), the agent script built from it, and the nvidia-smi command lines.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from console.core.gpus import APPS_QUERY_FIELDS, SMI_QUERY_FIELDS

# ---- NVML reading, shared by the local sampler and the agent script -----------------------------------
# These two functions are sent to remote hosts as source text: they use only their `nvml` argument and
# builtins, and Python 3.6-compatible syntax (the host's python3 is whatever SGLang runs on).


def _nvml_start(nvml: Any) -> dict[str, Any] | None:
    """Initialise NVML; None when ready, else the sample that says why not."""
    missing = getattr(nvml, "NVMLError_LibraryNotFound", None)
    try:
        nvml.nvmlInit()
    except Exception as exc:
        if missing is not None and isinstance(exc, missing):
            return {"state": "nvml_missing", "detail": "the NVML library is not installed on this host."}
        return {"state": "error", "detail": "NVML did not start: " + str(exc) + "."}
    return None


def _nvml_sample(nvml: Any, xids: list[list[Any]] | None = None) -> dict[str, Any]:
    """One sample of every GPU, as a plain dict of the `HostGpuSample` fields (a figure NVML does not give
    left out, never 0). `xids`: the XID events seen so far, `[GPU index, XID, time]` (`_nvml_xid_wait`)."""
    import time

    def text(value: object) -> object:
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else value

    def call(fn: Callable[..., Any], *args: object) -> Any:
        # Each field on its own: a card that cannot report one thing still reports the rest.
        try:
            return fn(*args)
        except Exception:
            return None

    def get(name: str, *args: object) -> Any:
        # By name: an older nvidia-ml-py lacks the newer calls, a stand-in lacks what it does not play.
        fn = getattr(nvml, name, None)
        return call(fn, *args) if fn is not None else None

    def const(name: str, default: int) -> Any:
        return getattr(nvml, name, default)

    def number(value: object, scale: float = 1.0) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return value / scale

    def memory_info(handle: object) -> tuple[Any, str | None]:
        # v2 as nvidia-smi reads it (used without the driver's reservation); v1 where the driver or the
        # nvidia-ml-py has no v2 (NVMLError_FunctionNotFound, or no `version` argument: TypeError).
        v2 = getattr(nvml, "nvmlMemory_v2", None)
        if v2 is not None:
            try:
                return nvml.nvmlDeviceGetMemoryInfo(handle, version=v2), "v2"
            except Exception:
                pass
        memory = call(nvml.nvmlDeviceGetMemoryInfo, handle)
        return memory, ("v1" if memory is not None else None)

    def xids_of(index: int) -> list[dict[str, Any]]:
        return [
            {"xid": xid, "age_s": round(max(0.0, now - at), 3), "at": round(at, 3)}
            for seen_index, xid, at in (xids or [])
            if seen_index == index and now - at <= 3600.0
        ][-16:]

    def lost(index: int, exc: Exception) -> dict[str, Any]:
        said = {"index": index, "lost": True, "lost_reason": "NVML: " + str(exc)}
        if xids_of(index):
            said["xids"] = xids_of(index)
        return said

    mib = 1024.0 * 1024.0
    try:
        count = nvml.nvmlDeviceGetCount()
    except Exception as exc:
        return {"state": "error", "detail": "NVML could not count the GPUs: " + str(exc) + "."}
    now = time.time()
    gpus: list[dict[str, Any]] = []
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            # NVML_ERROR_GPU_IS_LOST (15), or its Unknown Error (999) for a GPU that fell off the bus:
            # nvidia-smi says "Unable to determine the device handle" of the same two
            if getattr(exc, "value", None) in (15, 999):
                gpus.append(lost(index, exc))
            else:
                gpus.append({"index": index})
            continue
        memory, api = memory_info(handle)
        if memory is None and getattr(nvml, "nvmlDeviceGetMemoryInfo", None) is not None:
            try:
                nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception as exc:
                if getattr(exc, "value", None) == 15:  # it answered for its handle, then fell off
                    gpus.append(lost(index, exc))
                    continue
        rates = call(nvml.nvmlDeviceGetUtilizationRates, handle)
        processes: list[dict[str, Any]] = []
        for proc in call(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []:
            pid = getattr(proc, "pid", None)
            used = getattr(proc, "usedGpuMemory", None)
            name = call(nvml.nvmlSystemGetProcessName, pid) if pid is not None else None
            processes.append(
                {
                    "pid": pid,
                    "name": text(name),
                    "used_memory_mib": used / mib if isinstance(used, int) else None,
                }
            )
        sm, mem = const("NVML_CLOCK_SM", 1), const("NVML_CLOCK_MEM", 2)
        reasons = get("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if reasons is None:
            reasons = get("nvmlDeviceGetCurrentClocksThrottleReasons", handle)  # before R535
        ecc = get("nvmlDeviceGetEccMode", handle)
        uncorrected = const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
        corrected = const("NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
        volatile = const("NVML_VOLATILE_ECC", 0)
        rows = get("nvmlDeviceGetRemappedRows", handle)
        rows = rows if isinstance(rows, (tuple, list)) and len(rows) == 4 else (None,) * 4
        pstate = get("nvmlDeviceGetPerformanceState", handle)
        gpu = {
            "index": index,
            "name": text(call(nvml.nvmlDeviceGetName, handle)),
            "uuid": text(call(nvml.nvmlDeviceGetUUID, handle)),
            "utilization_pct": getattr(rates, "gpu", None),
            "memory_used_mib": memory.used / mib if memory is not None else None,
            "memory_total_mib": memory.total / mib if memory is not None else None,
            "memory_reserved_mib": number(getattr(memory, "reserved", None), mib) if api == "v2" else None,
            "memory_info": api,
            "processes": processes,
            "temperature_c": get("nvmlDeviceGetTemperature", handle, const("NVML_TEMPERATURE_GPU", 0)),
            "temperature_slowdown_c": get(
                "nvmlDeviceGetTemperatureThreshold", handle, const("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1)
            ),
            "temperature_shutdown_c": get(
                "nvmlDeviceGetTemperatureThreshold", handle, const("NVML_TEMPERATURE_THRESHOLD_SHUTDOWN", 0)
            ),
            "power_w": number(get("nvmlDeviceGetPowerUsage", handle), 1000.0),
            "power_limit_w": number(get("nvmlDeviceGetEnforcedPowerLimit", handle), 1000.0),
            "clock_sm_mhz": get("nvmlDeviceGetClockInfo", handle, sm),
            "clock_sm_max_mhz": get("nvmlDeviceGetMaxClockInfo", handle, sm),
            "clock_mem_mhz": get("nvmlDeviceGetClockInfo", handle, mem),
            "clock_mem_max_mhz": get("nvmlDeviceGetMaxClockInfo", handle, mem),
            "clock_event_reasons": reasons,
            # NVML_PSTATE_UNKNOWN is 32: not a state
            "pstate": pstate if isinstance(pstate, int) and 0 <= pstate <= 15 else None,
            "ecc_enabled": bool(ecc[0]) if isinstance(ecc, (tuple, list)) and ecc else None,
            "ecc_corrected_volatile": get("nvmlDeviceGetTotalEccErrors", handle, corrected, volatile),
            "ecc_uncorrected_volatile": get("nvmlDeviceGetTotalEccErrors", handle, uncorrected, volatile),
            "remapped_rows_correctable": rows[0],
            "remapped_rows_uncorrectable": rows[1],
            "remap_pending": bool(rows[2]) if rows[2] is not None else None,
            "remap_failed": bool(rows[3]) if rows[3] is not None else None,
            "pcie_gen": get("nvmlDeviceGetCurrPcieLinkGeneration", handle),
            "pcie_gen_max": get("nvmlDeviceGetMaxPcieLinkGeneration", handle),
            "pcie_width": get("nvmlDeviceGetCurrPcieLinkWidth", handle),
            "pcie_width_max": get("nvmlDeviceGetMaxPcieLinkWidth", handle),
            "memory_bus_width_bits": get("nvmlDeviceGetMemoryBusWidth", handle),
            "xids": xids_of(index),
        }
        # What NVML did not give is left out: the line stays short, and absent reads as absent.
        gpus.append({k: v for k, v in gpu.items() if v is not None and v != []})
    return {"state": "ok" if gpus else "no_gpus", "gpus": gpus}


def _nvml_xid_watch(nvml: Any) -> Any:
    """An NVML event set with every GPU registered for XID critical errors; None where NVML cannot (an
    older driver, a container without the rights, a stand-in that does not play events)."""
    kind = getattr(nvml, "nvmlEventTypeXidCriticalError", 8)
    try:
        events = nvml.nvmlEventSetCreate()
        count = nvml.nvmlDeviceGetCount()
    except Exception:
        return None
    registered = 0
    for index in range(count):
        try:
            nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(index), kind, events)
            registered += 1
        except Exception:
            pass
    if not registered:
        try:  # noqa: SIM105 (sent as source: no contextlib import on the host's side)
            nvml.nvmlEventSetFree(events)
        except Exception:
            pass
        return None
    return events


def _nvml_xid_wait(nvml: Any, events: Any, wait_s: float, seen: list[list[Any]]) -> bool:
    """Wait up to `wait_s` for XID events (0: take those already there), each added to `seen` as
    `[GPU index, XID, time]` (the last 64, of the last hour). False when waiting itself fails: the
    caller stops asking and sleeps instead."""
    import time

    wait = getattr(nvml, "nvmlEventSetWait_v2", None) or getattr(nvml, "nvmlEventSetWait", None)
    if wait is None:
        return False
    deadline = time.time() + wait_s
    for _ in range(256):  # an event storm still ends the wait
        left = max(0, int((deadline - time.time()) * 1000))
        try:
            data = wait(events, left)
        except Exception as exc:
            # NVML_ERROR_TIMEOUT (10): no event within the wait, the usual answer
            return getattr(exc, "value", None) == 10
        try:
            index = nvml.nvmlDeviceGetIndex(data.device)
        except Exception:
            index = None
        now = time.time()
        seen.append([index, int(getattr(data, "eventData", 0) or 0), now])
        seen[:] = [s for s in seen[-64:] if now - s[2] <= 3600.0]
    return True


_AGENT_MAIN = """
def _agent(interval):
    import json, os, sys, threading, time

    writing = threading.Lock()
    spoke = threading.Event()

    def emit(obj):
        with writing:
            sys.stdout.write(json.dumps(obj) + "\\n")
            sys.stdout.flush()
        spoke.set()

    def watch_stdin():
        # The console stops the agent by closing the channel. Root sessions ignore SSH signals, so
        # the end of stdin is the one stop signal that always arrives. A console that closes at once
        # (one reading, `communicate()`) still gets the first line, the verdict included: the end of
        # input is honoured once it is written (within 10 s: a hung NVML does not keep the agent), and
        # never in the middle of a line.
        try:
            while sys.stdin.buffer.read(4096):
                pass
        finally:
            spoke.wait(10)
            writing.acquire(timeout=5)
            os._exit(0)

    threading.Thread(target=watch_stdin, daemon=True).start()
    try:
        import pynvml as nvml
    except ImportError:
        emit({"state": "nvml_missing", "detail": "python3 on this host has no pynvml (nvidia-ml-py)."})
        return
    failed = _nvml_start(nvml)
    if failed is not None:
        emit(failed)
        return
    # XID events arrive between samples: the wait for them is the agent's sleep.
    events = _nvml_xid_watch(nvml)
    seen = []
    while True:
        started = time.time()
        try:
            emit(_nvml_sample(nvml, seen))
        except (BrokenPipeError, OSError):
            os._exit(0)
        left = max(0.0, interval - (time.time() - started))
        if events is not None and not _nvml_xid_wait(nvml, events, left, seen):
            events = None
        if events is None:
            time.sleep(max(0.0, interval - (time.time() - started)))


try:
    _agent(float(sys.argv[1]))
finally:
    # os._exit: a normal exit would wait a second for the stdin thread's lock at shutdown.
    try:
        sys.stdout.flush()
    except Exception:
        pass
    os._exit(0)
"""


def agent_script() -> str:
    """The self-contained NVML agent sent as `python3 -c SCRIPT INTERVAL`."""
    # The functions' annotations name typing objects the host's Python never imports: keep them unevaluated.
    head = "from __future__ import annotations\nimport os, sys"
    parts: list[Callable[..., Any]] = [_nvml_start, _nvml_sample, _nvml_xid_watch, _nvml_xid_wait]
    return "\n".join([head, *(inspect.getsource(fn) for fn in parts), _AGENT_MAIN])


def agent_argv(interval_s: float, python: str = "python3") -> list[str]:
    return [python, "-c", agent_script(), f"{interval_s:g}"]


def nvidia_smi_argv(fields: tuple[str, ...] = SMI_QUERY_FIELDS) -> list[str]:
    return ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]


def nvidia_smi_apps_argv() -> list[str]:
    return [
        "nvidia-smi",
        f"--query-compute-apps={','.join(APPS_QUERY_FIELDS)}",
        "--format=csv,noheader,nounits",
    ]
