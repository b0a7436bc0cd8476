"""GPU samples: what one tick of a GPU sampler says about a host's GPUs.

Pure models and the text readers for the sampler back-ends' outputs (nvidia-smi CSV, the NVML agent's
JSON). The back-ends themselves (NVML calls, SSH, subprocesses) live in `console.sources.gpus`; they all
produce the same `HostGpuSample`, so the screens never know which one ran.

Every field of a GPU may be missing: nvidia-smi prints `[N/A]` or `[Not Supported]` for what a card
(or a MIG slice, or a driver in a bad state) cannot report, and NVML raises per call.

Every value is held to its range where a sample becomes a model (the validators below: the agent's JSON,
nvidia-smi's CSV, local NVML and a recording all pass them): a GPU's memory from 0 to `MEMORY_MAX_MIB`
(used no more than total), its utilization from 0 to 100, a PID from 1 to `PID_MAX`, names of at most
`NAME_MAX` characters. A value out of range (NaN and ±Infinity included, which Python's JSON reads) is
refused: it becomes missing (drawn as "—", never as a bar), and `refused` says which. A sample of more than
`MAX_GPUS` GPUs is no host's: it is refused whole, with one sentence, before a widget draws 10,000 rows.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

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


MAX_GPUS = 64
"""The most GPUs one host's sample may hold: 8 or 16 on today's largest boards, 64 leaves room for MIG."""
MAX_PROCESSES = 256
"""The most processes kept per GPU (the rest are dropped, and said so)."""
MEMORY_MAX_MIB = 16 * 1024 * 1024
"""16 TiB: far past any card's memory; more (or less than 0) is refused."""
PID_MAX = 4_194_304
"""Linux's largest `pid_max` (2^22)."""
NAME_MAX = 256
"""Characters kept of a GPU's or a process's name or UUID."""
TS_MAX = 7_258_118_400.0
"""2200-01-01 in Unix seconds: a sample's time past it (or before 1970, or not finite) is refused."""


def _in_range(value: Any, low: float, high: float) -> float | None:
    """`value` as a float when it is a number from `low` to `high` (NaN and infinities are not)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return None
    return number if low <= number <= high else None  # NaN compares false


def _held(data: dict[str, Any], name: str, low: float, high: float, refused: list[str]) -> None:
    """`data[name]` kept when in range, else set to None and named in `refused`."""
    value = data.get(name)
    if value is None:
        return
    number = _in_range(value, low, high)
    if number is None:
        refused.append(f"{name} {str(value)[:24]}")
        data[name] = None
    elif isinstance(value, str):
        data[name] = number


def _text_field(data: dict[str, Any], name: str) -> None:
    value = data.get(name)
    if isinstance(value, str) and len(value) > NAME_MAX:
        data[name] = value[:NAME_MAX]


class GpuProcess(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True, extra="forbid")

    pid: int | None = None
    name: str | None = None
    used_memory_mib: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        refused: list[str] = []
        pid = data.get("pid")
        if pid is not None and (_in_range(pid, 1, PID_MAX) is None or float(pid) != int(float(pid))):
            data["pid"] = None
        _held(data, "used_memory_mib", 0, MEMORY_MAX_MIB, refused)
        _text_field(data, "name")
        return data


class GpuSample(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int | None = None
    name: str | None = None
    uuid: str | None = None
    utilization_pct: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    processes: tuple[GpuProcess, ...] = ()
    refused: tuple[str, ...] = ()
    """The values out of range this GPU's reading held (`memory_used_mib -5`), each now missing."""

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        refused: list[str] = []
        index = data.get("index")
        if index is not None and (
            _in_range(index, 0, MAX_GPUS * 16) is None or not float(index).is_integer()
        ):
            refused.append(f"index {str(index)[:24]}")
            data["index"] = None
        _held(data, "utilization_pct", 0, 100, refused)
        _held(data, "memory_used_mib", 0, MEMORY_MAX_MIB, refused)
        _held(data, "memory_total_mib", 0, MEMORY_MAX_MIB, refused)
        used, total = data.get("memory_used_mib"), data.get("memory_total_mib")
        if isinstance(used, int | float) and isinstance(total, int | float) and used > total:
            refused.append(f"memory_used_mib {used:g} over memory_total_mib {total:g}")
            data["memory_used_mib"] = None
        _text_field(data, "name")
        _text_field(data, "uuid")
        processes = data.get("processes")
        if isinstance(processes, list | tuple) and len(processes) > MAX_PROCESSES:
            refused.append(f"{len(processes):,} processes, the first {MAX_PROCESSES} kept")
            data["processes"] = tuple(processes[:MAX_PROCESSES])
        # A sample read back (a recording) says what was refused when it was taken: kept, bounded.
        earlier = data.get("refused")
        kept = [str(r)[:80] for r in earlier[:8]] if isinstance(earlier, list | tuple) else []
        data["refused"] = (*kept, *refused)
        return data

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

    @model_validator(mode="before")
    @classmethod
    def _bounded(cls, data: Any) -> Any:
        """More GPUs than any host has: the sample is refused whole, before a GPU of it is read."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        ts = data.get("ts")
        if ts is not None and _in_range(ts, 0, TS_MAX) is None:
            data["ts"] = None
        gpus = data.get("gpus")
        if isinstance(gpus, list | tuple) and len(gpus) > MAX_GPUS:
            data["gpus"] = ()
            data["state"] = SamplerState.ERROR
            data["detail"] = (
                f"the GPU sampler reported {len(gpus):,} GPUs; more than {MAX_GPUS} is no host's: sample refused."
            )
        return data

    @model_validator(mode="after")
    def _say_refused(self) -> HostGpuSample:
        """One sentence naming the values refused (the first few), for whatever shows the sample."""
        if self.state is SamplerState.OK and self.detail is None:
            refused = [
                f"GPU{g.index if g.index is not None else n} {r}"
                for n, g in enumerate(self.gpus)
                for r in g.refused
            ]
            if refused:
                more = f" and {len(refused) - 3} more" if len(refused) > 3 else ""
                object.__setattr__(
                    self, "detail", f"values out of range refused: {', '.join(refused[:3])}{more}."
                )
        return self

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
