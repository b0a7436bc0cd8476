"""The planning brain: from words (the command line, a profile, a journal's `server_args` dump) to the
pool configuration the capacity model sizes, the speculative setup, the boots' observations, and the
planner's verdict on a profile. `plan`, `apply`, `profiles validate`, the profile editor and `verify`
(through the one token-count reader) all come here, so they cannot disagree on what a flag means.

A profile is a whole argv: a flag it leaves out is SGLang's default, never what the host runs now. Without
a profile, `plan` starts from the journal's latest boot and changes what the command line names.
A boot is always read by its own dump (a proposal's fp8 KV cache must not change how an old bf16 boot's
pool is read).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from console.core.capacity import (
    DEFAULT_MIN_HEADROOM_GIB,
    GIB,
    MAX_GPU_MEM_GIB,
    MAX_PAGE_SIZE,
    MAX_RUNNING_REQUESTS,
    MAX_TOKENS,
    MAX_TP,
    CapacityError,
    Observation,
    PoolConfig,
    Speculative,
    calibrate,
    in_range,
    observation_from_boot,
    range_text,
    sizing_rule_for,
)
from console.core.capacity_multimodal import mm_reserve_gib, reservation_gib
from console.core.capacity_plan import Plan, plan
from console.core.flags import FlagList, UnknownVersion, load_flag_list
from console.core.models import ModelConfigError, ModelSpec, find_model, get_model
from console.core.profiles import Profile
from console.core.state import Boot
from console.core.text import terminal_safe
from console.core.token_count import TokenCountError, read_token_count

Kind = Literal["tokens", "int", "float", "str"]

_SYNONYMS = {
    "tensor_parallel_size": "tp_size",
    "tp": "tp_size",
    "model": "model_path",
    "model_name": "model_path",
}
"""Other names of the same setting: the flag list's dest for `--tp-size`, a profile's short spellings."""

_LIMITS: dict[str, tuple[float, float, str, bool]] = {
    # name: (low, high, unit, low excluded): what a value from any source must respect
    "tp_size": (1, MAX_TP, "", False),
    "page_size": (1, MAX_PAGE_SIZE, "tokens", False),
    "max_total_tokens": (1, MAX_TOKENS, "tokens", False),
    "max_running_requests": (1, MAX_RUNNING_REQUESTS, "", False),
    "context_length": (1, MAX_TOKENS, "tokens", False),
    "gpu_mem_gib": (0, MAX_GPU_MEM_GIB, "GiB", True),
    "speculative_num_steps": (0, 1 << 16, "", False),
    "speculative_eagle_topk": (0, 1 << 16, "", False),
    "speculative_num_draft_tokens": (0, 1 << 16, "", False),
    "swa_full_tokens_ratio": (0, 1, "", True),
    "mamba_full_memory_ratio": (0, 1000, "", True),
    "max_mamba_cache_size": (1, 1 << 24, "slots", False),
}

_KINDS: dict[str, Kind] = {
    "tp_size": "int",
    "page_size": "int",
    "max_running_requests": "int",
    "speculative_num_steps": "int",
    "speculative_eagle_topk": "int",
    "speculative_num_draft_tokens": "int",
    "max_total_tokens": "tokens",
    "context_length": "tokens",
    "mem_fraction_static": "float",
    "gpu_mem_gib": "float",
    "swa_full_tokens_ratio": "float",
    "mamba_full_memory_ratio": "float",
    "max_mamba_cache_size": "int",
}
"""How each setting the planner reads is spelled; anything else is a word (a dtype, an algorithm, a path)."""


class PlanInputError(CapacityError):
    """A value the planner cannot use, named with where it came from; one sentence."""


class FlagSource(BaseModel, defer_build=True):
    """Flag values from one place, keyed the way SGLang's ServerArgs names them (`tp_size`)."""

    where: str
    """`the command line`, `the profile`, `the journal`: said in an error message."""
    values: dict[str, Any] = Field(default_factory=dict)
    observed: bool = False
    """A boot's own dump: what ran, not what is proposed (its context length is not the plan's)."""


def _name(key: str) -> str:
    name = key.removeprefix("--").replace("-", "_")
    return _SYNONYMS.get(name, name)


