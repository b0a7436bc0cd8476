"""Issue 31 items 5-6 on an AMD twin: `k26-console twin --gpu mi300x --gpu-fault thermal` is an MI300X
host (amd-smi answers; no nvidia-smi, no NVML), the console picks its AMD back-end on its own and reads
its processes and health, and the fault the twin plays raises its alert in `snapshot --json` (exit 1).
One twin for the module, started by the command line as an operator starts it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from console.core import gpuhealth
from console.core.gpus import SamplerState
from console.sources.gpus import open_sampler
from console.sources.hosts import load_hosts
from console.sources.transport import Transport
from tests.support.cli import CLI, operator_env, run_cli

NAME = "amdtwin"


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(the operator's home, the twin's hosts.toml), the twin run by `k26-console twin` until the end."""
    base = tmp_path_factory.mktemp("amd-twin")
    home = base / "home"
    argv = [*CLI, "twin", "--gpu", "mi300x", "--gpu-fault", "thermal", "--name", NAME]
    argv += ["--state-dir", str(base / "state"), "--time-scale", "0.02", "--no-register"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=operator_env(home)
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        while not lines or not lines[-1].startswith("GPU fault:"):
            line = proc.stdout.readline()  # ends when the twin does: a deadline of its own (the start's)
            assert line, (lines, proc.stderr.read() if proc.stderr else "")
            lines.append(line.strip())
        assert lines[-1] == "GPU fault: GPU3 is in thermal slowdown", lines
        yield home, Path(lines[0])
    finally:
        proc.send_signal(2)
        proc.wait(60)


async def test_the_console_reads_the_mi300x_with_amd_smi_processes_and_health(
    twin: tuple[Path, Path],
) -> None:
    _, hosts = twin
    async with Transport(load_hosts(hosts).hosts[NAME], ssh_config=[]) as transport:
        sampler, sample = await open_sampler(transport, interval_s=1.0)
        await sampler.close()
    assert (sampler.backend, sample.state, len(sample.gpus)) == ("amd-smi", SamplerState.OK, 8)
    gpu0, gpu3 = sample.gpus[0], sample.gpus[3]
    assert gpu0.name == "AMD Instinct MI300X OAM" and gpu0.memory_total_mib == 196_592
    (proc,) = gpu0.processes  # the simulated server, by its PID, with what it holds
    assert proc.pid is not None and proc.used_memory_mib == gpu0.memory_used_mib > 0
    assert (gpu0.pcie_gen, gpu0.pcie_width, gpu0.pcie_gen_max, gpu0.pcie_width_max) == (5, 16, 5, 16)
    assert (gpu0.ecc_uncorrected_volatile, gpu0.power_limit_w, gpu0.throttled) == (0, 750, False)
    assert gpu3.throttled is True and gpuhealth.thermal_slowdown(gpu3) is True
    assert all(gpuhealth.faults(g) == () for g in sample.gpus if g.index != 3)


def test_the_fault_it_plays_raises_its_alert_in_snapshot_json(twin: tuple[Path, Path]) -> None:
    home, hosts = twin
    res = run_cli(home, "snapshot", NAME, "--hosts", str(hosts), "--json", "--sample", "1s")
    assert res.returncode == 1, res.stderr
    report = json.loads(res.stdout)
    assert [a["rule"] for a in report["alerts"]] == ["gpu_thermal_slowdown > 0"], report["alerts"]
    assert "GPU3 thermal slowdown at 102 °C (slowdown at 100 °C): throttled" in report["alerts"][0]["message"]
    assert {g["name"] for g in report["gpus"]} == {"AMD Instinct MI300X OAM"}


def test_an_xid_on_an_amd_host_is_one_sentence_and_nothing_is_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.cli import one_sentence, run_main

    state = tmp_path / "state"
    argv = ["twin", "--gpu", "mi300x", "--gpu-fault", "xid79", "--state-dir", str(state), "--no-register"]
    code, _, err = run_main(argv, capsys)
    assert code == 2 and "an AMD host has no XIDs" in one_sentence(err)
    assert not state.exists()
