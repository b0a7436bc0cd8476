"""Issue 31 item 3: the faults an operator must see first, from a GPU sample's health fields: throttling
and why, a power cap, a degraded PCIe link, ECC errors, row remaps and XIDs, each a default alert that
says which GPU and why, and a tag on the GPU panel. The healthy baseline is the real H200 of
tests/data/real-gpu-h200 (idle: its reasons 0x1, P0, PCIe gen 5 x16, no ECC error): nothing fires."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from console.core import gpuhealth
from console.core.alerts import Severity, alert_inputs, default_rules, evaluate
from console.core.gpus import GpuSample, HostGpuSample, SamplerState, XidEvent
from console.tui.view import gpu_rows
from tests.tui_support import corpus_events, make_app, plain, snapshot

F: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parent / "data" / "real-gpu-h200" / "samples.json").read_text()
)["nvml_fields"]
MIB_H200 = 143_771.0

# The H200 as its NVML answered, idle (the agent's field names).
H200_IDLE: dict[str, Any] = {
    "name": F["name"],
    "uuid": F["uuid"],
    "utilization_pct": 0.0,
    "memory_used_mib": 0.0,
    "memory_reserved_mib": 615.0625,
    "memory_total_mib": MIB_H200,
    "memory_info": "v2",
    "temperature_c": F["temp_gpu_c"],
    "temperature_slowdown_c": F["temp_thresholds_slowdown"],
    "temperature_shutdown_c": F["temp_thresholds_shutdown"],
    "power_w": F["power_mw"] / 1000,
    "power_limit_w": F["power_limit_mw"] / 1000,
    "clock_sm_mhz": F["clock_sm_mhz"],
    "clock_sm_max_mhz": F["max_clock_sm_mhz"],
    "clock_mem_mhz": F["clock_mem_mhz"],
    "clock_mem_max_mhz": F["max_clock_mem_mhz"],
    "clock_event_reasons": F["clock_event_reasons"],
    "pstate": F["perf_state"],
    "ecc_enabled": bool(F["ecc_mode"][0]),
    "ecc_corrected_volatile": F["ecc_corrected_volatile"],
    "ecc_uncorrected_volatile": F["ecc_uncorrected_volatile"],
    "remapped_rows_correctable": F["remapped_rows"][0],
    "remapped_rows_uncorrectable": F["remapped_rows"][1],
    "remap_pending": bool(F["remapped_rows"][2]),
    "remap_failed": bool(F["remapped_rows"][3]),
    "pcie_gen": F["pcie_gen"],
    "pcie_gen_max": F["pcie_max_gen"],
    "pcie_width": F["pcie_width"],
    "pcie_width_max": 16,
    "memory_bus_width_bits": F["mem_bus_width_bits"],
}
# The same card decoding: busy, at its boost clock, no reason held.
H200_BUSY = H200_IDLE | {
    "utilization_pct": 100.0,
    "clock_event_reasons": 0,
    "clock_sm_mhz": 1980,
    "power_w": 512.0,
}


def _sample(*gpus: dict[str, Any], backend: str = "agent") -> HostGpuSample:
    return HostGpuSample.model_validate(
        {"state": "ok", "backend": backend, "gpus": [g | {"index": i} for i, g in enumerate(gpus)]}
    )


def _fired(sample: HostGpuSample) -> dict[str, tuple[Severity, str]]:
    snap = snapshot([], sample)
    firing = evaluate(default_rules(), alert_inputs(snap), host="h200", ts=1.0).firing
    return {rule: (a.severity, a.message) for rule, a in firing.items()}


def test_the_real_h200_idle_and_decoding_raises_nothing() -> None:
    assert _fired(_sample(H200_IDLE, H200_BUSY)) == {}
    assert gpuhealth.reasons(H200_IDLE["clock_event_reasons"]) == ("idle",)


@pytest.mark.parametrize(
    ("fault", "rule", "severity", "says"),
    [
        (
            {"clock_event_reasons": 0x68, "temperature_c": 91, "clock_sm_mhz": 1188},
            "gpu_thermal_slowdown > 0",
            Severity.WARNING,
            "GPU1 thermal slowdown at 91 °C (slowdown at 89 °C): HW slowdown, SW thermal slowdown, "
            "HW thermal slowdown, SM clock 1188 of 1980 MHz",
        ),
        (
            {"clock_event_reasons": 0x4, "power_w": 700.0, "clock_sm_mhz": 1584},
            "gpu_power_capped > 0",
            Severity.WARNING,
            "GPU1 power capped at 700 of 700 W: power cap, SM clock 1584 of 1980 MHz",
        ),
        (
            {"pcie_width": 8},
            "gpu_pcie_degraded > 0",
            Severity.WARNING,
            "GPU1 PCIe link gen 5 x8, below its gen 5 x16",
        ),
        (
            {"ecc_uncorrected_volatile": 2},
            "gpu_ecc_uncorrected > 0",
            Severity.CRITICAL,
            "GPU1 2 uncorrectable ECC error(s) since the driver loaded",
        ),
        ({"remap_pending": True}, "gpu_remap_pending > 0", Severity.WARNING, "GPU1 a memory row remap waits"),
        ({"remap_failed": True}, "gpu_remap_failed > 0", Severity.CRITICAL, "GPU1 a memory row could not"),
        (
            {"xids": [{"xid": 79, "age_s": 4.0}]},
            "gpu_xid > 0",
            Severity.CRITICAL,
            "GPU1 XID 79: GPU has fallen off the bus",
        ),
    ],
)
def test_each_fault_fires_its_default_alert_naming_the_gpu_and_why(
    fault: dict[str, Any], rule: str, severity: Severity, says: str
) -> None:
    fired = _fired(_sample(H200_BUSY, H200_BUSY | fault))
    assert list(fired) == [rule], fired
    got_severity, message = fired[rule]
    assert got_severity is severity
    assert says in message, message


def test_an_idle_gpu_s_power_saving_is_not_a_fault() -> None:
    """A slowdown reason or a low link generation on an idle GPU is power saving (the H200 idles at P0 gen
    5, many PCIe cards drop to gen 1): the rules fire while a GPU works, fewer lanes at any time."""
    idle_slow = H200_IDLE | {"clock_event_reasons": 0x1 | 0x20 | 0x4, "pcie_gen": 1}
    assert _fired(_sample(idle_slow)) == {}
    busy_gen1 = H200_BUSY | {"pcie_gen": 1}
    assert list(_fired(_sample(busy_gen1))) == ["gpu_pcie_degraded > 0"]
    idle_x8 = H200_IDLE | {"pcie_width": 8}
    assert list(_fired(_sample(idle_x8))) == ["gpu_pcie_degraded > 0"]


def test_what_a_back_end_did_not_read_never_fires_nor_counts_as_zero() -> None:
    """nvidia-smi watches no XID; a consumer card has no ECC: the figure is absent, and its rule neither
    fires nor clears (an alert firing stays firing)."""
    bare = {"name": "NVIDIA GeForce RTX 4090", "memory_used_mib": 100.0, "memory_total_mib": 24_564.0}
    sample = _sample(bare, backend="nvidia-smi")
    inputs = alert_inputs(snapshot([], sample))
    for name in ("gpu_xid", "gpu_ecc_uncorrected", "gpu_thermal_slowdown", "gpu_pcie_degraded", "gpu_temp_c"):
        assert name not in inputs.figures, name
    xid = {"xids": [{"xid": 79, "age_s": 1.0}]}
    before = evaluate(default_rules(), alert_inputs(snapshot([], _sample(H200_BUSY | xid))), host="h", ts=1)
    assert "gpu_xid > 0" in before.firing
    after = evaluate(default_rules(), inputs, before.firing, host="h", ts=2)
    assert "gpu_xid > 0" in after.firing and after.transitions == ()


def test_xid_meanings_and_a_sample_s_xids_are_bounded() -> None:
    assert gpuhealth.xid_words(79).startswith("XID 79: GPU has fallen off the bus")
    assert gpuhealth.xid_words(48).startswith("XID 48: double-bit ECC error")
    assert gpuhealth.xid_words(1234) == "XID 1234 (see NVIDIA's XID catalogue)"
    for xid in (13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119):  # the common ones
        assert xid in gpuhealth.XID_MEANINGS
    many = [{"xid": 13, "age_s": float(i)} for i in range(40)] + [{"xid": "x"}, {"xid": -1}]
    gpu = GpuSample.model_validate({"xids": many})
    assert len(gpu.xids) == 16 and all(isinstance(x, XidEvent) for x in gpu.xids)


def test_health_values_out_of_range_are_refused_not_drawn() -> None:
    gpu = GpuSample.model_validate(
        {"temperature_c": float("nan"), "power_w": -5, "pstate": 32, "pcie_width": 0, "ecc_enabled": "maybe"}
    )
    assert (gpu.temperature_c, gpu.power_w, gpu.pstate, gpu.pcie_width, gpu.ecc_enabled) == (None,) * 5
    assert len(gpu.refused) == 5
    hexed = GpuSample.model_validate({"clock_event_reasons": "0x0000000000000068", "remap_pending": "Yes"})
    assert hexed.clock_event_reasons == 0x68 and hexed.remap_pending is True


async def test_the_gpu_panel_shows_the_reservation_the_health_and_the_faults() -> None:
    thermal = H200_BUSY | {"clock_event_reasons": 0x68, "temperature_c": 91}
    xid = H200_BUSY | {"xids": [{"xid": 79, "age_s": 3.0}], "pcie_width": 8}
    sample = _sample(H200_BUSY | {"memory_used_mib": 41_932.8125}, thermal, xid)
    events = corpus_events("case-31")
    rows = gpu_rows(snapshot(events, sample))
    assert rows[0].reserved_gib == pytest.approx(615.0625 / 1024)
    assert rows[0].health is not None and rows[0].health["peak_bandwidth_gbs"] == 4814.3
    assert rows[1].faults == (("THERMAL", "warning"),)
    assert rows[2].faults == (("XID 79", "critical"), ("PCIe x8", "warning"))
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        app.post_snapshot(snapshot(events, sample))
        await pilot.pause()
        text = plain(app.dashboards["gpu1"].gpus.render())
    lines = [line for line in text.splitlines() if line.lstrip().startswith("GPU")]
    assert "driver reserved" in text
    assert "91° 512W THERMAL" in lines[1], lines
    assert lines[2].rstrip().endswith("XID 79 PCIe x8"), lines
    assert "THERMAL" not in lines[0] and "XID" not in lines[0]
    assert "41.0/140.4 GiB" in lines[0]  # used without the driver's 0.6 GiB (v1 said 41.6), as nvidia-smi


def test_snapshot_json_carries_the_reservation_and_the_health() -> None:
    from console.cli.cmd_snapshot import ServiceReading, report_of
    from console.core.serving import ServingFigures
    from console.sources.alerts import default_alert_config

    xid = H200_BUSY | {"xids": [{"xid": 79, "age_s": 3.0}]}
    snap = snapshot([], _sample(H200_IDLE, xid))
    report = report_of(
        "h200",
        snap,
        ServiceReading(active_state="active", sub_state="running"),
        None,
        ServingFigures(window_s=60.0),
        (None, None),
        default_alert_config(),
        [],
        taken_at=1.0,
    )
    data = json.loads(report.model_dump_json())
    gpu0, gpu1 = data["gpus"]
    assert (gpu0["reserved_gib"], gpu0["memory_info"]) == (pytest.approx(0.6006, abs=1e-3), "v2")
    assert gpu0["health"]["temperature_slowdown_c"] == 89 and gpu0["health"]["faults"] == []
    assert gpu0["health"]["clock_event_reasons_words"] == ["idle"]
    assert gpu1["health"]["xids"][0]["meaning"].startswith("GPU has fallen off the bus")
    assert [a["rule"] for a in data["alerts"]] == ["gpu_xid > 0"]
    assert data["alerts"][0]["severity"] == "critical"
    assert "GPU1 XID 79" in data["problems"][0]
    assert SamplerState.OK.value == data["gpu_state"]


def test_a_recording_keeps_each_gpu_s_health() -> None:
    """A recording stores each `HostGpuSample` as its JSON: read back, the health is the same, the
    XIDs' ages included."""
    from console.core.recording import decode, encode

    sample = _sample(
        H200_IDLE, H200_BUSY | {"xids": [{"xid": 79, "age_s": 3.5}], "clock_event_reasons": 0x68}
    )
    blob, _ = encode([(1_780_000_000.0, "h200", "gpu", sample)])
    (record,) = decode(blob)
    again = record.payload
    assert again == sample and again.gpus[1].xids[0].xid == 79
    assert gpuhealth.thermal_slowdown(again.gpus[1]) is True