def command_line_source(values: Mapping[str, Any]) -> FlagSource:
    """The flags given on the command line (None for those not given)."""
    return FlagSource(
        where="the command line", values={_name(k): v for k, v in values.items() if v is not None}
    )


def profile_source(profile: Profile, flag_list: FlagList | None = None) -> FlagSource:
    """A profile's flags under ServerArgs names, aliases and abbreviations resolved as SGLang's parser
    resolves them (`tp = 8` is `tp_size`). A key the flag list does not know keeps its own name."""
    if flag_list is None:
        try:
            flag_list = load_flag_list(profile.sglang_version)
        except UnknownVersion:
            flag_list = None
    values: dict[str, Any] = {}
    for key, value in profile.flags.items():
        name = _name(key)
        if flag_list is not None:
            try:
                spec = flag_list.resolve("--" + key.removeprefix("--")).spec
            except ValueError:
                spec = None
            if spec is not None:
                name = _name(spec.target)
        values[name] = value
    return FlagSource(where=f"the profile {profile.name}", values=values)


def boot_source(boot: Boot) -> FlagSource:
    return FlagSource(
        where=f"the journal's boot {boot.index}",
        values={_name(k): v for k, v in (boot.server_args or {}).items()},
        observed=True,
    )


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return terminal_safe(text[:40] + ("…" if len(text) > 40 else ""))


def _convert(name: str, value: Any, where: str) -> Any:
    """`value` as the planner reads `name`, within its sane range; PlanInputError otherwise."""
    kind = _KINDS.get(name, "str")
    said = f"{name} in {where}"
    if kind == "str":
        return str(value)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise PlanInputError(f"{said} is {_shown(value)}, not a number.")
    number: int | float
    if kind == "tokens" and isinstance(value, str):
        try:
            number = read_token_count(value)
        except TokenCountError as exc:
            raise PlanInputError(f"{said}: {exc}.") from None
    elif kind == "float":
        try:
            number = float(value)
        except (ValueError, OverflowError):
            raise PlanInputError(f"{said} is {_shown(value)}, not a number.") from None
    else:
        number = _whole(value, said)
    if isinstance(number, float) and not math.isfinite(number):
        raise PlanInputError(f"{said} is {_shown(value)}, not a finite number.")
    if name == "mem_fraction_static" and not 0 < number < 1:
        raise PlanInputError(f"{said} must lie strictly between 0 and 1, not {_shown(value)}.")
    limits = _LIMITS.get(name)
    if limits is not None:
        lo, hi, unit, above_lo = limits
        if not in_range(number, lo, hi, above_lo=above_lo):
            raise PlanInputError(
                f"{said} must be {range_text(lo, hi, unit, above_lo=above_lo)}, not {_shown(value)}."
            )
    return number


def _whole(value: int | float | str, said: str) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        if len(value) > 40:  # int() of thousands of digits is slow
            raise PlanInputError(f"{said} is {_shown(value)}, not a whole number.")
        try:
            return int(value.strip())
        except ValueError:
            pass
        try:
            value = float(value)
        except ValueError:
            raise PlanInputError(f"{said} is {_shown(value)}, not a whole number.") from None
    if not math.isfinite(value) or not value.is_integer():
        raise PlanInputError(f"{said} is {_shown(value)}, not a whole number.")
    return int(value)


def pick(name: str, sources: Sequence[FlagSource]) -> Any:
    """The value of `name` from the first source that sets it (None when none does), read and checked
    the same way whichever source it came from."""
    for source in sources:
        value = source.values.get(name)
        if value is not None:
            return _convert(name, value, source.where)
    return None


def pick_flag(name: str, sources: Sequence[FlagSource]) -> bool:
    """A store-true flag (`--disable-radix-cache`) from the first source that names it."""
    for source in sources:
        value = source.values.get(name)
        if value is not None:
            return value is True or (
                isinstance(value, str) and value.strip().lower() in ("", "1", "true", "yes")
            )
    return False


def _pool_flags(sources: Sequence[FlagSource]) -> dict[str, Any]:
    """The flags that split a hybrid model's budget between its pools, as the sources set them."""
    flags: dict[str, Any] = {
        "max_mamba_cache_size": pick("max_mamba_cache_size", sources),
        "disable_radix_cache": pick_flag("disable_radix_cache", sources),
    }
    for name in ("swa_full_tokens_ratio", "mamba_full_memory_ratio"):
        value = pick(name, sources)
        if value is not None:
            flags[name] = value
    return flags


