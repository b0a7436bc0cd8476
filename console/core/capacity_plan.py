"""The planner: the `--mem-fraction-static` that reaches a target context in one restart, and the words
that explain a plan (why refused, what else would reach it, what the calibration and the knobs say).

The physics it searches over (the pool formula, calibration from a boot) is `console.core.capacity`.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from console.core.capacity import (
    DEFAULT_MIN_HEADROOM_GIB,
    FRACTION_STEP,
    GIB,
    MAMBA_SLOTS_PER_REQUEST,
    MAX_GPU_MEM_GIB,
    MAX_PAGE_SIZE,
    MAX_RUNNING_REQUESTS,
    MAX_TOKENS,
    MAX_TP,
    Calibration,
    CalibrationKind,
    CapacityError,
    PoolConfig,
    PoolSizes,
    check_range,
    draft_kv_gib,
    pool_sizes,
    req_to_token_gib,
    resolve_max_running_requests,
)


class PoolForecast(BaseModel, defer_build=True):
    """One pool of the plan, per GPU, at the fraction the plan shows (the pessimistic memory)."""

    pool: str
    """`full` (the context), `swa` (sliding window), `mamba` (recurrent state), `draft` (speculative)."""
    tokens: int | None = None
    slots: int | None = None
    gib: float | None = None


class Plan(BaseModel, defer_build=True):
    """The planner's answer; field names are the `plan --json` contract."""

    target_context: int
    model: str
    cell_bytes: int
    sizing_rule: str
    calibration: CalibrationKind
    pre_gib_range: tuple[float, float] | None = None
    mem_fraction_static: float | None = None
    predicted_max_total_num_tokens: int | None = None
    headroom_gib: float | None = None
    recommended_mem_fraction_static: float | None = None
    predicted_tokens_at_recommended: int | None = None
    headroom_gib_at_recommended: float | None = None
    req_to_token_gib_at_recommended: float | None = None
    max_running_requests_at_recommended: int | None = None
    max_safe_mem_fraction_static: float | None = None
    predicted_tokens_at_max_safe: int | None = None
    min_headroom_gib: float
    fits: bool
    reasons: list[str] = Field(default_factory=list)
    alternatives: list[str] = Field(default_factory=list)
    assumptions: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    pools: list[PoolForecast] = Field(default_factory=list)
    """Every pool SGLang would size at the recommended fraction (else the one asked about)."""
    limiting_pool: str | None = None
    """The pool that bounds the plan, in words: the context's pool, or the one that caps running requests."""
    recommended_flags: dict[str, str] = Field(default_factory=dict)
    """The flags that reach the target: `--mem-fraction-static`, and for a sliding-window or hybrid model
    the pool ratio that makes room when the fraction alone cannot."""


def fraction_grid(step: float = FRACTION_STEP) -> list[float]:
    count = round(1 / step)
    return [round(k * step, 6) for k in range(1, count)]


def check_fraction(f: float) -> float:
    if not math.isfinite(f) or not 0 < f < 1:
        raise CapacityError(f"--mem-fraction-static must lie strictly between 0 and 1, not {f:g}.")
    return f


def check_config(cfg: PoolConfig) -> PoolConfig:
    """`cfg`, or a CapacityError for the first number outside its sane range."""
    check_range("--tp", cfg.tp, 1, MAX_TP)
    check_range("--page-size", cfg.page_size, 1, MAX_PAGE_SIZE, "tokens")
    if cfg.max_total_tokens is not None:
        check_range("--max-total-tokens", cfg.max_total_tokens, 1, MAX_TOKENS, "tokens")
    if cfg.max_running_requests is not None:
        check_range("--max-running-requests", cfg.max_running_requests, 1, MAX_RUNNING_REQUESTS)
    if cfg.context_length is not None:
        check_range("--context-length", cfg.context_length, 1, MAX_TOKENS, "tokens")
    return cfg


