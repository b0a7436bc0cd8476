"""The pure half of `apply`: the planner's verdict on a profile, the argv a host will run, the post-restart
verdict, and the models the service controller reports with. No I/O (sources/service does the work).

The argv a host runs is the profile's, with two things the host decides rather than the profile:

- a bare program name (`python3`, the shipped profiles' spelling) means "this host's python": when the
  unit runs the same module (`-m sglang.launch_server`) with an interpreter of its own (a venv's
  `/opt/sglang/bin/python3`), that interpreter is kept. An absolute path in a profile is used as written.
- `--host` and `--port` stay as the unit has them: the console, its tunnel and anything in front of the
  server reach it there (`server_url` in hosts.toml), so a profile written for another host cannot move it.
Both are said in the preview when they change what the profile asked for.
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from console.core.capacity import (
    DEFAULT_MIN_HEADROOM_GIB,
    CapacityError,
    PoolConfig,
    Speculative,
    calibrate,
    observation_from_boot,
    plan,
    sizing_rule_for,
)
from console.core.confirm import PendingRollback
from console.core.events import Error
from console.core.flags import (
    FlagList,
    UnknownVersion,
    human_readable_int,
    load_flag_list,
    parse_argv,
    split_command,
)
from console.core.models import ModelConfigError, ModelSpec, find_model, get_model
from console.core.profiles import Profile, canonical_flags, diff_against_argv
from console.core.state import Boot

HOST_BOUND_FLAGS = ("--host", "--port")
"""Flags whose value the host's unit keeps (see the module docstring)."""

DEFAULT_MIN_FREE_GIB = 1.0
"""Least GPU memory left free at ready for a restart to verify: what long prefills' activations need once
CUDA graphs are captured (the planner's 3 GiB floor is the slack *before* the graphs take theirs)."""


# --------------------------------------------------------------------------------------------------
# Models the controller reports with (the API of sources/service)
# --------------------------------------------------------------------------------------------------


class ApplyProgress(BaseModel):
    """Sent to a callback as the apply goes: one per phase change."""

    phase: str
    """A console.core.restart.Phase value."""
    label: str
    message: str | None = None
    elapsed_s: float
    durations: dict[str, float] = Field(default_factory=dict)
    """Phase → seconds so far (the open phase counts up to now)."""
    eta_s: float | None = None
    purpose: Literal["apply", "rollback"] = "apply"


class PlannerVerdict(BaseModel):
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


class ApplyPreview(BaseModel):
    """Everything decided before the host is touched."""

    profile: str
    host: str = ""
    unit: str = ""
    ok: bool
    """Validation and the planner allow it (without force)."""
    valid: bool = True
    """The flags are valid for the profile's SGLang version (a planner refusal can be forced; this cannot)."""
    planner_refused: bool = False
    errors: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    diff: list[str] = Field(default_factory=list)
    """Human diff lines against the running ExecStart; empty when the unit already runs this argv."""
    predicted_pool_tokens: int | None = None
    headroom_gib: float | None = None
    fits: bool | None = None
    planner: PlannerVerdict | None = None
    running_argv: list[str] = Field(default_factory=list)
    new_argv: list[str] = Field(default_factory=list)
    dropin_path: str = ""
    program_changed: bool = False
    """The unit would run another program (the words before the flags differ, e.g. `/bin/sh -c …` for
    `python3 -m sglang.launch_server`): confirmed only by typing the profile's name, or with --yes."""

    @property
    def unchanged(self) -> bool:
        return self.running_argv == self.new_argv

    @property
    def needs_name(self) -> bool:
        """A yes is not enough: the operator types the profile's name (or passes --yes)."""
        return self.planner_refused or self.program_changed


