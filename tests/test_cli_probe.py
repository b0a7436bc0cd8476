"""`k26-console probe` end to end: the issue's Done-when against a twin registered in a hosts file.

The twin starts as the incident did (f = 0.85, a 101,134-token pool): a 185k probe is refused before any
request, the shallower depths are measured. After a restart at f = 0.94 (218,484 tokens) the same sweep
measures all three depths and names attention at 185k; run with `--profile ctx-200k`, it stays out of
that profile (the host runs 0.94, not ctx-200k's flags) until ctx-200k is applied. The user's config and
state dirs are pointed at temporary folders so the history file and the profile are the test's own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from console.core.profiles import parse_profile
from console.twin.host import TwinHost
from tests.support.cli import cli_process
from tests.support.twins import module_twin
from tests.test_probe_twin import TIME_SCALE, set_flags

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "console.cli.main"]
CONTRACT = {
    "depth",
    "output_tokens",
    "ttft_s",
    "decode_tok_s",
    "itl_p50_s",
    "itl_p99_s",
    "effective_kv_bandwidth_gbs",
    "peak_bandwidth_gbs",
    "diagnosis",
}


twin = module_twin("cli-probe", time_scale=TIME_SCALE)


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return cli_process(list(args), env=env, cwd=REPO, timeout=180)


def history(env: dict[str, str]) -> list[dict[str, object]]:
    path = Path(env["XDG_STATE_HOME"]) / "k26-console" / "probes.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_done_when_sweep_refuses_185k_at_085_then_measures_it_at_094(
    twin: TwinHost, dirs: dict[str, str]
) -> None:
    hosts = str(twin.hosts_toml)
    res = cli(dirs, "probe", "twin", "--sweep", "8k,64k,185k", "--tokens", "4", "--json", "--hosts", hosts)
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1
    assert "185k depth refused" in res.stderr and "101,134" in res.stderr
    out = json.loads(res.stdout)
    assert out["ok"] is False and out["limits"]["pool_tokens"] == 101_134
    shallow, mid, deep = out["results"]
    for r in out["results"]:
        assert set(r) >= CONTRACT
    assert [r["depth"] for r in out["results"]] == [8_000, 64_000, 185_000]
    assert (shallow["status"], mid["status"], deep["status"]) == ("ok", "ok", "refused")
    assert deep["decode_tok_s"] is None and "KV pool of 101,134 tokens" in deep["diagnosis"]
    for r in (shallow, mid):
        # the card's own peak, from NVML: 2 x 14,001 MHz x 512 bits / 8
        assert r["output_tokens"] == 4 and r["peak_bandwidth_gbs"] == 1792.1
        assert r["effective_kv_bandwidth_gbs"] == pytest.approx(r["depth"] * 70_272 * r["decode_tok_s"] / 1e9)
    assert shallow["decode_tok_s"] > mid["decode_tok_s"]

    set_flags(twin, {"--mem-fraction-static": "0.94"})
    twin.systemctl("restart", twin.unit)
    res = cli(
        dirs,
        "probe",
        "twin",
        "--sweep",
        "8k,64k,185k",
        "--tokens",
        "4",
        "--json",
        "--hosts",
        hosts,
        "--profile",
        "ctx-200k",
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["ok"] is True and out["limits"]["pool_tokens"] == 218_484
    deep = out["results"][2]
    assert deep["decode_tok_s"] == pytest.approx(0.70, rel=0.03)
    assert "attention is the bottleneck" in deep["diagnosis"]
    assert out["fit"]["verdict"] == "attention_bound"
    # The host runs the incident's hand-made 0.94, not ctx-200k (0.93, 8 requests): --profile names where
    # results go, and they go there only when that profile is what ran. This run stays in the history.
    (said,) = res.stderr.splitlines()
    assert said.startswith(
        "k26-console: the results go to the probe history only, not to ctx-200k's [verified]: "
    )
    assert "the unit runs other flags than ctx-200k (" in said and "--mem-fraction-static 0.94 → 0.93" in said
    runs = history(dirs)
    assert [(r["result"]["depth"], r["result"]["status"]) for r in runs] == [
        (8_000, "ok"),
        (64_000, "ok"),
        (185_000, "refused"),
        (8_000, "ok"),
        (64_000, "ok"),
        (185_000, "ok"),
    ]
    saved = Path(dirs["XDG_CONFIG_HOME"]) / "k26-console" / "profiles" / "ctx-200k.toml"
    assert not saved.exists()

    # Applied for real, ctx-200k is what runs: the same probe now lands in the profile's [verified].
    # (The hand-made drop-in goes first: it sorts after the console's, and apply refuses to be overridden.)
    (twin.layout.unit_dir / f"{twin.unit}.d" / "50-probe.conf").unlink()
    twin.systemctl("daemon-reload")
    applied = cli(dirs, "apply", "twin", "ctx-200k", "--yes", "--hosts", hosts)
    assert applied.returncode == 0, applied.stderr
    res = cli(dirs, "probe", "twin", "--depth", "185k", "--tokens", "4", "--json", "--hosts", hosts,
              "--profile", "ctx-200k")  # fmt: skip
    assert res.returncode == 0 and res.stderr == "", res.stderr
    (deep,) = json.loads(res.stdout)["results"]
    verified = parse_profile(saved.read_text(), name="ctx-200k").verified
    assert verified is not None and verified.pool_tokens == 205_445
    assert verified.tok_s_at_depth == {185_000: round(deep["decode_tok_s"], 2)}
    # The runs are on the host's audit trail, each with its speeds and the profile it was kept in.
    trail = cli(dirs, "audit", "twin", "--json", "--hosts", hosts)
    assert trail.returncode == 0, trail.stderr
    probes = [e for e in json.loads(trail.stdout)["entries"] if e["action"] == "probe"]
    assert [(e["outcome"], e["profile"]) for e in probes[-3:]] == [
        ("failed", None),
        ("ok", None),
        ("ok", "ctx-200k"),
    ]
    for probe in probes[-2:]:
        # a measured speed, as the JSON's above: 0.70 within 3% (0.69 once, in a 5-worker pass)
        speed = re.search(r"\b185k (\d+\.\d+) tok/s", probe["summary"])
        assert speed is not None and float(speed.group(1)) == pytest.approx(0.70, rel=0.03), probe["summary"]
        assert "attention is the bottleneck" in probe["summary"]
    # Without --profile a probe is audited with the profile the host runs, as the console's are (the
    # command line's said `-` where the console's named the profile, issue 34).
    res = cli(dirs, "probe", "twin", "--depth", "2k", "--tokens", "3", "--json", "--hosts", hosts)
    assert res.returncode == 0, res.stderr
    trail = cli(dirs, "audit", "twin", "--json", "--hosts", hosts)
    probes = [e for e in json.loads(trail.stdout)["entries"] if e["action"] == "probe"]
    assert probes[-1]["profile"] == "ctx-200k"


def test_human_output_is_a_table_and_a_diagnosis(twin: TwinHost, dirs: dict[str, str]) -> None:
    res = cli(dirs, "probe", "twin", "--depth", "2k", "--tokens", "3", "--hosts", str(twin.hosts_toml))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    # the card's own peak (the twin's python3 has nvidia-ml-py: the NVML agent reads its clocks), named
    assert (
        "kimi-k2.6 on 8x NVIDIA RTX PRO 6000 Blackwell Server Edition (1,792 GB/s peak from NVML)" in lines[0]
    )
    assert lines[1].split() == ["depth", "tokens", "TTFT", "tok/s", "ITL", "p50", "ITL", "p99", "KV", "GB/s",
                                "of", "peak"]  # fmt: skip
    assert lines[2].split()[:2] == ["2k", "3"]
    assert lines[3].startswith("2k: decode reads KV at ") and "too shallow" in lines[3]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["probe", "twin"], "one of the arguments --depth --sweep is required"),
        (["probe", "twin", "--depth", "8k", "--tokens", "0"], "not a positive number of tokens"),
        (["probe", "twin", "--sweep", "8k,lots"], "'lots' is not a depth"),
        (["probe", "twin", "--depth", "8k", "--tokens", "9000"], "use at most 4096"),
        (["probe", "twin", "--depth", "8k", "--profile", "no-such-profile"], "no profile named"),
        (["probe", "no-such-host.invalid", "--depth", "8k"], "does not resolve as a host name"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(
    twin: TwinHost, dirs: dict[str, str], tmp_path: Path, args: list[str], says: str
) -> None:
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(twin.hosts_toml.read_text())
    res = cli(dirs, *args, "--hosts", str(hosts))
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr and says in res.stderr


def test_a_stopped_server_is_exit_1_with_one_sentence(twin: TwinHost, dirs: dict[str, str]) -> None:
    twin.systemctl("stop", twin.unit)
    try:
        res = cli(dirs, "probe", "twin", "--depth", "8k", "--hosts", str(twin.hosts_toml))
    finally:
        twin.systemctl("start", twin.unit)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.startswith("k26-console: the SGLang server of twin is not ready to probe (")
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr


def test_without_host_it_probes_the_server_on_this_machine(twin: TwinHost, dirs: dict[str, str]) -> None:
    """`k26-console probe --depth N` on the GPU host itself: straight at the local URL, no SSH."""
    res = cli(dirs, "probe", "--url", twin.sglang_url, "--depth", "2k", "--tokens", "3", "--json")
    assert res.returncode == 0, res.stderr
    (result,) = json.loads(res.stdout)["results"]
    assert result["depth"] == 2_000 and result["output_tokens"] == 3 and result["decode_tok_s"] > 0
    bad = cli(dirs, "probe", "--url", "ftp://x", "--depth", "2k")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--url" in bad.stderr
