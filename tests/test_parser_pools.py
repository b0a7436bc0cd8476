"""The pools of hybrid models (issue 32) read from real public lines (tests/data/public-pools/INDEX.md):
mamba state, sliding-window, DeepSeek-V4, draft and fp8 KV pools, their runtime usage figures, and a
boot's pools folded into the state, rank by rank, target apart from draft."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.core.events import (
    DecodeBatch,
    Dsv4Memory,
    Dsv4Pool,
    Error,
    KvCacheDtype,
    MambaPoolAllocated,
    PrefillBatch,
    SwaPoolAllocated,
    SwaPoolSplit,
    WeightsLoaded,
    event_from_json,
)
from console.core.parser import JournalParser, parse_text
from console.core.state import fold_boots

DATA = Path(__file__).parent / "data" / "public-pools"


def lines(name: str) -> list[str]:
    return (DATA / name).read_text(encoding="utf-8").removesuffix("\n").split("\n")


def one(line: str):  # type: ignore[no-untyped-def]
    events = JournalParser().feed(line) + JournalParser().flush()
    assert len(events) == 1, events
    (event,) = events
    assert event_from_json(event.model_dump_json()) == event  # the JSON reads back to the same event
    return event


def test_mamba_pool_line_every_field_a_number() -> None:
    e = one(lines("qwen35-397b-hybrid-tp2.log")[3])
    assert isinstance(e, MambaPoolAllocated)
    assert (e.slots, e.conv_state_gb, e.ssm_state_gb, e.tp_rank) == (82, 0.13, 7.29, 0)
    e = one(lines("dsv4-and-draft-lines.log")[4])  # 0.5.2x, no trailing space
    assert (e.kind, e.slots, e.conv_state_gb, e.ssm_state_gb, e.tp_rank) == (
        "mamba_pool_allocated",
        113,
        0.13,
        1.89,
        2,
    )


def test_sliding_window_split_and_pool_lines() -> None:
    split = one(lines("swa-lines.log")[0])
    assert isinstance(split, SwaPoolSplit)
    assert (split.full_tokens, split.swa_tokens, split.tp_rank) == (375360, 300288, 2)
    pool = one(lines("swa-lines.log")[6])
    assert isinstance(pool, SwaPoolAllocated)
    assert (pool.mem_usage_gb, pool.swa_tokens, pool.full_tokens) == (36.69, 171008, 213761)


def test_hybrid_runtime_usage_fields() -> None:
    prefill = one(lines("mamba-runtime.log")[0])
    assert isinstance(prefill, PrefillBatch)
    assert (prefill.full_token_usage, prefill.mamba_usage, prefill.token_usage) == (0.12, 0.02, 0.12)
    assert (prefill.cached_token, prefill.input_throughput, prefill.cuda_graph) == (255983, 9.58, False)
    old = one(lines("mamba-runtime.log")[1])  # the v0.5.x form with its trailing ", "
    assert (old.kind, old.full_token_usage, old.mamba_usage, old.queue_req, old.dp_rank) == (
        "prefill_batch",
        0.0,
        0.0,
        0,
        1,
    )
    decode = one(lines("mamba-runtime.log")[2])
    assert isinstance(decode, DecodeBatch)
    assert (decode.mamba_num, decode.mamba_usage, decode.full_token_usage) == (20, 1.0, 0.14)
    assert (decode.num_tokens, decode.token_usage, decode.queue_req) == (2326796, 0.14, 6)
    swa_prefill = one(lines("swa-lines.log")[7])
    assert (swa_prefill.full_token_usage, swa_prefill.swa_token_usage) == (0.0, 0.01)
    swa_decode = one(lines("swa-lines.log")[8])
    assert isinstance(swa_decode, DecodeBatch)
    assert (swa_decode.swa_tokens, swa_decode.swa_token_usage, swa_decode.num_tokens) == (128, 0.04, 128)
    assert swa_decode.gen_throughput == 0.44


def test_deepseek_v4_lines_of_three_versions() -> None:
    boot = lines("dsv4-flash-mi300x-tp4dp4.log")
    mem = one(boot[15])
    assert isinstance(mem, Dsv4Memory)
    assert (mem.bytes_per_full_token, mem.available_gb, mem.full_tokens, mem.dp_rank) == (
        176983.05,
        87.26,
        529408,
        0,
    )
    pool = one(boot[19])
    assert isinstance(pool, Dsv4Pool)
    assert (pool.max_num_reqs, pool.swa_tokens, pool.c4_tokens, pool.c128_tokens) == (
        256,
        423424,
        132352,
        4136,
    )
    assert (pool.c4_state_tokens, pool.c128_state_tokens, pool.full_tokens) == (52928, 846848, None)
    later = lines("dsv4-and-draft-lines.log")
    mem = one(later[0])
    assert (mem.kind, mem.bytes_per_full_token, mem.c128_state_fixed_gb, mem.full_tokens) == (
        "dsv4_memory",
        7705.45,
        0.07,
        209280,
    )
    sizes = one(later[1])
    assert (sizes.full_tokens, sizes.swa_tokens, sizes.c4_tokens, sizes.c128_state_tokens) == (
        209280,
        20864,
        52320,
        0,
    )
    assert one(later[2]).swa_fixed_gb == 0.30


def test_weights_lines_without_dtype_and_fnuz_kv() -> None:
    e = one(lines("dsv4-flash-mi300x-tp4dp4.log")[7])
    assert isinstance(e, WeightsLoaded)
    assert (e.elapsed_s, e.model_type, e.dtype, e.quant) == (
        41.51,
        "DeepseekV4ForCausalLM",
        None,
        "fp8, fmt=e4m3",
    )
    assert (e.avail_mem_gb, e.mem_usage_gb) == (109.20, 73.43)
    bare = one(lines("dsv4-and-draft-lines.log")[7])
    assert (bare.kind, bare.model_type, bare.quant, bare.avail_mem_gb, bare.mem_usage_gb) == (
        "weights_loaded",
        None,
        "fp8, fmt=e4m3",
        12.25,
        125.65,
    )
    dtype = one(lines("dsv4-flash-mi300x-tp4dp4.log")[14])
    assert isinstance(dtype, KvCacheDtype)
    assert dtype.dtype == "torch.float8_e4m3fnuz"
    kv = one(lines("dsv4-and-draft-lines.log")[5])
    assert (kv.kind, kv.dtype, kv.tokens, kv.kv_size_gb) == (
        "kv_pool_allocated",
        "torch.float8_e4m3fn",
        341952,
        2.26,
    )


def test_rocm_out_of_memory_is_the_cuda_oom_error() -> None:
    e = one(lines("rocm-oom.log")[0])
    assert isinstance(e, Error)
    assert e.category == "cuda_oom"


@pytest.mark.parametrize(
    ("line", "field"),
    [
        (
            "Mamba Cache is allocated. max_mamba_cache_size: -82, conv_state size: 0.13GB, ssm_state size: 7.29GB ",
            "slots",
        ),
        ("Use sliding window memory pool. full_layer_tokens=-5, swa_layer_tokens=300288", "full_tokens"),
        (
            "DSv4 memory calculation: bytes_per_full_token=-176983.05, available_bytes=87.26 GB, full_token=529408",
            "bytes_per_full_token",
        ),
    ],
)
def test_a_pool_line_with_an_impossible_number_is_an_error_not_a_pool(line: str, field: str) -> None:
    e = one(line)
    assert isinstance(e, Error) and e.category == "out_of_range"
    assert e.message.startswith(f"{field}=")


def test_a_hybrid_boot_folds_its_mamba_and_full_pools() -> None:
    (boot,) = fold_boots(parse_text((DATA / "qwen35-397b-hybrid-tp2.log").read_text()))
    pool = boot.pool
    assert (pool.tokens, pool.kv_tokens, pool.kv_gb, pool.kv_dtype) == (580364, 580364, 8.3, "torch.bfloat16")
    assert (pool.mamba_slots, pool.mamba_gb) == (82, 7.42)
    assert (pool.draft_kv_tokens, pool.draft_weights_gb, pool.swa_tokens) == (None, None, None)
    assert (boot.pre_gib, boot.post_gib) == (22.84, 19.08)
    assert boot.ready and boot.phase == "scheduler_ready"


def test_a_deepseek_v4_boot_folds_its_full_and_window_pools() -> None:
    (boot,) = fold_boots(parse_text((DATA / "dsv4-flash-mi300x-tp4dp4.log").read_text()))
    pool = boot.pool
    # No summary line (the boot died allocating): the full pool is the DSv4 line's.
    assert (pool.max_total_num_tokens, pool.tokens, pool.swa_tokens) == (None, 529408, 423424)
    assert (pool.dsv4_bytes_per_full_token, pool.dsv4_available_gb) == (176983.05, 87.26)
    assert (pool.dsv4_c4_tokens, pool.dsv4_c128_tokens, pool.kv_dtype) == (
        132352,
        4136,
        "torch.float8_e4m3fnuz",
    )
    assert (boot.pre_gib, boot.post_gib) == (182.61, 109.18)  # the least over the four ranks
    assert boot.phase == "pool"


def test_a_sliding_window_boot_reads_its_full_pool_not_the_first_kv_line() -> None:
    # SGLang allocates the SWA pool first: the first `KV Cache` line (300,288) is not the context pool.
    (boot,) = fold_boots(parse_text("\n".join(lines("swa-lines.log")[:6])))
    assert (boot.pool.kv_tokens, boot.pool.full_tokens, boot.pool.swa_tokens) == (300288, 375360, 300288)
    assert boot.pool.tokens == 375360


def test_a_boot_without_a_draft_shows_no_draft_pool(corpus_dir: Path) -> None:
    # Kimi K2.5 on 8 ranks (case-01): every rank prints its weights, its pool and `Memory pool end`,
    # interleaved with the other ranks'. A draft is only a rank's second weights line or a pool of a
    # rank after that rank's own `Memory pool end`: none here, so no draft pool is made up.
    text = (corpus_dir / "public" / "case-01.log").read_text(encoding="utf-8", errors="replace")
    boot = fold_boots(parse_text(text))[0]
    assert boot.pool.kv_tokens == 2454421 and boot.pool.kv_gb == 160.63
    assert (boot.pool.draft_kv_tokens, boot.pool.draft_weights_gb) == (None, None)
    assert set(boot.weights_lines.values()) == {1} and len(boot.weights_lines) == 8
    assert len(boot.ranks_pool_ended) == 8


def test_each_pool_against_its_use_on_a_real_deepseek_v4_log() -> None:
    # One public DeepSeek-V4-Flash log on Ascend NPU (read_file id 57615238133): its budget and pool
    # lines, then a decode line with the full and sliding-window pools' use, in the log's order.
    from console.core.pools import pool_readings

    later = lines("dsv4-and-draft-lines.log")
    events = parse_text("\n".join([later[0], later[1], lines("swa-lines.log")[8]]))
    (boot,) = fold_boots(events)
    readings = {r.pool: r for r in pool_readings(boot, events)}
    assert list(readings) == ["full", "swa", "dsv4_c4", "dsv4_c128"]
    assert (readings["full"].size, readings["full"].used, readings["full"].usage) == (209280, 128, 0.0)
    assert (readings["swa"].size, readings["swa"].used, readings["swa"].usage) == (20864, 128, 0.04)
    assert (readings["dsv4_c4"].size, readings["dsv4_c128"].size) == (52320, 1635)


def test_a_hybrid_boots_pools_before_any_traffic() -> None:
    from console.core.pools import pool_readings

    (boot,) = fold_boots(parse_text((DATA / "qwen35-397b-hybrid-tp2.log").read_text()))
    readings = pool_readings(boot)
    assert [(r.pool, r.size, r.unit, r.gib, r.used, r.usage) for r in readings] == [
        ("full", 580364, "tokens", 8.3, None, None),
        ("mamba", 82, "slots", 7.42, None, None),
    ]
