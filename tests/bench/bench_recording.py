"""Benchmark of recording and replay (issue 17).

    python tests/bench/bench_recording.py                 # prints the figures and a JSON line
    python tests/bench/bench_recording.py --write         # and replaces its section of docs/performance.md

* **size per hour** of one host at 2,000 journal lines/s: `--seconds` (default 60) of input written through
  the real `Recorder` (its encoding, zlib, SQLite commits once per recorded second), extrapolated to an
  hour. The journal entries are `journalctl -o json` objects with the fields journald gives a unit's
  stdout line (systemd 252: cursor, timestamps, boot and machine ids, PID/UID/GID, comm/exe/cmdline,
  capabilities, cgroup, unit, slice, invocation, stream id; ~1.1 kB each), whose MESSAGE is a real
  serving line of the corpus (decode and prefill statistics, access lines). Beside it, as a session
  records: 8 GPUs sampled each second and a server reading with a real-sized `/metrics` scrape every 2 s.
* **writer CPU**: the recorder thread's CPU per second of input, against the baseline of the same run:
  the console's own parse and fold of those lines (`HostFold.journal`), which it does anyway.
* **seek**: a replay of a `--minutes` (default 60) recording of that host at 2,000 lines/s (the same lines,
  written at once): the first seek to its end (every record read, decoded, parsed and folded), then a
  seek back to the middle and forward to the end again (from the checkpoints the first seek left).
  Baseline: parsing and folding the same number of lines straight from memory (what the seek cannot
  avoid: a replay goes through the same fold as live).

Not a timed test: pytest ignores tests/bench.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from console.core.gpus import HostGpuSample  # noqa: E402
from console.core.hostfold import HostFold  # noqa: E402
from console.core.metrics import SglangMetrics, parse_prometheus  # noqa: E402
from console.core.snapshot import HealthState, ServerSample  # noqa: E402
from console.sources.recording import Recorder, RecordingReader  # noqa: E402
from console.sources.replay import CHECKPOINT_S, Replay  # noqa: E402
from console.sources.session import CONSUME_BATCH  # noqa: E402

CORPUS = REPO.parent / "shared" / "corpus" / "public"
SERVING_CASES = ("case-15.log", "case-23.log", "case-24.log", "case-26.log", "case-37.log")
RATE = 2000
HOST = "gpu-a"
UNIT = "sglang.service"


def serving_lines() -> list[str]:
    out: list[str] = []
    for case in SERVING_CASES:
        text = (CORPUS / case).read_text(encoding="utf-8").removesuffix("\n").split("\n")
        out.extend(line for line in text if re.search(r"\] (Decode batch|Prefill batch|INFO: )", line))
    return out


def entry(i: int, msg: str, t_us: int) -> dict[str, Any]:
    return {
        "__CURSOR": f"s=4f0c8a1e2b3d4c5e;i={0x1A2B3C + i:x};b=9d2e0a7c6b1e4bb0a1d4c8f57f0e2b11;"
        f"m={t_us - 1_700_000_000_000_000:x};t={t_us:x};x={(i * 2654435761) & 0xFFFFFFFFFFFF:x}",
        "__REALTIME_TIMESTAMP": str(t_us),
        "__MONOTONIC_TIMESTAMP": str(t_us - 1_700_000_000_000_000),
        "__SEQNUM": str(0x1A2B3C + i),
        "__SEQNUM_ID": "4f0c8a1e2b3d4c5e9f1a2b3c4d5e6f70",
        "_BOOT_ID": "9d2e0a7c6b1e4bb0a1d4c8f57f0e2b11",
        "_MACHINE_ID": "3c1f8e2d4b5a69780a1b2c3d4e5f6a7b",
        "_HOSTNAME": HOST,
        "_TRANSPORT": "stdout",
        "PRIORITY": "6",
        "SYSLOG_FACILITY": "3",
        "SYSLOG_IDENTIFIER": "python3",
        "_PID": "41007",
        "_UID": "1001",
        "_GID": "1001",
        "_COMM": "python3",
        "_EXE": "/opt/sglang/venv/bin/python3.11",
        "_CMDLINE": "/opt/sglang/venv/bin/python3 -m sglang.launch_server --model-path moonshotai/Kimi-K2.6 "
        "--tp 8 --mem-fraction-static 0.93 --context-length 200000 --host 127.0.0.1 --port 30000",
        "_CAP_EFFECTIVE": "0",
        "_SELINUX_CONTEXT": "unconfined\n",
        "_SYSTEMD_CGROUP": f"/system.slice/{UNIT}",
        "_SYSTEMD_UNIT": UNIT,
        "_SYSTEMD_SLICE": "system.slice",
        "_SYSTEMD_INVOCATION_ID": "0b6c3f1e9a2d4e7f8c5b1a3d2e4f6a8b",
        "_STREAM_ID": "7e1d2c3b4a5f60718293a4b5c6d7e8f9",
        "_RUNTIME_SCOPE": "system",
        "MESSAGE": msg,
    }


def journal(n: int, start_us: int, lines: list[str]) -> list[dict[str, Any]]:
    return [entry(i, lines[i % len(lines)], start_us + i * 1_000_000 // RATE) for i in range(n)]


def gpu_sample() -> HostGpuSample:
    gpus = [
        {
            "index": i,
            "name": "NVIDIA H200",
            "uuid": f"GPU-{i:08x}-1111-2222-3333-444455556666",
            "utilization_pct": 97,
            "memory_used_mib": 131_072.0 + i,
            "memory_total_mib": 143_771.0,
            "processes": [{"pid": 41007 + i, "name": "python3", "used_memory_mib": 131_000.0}],
        }
        for i in range(8)
    ]
    return HostGpuSample.model_validate({"state": "ok", "gpus": gpus, "ts": 0.0, "backend": "agent"})


def metrics_text() -> str:
    """A /metrics page the size of SGLang 0.5.12's (~140 samples: gauges, counters, 4 histograms)."""
    out = []
    labels = 'model_name="moonshotai/Kimi-K2.6",engine_type="unified",tp_rank="0",pp_rank="0"'
    for name in ("num_running_reqs", "num_queue_reqs", "num_used_tokens", "token_usage", "gen_throughput",
                 "cache_hit_rate", "spec_accept_length", "num_grammar_queue_reqs"):  # fmt: skip
        out += [f"# TYPE sglang:{name} gauge", f"sglang:{name}{{{labels}}} 12.5"]
    for name in (
        "prompt_tokens_total",
        "generation_tokens_total",
        "num_requests_total",
        "cached_tokens_total",
    ):
        out += [f"# TYPE sglang:{name} counter", f"sglang:{name}{{{labels}}} 123456789"]
    bounds = (
        0.1,
        0.25,
        0.5,
        0.75,
        1,
        2,
        3,
        4,
        5,
        7.5,
        10,
        15,
        20,
        30,
        40,
        60,
        80,
        120,
        160,
        200,
        240,
        300,
        400,
    )
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                 "queue_time_seconds"):  # fmt: skip
        out.append(f"# TYPE sglang:{name} histogram")
        out += [f'sglang:{name}_bucket{{le="{b}",{labels}}} {i * 100}' for i, b in enumerate(bounds)]
        out += [f'sglang:{name}_bucket{{le="+Inf",{labels}}} 9999', f"sglang:{name}_sum{{{labels}}} 1234.5",
                f"sglang:{name}_count{{{labels}}} 9999"]  # fmt: skip
    return "\n".join(out) + "\n"