def plan(
    target_context: int,
    cfg: PoolConfig,
    calibration: Calibration,
    *,
    mem_fraction_static: float | None = None,
    min_headroom_gib: float = DEFAULT_MIN_HEADROOM_GIB,
) -> Plan:
    """The smallest `f` on the 0.005 grid whose (pessimistic) pool holds `target_context` with at least
    `min_headroom_gib` of headroom; otherwise a refusal with reasons and alternatives."""
    check_range("--target-context", target_context, 1, MAX_TOKENS, "tokens")
    check_range("--min-headroom-gib", min_headroom_gib, 0, MAX_GPU_MEM_GIB, "GiB")
    check_config(cfg)
    if mem_fraction_static is not None:
        check_fraction(mem_fraction_static)
    if cfg.context_length is None:
        cfg = cfg.model_copy(update={"context_length": target_context})
    cal = calibration
    out = Plan(
        target_context=target_context,
        model=cfg.model.name,
        cell_bytes=cfg.cell_bytes,
        sizing_rule=cfg.rule.value,
        calibration=cal.kind,
        pre_gib_range=_round_pair(cal.pre_range_gib),
        mem_fraction_static=mem_fraction_static,
        min_headroom_gib=min_headroom_gib,
        fits=False,
        assumptions=list(cal.assumptions),
    )
    if cfg.mm_reserve_gib:
        out.assumptions.append(
            f"a multimodal model: SGLang keeps {cfg.mm_reserve_gib:.2f} GiB of the KV budget for its "
            "runtime allocations (0.5.19+; 1 GiB more with --mm-feature-transport cuda_ipc or cuda_vmm)."
        )
    if cal.kind == "none":
        out.reasons.append(
            "the journal shows no boot whose pool or weight-load memory the model can calibrate on "
            "(give --journal with a boot that sized its pool, and --gpu-mem-gib)."
        )
        out.notes.extend(knob_notes(cfg, None, None))
        return out

    if mem_fraction_static is not None:
        out.predicted_max_total_num_tokens = cal.predict(mem_fraction_static, cfg)
        out.headroom_gib = _round(cal.headroom(mem_fraction_static, cfg))

    needed, rows = _search(target_context, cfg, cal)
    safe = [row for row in rows if row[2] >= min_headroom_gib]
    if safe:
        out.max_safe_mem_fraction_static = safe[-1][0]
        out.predicted_tokens_at_max_safe = safe[-1][1]
    base = cfg
    if not _fits(needed, min_headroom_gib):
        # A sliding-window or hybrid model can give the context pool more of the same budget.
        for variant, flag, value in _pool_variants(cfg):
            found, _ = _search(target_context, variant, cal)
            if _fits(found, min_headroom_gib):
                needed, cfg = found, variant
                out.recommended_flags[flag] = value
                out.notes.append(
                    f"{flag} {value} (from {_ratio_of(base, flag)}) moves budget to the full-attention pool: "
                    "the fraction alone could not reach the target with the headroom kept."
                )
                break

    if needed is not None and _fits(needed, min_headroom_gib):
        f, tokens, room = needed
        out.fits = True
        out.recommended_mem_fraction_static = f
        out.predicted_tokens_at_recommended = tokens
        out.headroom_gib_at_recommended = _round(room)
        slots = _at(cal, f, cfg).mamba_slots
        out.req_to_token_gib_at_recommended = _round(req_to_token_gib(tokens, cfg, slots))
        out.max_running_requests_at_recommended = resolve_max_running_requests(tokens, cfg, slots)
        out.recommended_flags = {"--mem-fraction-static": f"{f:g}", **out.recommended_flags}
    else:
        out.reasons.extend(_refusal_reasons(target_context, base, needed, safe, min_headroom_gib))
        out.alternatives.extend(_alternatives(target_context, base, cal, min_headroom_gib))
    shown = out.recommended_mem_fraction_static or mem_fraction_static or out.max_safe_mem_fraction_static
    if shown is not None:
        out.pools, out.limiting_pool = _pools(cal, shown, cfg, target_context)
    out.notes.extend(_calibration_notes(cal, base))
    rec = out.recommended_mem_fraction_static
    out.notes.extend(knob_notes(cfg, cal, rec if rec is not None else mem_fraction_static))
    return out


