"""What a GPU sample's health fields mean: the clock-event (throttle) reasons in words, the XIDs' meanings,
the faults an operator must see first, and the card's peak memory bandwidth from its own clocks.

Pure functions of a `GpuSample` (`console/core/gpus.py`). A figure the back-end did not read is None, and
every judgement on it is None too ("not known"), never "fine": an alert on an unknown figure never fires.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from console.core.events import GpuXid
from console.core.gpus import XID_KEEP_S, GpuSample, HostGpuSample

# NVML's nvmlClocksEventReason* bits (nvml.h; nvidia-smi -q "Clocks Event Reasons"), in its order.
IDLE = 0x1
APP_CLOCKS = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SYNC_BOOST = 0x10
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
DISPLAY_CLOCKS = 0x100

REASONS: tuple[tuple[int, str], ...] = (
    (IDLE, "idle"),
    (APP_CLOCKS, "applications clocks"),
    (SW_POWER_CAP, "power cap"),
    (HW_SLOWDOWN, "HW slowdown"),
    (SYNC_BOOST, "sync boost"),
    (SW_THERMAL, "SW thermal slowdown"),
    (HW_THERMAL, "HW thermal slowdown"),
    (HW_POWER_BRAKE, "HW power brake"),
    (DISPLAY_CLOCKS, "display clocks"),
)
"""Each reason's words, as nvidia-smi -q names them (shortened)."""

Severity = Literal["warning", "critical"]

THERMAL = SW_THERMAL | HW_THERMAL
POWER = SW_POWER_CAP | HW_POWER_BRAKE

# The XIDs an inference host meets most, in the words of NVIDIA's XID catalogue (docs.nvidia.com,
# "XID Errors"): what happened, and whether the GPU needs a reset.
XID_MEANINGS: dict[int, str] = {
    13: "graphics engine exception (often the application: an illegal address or instruction)",
    31: "GPU memory page fault (often the application: an illegal memory access)",
    43: "GPU stopped processing (the faulting application's channel was stopped)",
    45: "preemptive cleanup after an earlier error (processes on the GPU were ended)",
    48: "double-bit ECC error: uncorrectable memory error (restart the application; reset if it repeats)",
    63: "ECC page retirement or row remap recorded (reset the GPU to apply it)",
    64: "ECC page retirement or row remap recording failed (the memory is failing)",
    74: "NVLink error (a link between GPUs failed or retrained)",
    79: "GPU has fallen off the bus (it no longer answers: reset or reboot)",
    92: "high single-bit ECC error rate",
    94: "contained uncorrectable ECC error (the affected application must restart)",
    95: "uncontained uncorrectable ECC error (every application on the GPU is affected: reset it)",
    119: "GSP RPC timeout (the GPU's system processor stopped answering: reset it)",
}


XID_WARNINGS: frozenset[int] = frozenset({13, 31, 43, 45, 63, 92})
"""XIDs that are most often the application's own fault (13, 31, 43, 45) or a memory event the driver
contained and recorded (63, 92): a warning. Every other XID, the table's and the unknown ones, is critical:
the GPU itself needs attention (48, 64, 74, 79, 94, 95, 119)."""

LOST_XID = 79
"""`GPU has fallen off the bus`: the GPU is gone until a reset or a reboot."""


def xid_words(xid: int) -> str:
    """`XID 79: GPU has fallen off the bus (…)`; an XID outside the table is named by its number only."""
    meaning = XID_MEANINGS.get(xid)
    return f"XID {xid}: {meaning}" if meaning else f"XID {xid} (see NVIDIA's XID catalogue)"


def xid_severity(xid: int) -> Severity:
    return "warning" if xid in XID_WARNINGS else "critical"


def lost(gpu: GpuSample) -> bool:
    """The GPU no longer answers: its driver says so (`GpuSample.lost`), or it reported XID 79 (fallen off
    the bus) and gave no memory figure since. An XID 79 on a GPU that still answers names its row as
    `XID 79` until its next reading fails."""
    if gpu.lost:
        return True
    return gpu.memory_used_mib is None and any(x.xid == LOST_XID for x in gpu.xids)


def lost_words(gpu: GpuSample) -> str:
    said = gpu.lost_reason or ("XID 79: fallen off the bus" if gpu.xids else "no answer")
    return f"lost: it no longer answers its driver ({said}); reset the GPU or reboot the host"


