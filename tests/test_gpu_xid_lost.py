"""Issue 31 items 2-3, what was left: an XID is a typed event on the feed (`gpu_xid`: the GPU, the XID, its
meaning, warn or error styling), once however many samples carry it, in `snapshot --json` and through a
recording; a GPU that stops answering (NVML's GPU is lost, nvidia-smi's `Unable to determine the device
handle`, XID 79) is LOST on its bar, in `snapshot --json`, and a critical alert.

The nvidia-smi lines are verbatim from public reports of GPUs that fell off the bus:
NVIDIA/open-gpu-kernel-modules#387 (`...GPU0000:0B:00.0: Unknown Error`) and JosephKJ/OWOD#81
(`...GPU 0000:02:00.0: GPU is lost. Reboot the system to recover this GPU`)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from console.core import gpuhealth
from console.core.alerts import alert_inputs, default_rules, evaluate
from console.core.events import GpuXid, event_from_json
from console.core.gpus import HostGpuSample, SamplerState
from console.core.hostfold import HostFold
from console.core.snapshot import ConnectionStatus, ConnState, FollowerStatus, HostSnapshot
from console.core.state import HostState
from console.sources.gpu_agent import _nvml_sample
from console.sources.gpus import nvidia_smi_sample
from console.sources.transport import CommandResult
from console.tui.view import gpu_rows
from tests.tui_support import NOW, corpus_events, make_app, plain, snapshot

UNKNOWN_ERROR = "Unable to determine the device handle for GPU0000:0B:00.0: Unknown Error"
GPU_IS_LOST = (
    "Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. "
    "Reboot the system to recover this GPU"
)
ROW = "{i}, NVIDIA H200, GPU-{i}aaa, 37, 41933, 143771"


def _smi(stdout: str, status: int) -> HostGpuSample:
    gpus = CommandResult(argv=("nvidia-smi",), exit_status=status, stdout=stdout, stderr="")
    apps = CommandResult(argv=("nvidia-smi",), exit_status=0, stdout="", stderr="")
    return nvidia_smi_sample(gpus, apps, "h200")


def test_nvidia_smi_names_the_gpu_it_cannot_reach_lost_in_its_place() -> None:
    rows = "\n".join([ROW.format(i=0), UNKNOWN_ERROR, ROW.format(i=2), ROW.format(i=3)]) + "\n"
    sample = _smi(rows, 15)
    assert sample.state is SamplerState.OK and [g.index for g in sample.gpus] == [0, 1, 2, 3]
    gone = sample.gpus[1]
    assert gone.lost is True and gone.memory_used_mib is None and gone.memory_total_mib is None
    assert gone.lost_reason == "nvidia-smi: unable to determine the device handle: Unknown Error"
    assert [gpuhealth.lost(g) for g in sample.gpus] == [False, True, False, False]
    # a host whose one GPU is gone: a sample of one lost GPU, not "nvidia-smi failed"
    (only,) = _smi(GPU_IS_LOST + "\n", 15).gpus
    assert only.index == 0 and only.lost and "GPU is lost. Reboot the system" in (only.lost_reason or "")
    # positive control: a failure that names no GPU stays what it was
    other = _smi("Failed to initialize NVML: Driver/library version mismatch\n", 18)
    assert other.state is SamplerState.NVML_MISSING and other.gpus == ()


class _GpuIsLost(Exception):
    value = 15  # NVML_ERROR_GPU_IS_LOST, as nvidia-ml-py's NVMLError_GpuIsLost carries it


class _Memory:
    total, used, free = 143_771 * 2**20, 0, 143_771 * 2**20


class _Nvml:
    """NVML of a two-GPU host whose GPU 1 fell off the bus: its handle is refused with GPU_IS_LOST."""

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index == 1:
            raise _GpuIsLost("GPU is lost")
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:
        return _Memory()

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA H200"

    def __getattr__(self, name: str) -> Any:
        if not name.startswith(("nvmlDevice", "nvmlSystem")):
            raise AttributeError(name)  # a constant or a v2 it does not have

        def not_supported(*args: object) -> None:
            raise RuntimeError("Not Supported")

        return not_supported


def test_nvml_s_gpu_is_lost_makes_a_lost_gpu_with_its_xid_79() -> None:
    raised = round(time.time() - 2.0, 3)  # two seconds before the sample: within the hour kept
    data = _nvml_sample(_Nvml(), [[1, 79, raised]])
    sample = HostGpuSample.model_validate({**data, "backend": "agent"})
    first, second = sample.gpus
    assert first.lost is None and first.memory_total_mib == 143_771
    assert second.lost is True and second.lost_reason == "NVML: GPU is lost"
    assert [x.xid for x in second.xids] == [79] and second.xids[0].at == raised
    rows = gpu_rows(snapshot([], sample))
    assert rows[1].faults[:2] == (("LOST", "critical"), ("XID 79", "critical"))
    assert rows[1].used_gib is None and rows[1].health is not None and rows[1].health["lost"] is True


def _xid_sample(ts: float, *xids: dict[str, Any], memory: bool = True) -> HostGpuSample:
    gpu3: dict[str, Any] = {"index": 3, "uuid": "GPU-3", "xids": list(xids)}
    if memory:
        gpu3 |= {"memory_used_mib": 1000.0, "memory_total_mib": 143_771.0}
    return HostGpuSample.model_validate(
        {"state": "ok", "backend": "agent", "host": "h200", "ts": ts, "gpus": [{"index": 0}, gpu3]}
    )


def test_each_xid_is_one_typed_event_once_however_many_samples_carry_it() -> None:
    fold = HostFold("h200")
    page_fault = {"xid": 31, "age_s": 0.2, "at": 5_000.0}
    assert [e.xid for e in fold.gpu(_xid_sample(NOW, page_fault))] == [31]  # type: ignore[attr-defined]
    # the next samples carry it again, a little older: not news
    assert fold.gpu(_xid_sample(NOW + 1, page_fault | {"age_s": 1.2})) == []
    assert fold.gpu(_xid_sample(NOW + 2, page_fault | {"age_s": 2.2})) == []
    off_the_bus = {"xid": 79, "age_s": 0.1, "at": 5_002.5}
    (event,) = fold.gpu(_xid_sample(NOW + 3, page_fault | {"age_s": 3.2}, off_the_bus, memory=False))
    assert isinstance(event, GpuXid)
    assert (event.gpu, event.xid, event.severity, event.uuid) == (3, 79, "critical", "GPU-3")
    assert event.message.startswith("GPU3 XID 79: GPU has fallen off the bus")
    assert event.meaning == gpuhealth.XID_MEANINGS[79]
    warn = fold.recent[-2]
    assert isinstance(warn, GpuXid) and warn.severity == "warning" and warn.xid == 31
    assert fold.events_total == 2
    # the same XID again later is another event
    again = {"xid": 79, "age_s": 0.1, "at": 5_010.0}
    assert len(fold.gpu(_xid_sample(NOW + 11, off_the_bus | {"age_s": 8.6}, again, memory=False))) == 1
    # typed through JSON (a recording's seed, `snapshot --json`), and no boot of the journal's
    assert event_from_json(event.model_dump_json()) == event
    assert HostState.empty().apply(event).boots == ()


def test_a_recording_made_before_the_driver_s_time_was_read_makes_the_same_events_once() -> None:
    """Samples without `at` (recorded earlier): an event is known by the sample's time less its age."""
    fold = HostFold("h200")
    assert len(fold.gpu(_xid_sample(NOW, {"xid": 48, "age_s": 0.5}))) == 1
    assert fold.gpu(_xid_sample(NOW + 1.0, {"xid": 48, "age_s": 1.51})) == []  # the same, a tick later
    assert len(fold.gpu(_xid_sample(NOW + 9.0, {"xid": 48, "age_s": 1.0}))) == 0 + 1  # a new one
    checkpoint = fold.checkpoint()
    assert checkpoint.gpu(_xid_sample(NOW + 20.0, {"xid": 94, "age_s": 0.1})) != []
    assert fold.xids.seen.keys() != checkpoint.xids.seen.keys()  # the checkpoint's own watch


