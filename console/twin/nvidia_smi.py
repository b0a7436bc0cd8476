"""`nvidia-smi` for a twin host: `--query-gpu`, `--query-compute-apps`, `-L`, `-i`, `-l/-lms`, and the
default table, with the numbers of the simulated GPUs (console.twin.gpustate).

CSV output matches the real tool: header fields with their unit in brackets (`memory.used [MiB]`),
values with the unit (`40123 MiB`), `noheader` and `nounits` dropping each.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from console.twin import gpustate
from console.twin.gpuhealth import GpuConditions, Health, health, lost_gpus, read_conditions, reserved_mib
from console.twin.gpustate import Gpu, GpuProcess, GpuSnapshot
from console.twin.layout import TwinConfig, TwinLayout

DRIVER_VERSION = "580.95.05"
V1_DRIVER_VERSION = "470.256.02"
"""What a twin playing a driver before NVML's v2 memory info (R510) says it runs."""
CUDA_VERSION = "13.0"


@dataclass(frozen=True)
class _At:
    """One GPU as a field reads it: the GPU, the snapshot, its health and the driver's conditions."""

    g: Gpu
    s: GpuSnapshot
    h: Health
    c: GpuConditions

    @property
    def reserved(self) -> int:
        return reserved_mib(self.g)

    @property
    def used(self) -> int:
        # A v1 driver counts its reservation in used, as its NVML v1 does.
        extra = self.reserved if self.c.driver_memory == "v1" else 0
        return min(self.g.memory_total_mib, self.g.memory_used_mib + extra)


# name -> (header, unit, value)
_GpuField = tuple[str, str, Callable[[_At], str]]


def _mem_util(g: Gpu) -> int:
    # Memory-controller busy tracks compute on a decode-bound server; it is not memory occupancy.
    return int(g.utilization_pct * 0.6)


def _yes(flag: bool) -> str:
    return "Yes" if flag else "No"


def _bus_id(g: Gpu) -> str:
    return f"00000000:{0x18 + g.index * 0x10:02X}:00.0"


