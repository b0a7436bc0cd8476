"""Issue 31: what a real card says. The console's three GPU back-ends (local NVML, the NVML agent run by a
real python3, nvidia-smi) read the real H200 of `tests/data/real-gpu-h200/` and agree: memory as
nvidia-smi counts it (NVML v2: used without the driver's reservation, the reservation apart), a v1-only
driver said to be one, and the card's health read where each back-end can.

NVML is played by a `pynvml` stand-in answering the H200's own NVML figures (`samples.json`: raw v1 and v2
memory info, every health field the card answered); nvidia-smi by a script printing the figures of the
H200's `nvidia-smi -q` and `--query-gpu` memory, in the query's field order.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from console.core import gpuhealth
from console.core.gpus import SMI_QUERY_FIELDS, GpuSample, HostGpuSample, SamplerState, sample_from_agent_line
from console.sources.gpu_agent import agent_argv
from console.sources.gpus import LocalRunner, NvidiaSmiSampler, NvmlSampler
from tests.test_sources_gpus import _load

H200 = Path(__file__).resolve().parent / "data" / "real-gpu-h200"
SAMPLES: dict[str, Any] = json.loads((H200 / "samples.json").read_text())
MIB = 1024 * 1024


def smi_q(text: str) -> dict[str, str]:
    """`nvidia-smi -q` as `Section/Sub/Label` → value (the GPU's own header left out)."""
    out: dict[str, str] = {}
    stack: list[str] = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("="):
            continue
        level = (len(line) - len(line.lstrip(" "))) // 4
        match = re.match(r"^\s*(\S.*?)\s+:\s?(.*)$", line)
        stack = stack[:level]
        if match:
            out["/".join([*stack[1:], match.group(1)])] = match.group(2).strip()
        else:
            stack.append(line.strip())
    return out


Q = smi_q((H200 / "nvidia-smi-q.txt").read_text())

# The H200's NVML, as nvidia-ml-py 13 answers it: `nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)`
# through nvmlDeviceGetMemoryInfo_v2 (missing from a driver before R510: NVML_ERROR_FUNCTION_NOT_FOUND).
STANDIN = """
import json, time

_D = json.loads({data!r})
_F = _D["fields"]
MIB = 1048576
nvmlMemory_v2 = 0x02000028
NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
nvmlEventTypeXidCriticalError = 8


class NVMLError(Exception):
    def __init__(self, value):
        self.value = value
        super().__init__(value)


class NVMLError_LibraryNotFound(NVMLError):
    pass


class _S:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return 1


def nvmlDeviceGetHandleByIndex(i):
    return i


def nvmlDeviceGetIndex(h):
    return h


def nvmlDeviceGetName(h):
    return _F["name"]


def nvmlDeviceGetUUID(h):
    return _F["uuid"]


def nvmlDeviceGetMemoryInfo(h, version=None):
    m = _D["memory"]
    if not version:
        return _S(total=int(m["v1_total_mib"] * MIB), free=int(m["v1_free_mib"] * MIB),
                  used=int(m["v1_used_mib"] * MIB))
    if not _D["v2"]:
        raise NVMLError(13)
    return _S(version=version, total=int(m["v2_total_mib"] * MIB), reserved=int(m["v2_reserved_mib"] * MIB),
              free=int(m["v2_free_mib"] * MIB), used=int(m["v2_used_mib"] * MIB))


def nvmlDeviceGetUtilizationRates(h):
    return _S(gpu=_D["util"], memory=0)


def nvmlDeviceGetComputeRunningProcesses(h):
    return [_S(pid=p["pid"], usedGpuMemory=int(p["used_memory_mib"] * MIB)) for p in _D["processes"]]


def nvmlSystemGetProcessName(pid):
    return [p["name"] for p in _D["processes"] if p["pid"] == pid][0]


def nvmlDeviceGetTemperature(h, sensor):
    return _F["temp_gpu_c"]


def nvmlDeviceGetTemperatureThreshold(h, which):
    return _F["temp_thresholds_slowdown"] if which == 1 else _F["temp_thresholds_shutdown"]


def nvmlDeviceGetPowerUsage(h):
    return _F["power_mw"]


def nvmlDeviceGetEnforcedPowerLimit(h):
    return _F["power_limit_mw"]


def nvmlDeviceGetTotalEnergyConsumption(h):
    return _F["energy_mj"]


def nvmlDeviceGetFanSpeed(h):
    raise NVMLError(3)  # an SXM card has no fan


def nvmlDeviceGetClockInfo(h, clock):
    return _F["clock_sm_mhz"] if clock == 1 else _F["clock_mem_mhz"]


def nvmlDeviceGetMaxClockInfo(h, clock):
    return _F["max_clock_sm_mhz"] if clock == 1 else _F["max_clock_mem_mhz"]


def nvmlDeviceGetMemoryBusWidth(h):
    return _F["mem_bus_width_bits"]


def nvmlDeviceGetCurrentClocksEventReasons(h):
    return _F["clock_event_reasons"]


def nvmlDeviceGetCurrentClocksThrottleReasons(h):
    return _F["throttle_reasons"]


def nvmlDeviceGetPerformanceState(h):
    return _F["perf_state"]


def nvmlDeviceGetEccMode(h):
    return tuple(_F["ecc_mode"])


def nvmlDeviceGetTotalEccErrors(h, kind, counter):
    return _F["ecc_uncorrected_volatile"] if kind == 1 else _F["ecc_corrected_volatile"]


def nvmlDeviceGetRetiredPages(h, cause):
    raise NVMLError(3)  # replaced by row remapping on this card


def nvmlDeviceGetRemappedRows(h):
    return tuple(_F["remapped_rows"])


def nvmlDeviceGetCurrPcieLinkGeneration(h):
    return _F["pcie_gen"]


def nvmlDeviceGetMaxPcieLinkGeneration(h):
    return _F["pcie_max_gen"]


def nvmlDeviceGetCurrPcieLinkWidth(h):
    return _F["pcie_width"]


def nvmlDeviceGetMaxPcieLinkWidth(h):
    return _D["pcie_max_width"]


def nvmlEventSetCreate():
    return _S(devices=[])


def nvmlDeviceRegisterEvents(h, kinds, events):
    events.devices.append(h)


def nvmlEventSetWait_v2(events, timeout_ms):
    time.sleep(timeout_ms / 1000)
    raise NVMLError(10)  # no XID: the card's own answer ("xid_wait": "NVMLError_Timeout(10)")


def nvmlEventSetFree(events):
    pass
"""


def standin_text(state: str, *, v2: bool = True) -> str:
    """The stand-in for the H200 `idle` or `loaded` (with the 40 GiB process)."""
    reading = SAMPLES[state]
    fields = dict(SAMPLES["nvml_fields"])
    data = {
        "fields": fields,
        "memory": reading["raw"],
        "v2": v2,
        "util": int(reading["nvml"]["gpus"][0]["utilization_pct"]),
        "processes": reading["nvml"]["gpus"][0]["processes"],
        # samples.json did not ask NVML the link's maximum width; nvidia-smi -q of the same card says it
        "pcie_max_width": int(Q["PCI/GPU Link Info/Link Width/Max"].removesuffix("x")),
    }
    return STANDIN.format(data=json.dumps(data))


def _number(text: str) -> str:
    return text.split()[0]


def smi_csv(state: str) -> str:
    """One `--query-gpu=SMI_QUERY_FIELDS --format=csv,noheader,nounits` row, the H200's own figures: its
    `nvidia-smi -q` (health) and its `--query-gpu=memory.used,memory.total,memory.reserved,memory.free`."""
    used, total, reserved, _free = (v.strip() for v in SAMPLES[state]["raw"]["smi"].split(","))
    active = {
        "Idle": 0x1,
        "Applications Clocks Setting": 0x2,
        "SW Power Cap": 0x4,
        "HW Slowdown": 0x8,
        "Sync Boost": 0x10,
        "SW Thermal Slowdown": 0x20,
        "HW Thermal Slowdown": 0x40,
        "HW Power Brake Slowdown": 0x80,
        "Display Clock Setting": 0x100,
    }
    reasons = sum(bit for label, bit in active.items() if Q[f"Clocks Event Reasons/{label}"] == "Active")
    volatile = "ECC Errors/Volatile"
    value = {
        "index": Q["Minor Number"],
        "name": Q["Product Name"],
        "uuid": Q["GPU UUID"],
        "utilization.gpu": f"{SAMPLES[state]['nvidia_smi']['gpus'][0]['utilization_pct']:.0f}",
        "memory.used": used,
        "memory.total": total,
        "memory.reserved": reserved,
        "temperature.gpu": _number(Q["Temperature/GPU Current Temp"]),
        "power.draw": _number(Q["GPU Power Readings/Instantaneous Power Draw"]),
        "enforced.power.limit": _number(Q["GPU Power Readings/Current Power Limit"]),
        "clocks.current.sm": _number(Q["Clocks/SM"]),
        "clocks.max.sm": _number(Q["Max Clocks/SM"]),
        "clocks.current.memory": _number(Q["Clocks/Memory"]),
        "clocks.max.memory": _number(Q["Max Clocks/Memory"]),
        "clocks_event_reasons.active": f"0x{reasons:016X}",
        "pstate": Q["Performance State"],
        "ecc.mode.current": Q["ECC Mode/Current"],
        "ecc.errors.corrected.volatile.total": str(
            int(Q[f"{volatile}/SRAM Correctable"]) + int(Q[f"{volatile}/DRAM Correctable"])
        ),
        "ecc.errors.uncorrected.volatile.total": str(
            sum(
                int(Q[f"{volatile}/{k}"])
                for k in ("SRAM Uncorrectable Parity", "SRAM Uncorrectable SEC-DED", "DRAM Uncorrectable")
            )
        ),
        "remapped_rows.correctable": Q["Remapped Rows/Correctable Error"],
        "remapped_rows.uncorrectable": Q["Remapped Rows/Uncorrectable Error"],
        "remapped_rows.pending": Q["Remapped Rows/Pending"],
        "remapped_rows.failure": Q["Remapped Rows/Remapping Failure Occurred"],
        "pcie.link.gen.current": Q["PCI/GPU Link Info/PCIe Generation/Current"],
        "pcie.link.gen.max": Q["PCI/GPU Link Info/PCIe Generation/Max"],
        "pcie.link.width.current": Q["PCI/GPU Link Info/Link Width/Current"].removesuffix("x"),
        "pcie.link.width.max": Q["PCI/GPU Link Info/Link Width/Max"].removesuffix("x"),
    }
    assert set(value) == set(SMI_QUERY_FIELDS)
    return ", ".join(value[f] for f in SMI_QUERY_FIELDS) + "\n"


def fake_smi(bindir: Path, state: str, *, v2: bool = True) -> None:
    """nvidia-smi on PATH answering the H200 `state`; `v2=False`: an older driver, which refuses
    `memory.reserved` (and counts it in used, as its NVML v1 does)."""
    bindir.mkdir(parents=True, exist_ok=True)
    full = ",".join(SMI_QUERY_FIELDS)
    (bindir / "gpus.csv").write_text(smi_csv(state))
    apps = "".join(
        f"{Q['GPU UUID']}, {p['pid']}, {p['name']}, {p['used_memory_mib']:.0f}\n"
        for p in SAMPLES[state]["nvidia_smi"]["gpus"][0]["processes"]
    )
    (bindir / "apps.csv").write_text(apps)
    raw = SAMPLES[state]["raw"]
    older = ",".join(f for f in SMI_QUERY_FIELDS if f != "memory.reserved")
    old_row = smi_csv(state).split(", ")
    old_row.pop(SMI_QUERY_FIELDS.index("memory.reserved"))
    old_row[SMI_QUERY_FIELDS.index("memory.used")] = f"{raw['v1_used_mib']:.0f}"
    (bindir / "old.csv").write_text(", ".join(old_row))
    gpu_query = (
        f'  --query-gpu={full}) cat "{bindir}/gpus.csv";;\n'
        if v2
        else "  --query-gpu=*memory.reserved*) echo 'Field \"memory.reserved\" is not a valid field to query.'; "
        "exit 2;;\n"
        f'  --query-gpu={older}) cat "{bindir}/old.csv";;\n'
    )
    script = bindir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        + gpu_query
        + f'  --query-compute-apps=gpu_uuid,pid,process_name,used_memory) cat "{bindir}/apps.csv";;\n'
        '  *) echo "unexpected: $*" >&2; exit 2;;\n'
        "esac\n"
    )
    script.chmod(0o755)


