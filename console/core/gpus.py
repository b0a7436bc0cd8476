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

Memory is counted as nvidia-smi counts it: `memory_used_mib` excludes the driver's own reservation, which
is `memory_reserved_mib` (NVML's v2 memory info; nvidia-smi's `memory.reserved`). A driver (or an
nvidia-ml-py) without v2 answers v1 only, whose `used` includes the reservation: `memory_info` says which
a sample holds, so three back-ends on one card agree, and a v1 reading is never taken for a v2 one.

Health (temperature, power, clocks, clock-event reasons, P-state, ECC, remapped rows, PCIe link, XID
events) is one optional field each: absent (None, never 0) where the back-end did not read it;
`console/core/gpuhealth.py` reads the faults out of them.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from console.core.text import split_lines

Backend = Literal["nvml", "agent", "nvidia-smi", "amd-smi", "rocm-smi"]


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
MAX_XIDS = 16
"""XID events kept per GPU in one sample (the newest)."""
XID_KEEP_S = 3600.0
"""How long an XID event stays in the samples after it happened: an operator who looks within the hour
sees it, and it does not fire an alert for the rest of the day."""

# Each health figure's range: past it (or not a number) the value is refused, as memory's is.
HEALTH_RANGES: dict[str, tuple[float, float]] = {
    "temperature_c": (-60, 250),
    "temperature_slowdown_c": (-60, 250),
    "temperature_shutdown_c": (-60, 250),
    "power_w": (0, 10_000),
    "power_limit_w": (0, 10_000),
    "clock_sm_mhz": (0, 100_000),
    "clock_sm_max_mhz": (0, 100_000),
    "clock_mem_mhz": (0, 100_000),
    "clock_mem_max_mhz": (0, 100_000),
}
HEALTH_INT_RANGES: dict[str, tuple[int, int]] = {
    "clock_event_reasons": (0, 2**64 - 1),
    "pstate": (0, 15),
    "ecc_corrected_volatile": (0, 2**63),
    "ecc_uncorrected_volatile": (0, 2**63),
    "remapped_rows_correctable": (0, 2**32),
    "remapped_rows_uncorrectable": (0, 2**32),
    "pcie_gen": (1, 16),
    "pcie_gen_max": (1, 16),
    "pcie_width": (1, 64),
    "pcie_width_max": (1, 64),
    "memory_bus_width_bits": (1, 65_536),
}
HEALTH_FLAGS: tuple[str, ...] = ("ecc_enabled", "remap_pending", "remap_failed", "lost", "throttled")
_HEALTH_KEYS = frozenset(
    (
        *HEALTH_RANGES,
        *HEALTH_INT_RANGES,
        *HEALTH_FLAGS,
        "memory_reserved_mib",
        "memory_info",
        "xids",
        "lost_reason",
    )
)


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


def _held_int(data: dict[str, Any], name: str, low: int, high: int, refused: list[str]) -> None:
    """`data[name]` kept as an int when it is a whole number in range (a hex string such as nvidia-smi's
    `0x0000000000000001` included), else set to None and named in `refused`."""
    value = data.get(name)
    if value is None:
        return
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        try:
            number = int(text, 16) if text.startswith("0x") else int(text)
        except ValueError:
            number = None
    if number is None or not low <= number <= high:
        refused.append(f"{name} {str(value)[:24]}")
        data[name] = None
    else:
        data[name] = number


def _flag(data: dict[str, Any], name: str, refused: list[str]) -> None:
    """A yes/no: a bool, 0/1, or nvidia-smi's words (Yes/No, Enabled/Disabled, Active/Not Active)."""
    value = data.get(name)
    if value is None or isinstance(value, bool):
        return
    words = {"yes": True, "enabled": True, "active": True, "1": True}
    words |= {"no": False, "disabled": False, "not active": False, "0": False}
    key = str(value).strip().lower() if isinstance(value, str | int) else None
    if key is not None and key in words:
        data[name] = words[key]
    else:
        refused.append(f"{name} {str(value)[:24]}")
        data[name] = None


def _text_field(data: dict[str, Any], name: str) -> None:
    value = data.get(name)
    if isinstance(value, str) and len(value) > NAME_MAX:
        data[name] = value[:NAME_MAX]


def _xid_ok(event: object) -> bool:
    """An XID event worth keeping: its code a whole number an XID can be (a malformed one is dropped)."""
    if not isinstance(event, dict):
        return False
    xid = event.get("xid")
    return isinstance(xid, int) and not isinstance(xid, bool) and 0 <= xid <= 65_535


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