def catalogue_model(word: str | None) -> ModelSpec | None:
    """The catalogue entry a `--model-path` (`org/name`, a local path) or a short name names, if any."""
    if not word:
        return None
    found = find_model(word)
    if found is not None:
        return found
    try:
        return get_model(word)
    except ModelConfigError:
        return None


def resolve_model(
    sources: Sequence[FlagSource],
    *,
    named: str | None = None,
    boots: Sequence[Boot] = (),
    how_to_name: str = "name the model with --model NAME or --model-config config.json",
) -> ModelSpec:
    """The model: `named` (a catalogue name: `--model`, a host's `model =`), else the sources'
    `--model-path`, else the newest boot whose dump names a catalogue model."""
    if named:
        return get_model(named)
    path = pick("model_path", sources)
    found = catalogue_model(path)
    if found is not None:
        return found
    for boot in reversed(boots):
        arg = boot.arg("model_path")
        found = catalogue_model(arg if isinstance(arg, str) else None)
        if found is not None:
            return found
    hint = f" ({terminal_safe(path)} is not in the catalogue)" if path else ""
    raise ModelConfigError(f"{how_to_name}{hint}.")


def speculative_setup(sources: Sequence[FlagSource], model: ModelSpec) -> Speculative | None:
    algorithm = pick("speculative_algorithm", sources)
    if not algorithm or algorithm == "None":
        return None
    return Speculative(
        algorithm=algorithm,
        draft_layers=(model.nextn_layers or 1) if algorithm.upper() == "NEXTN" else 1,
        num_steps=pick("speculative_num_steps", sources),
        eagle_topk=pick("speculative_eagle_topk", sources),
        num_draft_tokens=pick("speculative_num_draft_tokens", sources),
    )


def pool_config(
    model: ModelSpec, sources: Sequence[FlagSource], *, sglang_version: str | None, target_context: int
) -> PoolConfig:
    """The configuration a restart with these flags would size: the first source that sets a flag wins.
    The context length is the proposal's `--context-length`, else the target (never an old boot's)."""
    proposed = [s for s in sources if not s.observed]
    cfg = PoolConfig(
        model=model,
        tp=pick("tp_size", sources) or 1,
        kv_cache_dtype=pick("kv_cache_dtype", sources) or "auto",
        page_size=pick("page_size", sources) or 1,
        max_total_tokens=pick("max_total_tokens", sources),
        rule=sizing_rule_for(sglang_version),
        speculative=speculative_setup(sources, model),
        max_running_requests=pick("max_running_requests", sources),
        context_length=pick("context_length", proposed) or target_context,
        mm_reserve_gib=mm_reserve_gib(
            model.architectures, sglang_version, pick("mm_feature_transport", sources)
        ),
        **_pool_flags(sources),
    )
    model.kv_element_bytes(cfg.kv_cache_dtype)  # an unknown dtype is refused here, in one sentence
    return cfg


def _from_boot(boot: Boot, cfg: PoolConfig) -> dict[str, Any]:
    """What a boot's own lines say of costs its flags cannot: DeepSeek-V4's bytes per full token, and
    the draft worker's KV bytes per token (its pool's GiB over its tokens)."""
    update: dict[str, Any] = {}
    pool = boot.pool
    if cfg.model.dsv4 and pool.dsv4_bytes_per_full_token:
        update["dsv4_bytes_per_full_token"] = pool.dsv4_bytes_per_full_token
    if cfg.speculative is not None and pool.draft_kv_gb and pool.draft_kv_tokens:
        update["draft_cell_bytes"] = int(pool.draft_kv_gb * GIB / pool.draft_kv_tokens)
    return update