_GPU_FIELDS: dict[str, _GpuField] = {
    "timestamp": (
        "timestamp",
        "",
        lambda a: datetime.fromtimestamp(a.s.updated).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3],
    ),
    "driver_version": ("driver_version", "", lambda a: _driver(a.c)),
    "count": ("count", "", lambda a: str(len(a.s.gpus))),
    "index": ("index", "", lambda a: str(a.g.index)),
    "name": ("name", "", lambda a: a.g.name),
    "gpu_name": ("name", "", lambda a: a.g.name),
    "uuid": ("uuid", "", lambda a: a.g.uuid),
    "gpu_uuid": ("uuid", "", lambda a: a.g.uuid),
    "pci.bus_id": ("pci.bus_id", "", lambda a: _bus_id(a.g)),
    "gpu_bus_id": ("pci.bus_id", "", lambda a: _bus_id(a.g)),
    "persistence_mode": ("persistence_mode", "", lambda a: "Enabled"),
    "pstate": ("pstate", "", lambda a: f"P{a.h.pstate}"),
    "fan.speed": ("fan.speed", "%", lambda a: str(30 + a.g.utilization_pct // 3)),
    "temperature.gpu": ("temperature.gpu", "", lambda a: str(a.h.temperature_c)),
    "utilization.gpu": ("utilization.gpu", "%", lambda a: str(a.g.utilization_pct)),
    "utilization.memory": ("utilization.memory", "%", lambda a: str(_mem_util(a.g))),
    "memory.total": ("memory.total", "MiB", lambda a: str(a.g.memory_total_mib)),
    "memory.used": ("memory.used", "MiB", lambda a: str(a.used)),
    "memory.free": (
        "memory.free",
        "MiB",
        lambda a: str(max(0, a.g.memory_total_mib - a.g.memory_used_mib - a.reserved)),
    ),
    "memory.reserved": ("memory.reserved", "MiB", lambda a: str(a.reserved)),
    "power.draw": ("power.draw", "W", lambda a: f"{a.h.power_w:.2f}"),
    "power.limit": ("power.limit", "W", lambda a: f"{a.h.power_limit_w:.2f}"),
    "enforced.power.limit": ("enforced.power.limit", "W", lambda a: f"{a.h.power_limit_w:.2f}"),
    "clocks.sm": ("clocks.current.sm", "MHz", lambda a: str(a.h.clock_sm_mhz)),
    "clocks.current.sm": ("clocks.current.sm", "MHz", lambda a: str(a.h.clock_sm_mhz)),
    "clocks.max.sm": ("clocks.max.sm", "MHz", lambda a: str(a.h.clock_sm_max_mhz)),
    "clocks.mem": ("clocks.current.memory", "MHz", lambda a: str(a.h.clock_mem_mhz)),
    "clocks.current.memory": ("clocks.current.memory", "MHz", lambda a: str(a.h.clock_mem_mhz)),
    "clocks.max.memory": ("clocks.max.memory", "MHz", lambda a: str(a.h.clock_mem_max_mhz)),
    "clocks_event_reasons.active": ("clocks_event_reasons.active", "", lambda a: f"0x{a.h.reasons:016x}"),
    "clocks_throttle_reasons.active": (
        "clocks_throttle_reasons.active",
        "",
        lambda a: f"0x{a.h.reasons:016x}",
    ),
    "ecc.mode.current": ("ecc.mode.current", "", lambda a: "Enabled"),
    "ecc.errors.corrected.volatile.total": ("ecc.errors.corrected.volatile.total", "", lambda a: "0"),
    "ecc.errors.uncorrected.volatile.total": (
        "ecc.errors.uncorrected.volatile.total",
        "",
        lambda a: str(a.h.ecc_uncorrected),
    ),
    "remapped_rows.correctable": ("remapped_rows.correctable", "", lambda a: "0"),
    "remapped_rows.uncorrectable": (
        "remapped_rows.uncorrectable",
        "",
        lambda a: str(a.h.remapped_uncorrectable),
    ),
    "remapped_rows.pending": ("remapped_rows.pending", "", lambda a: _yes(a.h.remap_pending)),
    "remapped_rows.failure": ("remapped_rows.failure", "", lambda a: _yes(a.h.remap_failed)),
    "pcie.link.gen.current": ("pcie.link.gen.current", "", lambda a: str(a.h.pcie_gen)),
    "pcie.link.gen.max": ("pcie.link.gen.max", "", lambda a: str(a.h.pcie_gen_max)),
    "pcie.link.width.current": ("pcie.link.width.current", "", lambda a: str(a.h.pcie_width)),
    "pcie.link.width.max": ("pcie.link.width.max", "", lambda a: str(a.h.pcie_width_max)),
    "compute_mode": ("compute_mode", "", lambda a: "Default"),
}
_V2_ONLY = ("memory.reserved", "clocks_event_reasons.active")
"""Fields a driver before R510 (v1 memory info) does not know: it refuses the whole query."""


def _driver(c: GpuConditions) -> str:
    return DRIVER_VERSION if c.driver_memory == "v2" else V1_DRIVER_VERSION


_AppField = tuple[str, str, Callable[[Gpu, GpuProcess], str]]
_APP_FIELDS: dict[str, _AppField] = {
    "timestamp": ("timestamp", "", lambda g, p: datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]),
    "gpu_name": ("gpu_name", "", lambda g, p: g.name),
    "gpu_bus_id": ("gpu_bus_id", "", lambda g, p: f"00000000:{0x18 + g.index * 0x10:02X}:00.0"),
    "gpu_serial": ("gpu_serial", "", lambda g, p: f"17{g.index:011d}"),
    "gpu_uuid": ("gpu_uuid", "", lambda g, p: g.uuid),
    "pid": ("pid", "", lambda g, p: str(p.pid)),
    "process_name": ("process_name", "", lambda g, p: p.name),
    "name": ("process_name", "", lambda g, p: p.name),
    "used_memory": ("used_gpu_memory", "MiB", lambda g, p: str(p.used_mib)),
    "used_gpu_memory": ("used_gpu_memory", "MiB", lambda g, p: str(p.used_mib)),
}


