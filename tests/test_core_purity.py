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
