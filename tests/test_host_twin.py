"""`k26-console host` against the twin over SSH on loopback: the twin's unit runs a Python whose path
holds a real SGLang 0.5.12.post1 wheel's files and an HF cache with the model's config.json; the
console learns them from those files, and every fallback is one sentence naming what it used instead.

The tests that need the real SGLang tree skip, saying so, when `scripts/fetch-sglang-wheel` has not
cached the wheel (the twin then keeps its two-file stand-in package).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from console.core.flags import FlagList, load_flag_list
from console.core.models import get_model, parse_hf_config
from console.twin.host import TwinHost
from console.twin.sglang_tree import MODEL_ID, WHEEL_VERSION, find_wheel
from tests.support.cli import CTX200K, run_main, wait_until
from tests.support.twins import module_twin

TIME_SCALE = 0.002
needs_wheel = pytest.mark.skipif(
    find_wheel() is None,
    reason=f"the SGLang {WHEEL_VERSION} wheel is not cached in .cache/sglang-wheel (run scripts/fetch-sglang-wheel)",
)


twin = module_twin("host-twin", time_scale=TIME_SCALE)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own cache and config dirs: the flag-list cache starts empty."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "cache" / "k26-console"


def host_json(twin: TwinHost, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    code, out, err = run_main(["host", "twin", "--hosts", str(twin.hosts_toml), "--json", *extra], capsys)
    assert code == 0, err
    assert err == ""
    return json.loads(out)


def config_link(twin: TwinHost) -> Path:
    repo = twin.hf_home / "hub" / ("models--" + MODEL_ID.replace("/", "--"))
    revision = (repo / "refs" / "main").read_text().strip()
    return repo / "snapshots" / revision / "config.json"


@needs_wheel
def test_host_json_names_the_twins_sglang_and_model_from_its_files(
    twin: TwinHost, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = host_json(twin, capsys)
    facts = report["facts"]
    assert report["flags_from"] == "host" and facts["flags"]["flags_from"] == "host"
    assert facts["sglang"]["version"] == WHEEL_VERSION
    assert facts["sglang"]["path"] == str(twin.layout.pylib_dir / "sglang")
    assert facts["interpreter"] == sys.executable  # the unit's ExecStart names it
    # the list extracted on the host from the wheel's own server_args.py is the one shipped for it
    cached = cache / "sglang-args" / f"v{WHEEL_VERSION}.json"
    host_list = FlagList.from_json(cached.read_text())
    assert host_list.flags == load_flag_list(WHEEL_VERSION).flags
    assert facts["flags"]["count"] == len(host_list.flags) == 387

    # the model's layers and KV shape are those of the config.json in the twin's HF cache
    link = config_link(twin)
    model = facts["model"]
    assert model["config_from"] == "host" and model["config_path"] == str(link)
    assert model["hub_cache_source"] == "HF_HOME in the unit's environment"
    text_config = json.loads(link.read_text())["text_config"]
    shape = model["shape"]
    assert shape["layers"] == text_config["num_hidden_layers"] == 61
    assert (shape["kv_lora_rank"], shape["qk_rope_head_dim"]) == (
        text_config["kv_lora_rank"],
        text_config["qk_rope_head_dim"],
    )
    assert shape["cell_bytes"] == 70_272 and facts["tp_size"] == 8 and facts["kv_cache_dtype"] == "auto"
    # the card's own peak (its python3 has nvidia-ml-py): 2 × 14,001 MHz × 512 bits / 8, the table 1,792
    assert [(g["peak_bandwidth_gbs"], g["peak_from"], g["table_peak_gbs"]) for g in facts["gpus"]] == [
        (1792.1, "nvml", 1792.0)
    ] * 8
    assert {g["memory_total_mib"] for g in facts["gpus"]} == {97_887.0}
    assert facts["notes"] == []

    # a second look takes the flag list from the local cache of that version, still the host's own
    again = host_json(twin, capsys)["facts"]["flags"]
    assert again["flags_from"] == "host" and "cached at" in again["source"]


def _twin_journal(twin: TwinHost, path: Path) -> Path:
    def dump() -> str:
        res = subprocess.run(
            [str(twin.layout.bin_dir / "journalctl"), "-u", twin.unit, "-o", "json", "--no-pager"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return res.stdout

    assert wait_until(lambda: "max_total_num_tokens=" in dump(), 60), "the twin's boot did not reach its pool"
    path.write_text(dump())
    return path


def test_plan_from_the_hosts_config_gives_the_catalogues_fraction(
    twin: TwinHost, cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    facts = host_json(twin, capsys)["facts"]
    assert facts["model"]["config_from"] == "host"
    journal = _twin_journal(twin, tmp_path / "twin.journal")
    config = tmp_path / "config.json"
    shutil.copyfile(facts["model"]["config_path"], config)
    base = ["plan", "--target-context", "200000", "--journal", str(journal), "--json"]
    code, out_host, err = run_main([*base, "--model-config", str(config)], capsys)
    assert code == 0, err
    code, out_cat, err = run_main([*base, "--model", "kimi-k2.6"], capsys)
    assert code == 0, err
    by_host, by_catalogue = json.loads(out_host), json.loads(out_cat)
    assert by_host["cell_bytes"] == by_catalogue["cell_bytes"] == 70_272
    keys = [k for k in by_catalogue if "fraction" in k]
    assert keys and all(by_host[k] == by_catalogue[k] for k in keys)
    spec = parse_hf_config(config.read_text())
    assert spec.cell_bytes(tp=8) == get_model("kimi-k2.6").cell_bytes(tp=8)


@needs_wheel
def test_a_profile_written_for_another_sglang_is_reported_with_the_flags_that_differ(
    twin: TwinHost, cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        CTX200K.replace('name = "ctx-200k"', 'name = "ctx-200k-0523"')
        .replace('sglang_version = "v0.5.12.post1"', 'sglang_version = "v0.5.23"')
        .replace("enable-metrics = true", "enable-metrics = true\ncuda-graph-max-bs-decode = 16")
    )
    profile = tmp_path / "ctx-200k-0523.toml"
    profile.write_text(text)
    report = host_json(twin, capsys, "--profile", str(profile))
    drift = report["profile_drift"]
    assert (drift["written_for"], drift["host_version"]) == ("v0.5.23", f"v{WHEEL_VERSION}")
    changed = {d["flag"]: d for d in drift["profile_flags"]}
    assert changed["--cuda-graph-max-bs-decode"]["kind"] == "removed"
    assert any("--cuda-graph-max-bs-decode" in e for e in report["profile_errors"])
    # new defaults of flags the profile leaves alone: e.g. HiCache's memory layout
    defaults = {d["flag"]: d for d in drift["defaults"]}
    assert defaults["--hicache-mem-layout"]["old_default"] == "page_first"
    assert defaults["--hicache-mem-layout"]["new_default"] == "layer_first"

    code, out, _ = run_main(
        ["host", "twin", "--hosts", str(twin.hosts_toml), "--profile", str(profile)], capsys
    )
    assert code == 0
    assert f"the profile was written for SGLang v0.5.23; the host runs v{WHEEL_VERSION}" in out
    assert f"--cuda-graph-max-bs-decode is not a flag of SGLang v{WHEEL_VERSION}." in out

    same = host_json(twin, capsys, "--profile", "ctx-200k")["profile_drift"]
    assert same["profile_flags"] == [] and same["defaults"] == []


def _notes(twin: TwinHost, capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], list[str]]:
    code, out, err = run_main(["host", "twin", "--hosts", str(twin.hosts_toml)], capsys)
    assert code == 0 and err == "", err
    notes = [line.removeprefix("note: ") for line in out.split("\n") if line.startswith("note: ")]
    return host_json(twin, capsys)["facts"], notes


def test_a_huge_config_json_is_not_read_and_the_catalogue_is_named(
    twin: TwinHost, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    link = config_link(twin)
    blob = link.resolve()
    original = blob.read_bytes()
    try:
        blob.write_bytes(original + b" " * (2 << 20))
        facts, notes = _notes(twin, capsys)
    finally:
        blob.write_bytes(original)
    assert facts["model"]["config_from"] == "catalogue" and facts["model"]["shape"]["cell_bytes"] == 70_272
    [note] = [n for n in notes if "config.json" in n]
    assert note == (
        f"{link} on twin is {len(original) + (2 << 20):,} bytes, over the 1,048,576 a config.json may "
        "have: the model's shape comes from the console's catalogue (kimi-k2.6)."
    )


def test_an_unreadable_config_json_says_so_and_the_catalogue_is_named(
    twin: TwinHost, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    link = config_link(twin)
    target = link.readlink()
    link.unlink()
    link.mkdir()  # a directory where the file should be: no read gets a config out of it (even as root)
    try:
        facts, notes = _notes(twin, capsys)
    finally:
        link.rmdir()
        link.symlink_to(target)
    assert facts["model"]["config_from"] == "catalogue"
    assert (
        f"{link} on twin cannot be read: the model's shape comes from the console's catalogue (kimi-k2.6)."
        in notes
    )


def test_a_config_json_that_is_not_json_names_its_line(
    twin: TwinHost, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blob = config_link(twin).resolve()
    original = blob.read_bytes()
    try:
        blob.write_bytes(b'{"text_config": {"num_hidden_layers": 61,\n')
        facts, notes = _notes(twin, capsys)
    finally:
        blob.write_bytes(original)
    assert facts["model"]["config_from"] == "catalogue"
    [note] = [n for n in notes if "config.json" in n]
    assert "is not valid JSON (line 2" in note and note.endswith("catalogue (kimi-k2.6).")


def test_a_missing_hf_cache_says_where_it_looked(
    twin: TwinHost, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hub = twin.hf_home / "hub"
    moved = twin.hf_home / "hub.away"
    hub.rename(moved)
    try:
        facts, notes = _notes(twin, capsys)
    finally:
        moved.rename(hub)
    repo = hub / ("models--" + MODEL_ID.replace("/", "--"))
    assert facts["model"]["config_from"] == "catalogue" and facts["model"]["config_path"] is None
    assert (
        f"there is no Hugging Face cache of {MODEL_ID} at {repo} on twin: the model's shape comes from the "
        "console's catalogue (kimi-k2.6)."
    ) in notes


def test_an_interpreter_that_is_not_python_falls_back_to_the_shipped_list(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The unit runs bash, which execs Python: nothing tells the console which Python that is.
    wrapper = ["/bin/bash", "-c", 'exec "$0" -m sglang.launch_server "$@"', sys.executable]
    host = TwinHost(tmp_path / "state", time_scale=TIME_SCALE, server_command=wrapper, wait_ready=False)
    host.start_sync()
    try:
        facts, notes = _notes(host, capsys)
    finally:
        host.stop_sync()
    assert facts["interpreter"] is None and facts["flags"]["flags_from"] == "shipped"
    expected = (
        "the unit's ExecStart runs /bin/bash, which is not a Python interpreter: the flags are checked "
        "against the shipped list of SGLang v0.5.12.post1."
    )
    assert facts["flags"]["note"] == expected and expected in notes
    assert facts["sglang"]["version"] is None
    # the model is still read from the host: its config.json needs no Python
    assert facts["model"]["config_from"] == "host"


def test_a_host_without_sglang_version_falls_back_and_says_so(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No cached wheel: the twin's unit finds only its two-file stand-in `sglang`, with no version.
    monkeypatch.setenv("K26_SGLANG_WHEEL_DIR", str(tmp_path / "no-wheels"))
    host = TwinHost(tmp_path / "state", time_scale=TIME_SCALE, wait_ready=False)
    host.start_sync()
    try:
        facts, notes = _notes(host, capsys)
    finally:
        host.stop_sync()
    assert facts["flags"]["flags_from"] == "shipped"
    assert (
        facts["sglang"]["path"] == str(host.layout.pylib_dir / "sglang")
        and facts["sglang"]["version"] is None
    )
    expected = (
        f"{sys.executable} finds sglang at {host.layout.pylib_dir / 'sglang'} but no version in its metadata "
        "or files: the flags are checked against the shipped list of SGLang v0.5.12.post1."
    )
    assert expected in notes


def test_an_unknown_host_is_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[hosts.a]\nssh = "127.0.0.1"\n')
    code, out, err = run_main(["host", "nowhere", "--hosts", str(hosts)], capsys)
    assert code == 2 and out == ""
    assert err.strip() == f"k26-console: there is no host 'nowhere' in {hosts} (known: a)."


def test_a_draft_model_in_a_local_directory_sizes_the_draft_pool(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An EAGLE3 head for Kimi as TorchSpec's kimi_k25_eagle3.json describes it (shared/reference/sglang.md
    # §7): Llama-style, 1 layer, 64 KV heads of 128. It lives in a local directory, not the HF cache.
    draft_dir = tmp_path / "models" / "kimi-k2.6-eagle3"
    draft_dir.mkdir(parents=True)
    (draft_dir / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLMEagle3"],
                "model_type": "llama",
                "hidden_size": 7168,
                "num_attention_heads": 64,
                "num_key_value_heads": 64,
                "head_dim": 128,
                "num_hidden_layers": 1,
                "torch_dtype": "bfloat16",
            }
        )
    )
    command = [
        sys.executable, "-m", "sglang.launch_server", "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", str(draft_dir), "--kv-cache-dtype", "fp8_e4m3",
    ]  # fmt: skip
    host = TwinHost(tmp_path / "state", time_scale=TIME_SCALE, server_command=command, wait_ready=False)
    host.start_sync()
    try:
        facts = host_json(host, capsys)["facts"]
    finally:
        host.stop_sync()
    assert facts["kv_cache_dtype"] == "fp8_e4m3"
    assert facts["model"]["shape"]["cell_bytes"] == 35_136  # the target's MLA cell in fp8
    draft = facts["draft"]
    assert draft["algorithm"] == "EAGLE3" and draft["config_from"] == "host"
    assert draft["config_path"] == str(draft_dir / "config.json")
    # 64 KV heads at TP8 -> 8 per GPU, (128 + 128) each, 1 layer, 1 byte in fp8
    assert draft["cell_bytes"] == 8 * 256 * 1 * 1


def test_a_console_script_names_its_python_in_its_shebang(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `sglang serve …` as pip installs it: a script whose #! line names the environment's Python.
    bindir = tmp_path / "venv" / "bin"
    bindir.mkdir(parents=True)
    script = bindir / "sglang"
    script.write_text(
        f"#!{sys.executable}\n"
        "import runpy, sys\n"
        "sys.argv = [sys.argv[0], *sys.argv[2:]]  # drop 'serve'\n"
        "runpy.run_module('sglang.launch_server', run_name='__main__')\n"
    )
    script.chmod(0o755)
    host = TwinHost(
        tmp_path / "state", time_scale=TIME_SCALE, server_command=[str(script), "serve"], wait_ready=False
    )
    host.start_sync()
    try:
        facts = host_json(host, capsys)["facts"]
    finally:
        host.stop_sync()
    assert facts["interpreter"] == sys.executable
    assert facts["interpreter_source"] == f"the #! line of {script}, which the unit's ExecStart runs"
    assert facts["sglang"]["path"] == str(host.layout.pylib_dir / "sglang")
    assert facts["model"]["path"] == MODEL_ID and facts["model"]["config_from"] == "host"


def test_a_unit_the_host_does_not_have_is_one_sentence(
    twin: TwinHost, cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = tmp_path / "hosts.toml"
    text = twin.hosts_toml.read_text()
    assert '\nunit = "sglang-k26-ddtree"\n' in text
    hosts.write_text(text.replace('\nunit = "sglang-k26-ddtree"\n', '\nunit = "no-such-sglang"\n'))
    code, out, err = run_main(["host", "twin", "--hosts", str(hosts)], capsys)
    assert code == 2 and out == "", out
    assert err == (
        'k26-console: there is no unit no-such-sglang.service on twin; set unit = "..." for this host in hosts.toml.\n'
    )


def test_an_interpreter_that_floods_its_answer_is_cut_off(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A `python3` that runs the server but answers anything on stdin with 200 MB: the console reads
    # 64 KiB of it, closes the channel and says so.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    flood = bindir / "python3"
    flood.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-" ]; then yes K26K26K26K26K26K26K26K26K26K26K26K26K26 | head -c 200000000; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    flood.chmod(0o755)
    command = [str(flood), "-m", "sglang.launch_server"]
    host = TwinHost(tmp_path / "state", time_scale=TIME_SCALE, server_command=command, wait_ready=False)
    host.start_sync()
    try:
        facts, notes = _notes(host, capsys)
    finally:
        host.stop_sync()
    expected = (
        f"{flood} answered with more than 65,536 characters, not the line a Python prints: the flags are "
        "checked against the shipped list of SGLang v0.5.12.post1."
    )
    assert facts["flags"]["flags_from"] == "shipped" and expected in notes
    assert facts["model"]["config_from"] == "host"  # the config.json lookup needs no Python


def test_plan_host_plans_from_the_hosts_facts_with_no_model_named(
    twin: TwinHost, cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = _twin_journal(twin, tmp_path / "twin.journal")
    hosts = ["--hosts", str(twin.hosts_toml)]
    code, out_host, err = run_main(["plan", "twin", *hosts, "--target-context", "200000", "--json"], capsys)
    assert code == 0, err
    code, out_cat, err = run_main(
        ["plan", "--target-context", "200000", "--journal", str(journal), "--model", "kimi-k2.6", "--json"],
        capsys,
    )
    assert code == 0, err
    by_host, by_catalogue = json.loads(out_host), json.loads(out_cat)
    assert by_host["cell_bytes"] == by_catalogue["cell_bytes"] == 70_272
    assert by_host["model"] == "moonshotai/Kimi-K2.6"  # the config.json's, not a catalogue name
    assert by_host["recommended_mem_fraction_static"] == by_catalogue["recommended_mem_fraction_static"]
    assert by_host["notes"][0].startswith("the model from twin: ")
    # HOST and a journal file are two answers to one question: refused, one sentence
    code, _, err = run_main(
        ["plan", "twin", *hosts, "--target-context", "1k", "--journal", str(journal)], capsys
    )
    assert code == 2 and "give either HOST or --journal FILE, not both" in err