def server_sample(ts: float) -> ServerSample:
    scrape = parse_prometheus(metrics_text())
    return ServerSample(
        health=HealthState.OK,
        status_code=200,
        latency_s=0.004,
        metrics=SglangMetrics.from_metrics(scrape),
        scrape=scrape,
        ts=ts,
        version="0.5.12.post1",
        model="moonshotai/Kimi-K2.6",
    )


def record_seconds(path: Path, seconds: int, lines: list[str], start: float) -> tuple[Recorder, float]:
    """`seconds` of one host's input through the Recorder, committed once per recorded second as the
    writer thread does; the writer's CPU seconds."""
    now = [start]
    rec = Recorder(path, hosts=[HOST], policy=None, clock=lambda: now[0])
    gpu = gpu_sample()
    server = server_sample(start)
    cpu = 0.0
    for s in range(seconds):
        batch = journal(RATE, int((start + s) * 1e6), lines)
        for k in range(0, RATE, CONSUME_BATCH):
            now[0] = start + s + k / RATE
            rec.record(HOST, "journal", batch[k : k + CONSUME_BATCH])
        rec.record(HOST, "gpu", gpu)
        if s % 2 == 0:
            rec.record(HOST, "server", (server.model_copy(update={"ts": start + s}), 48.0))
        now[0] = start + s + 1
        t0 = time.thread_time()
        rec._write()  # what the writer thread does once a second
        cpu += time.thread_time() - t0
    return rec, cpu


