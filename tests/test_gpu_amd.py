"""Issue 31 item 5: AMD hosts. `amd-smi` (ROCm 6 on) and `rocm-smi` (older ROCm) JSON read into the same
GPU sample as NVIDIA's back-ends: memory and utilisation at least, temperature and power where given, the
card's name for the bandwidth table; the sampler picked when a host has no NVIDIA driver at all.
Published outputs in tests/data/amd (INDEX.md gives each source)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from console.core.amd import AmdFormatError, parse_amd_smi, parse_rocm_smi
from console.core.cards import card_bandwidth
from console.core.gpus import SamplerState
from console.sources.gpus import AmdSmiSampler, LocalRunner, open_sampler
from tests.test_sources_gpus import STANDIN, _load

DATA = Path(__file__).resolve().parent / "data" / "amd"
MIB = 2**20

# `amd-smi metric --usage --mem-usage --power --temperature --json` of two MI300X, in the format of AMD's
# CLI source (tests/data/amd/INDEX.md): GPU 1 cannot give its hotspot, nor its power.
MI300X_METRIC = [
    {
        "gpu": index,
        "usage": {
            "gfx_activity": {"value": util, "unit": "%"},
            "umc_activity": {"value": 3, "unit": "%"},
            "mm_activity": "N/A",
        },
        "power": {"socket_power": {"value": 412, "unit": "W"} if index == 0 else "N/A"},
        "temperature": {
            "edge": {"value": 41, "unit": "C"},
            "hotspot": {"value": 58, "unit": "C"} if index == 0 else "N/A",
            "mem": {"value": 47, "unit": "C"},
        },
        "mem_usage": {
            "total_vram": {"value": 196592, "unit": "MB"},
            "used_vram": {"value": used, "unit": "MB"},
            "free_vram": {"value": 196592 - used, "unit": "MB"},
            "total_visible_vram": {"value": 196592, "unit": "MB"},
        },
    }
    for index, util, used in ((0, 97, 181_024), (1, 0, 283))
]
MI300X_STATIC = [
    {"gpu": i, "asic": {"market_name": "AMD Instinct MI300X OAM", "vendor_id": "0x1002"}} for i in range(2)
]


def test_rocm_smi_of_a_real_radeon() -> None:
    (gpu,) = parse_rocm_smi((DATA / "rocm-smi-rx7900xt.json").read_text())
    assert (gpu.index, gpu.name, gpu.utilization_pct) == (0, "Radeon RX 7900 XT", 0.0)
    assert gpu.memory_total_mib == 21_458_059_264 / MIB == 20_464.0
    assert gpu.memory_used_mib == pytest.approx(26.566, abs=1e-3)
    assert gpu.temperature_c is None and gpu.power_w is None  # not asked in that output: absent, not 0


def test_amd_smi_of_amd_s_own_example_gives_what_it_holds_and_no_more() -> None:
    (gpu,) = parse_amd_smi((DATA / "amd-smi-metric-power.json").read_text())
    assert (gpu.index, gpu.power_w) == (0, 10.0)
    assert gpu.memory_used_mib is None and gpu.utilization_pct is None and gpu.temperature_c is None


@pytest.mark.parametrize("wrapped", [False, True], ids=["rocm6-list", "rocm7-gpu_data"])
def test_amd_smi_of_mi300x_memory_use_temperature_power_and_name(wrapped: bool) -> None:
    metric = {"gpu_data": MI300X_METRIC} if wrapped else MI300X_METRIC
    busy, idle = parse_amd_smi(json.dumps(metric), json.dumps(MI300X_STATIC))
    assert (busy.index, busy.name, busy.utilization_pct) == (0, "AMD Instinct MI300X OAM", 97.0)
    assert (busy.memory_used_mib, busy.memory_total_mib, busy.memory_free_mib) == (181_024, 196_592, 15_568)
    assert (busy.temperature_c, busy.power_w) == (58.0, 412.0)  # the hotspot, where the part slows
    assert (idle.temperature_c, idle.power_w, idle.memory_used_mib) == (41.0, None, 283.0)  # the edge
    entry = card_bandwidth(busy.name, busy.memory_total_mib)
    assert entry is not None and entry.peak_gbs == 5300.0


def test_what_is_not_the_tools_json_is_one_sentence() -> None:
    with pytest.raises(AmdFormatError, match=r"^amd-smi metric printed something that is not its JSON"):
        parse_amd_smi("ERROR: amdgpu driver not loaded")
    with pytest.raises(AmdFormatError, match="holds no list of GPUs"):
        parse_amd_smi('{"gpu": 0}')
    with pytest.raises(AmdFormatError, match="holds no cards"):
        parse_rocm_smi("[]")
    hostile = json.dumps([{"gpu": 0, "mem_usage": {"total_vram": {"value": 1e30, "unit": "MB"}}}])
    (gpu,) = parse_amd_smi(hostile)
    assert gpu.memory_total_mib is None and gpu.refused  # held to its range as every back-end's


def _tools(bindir: Path, *, amd_smi: bool = True, rocm_smi: bool = True) -> None:
    """Stand-ins on PATH: `amd-smi` answering the MI300X, `rocm-smi` the Radeon (and nothing else)."""
    bindir.mkdir(parents=True, exist_ok=True)
    (bindir / "metric.json").write_text(json.dumps(MI300X_METRIC))
    (bindir / "static.json").write_text(json.dumps(MI300X_STATIC))
    if amd_smi:
        script = bindir / "amd-smi"
        script.write_text(
            "#!/bin/sh\n"
            'case "$1 $*" in\n'
            f'  "metric metric --usage --mem-usage --power --temperature --json") /bin/cat "{bindir}/metric.json";;\n'
            f'  "static static --asic --json") /bin/cat "{bindir}/static.json";;\n'
            '  *) echo "unexpected: $*" >&2; exit 2;;\n'
            "esac\n"
        )
        script.chmod(0o755)
    if rocm_smi:
        script = bindir / "rocm-smi"
        script.write_text(f'#!/bin/sh\n/bin/cat "{DATA / "rocm-smi-rx7900xt.json"}"\n')
        script.chmod(0o755)


async def test_the_sampler_reads_amd_smi_else_rocm_smi_else_says_neither(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = tmp_path / "bin"
    monkeypatch.setenv("PATH", str(bindir))
    _tools(bindir)
    sample = await AmdSmiSampler(LocalRunner(), host="mi300x").sample()
    assert (sample.state, sample.backend, len(sample.gpus)) == (SamplerState.OK, "amd-smi", 2)
    assert sample.gpus[0].name == "AMD Instinct MI300X OAM" and sample.gpus[0].memory_used_mib == 181_024

    (bindir / "amd-smi").unlink()  # ROCm before 6: rocm-smi only
    sampler = AmdSmiSampler(LocalRunner(), host="radeon")
    sample = await sampler.sample()
    assert (sample.state, sample.backend) == (SamplerState.OK, "rocm-smi")
    assert sample.gpus[0].name == "Radeon RX 7900 XT" and sampler.backend == "rocm-smi"

    (bindir / "rocm-smi").unlink()
    sample = await AmdSmiSampler(LocalRunner()).sample()
    assert sample.state is SamplerState.NVML_MISSING
    assert sample.detail == "neither amd-smi nor rocm-smi is installed on the host."


async def test_a_host_without_nvidia_s_driver_is_read_with_amd_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    standin = tmp_path / "nvml"
    standin.mkdir()
    (standin / "pynvml.py").write_text(STANDIN.replace("MISSING = False", "MISSING = True"))
    bindir = tmp_path / "bin"
    monkeypatch.setenv("PATH", str(bindir))  # no nvidia-smi here
    _tools(bindir)
    sampler, first = await open_sampler(None, nvml=_load(standin / "pynvml.py"), host="mi300x")
    assert sampler.backend == "amd-smi" and first.state is SamplerState.OK and len(first.gpus) == 2
    # With no AMD tool either, nvidia-smi's sentence stays the one that says why.
    for tool in ("amd-smi", "rocm-smi"):
        (bindir / tool).unlink()
    sampler, first = await open_sampler(None, nvml=_load(standin / "pynvml.py"))
    assert sampler.backend == "nvidia-smi" and first.detail == "nvidia-smi is not installed on the host."


# Issue 31 item 4, AMD beyond temperature and power. `amd-smi metric --ecc --pcie --clock` sections and
# `static --bus --limit` of an MI300X, in the format of AMD's CLI source (ROCm/amdsmi
# amdsmi_cli/amdsmi_commands.py at 0ceca28: `values_dict['ecc' | 'pcie' | 'clock']`, `static_dict['bus' |
# 'limit']`; tests/data/amd/INDEX.md). GPU 0 works at its power cap, throttled; GPU 1 is throttled past its
# slowdown point with an uncorrectable ECC error on a link trained at x8 (reported in MT/s, as
# ROCm/rocm-systems#5200 shows some versions do).
def _health_metric(index: int) -> dict[str, object]:
    hot = index == 1
    return {
        **MI300X_METRIC[index],
        "usage": {"gfx_activity": {"value": 96, "unit": "%"}},
        "power": {
            "socket_power": {"value": 750 if not hot else 520, "unit": "W"},
            "gfx_voltage": "N/A",
            "throttle_status": "THROTTLED",
            "power_management": "ENABLED",
        },
        "temperature": {
            "edge": {"value": 70, "unit": "C"},
            "hotspot": {"value": 104 if hot else 81, "unit": "C"},
            "mem": {"value": 77, "unit": "C"},
        },
        "clock": {
            "gfx_0": {
                "clk": {"value": 1300 if hot else 1700, "unit": "MHz"},
                "min_clk": {"value": 500, "unit": "MHz"},
                "max_clk": {"value": 2100, "unit": "MHz"},
                "clk_locked": "N/A",
                "deep_sleep": "DISABLED",
            },
            "mem_0": {
                "clk": {"value": 1300, "unit": "MHz"},
                "min_clk": {"value": 900, "unit": "MHz"},
                "max_clk": {"value": 1300, "unit": "MHz"},
                "clk_locked": "N/A",
                "deep_sleep": "DISABLED",
            },
        },
        "pcie": {
            "width": 8 if hot else 16,
            "speed": 16000 if hot else {"value": 32, "unit": "GT/s"},
            "bandwidth": "N/A",
            "replay_count": 0,
        },
        "ecc": {
            "total_correctable_count": 12,
            "total_uncorrectable_count": 1 if hot else 0,
            "total_deferred_count": 0,
            "cache_correctable_count": 0,
            "cache_uncorrectable_count": 0,
        },
    }


MI300X_STATIC_HEALTH = [
    {
        "gpu": i,
        "asic": {"market_name": "AMD Instinct MI300X OAM"},
        "bus": {
            "bdf": f"0000:{0x0C + 0x10 * i:02x}:00.0",
            "max_pcie_width": 16,
            "max_pcie_speed": {"value": 32, "unit": "GT/s"},
            "pcie_interface_version": "Gen 5",
            "slot_type": "OAM",
        },
        "limit": {
            "max_power": {"value": 750, "unit": "W"},
            "min_power": {"value": 0, "unit": "W"},
            "socket_power": {"value": 750, "unit": "W"},
            "slowdown_edge_temperature": "N/A",
            "slowdown_hotspot_temperature": {"value": 100, "unit": "C"},
            "shutdown_hotspot_temperature": {"value": 105, "unit": "C"},
        },
    }
    for i in range(2)
]


def test_amd_smi_s_processes_from_amd_s_own_example() -> None:
    """`amd-smi process --json` as AMD's CHANGELOG prints it (the `-G` form: `mem_usage` only)."""
    metric = json.dumps([MI300X_METRIC[0]])
    (gpu,) = parse_amd_smi(metric, "", (DATA / "amd-smi-process-general.json").read_text())
    assert [(p.pid, p.name, p.used_memory_mib) for p in gpu.processes] == [
        (420157, "TransferBench", 0.0),
        (420315, "rvs", 0.0),
    ]
    idle = json.dumps([{"gpu": 0, "process_list": [{"process_info": "No running processes detected"}]}])
    assert parse_amd_smi(metric, "", idle)[0].processes == ()


