"""Issue 31 on the twin, over SSH as on a real host: its three GPU back-ends (the NVML agent on the twin's
python3, nvidia-smi's loop, and local NVML through the twin's pynvml) agree on memory as nvidia-smi counts
it, for a v2 driver and a v1-only one; each health fault the twin plays (thermal slowdown, power cap, a
degraded PCIe link, ECC errors and row remaps) raises its alert in `snapshot --json` (exit 1) and on the
GPU panel; an XID 79 raised while a console watches reaches it as a critical alert, and the GPU is lost
from then on. The faults `k26-console twin --gpu-fault` plays (thermal, power, xid79, pcie) each raise
their alert in `snapshot --json` and on the dashboard of a console watching (one console for the four)."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from console.core.alerts import alert_inputs, default_rules, evaluate
from console.core.gpus import HostGpuSample, SamplerState
from console.sources.gpus import AgentSampler, NvidiaSmiStreamSampler, NvmlSampler
from console.sources.hosts import HostConfig, load_hosts
from console.sources.session_options import SessionOptions
from console.sources.transport import Transport
from console.tui.host_entry import PairingOptions
from console.tui.view import gpu_rows
from console.twin import gpuhealth
from console.twin.gpuhealth import GpuConditions, write_conditions
from console.twin.host import TwinHost
from console.twin.layout import ROOT_ENV, TwinLayout
from tests.support.cli import run_cli, started_twin, wait_until
from tests.tui_support import plain, snapshot


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwinHost]:
    """A twin whose simulated server holds its eight GPUs (a GPU that holds a server works: P0, boost)."""
    with started_twin(tmp_path_factory.mktemp("gpu-health") / "state", name="twin", time_scale=0.02) as host:
        yield host


@pytest.fixture
def healthy(twin: TwinHost) -> Iterator[TwinHost]:
    write_conditions(twin.layout, GpuConditions())
    try:
        yield twin
    finally:
        write_conditions(twin.layout, GpuConditions())


def _config(twin: TwinHost) -> HostConfig:
    return load_hosts(twin.hosts_toml).hosts[twin.name]


async def _three(twin: TwinHost, monkeypatch: pytest.MonkeyPatch) -> dict[str, HostGpuSample]:
    from console.twin import nvml_library

    monkeypatch.setenv(ROOT_ENV, str(twin.layout.root))
    async with Transport(_config(twin), ssh_config=[]) as transport:
        agent = AgentSampler(transport, interval_s=0.5)
        smi = NvidiaSmiStreamSampler(transport, interval_s=0.5)
        local = NvmlSampler(nvml_library, host="twin")
        try:
            return {
                "agent": await agent.sample(),
                "nvidia-smi": await smi.sample(),
                "nvml": await local.sample(),
            }
        finally:
            for sampler in (agent, smi, local):
                await sampler.close()


@pytest.mark.parametrize("driver", ["v2", "v1"])
async def test_the_twin_s_three_back_ends_agree_on_memory(
    healthy: TwinHost, monkeypatch: pytest.MonkeyPatch, driver: str
) -> None:
    write_conditions(healthy.layout, GpuConditions(driver_memory=driver))  # type: ignore[arg-type]
    samples = await _three(healthy, monkeypatch)
    assert all(s.state is SamplerState.OK and len(s.gpus) == 8 for s in samples.values()), samples
    nvml = samples["nvml"].gpus
    reserved = round(97_887 * gpuhealth.RESERVED_SHARE)  # 419 MiB: the H200's share of the card
    for name, sample in samples.items():
        for gpu, ref in zip(sample.gpus, nvml, strict=True):
            assert gpu.memory_info == driver, (name, gpu.memory_info)
            assert gpu.memory_used_mib is not None and ref.memory_used_mib is not None
            assert abs(gpu.memory_used_mib - ref.memory_used_mib) <= 1.0, (name, gpu.index)
            if driver == "v2":
                assert gpu.memory_reserved_mib == reserved, name
            else:
                assert gpu.memory_reserved_mib is None, name
            # what does not move with the load (utilization, hence temperature and power, does)
            same = ("clock_sm_mhz", "clock_sm_max_mhz", "power_limit_w", "pcie_width", "pstate")
            assert [getattr(gpu, k) for k in same] == [getattr(ref, k) for k in same], name
    held = samples["nvml"].gpus[0]
    print(
        f"\ntwin {driver}: GPU0 used/reserved MiB "
        + ", ".join(
            f"{n} {s.gpus[0].memory_used_mib:,.0f}/{s.gpus[0].memory_reserved_mib}"
            for n, s in samples.items()
        )
        + f"; the server holds {held.processes[0].used_memory_mib if held.processes else 0:,.0f} MiB"
    )


def _snapshot(twin: TwinHost, home: Path) -> tuple[int, dict[str, object]]:
    res = run_cli(home, "snapshot", twin.name, "--hosts", str(twin.hosts_toml), "--json", "--sample", "1s")
    assert res.returncode in (0, 1), res.stderr
    return res.returncode, json.loads(res.stdout)


@pytest.mark.timeout(300)
def test_each_fault_the_twin_plays_raises_its_alert_in_snapshot(healthy: TwinHost, tmp_path: Path) -> None:
    code, report = _snapshot(healthy, tmp_path)
    assert code == 0 and report["alerts"] == [], report["problems"]
    gpus = report["gpus"]
    assert isinstance(gpus, list) and len(gpus) == 8
    first = gpus[0]["health"]
    assert first["pstate"] == 0 and first["faults"] == [] and first["peak_bandwidth_gbs"] == 1792.1

    write_conditions(
        healthy.layout,
        GpuConditions(
            thermal=[3],
            power_cap=[1],
            pcie_degraded=[5],
            ecc_uncorrected={2: 1},
            remap_pending=[2],
            remap_failed=[6],
        ),
    )
    code, report = _snapshot(healthy, tmp_path)
    assert code == 1
    alerts = {a["rule"]: a for a in report["alerts"]}  # type: ignore[union-attr]
    assert set(alerts) == {
        "gpu_thermal_slowdown > 0",
        "gpu_power_capped > 0",
        "gpu_pcie_degraded > 0",
        "gpu_ecc_uncorrected > 0",
        "gpu_remap_pending > 0",
        "gpu_remap_failed > 0",
    }, alerts
    assert (
        "GPU3 thermal slowdown at 92 °C (slowdown at 90 °C)" in alerts["gpu_thermal_slowdown > 0"]["message"]
    )
    assert "GPU1 power capped at 600 of 600 W" in alerts["gpu_power_capped > 0"]["message"]
    assert "GPU5 PCIe link gen 4 x8, below its gen 5 x16" in alerts["gpu_pcie_degraded > 0"]["message"]
    assert alerts["gpu_ecc_uncorrected > 0"]["severity"] == "critical"
    assert alerts["gpu_remap_failed > 0"]["severity"] == "critical"
    tags = {g["index"]: [f["kind"] for f in g["health"]["faults"]] for g in report["gpus"]}  # type: ignore[union-attr]
    assert tags == {0: [], 1: ["power"], 2: ["ecc", "remap_pending"], 3: ["thermal"], 4: [], 5: ["pcie"],
                    6: ["remap_failed"], 7: []}  # fmt: skip

    text = run_cli(tmp_path, "snapshot", healthy.name, "--hosts", str(healthy.hosts_toml), "--sample", "1s")
    assert text.returncode == 1
    assert "GPU3:" in text.stdout and "thermal slowdown at 92 °C" in text.stdout
    assert "alert (critical) gpu_remap_failed > 0" in text.stdout


async def test_an_xid_raised_while_a_console_watches_reaches_it_as_a_critical_alert(
    healthy: TwinHost,
) -> None:
    """NVML hears of an XID only in an event set made before it: the agent's, watching. It comes with the
    next sample, and stays in the samples for the hour; its alert names the GPU and the XID's meaning."""
    async with Transport(_config(healthy), ssh_config=[]) as transport:
        agent = AgentSampler(transport, interval_s=0.5)
        try:
            first = await agent.sample()
            assert first.state is SamplerState.OK and all(g.xids == () for g in first.gpus)
            raised = time.time()
            write_conditions(healthy.layout, gpuhealth.xid_now(gpu=3, xid=79))
            deadline = time.monotonic() + 15
            sample = first
            while not sample.gpus[3].xids:
                assert time.monotonic() < deadline, "no XID reached the console"
                sample = await agent.sample()
            heard = time.time() - raised
            later = await agent.sample()
        finally:
            await agent.close()
    assert [x.xid for x in sample.gpus[3].xids] == [79] and all(not g.xids for g in sample.gpus[:3])
    assert [x.xid for x in later.gpus[3].xids] == [79]  # kept
    firing = evaluate(default_rules(), alert_inputs(snapshot([], sample)), host="twin", ts=1.0).firing
    alert = firing["gpu_xid > 0"]
    assert alert.severity == "critical" and "GPU3 XID 79: GPU has fallen off the bus" in alert.message
    # XID 79: the GPU fell off the bus, and its driver answers for it no more
    assert gpu_rows(snapshot([], sample))[3].faults[:2] == (("LOST", "critical"), ("XID 79", "critical"))
    assert later.gpus[3].lost is True and later.gpus[3].memory_used_mib is None
    assert heard < 5, heard
    print(f"\nXID 79 raised on the twin reached the console in {heard:.2f} s")