def fold_cpu(seconds: int, lines: list[str], start: float) -> float:
    fold = HostFold(HOST)
    cpu = 0.0
    for s in range(seconds):
        batch = journal(RATE, int((start + s) * 1e6), lines)
        t0 = time.thread_time()
        for k in range(0, RATE, CONSUME_BATCH):
            fold.journal(batch[k : k + CONSUME_BATCH])
        cpu += time.thread_time() - t0
    return cpu


class Timed:
    """Wall seconds and this thread's CPU seconds of a block (the machine may be shared: the CPU figure
    is what the work costs, the wall figure what an operator waited here)."""

    def __enter__(self) -> Timed:
        self.wall, self.cpu = time.perf_counter(), time.thread_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.thread_time() - self.cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=60, help="input measured for the size and CPU figures")
    ap.add_argument("--minutes", type=int, default=60, help="length of the recording the seek runs over")
    ap.add_argument(
        "--write", action="store_true", help="replace the Recording section of docs/performance.md"
    )
    args = ap.parse_args(argv)
    lines = serving_lines()
    start = 1_780_000_000.0
    load_before = float(Path("/proc/loadavg").read_text().split()[0])
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="k26-bench-rec-") as tmp:
        path = Path(tmp) / "minute.k26rec"
        rec, write_cpu = record_seconds(path, args.seconds, lines, start)
        rec.close()
        base_cpu = fold_cpu(args.seconds, lines, start)
        out["measured_s"] = args.seconds
        out["mb_per_hour"] = rec.bytes_written / args.seconds * 3600 / 1e6
        out["raw_mb_per_hour"] = rec.raw_bytes / args.seconds * 3600 / 1e6
        out["file_mb_per_hour"] = path.stat().st_size / args.seconds * 3600 / 1e6
        out["ratio"] = rec.raw_bytes / max(rec.bytes_written, 1)
        out["writer_cpu_pct"] = write_cpu / args.seconds * 100
        out["fold_cpu_pct"] = base_cpu / args.seconds * 100
        print(json.dumps(out), flush=True)

        long = Path(tmp) / "hour.k26rec"
        t0 = time.perf_counter()
        rec, _ = record_seconds(long, args.minutes * 60, lines, start)
        rec.close()
        out["build_s"] = time.perf_counter() - t0
        out["hour_file_mb"] = long.stat().st_size / 1e6 * 60 / args.minutes
        print(f"built {args.minutes} min in {out['build_s']:.0f} s", flush=True)
        with RecordingReader(long) as reader:
            replay = Replay(reader)
            with Timed() as t:
                replay.seek(replay.end)
            out["seek_end_s"], out["seek_end_cpu_s"] = t.wall, t.cpu
            assert replay.hosts[HOST].follower.entries == RATE * args.minutes * 60
            with Timed() as t:
                replay.seek((replay.start + replay.end) / 2)
            out["seek_back_s"], out["seek_back_cpu_s"] = t.wall, t.cpu
            with Timed() as t:
                replay.seek(replay.end)
            out["seek_again_s"], out["seek_again_cpu_s"] = t.wall, t.cpu
        with Timed() as t:
            fold_cpu(args.minutes * 60, lines, start)
        out["fold_only_s"], out["fold_only_cpu_s"] = t.wall, t.cpu
    out["minutes"] = args.minutes
    out["load_before"] = load_before
    out["load"] = float(Path("/proc/loadavg").read_text().split()[0])
    print(json.dumps(out), flush=True)
    if args.write:
        write_section(REPO / "docs" / "performance.md", section(out))
    return 0