async def _agent_sample(standin_dir: Path) -> HostGpuSample:
    """The agent script as sent over SSH, on a real python3 with the stand-in: its first line."""
    proc = await asyncio.create_subprocess_exec(
        *agent_argv(1.0, python=sys.executable),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(standin_dir)},
    )
    assert proc.stdout is not None and proc.stdin is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 10)
    proc.stdin.close()
    assert await asyncio.wait_for(proc.wait(), 10) == 0
    return sample_from_agent_line(line, host="h200")


async def _three(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str, *, v2: bool = True
) -> dict[str, GpuSample]:
    standin = tmp_path / "nvml"
    standin.mkdir()
    (standin / "pynvml.py").write_text(standin_text(state, v2=v2))
    fake_smi(tmp_path / "bin", state, v2=v2)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    local = NvmlSampler(_load(standin / "pynvml.py"), host="h200")
    samples = {
        "nvml": await local.sample(),
        "agent": await _agent_sample(standin),
        "nvidia-smi": await NvidiaSmiSampler(LocalRunner(), host="h200").sample(),
    }
    await local.close()
    assert all(s.state is SamplerState.OK and len(s.gpus) == 1 for s in samples.values()), samples
    return {name: s.gpus[0] for name, s in samples.items()}


@pytest.mark.parametrize("state", ["idle", "loaded"])
async def test_the_three_back_ends_agree_on_the_h200_reserved_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    """NVML v1 read 615 MiB used idle and 42,548 with 40 GiB held where nvidia-smi read 0 and 41,933:
    every back-end now counts as nvidia-smi does, the driver's 615 MiB its own figure."""
    gpus = await _three(tmp_path, monkeypatch, state)
    raw = SAMPLES[state]["raw"]
    nvml = gpus["nvml"]
    assert (nvml.memory_used_mib, nvml.memory_reserved_mib) == (raw["v2_used_mib"], raw["v2_reserved_mib"])
    assert nvml.memory_used_mib + nvml.memory_reserved_mib == raw["v1_used_mib"]  # v1 counted both
    for name, gpu in gpus.items():
        assert gpu.memory_info == "v2", name
        assert gpu.memory_total_mib == 143_771.0
        assert gpu.memory_used_mib is not None and gpu.memory_reserved_mib is not None
        assert abs(gpu.memory_used_mib - nvml.memory_used_mib) <= 1.0, (name, gpu.memory_used_mib)
        assert abs(gpu.memory_reserved_mib - nvml.memory_reserved_mib) <= 1.0, (name, gpu.memory_reserved_mib)
        # free is total less two figures nvidia-smi rounds to the MiB: within 1 MiB each
        assert gpu.memory_free_mib is not None and abs(gpu.memory_free_mib - raw["v2_free_mib"]) <= 2.0
    assert gpus["agent"] == nvml  # one reading code, two places
    procs = {name: [(p.pid, p.used_memory_mib) for p in g.processes] for name, g in gpus.items()}
    assert len({tuple(p) for p in procs.values()}) == 1, procs
    print(
        f"\nH200 {state}: used/reserved MiB "
        + ", ".join(f"{n} {g.memory_used_mib:,.2f}/{g.memory_reserved_mib:,.2f}" for n, g in gpus.items())
    )


