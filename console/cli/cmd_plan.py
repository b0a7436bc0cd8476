"""`k26-console plan`: what a flag change will give, and the fraction that reaches a target in one restart."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from console.cli.errors import EXIT_CHECK_FAILED, EXIT_OK, UsageError
from console.core.capacity import (
    DEFAULT_MIN_HEADROOM_GIB,
    MAX_GPU_MEM_GIB,
    MAX_PAGE_SIZE,
    MAX_RUNNING_REQUESTS,
    MAX_TOKENS,
    MAX_TP,
    CapacityError,
    Plan,
    PoolConfig,
    Speculative,
    calibrate,
    check_fraction,
    in_range,
    observation_from_boot,
    plan,
    range_text,
    sizing_rule_for,
)
from console.core.models import (
    KV_CACHE_DTYPES,
    ModelConfigError,
    ModelSpec,
    find_model,
    get_model,
    parse_hf_config,
)
from console.core.parser import parse_lines
from console.core.profile_store import ProfileStore
from console.core.profiles import ProfileError
from console.core.state import Boot, fold_boots
from console.core.text import LineSplitter, json_safe, terminal_safe
from console.core.token_count import TokenCountError, read_token_count

# ------------------------------------------------------------------ shared with `verify`


def human_int(text: str) -> int:
    """An argparse type for a number of tokens, read by the console's one token-count reader."""
    try:
        return read_token_count(text)
    except TokenCountError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def fraction(text: str) -> float:
    """A `--mem-fraction-static`: a number strictly between 0 and 1."""
    try:
        value = finite_float(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (a fraction strictly between 0 and 1)") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction strictly between 0 and 1")
    return value


def positive_int(text: str) -> int:
    if len(text.strip()) > 30:
        raise argparse.ArgumentTypeError(f"{text[:30]!r}… is too large")
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


def ranged(
    parse: Callable[[str], float], lo: float, hi: float, unit: str = "", *, above_lo: bool = False
) -> Callable[[str], Any]:
    """An argparse type: `parse`, then the value must lie in the range (named in the message)."""

    span = range_text(lo, hi, unit, above_lo=above_lo)

    def convert(text: str) -> Any:
        try:
            value = parse(text)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"{exc} ({span})") from None
        if not in_range(value, lo, hi, above_lo=above_lo):
            raise argparse.ArgumentTypeError(f"{text!r} is out of range ({span})")
        return value

    return convert


def read_text(path: str) -> str:
    if path == "-":
        return sys.stdin.buffer.read().decode("utf-8", "replace")
    try:
        return Path(path).read_bytes().decode("utf-8", "replace")
    except FileNotFoundError:
        raise UsageError(f"there is no file {path}.") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory, not a file.") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}.") from None


def read_lines(path: str) -> list[str]:
    """The lines of a journal file (`-` for standard input), split on `\\n` only and each at most
    LINE_MAX_BYTES (a longer one keeps its start and a note): linear time whatever the file holds."""
    splitter = LineSplitter()
    lines: list[str] = []
    try:
        stream = sys.stdin.buffer if path == "-" else Path(path).open("rb")  # noqa: SIM115
    except FileNotFoundError:
        raise UsageError(f"there is no file {path}.") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory, not a file.") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}.") from None
    try:
        while data := stream.read(1 << 20):
            lines.extend(splitter.feed(data))
        lines.extend(splitter.flush())
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}.") from None
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    return lines


def read_boots(path: str) -> list[Boot]:
    """The boots in a journal file (`-` for standard input); a usage error when there are none."""
    name = "standard input" if path == "-" else path
    lines = [line for line in read_lines(path) if line.strip()]
    if not lines:
        raise UsageError(f"the journal {name} is empty.")
    boots = fold_boots(parse_lines(lines))
    if not boots:
        raise UsageError(
            f"the journal {name} shows no SGLang boot (no unit start and no SGLang startup, pool or error line)."
        )
    return boots