def boot_config(boot: Boot, planned: PoolConfig) -> PoolConfig:
    """The configuration a boot ran with, from its own dump. Without a dump only the TP size of the plan
    is carried over (the pool's cell bytes per GPU depend on it for MHA models)."""
    ran = [boot_source(boot)]
    return PoolConfig(
        model=planned.model,
        tp=pick("tp_size", ran) or planned.tp,
        kv_cache_dtype=pick("kv_cache_dtype", ran) or "auto",
        # SGLang forces DeepSeek-V4's page (compressed attention: 256 on CUDA/ROCm): a boot without a
        # dump ran with the plan's.
        page_size=pick("page_size", ran) or (planned.page_size if planned.model.dsv4 else 1),
        max_total_tokens=pick("max_total_tokens", ran),
        rule=planned.rule,
        speculative=speculative_setup(ran, planned.model),
        max_running_requests=boot.pool.max_running_requests or pick("max_running_requests", ran),
        context_length=boot.pool.context_len or pick("context_length", ran),
        mm_reserve_gib=_boot_mm_reserve(boot, planned),
        **_pool_flags(ran),
    ).model_copy(update=_from_boot(boot, planned))


def _boot_mm_reserve(boot: Boot, planned: PoolConfig) -> float:
    """The multimodal reservation of a boot: the plan's version decides whether there is one (a boot's
    journal does not name its version), the boot's own `--mm-feature-transport` how large."""
    if not planned.mm_reserve_gib:
        return 0.0
    transport = pick("mm_feature_transport", [boot_source(boot)])
    return reservation_gib(planned.model.architectures, transport)


def sized(boot: Boot) -> bool:
    """The boot showed its pool or its memory before the weights: something to calibrate on."""
    return boot.pool.tokens is not None or boot.pre_gib is not None


def latest_sized(boots: Sequence[Boot]) -> Boot | None:
    return next((b for b in reversed(boots) if sized(b)), None)


def observations(
    boots: Sequence[Boot], planned: PoolConfig, *, latest_fraction: float | None = None
) -> list[Observation]:
    """What each sized boot tells the capacity model, read by its own configuration; `latest_fraction`
    is the fraction the latest sized boot ran with when its journal shows no dump."""
    latest = latest_sized(boots)
    return [
        observation_from_boot(b, latest_fraction if b is latest else None, boot_config(b, planned))
        for b in boots
        if sized(b)
    ]


def plan_restart(
    target_context: int,
    sources: Sequence[FlagSource],
    boots: Sequence[Boot],
    *,
    model: ModelSpec,
    sglang_version: str | None,
    latest_fraction: float | None = None,
    gpu_mem_gib: float | None = None,
    min_headroom_gib: float = DEFAULT_MIN_HEADROOM_GIB,
) -> Plan:
    """The capacity plan for a restart with `sources`' flags, calibrated on `boots` (oldest first). The
    fraction is the sources' `--mem-fraction-static`, else the one the calibrating boot ran with."""
    cfg = pool_config(model, sources, sglang_version=sglang_version, target_context=target_context)
    latest = latest_sized(boots)
    if latest is not None:
        cfg = cfg.model_copy(update=_from_boot(latest, cfg))
    fraction = pick("mem_fraction_static", [s for s in sources if not s.observed])
    calibration = calibrate(
        observations(boots, cfg, latest_fraction=latest_fraction), cfg, gpu_mem_gib=gpu_mem_gib
    )
    if fraction is None and calibration.reference is not None:
        fraction = calibration.reference.mem_fraction_static
    result = plan(
        target_context, cfg, calibration, mem_fraction_static=fraction, min_headroom_gib=min_headroom_gib
    )
    if sglang_version is None:
        result.assumptions.append("SGLang v0.5.7-v0.5.13 sizing (give --sglang-version for another release).")
    return result


# --------------------------------------------------------------------------------------------------
# The planner's verdict on a profile (apply, `profiles validate`, the profile editor)
# --------------------------------------------------------------------------------------------------