def reasons(mask: int | None) -> tuple[str, ...] | None:
    """The reasons a bitmask holds, in words; None when the back-end did not read them."""
    if mask is None:
        return None
    return tuple(words for bit, words in REASONS if mask & bit)


def busy(gpu: GpuSample) -> bool | None:
    """Whether the GPU is working: the driver's idle reason clear, else (no reasons read) utilization > 0.
    A slowdown or a slow PCIe link of an idle GPU is its power saving, not a fault."""
    if gpu.clock_event_reasons is not None:
        return not gpu.clock_event_reasons & IDLE
    if gpu.utilization_pct is not None:
        return gpu.utilization_pct > 0
    return None


POWER_AT_CAP = 0.97
"""A GPU drawing this share of its power cap or more is at it (for a back-end whose throttle flag has no
cause: amd-smi)."""


def _hot(gpu: GpuSample) -> bool | None:
    if gpu.temperature_c is None or gpu.temperature_slowdown_c is None:
        return None
    return gpu.temperature_c >= gpu.temperature_slowdown_c


def _at_cap(gpu: GpuSample) -> bool | None:
    if gpu.power_w is None or not gpu.power_limit_w:
        return None
    return gpu.power_w >= POWER_AT_CAP * gpu.power_limit_w


def thermal_slowdown(gpu: GpuSample) -> bool | None:
    """A working GPU whose clocks are held down by heat: SW or HW thermal slowdown, or a HW slowdown that
    is not the power brake's. A back-end with a bare throttle flag (amd-smi): throttled at or past the
    slowdown temperature."""
    mask = gpu.clock_event_reasons
    if mask is None:
        if gpu.throttled is None or _hot(gpu) is None:
            return None
        return gpu.throttled and bool(_hot(gpu))  # an idle GPU is not past its slowdown point
    hot = bool(mask & THERMAL) or (bool(mask & HW_SLOWDOWN) and not mask & HW_POWER_BRAKE)
    return hot and busy(gpu) is not False


def power_capped(gpu: GpuSample) -> bool | None:
    """A working GPU whose clocks are held by its power limit (SW power cap) or the HW power brake. A
    back-end with a bare throttle flag (amd-smi): throttled while drawing its cap and not past its
    slowdown temperature. One flag names one cause: a GPU throttled for heat under decode draws near its
    cap too, and was read as both (two alerts for one fault, the second depending on the watts of the
    moment)."""
    mask = gpu.clock_event_reasons
    if mask is None:
        if gpu.throttled is None or _at_cap(gpu) is None:
            return None
        # nor does an idle one draw its cap
        return gpu.throttled and bool(_at_cap(gpu)) and not _hot(gpu)
    return bool(mask & POWER) and busy(gpu) is not False


def pcie_degraded(gpu: GpuSample) -> bool | None:
    """The PCIe link trained below what the GPU and its slot can do: fewer lanes at any time, or a lower
    generation while the GPU works (an idle GPU drops its link generation to save power: not a fault)."""
    width_low: bool | None = None
    if gpu.pcie_width is not None and gpu.pcie_width_max is not None:
        width_low = gpu.pcie_width < gpu.pcie_width_max
    gen_low: bool | None = None
    if gpu.pcie_gen is not None and gpu.pcie_gen_max is not None:
        gen_low = gpu.pcie_gen < gpu.pcie_gen_max and busy(gpu) is not False
    if width_low is None and gen_low is None:
        return None
    return bool(width_low) or bool(gen_low)


def peak_bandwidth_gbs(gpu: GpuSample) -> float | None:
    """The card's peak memory bandwidth from NVML itself, decimal GB/s: 2 (data on both clock edges) ×
    the maximum memory clock × the bus width / 8. An H200: 2 × 3,201 MHz × 6,016 bits / 8 = 4,814 GB/s
    (its spec sheet says 4,800). None where the back-end did not read both (nvidia-smi has no bus width)."""
    clock, bits = gpu.clock_mem_max_mhz, gpu.memory_bus_width_bits
    if not clock or not bits:
        return None
    return 2 * clock * 1e6 * bits / 8 / 1e9


@dataclass(frozen=True)
class Fault:
    """One thing wrong with one GPU, as the panel shows it (`tag`) and as a sentence (`words`)."""

    kind: str
    """`lost`, `thermal`, `power`, `pcie`, `ecc`, `remap_pending`, `remap_failed`, `xid`."""
    tag: str
    """A few characters for the GPU's row: `LOST`, `THERMAL`, `PWR CAP`, `XID 79`, `PCIe x8`."""
    words: str
    severity: Severity


