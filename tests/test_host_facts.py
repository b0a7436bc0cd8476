"""The pure steps of learning a host: the interpreter of an ExecStart, the unit's environment, where the
Hugging Face cache is, the model flags of a running argv, and the version drift of a profile."""

from __future__ import annotations

import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from console.core.flagdrift import version_drift
from console.core.flags import load_flag_list
from console.core.hostfacts import (
    hf_hub_dir,
    hf_repo_folder,
    interpreter_of,
    is_repo_id,
    model_args,
    parse_environment,
    shebang_interpreter,
)
from console.sources.hostinfo import EXTRACTOR_SCRIPT, PROBE_SCRIPT

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("argv", "kind", "program"),
    [
        (
            ["/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", "x"],
            "python",
            "/usr/bin/python3",
        ),
        (["python3.11", "-m", "sglang.launch_server"], "python", "python3.11"),
        (["/opt/venv/bin/python", "-u", "-m", "sglang.launch_server"], "python", "/opt/venv/bin/python"),
        (["/usr/bin/env", "-S", "FOO=1", "python3", "-m", "sglang.launch_server"], "python", "python3"),
        (["/opt/venv/bin/sglang", "serve", "--model-path", "x"], "script", "/opt/venv/bin/sglang"),
        (["/bin/bash", "-c", "exec python3 -m sglang.launch_server"], "other", "/bin/bash"),
        (["/usr/bin/docker", "run", "lmsysorg/sglang"], "other", "/usr/bin/docker"),
        (["/usr/bin/pythonista"], "other", "/usr/bin/pythonista"),
    ],
)
def test_the_interpreter_of_an_exec_start(argv: list[str], kind: str, program: str) -> None:
    interp = interpreter_of(argv)
    assert (interp.kind, interp.program) == (kind, program)


def test_a_console_scripts_shebang_names_its_python() -> None:
    assert (
        shebang_interpreter("#!/opt/venv/bin/python3.12\n# -*- coding: utf-8 -*-\n")
        == "/opt/venv/bin/python3.12"
    )
    assert shebang_interpreter("#!/usr/bin/env python3\nimport sys\n") == "python3"
    assert shebang_interpreter("#!/bin/sh\nexec foo\n") is None
    assert shebang_interpreter("\x7fELF\x02\x01") is None


def test_the_units_environment_as_systemctl_show_prints_it() -> None:
    value = 'PYTHONPATH=/a:/b HF_HOME=/models/hf "NOTE=two words" PYTHONUNBUFFERED=1'
    assert parse_environment(value) == {
        "PYTHONPATH": "/a:/b",
        "HF_HOME": "/models/hf",
        "NOTE": "two words",
        "PYTHONUNBUFFERED": "1",
    }
    assert parse_environment("") == {}


def test_the_hub_cache_as_huggingface_hub_resolves_it() -> None:
    assert hf_hub_dir({"HF_HUB_CACHE": "/c", "HF_HOME": "/h"}, "/root") == (
        "/c",
        "HF_HUB_CACHE in the unit's environment",
    )
    assert hf_hub_dir({"HF_HOME": "/h/"}, "/root")[0] == "/h/hub"
    assert hf_hub_dir({"XDG_CACHE_HOME": "/x"}, "/root")[0] == "/x/huggingface/hub"
    assert hf_hub_dir({}, "/home/svc") == (
        "/home/svc/.cache/huggingface/hub",
        "the default (~/.cache/huggingface/hub)",
    )
    assert hf_repo_folder("moonshotai/Kimi-K2.6") == "models--moonshotai--Kimi-K2.6"
    assert is_repo_id("moonshotai/Kimi-K2.6") and not is_repo_id("/models/kimi") and not is_repo_id("kimi")


def test_model_flags_of_the_running_argv_on_each_version() -> None:
    argv = [
        "python3", "-m", "sglang.launch_server", "--model", "/models/Kimi-K2.6", "--tp", "8",
        "--kv-cache-dtype", "fp8_e4m3", "--revision", "abc123", "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", "lightseekorg/kimi-k2.5-eagle3", "--trust-remote-code",
    ]  # fmt: skip
    for version in ("v0.5.12.post1", "v0.5.23", "v0.4.6.post5"):
        args = model_args(argv, load_flag_list(version))
        assert args.model_path == "/models/Kimi-K2.6" and args.tp_size == 8, version
        assert args.kv_cache_dtype == "fp8_e4m3" and args.revision == "abc123", version
        assert args.speculative_algorithm == "EAGLE3", version
        assert args.draft_model_path == "lightseekorg/kimi-k2.5-eagle3", version
        assert args.problems == [], version


def test_a_real_command_line_from_a_public_log(corpus_dir: Path) -> None:
    # case-31 begins with the shell prompt line that started the server (Qwen3-0.6B from a local dir).
    first = (corpus_dir / "public" / "case-31.log").read_text().split("\n", 1)[0]
    argv = shlex.split(first.split("$ ", 1)[1])
    assert interpreter_of(argv).kind == "python" and interpreter_of(argv).program == "python"
    args = model_args(argv, load_flag_list("v0.4.6.post5"))  # INDEX.md: 0.4.6.post2 (pip)
    assert args.model_path == "/mnt/d/gx/Desktop/Model/Qwen3-0___6B" and not is_repo_id(args.model_path)
    assert (args.tp_size, args.kv_cache_dtype, args.speculative_algorithm) == (1, "auto", None)


def test_the_remote_scripts_run_on_a_bare_python(tmp_path: Path) -> None:
    """Both scripts are sent to the host's Python on stdin: they must run with the standard library
    alone (`-I`: no site-packages, no PYTHONPATH, no console installed)."""
    probe = subprocess.run(
        [sys.executable, "-I", "-"],
        input=PROBE_SCRIPT.read_text(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        probe.returncode == 0 and '"error": "this Python has no sglang package on its path"' in probe.stdout
    )
    extract = subprocess.run(
        [sys.executable, "-I", "-", str(tmp_path)],
        input=EXTRACTOR_SCRIPT.read_text(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert extract.returncode == 2 and "no sglang/srt/server_args.py" in extract.stderr


def test_version_drift_between_shipped_lists() -> None:
    profile = tomllib.loads((REPO / "profiles" / "ctx-200k.toml").read_text())["flags"]
    flags = {**profile, "cuda-graph-max-bs": 16, "disable-cuda-graph": True, "enable-dp-attention": True}
    drift = version_drift(flags, load_flag_list("v0.5.12.post1"), load_flag_list("v0.5.23"))
    by_flag = {d.flag: d for d in drift.profile_flags}
    assert by_flag["--cuda-graph-max-bs"].kind == "removed"
    assert "ambiguous" in by_flag["--cuda-graph-max-bs"].sentence  # 0.5.23 has -decode and -prefill
    assert by_flag["--disable-cuda-graph"].kind == "deprecated"
    assert "--cuda-graph-backend-{decode,prefill}=disabled" in by_flag["--disable-cuda-graph"].sentence
    assert by_flag["--enable-dp-attention"].kind == "deprecated"
    assert set(by_flag) == {"--cuda-graph-max-bs", "--disable-cuda-graph", "--enable-dp-attention"}
    assert drift.summary().startswith(
        "the profile was written for SGLang v0.5.12.post1; the host runs v0.5.23: 3 of"
    )
    # an on/off flag left unset is off whether a list says None or False: not a new default
    assert all(d.old_default is not None or d.new_default not in (False, None) for d in drift.defaults)
    same = version_drift(profile, load_flag_list("v0.5.12.post1"), load_flag_list("v0.5.12.post1"))
    assert same.same_version and not same.differs