class XidEvent(BaseModel, defer_build=True):
    """One XID critical-error event the driver reported for a GPU (NVML's event set)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    xid: int
    age_s: float | None = None
    """Seconds between the event and the sample that carries it (the host's clock for both)."""
    at: float | None = None
    """When the driver reported it, Unix time on the host's clock: the event's identity from one sample
    to the next (the console turns each new one into a `gpu_xid` event once). None in samples recorded
    before it was read."""

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        age = data.get("age_s")
        if age is not None and _in_range(age, 0, 10 * XID_KEEP_S) is None:
            data["age_s"] = None
        at = data.get("at")
        if at is not None and _in_range(at, 0, TS_MAX) is None:
            data["at"] = None
        return data


def _check_health(data: dict[str, Any], total: object, refused: list[str]) -> None:
    """The driver's reservation and every health figure held to its range (`GpuSample`'s validator)."""
    _held(data, "memory_reserved_mib", 0, MEMORY_MAX_MIB, refused)
    reserved = data.get("memory_reserved_mib")
    if isinstance(reserved, int | float) and isinstance(total, int | float) and reserved > total:
        refused.append(f"memory_reserved_mib {reserved:g} over memory_total_mib {total:g}")
        data["memory_reserved_mib"] = None
    if data.get("memory_info") not in (None, "v1", "v2"):
        refused.append(f"memory_info {str(data['memory_info'])[:24]}")
        data["memory_info"] = None
    for name, (low, high) in HEALTH_RANGES.items():
        _held(data, name, low, high, refused)
    for name, (ilow, ihigh) in HEALTH_INT_RANGES.items():
        _held_int(data, name, ilow, ihigh, refused)
    for name in HEALTH_FLAGS:
        _flag(data, name, refused)
    xids = data.get("xids")
    if isinstance(xids, list | tuple):
        # the well-formed ones of the newest few, then the newest MAX_XIDS of those
        ok = [x for x in xids[-4 * MAX_XIDS :] if isinstance(x, XidEvent) or _xid_ok(x)]
        data["xids"] = tuple(ok[-MAX_XIDS:])
    elif xids is not None:
        refused.append(f"xids {str(xids)[:24]}")
        data["xids"] = ()


class GpuSample(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int | None = None
    name: str | None = None
    uuid: str | None = None
    utilization_pct: float | None = None
    memory_used_mib: float | None = None
    """As nvidia-smi counts it where `memory_info` is `v2`: without the driver's reservation."""
    memory_total_mib: float | None = None
    memory_reserved_mib: float | None = None
    """The driver's own reservation (NVML v2 `reserved`, nvidia-smi `memory.reserved`); None under v1."""
    memory_info: Literal["v2", "v1"] | None = None
    """`v2`: used excludes the reservation, given apart; `v1` (an old driver or nvidia-ml-py): used
    includes it and it is not known apart."""
    processes: tuple[GpuProcess, ...] = ()
    temperature_c: float | None = None
    temperature_slowdown_c: float | None = None
    """Where the GPU slows itself down (NVML's slowdown threshold); nvidia-smi's query has no field."""
    temperature_shutdown_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    """The enforced limit (the lowest of the limits in force)."""
    clock_sm_mhz: float | None = None
    clock_sm_max_mhz: float | None = None
    clock_mem_mhz: float | None = None
    clock_mem_max_mhz: float | None = None
    clock_event_reasons: int | None = None
    """NVML's clocks-event (throttle) reasons bitmask: `console/core/gpuhealth.py` words it."""
    throttled: bool | None = None
    """A back-end's own "clocks held down" flag without its cause (amd-smi's `throttle_status`): the
    cause is read from the figures (temperature at its slowdown point, power at its cap)."""
    pstate: int | None = None
    """Performance state, 0 (P0, the fastest) to 15."""
    ecc_enabled: bool | None = None
    ecc_corrected_volatile: int | None = None
    """ECC errors since the driver loaded."""
    ecc_uncorrected_volatile: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remap_pending: bool | None = None
    """A row remap waits for a GPU reset."""
    remap_failed: bool | None = None
    """A row could not be remapped: the memory is failing."""
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    memory_bus_width_bits: int | None = None
    """With `clock_mem_max_mhz`, the card's peak memory bandwidth (`gpuhealth.peak_bandwidth_gbs`)."""
    xids: tuple[XidEvent, ...] = ()
    """XID critical-error events seen within the last `XID_KEEP_S` (NVML back-ends only), oldest first."""
    lost: bool | None = None
    """The GPU no longer answers its driver: NVML's GPU_IS_LOST (or its Unknown Error) for the device, or
    nvidia-smi's `Unable to determine the device handle for GPU…`. Its figures are then missing, never 0."""
    lost_reason: str | None = None
    """What the driver said of it, in its words (`GPU is lost`, `Unknown Error`)."""
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
        if not _HEALTH_KEYS.isdisjoint(data):  # a reading with health (not nvidia-smi's bare six fields)
            _check_health(data, total, refused)
        _text_field(data, "name")
        _text_field(data, "uuid")
        _text_field(data, "lost_reason")
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
        """What no one holds: total less used and (under v2) the driver's reservation."""
        if self.memory_used_mib is None or self.memory_total_mib is None:
            return None
        return max(0.0, self.memory_total_mib - self.memory_used_mib - (self.memory_reserved_mib or 0.0))


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
"""What every nvidia-smi answers: the query falls back to these when it refuses the others."""
SMI_NAME_COLUMN = 1
"""The one column that may itself hold commas (nvidia-smi does not quote)."""

# nvidia-smi's --query-gpu field → the sample's field (`--help-query-gpu` of driver 580). A driver that
# does not know a field refuses the whole query (`Field "x" is not a valid field to query.`): the sampler
# then asks without it, or with its older name (`SMI_ALTERNATIVES`), and keeps what its host's driver takes.
SMI_HEALTH_FIELDS: dict[str, str] = {
    "memory.reserved": "memory_reserved_mib",
    "temperature.gpu": "temperature_c",
    "power.draw": "power_w",
    "enforced.power.limit": "power_limit_w",
    "clocks.current.sm": "clock_sm_mhz",
    "clocks.max.sm": "clock_sm_max_mhz",
    "clocks.current.memory": "clock_mem_mhz",
    "clocks.max.memory": "clock_mem_max_mhz",
    "clocks_event_reasons.active": "clock_event_reasons",
    "pstate": "pstate",
    "ecc.mode.current": "ecc_enabled",
    "ecc.errors.corrected.volatile.total": "ecc_corrected_volatile",
    "ecc.errors.uncorrected.volatile.total": "ecc_uncorrected_volatile",
    "remapped_rows.correctable": "remapped_rows_correctable",
    "remapped_rows.uncorrectable": "remapped_rows_uncorrectable",
    "remapped_rows.pending": "remap_pending",
    "remapped_rows.failure": "remap_failed",
    "pcie.link.gen.current": "pcie_gen",
    "pcie.link.gen.max": "pcie_gen_max",
    "pcie.link.width.current": "pcie_width",
    "pcie.link.width.max": "pcie_width_max",
}
SMI_ALTERNATIVES: dict[str, str] = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}
"""A field's name before the driver renamed it (throttle reasons became clock-event reasons in R535)."""
SMI_FIELD_OF: dict[str, str] = {
    **SMI_HEALTH_FIELDS,
    **{old: SMI_HEALTH_FIELDS[new] for new, old in SMI_ALTERNATIVES.items()},
}
SMI_QUERY_FIELDS: tuple[str, ...] = (*GPU_QUERY_FIELDS, *SMI_HEALTH_FIELDS)
"""What the nvidia-smi back-end asks first."""
_REFUSED_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')


def smi_fields_without(fields: tuple[str, ...], said: str) -> tuple[str, ...] | None:
    """The fields to ask instead when nvidia-smi refused one (`said` its output): the refused field's
    older name where it has one, else the field left out. None when nothing can be left out (it did not
    refuse a field, or refused one every driver has: that is not the driver's age)."""
    match = _REFUSED_FIELD.search(said)
    if match is None or match.group(1) not in fields or match.group(1) in GPU_QUERY_FIELDS:
        return None
    field = match.group(1)
    older = SMI_ALTERNATIVES.get(field)
    if older is not None and older not in fields:
        return tuple(older if f == field else f for f in fields)
    return tuple(f for f in fields if f != field)


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


_LOST_LINE = re.compile(
    r"Unable to determine the device handle for GPU\s*([0-9A-Fa-f:.]{1,32}):\s*(.{1,200})"
)
"""What nvidia-smi prints, in place of a row, for a GPU that no longer answers (it fell off the bus):
`Unable to determine the device handle for GPU0000:0B:00.0: Unknown Error`, or `…: GPU is lost. Reboot
the system to recover this GPU` (public reports: NVIDIA/open-gpu-kernel-modules#387, JosephKJ/OWOD#81)."""


def parse_nvidia_smi_apps(text: str) -> dict[str, list[GpuProcess]]:
    """`nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits`
    → processes by GPU UUID."""
    by_uuid: dict[str, list[GpuProcess]] = {}
    text = "".join(line + "\n" for line in split_lines(text) if _LOST_LINE.search(line) is None)
    for uuid, pid, name, used in _csv_rows(text, len(APPS_QUERY_FIELDS), 2):
        key = _text(uuid)
        if key is None:
            continue
        by_uuid.setdefault(key, []).append(
            GpuProcess(pid=_integer(pid), name=_text(name), used_memory_mib=_number(used))
        )
    return by_uuid


def _pstate(value: str) -> int | None:
    text = _text(value)
    if text is None or not text.upper().startswith("P") or not text[1:].isdigit():
        return None
    return int(text[1:])


def nvidia_smi_lost(text: str) -> list[tuple[str, str]]:
    """The (bus ID, the driver's words) of each GPU nvidia-smi could not reach, in its order."""
    return [
        (m.group(1), m.group(2).strip().rstrip("."))
        for line in split_lines(text)
        if (m := _LOST_LINE.search(line)) is not None
    ]


def _lost_samples(lost: list[tuple[str, str]], listed: list[GpuSample]) -> list[GpuSample]:
    """A sample for each GPU nvidia-smi could not reach. It names it by bus ID only; nvidia-smi numbers the
    GPUs in bus order, so the indices missing from the rows are theirs, in the same order."""
    count = len(listed) + len(lost)
    missing = sorted(set(range(count)) - {g.index for g in listed if g.index is not None})
    out = []
    for n, (bus, words) in enumerate(lost):
        out.append(
            GpuSample(
                index=missing[n] if n < len(missing) else None,
                name=f"GPU {bus}",
                lost=True,
                lost_reason=f"nvidia-smi: unable to determine the device handle: {words}",
            )
        )
    return out


def parse_nvidia_smi_gpus(
    text: str, apps_text: str = "", fields: tuple[str, ...] = GPU_QUERY_FIELDS
) -> list[GpuSample]:
    """`nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits` (+ the compute-apps query) → one
    sample per GPU. `fields` are the query's, in its order: `GPU_QUERY_FIELDS` first, then any of
    `SMI_FIELD_OF`. A GPU that no longer answers is one lost sample (`nvidia_smi_lost`), in its place."""
    apps = parse_nvidia_smi_apps(apps_text) if apps_text else {}
    lost = nvidia_smi_lost(text)
    if lost:
        text = "".join(line + "\n" for line in split_lines(text) if _LOST_LINE.search(line) is None)
    gpus = []
    for row in _csv_rows(text, len(fields), SMI_NAME_COLUMN):
        value = dict(zip(fields, row, strict=True))
        key = _text(value["uuid"])
        if any("gpu is lost" in v.lower() or v.strip().lower() == "[gpu lost]" for v in row):
            health_lost: dict[str, Any] = {"lost": True, "lost_reason": "nvidia-smi: GPU is lost"}
        else:
            health_lost = {}
        health: dict[str, Any] = {}
        for field, raw in value.items():
            name = SMI_FIELD_OF.get(field)
            if name is None:
                continue
            if name == "pstate":
                health[name] = _pstate(raw)
            elif name in HEALTH_FLAGS or name == "clock_event_reasons":
                health[name] = _text(raw)  # words and hex: the model reads them
            else:
                health[name] = _number(raw)
        if "memory.reserved" in value:
            # nvidia-smi counts used as NVML v2 does wherever it can say what the driver reserved.
            health["memory_info"] = "v2" if health.get("memory_reserved_mib") is not None else None
        else:
            # A driver that refuses the field predates v2 (R510): its used includes the reservation.
            health["memory_info"] = "v1"
        gpus.append(
            GpuSample(
                index=_integer(value["index"]),
                name=_text(value["name"]),
                uuid=key,
                utilization_pct=_number(value["utilization.gpu"]),
                memory_used_mib=_number(value["memory.used"]),
                memory_total_mib=_number(value["memory.total"]),
                processes=tuple(apps.get(key, ())) if key else (),
                **health,
                **health_lost,
            )
        )
    if lost:
        gpus = sorted([*gpus, *_lost_samples(lost, gpus)], key=lambda g: (g.index is None, g.index or 0))
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


def same_reading(before: HostGpuSample | None, after: HostGpuSample) -> bool:
    """`after` reads as `before` did (its time aside): the same GPUs' figures, state and detail. The
    agent's sampler gives an unchanged line back as the same objects, so this is an identity test."""
    return (
        before is not None
        and before.state == after.state
        and before.detail == after.detail
        and (before.gpus is after.gpus or before.gpus == after.gpus)
    )