def _slowed(gpu: GpuSample, mask: int) -> str:
    said = [w for bit, w in REASONS if mask & bit and bit != IDLE]
    if gpu.clock_event_reasons is None and gpu.throttled:
        said = ["throttled (the back-end names no cause)"]
    clock = ""
    if gpu.clock_sm_mhz is not None and gpu.clock_sm_max_mhz:
        clock = f", SM clock {gpu.clock_sm_mhz:.0f} of {gpu.clock_sm_max_mhz:.0f} MHz"
    return f"{', '.join(said)}{clock}"


def faults(gpu: GpuSample) -> tuple[Fault, ...]:
    """The faults of one GPU, the most serious first."""
    out: list[Fault] = []
    if lost(gpu):
        out.append(Fault("lost", "LOST", lost_words(gpu), "critical"))
    for event in reversed(gpu.xids):
        out.append(Fault("xid", f"XID {event.xid}", xid_words(event.xid), xid_severity(event.xid)))
        break  # the newest names the row; the count is the alert's
    if gpu.ecc_uncorrected_volatile:
        out.append(
            Fault(
                "ecc",
                "ECC",
                f"{gpu.ecc_uncorrected_volatile} uncorrectable ECC error(s) since the driver loaded",
                "critical",
            )
        )
    if gpu.remap_failed:
        out.append(Fault("remap_failed", "REMAP FAIL", "a memory row could not be remapped", "critical"))
    if gpu.remap_pending:
        out.append(Fault("remap_pending", "REMAP", "a memory row remap waits for a GPU reset", "warning"))
    mask = gpu.clock_event_reasons or 0
    temp = f" at {gpu.temperature_c:.0f} °C" if gpu.temperature_c is not None else ""
    if thermal_slowdown(gpu):
        limit = (
            f" (slowdown at {gpu.temperature_slowdown_c:.0f} °C)"
            if gpu.temperature_slowdown_c is not None
            else ""
        )
        out.append(
            Fault("thermal", "THERMAL", f"thermal slowdown{temp}{limit}: {_slowed(gpu, mask)}", "warning")
        )
    if power_capped(gpu):
        power = ""
        if gpu.power_w is not None and gpu.power_limit_w:
            power = f" at {gpu.power_w:.0f} of {gpu.power_limit_w:.0f} W"
        out.append(Fault("power", "PWR CAP", f"power capped{power}: {_slowed(gpu, mask)}", "warning"))
    if pcie_degraded(gpu):
        out.append(
            Fault(
                "pcie",
                f"PCIe x{gpu.pcie_width}"
                if gpu.pcie_width != gpu.pcie_width_max
                else f"PCIe G{gpu.pcie_gen}",
                f"PCIe link gen {gpu.pcie_gen} x{gpu.pcie_width}, below its gen {gpu.pcie_gen_max} "
                f"x{gpu.pcie_width_max}",
                "warning",
            )
        )
    return tuple(out)


def count(gpus: Iterable[GpuSample], judge: str) -> float | None:
    """How many GPUs a judgement (`thermal_slowdown`, `power_capped`, `pcie_degraded`) holds for; None
    when it is known for none of them."""
    fn = {"thermal": thermal_slowdown, "power": power_capped, "pcie": pcie_degraded}[judge]
    verdicts = [fn(g) for g in gpus]
    known = [v for v in verdicts if v is not None]
    return float(sum(known)) if known else None