class ApplyOutcome(BaseModel):
    ok: bool
    """The verification held."""
    profile: str
    summary: str
    """One line for the operator."""
    outcome: str = ""
    """The RestartMachine outcome: verified, not_verified, failed, refused, unchanged."""
    pool_tokens: int | None = None
    headroom_gib: float | None = None
    """GPU memory free at ready (GiB), as the server reported it."""
    durations: dict[str, float] = Field(default_factory=dict)
    total_s: float = 0.0
    reasons: list[str] = Field(default_factory=list)
    diff: list[str] = Field(default_factory=list)
    recorded_in: str | None = None
    """The profile file the verified numbers went into."""
    rolled_back: bool = False
    rollback: ApplyOutcome | None = None
    pending_rollback: PendingRollback | None = None
    """A host-side rollback still armed when the apply ended (commit-confirmed, not confirmed)."""


# --------------------------------------------------------------------------------------------------
# The post-restart verdict (shared with `verify`)
# --------------------------------------------------------------------------------------------------


class Verdict(BaseModel):
    """The `verify --json` contract."""

    ok: bool
    max_total_num_tokens: int | None
    target_context: int
    ready: bool
    errors: list[dict[str, Any]] = Field(default_factory=list)
    stale_errors: list[dict[str, Any]] = Field(default_factory=list)
    available_gpu_mem_gb: float | None = None
    phase: str
    boot_index: int
    boots: int
    reasons: list[str] = Field(default_factory=list)
    summary: str = ""


def _error_dict(error: Error, boot: Boot) -> dict[str, Any]:
    return {
        "boot": boot.index,
        "ts": error.ts,
        "rank": f"TP{error.tp_rank}" if error.tp_rank is not None else None,
        "category": error.category,
        "message": error.message,
    }


def judge(boots: list[Boot], target: int) -> Verdict:
    """The verdict for the latest boot; errors of earlier boots are stale and do not fail it."""
    boot = boots[-1]
    tokens = boot.pool.tokens
    reasons: list[str] = []
    if tokens is None:
        reasons.append("the latest boot has not sized its KV pool yet")
    elif tokens < target:
        reasons.append(
            f"the pool holds {tokens:,} tokens, {target - tokens:,} short of the {target:,} target "
            "(raise --mem-fraction-static; --context-length alone does not grow the pool)"
        )
    if boot.ended:
        reasons.append(f"the server {boot.phase} after this boot's start")
    elif not boot.ready:
        reasons.append(f"the server is not ready (it got as far as: {boot.phase})")
    if boot.errors:
        first = boot.errors[0]
        more = f" and {len(boot.errors) - 1} more" if len(boot.errors) > 1 else ""
        reasons.append(
            f"{len(boot.errors)} error(s) since this boot, first {first.category}: {first.message}{more}"
        )
    stale = [_error_dict(e, b) for b in boots[:-1] for e in b.errors]
    room = boot.pool.available_gpu_mem_gb
    if reasons:
        summary = "not ok: " + "; ".join(reasons) + "."
    else:
        parts = [
            f"ok: the pool holds {tokens:,} tokens (target {target:,})",
            "the server is ready",
            "no errors since this boot",
        ]
        if room is not None:
            parts.append(f"{room:.2f} GiB free at ready")
        if stale:
            parts.append(f"{len(stale)} stale error(s) from earlier boots ignored")
        summary = ", ".join(parts) + "."
    return Verdict(
        ok=not reasons,
        max_total_num_tokens=tokens,
        target_context=target,
        ready=boot.ready,
        errors=[_error_dict(e, boot) for e in boot.errors],
        stale_errors=stale,
        available_gpu_mem_gb=room,
        phase=boot.phase,
        boot_index=boot.index,
        boots=len(boots),
        reasons=reasons,
        summary=summary,
    )


# --------------------------------------------------------------------------------------------------
# The argv the host will run
# --------------------------------------------------------------------------------------------------


def _flag_key(profile: Profile, flag_list: FlagList, option: str) -> str | None:
    """The profile key that sets `option` (any alias or abbreviation), if any."""
    for key in profile.flags:
        try:
            res = flag_list.resolve("--" + key.removeprefix("--"))
        except ValueError:
            continue
        if res.spec is not None and res.spec.flag == option:
            return key
    return None


