"""The README says what a newcomer needs: every `plan` option, that the demo runs apt-get as root, and a
recipe for the 0.97 profile that works as written."""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

from console.cli.main import build_parser
from console.core.profiles import parse_profile

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def _plan_options() -> list[str]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    plan = sub.choices["plan"]
    return [o for a in plan._actions for o in a.option_strings if o.startswith("--") and o != "--help"]


def test_the_readme_names_every_plan_option() -> None:
    options = _plan_options()
    assert "--mem-fraction-static" in options and "--gpu-mem-gib" in options
    plan_rows = [line for line in README.splitlines() if line.startswith("| `k26-console plan")]
    assert len(plan_rows) == 1
    missing = [o for o in options if not re.search(re.escape(o) + r"\b(?!-)", plan_rows[0])]
    assert missing == []


def test_the_readme_says_the_demo_runs_apt_get_as_root() -> None:
    assert re.search(r"`scripts/demo` runs `apt-get` only when run as root", README)


def test_the_readmes_recipe_for_the_097_profile_works(tmp_path: Path) -> None:
    block = next(b for b in re.findall(r"```bash\n(.*?)```", README, re.S) if "0.97" in b)
    command = block.split("\n.venv/bin/")[0].replace("/tmp/ctx-200k-097.toml", str(tmp_path / "p.toml"))
    subprocess.run(["bash", "-c", command], cwd=REPO, check=True, timeout=30)
    profile = parse_profile((tmp_path / "p.toml").read_text(), name="ctx-200k-097")
    assert profile.name == "ctx-200k-097" and profile.flags["mem-fraction-static"] == 0.97
    assert "/tmp/ctx-200k-097.toml" in block.split("\n.venv/bin/", 1)[1]  # the path is what apply gets