def test_a_lost_gpu_is_a_critical_alert_and_is_lost_in_snapshot_json() -> None:
    from console.cli.cmd_snapshot import ServiceReading, report_of
    from console.core.serving import ServingFigures
    from console.sources.alerts import default_alert_config

    fold = HostFold("h200")
    sample = _xid_sample(NOW, {"xid": 79, "age_s": 0.4, "at": 9_000.0}, memory=False)
    fold.gpu(sample)
    snap = fold.snapshot(seq=1, ts=NOW, connection=None, follower=FollowerStatus())
    firing = evaluate(default_rules(), alert_inputs(snap), host="h200", ts=NOW).firing
    assert firing["gpu_lost > 0"].severity == "critical"
    assert (
        "GPU3 lost: it no longer answers its driver (XID 79: fallen off the bus)"
        in firing["gpu_lost > 0"].message
    )
    report = report_of(
        "h200",
        snap,
        ServiceReading(active_state="active", sub_state="running"),
        None,
        ServingFigures(window_s=60.0),
        (None, None),
        default_alert_config(),
        [],
        taken_at=NOW,
    )
    data = json.loads(report.model_dump_json())
    assert data["gpus"][1]["health"]["lost"] is True and data["gpus"][1]["used_gib"] is None
    assert [e["xid"] for e in data["gpu_events"]] == [79] and data["gpu_events"][0]["kind"] == "gpu_xid"
    assert {a["rule"] for a in data["alerts"]} == {"gpu_lost > 0", "gpu_xid > 0"}
    # positive control: the same GPU answering, an XID 79 just read, is not yet lost
    answering = _xid_sample(NOW, {"xid": 79, "age_s": 0.4, "at": 9_000.0})
    assert gpuhealth.lost(answering.gpus[1]) is False


