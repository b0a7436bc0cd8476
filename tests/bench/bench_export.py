"""Benchmark of `k26-console export`'s scrape, with baselines measured in the same run.

    python tests/bench/bench_export.py                      # 1, 4, 16 and 64 hosts, 200 scrapes each
    python tests/bench/bench_export.py --hosts 8 --scrapes 500

Each host is a real journal from the reference corpus (../shared/corpus/public, all of its cases folded
one after another into one host's state: every boot, error and pool of the public cases) with a sample of
8 GPUs, as a `HostSnapshot` the way `HostSession` publishes it. A scrape is what Prometheus triggers:
`GET /metrics` over loopback on prometheus_client's own HTTP server, where `ExportCollector.collect`
builds every family from every host's newest snapshot (`core.export.host_figures`: the fold's pool,
phases over every boot, the verdict, errors, memory split).

Baselines, same run, same sample count:
  * `static`: the same text from a registry of plain `Gauge`/`Histogram` objects set once (what a scrape
    costs when nothing is computed at scrape time: prometheus_client's rendering alone);
  * `empty`: `GET /metrics` of a registry with no metric (the HTTP round trip alone).

Not a timed test: pytest ignores tests/bench. The machine is shared: the ratio to the baselines is the
steadier figure.
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from prometheus_client import CollectorRegistry, Gauge, Histogram, start_http_server  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from console.core.export import PHASE_BUCKETS_S, HostExtras, HostFigures, ProbePoint  # noqa: E402
from console.core.gpus import GpuSample, HostGpuSample, SamplerState  # noqa: E402
from console.core.parser import parse_lines  # noqa: E402
from console.core.snapshot import ConnectionStatus, ConnState, HostSnapshot  # noqa: E402
from console.core.state import Boot, HostState  # noqa: E402
from console.sources.exporter import BASE_LABELS, ExportCollector, FigureCache  # noqa: E402

CORPUS = REPO.parent / "shared" / "corpus" / "public"


def corpus_state() -> HostState:
    """Every boot of every public case, one after another, as one host's history."""
    boots: list[Boot] = []
    for path in sorted(CORPUS.glob("*.log")):
        state = HostState().apply_all(parse_lines(path.read_text(errors="replace").split("\n")))
        boots.extend(b.model_copy(update={"index": len(boots) + i}) for i, b in enumerate(state.boots))
    if not boots:
        sys.exit(f"bench_export: no corpus journals in {CORPUS}")
    # the newest boot a sized, serving one (the usual state of a host being scraped)
    sized = [b for b in boots if b.pool.tokens is not None]
    return HostState(boots=(*boots, sized[-1].model_copy(update={"index": len(boots)})))


def snapshot(name: str, state: HostState) -> HostSnapshot:
    gib = 1024.0
    gpus = tuple(
        GpuSample(index=i, name="NVIDIA H200", memory_used_mib=130 * gib + i, memory_total_mib=141 * gib)
        for i in range(8)
    )
    return HostSnapshot(
        host=name,
        state=state,
        connection=ConnectionStatus(host=name, state=ConnState.UP, since=0.0),
        gpus=HostGpuSample(state=SamplerState.OK, gpus=gpus, ts=0.0, host=name),
    )


class Live:
    """A host as the exporter holds it: the newest snapshot, figures built at each scrape through the
    exporter's own `FigureCache` (as `HostExport.figures` does)."""

    def __init__(self, snap: HostSnapshot, extras: HostExtras) -> None:
        self.name = snap.host
        self.snap = snap
        self.extras = extras
        self.cache = FigureCache(unit="sglang.service")

    def figures(self) -> HostFigures:
        return self.cache.figures(self.snap, self.extras)


def static_registry(figures: list[HostFigures]) -> CollectorRegistry:
    """The same series as plain prometheus_client metrics, set once."""
    reg = CollectorRegistry(auto_describe=False)
    text = _scrape_text(ExportCollector([_Fixed(f) for f in figures]))
    gauges: dict[str, Gauge] = {}
    hist: dict[str, Histogram] = {}
    for fam in text_string_to_metric_families(text):
        if fam.type == "histogram":
            extra = sorted({k for s in fam.samples for k in s.labels} - {"le", *BASE_LABELS})
            h = Histogram(
                fam.name, fam.documentation, [*BASE_LABELS, *extra], buckets=PHASE_BUCKETS_S, registry=reg
            )
            hist[fam.name] = h
            for s in fam.samples:
                if s.name.endswith("_count"):
                    child = h.labels(**{k: v for k, v in s.labels.items()})
                    for _ in range(int(s.value)):
                        child.observe(30.0)
            continue
        extra = sorted({k for s in fam.samples for k in s.labels} - set(BASE_LABELS))
        g = Gauge(fam.name, fam.documentation, [*BASE_LABELS, *extra], registry=reg)
        gauges[fam.name] = g
        for s in fam.samples:
            g.labels(**s.labels).set(s.value)
    return reg


