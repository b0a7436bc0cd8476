"""`nvidia-smi` for a twin host: `--query-gpu`, `--query-compute-apps`, `-L`, `-i`, `-l/-lms`, and the
default table, with the numbers of the simulated GPUs (console.twin.gpustate).

CSV output matches the real tool: header fields with their unit in brackets (`memory.used [MiB]`),
values with the unit (`40123 MiB`), `noheader` and `nounits` dropping each.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import datetime

from console.twin import gpustate
from console.twin.gpustate import Gpu, GpuProcess, GpuSnapshot
from console.twin.layout import TwinConfig, TwinLayout

DRIVER_VERSION = "580.95.05"
CUDA_VERSION = "13.0"
POWER_LIMIT_W = 600.0
IDLE_POWER_W = 32.0

# name -> (header, unit, value)
_GpuField = tuple[str, str, Callable[[Gpu, GpuSnapshot], str]]


def _power(g: Gpu) -> float:
    return IDLE_POWER_W + (POWER_LIMIT_W - IDLE_POWER_W) * g.utilization_pct / 100


def _mem_util(g: Gpu) -> int:
    # Memory-controller busy tracks compute on a decode-bound server; it is not memory occupancy.
    return int(g.utilization_pct * 0.6)


_GPU_FIELDS: dict[str, _GpuField] = {
    "timestamp": (
        "timestamp",
        "",
        lambda g, s: datetime.fromtimestamp(s.updated).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3],
    ),
    "driver_version": ("driver_version", "", lambda g, s: DRIVER_VERSION),
    "count": ("count", "", lambda g, s: str(len(s.gpus))),
    "index": ("index", "", lambda g, s: str(g.index)),
    "name": ("name", "", lambda g, s: g.name),
    "gpu_name": ("name", "", lambda g, s: g.name),
    "uuid": ("uuid", "", lambda g, s: g.uuid),
    "gpu_uuid": ("uuid", "", lambda g, s: g.uuid),
    "pci.bus_id": ("pci.bus_id", "", lambda g, s: f"00000000:{0x18 + g.index * 0x10:02X}:00.0"),
    "gpu_bus_id": ("pci.bus_id", "", lambda g, s: f"00000000:{0x18 + g.index * 0x10:02X}:00.0"),
    "persistence_mode": ("persistence_mode", "", lambda g, s: "Enabled"),
    "pstate": ("pstate", "", lambda g, s: "P0" if g.processes else "P8"),
    "fan.speed": ("fan.speed", "%", lambda g, s: str(30 + g.utilization_pct // 3)),
    "temperature.gpu": ("temperature.gpu", "", lambda g, s: str(34 + g.utilization_pct * 40 // 100)),
    "utilization.gpu": ("utilization.gpu", "%", lambda g, s: str(g.utilization_pct)),
    "utilization.memory": ("utilization.memory", "%", lambda g, s: str(_mem_util(g))),
    "memory.total": ("memory.total", "MiB", lambda g, s: str(g.memory_total_mib)),
    "memory.used": ("memory.used", "MiB", lambda g, s: str(g.memory_used_mib)),
    "memory.free": ("memory.free", "MiB", lambda g, s: str(max(0, g.memory_total_mib - g.memory_used_mib))),
    "memory.reserved": ("memory.reserved", "MiB", lambda g, s: "0"),
    "power.draw": ("power.draw", "W", lambda g, s: f"{_power(g):.2f}"),
    "power.limit": ("power.limit", "W", lambda g, s: f"{POWER_LIMIT_W:.2f}"),
    "clocks.sm": ("clocks.current.sm", "MHz", lambda g, s: "2430" if g.processes else "180"),
    "clocks.current.sm": ("clocks.current.sm", "MHz", lambda g, s: "2430" if g.processes else "180"),
    "clocks.mem": ("clocks.current.memory", "MHz", lambda g, s: "14001" if g.processes else "405"),
    "compute_mode": ("compute_mode", "", lambda g, s: "Default"),
}

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


def _fields(spec: str, table: dict) -> list[str]:  # type: ignore[type-arg]
    names = [f.strip() for f in spec.split(",") if f.strip()]
    for n in names:
        if n not in table:
            raise _Fail(f'Field "{n}" is not a valid field to query.\n', 2)
    return names


def _csv(rows: list[list[tuple[str, str]]], headers: list[tuple[str, str]], fmt: set[str]) -> str:
    out = []
    if "noheader" not in fmt:
        out.append(", ".join(f"{h} [{u}]" if u and "nounits" not in fmt else h for h, u in headers))
    for row in rows:
        out.append(", ".join(f"{v} {u}" if u and "nounits" not in fmt else v for v, u in row))
    return "".join(line + "\n" for line in out)


def _table(snap: GpuSnapshot) -> str:
    now = datetime.now().strftime("%a %b %d %H:%M:%S %Y")
    bar = "+-----------------------------------------------------------------------------------------+"
    lines = [
        now,
        bar,
        f"| NVIDIA-SMI {DRIVER_VERSION}              Driver Version: {DRIVER_VERSION}      CUDA Version: {CUDA_VERSION}     |",
        "|-----------------------------------------+------------------------+----------------------+",
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|=========================================+========================+======================|",
    ]
    for g in snap.gpus:
        name = g.name[:20]
        bus = _GPU_FIELDS["pci.bus_id"][2](g, snap)[4:]
        fan = _GPU_FIELDS["fan.speed"][2](g, snap)
        temp = _GPU_FIELDS["temperature.gpu"][2](g, snap)
        pstate = _GPU_FIELDS["pstate"][2](g, snap)
        mem = f"{g.memory_used_mib}MiB /  {g.memory_total_mib}MiB"
        lines.append(f"| {g.index:>3}  {name:<20}            On  | {bus:<16}   Off |                  Off |")
        lines.append(
            f"| {fan:>2}%  {temp:>3}C    {pstate:<3}  {_power(g):>5.0f}W /  {POWER_LIMIT_W:.0f}W | {mem:>22} | {g.utilization_pct:>6}%      Default |"
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


def render(argv: list[str], snap: GpuSnapshot) -> str:
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
        return "".join(f"GPU {g.index}: {g.name} (UUID: {g.uuid})\n" for g in gpus)
    if query_gpu is not None or query_apps is not None:
        if fmt is None or "csv" not in fmt:
            raise _Fail("Option --format is required when using --query-gpu or --query-compute-apps.\n", 2)
        if query_gpu is not None:
            names = _fields(query_gpu, _GPU_FIELDS)
            headers = [(_GPU_FIELDS[n][0], _GPU_FIELDS[n][1]) for n in names]
            rows = [[(_GPU_FIELDS[n][2](g, snap), _GPU_FIELDS[n][1]) for n in names] for g in gpus]
            return _csv(rows, headers, fmt)
        assert query_apps is not None
        names = _fields(query_apps, _APP_FIELDS)
        headers = [(_APP_FIELDS[n][0], _APP_FIELDS[n][1]) for n in names]
        rows = [
            [(_APP_FIELDS[n][2](g, p), _APP_FIELDS[n][1]) for n in names] for g in gpus for p in g.processes
        ]
        return _csv(rows, headers, fmt)
    return _table(GpuSnapshot(updated=snap.updated, pid=snap.pid, gpus=gpus))


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
            sys.stdout.write(render(args, snapshot(layout, cfg)))
            sys.stdout.flush()
            if interval is None:
                return 0
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