def test_amd_smi_s_health_becomes_the_faults_an_operator_sees() -> None:
    from console.core import gpuhealth
    from console.core.alerts import alert_inputs, default_rules, evaluate
    from console.core.gpus import HostGpuSample
    from tests.tui_support import snapshot

    capped, hot = parse_amd_smi(
        json.dumps([_health_metric(0), _health_metric(1)]), json.dumps(MI300X_STATIC_HEALTH)
    )
    assert (capped.power_limit_w, capped.temperature_slowdown_c, capped.temperature_shutdown_c) == (
        750,
        100,
        105,
    )
    assert (capped.clock_sm_mhz, capped.clock_sm_max_mhz, capped.clock_mem_max_mhz) == (1700, 2100, 1300)
    assert (capped.pcie_gen, capped.pcie_width, capped.pcie_gen_max, capped.pcie_width_max) == (5, 16, 5, 16)
    assert (hot.pcie_gen, hot.pcie_width) == (4, 8)  # 16000 "GT/s" read as the MT/s it is
    assert (hot.ecc_corrected_volatile, hot.ecc_uncorrected_volatile, hot.throttled) == (12, 1, True)
    assert [f.kind for f in gpuhealth.faults(capped)] == ["power"]
    assert [f.kind for f in gpuhealth.faults(hot)] == ["ecc", "thermal", "pcie"]
    assert "throttled (the back-end names no cause)" in gpuhealth.faults(hot)[1].words
    sample = HostGpuSample(state=SamplerState.OK, backend="amd-smi", gpus=(capped, hot))
    firing = evaluate(default_rules(), alert_inputs(snapshot([], sample)), host="mi300x", ts=1.0).firing
    assert set(firing) == {
        "gpu_power_capped > 0",
        "gpu_thermal_slowdown > 0",
        "gpu_pcie_degraded > 0",
        "gpu_ecc_uncorrected > 0",
    }
    assert (
        "GPU1 thermal slowdown at 104 °C (slowdown at 100 °C)" in firing["gpu_thermal_slowdown > 0"].message
    )
    # positive control: unthrottled, the same figures are no slowdown (the flag is what says so)
    calm = _health_metric(1) | {
        "power": {"socket_power": {"value": 520, "unit": "W"}, "throttle_status": "UNTHROTTLED"}
    }
    (_, cool) = parse_amd_smi(json.dumps([_health_metric(0), calm]), json.dumps(MI300X_STATIC_HEALTH))
    assert gpuhealth.thermal_slowdown(cool) is False and gpuhealth.power_capped(cool) is False