class _Fixed:
    def __init__(self, f: HostFigures) -> None:
        self.name = f.host
        self._f = f

    def figures(self) -> HostFigures:
        return self._f


def _scrape_text(collector: ExportCollector) -> str:
    from prometheus_client import generate_latest

    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return generate_latest(reg).decode()


def serve(reg: CollectorRegistry) -> tuple[str, Callable[[], None]]:
    server, thread = start_http_server(0, addr="127.0.0.1", registry=reg)
    port = server.server_address[1]

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(5)

    return f"http://127.0.0.1:{port}/metrics", stop


def time_scrapes(url: str, n: int) -> tuple[list[float], int]:
    times: list[float] = []
    size = 0
    for _ in range(n):
        t0 = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as res:
            size = len(res.read())
        times.append(time.perf_counter() - t0)
    return times, size


def fmt(times: list[float]) -> str:
    ms = sorted(t * 1000 for t in times)
    p95 = ms[min(len(ms) - 1, int(len(ms) * 0.95))]
    return f"p50 {statistics.median(ms):7.2f} ms  p95 {p95:7.2f} ms  min {ms[0]:7.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, nargs="*", default=[1, 4, 16, 64])
    ap.add_argument("--scrapes", type=int, default=200)
    args = ap.parse_args()

    t0 = time.perf_counter()
    state = corpus_state()
    fold_s = time.perf_counter() - t0
    boots = len(state.boots)
    extras = HostExtras(
        profile="ctx-200k",
        target_context=200_000,
        predicted_pool_tokens=218_000,
        lock_holder="ana@jump1",
        lock_intent="apply ctx-200k",
        probe=tuple(
            ProbePoint(depth=d, decode_tok_s=50.0, bandwidth_gbs=900.0) for d in (2_000, 8_000, 64_000)
        ),
        probe_time=0.0,
    )
    print(
        f"bench_export: {platform.python_implementation()} {platform.python_version()}, {platform.machine()}"
    )
    print(
        f"one host = the public corpus folded: {boots} boots (folded in {fold_s:.2f} s), 8 GPUs, 3 probe depths"
    )
    print(f"{args.scrapes} scrapes per figure, GET /metrics over loopback\n")
    empty_url, stop_empty = serve(CollectorRegistry(auto_describe=False))
    try:
        empty, _ = time_scrapes(empty_url, args.scrapes)
    finally:
        stop_empty()
    print(f"{'empty registry':>28}: {fmt(empty)}")
    for n in args.hosts:
        lives = [Live(snapshot(f"gpu-{i:03d}", state), extras) for i in range(n)]
        reg = CollectorRegistry(auto_describe=False)
        reg.register(ExportCollector(lives))
        static = static_registry([h.figures() for h in lives])
        gc.collect()
        url, stop = serve(reg)
        try:
            live_t, size = time_scrapes(url, args.scrapes)
        finally:
            stop()
        url, stop = serve(static)
        try:
            static_t, static_size = time_scrapes(url, args.scrapes)
        finally:
            stop()
        series = sum(
            1 for line in _scrape_text(ExportCollector(lives)).split("\n") if line and line[0] != "#"
        )
        print(f"{n:>3} host(s), {series:>6} series, {size / 1024:7.1f} KiB")
        print(f"{'export (collector)':>28}: {fmt(live_t)}")
        print(f"{'static gauges (baseline)':>28}: {fmt(static_t)}  ({static_size / 1024:.1f} KiB)")
        ratio = statistics.median(live_t) / statistics.median(static_t)
        print(
            f"{'collector / static':>28}: {ratio:.2f}x   per host p50 {statistics.median(live_t) * 1000 / n:.2f} ms\n"
        )


if __name__ == "__main__":
    main()
