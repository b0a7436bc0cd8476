"""The KV-pool physics of SGLang, calibration from what a journal showed, and the planner.

For SGLang v0.4 … v0.5.13 (shared/reference/sglang.md §4.1, §4.2):

    T = floor(floor((post − pre·(1 − f)) · 2^30) / cell)   → page-aligned → capped by --max-total-tokens

`pre` / `post` are the free GPU memory (GiB, min over ranks) before and after the weights load, `f` is
`--mem-fraction-static`, `cell` the KV bytes per token per GPU. The slack `pre·(1 − f)` is what pays
for CUDA graphs, activations, the draft model and the req_to_token table: the planner reports what is
left of it as *headroom*. Versions differ (`SizingRule`): ≤ v0.5.6 adds an EAGLE headroom term to the
token count, ≥ v0.5.14 adds the EAGLE draft layers to `cell`. Everything here is pure arithmetic.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from console.core.capacity_multimodal import is_dev_build
from console.core.models import ModelSpec

if TYPE_CHECKING:
    from console.core.state import Boot

GIB = 1 << 30
FRACTION_STEP = 0.005
DEFAULT_MIN_HEADROOM_GIB = 3.0
DEFAULT_BAND = (0.80, 1.00)
"""When a boot showed neither `pre` nor `post`: `pre` is assumed between 80% and 100% of the card."""

EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE"})

CalibrationKind = Literal["exact", "two_point", "band", "none"]


class CapacityError(ValueError):
    """Input the model cannot work with; the message is one sentence."""


# Sane ranges for every number the planner takes. Far wider than any real deployment, narrow enough
# that the arithmetic stays finite (a 1e300 GiB card overflowed `int()` into a traceback).
MAX_TOKENS = 2**31 - 1
"""A context, a pool, a cap: SGLang indexes tokens with int32 (req_to_token), so no pool holds more."""
MAX_GPU_MEM_GIB = 1024.0
"""One GPU's memory; the largest cards hold 288 GB."""
MAX_TP = 1024
MAX_PAGE_SIZE = 1 << 16
MAX_RUNNING_REQUESTS = 1 << 20


def range_text(lo: float, hi: float, unit: str = "", *, above_lo: bool = False) -> str:
    """`from 1 to 1,024 GiB` or `more than 0 and at most 1,024 GiB`: a range as an error message says it."""
    lo_s, hi_s = _number_text(lo), _number_text(hi)
    unit = f" {unit}" if unit else ""
    return f"more than {lo_s} and at most {hi_s}{unit}" if above_lo else f"from {lo_s} to {hi_s}{unit}"


def _number_text(x: float) -> str:
    """1024 as `1,024`, 0.5 as `0.5`, 1e300 as `1e+300`."""
    if isinstance(x, int):
        # A huge int has no float form (and more than 4,300 digits no str() either).
        return f"{x:,}" if abs(x) < 10**15 else f"2^{abs(x).bit_length() - 1} or more"
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:g}"


def in_range(value: float, lo: float, hi: float, *, above_lo: bool = False) -> bool:
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return (lo < value if above_lo else lo <= value) and value <= hi


def check_range(
    name: str, value: float, lo: float, hi: float, unit: str = "", *, above_lo: bool = False
) -> float:
    """`value`, or a CapacityError naming `name` and the range it must lie in."""
    if not in_range(value, lo, hi, above_lo=above_lo):
        shown = _number_text(value)
        raise CapacityError(f"{name} must be {range_text(lo, hi, unit, above_lo=above_lo)}, not {shown}.")
    return value


class SizingRule(StrEnum):
    LEGACY = "v0.4-v0.5.6"
    """`rest = avail − pre·(1−f)`; EAGLE adds `reqs·(steps·topk + draft_tokens) + 100` tokens."""
    V0_5_7 = "v0.5.7-v0.5.13"
    """`rest = post − pre·(1−f)`; the EAGLE draft's KV is paid from the slack, not in `cell`."""
    V0_5_14 = "v0.5.14+"
    """As v0.5.7, but an EAGLE-family target adds `int(cell·draft_layers/num_layers)` to `cell`, and
    `post` is measured after the draft weights load."""


