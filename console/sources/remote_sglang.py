"""Sent over SSH to the Python a host's unit runs (`PYTHON -` with this file on stdin): where that Python
finds the `sglang` package and which version it is, WITHOUT importing it.

Importing sglang pulls torch and CUDA (seconds, and GPU memory on a busy card), so the package is only
located (`importlib.util.find_spec` of a top-level name executes nothing) and its version read from the
distribution's metadata, or from `sglang/_version.py` / `sglang/version.py` parsed with `ast` when the
metadata is missing or belongs to another copy. Standard library only, Python 3.8+; prints one JSON
object on one line, whatever happens.
"""

from __future__ import annotations  # the host may run 3.8: annotations stay unevaluated

import ast
import json
import os
import sys
from typing import Any


def _literal_version(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(200_000))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        value = getattr(node, "value", None)
        for target in targets:
            names = [target] if isinstance(target, ast.Name) else []
            if isinstance(target, ast.Tuple):
                names = [t for t in target.elts if isinstance(t, ast.Name)]
            is_text = isinstance(value, ast.Constant) and isinstance(value.value, str)
            if is_text and any(n.id in ("__version__", "version") for n in names):
                return str(value.value)  # type: ignore[union-attr]
    return None


def _same_dir(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def probe() -> dict[str, Any]:
    out: dict[str, Any] = {"k26": 1, "python": sys.version.split()[0], "executable": sys.executable}
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None:
        out["error"] = "this Python has no sglang package on its path"
        return out
    locations = list(spec.submodule_search_locations or [])
    path = locations[0] if locations else os.path.dirname(spec.origin or "")
    out["path"] = path
    out["root"] = os.path.dirname(path)
    out["has_server_args"] = os.path.isfile(os.path.join(path, "srt", "server_args.py"))
    try:
        import importlib.metadata as metadata

        dist = metadata.distribution("sglang")
        located = dist.locate_file("sglang")
        if _same_dir(str(located), path):
            out["version"] = dist.version
            out["version_from"] = "the installed distribution's metadata (importlib.metadata)"
    except Exception:  # no metadata, or an older Python without importlib.metadata
        pass
    if "version" not in out:
        for name in ("_version.py", "version.py"):
            version = _literal_version(os.path.join(path, name))
            if version:
                out["version"] = version
                out["version_from"] = f"sglang/{name} (read, not imported)"
                break
    return out


if __name__ == "__main__":
    try:
        result = probe()
    except Exception as exc:
        result = {"k26": 1, "error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(result) + "\n")