async def test_a_driver_without_v2_memory_info_is_read_as_v1_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver before R510 has no nvmlDeviceGetMemoryInfo_v2, and its nvidia-smi no memory.reserved: used
    then includes the reservation, and every back-end says it read v1 (agreeing with each other)."""
    gpus = await _three(tmp_path, monkeypatch, "loaded", v2=False)
    raw = SAMPLES["loaded"]["raw"]
    for name, gpu in gpus.items():
        assert gpu.memory_info == "v1" and gpu.memory_reserved_mib is None, name
        assert gpu.memory_used_mib is not None and abs(gpu.memory_used_mib - raw["v1_used_mib"]) <= 1.0, name
        assert gpu.memory_free_mib is not None and abs(gpu.memory_free_mib - raw["v1_free_mib"]) <= 1.0
    assert gpus["nvml"].memory_used_mib == 42_547.875


async def test_the_h200_health_in_every_back_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Temperature and its thresholds, power and its limit, clocks and their maxima, the clock-event
    reasons, P-state, ECC, remapped rows and the PCIe link, as the H200 answered them; a figure a
    back-end cannot read (nvidia-smi's query has no thresholds, no bus width, no XID events) is absent,
    never 0."""
    gpus = await _three(tmp_path, monkeypatch, "idle")
    f = SAMPLES["nvml_fields"]
    nvml = gpus["nvml"]
    assert (nvml.temperature_c, nvml.temperature_slowdown_c, nvml.temperature_shutdown_c) == (33, 89, 95)
    assert (nvml.power_w, nvml.power_limit_w) == (f["power_mw"] / 1000, 700.0)
    assert (nvml.clock_sm_mhz, nvml.clock_sm_max_mhz) == (345, 1980)
    assert (nvml.clock_mem_mhz, nvml.clock_mem_max_mhz) == (3201, 3201)
    assert nvml.clock_event_reasons == 1 and gpuhealth.reasons(nvml.clock_event_reasons) == ("idle",)
    assert (nvml.pstate, nvml.ecc_enabled, nvml.ecc_corrected_volatile, nvml.ecc_uncorrected_volatile) == (
        0,
        True,
        0,
        0,
    )
    assert (nvml.remapped_rows_correctable, nvml.remapped_rows_uncorrectable) == (0, 0)
    assert (nvml.remap_pending, nvml.remap_failed) == (False, False)
    assert (nvml.pcie_gen, nvml.pcie_gen_max, nvml.pcie_width, nvml.pcie_width_max) == (5, 5, 16, 16)
    assert nvml.memory_bus_width_bits == 6016 and nvml.xids == ()
    assert gpus["agent"] == nvml
    smi = gpus["nvidia-smi"]
    same = ("temperature_c", "power_limit_w", "clock_sm_mhz", "clock_sm_max_mhz", "clock_mem_max_mhz")
    same += ("clock_event_reasons", "pstate", "ecc_enabled", "ecc_uncorrected_volatile", "remap_pending")
    same += ("remap_failed", "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max")
    assert {k: getattr(smi, k) for k in same} == {k: getattr(nvml, k) for k in same}
    assert smi.power_w is not None and abs(smi.power_w - nvml.power_w) < 0.1
    assert smi.temperature_slowdown_c is None and smi.memory_bus_width_bits is None
    # An idle card at P0 with its idle reason set is not throttling, capped or on a degraded link.
    for gpu in gpus.values():
        assert gpuhealth.faults(gpu) == ()
        assert (gpuhealth.thermal_slowdown(gpu), gpuhealth.power_capped(gpu)) == (False, False)
        assert gpuhealth.pcie_degraded(gpu) is False


def test_the_h200_peak_bandwidth_from_its_own_clocks() -> None:
    """2 × the maximum memory clock (3,201 MHz) × the bus (6,016 bits) / 8 = 4,814 GB/s: the spec sheet
    says 4,800, and a device-to-device copy reached 4.27 TB/s (89%)."""
    f = SAMPLES["nvml_fields"]
    gpu = GpuSample(clock_mem_max_mhz=f["max_clock_mem_mhz"], memory_bus_width_bits=f["mem_bus_width_bits"])
    peak = gpuhealth.peak_bandwidth_gbs(gpu)
    assert peak is not None and round(peak, 3) == round(f["derived_peak_gbs"], 3) == 4814.304
    copy = SAMPLES["bandwidth"]["tb_s_read_plus_write"] * 1000
    assert 0.85 < copy / peak < 0.95
    assert gpuhealth.peak_bandwidth_gbs(GpuSample(clock_mem_max_mhz=3201.0)) is None