Row = tuple[float, int, float]


def _search(target: int, cfg: PoolConfig, cal: Calibration) -> tuple[Row | None, list[Row]]:
    """The first grid fraction whose pool holds `target` (and, for a hybrid linear-attention model,
    whose mamba pool holds the slots its running requests need), and every grid fraction's row."""
    rows = [(f, cal.predict(f, cfg) or 0, cal.headroom(f, cfg) or 0.0) for f in fraction_grid()]
    least = _least_mamba_slots(cfg)
    needed = next(
        (row for row in rows if row[1] >= target and (_at(cal, row[0], cfg).mamba_slots or 0) >= least),
        None,
    )
    return needed, rows


def _least_mamba_slots(cfg: PoolConfig) -> int:
    """The mamba slots a hybrid model needs to run its requests (0 for other models): with the radix
    cache 3 per running request (SGLang's ratio), one each without; at least one request."""
    if not cfg.mamba_bytes_per_slot:
        return 0
    per = 1 if cfg.disable_radix_cache else MAMBA_SLOTS_PER_REQUEST
    return per * max(1, cfg.max_running_requests or 1)


def _fits(row: Row | None, min_headroom: float) -> bool:
    return row is not None and row[2] >= min_headroom


def _pool_variants(cfg: PoolConfig) -> list[tuple[PoolConfig, str, str]]:
    """Smaller shares for the other pools, the nearest to the current one first: a sliding-window
    model's `--swa-full-tokens-ratio`, a hybrid linear-attention model's `--mamba-full-memory-ratio`
    (only when SGLang sizes the slots by it)."""
    out: list[tuple[PoolConfig, str, str]] = []
    if cfg.model.sliding_window and cfg.model.num_layers:
        for r in (0.6, 0.5, 0.4, 0.3, 0.2, 0.1):
            if r < cfg.swa_full_tokens_ratio:
                out.append(
                    (cfg.model_copy(update={"swa_full_tokens_ratio": r}), "--swa-full-tokens-ratio", f"{r:g}")
                )
    mamba_by_ratio = cfg.max_mamba_cache_size is None and not (
        cfg.disable_radix_cache and cfg.max_running_requests is not None
    )
    if cfg.mamba_bytes_per_slot and mamba_by_ratio:
        for r in (0.7, 0.5, 0.3, 0.2, 0.1):
            if r < cfg.mamba_full_memory_ratio:
                out.append(
                    (
                        cfg.model_copy(update={"mamba_full_memory_ratio": r}),
                        "--mamba-full-memory-ratio",
                        f"{r:g}",
                    )
                )
    return out


def _ratio_of(cfg: PoolConfig, flag: str) -> str:
    value = cfg.swa_full_tokens_ratio if flag == "--swa-full-tokens-ratio" else cfg.mamba_full_memory_ratio
    return f"{value:g}"


def _at(cal: Calibration, f: float, cfg: PoolConfig) -> PoolSizes:
    """The pools at `f` on the pessimistic memory (the scenario with the smallest context pool)."""
    return min((pool_sizes(mem, f, cfg) for mem in cal.scenarios), key=lambda sizes: sizes.full_tokens)