def test_host_names_the_peak_bandwidth_s_source_nvml_else_the_table(
    healthy: TwinHost, tmp_path: Path
) -> None:
    """Item 4: the peak from the card's own clocks where the back-end reads them (the agent: NVML), the
    hand-kept table where it cannot (a python3 without nvidia-ml-py: nvidia-smi has no bus width)."""
    res = run_cli(tmp_path, "host", healthy.name, "--hosts", str(healthy.hosts_toml), "--json")
    assert res.returncode == 0, res.stderr
    gpu = json.loads(res.stdout)["facts"]["gpus"][0]
    assert (gpu["peak_bandwidth_gbs"], gpu["peak_from"], gpu["table_peak_gbs"]) == (1792.1, "nvml", 1792.0)
    assert gpu["bandwidth_source"] == "NVML: 2 × max memory clock 14,001 MHz × 512-bit bus / 8"
    text = run_cli(tmp_path, "host", healthy.name, "--hosts", str(healthy.hosts_toml))
    assert (
        "1,792 GB/s (NVML: 2 × max memory clock 14,001 MHz × 512-bit bus / 8; the table: 1,792)"
        in text.stdout
    )
    assert "[NVML (the GPU agent) on twin]" in text.stdout

    module = healthy.layout.nvml_dir / "pynvml.py"
    hidden = module.with_name("pynvml.hidden")
    module.rename(hidden)  # the host's python3 now has no nvidia-ml-py
    try:
        res = run_cli(tmp_path, "host", healthy.name, "--hosts", str(healthy.hosts_toml), "--json")
    finally:
        hidden.rename(module)
    assert res.returncode == 0, res.stderr
    facts = json.loads(res.stdout)["facts"]
    gpu = facts["gpus"][0]
    assert (gpu["peak_bandwidth_gbs"], gpu["peak_from"], gpu["bandwidth_card"]) == (
        1792.0,
        "table",
        "RTX PRO 6000 Blackwell",
    )
    assert facts["gpus_source"] == "nvidia-smi on twin"