class PlannerVerdict(BaseModel, defer_build=True):
    """The capacity planner on a profile, calibrated on the host's own boots."""

    checked: bool
    """False when the planner could not judge (no model, no boot to calibrate on, no fraction)."""
    fits: bool | None = None
    target_context: int
    mem_fraction_static: float | None = None
    predicted_pool_tokens: int | None = None
    headroom_gib: float | None = None
    min_headroom_gib: float = DEFAULT_MIN_HEADROOM_GIB
    calibration: str = "none"
    model: str | None = None
    recommended_mem_fraction_static: float | None = None
    reasons: list[str] = Field(default_factory=list)
    """Why it refuses, or why it could not check."""

    def summary(self) -> str:
        if not self.checked:
            return "planner: not checked (" + "; ".join(self.reasons) + ")."
        pool = f"{self.predicted_pool_tokens:,}" if self.predicted_pool_tokens is not None else "?"
        room = f"{self.headroom_gib:.2f}" if self.headroom_gib is not None else "?"
        head = (
            f"planner ({self.calibration} calibration): at --mem-fraction-static {self.mem_fraction_static:g} "
            f"the pool is predicted at {pool} tokens (target {self.target_context:,}) with {room} GiB of "
            f"headroom (floor {self.min_headroom_gib:g} GiB)"
        )
        if self.fits:
            return head + ": fits."
        return head + ": refused: " + " ".join(self.reasons)


def planner_verdict(
    profile: Profile,
    flag_list: FlagList,
    boots: Sequence[Boot],
    *,
    model: str | None = None,
    min_headroom_gib: float = DEFAULT_MIN_HEADROOM_GIB,
) -> PlannerVerdict:
    """Does the profile fit, calibrated on `boots` (the host's journal, oldest first) as `plan` sizes it?
    `model` is the host's catalogue name when hosts.toml gives one."""
    out = PlannerVerdict(
        checked=False, target_context=profile.target_context, min_headroom_gib=min_headroom_gib
    )
    source = profile_source(profile, flag_list)
    try:
        f = pick("mem_fraction_static", [source])
    except PlanInputError:
        f = None
    out.mem_fraction_static = f
    if f is None or not 0 < f < 1:
        out.reasons.append(
            "the profile sets no --mem-fraction-static between 0 and 1, so SGLang picks one itself"
        )
        return out
    try:
        spec = resolve_model(
            [source],
            named=model,
            boots=boots,
            how_to_name='the model is not in the capacity catalogue; name it with model = "..." for this host '
            "in hosts.toml",
        )
    except ModelConfigError as exc:
        out.reasons.append(str(exc).rstrip("."))
        return out
    out.model = spec.name
    try:
        result = plan_restart(
            profile.target_context,
            [source],
            boots,
            model=spec,
            sglang_version=profile.sglang_version,
            min_headroom_gib=min_headroom_gib,
        )
    except (CapacityError, ModelConfigError, ValueError) as exc:
        out.reasons.append(f"the planner cannot size this profile: {str(exc).splitlines()[0].rstrip('.')}")
        return out
    out.calibration = result.calibration
    if result.calibration == "none" or result.predicted_max_total_num_tokens is None:
        out.reasons.append("the host's journal shows no boot that sized its KV pool to calibrate on")
        return out
    out.checked = True
    out.predicted_pool_tokens = result.predicted_max_total_num_tokens
    out.headroom_gib = result.headroom_gib
    out.recommended_mem_fraction_static = result.recommended_mem_fraction_static
    tokens, room = out.predicted_pool_tokens, out.headroom_gib or 0.0
    if tokens < profile.target_context:
        out.reasons.append(
            f"at --mem-fraction-static {f:g} the pool is predicted at {tokens:,} tokens, "
            f"{profile.target_context - tokens:,} short of the {profile.target_context:,} target."
        )
    if room < min_headroom_gib:
        out.reasons.append(
            f"--mem-fraction-static {f:g} leaves {room:.2f} GiB of headroom, under the {min_headroom_gib:g} GiB "
            "that CUDA graphs, activations and the draft model need: the server would likely run out of memory."
        )
    if out.reasons and result.recommended_mem_fraction_static is not None:
        out.reasons.append(
            f"--mem-fraction-static {result.recommended_mem_fraction_static:g} reaches the target with "
            f"{result.headroom_gib_at_recommended:.2f} GiB of headroom."
        )
    out.fits = not out.reasons
    return out


__all__ = [
    "FlagSource",
    "PlanInputError",
    "PlannerVerdict",
    "boot_config",
    "boot_source",
    "catalogue_model",
    "command_line_source",
    "latest_sized",
    "observations",
    "pick",
    "plan_restart",
    "planner_verdict",
    "pool_config",
    "profile_source",
    "resolve_model",
    "sized",
    "speculative_setup",
]