def section(f: dict[str, float]) -> str:
    minutes = int(f["minutes"])
    hour = 60 / minutes  # the seek's cost is linear in the records it folds

    def seek_row(label: str, key: str, base: str) -> str:
        return (
            f"| {label} | {f[key + '_cpu_s'] * hour:,.0f} s CPU ({f[key + '_cpu_s']:.1f} s for {minutes} min; "
            f"{f[key + '_s']:.1f} s wall) | {base} |"
        )

    def bounded_row(label: str, key: str) -> str:
        return f"| {label} | {f[key + '_cpu_s']:.1f} s CPU ({f[key + '_s']:.1f} s wall) | at most {CHECKPOINT_S:g} s of input |"

    return f"""## Recording and replay (issue 17)

`python tests/bench/bench_recording.py` (issue 17): one host at 2,000 journal lines/s of real corpus serving
lines in full `journalctl -o json` entries (~1.1 kB each), 8 GPUs sampled each second, a server reading with
a /metrics scrape of ~140 samples every 2 s. Measured on the shared 2-core machine (load average
{f["load_before"]:.0f} at the start, {f["load"]:.0f} at the end): the CPU figures are what the work costs (the
thread's own CPU time); the wall times include waiting for the CPU behind the other processes.

| figure | value | baseline (same run) |
|---|---|---|
| recording size per hour (zlib chunks) | {f["mb_per_hour"]:,.0f} MB | {f["raw_mb_per_hour"]:,.0f} MB of JSON before compression ({f["ratio"]:.1f}x) |
| file size per hour (SQLite pages) | {f["file_mb_per_hour"]:,.0f} MB | — |
| writer thread CPU | {f["writer_cpu_pct"]:.1f}% of a core | parse and fold of the same lines: {f["fold_cpu_pct"]:.1f}% |
{seek_row("seek to the end of a one-hour recording (first time)", "seek_end", f"parse and fold alone: {f['fold_only_cpu_s'] * hour:,.0f} s CPU")}
{bounded_row("then back to the middle", "seek_back")}
{bounded_row("then forward to the end again", "seek_again")}

Extrapolated, and so labelled: the size per hour from {int(f["measured_s"])} s of input, and the first seek from a
{minutes}-minute recording (× {hour:g}; it folds every record before its target, so its cost is linear in
them; the later seeks do not depend on the recording's length). With the default bound (2 GiB, 7 days) a recording of such a host keeps about
{2 * 1024**3 / 1e6 / f["file_mb_per_hour"]:.0f} hours; a quiet host, weeks. The first seek to the end reads,
decodes, parses and folds every line, and the server readings into the serving window: what the live
session spent on them, plus reading and decoding (a cProfile of a one-minute seek, run by hand: parsing 66%,
folding 17%, reading and decoding the chunks 15%). Later
seeks start from the checkpoint before the target (a copy of the fold every {CHECKPOINT_S:g} s of recording,
kept in memory as the cursor passes), so they cost at most {CHECKPOINT_S:g} s of input whatever the length.
The replay's screen stays live meanwhile (the seek runs in a thread). A faster first seek would need the
recorder to write the whole fold (parser, serving window, readings) now and then, which it does not.
"""


def write_section(path: Path, text: str) -> None:
    doc = path.read_text() if path.exists() else "# Performance\n\n"
    start = doc.find("## Recording and replay (issue 17)\n")
    if start < 0:
        doc = doc.rstrip("\n") + "\n\n" + text
    else:
        nxt = doc.find("\n## ", start + 1)
        rest = "\n" + doc[nxt + 1 :] if nxt >= 0 else ""
        doc = doc[:start] + text.rstrip("\n") + "\n" + rest
    path.write_text(doc.rstrip("\n") + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