def health_json(gpu: GpuSample) -> dict[str, object]:
    """One GPU's health as `snapshot --json` prints it: the figures read (absent ones left out), the
    reasons in words, the peak bandwidth and the faults."""
    figures = {
        name: getattr(gpu, name)
        for name in (
            "temperature_c",
            "temperature_slowdown_c",
            "temperature_shutdown_c",
            "power_w",
            "power_limit_w",
            "clock_sm_mhz",
            "clock_sm_max_mhz",
            "clock_mem_mhz",
            "clock_mem_max_mhz",
            "clock_event_reasons",
            "throttled",
            "pstate",
            "ecc_enabled",
            "ecc_corrected_volatile",
            "ecc_uncorrected_volatile",
            "remapped_rows_correctable",
            "remapped_rows_uncorrectable",
            "remap_pending",
            "remap_failed",
            "pcie_gen",
            "pcie_gen_max",
            "pcie_width",
            "pcie_width_max",
            "memory_bus_width_bits",
        )
        if getattr(gpu, name) is not None
    }
    if lost(gpu):
        figures["lost"] = True
        figures["lost_reason"] = gpu.lost_reason
    said = reasons(gpu.clock_event_reasons)
    if said is not None:
        figures["clock_event_reasons_words"] = list(said)
    peak = peak_bandwidth_gbs(gpu)
    if peak is not None:
        figures["peak_bandwidth_gbs"] = round(peak, 1)
    if gpu.xids:
        figures["xids"] = [
            {
                "xid": x.xid,
                "age_s": x.age_s,
                "meaning": XID_MEANINGS.get(x.xid),
                "severity": xid_severity(x.xid),
            }
            for x in gpu.xids
        ]
    figures["faults"] = [{"kind": f.kind, "severity": f.severity, "words": f.words} for f in faults(gpu)]
    return figures


XID_SAME_S = 2.0
"""Two readings of one XID event without the driver's own time (`XidEvent.at`: samples recorded before
it was read) are the same event when their times, the sample's less the event's age, are this close."""
_XID_MEMORY = 64
"""Times kept per (GPU, XID): an event storm does not grow the watch."""


def xid_event(
    gpu: int | None, xid: int, when: float | None, host: str | None, uuid: str | None = None
) -> GpuXid:
    """The feed's typed event of one XID: the GPU, the XID, its meaning and severity, its line."""
    where = f"GPU{gpu}" if gpu is not None else "a GPU"
    text = f"{where} {xid_words(xid)}"
    return GpuXid(
        ts=datetime.fromtimestamp(when, UTC).isoformat() if when is not None else None,
        host=host,
        gpu=gpu,
        uuid=uuid,
        xid=xid,
        meaning=XID_MEANINGS.get(xid),
        severity=xid_severity(xid),
        message=text,
        raw=text,
    )


class XidWatch:
    """Which XID events of one host's GPU samples are already on its feed: a sample carries every XID of
    the last hour, and each becomes one `GpuXid` event, the first time a sample carries it. An event is
    known by its GPU, its XID and its time (`XidEvent.at`, the host's clock; else the sample's time less
    the event's age, within `XID_SAME_S`). Pure: a host's fold holds one, and a replay makes the same
    events from the same samples."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], list[float]] = {}
        self.untimed: dict[tuple[int, int], int] = {}
        """Events no time identifies (no `at`, no age): how many a sample carried at most."""

    def new_events(self, sample: HostGpuSample) -> list[GpuXid]:
        out: list[GpuXid] = []
        newest: float | None = None
        for pos, gpu in enumerate(sample.gpus):
            index = gpu.index if gpu.index is not None else pos
            untimed: dict[int, int] = {}
            for x in gpu.xids:
                key = (index, x.xid)
                console_time = sample.ts - x.age_s if sample.ts is not None and x.age_s is not None else None
                when, close = (x.at, 0.001) if x.at is not None else (console_time, XID_SAME_S)
                if when is None:
                    untimed[x.xid] = untimed.get(x.xid, 0) + 1
                    if untimed[x.xid] > self.untimed.get(key, 0):
                        self.untimed[key] = untimed[x.xid]
                        out.append(xid_event(index, x.xid, None, sample.host, gpu.uuid))
                    continue
                newest = when if newest is None else max(newest, when)
                times = self.seen.setdefault(key, [])
                if any(abs(when - t) <= close for t in times):
                    continue
                times.append(when)
                del times[:-_XID_MEMORY]
                out.append(xid_event(index, x.xid, console_time if console_time is not None else when,
                                     sample.host, gpu.uuid))  # fmt: skip
        if newest is not None:
            # An event older than the samples keep is not carried again: forget it.
            for key, times in list(self.seen.items()):
                times[:] = [t for t in times if t >= newest - XID_KEEP_S - 60.0]
                if not times:
                    del self.seen[key]
        return out


__all__ = [
    "LOST_XID",
    "REASONS",
    "XID_MEANINGS",
    "XID_WARNINGS",
    "Fault",
    "XidWatch",
    "busy",
    "count",
    "faults",
    "health_json",
    "lost",
    "lost_words",
    "pcie_degraded",
    "peak_bandwidth_gbs",
    "power_capped",
    "reasons",
    "thermal_slowdown",
    "xid_event",
    "xid_severity",
    "xid_words",
]
