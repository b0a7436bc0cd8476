"""console/core must stay pure: importing it must not pull in Textual, SSH, HTTP or asyncio."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "console" / "core"
FORBIDDEN = {"textual", "asyncssh", "httpx", "asyncio", "subprocess", "socket"}


def test_core_sources_import_nothing_forbidden() -> None:
    offenders = []
    for path in sorted(CORE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                if name.split(".")[0] in FORBIDDEN:
                    offenders.append(f"{path.name}: {name}")
    assert offenders == []


def test_importing_core_loads_no_io_or_ui_library() -> None:
    code = (
        "import sys, pkgutil, importlib, console.core as c\n"
        "for m in pkgutil.iter_modules(c.__path__): importlib.import_module('console.core.' + m.name)\n"
        "bad = sorted({n.split('.')[0] for n in sys.modules} & {'textual','asyncssh','httpx'})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# File I/O: the disk belongs to console/sources (the profile store, the flag-list cache, the host's files).
_IO_CALLS = {"open"}
_IO_METHODS = {
    "read_text", "write_text", "read_bytes", "write_bytes", "mkdir", "unlink", "rmdir", "iterdir",
    "glob", "rglob", "is_file", "is_dir", "exists", "stat", "touch", "chmod",
}  # fmt: skip
_IO_MODULES = {"platformdirs", "tempfile", "shutil", "io"}
_OS_IO = {"open", "fdopen", "replace", "rename", "unlink", "remove", "fsync", "makedirs", "mkdir", "listdir",
          "scandir", "chmod", "stat", "walk"}  # fmt: skip
# The shipped SGLang flag lists are the program's own read-only data (package data read through
# importlib.resources, like a module): the one read core may make.
_ALLOWED = {("flags.py", "available_versions"), ("flags.py", "_load_flag_list")}


def _io_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []

    def visit(node: ast.AST, func: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            func = node.name
        where = f"{path.name}:{getattr(node, 'lineno', '?')} in {func}"
        if (path.name, func) not in _ALLOWED:
            if isinstance(node, ast.Call):
                f = node.func
                if isinstance(f, ast.Name) and f.id in _IO_CALLS:
                    found.append(f"{where}: {f.id}()")
                elif isinstance(f, ast.Attribute):
                    base = f.value
                    if isinstance(base, ast.Name) and base.id == "os" and f.attr in _OS_IO:
                        found.append(f"{where}: os.{f.attr}()")
                    elif f.attr in _IO_METHODS and not (
                        isinstance(base, ast.Name) and base.id in ("re", "str")
                    ):
                        found.append(f"{where}: .{f.attr}()")
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            found.extend(f"{where}: import {n}" for n in names if n.split(".")[0] in _IO_MODULES)
        for child in ast.iter_child_nodes(node):
            visit(child, func)

    visit(tree, "<module>")
    return found


def test_core_does_no_file_io() -> None:
    offenders = [use for path in sorted(CORE.rglob("*.py")) for use in _io_uses(path)]
    assert offenders == []


def test_the_file_io_check_sees_a_read(tmp_path: Path) -> None:
    # The check itself must catch what it is for: a module that reads a file, and one that writes.
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os, platformdirs\n"
        "def load(p):\n    return p.read_text()\n"
        "def save(p, t):\n    os.replace(p, t)\n    with open(p) as f:\n        return f\n"
    )
    uses = _io_uses(sample)
    assert any(".read_text()" in u for u in uses) and any("os.replace()" in u for u in uses)
    assert any("open()" in u for u in uses) and any("import platformdirs" in u for u in uses)
