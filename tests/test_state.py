"""Folding events into boots: boundaries, pool, readiness, errors, and the memory around the weights."""

from __future__ import annotations

import json
from pathlib import Path

from console.core.events import Error, KvPoolAllocated, Log, MemoryPoolEnd, PoolSummary, Unit, WeightsBegin
from console.core.parser import parse_lines, parse_text
from console.core.state import Boot, HostState, fold_boots, rank_key


def boots_of(text: str) -> list[Boot]:
    return fold_boots(parse_text(text))


def line(pid: int, rank: str | None, msg: str, clock: str = "22:00:00") -> str:
    tag = f" {rank}" if rank else ""
    return f"May 30 {clock} gpu1 python[{pid}]: [2026-05-30 {clock}{tag}] {msg}"


def raw(pid: int, text: str, clock: str = "22:00:00") -> str:
    return f"May 30 {clock} gpu1 python[{pid}]: {text}"


def systemd(msg: str, clock: str = "22:00:00") -> str:
    return f"May 30 {clock} gpu1 systemd[1]: {msg}"


SERVER_ARGS = "server_args=ServerArgs(model_path='moonshotai/Kimi-K2.6', tp_size=2, mem_fraction_static=0.85, context_length=200000)"


def startup(base_pid: int, tokens: int, f_avail: float = 4.2) -> list[str]:
    """A two-rank SGLang startup, as ≤ v0.5.13 prints it (target, then draft weights and pool)."""
    out = [line(base_pid, None, SERVER_ARGS)]
    for r in (0, 1):
        out.append(
            line(base_pid + 1 + r, f"TP{r}", f"Load weight begin. avail mem={85.40 - r * 0.07:.2f} GB")
        )
    for r in (0, 1):
        out.append(
            line(
                base_pid + 1 + r,
                f"TP{r}",
                f"Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem={19.50 - r * 0.08:.2f} GB, mem usage=65.90 GB.",
            )
        )
        out.append(
            line(base_pid + 1 + r, f"TP{r}", f"KV Cache is allocated. #tokens: {tokens}, KV size: 6.62 GB")
        )
        out.append(line(base_pid + 1 + r, f"TP{r}", "Memory pool end. avail mem=12.80 GB"))
        # the draft worker loads its own weights after the target's pool: not `post`
        out.append(
            line(
                base_pid + 1 + r,
                f"TP{r}",
                "Load weight end. type=LlamaForCausalLMEagle3, dtype=torch.bfloat16, avail mem=11.00 GB, mem usage=1.80 GB.",
            )
        )
    out.append(
        line(
            base_pid + 1,
            "TP0",
            f"max_total_num_tokens={tokens}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
            f"max_running_requests=8, context_len=200000, available_gpu_mem={f_avail:.2f} GB",
        )
    )
    out.append(line(base_pid, None, "The server is fired up and ready to roll!"))
    return out


def test_seed_journals_are_one_boot_each(corpus_dir: Path) -> None:
    (ctx_only,) = boots_of((corpus_dir / "seed-restart-ctx-only.journal").read_text())
    assert ctx_only.opened_by == "first_event"
    assert ctx_only.pool.tokens == 101_134 and ctx_only.pool.max_total_num_tokens is None
    assert not ctx_only.ready and ctx_only.phase == "pool"
    assert ctx_only.pids == {"TP7": 7411, "TP4": 7408}

    (mfs094,) = boots_of((corpus_dir / "seed-restart-mfs094.journal").read_text())
    assert mfs094.pool.max_total_num_tokens == 218_484
    assert mfs094.pool.available_gpu_mem_gb == 4.24
    assert mfs094.pool.max_running_requests == 8 and mfs094.pool.context_len == 200_000
    assert mfs094.ready and mfs094.phase == "scheduler_ready"