@pytest.mark.timeout(60)
async def test_the_feed_shows_the_xid_as_a_typed_row_and_the_bar_reads_lost() -> None:
    fold = HostFold("gpu1")
    fold.apply(corpus_events("case-31"))
    fold.gpu(_xid_sample(NOW, {"xid": 13, "age_s": 0.3, "at": 1.0}))
    fold.gpu(_xid_sample(NOW + 1, {"xid": 13, "age_s": 1.3, "at": 1.0}, {"xid": 79, "age_s": 0.2, "at": 2.0},
                         memory=False))  # fmt: skip
    snap: HostSnapshot = fold.snapshot(
        seq=2,
        ts=NOW + 1,
        connection=ConnectionStatus(host="gpu1", state=ConnState.UP, since=NOW - 60),
        follower=FollowerStatus(),
    )
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        app.post_snapshot(snap)
        await pilot.pause()
        dash = app.dashboards["gpu1"]
        feed = [line for line in dash.feed.visible_lines() if "gpu_xid" in line]
        panel = plain(dash.gpus.render())
        rows = dash.feed.log_widget.rows
        styles = {e.xid: dash.feed._pieces(e)[2][1] for e in rows if isinstance(e, GpuXid)}
    assert len(feed) == 2, feed
    assert "GPU3 XID 13: graphics engine exception" in feed[0] and "GPU3 XID 79: GPU has fallen" in feed[1]
    bad, warn = (make_app_palette_style("bad"), make_app_palette_style("warn"))
    assert styles == {13: warn, 79: bad}
    gpu3 = next(line for line in panel.splitlines() if line.lstrip().startswith("GPU3"))
    assert "LOST: the driver cannot reach it" in gpu3 and "—/— GiB" in gpu3 and "XID 79" in gpu3
    assert "0.0/" not in gpu3


def make_app_palette_style(role: str) -> object:
    from console.tui.themes import palette

    return palette().style(role, bold=True)


def test_a_recording_replays_the_same_xid_events_and_keeps_them_in_its_seed() -> None:
    """A recording keeps the GPU samples (each XID with the driver's time): folded again, they make the
    same `gpu_xid` events, once; a seed record (a recording begun mid-session) keeps them typed."""
    from console.core.recording import decode, encode

    live = HostFold("h200")
    samples = [
        _xid_sample(NOW, {"xid": 48, "age_s": 0.2, "at": 7_000.0}),
        _xid_sample(NOW + 1, {"xid": 48, "age_s": 1.2, "at": 7_000.0}),
        _xid_sample(
            NOW + 2,
            {"xid": 48, "age_s": 2.2, "at": 7_000.0},
            {"xid": 79, "age_s": 0.1, "at": 7_002.1},
            memory=False,
        ),
    ]
    made = [e for s in samples for e in live.gpu(s)]
    seed = (live.state, tuple(live.recent), live.events_total)
    blob, _ = encode(
        [(NOW + i, "h200", "gpu", s) for i, s in enumerate(samples)] + [(NOW + 3, "h200", "seed", seed)]
    )
    records = decode(blob)
    replayed = HostFold("h200")
    again = [e for r in records if r.kind == "gpu" for e in replayed.gpu(r.payload)]
    assert again == made and [e.xid for e in again] == [48, 79]  # type: ignore[attr-defined]
    (seeded,) = [r.payload for r in records if r.kind == "seed"]
    assert [e for e in seeded[1] if isinstance(e, GpuXid)] == made
