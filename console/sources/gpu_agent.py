"""What runs on the GPU host to read its GPUs: the NVML reading (sent to remote hosts as source text, so it
uses only its `nvml` argument and builtins, in Python 3.6-compatible syntax: the host's python3 is whatever
SGLang runs on), the agent script built from it, and the nvidia-smi command lines.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from console.core.gpus import (
    APPS_QUERY_FIELDS,
    GPU_QUERY_FIELDS,
)

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


def _nvml_sample(nvml: Any) -> dict[str, Any]:
    """One sample of every GPU, as a plain dict of the `HostGpuSample` fields."""

    def text(value: object) -> object:
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else value

    def call(fn: Callable[..., Any], *args: object) -> Any:
        # Each field on its own: a card that cannot report one thing still reports the rest.
        try:
            return fn(*args)
        except Exception:
            return None

    mib = 1024.0 * 1024.0
    try:
        count = nvml.nvmlDeviceGetCount()
    except Exception as exc:
        return {"state": "error", "detail": "NVML could not count the GPUs: " + str(exc) + "."}
    gpus: list[dict[str, Any]] = []
    for index in range(count):
        handle = call(nvml.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            gpus.append({"index": index})
            continue
        memory = call(nvml.nvmlDeviceGetMemoryInfo, handle)
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
        gpus.append(
            {
                "index": index,
                "name": text(call(nvml.nvmlDeviceGetName, handle)),
                "uuid": text(call(nvml.nvmlDeviceGetUUID, handle)),
                "utilization_pct": getattr(rates, "gpu", None),
                "memory_used_mib": memory.used / mib if memory is not None else None,
                "memory_total_mib": memory.total / mib if memory is not None else None,
                "processes": processes,
            }
        )
    return {"state": "ok" if gpus else "no_gpus", "gpus": gpus}


_AGENT_MAIN = """
def _agent(interval):
    import json, os, sys, threading, time

    def emit(obj):
        sys.stdout.write(json.dumps(obj) + "\\n")
        sys.stdout.flush()

    def watch_stdin():
        # The console stops the agent by closing the channel. Root sessions ignore SSH signals, so
        # the end of stdin is the one stop signal that always arrives.
        try:
            while sys.stdin.buffer.read(4096):
                pass
        finally:
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
    while True:
        started = time.time()
        try:
            emit(_nvml_sample(nvml))
        except (BrokenPipeError, OSError):
            os._exit(0)
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
    return "\n".join([head, inspect.getsource(_nvml_start), inspect.getsource(_nvml_sample), _AGENT_MAIN])


def agent_argv(interval_s: float, python: str = "python3") -> list[str]:
    return [python, "-c", agent_script(), f"{interval_s:g}"]


def nvidia_smi_argv() -> list[str]:
    return ["nvidia-smi", f"--query-gpu={','.join(GPU_QUERY_FIELDS)}", "--format=csv,noheader,nounits"]


def nvidia_smi_apps_argv() -> list[str]:
    return [
        "nvidia-smi",
        f"--query-compute-apps={','.join(APPS_QUERY_FIELDS)}",
        "--format=csv,noheader,nounits",
    ]
