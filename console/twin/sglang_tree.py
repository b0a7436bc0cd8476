"""The twin's installed-looking SGLang and its Hugging Face cache.

A real host's unit runs a Python whose site-packages holds `sglang/` and `sglang-X.dist-info/`; the
console learns the version and the flag list from those files (console.sources.hostinfo). So the twin
lays out the same: the Python files of a real SGLang wheel (pinned `WHEEL_VERSION`, downloaded by
`scripts/fetch-sglang-wheel` into the git-ignored `.cache/sglang-wheel/`, never committed) are extracted
once and linked into the twin's `lib/python/`, with two exceptions that stay the twin's own:
`sglang/__init__.py` (the real one imports torch) and `sglang/launch_server.py` (it runs the simulated
server). Without the wheel the twin keeps its two-file stand-in package, and the console, finding no
version there, falls back to its shipped flag list and says so.

The model's config.json sits in a Hugging Face cache layout under the twin's `HF_HOME`
(`hub/models--ORG--NAME/{refs/main, blobs/SHA256, snapshots/REV/config.json -> ../../blobs/SHA256}`),
as `huggingface_hub` writes it: the real file when the fetch script could download it, else the
hand-written one in `console/twin/data/hf-kimi-k2.6/` (see its README: documented values, not the
downloaded file).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from console.twin.layout import write_atomic

WHEEL_VERSION = "0.5.12.post1"
"""The SGLang the simulated server imitates (its flag list and log formats are v0.5.12.post1's)."""
MODEL_ID = "moonshotai/Kimi-K2.6"
WHEEL_DIR_ENV = "K26_SGLANG_WHEEL_DIR"
REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_ROOT = REPO_ROOT / ".cache"
BUNDLED_CONFIG = Path(__file__).resolve().parent / "data" / "hf-kimi-k2.6" / "config.json"
_TWIN_OWN = frozenset({"__init__.py", "launch_server.py", "__pycache__"})


def wheel_dir() -> Path:
    override = os.environ.get(WHEEL_DIR_ENV)
    return Path(override) if override else CACHE_ROOT / "sglang-wheel"


def find_wheel(version: str = WHEEL_VERSION) -> Path | None:
    """The cached wheel of `version`, if `scripts/fetch-sglang-wheel` has fetched it."""
    d = wheel_dir()
    if not d.is_dir():
        return None
    found = sorted(d.glob(f"sglang-{version}-*.whl"))
    return found[0] if found else None


def downloaded_config() -> Path | None:
    """The real config.json of MODEL_ID, when the fetch script could reach the hub."""
    path = CACHE_ROOT / "hf-configs" / MODEL_ID.replace("/", "--") / "config.json"
    return path if path.is_file() else None


def extracted_tree(wheel: Path) -> Path:
    """The wheel's Python files, extracted once beside it (`<wheel>.site/`), safe against a concurrent
    extraction by another twin: each extracts into a temporary directory and renames it into place."""
    target = wheel.with_name(wheel.name + ".site")
    if (target / "sglang" / "srt" / "server_args.py").is_file():
        return target
    tmp = Path(tempfile.mkdtemp(dir=wheel.parent, prefix=f".{wheel.name}."))
    try:
        with zipfile.ZipFile(wheel) as zf:
            for member in zf.namelist():
                top = member.split("/", 1)[0]
                if member.endswith("/") or ".." in member.split("/"):
                    continue
                if top == "sglang" and not member.endswith(".py"):
                    continue  # the package's Python sources only
                if top == "sglang" or top.endswith(".dist-info"):
                    zf.extract(member, tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "sglang" / "srt" / "server_args.py").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def install_sglang_tree(pylib_dir: Path, version: str = WHEEL_VERSION) -> str | None:
    """Link the real wheel's files into the twin's `lib/python/` (the twin's two own files kept);
    returns the version installed, or None when the wheel is not cached (the stand-in stays alone)."""
    pkg = pylib_dir / "sglang"
    pkg.mkdir(parents=True, exist_ok=True)
    for entry in [*pkg.iterdir(), *pylib_dir.glob("sglang-*.dist-info")]:
        if entry.is_symlink():
            entry.unlink()
    wheel = find_wheel(version)
    if wheel is None:
        return None
    tree = extracted_tree(wheel)
    for entry in (tree / "sglang").iterdir():
        link = pkg / entry.name
        if entry.name not in _TWIN_OWN and not link.exists():
            link.symlink_to(entry)
    for dist in tree.glob("sglang-*.dist-info"):
        if not (pylib_dir / dist.name).exists():
            (pylib_dir / dist.name).symlink_to(dist)
    return version


def install_hf_cache(hf_home: Path, model_id: str = MODEL_ID) -> Path:
    """The model's config.json in the Hugging Face cache layout under `hf_home`; returns its snapshot path."""
    source = downloaded_config() or BUNDLED_CONFIG
    data = source.read_bytes()
    repo = hf_home / "hub" / ("models--" + model_id.replace("/", "--"))
    blob_name = hashlib.sha256(data).hexdigest()
    revision = hashlib.sha1(data).hexdigest()  # a 40-hex commit id, stable for the same file
    write_atomic(repo / "blobs" / blob_name, data)
    write_atomic(repo / "refs" / "main", revision)
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    link = snapshot / "config.json"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(Path("..") / ".." / "blobs" / blob_name)
    return link


__all__ = [
    "BUNDLED_CONFIG",
    "MODEL_ID",
    "WHEEL_DIR_ENV",
    "WHEEL_VERSION",
    "downloaded_config",
    "extracted_tree",
    "find_wheel",
    "install_hf_cache",
    "install_sglang_tree",
    "wheel_dir",
]
