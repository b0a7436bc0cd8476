"""`k26-console snapshot` against a twin, as an operator runs it: a twin under `--load`, and one whose
service is stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from console.core.metrics import parse_prometheus
from tests.support.cli import CLI, one_sentence, operator_env, run_cli, started_twin, wait_until


def _metrics(url: str) -> str:
    try:
        return httpx.get(url + "/metrics", trust_env=False, timeout=5).text
    except httpx.HTTPError:
        return ""


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, str]]:
    """`k26-console twin --load 2` in a process of its own: (operator home, hosts.toml, server URL)."""
    root = tmp_path_factory.mktemp("loaded")
    home = root / "home"
    out = root / "twin.out"
    with out.open("w") as stdout, (root / "twin.err").open("w") as stderr:
        proc = subprocess.Popen(
            [
                *CLI,
                "twin",
                "--state-dir",
                str(root / "state"),
                "--no-register",
                "--scenario",
                "healthy",
                "--time-scale",
                "0.02",
                "--load",
                "2",
            ],
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            env=operator_env(home),
        )
    try:
        assert wait_until(lambda: "serving a load" in out.read_text() or proc.poll() is not None, 180)
        text = out.read_text()
        assert "serving a load" in text, (text, (root / "twin.err").read_text())
        url = text.split(" on ")[-1].strip()
        # a steady load: requests have come and gone, decode steps by the hundred
        assert wait_until(lambda: finished(_metrics(url)) >= 20, 120, interval_s=0.5)
        yield home, root / "state" / "hosts.toml", url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def finished(text: str) -> float:
    """Requests the server has finished (its e2e histogram's count)."""
    return parse_prometheus(text).total("sglang:e2e_request_latency_seconds_count") or 0.0


@pytest.mark.timeout(400)
def test_snapshot_under_load_agrees_with_the_probe_on_inter_token_latency(
    loaded: tuple[Path, Path, str],
) -> None:
    home, hosts, _ = loaded
    snap = run_cli(
        home, "snapshot", "twin", "--hosts", str(hosts), "--json", "--window", "5m", "--target-context", "32k"
    )
    assert snap.returncode == 0, snap.stderr
    report = json.loads(snap.stdout)
    probe = run_cli(home, "probe", "twin", "--hosts", str(hosts), "--depth", "1k", "--tokens", "64", "--json")
    assert probe.returncode == 0, probe.stderr
    measured = json.loads(probe.stdout)["results"][0]["itl_p50_s"]

    serving = report["serving"]
    assert serving["window_s"] == 300.0 and serving["scrapes"] == 2
    assert 1.5 <= serving["covered_s"] <= 10.0  # what the window really was: the --sample period
    itl = serving["itl"]
    assert itl["metric"] == "sglang:inter_token_latency_seconds" and itl["count"] > 0
    assert abs(itl["p50"] - measured) <= 0.2 * measured, (itl, measured)
    assert serving["gen_tok_s"] > 0 and serving["running"] is not None and serving["kv_pool"] > 0
    # exported, so present even when the 2 s window held no new request (then its quantiles are None)
    assert serving["queue_time"] is not None and serving["ttft"] is not None and serving["e2e"] is not None
    print(f"ITL p50: snapshot {itl['p50']:.5f} s over {itl['count']:.0f} steps, probe {measured:.5f} s")
    assert report["service"]["active_state"] == "active" and report["problems"] == []
    assert report["boot"]["state"] == "ready" and report["server_version"] == "0.5.12.post1"
    assert len(report["gpus"]) == 8 and all(g["parts"] for g in report["gpus"])
    assert report["pool"]["pool_tokens"] == serving["kv_pool"]
    assert report["pool"]["target"] == 32_000 and report["pool"]["target_source"] == "--target-context"
    assert report["lock"] is None and report["incomplete"] == []
    text = run_cli(home, "snapshot", "twin", "--hosts", str(hosts), "--sample", "1s")
    assert text.returncode == 0, text.stderr
    assert "ITL: p50" in text.stdout and "problems: none" in text.stdout


@pytest.mark.timeout(300)
def test_snapshot_exits_1_when_an_alert_of_the_config_fires_and_0_when_none_does(
    loaded: tuple[Path, Path, str],
) -> None:
    home, hosts, _ = loaded
    table = hosts.read_text()

    def snapshot_with(alerts: str) -> subprocess.CompletedProcess[str]:
        config = hosts.parent / "alerting.toml"
        config.write_text(table + "\n[alerts]\n" + alerts + "\n")
        return run_cli(home, "snapshot", "twin", "--hosts", str(config), "--json", "--sample", "1s")

    # Under load the twin generates tokens: a rule on that figure fires; one on a queue it never has does not.
    firing = snapshot_with('rules = ["gen_tok_s > 1", "queue > 100000"]')
    assert firing.returncode == 1, firing.stderr
    report = json.loads(firing.stdout)
    assert [a["rule"] for a in report["alerts"]] == ["gen_tok_s > 1"]
    alert = report["alerts"][0]
    assert alert["state"] == "fired" and alert["host"] == "twin" and alert["value"] > 1
    assert report["problems"] == [alert["message"]]
    quiet = snapshot_with('rules = ["queue > 100000", "error", "service_not_active"]')
    assert quiet.returncode == 0, quiet.stderr
    assert json.loads(quiet.stdout)["alerts"] == [] and json.loads(quiet.stdout)["problems"] == []
    text = snapshot_with('rules = ["gen_tok_s > 1"]\nbell = false')
    assert text.returncode == 1
    bad = snapshot_with('rules = ["gen_tok_s >> 1"]')
    assert bad.returncode == 2 and bad.stdout == ""
    assert "the alert rule 'gen_tok_s >> 1' is not `metric op number`" in one_sentence(bad.stderr)


@pytest.mark.timeout(300)
def test_a_stopped_service_is_a_problem_exit_1_and_bad_input_is_one_sentence(tmp_path: Path) -> None:
    with started_twin(tmp_path / "state", name="twin", start_service=False, time_scale=0.02) as twin:
        res = run_cli(
            tmp_path, "snapshot", "twin", "--hosts", str(twin.hosts_toml), "--json", "--timeout", "10s"
        )
        assert res.returncode == 1, res.stderr
        report = json.loads(res.stdout)
        assert report["service"]["active_state"] == "inactive"
        assert report["problems"][0].startswith("the service is inactive")
        # the default set's service_not_active rule says it, through the alerts engine
        assert report["alerts"][0]["rule"] == "service_not_active"
        assert report["alerts"][0]["severity"] == "critical"
        # nothing serves: latencies are absent with a reason, never zero
        assert report["serving"]["itl"] is None and report["serving"]["absent"]["itl"]
    bad = run_cli(tmp_path, "snapshot", "twin", "--window", "5 fortnights")
    assert bad.returncode == 2
    assert "is not a duration" in one_sentence(bad.stderr)
    no_load = run_cli(tmp_path, "twin", "--state-dir", str(tmp_path / "never"), "--load", "0")
    assert no_load.returncode == 2
    assert one_sentence(no_load.stderr).startswith("k26-console: --load must be a positive number")
    assert not (tmp_path / "never").exists()


@pytest.mark.timeout(300)
def test_without_a_target_snapshot_takes_the_applied_profile_s_as_export_does(
    loaded: tuple[Path, Path, str],
) -> None:
    """`snapshot --json` said target null where `export` said the applied ctx-200k's 200,000 (issue
    34): both read the host's audit trail through one function."""
    from datetime import UTC, datetime

    from console.core.audit import AuditEntry
    from console.sources.profile_store import applied_target

    home, hosts, _ = loaded
    trail = hosts.parent / "home" / ".k26-console" / "audit.jsonl"
    entries = [
        AuditEntry(
            ts=datetime.now(UTC), user="alice", host="twin", action=action, profile=name, outcome=outcome
        )
        for action, name, outcome in (
            ("apply", "ctx-200k", "ok"),
            ("apply", "ctx-256k", "failed"),  # not what runs: it failed
        )
    ]
    before = trail.read_text() if trail.exists() else None
    try:
        trail.parent.mkdir(parents=True, exist_ok=True)
        with trail.open("a") as f:
            f.writelines(e.model_dump_json() + "\n" for e in entries)
        res = run_cli(home, "snapshot", "twin", "--hosts", str(hosts), "--json", "--sample", "1s")
        assert res.returncode in (0, 1), res.stderr
        pool = json.loads(res.stdout)["pool"]
        assert (pool["target"], pool["target_source"]) == (200_000, "profile ctx-200k (last applied)")
        assert applied_target(entries) == ("ctx-200k", 200_000)  # what export's poll reads
        given = run_cli(
            home,
            "snapshot",
            "twin",
            "--hosts",
            str(hosts),
            "--json",
            "--sample",
            "1s",
            "--profile",
            "ctx-32k",
        )
        assert json.loads(given.stdout)["pool"]["target_source"] == "profile ctx-32k"
    finally:
        if before is None:
            trail.unlink(missing_ok=True)
        else:
            trail.write_text(before)
