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
    MAX_GPU_MEM_GIB,
    MAX_PAGE_SIZE,
    MAX_RUNNING_REQUESTS,
    MAX_TOKENS,
    MAX_TP,
    Calibration,
    CalibrationKind,
    CapacityError,
    PoolConfig,
    check_range,
    req_to_token_gib,
    resolve_max_running_requests,
)


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

    grid = fraction_grid()
    rows = [(f, cal.predict(f, cfg) or 0, cal.headroom(f, cfg) or 0.0) for f in grid]
    safe = [row for row in rows if row[2] >= min_headroom_gib]
    if safe:
        out.max_safe_mem_fraction_static = safe[-1][0]
        out.predicted_tokens_at_max_safe = safe[-1][1]
    needed = next((row for row in rows if row[1] >= target_context), None)

    if needed is not None and needed[2] >= min_headroom_gib:
        f, tokens, room = needed
        out.fits = True
        out.recommended_mem_fraction_static = f
        out.predicted_tokens_at_recommended = tokens
        out.headroom_gib_at_recommended = _round(room)
        out.req_to_token_gib_at_recommended = _round(req_to_token_gib(tokens, cfg))
        out.max_running_requests_at_recommended = resolve_max_running_requests(tokens, cfg)
    else:
        out.reasons.extend(_refusal_reasons(target_context, cfg, needed, safe, min_headroom_gib))
        out.alternatives.extend(_alternatives(target_context, cfg, cal, min_headroom_gib))
    out.notes.extend(_calibration_notes(cal, cfg))
    rec = out.recommended_mem_fraction_static
    out.notes.extend(knob_notes(cfg, cal, rec if rec is not None else mem_fraction_static))
    return out


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
    if cfg.model.kv_element_bytes(cfg.kv_cache_dtype) > 1:
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
    if cfg.model.kv_element_bytes(cfg.kv_cache_dtype) > 1:
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
