"""`k26-console probe HOST --depth N | --sweep LIST`: a synthetic long-context request at real depth.

TTFT, decode tok/s, inter-token latency and the KV read bandwidth decode achieved, set against the card's
peak. Exit 0 when every depth was measured, 1 when a depth was refused or the probe failed (the results
are still printed), 2 on bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from console.cli.cmd_plan import human_int
from console.cli.errors import EXIT_OK, CheckFailed, UsageError
from console.cli.tables import cell, render, styled, table
from console.core.capacity import MAX_TOKENS as MAX_CONTEXT_TOKENS
from console.core.capacity import in_range, range_text
from console.core.probe import (
    ProbePhase,
    ProbeProgress,
    ProbeReport,
    ProbeResult,
    ProbeStatus,
    fmt_depth,
    fmt_pct,
    parse_depths,
)
from console.core.text import terminal_safe

if TYPE_CHECKING:  # the SSH stack loads only when a command needs it
    from console.sources.hosts import HostConfig
    from console.sources.profile_store import ProfileStore
    from console.sources.server import ServerClient
    from console.sources.transport import Transport

MAX_TOKENS = 4096
"""New tokens a probe asks for at most: enough for a steady decode rate."""
MAX_SWEEP = 64
"""Depths one sweep may hold; each costs a full prefill."""
MAX_TIMEOUT_S = 86_400.0
"""A day: a wait longer than that is no timeout."""


def _depths(text: str) -> list[int]:
    depth_range = range_text(1, MAX_CONTEXT_TOKENS, "tokens")
    try:
        depths = parse_depths(text)
    except OverflowError:  # a number too large for a float
        raise argparse.ArgumentTypeError(f"a depth in {text[:40]!r} is too large ({depth_range})") from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if len(depths) > MAX_SWEEP:
        raise argparse.ArgumentTypeError(
            f"{len(depths)} depths are too many for one sweep (at most {MAX_SWEEP})"
        )
    too_deep = [d for d in depths if d > MAX_CONTEXT_TOKENS]
    if too_deep:
        raise argparse.ArgumentTypeError(f"depth {too_deep[0]:,} is too large ({depth_range})")
    return depths


def _new_tokens(text: str) -> int:
    value = human_int(text)
    if value > MAX_TOKENS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is more new tokens than a probe needs; use at most {MAX_TOKENS} and at least 1"
        )
    return value


def _seconds(text: str) -> float:
    span = range_text(0, MAX_TIMEOUT_S, "seconds", above_lo=True)
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds ({span})") from None
    if not in_range(value, 0, MAX_TIMEOUT_S, above_lo=True):
        raise argparse.ArgumentTypeError(f"{text!r} is out of range ({span})")
    return value


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "probe",
        help="one synthetic long-context request (or a sweep): TTFT, tok/s, effective KV bandwidth",
        description=(
            "Send a streamed /generate of N random token ids (a fresh prefix each run, so the radix cache "
            "cannot answer it) asking for exactly M new tokens, and measure time to first token, decode "
            "tok/s, inter-token latency and the KV read bandwidth against the card's peak. A depth the "
            "server cannot take (context length, KV pool) is refused before anything is sent. Results go "
            "to the probe history and, with --profile, to the profile's [verified] tok_s_at_depth when the "
            "host's unit runs that profile as apply writes it (otherwise it says which flags differ). "
            "Exit 0 when every depth was measured, 1 when one was refused or failed, 2 on bad input."
        ),
    )
    p.add_argument(
        "host",
        nargs="?",
        metavar="HOST",
        help="a hosts-file name or an ssh alias; without it, the SGLang server on this machine (--url)",
    )
    p.add_argument(
        "--url",
        metavar="URL",
        help="without HOST: the local server's URL (default http://127.0.0.1:30000)",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--depth", type=human_int, metavar="N", help="prompt tokens (e.g. 185k)")
    what.add_argument(
        "--sweep", type=_depths, metavar="LIST", help="depths in order, e.g. 1k,8k,32k,64k,128k,185k,200k"
    )
    p.add_argument(
        "--tokens",
        type=_new_tokens,
        default=None,
        metavar="M",
        help=f"new tokens per depth (default 32, at most {MAX_TOKENS})",
    )
    p.add_argument("--profile", metavar="NAME", help="record tok/s by depth in this profile's [verified]")
    p.add_argument("--hosts", metavar="FILE", help="the hosts file (default: hosts.toml in the config dir)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--ttft-timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="longest wait for the first token (default 900)",
    )
    p.add_argument(
        "--stall-timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="longest wait between two tokens (default 120)",
    )
    p.set_defaults(func=run)


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{unit}"


_STATUS_STYLE = {ProbeStatus.REFUSED: "yellow"}


def format_table(report: ProbeReport) -> str:
    """The human form: what was probed, one row per depth, then the diagnoses."""
    t = report.target
    card = t.gpu_name or "unknown GPU"
    source = {"nvml": " from NVML", "table": " from the bandwidth table"}.get(t.peak_from or "", "")
    peak = f"{t.peak_bandwidth_gbs:,.0f} GB/s peak{source}" if t.peak_bandwidth_gbs else "peak unknown"
    cell_size = (
        f"{t.kv_bytes_per_token_per_gpu:,} B/token/GPU" if t.kv_bytes_per_token_per_gpu else "KV cell unknown"
    )
    head = f"{report.host}: {t.model or 'unknown model'} on {t.gpu_count or '?'}x {card} ({peak}), KV {cell_size}"
    rows = table(
        "depth", "tokens", "TTFT", "tok/s", "ITL p50", "ITL p99", "KV GB/s", "of peak", "",
        right=("depth", "tokens", "TTFT", "tok/s", "ITL p50", "ITL p99", "KV GB/s", "of peak"),
    )  # fmt: skip
    for r in report.results:
        if r.status is not ProbeStatus.OK:
            # The reason in the last column: a long server message widens no number column.
            style = _STATUS_STYLE.get(r.status, "red")
            rows.add_row(fmt_depth(r.depth), *["—"] * 7, cell(f"{r.status.value}: {r.error}", style))
            continue
        pct = fmt_pct(r.bandwidth_pct) if r.bandwidth_pct is not None else "—"
        rows.add_row(
            fmt_depth(r.depth),
            str(r.output_tokens),
            _fmt(r.ttft_s, ".2f", " s"),
            _fmt(r.decode_tok_s, ".2f"),
            _fmt(r.itl_p50_s, ".3f", " s"),
            _fmt(r.itl_p99_s, ".3f", " s"),
            _fmt(r.effective_kv_bandwidth_gbs, ".1f"),
            pct,
            "",
        )
    lines = [f"{fmt_depth(r.depth)}: {r.diagnosis}." for r in report.results if r.status is ProbeStatus.OK]
    if report.fit is not None:
        lines.append(f"sweep: {report.fit.diagnosis}.")
    # The host name, the model, the card's name (from nvidia-smi) and the server's error messages come
    # from the host: each line and cell is drawn terminal-safe, so none of them can send an escape sequence.
    return styled(head, "bold") + "\n" + render(rows) + "".join(terminal_safe(line) + "\n" for line in lines)


def _progress_printer(enabled: bool) -> Callable[[ProbeProgress], None]:
    def show(p: ProbeProgress) -> None:
        if not enabled:
            return
        where = f"[{p.index + 1}/{p.total}] {fmt_depth(p.depth)}"
        if p.phase is ProbePhase.PREFILL:
            text = f"{where}: prefill..."
        elif p.phase is ProbePhase.DECODING:
            live = f", {p.live_tok_s:.2f} tok/s" if p.live_tok_s else ""
            text = f"{where}: {p.tokens}/{p.requested_tokens} tokens{live}"
        else:
            result: ProbeResult | None = p.result
            text = f"{where}: {p.phase.value}" + (f" ({result.error})" if result and result.error else "")
        end = "\n" if p.phase not in (ProbePhase.PREFILL, ProbePhase.DECODING) else ""
        # Our own "\r" and erase-line only; the text (the server's error) is drawn safe.
        sys.stderr.write(f"\r\033[K{terminal_safe(text)}{end}")
        sys.stderr.flush()

    return show


def run(args: argparse.Namespace) -> int:
    from console.cli.remote import inventory_host
    from console.core.profiles import ProfileError
    from console.sources.hosts import HostsError
    from console.sources.probe import DEFAULT_NEW_TOKENS, ProbeError, audit_probe, open_prober, report_json
    from console.sources.probe_history import append_history, record_profile
    from console.sources.transport import TransportError

    depths: list[int] = args.sweep if args.sweep else [args.depth]
    tokens: int = args.tokens or DEFAULT_NEW_TOKENS
    store = None
    if args.profile:
        from console.sources.profile_store import ProfileStore

        store = ProfileStore()
        try:
            store.find(args.profile)
        except ProfileError as exc:
            raise UsageError(str(exc)) from None
    try:
        if args.host is None:
            import socket

            from console.sources.hosts import DEFAULT_SERVER_URL, HostConfig

            url = args.url or DEFAULT_SERVER_URL
            try:
                host = HostConfig(name=socket.gethostname(), ssh="localhost", local=True, server_url=url)
            except ValueError:
                raise UsageError(f"--url must look like http://127.0.0.1:30000, not {url!r}.") from None
        elif args.url:
            raise UsageError(
                "--url is for the server on this machine; a HOST is reached by its hosts-file entry."
            )
        else:
            host = inventory_host(args.host, args.hosts, strict=False)  # a typo: refused, no connection
    except HostsError as exc:
        raise UsageError(f"{str(exc).rstrip('.')}.") from None
    options: dict[str, float] = {}
    if args.ttft_timeout:
        options["ttft_timeout_s"] = args.ttft_timeout
    if args.stall_timeout:
        options["stall_timeout_s"] = args.stall_timeout
    show = _progress_printer(sys.stderr.isatty())

    in_force: list[str] = []  # the saved profile the host runs, when no --profile was given

    async def go() -> ProbeReport:
        async with open_prober(host, **options) as prober:  # type: ignore[arg-type]
            if args.host is None:
                await _local_server_answers(prober.client, args.url is not None)
            if not args.profile and prober.transport is not None:
                in_force.extend(await _profile_in_force(host, prober.transport))
            keep_in: str | None = args.profile
            if args.profile and store is not None and prober.transport is not None:
                why = await _not_running(host, prober.transport, store, args.profile)
                if why:
                    sys.stderr.write(
                        terminal_safe(
                            f"k26-console: the results go to the probe history only, not to "
                            f"{args.profile}'s [verified]: {why}."
                        )
                        + "\n"
                    )
                    keep_in = None
            started = time.monotonic()
            report = await prober.sweep(depths, tokens, profile=keep_in, on_progress=show)
            if prober.transport is not None:
                trouble = await audit_probe(
                    prober.transport, host, report, time.monotonic() - started, store=store
                )
                if trouble:
                    sys.stderr.write(f"k26-console: {terminal_safe(trouble)}\n")
            return report

    try:
        report = asyncio.run(go())
    except TransportError as exc:
        raise UsageError(f"{str(exc).rstrip('.')}.") from None
    except ProbeError as exc:
        raise CheckFailed(f"{str(exc).rstrip('.')}.") from None
    where: str | None = None
    try:
        history = append_history(report)
        recorded = record_profile(report, report.profile, store) if report.profile else None
        where = _where_kept(host.name, history, report.profile, recorded, in_force[0] if in_force else None)
    except (OSError, ProfileError) as exc:
        sys.stderr.write(f"k26-console: the results could not be kept: {terminal_safe(exc)}\n")
    if args.json:
        sys.stdout.write(report_json(report) + "\n")
    else:
        sys.stdout.write(format_table(report))
        if where is not None:
            sys.stdout.write(terminal_safe(where) + "\n")
    if not report.ok:
        raise CheckFailed(report.summary())
    return EXIT_OK


async def _local_server_answers(client: ServerClient, url_given: bool) -> None:
    """Without HOST the probe goes to a server on this machine; when nothing answers there, the operator
    most likely forgot the HOST: say both in one sentence (exit 2), not a connection error."""
    from console.core.snapshot import HealthState

    if (await client.health()).health is not HealthState.DOWN:
        return
    if url_given:
        raise UsageError(f"no SGLang server answers at {client.base_url}; check --url, or name a HOST.")
    raise UsageError(
        f"no HOST given and no SGLang server answers at {client.base_url} on this machine; "
        "name a HOST (from hosts.toml or an ssh alias) or give --url."
    )


def _where_kept(
    host: str, history: Path, profile: str | None, recorded: Path | None, in_force: str | None
) -> str:
    """Where this run's numbers went: the probe history always, a profile's [verified] only when named
    (and measured); a profile the host runs but that was not named is said to be left alone."""
    if recorded is not None:
        return f"results kept in {profile}'s [verified] ({recorded}) and in the probe history ({history})."
    if in_force is not None:
        return (
            f"results kept in the probe history only ({history}); {host} runs profile {in_force}, whose "
            f"[verified] is left as it was (--profile {in_force} records them there)."
        )
    return f"results kept in the probe history ({history})."


async def _profile_in_force(host: HostConfig, transport: Transport) -> list[str]:
    """The saved profile the host's unit runs as `apply` writes it (a one-item list), or none."""
    from console.sources.probe import profile_in_force

    name = await profile_in_force(host, transport)
    return [name] if name is not None else []


async def _not_running(host: HostConfig, transport: Transport, store: ProfileStore, name: str) -> str | None:
    """Why the host's unit is not running profile `name`, or None when it is: `--profile` names where
    the results go, and they belong there only if that profile ran."""
    from console.sources.service import ServiceController

    return await ServiceController(host, transport).why_not_running(store.load(name))


__all__ = ["format_table", "register", "run"]
