"""`k26-console export`: the Prometheus exporter against the twin, checked by promtool and scraped by a
real Prometheus server (Debian's `prometheus`, started by the test on loopback and stopped by its PID).

Also: the families built from a real journal (the corpus) carry the fold's pool and pass promtool, a
host that drops keeps its values with `k26_up` 0 and comes back, and bad input is one sentence.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from console.cli import cmd_export
from console.cli.main import build_parser
from console.core.confirm import PendingRollback
from console.core.export import HostExtras, HostFigures, host_figures, phase_durations
from console.core.pairing import Identity
from console.core.parser import parse_lines
from console.core.snapshot import ConnectionStatus, ConnState, HostSnapshot
from console.core.state import HostState
from console.sources.exporter import ExportCollector, FigureCache, families
from console.sources.hosts import load_hosts
from console.sources.hoststate import HostStateDir
from console.sources.transport import Transport
from console.twin.host import TwinHost, free_port
from tests.support.cli import CLI, REPO, operator_env, run_cli, wait_until
from tests.support.twins import module_twin

SHARED = REPO.parent / "shared"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")


def _corpus_journal(name: str = "case-01.log") -> Path:
    """A real journal from the reference corpus: case-01 has a pool and two errors in its boot."""
    path = SHARED / "corpus" / "public" / name
    if not path.is_file():
        pytest.skip(f"the reference corpus is not at {path.parent}")
    return path


class Named:
    def __init__(self, name: str, figures: HostFigures) -> None:
        self.name = name
        self._figures = figures

    def figures(self) -> HostFigures:
        return self._figures


def promtool_check(text: str) -> None:
    if PROMTOOL is None:
        pytest.skip("promtool is not installed (Debian package prometheus; scripts/bootstrap --dev)")
    res = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stdout + res.stderr


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def test_families_from_a_real_journal_carry_its_pool_and_pass_promtool() -> None:
    path = _corpus_journal()
    state = HostState().apply_all(parse_lines(path.read_text(errors="replace").split("\n")))
    latest = state.latest
    assert latest is not None and latest.pool.tokens is not None
    snap = HostSnapshot(
        host="gpu-a",
        state=state,
        connection=ConnectionStatus(host="gpu-a", state=ConnState.UP, since=0.0),
    )
    extras = HostExtras(
        profile="ctx-200k",
        target_context=200_000,
        lock_holder="ana@jump",
        lock_intent="apply",
        pending_deadline=1_800_000_000.5,
    )
    figures = host_figures(snap, extras, unit="sglang.service")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExportCollector([Named("gpu-a", figures)]))
    text = generate_latest(registry).decode()
    promtool_check(text)
    got = samples(text)
    (labels, pool), *_ = got["k26_kv_pool_tokens"]
    assert pool == latest.pool.tokens
    assert labels == {
        "host": "gpu-a",
        "unit": "sglang.service",
        "model": figures.model,
        "profile": "ctx-200k",
    }
    assert got["k26_up"][0][1] == 1.0
    assert got["k26_target_context_tokens"][0][1] == 200_000
    assert ({**labels, "holder": "ana@jump", "intent": "apply"}, 1.0) in got["k26_lock_held"]
    assert got["k26_pending_rollback_deadline_seconds"] == [({**labels, "active": "true"}, 1_800_000_000.5)]
    errors = {lab["category"]: v for lab, v in got.get("k26_errors_since_boot", [])}
    want: dict[str, float] = {}
    for err in latest.errors:
        want[err.category] = want.get(err.category, 0) + 1
    assert errors == want
    assert errors == {"scheduler_exception": 1.0, "sigquit": 1.0}
    phases = [lab["phase"] for lab, v in got["k26_boot_phase"] if v == 1.0]
    assert phases == [latest.phase]
    # the histogram counts every boot that showed a phase's start and the next one's
    durations = phase_durations(latest)
    for phase, seconds in durations.items():
        count = [v for lab, v in got["k26_startup_phase_duration_seconds_count"] if lab["phase"] == phase]
        assert count and count[0] >= 1, (phase, seconds)


def test_a_host_removed_from_the_collector_takes_its_series_with_it() -> None:
    state = HostState()
    snaps = {
        name: HostSnapshot(
            host=name, state=state, connection=ConnectionStatus(host=name, state=ConnState.UP, since=0)
        )
        for name in ("a", "b")
    }

    class Fixed:
        def __init__(self, name: str) -> None:
            self.name = name

        def figures(self) -> HostFigures:
            return host_figures(snaps[self.name], None, unit="u.service")

    collector = ExportCollector([Fixed("a"), Fixed("b")])
    hosts = {lab["host"] for lab, _ in samples(_text(collector))["k26_up"]}
    assert hosts == {"a", "b"}
    collector.remove("a")
    text = _text(collector)
    assert {lab["host"] for lab, _ in samples(text)["k26_up"]} == {"b"}
    assert 'host="a"' not in text


def _text(collector: ExportCollector) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode()


def test_bad_listen_and_unknown_host_are_one_sentence(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[hosts.a]\nssh = "127.0.0.1"\n')
    for args, words in (
        (["--listen", "nowhere"], "--listen wants ADDRESS:PORT"),
        (["--listen", "127.0.0.1:99999"], "--listen wants ADDRESS:PORT"),
        (["--listen", "example.org:9426"], "--listen wants an IP address"),
        (["--poll", "0"], "--poll wants"),
        (["nosuch-host.invalid"], "nosuch-host.invalid"),
    ):
        res = run_cli(tmp_path, "export", "a", "--hosts", str(hosts), *args, timeout=60)
        assert res.returncode == 2, res.stderr
        assert res.stderr.startswith("k26-console: ") and words in res.stderr
        assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    res = run_cli(tmp_path, "export", "--hosts", str(empty), timeout=60)
    assert res.returncode == 2 and "no HOST given and the hosts file lists none" in res.stderr
    with socket.socket() as busy:  # an address something else holds
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        res = run_cli(
            tmp_path, "export", "a", "--hosts", str(hosts), "--listen", f"127.0.0.1:{taken}", timeout=60
        )
    assert res.returncode == 2 and f"cannot listen on 127.0.0.1:{taken}" in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr


# --------------------------------------------------------------------------------------------------
# Against the twin: promtool, a real Prometheus, a host that goes away
# --------------------------------------------------------------------------------------------------


def _get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as res:
        return str(res.read().decode())


def _metrics(port: int) -> str | None:
    try:
        return _get(f"http://127.0.0.1:{port}/metrics")
    except OSError:
        return None


def _value(text: str | None, name: str, host: str = "twin") -> float | None:
    if text is None:
        return None
    for lab, v in samples(text).get(name, []):
        if lab.get("host") == host:
            return v
    return None


twin = module_twin("export")


def _start(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture
def exporter(twin: TwinHost, tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    port = free_port()
    proc = _start(
        [
            *CLI,
            "export",
            "twin",
            "--hosts",
            str(twin.hosts_toml),
            "--listen",
            f"127.0.0.1:{port}",
            "--poll",
            "1",
        ],
        tmp_path / "export.log",
        env=operator_env(tmp_path),
    )
    try:
        yield port, proc
    finally:
        _stop(proc)
        assert proc.returncode == 0, (tmp_path / "export.log").read_text()


def _twin_pool(twin: TwinHost) -> int:
    from console.cli.remote_journal import remote_boots

    boots, _ = remote_boots("twin", str(twin.hosts_toml))
    tokens = boots[-1].pool.tokens
    assert tokens is not None
    return tokens


def test_export_serves_the_twin_to_promtool_and_a_real_prometheus(
    twin: TwinHost, exporter: tuple[int, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    if PROMETHEUS is None or PROMTOOL is None:
        pytest.skip(
            "prometheus/promtool are not installed (Debian package prometheus; scripts/bootstrap --dev)"
        )
    port, _proc = exporter
    pool = _twin_pool(twin)
    assert wait_until(lambda: _value(_metrics(port), "k26_kv_pool_tokens") == pool, 60), _metrics(port)

    def memory_split(text: str | None) -> dict[str, float]:
        rows = samples(text)["k26_boot_memory_gib"] if text is not None else []
        return {lab["part"]: v for lab, v in rows if lab["host"] == "twin"}

    # The pool is in the journal before the CUDA graphs' capture and the boot's end: the split is whole
    # once the boot is.
    assert wait_until(lambda: len(memory_split(_metrics(port))) == 4, 60), _metrics(port)
    text = _metrics(port)
    assert text is not None
    promtool_check(text)
    assert _value(text, "k26_up") == 1.0
    assert _value(text, "k26_boot_phase") is not None
    parts = memory_split(text)
    assert set(parts) == {"weights", "kv_cache", "cuda_graphs", "free"}, parts
    assert parts["free"] == _value(text, "k26_headroom_gib") and parts["weights"] > parts["kv_cache"] > 0

    prom_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: k26\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{port}']\n"
    )
    prom = _start(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        tmp_path / "prometheus.log",
    )
    try:
        query = urllib.parse.urlencode({"query": 'k26_kv_pool_tokens{host="twin"}'})

        def answered() -> float | None:
            try:
                doc = json.loads(_get(f"http://127.0.0.1:{prom_port}/api/v1/query?{query}"))
            except (OSError, ValueError):
                return None
            result = doc.get("data", {}).get("result", [])
            return float(result[0]["value"][1]) if result else None

        assert wait_until(lambda: answered() == pool, 60, 0.5), (tmp_path / "prometheus.log").read_text()[
            -2000:
        ]
    finally:
        _stop(prom)


def test_a_host_that_goes_away_shows_up_0_keeps_its_values_and_recovers(
    twin: TwinHost, exporter: tuple[int, subprocess.Popen[bytes]]
) -> None:
    port, _ = exporter
    assert wait_until(lambda: _value(_metrics(port), "k26_up") == 1.0, 60), _metrics(port)
    assert wait_until(lambda: _value(_metrics(port), "k26_kv_pool_tokens") is not None, 60)
    pool = _value(_metrics(port), "k26_kv_pool_tokens")
    twin.cut_ssh()
    try:
        assert wait_until(lambda: _value(_metrics(port), "k26_up") == 0.0, 60), _metrics(port)
        # the last values stay, marked by up = 0
        assert _value(_metrics(port), "k26_kv_pool_tokens") == pool
    finally:
        twin.restore_ssh()
    assert wait_until(lambda: _value(_metrics(port), "k26_up") == 1.0, 90), _metrics(port)
    assert _value(_metrics(port), "k26_kv_pool_tokens") == pool


def test_the_lock_holder_and_the_last_probe_show_up_and_the_lock_goes_away_on_release(
    twin: TwinHost, exporter: tuple[int, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    port, _ = exporter
    # a probe run by the same operator (same state dir): its history is what the exporter reads
    res = run_cli(
        tmp_path, "probe", "twin", "--depth", "2k", "--tokens", "3", "--hosts", str(twin.hosts_toml)
    )
    assert res.returncode == 0, res.stderr
    record = json.loads((tmp_path / "state" / "k26-console" / "probes.jsonl").read_text().split("\n")[0])
    tok_s = record["result"]["decode_tok_s"]
    assert wait_until(lambda: _value(_metrics(port), "k26_probe_decode_tokens_per_second") == tok_s, 30)
    text = _metrics(port)
    assert [lab["depth"] for lab, _ in samples(text or "")["k26_probe_decode_tokens_per_second"]] == ["2000"]

    config = load_hosts(twin.hosts_toml).hosts[twin.name]
    me = Identity(user="alice", jump_host="jump1", pid=4242, console_id="alice1")

    def held(text: str | None) -> list[tuple[dict[str, str], float]]:
        return [(lab, v) for lab, v in samples(text or "").get("k26_lock_held", []) if v == 1.0]

    async def hold_then_release() -> None:
        async with Transport(config, ssh_config=[]) as transport:
            state = HostStateDir(transport, config, me)
            lock = await state.locks.acquire("apply ctx-200k")
            try:
                seen = await asyncio.to_thread(wait_until, lambda: held(_metrics(port)), 30)
                assert seen, _metrics(port)
                ((labels, _),) = held(_metrics(port))
                assert (labels["holder"], labels["intent"]) == ("alice@jump1", "apply ctx-200k")
            finally:
                await lock.release()
            assert await asyncio.to_thread(wait_until, lambda: not held(_metrics(port)), 30)

    asyncio.run(hold_then_release())
    # the predicted pool for the running flags: the planner calibrated on the twin's own boots
    pool = _value(_metrics(port), "k26_kv_pool_tokens")
    predicted = _value(_metrics(port), "k26_predicted_pool_tokens")
    assert pool is not None and predicted is not None
    assert abs(predicted - pool) / pool < 0.02


def test_the_figure_cache_gives_what_a_fresh_fold_gives_as_the_journal_grows() -> None:
    lines = _corpus_journal("case-03.log").read_text(errors="replace").split("\n")
    cache = FigureCache(unit="u.service")
    state = HostState()
    seen_phases = 0
    for chunk in range(0, len(lines), max(1, len(lines) // 7)):
        state = state.apply_all(parse_lines(lines[chunk : chunk + max(1, len(lines) // 7)]))
        snap = HostSnapshot(host="h", state=state)
        cached = cache.figures(snap, None)
        assert cached == host_figures(snap, None, unit="u.service")
        seen_phases = max(seen_phases, len(cached.phase_durations))
    assert seen_phases >= 2  # the startup's phases showed up along the way, not only at the end


def _exported_names() -> set[str]:
    """Every sample name the exporter can produce (a histogram's _bucket, _count and _sum included)."""
    names: set[str] = set()
    for fam in families([]):
        names.add(fam.name)
        if fam.type == "histogram":
            names |= {fam.name + s for s in ("_bucket", "_count", "_sum")}
    return names


def test_the_grafana_dashboard_queries_only_metrics_the_exporter_serves() -> None:
    doc = json.loads((REPO / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bk26_[a-z0-9_]+", e)}
    assert used and used <= _exported_names(), used - _exported_names()
    # built on SGLang's own metrics too, by the names SGLang exports (those the console reads)
    sglang = {m for e in exprs for m in re.findall(r"\bsglang:[a-z0-9_]+", e)}
    assert {"sglang:num_running_reqs", "sglang:token_usage", "sglang:gen_throughput"} <= sglang
    known = (REPO / "console" / "core" / "metrics.py").read_text()
    for name in sglang:
        assert f'"{name.removesuffix("_bucket")}"' in known, name
    # every family of the exporter is on some panel
    assert {f.name for f in families([])} - {m.removesuffix("_bucket") for m in used} <= {
        "k26_server_healthy",
        "k26_probe_time_seconds",
    }


def test_the_systemd_unit_example_runs_a_valid_export_command() -> None:
    unit = (REPO / "docs" / "k26-console-export.service").read_text()
    (exec_start,) = [line for line in unit.split("\n") if line.startswith("ExecStart=")]
    argv = shlex.split(exec_start.removeprefix("ExecStart="))
    assert argv[0].endswith("/k26-console") and argv[1] == "export"
    args = build_parser().parse_args(argv[1:])
    assert args.func is cmd_export.run
    assert cmd_export.parse_listen(args.listen) == ("127.0.0.1", 9426)


def test_a_pending_rollback_record_on_the_host_shows_its_deadline_and_whether_its_timer_waits(
    twin: TwinHost, exporter: tuple[int, subprocess.Popen[bytes]]
) -> None:
    port, _ = exporter
    state_dir = twin.layout.home_dir / ".k26-console"
    state_dir.mkdir(exist_ok=True)
    record = state_dir / "pending-rollback.json"
    deadline = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    pending = PendingRollback(
        unit=twin.unit_name,
        timer="k26-rollback-x",
        deadline=deadline,
        armed_at=deadline,
        armed_by="ana@jump1",
        profile="ctx-200k",
        confirm_within_s=300,
    )
    record.write_text(pending.model_dump_json() + "\n")

    def deadline_series() -> list[tuple[dict[str, str], float]]:
        return samples(_metrics(port) or "").get("k26_pending_rollback_deadline_seconds", [])

    try:
        assert wait_until(deadline_series, 30), _metrics(port)
        ((labels, value),) = deadline_series()
        # no timer of that name waits on the twin: the record is there, the rollback will not fire
        assert (labels["active"], value) == ("false", deadline.timestamp())
    finally:
        record.unlink()
    assert wait_until(lambda: not deadline_series(), 30), _metrics(port)


def test_a_host_that_never_answers_is_up_0_beside_a_live_one(twin: TwinHost, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.toml"
    dead_port = free_port()  # nothing listens there: every connect is refused
    hosts.write_text(twin.hosts_toml.read_text() + f'\n[hosts.gone]\nssh = "127.0.0.1"\nport = {dead_port}\n')
    port = free_port()
    proc = _start(
        [*CLI, "export", "--hosts", str(hosts), "--listen", f"127.0.0.1:{port}", "--poll", "1"],
        tmp_path / "export.log",
        env=operator_env(tmp_path),
    )
    try:
        pool = _twin_pool(twin)
        assert wait_until(lambda: _value(_metrics(port), "k26_kv_pool_tokens") == pool, 60), _metrics(port)
        text = _metrics(port)
        assert _value(text, "k26_up", "gone") == 0.0 and _value(text, "k26_up") == 1.0
        assert _value(text, "k26_kv_pool_tokens", "gone") is None  # nothing known: no value, not a 0
        promtool_check(text or "")
    finally:
        _stop(proc)
    assert proc.returncode == 0, (tmp_path / "export.log").read_text()


def test_sighup_rereads_the_hosts_file_and_a_removed_host_s_series_are_gone(
    twin: TwinHost, tmp_path: Path
) -> None:
    hosts = tmp_path / "hosts.toml"
    base = twin.hosts_toml.read_text()
    hosts.write_text(base + f'\n[hosts.gone]\nssh = "127.0.0.1"\nport = {free_port()}\n')
    port = free_port()
    log = tmp_path / "export.log"
    proc = _start(
        [*CLI, "export", "--hosts", str(hosts), "--listen", f"127.0.0.1:{port}", "--poll", "1"],
        log,
        env=operator_env(tmp_path),
    )
    try:
        assert wait_until(lambda: _value(_metrics(port), "k26_up", "gone") == 0.0, 60), log.read_text()
        assert wait_until(lambda: _value(_metrics(port), "k26_up") == 1.0, 60), log.read_text()
        # "gone" leaves the file, "other" comes in
        hosts.write_text(base + f'\n[hosts.other]\nssh = "127.0.0.1"\nport = {free_port()}\n')
        proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: 'host="gone"' not in (_metrics(port) or 'host="gone"'), 30), _metrics(port)
        assert wait_until(lambda: _value(_metrics(port), "k26_up", "other") == 0.0, 30), _metrics(port)
        assert _value(_metrics(port), "k26_up") == 1.0  # the twin followed on, untouched
        # a broken file is said and changes nothing
        hosts.write_text("[hosts.x\n")
        proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: "hosts not reloaded" in log.read_text(), 30), log.read_text()
        assert _value(_metrics(port), "k26_up", "other") == 0.0
    finally:
        _stop(proc)
    assert proc.returncode == 0, log.read_text()
    assert "removed gone" in log.read_text() and "started other" in log.read_text()