def profile_differences(profile: Profile, running_argv: Sequence[str]) -> tuple[str, ...] | None:
    """How the running argv differs from what `apply` would write for `profile` (the diff lines; empty
    when the unit runs it), or None when the profile's SGLang version has no flag list to judge by.
    A probe's results belong to a profile only when this is empty."""
    try:
        flag_list = load_flag_list(profile.sglang_version)
    except UnknownVersion:
        return None
    hosted, _ = host_profile(profile, flag_list, running_argv)
    return tuple(diff_against_argv(running_argv, hosted, flag_list).lines())


def why_not_running(profile: Profile, running_argv: Sequence[str]) -> str | None:
    """None when the unit runs `profile` as `apply` writes it; otherwise why not, in words."""
    diff = profile_differences(profile, running_argv)
    if diff is None:
        return f"{profile.name} names an SGLang version without a flag list"
    if diff:
        shown = "; ".join(diff[:3]) + (f"; and {len(diff) - 3} more" if len(diff) > 3 else "")
        return f"the unit runs other flags than {profile.name} ({shown})"
    return None


def host_profile(profile: Profile, flag_list: FlagList, running: Sequence[str]) -> tuple[Profile, list[str]]:
    """The profile as this host will run it (module docstring), with one note per thing the host kept."""
    notes: list[str] = []
    command, words = split_command(running) if running else ([], [])
    new_command = list(profile.command)
    if (
        command
        and "/" not in new_command[0]
        and command[0] != new_command[0]
        and command[1:] == new_command[1:]
        and posixpath.basename(command[0]).startswith(
            posixpath.basename(new_command[0]).rstrip("0123456789.")
        )
    ):
        notes.append(
            f"the profile's {new_command[0]} runs as the unit's own interpreter {command[0]} "
            "(write an absolute path in the profile's command to change it)."
        )
        new_command[0] = command[0]
    running_flags = parse_argv(words, flag_list).values
    flags: dict[str, Any] = dict(profile.flags)
    for option in HOST_BOUND_FLAGS:
        kept = running_flags.get(option)
        if not isinstance(kept, tuple) or len(kept) != 1:
            continue
        key = _flag_key(profile, flag_list, option)
        asked = flags.get(key) if key is not None else None
        if asked is not None and str(asked) == kept[0]:
            continue
        if key is not None:
            del flags[key]
        flags[option.removeprefix("--")] = (
            int(kept[0]) if option == "--port" and kept[0].isdigit() else kept[0]
        )
        if asked is not None:
            notes.append(
                f"{option} stays {kept[0]} as the unit has it (the profile says {asked}; the console and "
                "server_url in hosts.toml reach the server there)."
            )
    return profile.model_copy(update={"command": new_command, "flags": flags}), notes


# --------------------------------------------------------------------------------------------------
# The planner's verdict on a profile
# --------------------------------------------------------------------------------------------------


def _first(values: Mapping[str, tuple[str, ...] | bool], option: str) -> str | None:
    v = values.get(option)
    return v[0] if isinstance(v, tuple) and v else None


def _as_int(word: str | None) -> int | None:
    if word is None:
        return None
    try:
        return human_readable_int(word)
    except ValueError:
        return None


def _as_float(word: str | None) -> float | None:
    if word is None:
        return None
    try:
        value = float(word)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def resolve_model(
    override: str | None, profile: Profile, flag_list: FlagList, boots: Sequence[Boot]
) -> ModelSpec:
    """The model spec: the host's override, else the profile's --model-path, else the boots' own."""
    if override:
        return get_model(override)
    values, _ = canonical_flags(profile, flag_list)
    found = find_model(_first(values, "--model-path"))
    if found is not None:
        return found
    for boot in reversed(boots):
        path = boot.arg("model_path")
        found = find_model(path if isinstance(path, str) else None)
        if found is not None:
            return found
    raise ModelConfigError(
        'the model is not in the capacity catalogue; name it with model = "..." for this host in hosts.toml'
    )


