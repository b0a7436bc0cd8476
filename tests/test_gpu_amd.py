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