# ---- the faults `k26-console twin --gpu-fault` plays (issue 31 item 6, "Done when") ----------------------

PLAYED: dict[str, tuple[set[str], dict[int, str]]] = {
    # fault → (the alerts it raises, GPU → the fault kind its row shows)
    "thermal": ({"gpu_thermal_slowdown > 0"}, {3: "thermal"}),
    "power": ({"gpu_power_capped > 0"}, dict.fromkeys(range(8), "power")),
    "pcie": ({"gpu_pcie_degraded > 0"}, {5: "pcie"}),
    "xid79": ({"gpu_lost > 0"}, {3: "lost"}),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", gpuhealth.GPU_FAULTS)
def test_each_fault_the_twin_command_plays_raises_its_alert_in_snapshot_json(
    healthy: TwinHost, tmp_path: Path, fault: str
) -> None:
    alerts, rows = PLAYED[fault]
    # XID 79 a second from now: mid-reading, or just before it (a one-shot reading hears the event only
    # when its agent was already watching; the lost GPU it always sees)
    write_conditions(healthy.layout, gpuhealth.fault_conditions(fault, after_s=1.0))
    if fault == "xid79":
        assert wait_until(lambda: time.time() > gpuhealth.read_conditions(healthy.layout).xids[0].at, 5)
    code, report = _snapshot(healthy, tmp_path)
    assert code == 1, report["problems"]
    fired = {a["rule"] for a in report["alerts"]}  # type: ignore[union-attr]
    assert alerts <= fired <= alerts | {"gpu_xid > 0"}, fired
    shown = {g["index"]: [f["kind"] for f in g["health"]["faults"]] for g in report["gpus"]}  # type: ignore[union-attr]
    assert {i: kinds[0] for i, kinds in shown.items() if kinds} == rows, shown
    if fault == "xid79":
        gpu3 = report["gpus"][3]  # type: ignore[index]
        assert gpu3["health"]["lost"] is True and gpu3["used_gib"] is None  # not 0 MiB


@pytest.mark.timeout(240)
async def test_each_fault_the_twin_command_plays_raises_its_alert_on_the_dashboard(
    healthy: TwinHost, tmp_path: Path
) -> None:
    """One console watches the twin while it plays each fault in turn: the GPU panel's row shows it, the
    feed says the alert fired, and it clears when the fault ends. XID 79 comes mid-decode, while the
    console's agent watches: a `gpu_xid` row on the feed, and GPU3 LOST where its bar was."""
    from console.sources.alerts import default_alert_config
    from console.sources.profile_store import ProfileStore, shipped_profile_dir
    from console.tui.app import ConsoleApp, HostEntry

    config = _config(healthy)
    entry = HostEntry(
        healthy.name,
        config=config,
        simulated=True,
        session=SessionOptions(gpu_interval_s=0.5, server_interval_s=0.5),
        restart_history_dir=tmp_path / "controller",
        pairing=PairingOptions(heartbeat_s=0.5, poll_s=0.5),
    )
    shipped = shipped_profile_dir()
    assert shipped is not None
    app = ConsoleApp(
        [entry],
        store=ProfileStore([tmp_path / "profiles", shipped]),
        target=200_000,
        alerts=default_alert_config(),
    )

    async def until(pilot: object, what: str, predicate: Callable[[], object], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await pilot.pause(0.1)  # type: ignore[attr-defined]

    async with app.run_test(size=(200, 60)) as pilot:
        dash = app.dashboards[healthy.name]

        def row(index: int) -> str:
            panel = plain(dash.gpus.render(), width=200)
            return next((ln for ln in panel.splitlines() if ln.lstrip().startswith(f"GPU{index} ")), "")

        def fed(text: str) -> bool:
            return any(text in line for line in dash.feed.visible_lines())

        await until(pilot, "the GPUs", lambda: row(7) and "—" not in row(0).split("GiB")[0])
        for fault in gpuhealth.GPU_FAULTS:
            await play(pilot, healthy.layout, fault, row, fed, until)


def _severity(rule: str) -> str:
    return "critical" if rule.startswith("gpu_lost") else "warning"


async def play(
    pilot: object,
    layout: TwinLayout,
    fault: str,
    row: Callable[[int], str],
    fed: Callable[[str], bool],
    until: Callable[..., Awaitable[None]],
) -> None:
    """One fault, start to end, on a console watching: its rows' tags and its alerts, then cleared."""
    tags = {"thermal": "THERMAL", "power": "PWR CAP", "pcie": "PCIe x8", "lost": "LOST"}
    alerts, rows = PLAYED[fault]
    write_conditions(layout, gpuhealth.fault_conditions(fault, after_s=1.0))
    for index, kind in rows.items():
        await until(pilot, f"{fault}: GPU{index} {tags[kind]}", lambda i=index, k=kind: tags[k] in row(i))
    for rule in alerts:
        await until(pilot, f"{fault}: the alert {rule}", lambda r=rule: fed(f"ALERT ({_severity(r)}) {r}: "))
    others = [i for i in range(8) if i not in rows]
    assert not any(tag in row(i) for i in others for tag in tags.values()), fault
    if fault == "xid79":
        await until(pilot, "the gpu_xid row", lambda: fed("GPU3 XID 79: GPU has fallen off the bus"))
        assert "LOST: the driver cannot reach it" in row(3) and "—/" in row(3), row(3)
        await until(pilot, "the XID alert", lambda: fed("ALERT (critical) gpu_xid > 0"))
    write_conditions(layout, GpuConditions())
    for rule in alerts:
        await until(
            pilot, f"{fault}: {rule} cleared", lambda r=rule: fed(f"alert cleared ({_severity(r)}) {r}: ")
        )
    await until(
        pilot,
        f"{fault}: the rows clear",
        lambda: not any(tags[k] in row(i) for i, k in rows.items()),
    )