async def test_the_sampler_asks_amd_smi_for_health_and_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An amd-smi that takes the health options is asked them, its static facts once, its processes each
    tick; the older one of `_tools` (which refuses them) keeps the base reading (the test above)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))
    (bindir / "metric.json").write_text(json.dumps([_health_metric(0), _health_metric(1)]))
    (bindir / "static.json").write_text(json.dumps(MI300X_STATIC_HEALTH))
    (bindir / "process.json").write_text((DATA / "amd-smi-process-general.json").read_text())
    script = bindir / "amd-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{bindir}/asked"\n'
        'case "$*" in\n'
        f'  "metric --usage --mem-usage --power --temperature --ecc --pcie --clock --json") /bin/cat "{bindir}/metric.json";;\n'
        f'  "static --asic --bus --limit --json") /bin/cat "{bindir}/static.json";;\n'
        f'  "process --json") /bin/cat "{bindir}/process.json";;\n'
        '  *) echo "amd-smi: error: unrecognized arguments: $*" >&2; exit 2;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    sampler = AmdSmiSampler(LocalRunner(), host="mi300x")
    first = await sampler.sample()
    second = await sampler.sample()
    assert first.state is SamplerState.OK and second.gpus[1].ecc_uncorrected_volatile == 1
    assert [p.name for p in second.gpus[0].processes] == ["TransferBench", "rvs"]
    asked = (bindir / "asked").read_text().splitlines()
    assert asked.count("static --asic --bus --limit --json") == 1 and asked.count("process --json") == 2
    assert not any("unrecognized" in line for line in asked)