# ------------------------------------------------------------------ plan


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "plan",
        help="predict the KV pool for a flag change and the fraction that reaches a target context",
        description=(
            "Predict SGLang's KV pool (max_total_num_tokens) and recommend the smallest "
            "--mem-fraction-static that holds the target context with safe headroom, calibrated on "
            "what the journal showed. Exit 0 when it fits, 1 when it cannot, 2 on bad input."
        ),
    )
    p.add_argument(
        "--target-context", type=human_int, required=True, metavar="N", help="tokens the pool must hold"
    )
    p.add_argument("--journal", metavar="FILE", help="journal text or JSON ('-' for standard input)")
    model = p.add_mutually_exclusive_group()
    model.add_argument(
        "--model", metavar="NAME", help="a catalogue model, e.g. kimi-k2.6, deepseek-v3, qwen3-32b"
    )
    model.add_argument("--model-config", metavar="PATH", help="the model's Hugging Face config.json")
    p.add_argument(
        "--mem-fraction-static",
        type=fraction,
        metavar="F",
        help="the fraction to predict for; also the fraction the journal's boot ran with when it shows none",
    )
    p.add_argument(
        "--journal-mem-fraction-static",
        type=fraction,
        metavar="F",
        help="the fraction the journal's latest boot ran with, when the journal shows no server_args dump "
        "(default: --mem-fraction-static)",
    )
    p.add_argument("--profile", metavar="FILE", help="a flag profile (TOML) to take flags from")
    p.add_argument(
        "--gpu-mem-gib",
        type=ranged(finite_float, 0, MAX_GPU_MEM_GIB, "GiB", above_lo=True),
        metavar="G",
        help="total memory of one GPU in GiB",
    )
    p.add_argument(
        "--tp",
        type=ranged(positive_int, 1, MAX_TP),
        metavar="N",
        help="tensor-parallel size (matters for MHA models)",
    )
    p.add_argument("--max-running-requests", type=ranged(positive_int, 1, MAX_RUNNING_REQUESTS), metavar="N")
    p.add_argument("--max-total-tokens", type=human_int, metavar="N")
    p.add_argument("--page-size", type=ranged(positive_int, 1, MAX_PAGE_SIZE), metavar="N")
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, metavar="DTYPE")
    p.add_argument("--sglang-version", metavar="V", help="e.g. 0.5.12 (default: the v0.5.7-v0.5.13 rule)")
    p.add_argument(
        "--min-headroom-gib",
        type=ranged(finite_float, 0, MAX_GPU_MEM_GIB, "GiB"),
        default=DEFAULT_MIN_HEADROOM_GIB,
        metavar="G",
        help=f"least headroom to keep for CUDA graphs, activations and the draft (default {DEFAULT_MIN_HEADROOM_GIB:g})",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def read_profile(ref: str) -> dict[str, Any]:
    """The flags of a saved profile (a name from the profile directories, or a path to a .toml file),
    keyed the way ServerArgs names them (underscores). Read by core.profiles, the one profile reader."""
    try:
        profile = ProfileStore().load(ref)
    except ProfileError as exc:
        raise UsageError(str(exc)) from None
    return {key.replace("-", "_"): value for key, value in profile.flags.items()}


_LIMITS: dict[str, tuple[float, float, str, bool]] = {
    # flag: (low, high, unit, low excluded) -- what a value from a profile or a journal must respect too
    "tp_size": (1, MAX_TP, "", False),
    "page_size": (1, MAX_PAGE_SIZE, "tokens", False),
    "max_total_tokens": (1, MAX_TOKENS, "tokens", False),
    "max_running_requests": (1, MAX_RUNNING_REQUESTS, "", False),
    "context_length": (1, MAX_TOKENS, "tokens", False),
    "gpu_mem_gib": (0, MAX_GPU_MEM_GIB, "GiB", True),
    "speculative_num_steps": (0, 1 << 16, "", False),
    "speculative_eagle_topk": (0, 1 << 16, "", False),
    "speculative_num_draft_tokens": (0, 1 << 16, "", False),
}


def _number(value: Any, kind: type, name: str, flag: str | None = None) -> Any:
    """`value` as `kind`, within the sane range of `flag` when it has one; `name` says where it came
    from (a profile, a journal) in the message."""
    if value is None:
        return None
    if kind is str:
        return str(value)
    if isinstance(value, str) and len(value) > 40:
        raise UsageError(f"{name}={terminal_safe(value[:40])!r}… is not a number.")
    try:
        number = kind(value)
    except (TypeError, ValueError, OverflowError):
        raise UsageError(f"{name}={terminal_safe(repr(value))} is not a number.") from None
    limits = _LIMITS.get(flag or "")
    if limits is not None:
        lo, hi, unit, above_lo = limits
        if not in_range(number, lo, hi, above_lo=above_lo):
            raise UsageError(
                f"{name} must be {range_text(lo, hi, unit, above_lo=above_lo)}, not {terminal_safe(value)}."
            )
    elif isinstance(number, float) and not math.isfinite(number):
        raise UsageError(f"{name}={value!r} is not a finite number.")
    return number


def _pick(name: str, explicit: Any, profile: dict[str, Any], boot: Boot | None, kind: type = str) -> Any:
    """A flag's value: the command line, then the profile, then the journal's latest server_args dump.
    Numbers from a profile or a journal are held to the same ranges as the command line's."""
    if explicit is not None:
        return explicit
    for key in (name, *_ALIASES.get(name, ())):
        if profile.get(key) is not None:
            return _number(profile[key], kind, f"{key} in the profile", name)
    if boot is not None:
        for key in (name, *_ALIASES.get(name, ())):
            if boot.arg(key) is not None:
                return _number(boot.arg(key), kind, f"{key} in the journal", name)
    return None


_ALIASES = {"tp_size": ("tp", "tensor_parallel_size"), "model_path": ("model",)}


def _model(args: argparse.Namespace, profile: dict[str, Any], boot: Boot | None) -> ModelSpec:
    try:
        if args.model_config:
            return parse_hf_config(read_text(args.model_config), Path(args.model_config).name)
        if args.model:
            return get_model(args.model)
        named = profile.get("model") or profile.get("model_name")
        if isinstance(named, str):
            return get_model(named)
    except ModelConfigError as exc:
        raise UsageError(str(exc)) from None
    path = _pick("model_path", None, profile, boot)
    found = find_model(path if isinstance(path, str) else None)
    if found is None:
        hint = f" ({path} is not in the catalogue)" if path else ""
        raise UsageError(f"name the model with --model NAME or --model-config config.json{hint}.")
    return found


def _speculative(profile: dict[str, Any], boot: Boot | None, model: ModelSpec) -> Speculative | None:
    algorithm = _pick("speculative_algorithm", None, profile, boot)
    if not algorithm or not isinstance(algorithm, str):
        return None
    return Speculative(
        algorithm=algorithm,
        draft_layers=(model.nextn_layers or 1) if algorithm.upper() == "NEXTN" else 1,
        num_steps=_pick("speculative_num_steps", None, profile, boot, int),
        eagle_topk=_pick("speculative_eagle_topk", None, profile, boot, int),
        num_draft_tokens=_pick("speculative_num_draft_tokens", None, profile, boot, int),
    )


def _ran_with(boot: Boot, planned: PoolConfig) -> PoolConfig:
    """The configuration a boot ran with, from its own dump: a proposal (a profile's fp8 KV cache, say)
    must not change how an old boot's pool is read. Without a dump only the TP size is carried over."""
    empty: dict[str, Any] = {}
    return PoolConfig(
        model=planned.model,
        tp=_pick("tp_size", None, empty, boot, int) or planned.tp,
        kv_cache_dtype=_pick("kv_cache_dtype", None, empty, boot) or "auto",
        page_size=_pick("page_size", None, empty, boot, int) or 1,
        max_total_tokens=_pick("max_total_tokens", None, empty, boot, int),
        rule=planned.rule,
        speculative=_speculative(empty, boot, planned.model),
        max_running_requests=boot.pool.max_running_requests
        or _pick("max_running_requests", None, empty, boot, int),
        context_length=boot.pool.context_len or _pick("context_length", None, empty, boot, int),
    )


def build_plan(args: argparse.Namespace) -> Plan:
    profile = read_profile(args.profile) if args.profile else {}
    boots = read_boots(args.journal) if args.journal else []
    latest = next((b for b in reversed(boots) if b.pool.tokens is not None or b.pre_gib is not None), None)
    if boots and latest is None:
        latest = boots[-1]

    f = _pick("mem_fraction_static", args.mem_fraction_static, profile, None, float)
    # The fraction the journal's latest boot ran with when it has no dump: never a profile's proposal.
    boot_f = (
        args.journal_mem_fraction_static
        if args.journal_mem_fraction_static is not None
        else args.mem_fraction_static
    )
    try:
        for value in (f, boot_f):
            if value is not None:
                check_fraction(value)
        model = _model(args, profile, latest)
        version = _pick("sglang_version", args.sglang_version, profile, None)
        cfg = PoolConfig(
            model=model,
            tp=_pick("tp_size", args.tp, profile, latest, int) or 1,
            kv_cache_dtype=_pick("kv_cache_dtype", args.kv_cache_dtype, profile, latest) or "auto",
            page_size=_pick("page_size", args.page_size, profile, latest, int) or 1,
            max_total_tokens=_pick("max_total_tokens", args.max_total_tokens, profile, latest, int),
            rule=sizing_rule_for(str(version) if version is not None else None),
            speculative=_speculative(profile, latest, model),
            max_running_requests=_pick(
                "max_running_requests", args.max_running_requests, profile, latest, int
            ),
            context_length=args.target_context,
        )
        model.kv_element_bytes(cfg.kv_cache_dtype)
        gpu = _pick("gpu_mem_gib", args.gpu_mem_gib, profile, None, float)
        observations = []
        for boot in boots:
            fallback = boot_f if boot is latest else None
            if boot.pool.tokens is not None or boot.pre_gib is not None:
                ran = _ran_with(boot, cfg)
                observations.append(observation_from_boot(boot, fallback, ran))
        calibration = calibrate(observations, cfg, gpu_mem_gib=gpu)
        if f is None and calibration.reference is not None:
            f = calibration.reference.mem_fraction_static
        result = plan(
            args.target_context,
            cfg,
            calibration,
            mem_fraction_static=f,
            min_headroom_gib=args.min_headroom_gib,
        )
        if version is None:
            result.assumptions.append(
                "SGLang v0.5.7-v0.5.13 sizing (give --sglang-version for another release)."
            )
        return result
    except (CapacityError, ModelConfigError) as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:  # pydantic validation of a profile or journal value
        last = str(exc).split("\n")[-1].strip()
        raise UsageError(f"a flag value is out of range ({last}).") from None


def render(result: Plan) -> str:
    # The model's name, the assumptions and the notes quote the journal, a profile and a config.json:
    # each line is drawn terminal-safe on its own, so nothing in them moves the cursor or adds a line.
    lines = [
        f"plan for {result.target_context:,} tokens: {result.model}, {result.cell_bytes:,} B/token/GPU, "
        f"SGLang {result.sizing_rule} sizing, calibration {result.calibration}",
    ]
    lines.extend(f"  assumes {a}" for a in result.assumptions)
    if result.mem_fraction_static is not None and result.predicted_max_total_num_tokens is not None:
        lines.append(
            f"at --mem-fraction-static {result.mem_fraction_static:g}: "
            f"{result.predicted_max_total_num_tokens:,} tokens, {result.headroom_gib:.2f} GiB headroom"
        )
    if result.fits:
        lines.append(
            f"recommended: --mem-fraction-static {result.recommended_mem_fraction_static:g} -> "
            f"{result.predicted_tokens_at_recommended:,} tokens, {result.headroom_gib_at_recommended:.2f} GiB "
            f"headroom (at least {result.min_headroom_gib:g} GiB kept)"
        )
    else:
        lines.append("cannot fit:")
        lines.extend(f"  - {r}" for r in result.reasons)
        if result.alternatives:
            lines.append("alternatives:")
            lines.extend(f"  - {a}" for a in result.alternatives)
    lines.append("notes:")
    lines.extend(f"  - {n}" for n in result.notes)
    return "\n".join(terminal_safe(line) for line in lines)


def run(args: argparse.Namespace) -> int:
    result = build_plan(args)
    if args.json:
        sys.stdout.write(json_safe(json.dumps(result.model_dump(mode="json"), ensure_ascii=False)) + "\n")
    else:
        sys.stdout.write(render(result) + "\n")
    return EXIT_OK if result.fits else EXIT_CHECK_FAILED
