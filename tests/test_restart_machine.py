"""The restart state machine: phases from controller steps and journal events, timings, ETA."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.core.events import (
    CudaGraph,
    DistInit,
    Error,
    KvPoolAllocated,
    MemoryPoolEnd,
    PoolSummary,
    ServerArgs,
    ServerReady,
    Unit,
    WeightsBegin,
    WeightsLoaded,
)
from console.core.parser import parse_text
from console.core.restart import Phase, RestartError, RestartMachine, median_durations

STEPS_OK = [Phase.VALIDATE, Phase.DIFF, Phase.WRITE_DROPIN, Phase.DAEMON_RELOAD]


def started(t0: float = 0.0, history=()) -> RestartMachine:
    m = RestartMachine("ctx-200k", now=t0, host="gpu-01", history=history)
    t = t0
    for phase in STEPS_OK:
        t += 1
        m.step_done(phase, t)
    return m


def boot_events():
    """Order A (≤ 0.5.13): target weights → pool → graphs, then the EAGLE draft does the same."""
    return [
        (10, Unit(state="stopping", message="Stopping sglang.service")),
        (20, Unit(state="started", message="Started sglang.service")),
        (21, ServerArgs(args={"mem_fraction_static": 0.93})),
        (25, DistInit(phase="begin")),
        (30, WeightsBegin(tp_rank=0, avail_mem_gb=85.3)),
        (200, WeightsLoaded(tp_rank=0, mem_usage_gb=65.9)),
        (201, KvPoolAllocated(tp_rank=0, tokens=205_444, kv_size_gb=13.45)),
        (202, MemoryPoolEnd(tp_rank=0, avail_mem_gb=5.1)),
        (203, CudaGraph(phase="begin", tp_rank=0)),
        (240, CudaGraph(phase="end", tp_rank=0)),
        (241, WeightsBegin(tp_rank=0)),  # draft
        (250, KvPoolAllocated(tp_rank=0, tokens=205_444, k_size_gb=0.3, v_size_gb=0.3)),
        (251, CudaGraph(phase="begin", tp_rank=0, graph="draft")),
        (270, PoolSummary(max_total_num_tokens=205_444, available_gpu_mem_gb=4.9, context_len=200_000)),
        (275, ServerReady()),
    ]


def test_a_verified_restart_records_every_phase() -> None:
    m = started()
    assert m.phase == Phase.RESTART
    m.step_done(Phase.RESTART, 5)
    assert m.phase == Phase.STOPPING
    seen = []
    for t, ev in boot_events():
        seen.append(m.feed(ev, t))
    assert seen[:7] == [
        Phase.STOPPING,
        Phase.LAUNCHING,
        Phase.LAUNCHING,
        Phase.LAUNCHING,
        Phase.LOADING_WEIGHTS,
        Phase.LOADING_WEIGHTS,
        Phase.KV_POOL,
    ]
    assert m.phase == Phase.READY
    assert m.pool_tokens == 205_444 and m.available_gpu_mem_gb == 4.9
    m.begin_verify(280)
    m.step_done(Phase.VERIFY, 282)
    m.step_done(Phase.RECORD, 283)
    assert m.finished and m.outcome == "verified"
    rec = m.record()
    d = rec.durations
    assert d[Phase.STOPPING] == 15 and d[Phase.LAUNCHING] == 10  # stopping runs from `systemctl restart`
    assert d[Phase.LOADING_WEIGHTS] == (201 - 30) + (250 - 241)  # target + draft weights add up
    assert d[Phase.KV_POOL] == (203 - 201) + (251 - 250)
    assert d[Phase.CUDA_GRAPHS] == (241 - 203) + (275 - 251)
    assert d[Phase.READY] == 5 and d[Phase.VERIFY] == 2 and d[Phase.RECORD] == 1
    assert rec.ended == 283 and rec.started == 0
    assert all(s.end is not None for s in rec.spans)
    assert [s.phase for s in rec.spans][-1] == Phase.DONE


def test_oom_after_launch_fails_but_old_process_noise_does_not() -> None:
    m = started()
    m.step_done(Phase.RESTART, 5)
    m.feed(Error(category="sigquit", message="old server got SIGQUIT"), 6)  # the old process dying
    assert m.phase == Phase.STOPPING
    m.feed(Unit(state="started"), 7)
    m.feed(WeightsBegin(), 8)
    m.feed(Error(category="other", message="a warning"), 9)
    assert m.phase == Phase.LOADING_WEIGHTS
    m.feed(Error(category="cuda_oom", message="CUDA out of memory. Tried to allocate 2.00 GiB"), 10)
    assert m.phase == Phase.FAILED
    assert m.reason and m.reason.startswith("cuda_oom")
    m.feed(ServerReady(), 11)  # nothing moves a failed boot
    assert m.phase == Phase.FAILED
    with pytest.raises(RestartError):
        m.begin_verify(12)
    m.finish_failed(12)
    assert m.outcome == "failed" and m.record().outcome == "failed"


@pytest.mark.parametrize(
    "event",
    [Unit(state="failed", result="exit-code"), Unit(state="stopped")],
)
def test_unit_failing_or_stopping_after_launch_fails(event: Unit) -> None:
    m = started()
    m.step_done(Phase.RESTART, 5)
    m.feed(Unit(state="started"), 6)
    m.feed(event, 7)
    assert m.phase == Phase.FAILED


def test_events_before_restart_and_repeats_are_ignored() -> None:
    m = RestartMachine("p", now=0)
    m.feed(ServerReady(), 0.5)  # the old server, before we touched anything
    assert m.phase == Phase.VALIDATE
    m.step_done(Phase.VALIDATE, 1)
    m.step_done(Phase.DIFF, 2)
    m.step_done(Phase.WRITE_DROPIN, 3)
    m.step_done(Phase.DAEMON_RELOAD, 4)
    # the journal gets there before `systemctl restart` returns (and the follower replays after a drop)
    m.feed(Unit(state="stopping", cursor="c1"), 5)
    m.feed(Unit(state="started", cursor="c2"), 6)
    m.feed(WeightsBegin(cursor="c3"), 7)
    m.feed(Unit(state="stopping", cursor="c1"), 8)
    m.feed(Unit(state="started", cursor="c2"), 8)
    assert m.phase == Phase.LOADING_WEIGHTS
    m.step_done(Phase.RESTART, 9)  # late report: no effect
    assert m.phase == Phase.LOADING_WEIGHTS
    assert [s.phase for s in m.spans][-3:] == [Phase.STOPPING, Phase.LAUNCHING, Phase.LOADING_WEIGHTS]


def test_controller_outcomes() -> None:
    refused = RestartMachine("p", now=0)
    refused.step_done(Phase.VALIDATE, 1, ok=False, reason="--foo is not an SGLang flag")
    assert refused.outcome == "refused" and refused.reason == "--foo is not an SGLang flag"
    same = RestartMachine("p", now=0)
    same.step_done(Phase.VALIDATE, 1)
    same.step_done(Phase.DIFF, 2, ok=False)
    assert same.outcome == "unchanged"
    sudo = RestartMachine("p", now=0)
    sudo.step_done(Phase.VALIDATE, 1)
    sudo.step_done(Phase.DIFF, 2)
    sudo.step_done(Phase.WRITE_DROPIN, 3, ok=False, reason="sudo needs a password")
    assert sudo.outcome == "failed" and sudo.reason == "sudo needs a password"
    m = started()
    with pytest.raises(RestartError):
        m.step_done(Phase.VERIFY, 9)
    with pytest.raises(RestartError):
        m.step_done(Phase.LOADING_WEIGHTS, 9)
    m.step_done(Phase.RESTART, 5)
    m.feed(Unit(state="started"), 6)
    m.feed(ServerReady(), 7)
    m.begin_verify(8)
    m.step_done(Phase.VERIFY, 9, ok=False, reason="pool 190,000 < 200,000")
    m.step_done(Phase.RECORD, 10)
    assert m.outcome == "not_verified" and m.reason == "pool 190,000 < 200,000"


def test_timeout_fails_a_hung_boot() -> None:
    m = started()
    m.step_done(Phase.RESTART, 5)
    m.feed(Unit(state="started"), 6)
    m.timed_out(900, "no progress for 10 minutes")
    assert m.phase == Phase.FAILED and m.reason == "no progress for 10 minutes"


def test_eta_from_history() -> None:
    history = [
        {"stopping": 10, "launching": 10, "loading_weights": 180, "kv_pool": 3, "cuda_graphs": 60},
        {"stopping": 12, "launching": 8, "loading_weights": 200, "kv_pool": 3, "cuda_graphs": 40},
        {"stopping": 14, "launching": 12, "loading_weights": 220, "kv_pool": 3, "cuda_graphs": 50},
    ]
    assert median_durations(history)[Phase.LOADING_WEIGHTS] == 200
    m = started(history=history)
    assert m.eta(4) == pytest.approx(12 + 10 + 200 + 3 + 50)  # restart has no history: 0
    m.step_done(Phase.RESTART, 5)
    assert m.eta(5) == pytest.approx(12 + 10 + 200 + 3 + 50)
    m.feed(Unit(state="started"), 15)
    m.feed(WeightsBegin(), 25)
    assert m.eta(125) == pytest.approx(100 + 3 + 50)
    assert m.eta(400) == pytest.approx(3 + 50)  # overran: the current phase counts 0, never negative
    m.feed(ServerReady(), 401)
    assert m.eta(402) is None
    assert started().eta(10) is None  # no history, no estimate


def test_clock_stepping_back_never_gives_negative_durations() -> None:
    m = started(t0=100)
    m.step_done(Phase.RESTART, 50)
    assert all(v >= 0 for v in m.durations(40).values())


def test_the_replaced_invocation_ending_in_failure_does_not_fail_the_new_boot() -> None:
    """Seen on a real systemd: restarting a unit that is still starting (in its start-post wait) ends the
    old invocation with "Failed with result 'signal'". That is the old boot going away; the new one (its
    own invocation id) still decides the outcome."""
    old, new = "a" * 32, "b" * 32
    m = started()
    m.replaced_invocation = old
    m.step_done(Phase.RESTART, 5)
    m.feed(Unit(state="stopping", message="Stopping sglang.service", invocation_id=old), 6)
    assert m.phase == Phase.STOPPING
    m.feed(Error(category="traceback", message="KeyboardInterrupt", invocation_id=old), 6.5)
    m.feed(
        Unit(state="failed", result="signal", message="Failed with result 'signal'.", invocation_id=old), 7
    )
    assert m.phase == Phase.STOPPING and m.errors == []
    for t, event in boot_events()[1:]:
        m.feed(event.model_copy(update={"invocation_id": new}), t)
    assert m.phase == Phase.READY
    # The new invocation failing is still a failure.
    m2 = started()
    m2.replaced_invocation = old
    m2.step_done(Phase.RESTART, 5)
    m2.feed(Unit(state="started", message="Started sglang.service", invocation_id=new), 6)
    m2.feed(
        Unit(state="failed", result="signal", message="Failed with result 'signal'.", invocation_id=new), 7
    )
    assert m2.phase == Phase.FAILED


# ------------------------------------------------------------------ the pools of newer models (issue 32)

POOLS = Path(__file__).parent / "data" / "public-pools"


def booted_on(lines: str) -> RestartMachine:
    """A machine past `systemctl restart`, fed the parsed lines of a real public boot, one a second."""
    m = started()
    m.step_done(Phase.RESTART, 5)
    m.feed(Unit(state="started", message="Started sglang.service"), 6)
    for i, event in enumerate(parse_text(lines)):
        m.feed(event, 10 + i)
    return m


def test_deepseek_v4_pool_lines_are_the_kv_pool_phase_and_name_the_context_pool() -> None:
    # sglang#25118 (DeepSeek-V4-Flash, MI300X): weights lines, then only `DSv4 memory calculation` and
    # `Initialize DeepSeekV4TokenToKVPool` lines, no `KV Cache is allocated`
    text = (POOLS / "dsv4-flash-mi300x-tp4dp4.log").read_text()
    m = booted_on(text)
    assert m.phase == Phase.KV_POOL and m.pool_tokens == 529_408
    # positive control: the same boot cut before its pool lines is still loading weights
    weights_only = "".join(
        line
        for line in text.splitlines(keepends=True)
        if "DSv4" not in line and "DeepSeekV4TokenToKVPool" not in line
    )
    cut = booted_on(weights_only)
    assert cut.phase == Phase.LOADING_WEIGHTS and cut.pool_tokens is None


def test_sliding_window_and_mamba_pool_lines_are_the_kv_pool_phase() -> None:
    # MiMo-V2-Flash (sglang#18039): the split line names the full pool; the KV lines after it are the
    # sliding-window pool's (300,288 tokens), not the context pool
    swa = (POOLS / "swa-lines.log").read_text().splitlines(keepends=True)
    m = booted_on("".join(swa[:6]))
    assert m.phase == Phase.KV_POOL and m.pool_tokens == 375_360
    # Gemma 4 on a GB10: only the `SWAKVPool mem usage` line
    gemma = booted_on(swa[6])
    assert gemma.phase == Phase.KV_POOL and gemma.pool_tokens == 213_761
    # Qwen3.5 hybrid (ktransformers#1870): the mamba line opens the phase, the KV line gives the pool
    hybrid = (POOLS / "qwen35-397b-hybrid-tp2.log").read_text().splitlines(keepends=True)
    mamba_only = "".join(line for line in hybrid[:8] if "KV Cache" not in line)
    assert "Mamba Cache" in mamba_only and booted_on(mamba_only).phase == Phase.KV_POOL
    whole = booted_on("".join(hybrid))
    assert whole.pool_tokens == 580_364
