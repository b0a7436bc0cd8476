"""What the console learns about a host, and the pure steps of learning it.

`HostFacts` is the contract of `k26-console host HOST --json` and of `console.sources.hostinfo.learn_host`:
the unit, the interpreter its ExecStart runs, that interpreter's SGLang (version and install path, read
without importing SGLang), where the flag list came from (the host's own installation, or the shipped
list as a named fallback), the model the unit serves with the shape the capacity model uses (from the
host's config.json, or the catalogue as a named fallback), and the GPUs with their peak bandwidth.
Every fact carries where it came from.

Everything here is pure: the sources layer runs the commands and hands their output in.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from console.core.flags import FlagList, FlagSpec, parse_argv, split_command
from console.core.models import ModelSpec, draft_cell_bytes

CONFIG_MAX_BYTES = 1 << 20
"""A config.json is a few KB (Kimi K2.6's ~5 KB); more than this is not one, and is not read."""
FLAGS_MAX_BYTES = 8 << 20
"""The extracted flag list of 0.5.23 is ~134 KB; the host's answer is refused past this."""
PROBE_MAX_BYTES = 64 << 10

_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)*)?$")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


# ---- the interpreter -----------------------------------------------------------------------------


class Interpreter(BaseModel, defer_build=True):
    """How the unit's program is run: a Python interpreter named in ExecStart, a console script whose
    shebang names it, or something that is not Python."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["python", "script", "other"]
    program: str
    """The interpreter (kind python), the script whose `#!` line names it (script), or the program."""


def interpreter_of(argv: Sequence[str]) -> Interpreter:
    """The interpreter of an ExecStart argv: `python3 -m sglang.launch_server …`, `/usr/bin/env python3 …`,
    or `sglang serve …` (a console script: its shebang names the interpreter)."""
    words = list(argv)
    if not words:
        return Interpreter(kind="other", program="")
    program = words[0]
    if program.rsplit("/", 1)[-1] == "env":
        rest = [w for w in words[1:] if not w.startswith("-") and not _ENV_ASSIGNMENT.match(w)]
        if not rest:
            return Interpreter(kind="other", program=program)
        program = rest[0]
    base = program.rsplit("/", 1)[-1]
    if _PYTHON_NAME.match(base):
        return Interpreter(kind="python", program=program)
    if base == "sglang":
        return Interpreter(kind="script", program=program)
    return Interpreter(kind="other", program=program)


def shebang_interpreter(head: str) -> str | None:
    """The Python interpreter of a script from its first line (`#!/opt/venv/bin/python3`), else None."""
    first = head.split("\n", 1)[0]
    if not first.startswith("#!"):
        return None
    words = first[2:].split()
    if not words:
        return None
    if words[0].rsplit("/", 1)[-1] == "env" and len(words) > 1:
        words = words[1:]
    return words[0] if _PYTHON_NAME.match(words[0].rsplit("/", 1)[-1]) else None


# ---- the unit's environment and the Hugging Face cache ------------------------------------------


def parse_environment(value: str) -> dict[str, str]:
    """`systemctl show -p Environment --value`: space-separated NAME=value words, quoted where needed."""
    try:
        words = shlex.split(value)
    except ValueError:
        words = value.split()
    env: dict[str, str] = {}
    for word in words:
        name, sep, val = word.partition("=")
        if sep and _ENV_ASSIGNMENT.match(word):
            env[name] = val
    return env


def hf_hub_dir(env: Mapping[str, str], home: str) -> tuple[str, str]:
    """(hub cache directory, which setting chose it), as huggingface_hub resolves it: HF_HUB_CACHE, the
    older HUGGINGFACE_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(name):
            return env[name], f"{name} in the unit's environment"
    if env.get("HF_HOME"):
        return env["HF_HOME"].rstrip("/") + "/hub", "HF_HOME in the unit's environment"
    if env.get("XDG_CACHE_HOME"):
        return env["XDG_CACHE_HOME"].rstrip(
            "/"
        ) + "/huggingface/hub", "XDG_CACHE_HOME in the unit's environment"
    return home.rstrip("/") + "/.cache/huggingface/hub", "the default (~/.cache/huggingface/hub)"


def is_repo_id(model_path: str) -> bool:
    """`org/name` as the hub spells a repository (SGLang tries a local directory of that name first)."""
    return bool(_REPO_ID.match(model_path))


