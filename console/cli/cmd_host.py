"""`k26-console host HOST [--json] [--profile P]`: what the console learned about a host, and from where.

The unit and its ExecStart, the interpreter that runs SGLang, SGLang's version and install path (read
without importing it), where the flag list came from (the host's own installation, or the shipped list
as a named fallback), the model with the shape the capacity model uses (from the host's config.json,
or the catalogue as a named fallback), the KV dtype, and the GPUs with their memory and peak bandwidth.
With `--profile`, the profile is set against the host's SGLang: a profile written for another version
is reported with the flags that differ (renamed, removed, retired, new defaults).

Everything the host sent is printed through `terminal_safe`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from console.cli.errors import EXIT_OK, UsageError
from console.core.flagdrift import VersionDrift, version_drift
from console.core.flags import UnknownVersion, load_flag_list
from console.core.hostfacts import HostFacts
from console.core.text import json_safe, terminal_safe

if TYPE_CHECKING:
    from console.core.profiles import Profile


class HostReport(BaseModel, defer_build=True):
    """The `host --json` contract: the facts, and the profile check when `--profile` was given."""

    facts: HostFacts
    flags_from: str
    """Shortcut of `facts.flags.flags_from`: `host` or `shipped`."""
    profile: str | None = None
    profile_drift: VersionDrift | None = None
    profile_errors: list[str] = []


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "host",
        help="what the console learned about a host: its SGLang, model and GPUs",
        description=(
            "Read the host over SSH without changing it: the unit's interpreter and its SGLang (version "
            "and path, without importing SGLang), the flag list of that version (extracted on the host, "
            "cached per version), the served model's config.json (local directory or Hugging Face cache) "
            "and the shape the capacity model uses, the KV dtype, and the GPUs with memory and peak "
            "bandwidth. Each fact says where it came from; each fallback says why. Exit 2 when the host "
            "or its unit cannot be reached."
        ),
    )
    p.add_argument("host", metavar="HOST", help="a hosts-file name or an ssh alias")
    p.add_argument("--hosts", metavar="FILE", help="the hosts file (default: hosts.toml in the config dir)")
    p.add_argument(
        "--profile",
        metavar="P",
        help="check a profile (name or .toml path) against the host's SGLang version and flag list",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _load_profile(ref: str) -> Profile:
    from console.core.profiles import ProfileError, parse_profile
    from console.sources.profile_store import ProfileStore

    path = Path(ref)
    try:
        if ref.endswith(".toml") or path.is_file():
            return parse_profile(path.read_text(encoding="utf-8"), name=path.stem, source=str(path))
        return ProfileStore().load(ref)
    except UnicodeDecodeError:
        raise UsageError(f"the profile {ref} is not UTF-8 text.") from None
    except OSError as exc:
        raise UsageError(f"cannot read the profile {ref} ({exc.strerror or exc}).") from None
    except (ProfileError, LookupError, ValueError) as exc:
        raise UsageError(f"{str(exc).rstrip('.')}.") from None


def learn(name: str, hosts_file: str | None, cache_dir: Path | None = None) -> HostFacts:
    """`learn_host` for a host of the inventory, as the commands and the lead's wiring call it."""
    from console.cli.remote import connected, inventory_host
    from console.sources.hostinfo import HostInfoError, learn_host

    host = inventory_host(name, hosts_file)

    async def go() -> HostFacts:
        transport = await connected(host)
        try:
            return await learn_host(host, transport, cache_dir=cache_dir)
        finally:
            await transport.close()

    try:
        return asyncio.run(go())
    except HostInfoError as exc:
        raise UsageError(f"{str(exc).rstrip('.')}.") from None


def _profile_check(facts: HostFacts, profile: Profile) -> tuple[VersionDrift | None, list[str]]:
    from console.core.profiles import validate_profile
    from console.sources.hostinfo import host_flag_list

    host_flags = host_flag_list(facts)
    errors = [i.message for i in validate_profile(profile, host_flags).issues if i.level == "error"]
    try:
        written_for = load_flag_list(profile.sglang_version)
    except UnknownVersion as exc:
        return None, [*errors, f"{exc}."]
    return version_drift(profile.flags, written_for, host_flags), errors


def _mib(value: float | None) -> str:
    return f"{value:,.0f} MiB" if value is not None else "? MiB"