class _Fail(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _fields(spec: str, table: dict, refused: tuple[str, ...] = ()) -> list[str]:  # type: ignore[type-arg]
    names = [f.strip() for f in spec.split(",") if f.strip()]
    for n in names:
        if n not in table or n in refused:
            raise _Fail(f'Field "{n}" is not a valid field to query.\n', 2)
    return names


def _csv(rows: list[list[tuple[str, str]]], headers: list[tuple[str, str]], fmt: set[str]) -> str:
    out = []
    if "noheader" not in fmt:
        out.append(", ".join(f"{h} [{u}]" if u and "nounits" not in fmt else h for h, u in headers))
    for row in rows:
        out.append(", ".join(f"{v} {u}" if u and "nounits" not in fmt else v for v, u in row))
    return "".join(line + "\n" for line in out)


def _table(snap: GpuSnapshot, conditions: GpuConditions) -> str:
    now = datetime.now().strftime("%a %b %d %H:%M:%S %Y")
    bar = "+-----------------------------------------------------------------------------------------+"
    lines = [
        now,
        bar,
        f"| NVIDIA-SMI {_driver(conditions)}              Driver Version: {_driver(conditions)}      CUDA Version: {CUDA_VERSION}     |",
        "|-----------------------------------------+------------------------+----------------------+",
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|=========================================+========================+======================|",
    ]
    for g in snap.gpus:
        at = _At(g, snap, health(g, conditions), conditions)
        name = g.name[:20]
        bus = _bus_id(g)[4:]
        fan = _GPU_FIELDS["fan.speed"][2](at)
        temp = at.h.temperature_c
        pstate = f"P{at.h.pstate}"
        mem = f"{at.used}MiB /  {g.memory_total_mib}MiB"
        lines.append(f"| {g.index:>3}  {name:<20}            On  | {bus:<16}   Off |                  Off |")
        lines.append(
            f"| {fan:>2}%  {temp:>3}C    {pstate:<3}  {at.h.power_w:>5.0f}W /  {at.h.power_limit_w:.0f}W | {mem:>22} | {g.utilization_pct:>6}%      Default |"
        )
        lines.append(
            "+-----------------------------------------+------------------------+----------------------+"
        )
    lines += [
        "",
        bar,
        "| Processes:                                                                              |",
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|=========================================================================================|",
    ]
    procs = [(g, p) for g in snap.gpus for p in g.processes]
    if not procs:
        lines.append(
            "|  No running processes found                                                             |"
        )
    for g, p in procs:
        lines.append(
            f"|  {g.index:>3}   N/A  N/A  {p.pid:>15}      C   {p.name[:32]:<32}  {p.used_mib:>7}MiB |"
        )
    lines.append(bar)
    return "\n".join(lines) + "\n"


LOST_STATUS = 15
"""nvidia-smi's exit status when a GPU cannot be reached: NVML's GPU_IS_LOST (the console reads the lines,
not the status)."""


def _lost_line(g: Gpu) -> str:
    # as public reports show it (NVIDIA/open-gpu-kernel-modules#387): the bus ID with a 4-digit domain
    return f"Unable to determine the device handle for GPU{_bus_id(g)[4:]}: Unknown Error\n"


def lost_shown(argv: list[str], snap: GpuSnapshot, conditions: GpuConditions) -> bool:
    """Whether the command names a GPU the driver cannot reach (its exit status is then `LOST_STATUS`)."""
    gone = lost_gpus(conditions)
    if not gone:
        return False
    ids = _ids(argv)
    return any(g.index in gone and (ids is None or g.index in ids) for g in snap.gpus)


def _ids(argv: list[str]) -> set[int] | None:
    it = iter(argv)
    for arg in it:
        if arg in ("-i", "--id"):
            return {int(x) for x in next(it, "").split(",") if x.strip().isdigit()}
        if arg.startswith("--id="):
            return {int(x) for x in arg.split("=", 1)[1].split(",") if x.strip().isdigit()}
    return None


def render(argv: list[str], snap: GpuSnapshot, conditions: GpuConditions | None = None) -> str:
    """What nvidia-smi prints. A GPU that fell off the bus (`lost_gpus`) is its `Unable to determine the
    device handle` line in place of its row, as the real one prints; the plain table is then that line
    alone."""
    conditions = conditions if conditions is not None else GpuConditions()
    gone = lost_gpus(conditions)
    query_gpu = query_apps = None
    fmt: set[str] | None = None
    ids: set[int] | None = None
    list_gpus = False
    it = iter(argv)
    for arg in it:
        if arg.startswith("--query-gpu="):
            query_gpu = arg.split("=", 1)[1]
        elif arg.startswith("--query-compute-apps="):
            query_apps = arg.split("=", 1)[1]
        elif arg.startswith("--format="):
            fmt = {f.strip() for f in arg.split("=", 1)[1].split(",")}
        elif arg in ("-L", "--list-gpus"):
            list_gpus = True
        elif arg in ("-i", "--id"):
            ids = {int(x) for x in next(it, "").split(",") if x.strip().isdigit()}
        elif arg.startswith("--id="):
            ids = {int(x) for x in arg.split("=", 1)[1].split(",") if x.strip().isdigit()}
        elif arg.startswith("-"):
            raise _Fail("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n", 2)
    gpus = [g for g in snap.gpus if ids is None or g.index in ids]
    if list_gpus:
        return "".join(
            _lost_line(g) if g.index in gone else f"GPU {g.index}: {g.name} (UUID: {g.uuid})\n" for g in gpus
        )
    if query_gpu is not None or query_apps is not None:
        if fmt is None or "csv" not in fmt:
            raise _Fail("Option --format is required when using --query-gpu or --query-compute-apps.\n", 2)
        if query_gpu is not None:
            refused = _V2_ONLY if conditions.driver_memory == "v1" else ()
            names = _fields(query_gpu, _GPU_FIELDS, refused)
            headers = [(_GPU_FIELDS[n][0], _GPU_FIELDS[n][1]) for n in names]
            out = _csv([], headers, fmt)
            for g in gpus:
                if g.index in gone:
                    out += _lost_line(g)
                    continue
                at = _At(g, snap, health(g, conditions), conditions)
                out += _csv(
                    [[(_GPU_FIELDS[n][2](at), _GPU_FIELDS[n][1]) for n in names]], headers, fmt | {"noheader"}
                )
            return out
        assert query_apps is not None
        names = _fields(query_apps, _APP_FIELDS)
        headers = [(_APP_FIELDS[n][0], _APP_FIELDS[n][1]) for n in names]
        rows = [
            [(_APP_FIELDS[n][2](g, p), _APP_FIELDS[n][1]) for n in names]
            for g in gpus
            if g.index not in gone
            for p in g.processes
        ]
        return "".join(_lost_line(g) for g in gpus if g.index in gone) + _csv(rows, headers, fmt)
    if any(g.index in gone for g in gpus):
        return "".join(_lost_line(g) for g in gpus if g.index in gone)
    return _table(GpuSnapshot(updated=snap.updated, pid=snap.pid, gpus=gpus), conditions)


def _loop_interval(argv: list[str]) -> tuple[list[str], float | None]:
    rest: list[str] = []
    interval = None
    it = iter(argv)
    for arg in it:
        if arg in ("-l", "--loop"):
            interval = float(next(it, "5"))
        elif arg.startswith("--loop="):
            interval = float(arg.split("=", 1)[1])
        elif arg in ("-lms", "--loop-ms"):
            interval = float(next(it, "1000")) / 1000
        elif arg.startswith("--loop-ms="):
            interval = float(arg.split("=", 1)[1]) / 1000
        else:
            rest.append(arg)
    return rest, interval


def snapshot(layout: TwinLayout, cfg: TwinConfig) -> GpuSnapshot:
    return gpustate.read(layout, cfg)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    layout = TwinLayout.from_env()
    cfg = layout.load_config()
    try:
        args, interval = _loop_interval(args)
        while True:
            snap, conditions = snapshot(layout, cfg), read_conditions(layout)
            sys.stdout.write(render(args, snap, conditions))
            sys.stdout.flush()
            if interval is None:
                return LOST_STATUS if lost_shown(args, snap, conditions) else 0
            time.sleep(max(interval, 0.05))
    except _Fail as exc:
        sys.stdout.write(str(exc))
        return exc.code
    except ValueError:
        sys.stdout.write("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n")
        return 2
    except (BrokenPipeError, KeyboardInterrupt):
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
