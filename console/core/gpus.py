"""GPU samples: what one tick of a GPU sampler says about a host's GPUs.

Pure models and the text readers for the sampler back-ends' outputs (nvidia-smi CSV, the NVML agent's
JSON). The back-ends themselves (NVML calls, SSH, subprocesses) live in `console.sources.gpus`; they all
produce the same `HostGpuSample`, so the screens never know which one ran.

Every field of a GPU may be missing: nvidia-smi prints `[N/A]` or `[Not Supported]` for what a card
(or a MIG slice, or a driver in a bad state) cannot report, and NVML raises per call.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from console.core.text import split_lines

Backend = Literal["nvml", "agent", "nvidia-smi"]


class SamplerState(StrEnum):
    OK = "ok"
    """The sample holds one entry per GPU the host has."""
    NVML_MISSING = "nvml_missing"
    """Neither NVML nor nvidia-smi is usable on the host (no driver, no library): a state, not a crash."""
    NO_GPUS = "no_gpus"
    """The driver answered and counted zero GPUs."""
    ERROR = "error"
    """The sampler failed this tick (a command failed, the host dropped); `detail` says why."""


class GpuProcess(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True, extra="forbid")

    pid: int | None = None
    name: str | None = None
    used_memory_mib: float | None = None


class GpuSample(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int | None = None
    name: str | None = None
    uuid: str | None = None
    utilization_pct: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    processes: tuple[GpuProcess, ...] = ()

    @property
    def memory_free_mib(self) -> float | None:
        if self.memory_used_mib is None or self.memory_total_mib is None:
            return None
        return self.memory_total_mib - self.memory_used_mib


class HostGpuSample(BaseModel, defer_build=True):
    """One batched sample of all GPUs of one host, taken in one tick."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    state: SamplerState
    backend: Backend | None = None
    gpus: tuple[GpuSample, ...] = ()
    detail: str | None = None
    """Why the state is not `ok`, in one sentence."""
    ts: float | None = None
    """Wall-clock seconds (Unix time) when the sample was taken."""
    host: str | None = None

    @property
    def memory_used_mib(self) -> float | None:
        values = [g.memory_used_mib for g in self.gpus if g.memory_used_mib is not None]
        return sum(values) if values else None


# nvidia-smi's markers for a value it cannot give. Anything else that is not a number is also treated
# as missing: a sample with a hole is worth more than no sample.
_NA = {"", "[n/a]", "n/a", "[not supported]", "[unknown error]", "[insufficient permissions]", "[gpu lost]"}

GPU_QUERY_FIELDS: tuple[str, ...] = (
    "index",
    "name",
    "uuid",
    "utilization.gpu",
    "memory.used",
    "memory.total",
)
APPS_QUERY_FIELDS: tuple[str, ...] = ("gpu_uuid", "pid", "process_name", "used_memory")


def _text(value: str) -> str | None:
    value = value.strip()
    return None if value.lower() in _NA else value


def _number(value: str) -> float | None:
    text = _text(value)
    if text is None:
        return None
    # `nounits` should strip units; be lenient in case an older driver still prints them.
    for unit in ("MiB", "%", "W"):
        text = text.removesuffix(unit).strip()
    try:
        return float(text)
    except ValueError:
        return None


def _integer(value: str) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None


def _csv_rows(text: str, width: int, free_column: int) -> list[list[str]]:
    """Split CSV rows of `width` columns where only `free_column` may itself hold commas (a process or
    GPU name): nvidia-smi does not quote, so split from both ends around that column."""
    rows = []
    for line in split_lines(text):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) > width:
            after = width - free_column - 1
            head = parts[:free_column]
            tail = parts[len(parts) - after :] if after else []
            parts = [*head, ",".join(parts[free_column : len(parts) - after]), *tail]
        if len(parts) < width:
            parts += [""] * (width - len(parts))
        rows.append(parts)
    return rows


def parse_nvidia_smi_apps(text: str) -> dict[str, list[GpuProcess]]:
    """`nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits`
    → processes by GPU UUID."""
    by_uuid: dict[str, list[GpuProcess]] = {}
    for uuid, pid, name, used in _csv_rows(text, len(APPS_QUERY_FIELDS), 2):
        key = _text(uuid)
        if key is None:
            continue
        by_uuid.setdefault(key, []).append(
            GpuProcess(pid=_integer(pid), name=_text(name), used_memory_mib=_number(used))
        )
    return by_uuid


def parse_nvidia_smi_gpus(text: str, apps_text: str = "") -> list[GpuSample]:
    """`nvidia-smi --query-gpu=index,name,uuid,utilization.gpu,memory.used,memory.total
    --format=csv,noheader,nounits` (+ the compute-apps query) → one sample per GPU."""
    apps = parse_nvidia_smi_apps(apps_text) if apps_text else {}
    gpus = []
    for row in _csv_rows(text, len(GPU_QUERY_FIELDS), 1):
        index, name, uuid, util, used, total = row
        key = _text(uuid)
        gpus.append(
            GpuSample(
                index=_integer(index),
                name=_text(name),
                uuid=key,
                utilization_pct=_number(util),
                memory_used_mib=_number(used),
                memory_total_mib=_number(total),
                processes=tuple(apps.get(key, ())) if key else (),
            )
        )
    return gpus


def sample_from_agent_line(line: str | bytes, *, host: str | None = None) -> HostGpuSample:
    """One JSON line of the NVML agent → a sample. A line that is not the agent's JSON is an error state,
    never an exception: the agent runs on a host we do not control."""
    try:
        data: Any = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        return HostGpuSample.model_validate({**data, "backend": "agent", "host": host, "ts": data.get("ts")})
    except (ValueError, ValidationError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return HostGpuSample(
            state=SamplerState.ERROR,
            backend="agent",
            host=host,
            detail=f"the GPU agent printed something that is not a sample ({first[:120]}).",
        )