def hf_repo_folder(repo_id: str) -> str:
    """The cache folder of a model repository: `models--ORG--NAME`."""
    return "models--" + repo_id.replace("/", "--")


# ---- the model arguments of the running argv ----------------------------------------------------


class ModelArgs(BaseModel, defer_build=True):
    """What the running argv says about the model (None where it does not say)."""

    model_path: str | None = None
    tokenizer_path: str | None = None
    revision: str | None = None
    kv_cache_dtype: str = "auto"
    tp_size: int = 1
    speculative_algorithm: str | None = None
    draft_model_path: str | None = None
    draft_revision: str | None = None
    problems: list[str] = Field(default_factory=list)


_TARGETS = {
    "model_path": ("model_path",),
    "tokenizer_path": ("tokenizer_path",),
    "revision": ("revision",),
    "kv_cache_dtype": ("kv_cache_dtype",),
    "tp_size": ("tp_size", "tensor_parallel_size"),
    "speculative_algorithm": ("speculative_algorithm",),
    "draft_model_path": ("speculative_draft_model_path",),
    "draft_revision": ("speculative_draft_model_revision",),
}


def model_args(argv: Sequence[str], flag_list: FlagList) -> ModelArgs:
    """The model flags of an ExecStart argv, read as the server's parser of `flag_list` reads them."""
    _, flags = split_command(argv)
    parsed = parse_argv(flags, flag_list)
    by_target: dict[str, str] = {}
    for flag, value in parsed.values.items():
        spec: FlagSpec | None = flag_list.spec(flag)
        if spec is not None and isinstance(value, tuple) and value:
            by_target[spec.target] = value[-1]
    found: dict[str, Any] = {}
    for field, targets in _TARGETS.items():
        for target in targets:
            if target in by_target:
                found[field] = by_target[target]
                break
    tp = found.pop("tp_size", None)
    out = ModelArgs(**found, problems=list(parsed.problems))
    if tp is not None:
        try:
            out.tp_size = max(1, int(tp))
        except ValueError:
            out.problems.append(f"--tp-size {tp!r} is not a whole number.")
    return out


# ---- the facts ----------------------------------------------------------------------------------


class SglangFacts(BaseModel, defer_build=True):
    version: str | None = None
    """As the installation names itself (`0.5.12.post1`); None when it could not be read."""
    path: str | None = None
    """The installed package directory (`…/site-packages/sglang`)."""
    source: str
    """How it was read (`importlib.metadata of /usr/bin/python3`), or why it could not be."""


class FlagsFacts(BaseModel, defer_build=True):
    flags_from: Literal["host", "shipped"]
    """`host`: extracted from the host's own installation (now, or cached from an earlier extraction of
    that version); `shipped`: the console's own list, a fallback named as such."""
    version: str
    """The SGLang version of the list in use (`v0.5.12.post1`)."""
    source: str
    count: int
    note: str | None = None
    """Why the shipped list is used, one sentence; None when the host's own list is."""


class ModelShape(BaseModel, defer_build=True):
    """What the capacity model uses, per GPU at the running TP."""

    attention: Literal["mla", "mha"]
    layers: int
    """Layers that hold KV (full-attention layers of a hybrid model)."""
    linear_layers: int = 0
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    num_kv_heads: int | None = None
    kv_heads_per_gpu: int | None = None
    head_dim: int | None = None
    v_head_dim: int | None = None
    kv_dtype_bytes: int
    cell_bytes: int
    """KV bytes per token per GPU (SGLang's cell) at this TP and KV dtype."""
    state_bytes_per_request: int = 0
    """Linear-attention/mamba state of one request on one GPU (hybrid models)."""
    context_length: int | None = None
    architectures: list[str] = Field(default_factory=list)
    model_type: str | None = None


def model_shape(spec: ModelSpec, *, tp: int, kv_cache_dtype: str) -> ModelShape:
    return ModelShape(
        attention=spec.attention,
        layers=spec.num_layers,
        linear_layers=spec.linear_layers,
        kv_lora_rank=spec.kv_lora_rank,
        qk_rope_head_dim=spec.qk_rope_head_dim,
        num_kv_heads=spec.num_kv_heads,
        kv_heads_per_gpu=spec.kv_heads_per_rank(tp) if spec.attention == "mha" else None,
        head_dim=spec.head_dim,
        v_head_dim=spec.v_head_dim,
        kv_dtype_bytes=spec.kv_element_bytes(kv_cache_dtype),
        cell_bytes=spec.cell_bytes(tp=tp, kv_cache_dtype=kv_cache_dtype),
        state_bytes_per_request=spec.state_bytes_per_request(tp),
        context_length=spec.context_length,
        architectures=list(spec.architectures),
        model_type=spec.model_type,
    )