def test_unit_starts_split_boots_and_errors_belong_to_their_boot() -> None:
    text = "\n".join(
        [
            systemd("Starting sglang.service - SGLang..."),
            systemd("Started sglang.service - SGLang."),
            *startup(100, 101_134),
            line(101, "TP0", "Scheduler hit an exception: Traceback (most recent call last):"),
            raw(101, '  File "/x/scheduler.py", line 1, in run'),
            raw(101, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."),
            systemd("Stopping sglang.service - SGLang...", "22:10:00"),
            systemd("sglang.service: Deactivated successfully.", "22:10:01"),
            systemd("Stopped sglang.service - SGLang.", "22:10:01"),
            systemd("Starting sglang.service - SGLang...", "22:11:00"),
            systemd("Started sglang.service - SGLang.", "22:11:00"),
            *startup(200, 218_484),
        ]
    )
    first, second = boots_of(text)
    assert (first.opened_by, second.opened_by) == ("unit_start", "unit_start")
    assert first.phase == "stopped" and first.ended and not first.ready
    assert len(first.errors) == 1 and first.errors[0].category == "cuda_oom"
    assert second.errors == () and second.phase == "ready" and second.ready
    assert second.pool.tokens == 218_484
    assert second.unit == "sglang.service"


def test_pre_and_post_are_min_over_ranks_and_ignore_the_draft_weights() -> None:
    (boot,) = boots_of("\n".join(startup(100, 101_134)))
    assert boot.weights_begin_gb == {"TP0": 85.40, "TP1": 85.33}
    assert boot.pre_gib == 85.33
    assert boot.post_gib == 19.42  # the draft's 11.00 GB after the pool is not post
    assert boot.mem_fraction_static == 0.85
    assert boot.arg("tp_size") == 2


def test_pre_from_load_end_when_begin_is_missing() -> None:
    msg = "Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=33.80 GB, mem usage=13.06 GB."
    (boot,) = boots_of(line(5, "TP0", msg))
    assert boot.pre_gib == 46.86 and boot.post_gib == 33.80


def test_a_new_pid_for_a_rank_opens_a_new_boot() -> None:
    text = "\n".join(
        [
            line(7411, "TP7", "KV Cache is allocated. #tokens: 101134, K size: 0.14 GB, V size: 0.14 GB"),
            line(7408, "TP4", "Memory pool end. avail mem=10.37 GB"),
            line(9999, "TP7", "Memory pool end. avail mem=4.38 GB", "22:14:44"),
        ]
    )
    first, second = boots_of(text)
    assert second.opened_by == "pid"
    assert first.pool.tokens == 101_134 and second.pool.tokens is None
    assert second.pids == {"TP7": 9999}


def test_server_args_and_a_repeated_summary_open_new_boots() -> None:
    a = startup(100, 101_134)
    b = startup(100, 192_406)  # same PIDs (a container restarts with the same numbering)
    boots = boots_of("\n".join(a + b))
    assert [x.opened_by for x in boots] == ["first_event", "server_args"]
    summary = line(101, "TP0", "max_total_num_tokens=5, context_len=8, available_gpu_mem=1.00 GB")
    boots = boots_of("\n".join([*a[1:-1], summary]))
    assert [x.opened_by for x in boots] == ["first_event", "startup_repeated"]


def test_a_systemd_auto_restart_is_one_failed_boot_and_one_new_boot() -> None:
    text = "\n".join(
        [
            *startup(100, 101_134)[:4],
            systemd("sglang.service: Main process exited, code=killed, status=9/KILL"),
            systemd("sglang.service: Failed with result 'signal'."),
            systemd("sglang.service: Scheduled restart job, restart counter is at 1."),
            systemd("Stopped sglang.service - SGLang."),
            systemd("Starting sglang.service - SGLang..."),
            systemd("Started sglang.service - SGLang."),
            *startup(300, 101_134),
        ]
    )
    first, second = boots_of(text)
    assert first.phase == "failed" and first.unit_result == "signal"
    assert second.opened_by == "unit_start" and second.phase == "ready"


def jrecord(msg: str, pid: int, invocation: str, n: int) -> str:
    return json.dumps(
        {
            "__CURSOR": f"s=1;i={n}",
            "__REALTIME_TIMESTAMP": str(1_780_000_000_000_000 + n),
            "_BOOT_ID": "b1",
            "_PID": str(pid),
            "_SYSTEMD_UNIT": "sglang.service",
            "_SYSTEMD_INVOCATION_ID": invocation,
            "SYSLOG_IDENTIFIER": "python",
            "MESSAGE": msg,
        }
    )


def test_a_new_invocation_id_opens_a_new_boot() -> None:
    records = [
        jrecord(
            "[2026-05-30 22:00:23 TP0] KV Cache is allocated. #tokens: 101134, KV size: 6.62 GB",
            10,
            "inv-a",
            1,
        ),
        jrecord("[2026-05-30 22:10:00 TP0] Memory pool end. avail mem=4.38 GB", 10, "inv-b", 2),
    ]
    first, second = fold_boots(parse_lines(records))
    assert first.invocation_id == "inv-a" and second.invocation_id == "inv-b"
    assert second.opened_by == "invocation"
    assert first.events[0].cursor == "s=1;i=1"


def test_log_lines_alone_are_no_boot_and_traffic_is_counted_not_kept() -> None:
    assert boots_of("hello\nworld") == []
    assert fold_boots([Unit(state="stopped")]) == []
    text = "\n".join(
        [
            *startup(100, 101_134),
            line(100, None, 'INFO:     127.0.0.1:1 - "POST /generate HTTP/1.1" 200 OK'),
            line(
                101,
                "TP0",
                "Decode batch. #running-req: 1, #token: 10, token usage: 0.00, gen throughput (token/s): 5.00, #queue-req: 0",
            ),
            "some unrelated line",
        ]
    )
    (boot,) = boots_of(text)
    assert boot.traffic_events == 2 and boot.log_lines >= 1
    assert all(e.kind not in ("decode_batch", "http_access", "log") for e in boot.events)


def test_apply_is_pure_and_snapshots_stay_as_they_were() -> None:
    s0 = HostState()
    s1 = s0.apply(KvPoolAllocated(tokens=5, pid=1, tp_rank=0))
    s2 = s1.apply(PoolSummary(max_total_num_tokens=5, pid=1, tp_rank=0, available_gpu_mem_gb=2.0))
    s3 = s2.apply(Error(category="nccl_timeout", message="x", pid=1, tp_rank=0))
    assert s0.boots == ()
    assert s1.latest is not None and not s1.latest.ready and s1.latest.errors == ()
    assert s2.latest is not None and s2.latest.ready
    assert s3.latest is not None and len(s3.latest.errors) == 1 and len(s2.latest.events) == 2
    assert s3.apply(Log(message="x")).latest is not None
    assert HostState().apply(Log(message="x")).boots == ()
    assert HostState().apply(MemoryPoolEnd(avail_mem_gb=1.0)).latest.phase == "pool"  # type: ignore[union-attr]


def test_rank_keys() -> None:
    assert rank_key(WeightsBegin(tp_rank=3)) == "TP3"
    assert rank_key(WeightsBegin(dp_rank=1, tp_rank=1, ep_rank=1)) == "DP1 TP1 EP1"
    assert rank_key(WeightsBegin()) is None


def test_started_after_a_readiness_wait_closes_the_start_instead_of_opening_a_boot() -> None:
    """A unit with ExecStartPost= waiting for /health: systemd says "Started" only once the server is up."""
    text = "\n".join(
        [
            systemd("Starting sglang.service - SGLang..."),
            *startup(100, 192_406),
            systemd("Started sglang.service - SGLang.", "22:05:00"),
        ]
    )
    (boot,) = boots_of(text)
    assert boot.opened_by == "unit_start" and boot.ready and boot.pool.tokens == 192_406


def test_started_after_a_stop_still_opens_the_next_boot() -> None:
    """Type=simple units log only "Started" for a start: after a stop it is the next boot."""
    text = "\n".join(
        [
            *startup(100, 101_134),
            systemd("Stopping sglang.service - SGLang...", "22:10:00"),
            systemd("Stopped sglang.service - SGLang.", "22:10:01"),
            systemd("Started sglang.service - SGLang.", "22:11:00"),
            *startup(200, 218_484),
        ]
    )
    first, second = boots_of(text)
    assert first.ended and second.opened_by == "unit_start" and second.pool.tokens == 218_484


def test_an_audit_entry_belongs_to_no_boot() -> None:
    from console.core.events import Audit

    audit = Audit(action="apply", user="alice", outcome="ok", message="alice applied ctx-200k", host="gpu1")
    assert HostState().apply(audit).boots == ()
    unit = parse_lines(["Nov 30 10:00:00 gpu1 systemd[1]: Started sglang.service - SGLang."], host="gpu1")
    state = HostState().apply_all(unit)
    assert state.apply(audit) is state


def test_apply_all_folds_runs_of_traffic_exactly_as_one_by_one(corpus_dir: Path) -> None:
    """`apply_all` counts runs of traffic and log lines in one step; every corpus journal (and all of them
    end to end, restarts and tracebacks included) folds to the same state as applying event by event."""
    everything: list[object] = []
    files = sorted(corpus_dir.glob("*.journal")) + sorted((corpus_dir / "public").glob("*.log"))
    assert len(files) > 10
    for path in files:
        events = list(parse_text(path.read_text(errors="replace")))
        everything.extend(events)
        one_by_one = HostState()
        for e in events:
            one_by_one = one_by_one.apply(e)
        assert HostState().apply_all(events) == one_by_one, path.name
    one_by_one = HostState()
    for e in everything:
        one_by_one = one_by_one.apply(e)  # type: ignore[arg-type]
    batched = HostState()
    for start in range(0, len(everything), 97):  # batches that cut runs anywhere
        batched = batched.apply_all(everything[start : start + 97])  # type: ignore[arg-type]
    assert batched == one_by_one
    assert sum(b.traffic_events for b in batched.boots) > 20