_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


def sizing_rule_for(version: str | None) -> SizingRule:
    """The sizing rule of an SGLang version string (`0.5.12.post1`, `v0.4.6`); v0.5.7–v0.5.13 when None."""
    if version is None:
        return SizingRule.V0_5_7
    if is_dev_build(version):
        return SizingRule.V0_5_14  # built from main (`0.0.0.dev1+g<commit>`): today's rule
    match = _VERSION_RE.match(version.strip())
    if not match:
        raise CapacityError(f"cannot read the SGLang version {version!r}; write it like 0.5.12 or v0.4.6.")
    major, minor, patch = int(match[1]), int(match[2]), int(match[3] or 0)
    if (major, minor) < (0, 4):
        raise CapacityError(f"SGLang {version} is older than v0.4, whose pool sizing is not modelled.")
    if (major, minor, patch) <= (0, 5, 6):
        return SizingRule.LEGACY
    if (major, minor, patch) <= (0, 5, 13):
        return SizingRule.V0_5_7
    return SizingRule.V0_5_14


class Speculative(BaseModel, defer_build=True):
    """Speculative decoding as far as it changes the pool or its slack."""

    model_config = ConfigDict(frozen=True)

    algorithm: str
    draft_layers: int = 1
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None

    @property
    def eagle_family(self) -> bool:
        return self.algorithm.upper() in EAGLE_FAMILY


class PoolConfig(BaseModel, defer_build=True):
    """Everything that sizes the pool except memory and `f`."""

    model_config = ConfigDict(frozen=True)

    model: ModelSpec
    tp: int = Field(default=1, ge=1)
    kv_cache_dtype: str = "auto"
    page_size: int = Field(default=1, ge=1)
    max_total_tokens: int | None = Field(default=None, ge=1)
    rule: SizingRule = SizingRule.V0_5_7
    speculative: Speculative | None = None
    max_running_requests: int | None = Field(default=None, ge=1)
    """`--max-running-requests` when set; None means SGLang's default rule."""
    context_length: int | None = Field(default=None, ge=1)
    # The pools of hybrid models (issue 32).
    swa_full_tokens_ratio: float = Field(default=0.8, gt=0, le=1)
    """`--swa-full-tokens-ratio`: sliding-window pool tokens per full-pool token (SGLang's default 0.8)."""
    max_mamba_cache_size: int | None = Field(default=None, ge=1)
    """`--max-mamba-cache-size`: the mamba state slots when set; else SGLang sizes them by the ratio."""
    mamba_full_memory_ratio: float = Field(default=0.9, gt=0, le=1000)
    """`--mamba-full-memory-ratio`: mamba state memory over full KV memory (SGLang's default 0.9)."""
    disable_radix_cache: bool = False
    dsv4_bytes_per_full_token: float | None = Field(default=None, gt=0)
    """DeepSeek-V4's bytes per full token as a boot printed them (`DSv4 memory calculation`)."""
    draft_cell_bytes: int = Field(default=0, ge=0)
    """The draft worker's own KV bytes per token per GPU, from a boot's draft pool line (0: unknown)."""
    mm_reserve_gib: float = Field(default=0.0, ge=0, le=64)
    """GiB a multimodal model's boot keeps out of the KV budget (0.5.19+, `capacity_multimodal`)."""

    @property
    def cell_bytes(self) -> int:
        """KV bytes per token per GPU that SGLang divides the budget by (rounded down for display when
        it is fractional: a sliding-window or DeepSeek-V4 model's)."""
        if self.model.dsv4 or self.model.sliding_window:
            return int(self.cost_per_full_token)
        return self.model_cell_bytes

    @property
    def cost_per_full_token(self) -> float:
        """Bytes of the budget one token of the full (context) pool costs, every pool's share included.

        - DeepSeek-V4: `bytes_per_full_token` (v0.5.12.post1 `model_executor/pool_configurator.py`
          `DSV4PoolConfigurator._get_bytes_per_full_token`), taken from the journal because builds differ.
        - Sliding-window models: `F·n_full + r·S·n_swa` (same file, `HybridSWAPoolConfigurator.__init__`;
          v0.5.9's `set_num_tokens_hybrid_swa` solves the same split), r = `--swa-full-tokens-ratio`.
        - Others: the KV cell (full-attention layers only for hybrid linear-attention models).
        """
        model = self.model
        if model.dsv4:
            if self.dsv4_bytes_per_full_token is None:
                raise CapacityError(
                    "DeepSeek-V4's bytes per full token are not known: give --journal with a boot that printed "
                    "its 'DSv4 memory calculation' line."
                )
            return self.dsv4_bytes_per_full_token
        if model.sliding_window:
            full = model.layer_bytes(tp=self.tp, kv_cache_dtype=self.kv_cache_dtype) * model.num_layers
            swa = model.swa_layer_bytes(tp=self.tp, kv_cache_dtype=self.kv_cache_dtype) * model.swa_layers
            if model.num_layers == 0:
                return float(swa)  # all layers sliding: the ratio does not apply (SGLang's "all SWA")
            return full + self.swa_full_tokens_ratio * swa
        return float(self.model_cell_bytes)

    @property
    def model_cell_bytes(self) -> int:
        cell = self.model.cell_bytes(tp=self.tp, kv_cache_dtype=self.kv_cache_dtype)
        spec = self.speculative
        if self.rule is SizingRule.V0_5_14 and spec is not None and spec.eagle_family:
            cell += int(cell * spec.draft_layers / self.model.num_layers)
        return cell

    @property
    def mamba_bytes_per_slot(self) -> int:
        """One mamba slot on one GPU: SGLang's `mamba_cache_per_req` (0 for a model without a state)."""
        return self.model.state_bytes_per_request(self.tp)

    @property
    def draft_tokens(self) -> int:
        return (self.speculative.num_draft_tokens or 0) if self.speculative else 0


