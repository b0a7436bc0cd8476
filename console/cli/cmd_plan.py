"""`k26-console plan`: what a flag change will give, and the fraction that reaches a target in one restart."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Re-exported: the other commands that take these types import them from here (or from argtypes).
from console.cli.argtypes import finite_float as finite_float
from console.cli.argtypes import fraction as fraction
from console.cli.argtypes import human_int as human_int
from console.cli.argtypes import positive_int as positive_int
from console.cli.errors import EXIT_CHECK_FAILED, EXIT_OK, UsageError
from console.core.capacity import (
    DEFAULT_MIN_HEADROOM_GIB,
    MAX_GPU_MEM_GIB,
    MAX_PAGE_SIZE,
    MAX_RUNNING_REQUESTS,
    MAX_TP,
    CapacityError,
    in_range,
    range_text,
)
from console.core.capacity_plan import Plan, check_fraction
from console.core.hostfacts import HostFacts
from console.core.models import KV_CACHE_DTYPES, ModelConfigError, ModelSpec, parse_hf_config
from console.core.parser import parse_lines
from console.core.planning import (
    FlagSource,
    boot_source,
    command_line_source,
    latest_sized,
    pick,
    plan_restart,
    profile_source,
    resolve_model,
)
from console.core.profiles import Profile, ProfileError
from console.core.state import Boot, fold_boots
from console.core.text import LineSplitter, json_safe, terminal_safe
from console.sources.profile_store import ProfileStore

# ------------------------------------------------------------------ shared with `verify`


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
        "host",
        nargs="?",
        metavar="HOST",
        help="plan from HOST: its unit's journal over SSH, and the model (its config.json), SGLang version "
        "and GPUs the console learns there (see `k26-console host`); no --model needed",
    )
    p.add_argument(
        "--target-context", type=human_int, required=True, metavar="N", help="tokens the pool must hold"
    )
    p.add_argument("--journal", metavar="FILE", help="journal text or JSON ('-' for standard input)")
    p.add_argument("--hosts", metavar="FILE", help="the hosts file (default: hosts.toml in the config dir)")
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
        "--swa-full-tokens-ratio",
        type=ranged(finite_float, 0, 1, above_lo=True),
        metavar="R",
        help="sliding-window models: SWA pool tokens per full-pool token (SGLang's default 0.8)",
    )
    p.add_argument(
        "--mamba-full-memory-ratio",
        type=ranged(finite_float, 0, 1000, above_lo=True),
        metavar="R",
        help="hybrid linear-attention models: mamba state memory over full KV memory (default 0.9)",
    )
    p.add_argument(
        "--max-mamba-cache-size",
        type=ranged(positive_int, 1, 1 << 24),
        metavar="N",
        help="hybrid linear-attention models: the mamba state slots (default: sized by the ratio)",
    )
    p.add_argument(
        "--min-headroom-gib",
        type=ranged(finite_float, 0, MAX_GPU_MEM_GIB, "GiB"),
        default=DEFAULT_MIN_HEADROOM_GIB,
        metavar="G",
        help=f"least headroom to keep for CUDA graphs, activations and the draft (default {DEFAULT_MIN_HEADROOM_GIB:g})",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def read_profile(ref: str) -> Profile:
    """A saved profile: a name from the profile directories, or a path to a .toml file."""
    try:
        return ProfileStore().load(ref)
    except ProfileError as exc:
        raise UsageError(str(exc)) from None


def _model(
    args: argparse.Namespace, sources: list[FlagSource], boots: list[Boot], facts: HostFacts | None
) -> ModelSpec:
    if args.model_config:
        return parse_hf_config(read_text(args.model_config), Path(args.model_config).name)
    if facts is not None and not args.model and facts.model.spec is not None:
        return facts.model.spec
    return resolve_model(sources, named=args.model, boots=boots)


def _from_host(args: argparse.Namespace) -> tuple[list[Boot], HostFacts]:
    """HOST's boots (its unit's journal) and what the console learns of it, both over one SSH connection
    and at once (they were two connections, one after the other: a second key exchange, ~0.1 s)."""
    import asyncio

    from console.cli.remote import connected, inventory_host
    from console.cli.remote_journal import boots_of, together, unit_journal
    from console.sources.hostinfo import HostInfoError, learn_host
    from console.sources.hosts import HostsError
    from console.sources.transport import TransportError

    if args.journal:
        raise UsageError("give either HOST or --journal FILE, not both.")
    host = inventory_host(args.host, args.hosts)  # a typo is refused before any connection

    async def fetch() -> tuple[list[str], HostFacts]:
        transport = await connected(host)
        try:
            return await together(unit_journal(transport, host), learn_host(host, transport))
        finally:
            await transport.close()

    try:
        lines, facts = asyncio.run(fetch())
    except (HostsError, TransportError, HostInfoError) as exc:
        raise UsageError(f"{str(exc).rstrip('.')}.") from None
    return boots_of(args.host, lines), facts


def _host_notes(facts: HostFacts) -> list[str]:
    """Where the host's facts came from, said first among the plan's notes."""
    model = facts.model
    said = [f"the model from {facts.host}: {model.source}"]
    if facts.sglang.version:
        said.append(f"SGLang {facts.sglang.version} on {facts.host} ({facts.sglang.source})")
    return said + facts.notes


def build_plan(args: argparse.Namespace) -> Plan:
    """The plan for the command line's flags over the profile's (a whole argv) or, without a profile,
    over the flags the journal's latest boot ran with; the planning brain does the rest."""
    profile = read_profile(args.profile) if args.profile else None
    facts: HostFacts | None = None
    if args.host:
        boots, facts = _from_host(args)
    else:
        boots = read_boots(args.journal) if args.journal else []
    latest = latest_sized(boots)
    # The fraction the journal's latest boot ran with when it has no dump: never a profile's proposal.
    latest_fraction = (
        args.journal_mem_fraction_static
        if args.journal_mem_fraction_static is not None
        else args.mem_fraction_static
    )
    cli = command_line_source(
        {
            "mem_fraction_static": args.mem_fraction_static,
            "gpu_mem_gib": args.gpu_mem_gib,
            "tp_size": args.tp,
            "max_running_requests": args.max_running_requests,
            "max_total_tokens": args.max_total_tokens,
            "page_size": args.page_size,
            "kv_cache_dtype": args.kv_cache_dtype,
            "swa_full_tokens_ratio": args.swa_full_tokens_ratio,
            "mamba_full_memory_ratio": args.mamba_full_memory_ratio,
            "max_mamba_cache_size": args.max_mamba_cache_size,
        }
    )
    if profile is not None:
        sources = [cli, profile_source(profile)]
    else:
        sources = [cli, boot_source(latest)] if latest is not None else [cli]
    version = args.sglang_version or (profile.sglang_version if profile is not None else None)
    if version is None and facts is not None:
        version = facts.sglang.version
    gpu_mem_gib = pick("gpu_mem_gib", [s for s in sources if not s.observed])
    if gpu_mem_gib is None and facts is not None and latest is None:
        # Nothing in the journal to calibrate on: the card's memory as the host reports it.
        sizes = {g.memory_total_mib for g in facts.gpus if g.memory_total_mib}
        gpu_mem_gib = min(sizes) / 1024 if sizes else None
    try:
        if latest_fraction is not None:
            check_fraction(latest_fraction)
        model = _model(args, sources, boots, facts)
        result = plan_restart(
            args.target_context,
            sources,
            boots,
            model=model,
            sglang_version=version,
            latest_fraction=latest_fraction,
            gpu_mem_gib=gpu_mem_gib,
            min_headroom_gib=args.min_headroom_gib,
        )
    except (CapacityError, ModelConfigError) as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:  # pydantic validation of a profile or journal value
        last = str(exc).split("\n")[-1].strip()
        raise UsageError(f"a flag value is out of range ({last}).") from None
    if facts is not None:
        result.notes[:0] = _host_notes(facts)
    return result


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
        flags = " ".join(f"{k} {v}" for k, v in result.recommended_flags.items()) or (
            f"--mem-fraction-static {result.recommended_mem_fraction_static:g}"
        )
        lines.append(
            f"recommended: {flags} -> "
            f"{result.predicted_tokens_at_recommended:,} tokens, {result.headroom_gib_at_recommended:.2f} GiB "
            f"headroom (at least {result.min_headroom_gib:g} GiB kept)"
        )
    else:
        lines.append("cannot fit:")
        lines.extend(f"  - {r}" for r in result.reasons)
        if result.alternatives:
            lines.append("alternatives:")
            lines.extend(f"  - {a}" for a in result.alternatives)
    if len(result.pools) > 1:
        # A hybrid model's pools, each per GPU: which one bounds the plan is said first.
        lines.append(f"pools (bounded by {result.limiting_pool}):")
        for forecast in result.pools:
            size = (
                f"{forecast.tokens:,} tokens" if forecast.tokens is not None else f"{forecast.slots:,} slots"
            )
            gib = f", {forecast.gib:.2f} GiB" if forecast.gib is not None else ""
            lines.append(f"  {forecast.pool}: {size}{gib}")
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