def test_export_serves_each_gpu_s_health_and_faults() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from console.core.export import host_figures
    from console.sources.exporter import ExportCollector
    from tests.test_export import Named, promtool_check, samples

    xid = H200_BUSY | {"xids": [{"xid": 79, "age_s": 3.0}], "clock_event_reasons": 0x4, "power_w": 700.0}
    bare = {"memory_used_mib": 10.0, "memory_total_mib": 24_564.0, "utilization_pct": 0.0}  # no health read
    figures = host_figures(snapshot([], _sample(H200_IDLE, xid, bare)), None, unit="sglang.service")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExportCollector([Named("h200", figures)]))
    text = generate_latest(registry).decode()
    promtool_check(text)
    got = samples(text)

    def by_gpu(name: str) -> dict[str, float]:
        return {labels["gpu"]: value for labels, value in got.get(name, [])}

    assert by_gpu("k26_gpu_memory_reserved_bytes") == {"0": 615.0625 * 2**20, "1": 615.0625 * 2**20}
    assert by_gpu("k26_gpu_temperature_celsius") == {"0": 33.0, "1": 33.0}
    assert by_gpu("k26_gpu_power_watts") == {"0": 79.399, "1": 700.0}
    assert by_gpu("k26_gpu_clock_event_reasons") == {"0": 1.0, "1": 4.0}
    assert by_gpu("k26_gpu_xid_events") == {"0": 0.0, "1": 1.0, "2": 0.0}  # the agent watches every GPU
    faults = {(lab["gpu"], lab["kind"]): v for lab, v in got["k26_gpu_fault"]}
    assert faults[("1", "xid")] == faults[("1", "power")] == 1.0
    assert faults[("0", "xid")] == faults[("0", "thermal")] == faults[("1", "ecc")] == 0.0
    # a reading without health judges nothing but XIDs (the agent watched) and whether it answers at all
    assert [kind for gpu, kind in faults if gpu == "2"] == ["lost", "xid"]
    smi = host_figures(snapshot([], _sample(H200_IDLE, backend="nvidia-smi")), None, unit="sglang.service")
    assert "k26_gpu_xid_events" not in smi.gpu_health["0"] and "xid" not in smi.gpu_faults["0"]
    assert smi.gpu_faults["0"]["thermal"] is False
    # A GPU its driver cannot reach is a fault of its own, on every back-end (issue 31: LOST on the bar).
    assert faults[("0", "lost")] == faults[("1", "lost")] == 0.0 and smi.gpu_faults["0"]["lost"] is False
    gone = host_figures(
        snapshot([], _sample(H200_IDLE, {"lost": True, "lost_reason": "GPU_IS_LOST"}, backend="nvidia-smi")),
        None,
        unit="sglang.service",
    )
    assert gone.gpu_faults["1"]["lost"] is True and gone.gpu_faults["0"]["lost"] is False


def test_a_bare_throttle_flag_names_one_cause_heat_before_the_power_cap() -> None:
    """amd-smi gives one throttle flag, no reasons: a GPU throttled past its slowdown temperature while it
    draws near its cap is in thermal slowdown, not also power capped (the AMD twin's thermal fault read
    as both whenever its watts crossed 95% of the cap)."""
    base: dict[str, Any] = dict(
        index=3,
        name="AMD Instinct MI300X OAM",
        memory_used_mib=1,
        memory_total_mib=196_592,
        utilization_pct=97,
        throttled=True,
        temperature_slowdown_c=100,
        power_limit_w=750,
    )
    hot_at_cap = GpuSample(**base, temperature_c=102, power_w=740)
    assert gpuhealth.thermal_slowdown(hot_at_cap) is True and gpuhealth.power_capped(hot_at_cap) is False
    cool_at_cap = GpuSample(**base, temperature_c=70, power_w=740)
    assert gpuhealth.thermal_slowdown(cool_at_cap) is False and gpuhealth.power_capped(cool_at_cap) is True
    cool_under_cap = GpuSample(**base, temperature_c=70, power_w=400)
    assert gpuhealth.power_capped(cool_under_cap) is False