def _speculative(algorithm: Any, model: ModelSpec, steps: Any, topk: Any, draft: Any) -> Speculative | None:
    if not isinstance(algorithm, str) or not algorithm:
        return None

    def num(v: Any) -> int | None:
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        return _as_int(v) if isinstance(v, str) else None

    return Speculative(
        algorithm=algorithm,
        draft_layers=(model.nextn_layers or 1) if algorithm.upper() == "NEXTN" else 1,
        num_steps=num(steps),
        eagle_topk=num(topk),
        num_draft_tokens=num(draft),
    )


def _boot_config(boot: Boot, planned: PoolConfig) -> PoolConfig:
    """The configuration a boot ran with, from its own dump (a profile's proposal must not change how an
    old boot's pool is read)."""

    def arg_int(name: str) -> int | None:
        v = boot.arg(name)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    kv = boot.arg("kv_cache_dtype")
    return PoolConfig(
        model=planned.model,
        tp=arg_int("tp_size") or planned.tp,
        kv_cache_dtype=kv if isinstance(kv, str) and kv else "auto",
        page_size=arg_int("page_size") or 1,
        max_total_tokens=arg_int("max_total_tokens"),
        rule=planned.rule,
        speculative=_speculative(
            boot.arg("speculative_algorithm"),
            planned.model,
            boot.arg("speculative_num_steps"),
            boot.arg("speculative_eagle_topk"),
            boot.arg("speculative_num_draft_tokens"),
        ),
        max_running_requests=boot.pool.max_running_requests or arg_int("max_running_requests"),
        context_length=boot.pool.context_len or arg_int("context_length"),
    )


def planner_verdict(
    profile: Profile,
    flag_list: FlagList,
    boots: Sequence[Boot],
    *,
    model: str | None = None,
    min_headroom_gib: float = DEFAULT_MIN_HEADROOM_GIB,
) -> PlannerVerdict:
    """Does the profile fit, calibrated on `boots` (the host's journal, oldest first) the way `plan` does?"""
    out = PlannerVerdict(
        checked=False, target_context=profile.target_context, min_headroom_gib=min_headroom_gib
    )
    values, _ = canonical_flags(profile, flag_list)
    f = _as_float(_first(values, "--mem-fraction-static"))
    out.mem_fraction_static = f
    if f is None or not 0 < f < 1:
        out.reasons.append(
            "the profile sets no --mem-fraction-static between 0 and 1, so SGLang picks one itself"
        )
        return out
    try:
        spec = resolve_model(model, profile, flag_list, boots)
    except ModelConfigError as exc:
        out.reasons.append(str(exc).rstrip("."))
        return out
    out.model = spec.name
    try:
        cfg = PoolConfig(
            model=spec,
            tp=_as_int(_first(values, "--tp-size")) or 1,
            kv_cache_dtype=_first(values, "--kv-cache-dtype") or "auto",
            page_size=_as_int(_first(values, "--page-size")) or 1,
            max_total_tokens=_as_int(_first(values, "--max-total-tokens")),
            rule=sizing_rule_for(profile.sglang_version),
            speculative=_speculative(
                _first(values, "--speculative-algorithm"),
                spec,
                _first(values, "--speculative-num-steps"),
                _first(values, "--speculative-eagle-topk"),
                _first(values, "--speculative-num-draft-tokens"),
            ),
            max_running_requests=_as_int(_first(values, "--max-running-requests")),
            context_length=_as_int(_first(values, "--context-length")) or profile.target_context,
        )
        spec.kv_element_bytes(cfg.kv_cache_dtype)
        observations = [
            observation_from_boot(b, None, _boot_config(b, cfg))
            for b in boots
            if b.pool.tokens is not None or b.pre_gib is not None
        ]
        calibration = calibrate(observations, cfg)
        result = plan(
            profile.target_context, cfg, calibration, mem_fraction_static=f, min_headroom_gib=min_headroom_gib
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
    "DEFAULT_MIN_FREE_GIB",
    "HOST_BOUND_FLAGS",
    "ApplyOutcome",
    "ApplyPreview",
    "ApplyProgress",
    "PlannerVerdict",
    "Verdict",
    "host_profile",
    "judge",
    "planner_verdict",
    "resolve_model",
]
