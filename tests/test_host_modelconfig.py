"""The config.json lookup script, run by a real /bin/sh over a real Hugging Face cache layout built in
the test's directory: repository ids, revisions (a branch in refs/ or a commit), local directories
relative to the unit's WorkingDirectory, the unit user's home, and the limit."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import subprocess
from pathlib import Path

from console.core.hostfacts import CONFIG_MAX_BYTES, hf_hub_dir
from console.core.models import ModelSpec
from console.sources.modelconfig import config_argv, read_config_answer
from console.sources.transport import CommandResult

CONFIGS = Path(__file__).resolve().parent / "data" / "hf-configs"


def lookup(
    model: str, *, revision: str | None = None, hub: str, wd: str = "", user: str = ""
) -> tuple[ModelSpec | None, str | None, str]:
    argv = config_argv(model, revision, hub, wd, user)
    res = subprocess.run(
        argv, capture_output=True, text=True, timeout=30, env={**os.environ, "HOME": "/nonexistent"}
    )
    result = CommandResult(argv=tuple(argv), exit_status=res.returncode, stdout=res.stdout, stderr=res.stderr)
    return read_config_answer(result, model, "gpu1")


def hf_cache(hub: Path, repo_id: str, config: bytes, *, branch: str = "main") -> tuple[Path, str]:
    """A snapshot as huggingface_hub lays it out: blobs/SHA256, refs/BRANCH, snapshots/COMMIT/ -> blob."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    blob = hashlib.sha256(config).hexdigest()
    commit = hashlib.sha1(config + branch.encode()).hexdigest()
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "blobs" / blob).write_bytes(config)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / branch).write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").symlink_to(Path("../..") / "blobs" / blob)
    return snap / "config.json", commit


def test_a_repo_id_is_found_in_the_hub_cache_by_branch_or_commit(tmp_path: Path) -> None:
    qwen = (CONFIGS / "Qwen--Qwen3-32B.json").read_bytes()
    main_cfg, commit = hf_cache(tmp_path / "hub", "Qwen/Qwen3-32B", qwen)
    other = json.dumps({**json.loads(qwen), "num_hidden_layers": 8}).encode()
    dev_cfg, _ = hf_cache(tmp_path / "hub", "Qwen/Qwen3-32B", other, branch="dev")
    spec, path, source = lookup("Qwen/Qwen3-32B", hub=str(tmp_path / "hub"))
    assert (
        spec is not None
        and spec.num_layers == 64
        and path == str(main_cfg)
        and source == f"{main_cfg} on gpu1"
    )
    spec, path, _ = lookup("Qwen/Qwen3-32B", revision="dev", hub=str(tmp_path / "hub"))
    assert spec is not None and spec.num_layers == 8 and path == str(dev_cfg)
    spec, path, _ = lookup("Qwen/Qwen3-32B", revision=commit, hub=str(tmp_path / "hub"))
    assert spec is not None and spec.num_layers == 64
    spec, path, source = lookup("Qwen/Qwen3-32B", revision="v9", hub=str(tmp_path / "hub"))
    assert spec is None and source.endswith("snapshots/v9/config.json does not exist on gpu1")
    spec, path, source = lookup("Qwen/Qwen3-8B", hub=str(tmp_path / "hub"))
    repo = tmp_path / "hub" / "models--Qwen--Qwen3-8B"
    assert (spec, path, source) == (
        None,
        None,
        f"there is no Hugging Face cache of Qwen/Qwen3-8B at {repo} on gpu1",
    )


def test_a_local_directory_absolute_or_relative_to_the_working_directory(tmp_path: Path) -> None:
    model = tmp_path / "srv" / "models" / "llama"
    model.mkdir(parents=True)
    (model / "config.json").write_bytes((CONFIGS / "meta-llama--Llama-3.1-8B-Instruct.json").read_bytes())
    spec, path, _ = lookup(str(model), hub=str(tmp_path / "hub"))
    assert spec is not None and spec.num_kv_heads == 8 and path == str(model / "config.json")
    spec, path, _ = lookup("models/llama", hub=str(tmp_path / "hub"), wd=str(tmp_path / "srv"))
    assert spec is not None and path == f"{tmp_path / 'srv'}/models/llama/config.json"


def test_the_default_hub_is_under_the_unit_users_home(tmp_path: Path) -> None:
    me = pwd.getpwuid(os.getuid())
    hub, _ = hf_hub_dir({}, "~")
    assert hub == "~/.cache/huggingface/hub"
    spec, path, source = lookup("org/absent-model", hub=hub, user=me.pw_name)
    assert spec is None and path is None
    assert source.startswith(
        f"there is no Hugging Face cache of org/absent-model at {me.pw_dir}/.cache/huggingface/hub/"
    )


def test_over_the_limit_the_file_is_not_sent(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_bytes(b"{" + b" " * CONFIG_MAX_BYTES + b"}")
    argv = config_argv(str(big), None, str(tmp_path / "hub"), "", "")
    res = subprocess.run(argv, capture_output=True, timeout=30)
    assert res.stdout.decode() == f"huge {CONFIG_MAX_BYTES + 2} {big}/config.json\n"  # the status line only
    spec, path, source = lookup(str(big), hub=str(tmp_path / "hub"))
    assert spec is None and path == f"{big}/config.json"
    assert (
        source
        == f"{big}/config.json on gpu1 is {CONFIG_MAX_BYTES + 2:,} bytes, over the 1,048,576 a config.json may have"
    )
