"""SGLang flag lists by version: the ones learned from hosts, cached locally, and the shipped ones.

A host's own list is extracted once per SGLang version (console.sources.hostinfo) and kept as
`<cache>/sglang-args/v<version>.json` (the user's cache dir); the shipped lists in
`console/data/sglang-args/` are the fallback, and each caller says which it used.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import platformdirs

from console.core.flags import (
    DEFAULT_SGLANG_VERSION,
    FlagList,
    UnknownVersion,
    canonical_version,
    load_flag_list,
)
from console.core.hostfacts import HostFacts


def default_cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("k26-console"))


def shipped_flag_list(version: str | None) -> tuple[FlagList, str]:
    """The shipped list for `version` when there is one, else the default; with which it is."""
    if version:
        with contextlib.suppress(UnknownVersion):
            flags = load_flag_list(version)
            return flags, f"the shipped list of the same version ({flags.sglang_version})"
    flags = load_flag_list(DEFAULT_SGLANG_VERSION)
    return flags, f"the shipped list of SGLang {DEFAULT_SGLANG_VERSION}"


def host_flag_list(facts: HostFacts, cache_dir: Path | None = None) -> FlagList:
    """The flag list `facts` names: the host's own (from the local cache) or the shipped fallback."""
    if facts.flags.flags_from == "host":
        cached = read_cached(cache_dir or default_cache_dir(), facts.flags.version)
        if cached is not None:
            return cached
    return shipped_flag_list(facts.flags.version)[0]


def cache_path(cache_dir: Path, version: str) -> Path:
    return cache_dir / "sglang-args" / f"{canonical_version(version)}.json"


def read_cached(cache_dir: Path, version: str) -> FlagList | None:
    path = cache_path(cache_dir, version)
    try:
        flags = FlagList.from_json(path.read_bytes())
    except (OSError, ValueError):
        return None
    return flags if flags.sglang_version == canonical_version(version) else None


def write_cached(cache_dir: Path, flags: FlagList, text: str) -> Path:
    path = cache_path(cache_dir, flags.sglang_version)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


__all__ = [
    "cache_path",
    "default_cache_dir",
    "host_flag_list",
    "read_cached",
    "shipped_flag_list",
    "write_cached",
]