def _pools(cal: Calibration, f: float, cfg: PoolConfig, target: int) -> tuple[list[PoolForecast], str]:
    """Each pool at `f`, and which one bounds the plan, in words."""
    sizes = _at(cal, f, cfg)
    full = sizes.full_tokens
    pools = [PoolForecast(pool="full", tokens=full, gib=_round(full * cfg.cost_per_full_token / GIB))]
    if sizes.swa_tokens is not None:
        pools.append(PoolForecast(pool="swa", tokens=sizes.swa_tokens))
    if sizes.mamba_slots is not None:
        pools.append(PoolForecast(pool="mamba", slots=sizes.mamba_slots, gib=_round(sizes.mamba_gib)))
    draft = draft_kv_gib(full, cfg)
    if draft:
        pools.append(PoolForecast(pool="draft", tokens=full, gib=_round(draft)))
    if full < target:
        return (
            pools,
            f"the full-attention pool ({full:,} tokens at f={f:g}) cannot hold the {target:,}-token context.",
        )
    if sizes.mamba_slots is not None:
        per = 1 if cfg.disable_radix_cache else MAMBA_SLOTS_PER_REQUEST
        return pools, (
            f"the mamba state pool, whose {sizes.mamba_slots:,} slots ({sizes.mamba_gib:.2f} GiB) let at most "
            f"{_requests(max(1, sizes.mamba_slots // per))} run at once ({per} slot{'s' if per > 1 else ''} each); "
            f"the full-attention pool's {full:,} tokens hold the {target:,}-token context"
        )
    if sizes.swa_tokens is not None:
        return pools, (
            f"the full-attention pool, whose {full:,} tokens hold the {target:,}-token context; the "
            f"sliding-window pool's {sizes.swa_tokens:,} tokens ({cfg.swa_full_tokens_ratio:g} of it) hold the "
            "recent window of every running request together"
        )
    return pools, f"the KV pool, whose {full:,} tokens hold the {target:,}-token context"


def _requests(n: int) -> str:
    return f"{n:,} request" + ("" if n == 1 else "s")


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _round_pair(pair: tuple[float, float] | None) -> tuple[float, float] | None:
    return None if pair is None else (round(pair[0], 2), round(pair[1], 2))


def _refusal_reasons(
    target: int,
    cfg: PoolConfig,
    needed: tuple[float, int, float] | None,
    safe: list[tuple[float, int, float]],
    min_headroom: float,
) -> list[str]:
    reasons: list[str] = []
    if cfg.max_total_tokens is not None and cfg.max_total_tokens < target:
        reasons.append(
            f"--max-total-tokens {cfg.max_total_tokens:,} caps the pool below the {target:,}-token target."
        )
    if needed is None:
        reasons.append(f"no fraction below 1 gives a pool of {target:,} tokens on this memory.")
    else:
        f, _tokens, room = needed
        reasons.append(
            f"the pool first reaches {target:,} tokens at --mem-fraction-static {f:g}, which leaves only "
            f"{room:.2f} GiB of headroom (at least {min_headroom:g} GiB is needed for CUDA graphs, "
            "activations and the draft model)."
        )
    if safe:
        f, tokens, _room = safe[-1]
        reasons.append(
            f"with {min_headroom:g} GiB of headroom kept, the most the pool can hold is {tokens:,} tokens (f={f:g})."
        )
    return reasons


def _alternatives(target: int, cfg: PoolConfig, cal: Calibration, min_headroom: float) -> list[str]:
    alts: list[str] = []
    if cfg.model.kv_element_bytes(cfg.kv_cache_dtype) > 1 and not cfg.model.dsv4:
        fp8 = cfg.model_copy(update={"kv_cache_dtype": "fp8_e4m3"})
        hit = next(
            (
                (f, cal.predict(f, fp8) or 0, cal.headroom(f, fp8) or 0.0)
                for f in fraction_grid()
                if (cal.predict(f, fp8) or 0) >= target
            ),
            None,
        )
        tail = (
            f": the target would need f={hit[0]:g} with {hit[2]:.2f} GiB of headroom"
            if hit is not None and hit[2] >= min_headroom
            else ", though even that does not reach the target here"
        )
        alts.append(
            f"--kv-cache-dtype fp8_e4m3 halves the KV bytes per token ({cfg.cell_bytes:,} → {fp8.cell_bytes:,} B){tail}."
        )
    if cfg.model.attention == "mha":
        alts.append(
            "more GPUs (a larger --tp-size) divide the KV heads per GPU and spread the weights, "
            "so each GPU holds more tokens."
        )
    else:
        alts.append(
            "more GPUs (a larger --tp-size or more nodes) spread the weights and leave more memory per GPU "
            "for the pool (MLA keeps the whole latent cache on every GPU, so the bytes per token stay the same)."
        )
    alts.append(
        "fewer layers per GPU (pipeline parallelism, --pp-size 2 over twice the GPUs) halves the KV bytes per token."
    )
    if cfg.max_running_requests is None:
        alts.append(
            "a small --max-running-requests (e.g. 8) shrinks the req_to_token table and returns its memory to the headroom."
        )
    if cfg.max_total_tokens is not None and cfg.max_total_tokens < target:
        alts.append("drop --max-total-tokens or raise it above the target.")
    alts.append("a smaller --target-context.")
    return alts