class ModelFacts(BaseModel, defer_build=True):
    path: str | None = None
    """`--model-path` as the unit gives it."""
    tokenizer_path: str | None = None
    revision: str | None = None
    config_path: str | None = None
    """The config.json read on the host (a local directory or the HF cache snapshot)."""
    config_from: Literal["host", "catalogue"] | None = None
    """`host`: the host's config.json; `catalogue`: the console's bundled entry (a named fallback)."""
    source: str
    """Where the shape came from, or why the host's config.json could not be used."""
    hub_cache: str | None = None
    hub_cache_source: str | None = None
    shape: ModelShape | None = None
    spec: ModelSpec | None = None
    """The spec the capacity model takes (`PoolConfig(model=facts.model.spec, …)`)."""


class DraftFacts(BaseModel, defer_build=True):
    algorithm: str
    path: str | None = None
    config_path: str | None = None
    config_from: Literal["host", "target"] | None = None
    source: str
    cell_bytes: int | None = None
    """The draft pool's KV bytes per token per GPU (same token count as the target pool)."""
    spec: ModelSpec | None = None


class GpuFacts(BaseModel, defer_build=True):
    index: int | None = None
    name: str | None = None
    memory_total_mib: float | None = None
    peak_bandwidth_gbs: float | None = None
    bandwidth_card: str | None = None
    """The table's card (`H100 SXM`); None for a card the table does not name."""
    bandwidth_source: str
    """The figure's source, or `unknown: … is not in the bandwidth table`."""
    peak_from: Literal["nvml", "table"] | None = None
    """`nvml`: the card's own clocks (2 × max memory clock × bus width / 8, NVML back-ends); `table`:
    `console/core/cards.py`, where the back-end cannot say (nvidia-smi has no bus width)."""
    table_peak_gbs: float | None = None
    """The table's figure for the card, beside NVML's (each checks the other)."""


class HostFacts(BaseModel, defer_build=True):
    """What the console learned about one host, each fact with where it came from."""

    host: str
    unit: str
    exec_start: list[str] = Field(default_factory=list)
    working_directory: str | None = None
    interpreter: str | None = None
    interpreter_source: str
    python_version: str | None = None
    sglang: SglangFacts
    flags: FlagsFacts
    model: ModelFacts
    kv_cache_dtype: str = "auto"
    tp_size: int = 1
    draft: DraftFacts | None = None
    gpus: list[GpuFacts] = Field(default_factory=list)
    gpus_source: str = ""
    notes: list[str] = Field(default_factory=list)
    """One sentence per fallback taken (the shipped flag list, the catalogue, an unknown card)."""


def draft_facts(
    algorithm: str,
    target: ModelSpec | None,
    draft: ModelSpec | None,
    *,
    path: str | None,
    config_path: str | None,
    source: str,
    tp: int,
    kv_cache_dtype: str,
) -> DraftFacts:
    """The draft pool's facts: from its own config.json, or from the target's layers (NEXTN/MTP)."""
    cell = None
    config_from: Literal["host", "target"] | None = "host" if draft is not None else None
    if target is not None:
        try:
            cell = draft_cell_bytes(target, draft, algorithm, tp=tp, kv_cache_dtype=kv_cache_dtype)
        except ValueError as exc:
            source = f"{source} {exc}".strip()
        else:
            if draft is None and cell:
                config_from = "target"
    return DraftFacts(
        algorithm=algorithm,
        path=path,
        config_path=config_path,
        config_from=config_from,
        source=source,
        cell_bytes=cell,
        spec=draft,
    )


__all__ = [
    "CONFIG_MAX_BYTES",
    "FLAGS_MAX_BYTES",
    "PROBE_MAX_BYTES",
    "DraftFacts",
    "FlagsFacts",
    "GpuFacts",
    "HostFacts",
    "Interpreter",
    "ModelArgs",
    "ModelFacts",
    "ModelShape",
    "SglangFacts",
    "draft_facts",
    "hf_hub_dir",
    "hf_repo_folder",
    "interpreter_of",
    "is_repo_id",
    "model_args",
    "model_shape",
    "parse_environment",
    "shebang_interpreter",
]