def default_max_running_requests(tokens: int, context_length: int) -> int:
    """SGLang's estimate when `--max-running-requests` is not set: clamp(T/ctx·512, 2048, 4096)."""
    return min(max(int(tokens / max(1, context_length) * 512), 2048), 4096)


def resolve_max_running_requests(tokens: int, cfg: PoolConfig, mamba_slots: int | None = None) -> int:
    """The request slots SGLang will allocate for a pool of `tokens` (`_resolve_max_num_reqs`); a hybrid
    model's mamba slots cap them too, `slots // 3` with the radix cache (each running request keeps
    checkpoints), `slots` without (v0.5.12.post1 `_calculate_mamba_ratio`)."""
    reqs = _resolve_max_running_requests(tokens, cfg)
    if mamba_slots:
        reqs = max(1, min(reqs, mamba_slots // (1 if cfg.disable_radix_cache else MAMBA_SLOTS_PER_REQUEST)))
    return reqs


MAMBA_SLOTS_PER_REQUEST = 3
"""SGLang's `MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO` (radix cache, no extra buffer)."""


def _resolve_max_running_requests(tokens: int, cfg: PoolConfig) -> int:
    estimated = default_max_running_requests(tokens, cfg.context_length or 1)
    user = cfg.max_running_requests
    if cfg.rule is SizingRule.LEGACY:
        return user or estimated
    if cfg.rule is SizingRule.V0_5_14:
        if user:
            return max(1, min(user, tokens // 2))
        return max(1, min(estimated, tokens // 2))
    if user:
        return min(user, estimated)
    return max(1, min(estimated, tokens // 2))


def req_to_token_bytes(max_running_requests: int, context_length: int, draft_tokens: int = 0) -> int:
    """The int32 req_to_token table: `(reqs + 1) · (ctx + 4 + draft_tokens) · 4` bytes, paid from the slack."""
    return (max_running_requests + 1) * (context_length + 4 + draft_tokens) * 4


def _legacy_extra_tokens(t0: int, cfg: PoolConfig) -> int:
    spec = cfg.speculative
    if cfg.rule is not SizingRule.LEGACY or spec is None or not spec.eagle_family:
        return 0
    reqs = cfg.max_running_requests or default_max_running_requests(t0, cfg.context_length or 1)
    return reqs * (spec.num_steps or 0) * (spec.eagle_topk or 1) + reqs * (spec.num_draft_tokens or 0) + 100


class MemoryEstimate(BaseModel, defer_build=True):
    """One consistent view of a GPU: free GiB before (`pre`) and after (`post`) the weights load."""

    model_config = ConfigDict(frozen=True)

    pre_gib: float
    post_gib: float
    label: str = ""

    def slack_gib(self, f: float) -> float:
        return self.pre_gib * (1 - f)


class PoolSizes(BaseModel, defer_build=True):
    """Every pool SGLang sizes from one budget, per GPU."""

    model_config = ConfigDict(frozen=True)

    full_tokens: int
    """`max_total_num_tokens`: the pool a request's whole context lives in."""
    swa_tokens: int | None = None
    mamba_slots: int | None = None
    mamba_gib: float = 0.0
    kv_gib: float = 0.0
    """The KV pools (full and sliding-window, or all of DeepSeek-V4's) the budget left room for."""
    rest_gib: float = 0.0
    """The budget: `post − pre·(1−f)`."""


def pool_sizes(mem: MemoryEstimate, f: float, cfg: PoolConfig) -> PoolSizes:
    """The pools SGLang sizes for this memory and fraction (a full pool of 0 when nothing fits)."""
    rest_gib = mem.post_gib - mem.pre_gib * (1 - f) - cfg.mm_reserve_gib
    if not math.isfinite(rest_gib):
        # Only out-of-range memory gets here (the entry points check theirs); never an OverflowError.
        raise CapacityError(
            f"the memory figures ({mem.pre_gib:g} and {mem.post_gib:g} GiB) are not GPU memory."
        )
    budget = rest_gib
    slots, rest_gib = _mamba_pool(rest_gib, cfg)
    mamba_gib = slots * cfg.mamba_bytes_per_slot / GIB if slots else 0.0
    cost = cfg.cost_per_full_token
    if cfg.model.dsv4:
        # DSV4PoolConfigurator.calculate_pool_sizes: `int(available_bytes / bytes_per_full_token)`.
        t0 = int(int(rest_gib * GIB) / cost)
    elif cfg.model.sliding_window:
        # HybridSWAPoolConfigurator.calculate_pool_sizes: `int(available_bytes // cell_size)`.
        t0 = int(int(rest_gib * GIB) // cost)
    else:
        t0 = int(rest_gib * GIB) // cfg.cell_bytes
    empty = PoolSizes(full_tokens=0, mamba_slots=slots, mamba_gib=mamba_gib, rest_gib=budget)
    if t0 <= 0:
        return empty
    tokens = t0 + _legacy_extra_tokens(t0, cfg)
    page = cfg.page_size
    tokens = tokens // page * page
    if cfg.max_total_tokens is not None:
        tokens = min(tokens, cfg.max_total_tokens // page * page)
    swa: int | None = None
    if cfg.model.sliding_window and cfg.model.num_layers == 0:
        swa = tokens  # all layers sliding: the one pool is the SWA pool
    elif cfg.model.sliding_window or cfg.model.dsv4:
        swa = int(tokens * cfg.swa_full_tokens_ratio) // page * page
    return PoolSizes(
        full_tokens=tokens,
        swa_tokens=swa,
        mamba_slots=slots,
        mamba_gib=mamba_gib,
        kv_gib=tokens * cost / GIB,
        rest_gib=budget,
    )


def _mamba_pool(rest_gib: float, cfg: PoolConfig) -> tuple[int | None, float]:
    """The mamba state slots and what the budget keeps for the KV pool, as SGLang splits them:
    v0.5.9 / v0.5.12.post1 `model_executor/model_runner_kv_cache_mixin.py`
    `ModelRunnerKVCacheMixin.handle_max_mamba_cache` (0.5.23: `mem_cache/kv_cache_configurator.py`
    `KVCacheConfigurator._handle_max_mamba_cache`), called from `_profile_available_bytes` on
    `rest = post − pre·(1−f)` before the KV pool is sized:

    - speculative decoding first reserves `per_req · max_running_requests · num_draft_tokens` for the
      draft's intermediate states;
    - `--max-mamba-cache-size N` gives N slots; with `--disable-radix-cache` and
      `--max-running-requests R`, R slots;
    - otherwise the slots take `rest · r / (1 + r)` (`--mamba-full-memory-ratio` r, default 0.9):
      `int(rest · r/(1+r) · 2^30 // per_req)`;
    - the KV pool gets `rest − slots · per_req`.
    """
    per_req = cfg.mamba_bytes_per_slot
    if not per_req:
        return None, rest_gib
    spec = cfg.speculative
    if spec is not None and cfg.max_running_requests and spec.num_draft_tokens:
        rest_gib -= per_req * cfg.max_running_requests * spec.num_draft_tokens / GIB
    if cfg.max_mamba_cache_size is not None:
        slots = cfg.max_mamba_cache_size
    elif cfg.disable_radix_cache and cfg.max_running_requests is not None:
        slots = cfg.max_running_requests
    else:
        ratio = cfg.mamba_full_memory_ratio
        slots = max(0, int((rest_gib * ratio / (1 + ratio) * GIB) // per_req))
    return slots, rest_gib - slots * per_req / GIB


def pool_tokens(mem: MemoryEstimate, f: float, cfg: PoolConfig) -> int:
    """`max_total_num_tokens` SGLang sizes for this memory and fraction (0 when nothing fits)."""
    return pool_sizes(mem, f, cfg).full_tokens


def headroom_gib(mem: MemoryEstimate, f: float, cfg: PoolConfig, tokens: int | None = None) -> float:
    """What the slack `pre·(1−f)` leaves after the req_to_token table and, before v0.5.14, the draft
    worker's own KV pool: the room for CUDA graphs, activations and the draft model's weights."""
    sizes = pool_sizes(mem, f, cfg)
    if tokens is None:
        tokens = sizes.full_tokens
    table = req_to_token_gib(tokens, cfg, sizes.mamba_slots)
    return mem.slack_gib(f) - table - draft_kv_gib(tokens, cfg)


def draft_kv_gib(tokens: int, cfg: PoolConfig) -> float:
    """The draft worker's KV pool (the target's token count at its own cell) where it is paid from the
    slack: v0.5.7–v0.5.13 allocate it after sizing the target's pool (v0.5.14+ put it in the cell)."""
    if cfg.rule is SizingRule.V0_5_14 or not cfg.draft_cell_bytes:
        return 0.0
    return tokens * cfg.draft_cell_bytes / GIB


def req_to_token_gib(tokens: int, cfg: PoolConfig, mamba_slots: int | None = None) -> float:
    ctx = cfg.context_length or 1
    reqs = resolve_max_running_requests(max(tokens, 1), cfg, mamba_slots)
    return req_to_token_bytes(reqs, ctx, cfg.draft_tokens) / GIB


class Observation(BaseModel, defer_build=True):
    """What one boot showed: its pool and, when the lines were there, the memory around the weights."""

    model_config = ConfigDict(frozen=True)

    tokens: int | None = None
    mem_fraction_static: float | None = None
    pre_gib: float | None = None
    post_gib: float | None = None
    capped: bool = False
    """The pool was clamped by `--max-total-tokens`: its size says nothing about memory."""
    available_gpu_mem_gb: float | None = None
    config: PoolConfig | None = None
    """The configuration the boot ran with; None means the same as the one planned for."""
    label: str = ""

    @field_validator("mem_fraction_static")
    @classmethod
    def _fraction(cls, value: float | None) -> float | None:
        if value is not None and not 0 < value < 1:
            raise ValueError("mem_fraction_static must lie strictly between 0 and 1")
        return value


class Calibration(BaseModel, defer_build=True):
    """The memory views consistent with the journal; predictions take the most pessimistic one."""

    model_config = ConfigDict(frozen=True)

    kind: CalibrationKind
    scenarios: tuple[MemoryEstimate, ...] = ()
    assumptions: tuple[str, ...] = ()
    reference: Observation | None = None
    """The observation the calibration leans on (for the sanity note and the overhead estimate)."""

    def predict(self, f: float, cfg: PoolConfig) -> int | None:
        if not self.scenarios:
            return None
        return min(pool_tokens(mem, f, cfg) for mem in self.scenarios)

    def headroom(self, f: float, cfg: PoolConfig) -> float | None:
        if not self.scenarios:
            return None
        return min(headroom_gib(mem, f, cfg) for mem in self.scenarios)

    @property
    def pre_range_gib(self) -> tuple[float, float] | None:
        if not self.scenarios:
            return None
        pres = [m.pre_gib for m in self.scenarios]
        return min(pres), max(pres)


def _rest_gib(obs: Observation, cfg: PoolConfig) -> float:
    """The unrounded `rest` (GiB) behind an observed pool size, in the boot's own configuration. The
    floor and the page rounding hid up to one page, so the middle of that page is taken (the prediction
    at the observed `f` is then the observed size again). A hybrid model's mamba share is added back."""
    tokens = obs.tokens or 0
    t0 = tokens - _legacy_extra_tokens(tokens, cfg)
    # The multimodal reservation came out of the budget before the pools: it is part of `rest` here.
    kv = (t0 + cfg.page_size / 2) * cfg.cost_per_full_token / GIB + cfg.mm_reserve_gib
    per_req = cfg.mamba_bytes_per_slot
    if not per_req:
        return kv
    if cfg.max_mamba_cache_size is not None:
        return kv + cfg.max_mamba_cache_size * per_req / GIB
    if cfg.disable_radix_cache and cfg.max_running_requests is not None:
        return kv + cfg.max_running_requests * per_req / GIB
    # The slots took r/(1+r) of the budget after the reservation, the KV pool the rest: 1/(1+r).
    return (kv - cfg.mm_reserve_gib) * (1 + cfg.mamba_full_memory_ratio) + cfg.mm_reserve_gib


def calibrate(
    observations: Sequence[Observation],
    cfg: PoolConfig,
    *,
    gpu_mem_gib: float | None = None,
    band: tuple[float, float] = DEFAULT_BAND,
) -> Calibration:
    """The best calibration the observations allow (oldest first): exact > two_point > band > none.

    Each observation is read in the configuration its boot ran with (`Observation.config`, else `cfg`);
    the result is memory (`pre`, `post`), so it predicts for any other configuration: another KV dtype,
    page size or TP size."""
    if gpu_mem_gib is not None:
        check_range("--gpu-mem-gib", gpu_mem_gib, 0, MAX_GPU_MEM_GIB, "GiB", above_lo=True)
    for obs in observations:
        for what, gib in (("free memory before the weights", obs.pre_gib), ("after them", obs.post_gib)):
            if gib is not None and not in_range(gib, 0, MAX_GPU_MEM_GIB):
                raise CapacityError(
                    f"{obs.label or 'a boot'} shows {gib:g} GiB of {what}, which is no GPU's memory "
                    f"({range_text(0, MAX_GPU_MEM_GIB, 'GiB')})."
                )
    for obs in reversed(observations):
        if obs.pre_gib is not None and obs.post_gib is not None:
            return Calibration(
                kind="exact",
                scenarios=(MemoryEstimate(pre_gib=obs.pre_gib, post_gib=obs.post_gib, label="measured"),),
                assumptions=(
                    f"pre={obs.pre_gib:.2f} GiB and post={obs.post_gib:.2f} GiB are the least free memory "
                    "over the ranks at 'Load weight begin' and 'Load weight end'.",
                ),
                reference=obs,
            )

    usable = [o for o in observations if o.tokens and o.mem_fraction_static is not None and not o.capped]
    fractions = {round(o.mem_fraction_static or 0, 6) for o in usable}
    if len(fractions) >= 2:
        # rest = post − pre·(1−f) = pre·f + (post − pre): a line in f whose slope is pre.
        xs = [o.mem_fraction_static or 0.0 for o in usable]
        ys = [_rest_gib(o, o.config or cfg) for o in usable]
        n = len(xs)
        mx, my = sum(xs) / n, sum(ys) / n
        pre = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
        if pre <= 0:
            raise CapacityError("the boots in the journal show a pool that shrinks as the fraction grows.")
        post = my - pre * mx + pre
        slope = pre * GIB / cfg.cell_bytes
        return Calibration(
            kind="two_point",
            scenarios=(MemoryEstimate(pre_gib=pre, post_gib=post, label="fitted"),),
            assumptions=(
                f"fitted on {n} boots at fractions {', '.join(f'{x:g}' for x in sorted(set(xs)))}: "
                f"pre={pre:.2f} GiB, post={post:.2f} GiB, so T = {slope:,.0f}·f "
                f"− {slope * (1 - post / pre):,.0f} tokens at {cfg.cell_bytes:,} B/token.",
            ),
            reference=usable[-1],
        )

    if usable and gpu_mem_gib is not None:
        obs = usable[-1]
        f0 = obs.mem_fraction_static or 0.0
        rest0 = _rest_gib(obs, obs.config or cfg)
        lo, hi = band
        scenarios = tuple(
            MemoryEstimate(
                pre_gib=share * gpu_mem_gib, post_gib=rest0 + share * gpu_mem_gib * (1 - f0), label=label
            )
            for share, label in ((lo, "pessimistic"), (hi, "optimistic"))
        )
        return Calibration(
            kind="band",
            scenarios=scenarios,
            assumptions=(
                f"one boot (f={f0:g}, {obs.tokens:,} tokens) and no weight-load lines: pre is assumed between "
                f"{lo:.0%} and {hi:.0%} of the {gpu_mem_gib:.2f} GiB card; the plan takes the pessimistic end.",
            ),
            reference=obs,
        )
    return Calibration(kind="none")


def observation_from_boot(
    boot: Boot, mem_fraction_static: float | None = None, config: PoolConfig | None = None
) -> Observation:
    """What a boot tells the capacity model; `mem_fraction_static` stands in when the boot has no dump,
    `config` is the configuration the boot ran with (its cell bytes, page size, speculative decoding)."""
    f = boot.mem_fraction_static if boot.mem_fraction_static is not None else mem_fraction_static
    tokens = boot.pool.tokens
    cap = boot.arg("max_total_tokens")
    page = boot.arg("page_size")
    page = page if isinstance(page, int) and page > 0 else 1
    capped = boot.pool.clamped_from is not None or (
        isinstance(cap, int) and tokens is not None and tokens >= cap // page * page
    )
    return Observation(
        tokens=tokens,
        mem_fraction_static=f,
        pre_gib=boot.pre_gib,
        post_gib=boot.post_gib,
        capped=capped,
        available_gpu_mem_gb=boot.pool.available_gpu_mem_gb,
        config=config,
        label=f"boot {boot.index}",
    )