def _calibration_notes(cal: Calibration, cfg: PoolConfig) -> list[str]:
    notes: list[str] = []
    ref = cal.reference
    if ref is None or ref.mem_fraction_static is None:
        return notes
    f0 = ref.mem_fraction_static
    cfg = ref.config or cfg
    if cal.kind == "exact" and ref.tokens is not None:
        predicted = cal.predict(f0, cfg) or 0
        if ref.capped:
            notes.append(
                f"check: the boot's pool of {ref.tokens:,} tokens was capped by --max-total-tokens; "
                "the memory would have allowed more."
            )
        else:
            error = (predicted - ref.tokens) / ref.tokens
            notes.append(
                f"check: at the boot's f={f0:g} the model gives {predicted:,} tokens; the boot showed "
                f"{ref.tokens:,} ({error:+.2%})."
            )
    if ref.available_gpu_mem_gb is not None and cal.kind in ("exact", "two_point"):
        slack = cal.headroom(f0, cfg)
        if slack is not None:
            other = slack - ref.available_gpu_mem_gb
            notes.append(
                f"at f={f0:g} the boot had {ref.available_gpu_mem_gb:.2f} GiB free at ready against "
                f"{slack:.2f} GiB of modelled headroom: CUDA graphs, the draft model and the rest took about "
                f"{other:.2f} GiB of it."
            )
    return notes


def knob_notes(cfg: PoolConfig, cal: Calibration | None, f: float | None) -> list[str]:
    """One sentence per flag on what it does to the pool and the headroom."""
    cell = cfg.cell_bytes
    notes: list[str] = []
    if cal is not None and cal.scenarios:
        pre = min(m.pre_gib for m in cal.scenarios)
        per_step = int(pre * 0.01 * GIB / cell)
        notes.append(
            f"--mem-fraction-static: every +0.01 gives the pool about {pre * 0.01:.2f} GiB "
            f"(≈{per_step:,} tokens at {cell:,} B/token) and takes the same from the headroom."
        )
    notes.append(
        "--context-length only sets the longest request the server accepts; raising it alone does not grow the pool."
    )
    if f is not None and cal is not None and cal.scenarios:
        tokens = cal.predict(f, cfg) or 0
        reqs = resolve_max_running_requests(max(tokens, 1), cfg)
        table = req_to_token_gib(tokens, cfg)
        how = "as set" if cfg.max_running_requests else "SGLang's default when the flag is not set"
        notes.append(
            f"--max-running-requests does not enter the pool size, but its req_to_token table "
            f"((reqs+1)·(ctx+4+draft)·4 B) costs {table:.2f} GiB of headroom at {reqs:,} requests ({how})."
        )
    else:
        notes.append(
            "--max-running-requests does not enter the pool size, but its req_to_token table "
            "((reqs+1)·(ctx+4+draft)·4 B) is paid from the headroom."
        )
    if cfg.model.kv_element_bytes(cfg.kv_cache_dtype) > 1 and not cfg.model.dsv4:
        notes.append(
            "--kv-cache-dtype fp8_e4m3 halves the KV bytes per token, about doubling the pool at the same fraction."
        )
    cap = f" (set to {cfg.max_total_tokens:,} here)" if cfg.max_total_tokens else ""
    notes.append(f"--max-total-tokens only caps the pool, it never grows it{cap}.")
    notes.append(
        "CUDA graphs, activations, the draft model's weights and KV pool are all paid from the headroom, "
        "which is why the plan keeps a minimum of it."
    )
    return notes