def _lines(report: HostReport) -> list[str]:
    f = report.facts
    s = f.sglang
    out = [
        f"host {f.host}, unit {f.unit}",
        f"  ExecStart     {shlex.join(f.exec_start)}",
        f"  interpreter   {f.interpreter or '(none)'}  [{f.interpreter_source}]"
        + (f", Python {f.python_version}" if f.python_version else ""),
        f"  SGLang        {s.version or 'unknown'} at {s.path or '?'}  [{s.source}]",
        f"  flags         {f.flags.count} flags of SGLang {f.flags.version}, "
        f"{'the host' if f.flags.flags_from == 'host' else 'shipped with the console'}  [{f.flags.source}]",
    ]
    m = f.model
    out.append(f"  model         {m.path or '(no --model-path)'}  [{m.source}]")
    if m.hub_cache:
        out.append(f"  HF cache      {m.hub_cache}  [{m.hub_cache_source}]")
    if m.shape is not None:
        sh = m.shape
        if sh.attention == "mla":
            kv = f"MLA, kv_lora_rank {sh.kv_lora_rank} + rope {sh.qk_rope_head_dim}"
        else:
            kv = (
                f"GQA, {sh.num_kv_heads} KV heads ({sh.kv_heads_per_gpu}/GPU) × {sh.head_dim}+{sh.v_head_dim}"
            )
        hybrid = f", {sh.linear_layers} linear-attention layers" if sh.linear_layers else ""
        out.append(
            f"  shape         {sh.layers} KV layers{hybrid}, {kv}, {sh.kv_dtype_bytes} B/element "
            f"-> {sh.cell_bytes:,} B/token/GPU at TP{f.tp_size}"
            + (f", state {sh.state_bytes_per_request:,} B/request/GPU" if sh.state_bytes_per_request else "")
        )
        if sh.context_length:
            out.append(f"  context       {sh.context_length:,} (max_position_embeddings)")
    out.append(f"  KV dtype      {f.kv_cache_dtype}")
    if f.draft is not None:
        d = f.draft
        cell = f"{d.cell_bytes:,} B/token/GPU" if d.cell_bytes is not None else "not sized"
        out.append(f"  draft         {d.algorithm} {d.path or ''} -> {cell}  [{d.source}]")
    if f.gpus:
        out.append(f"  GPUs          {len(f.gpus)}  [{f.gpus_source}]")
        for g in f.gpus:
            if not g.peak_bandwidth_gbs:
                peak = "peak unknown"
            elif g.peak_from == "nvml":
                table = f"; the table: {g.table_peak_gbs:,.0f}" if g.table_peak_gbs else "; not in the table"
                peak = f"{g.peak_bandwidth_gbs:,.0f} GB/s ({g.bandwidth_source}{table})"
            else:
                peak = f"{g.peak_bandwidth_gbs:,.0f} GB/s ({g.bandwidth_card}, the bandwidth table)"
            out.append(
                f"    {g.index if g.index is not None else '?'}: {g.name or '?'}, {_mib(g.memory_total_mib)}, {peak}"
            )
    else:
        out.append(f"  GPUs          none  [{f.gpus_source}]")
    if report.profile is not None:
        drift = report.profile_drift
        if drift is None:
            head = "its SGLang version has no shipped flag list to compare with."
        elif f.sglang.version is None:
            head = (
                f"written for SGLang {drift.written_for}; the host's version is unknown, so it is checked "
                f"against {f.flags.source}."
            )
        else:
            head = drift.summary()
        out.append(f"profile {report.profile}: {head}")
        if drift is not None:
            out.extend(f"  {c.sentence}" for c in drift.profile_flags)
            out.extend(f"  {c.sentence}" for c in drift.defaults)
        out.extend(f"  error: {e}" for e in report.profile_errors)
    out.extend(f"note: {n}" for n in f.notes)
    return out


def _json_text(data: Any) -> str:
    return json_safe(json.dumps(data, ensure_ascii=False))


def run(args: argparse.Namespace) -> int:
    profile = _load_profile(args.profile) if args.profile else None
    facts = learn(args.host, args.hosts)
    report = HostReport(facts=facts, flags_from=facts.flags.flags_from)
    if profile is not None:
        report.profile = profile.name
        report.profile_drift, report.profile_errors = _profile_check(facts, profile)
    if args.json:
        sys.stdout.write(_json_text(report.model_dump(mode="json")) + "\n")
    else:
        sys.stdout.write("".join(terminal_safe(line) + "\n" for line in _lines(report)))
    return EXIT_OK
