"""Where the files shipped with the console lie: the stylesheets (`styles/`) and the example profiles
(`profiles/`).

They live at the repository root (the layout DESIGN.md names). A wheel carries them inside the package,
as `console/shipped/styles` and `console/shipped/profiles` (setup.py maps them at build time), so an
install finds them beside its own code whatever its prefix: a venv, `pip install --user`, pipx, a wheel
unpacked anywhere. A checkout or an editable install has no such folders and uses the repository's.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent
"""The `console` package this module was imported from."""


def _shipped(folder: str) -> Path | None:
    for candidate in (PACKAGE_DIR / "shipped" / folder, PACKAGE_DIR.parent / folder):
        if candidate.is_dir():
            return candidate
    return None


def styles_dir() -> Path | None:
    return _shipped("styles")


def stylesheets() -> list[Path]:
    """The console's `.tcss` files, in name order; empty when the install lost them."""
    folder = styles_dir()
    return sorted(folder.glob("*.tcss")) if folder is not None else []


def profiles_dir() -> Path | None:
    """The example profiles shipped with the console (`ctx-200k.toml`, ...)."""
    return _shipped("profiles")


__all__ = ["PACKAGE_DIR", "profiles_dir", "styles_dir", "stylesheets"]
