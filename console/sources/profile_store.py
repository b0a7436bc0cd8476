"""Profiles on disk: where they live, listing, loading, and atomic saving.

Search order: the user's profiles (`platformdirs.user_config_dir("k26-console")/profiles`), then the
examples shipped with the console (the repository's `profiles/`, inside the package once installed). A user profile shadows a shipped one of the same name.
Saving always goes to the user directory (or the first directory given) and is atomic: the text is
written to a temporary file in the same directory, flushed and fsync'd, then renamed over the old file,
and the directory is fsync'd, so a crash leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from platformdirs import user_config_dir
from pydantic import BaseModel

from console.core.audit import AuditEntry
from console.core.profiles import Profile, ProfileError, Verified, parse_profile, record_verified
from console.sources.shipped import profiles_dir

APP_NAME = "k26-console"


def user_profile_dir() -> Path:
    return Path(user_config_dir(APP_NAME)) / "profiles"


def shipped_profile_dir() -> Path | None:
    """The example profiles shipped with the console (console.sources.shipped says where they lie)."""
    return profiles_dir()


def default_dirs() -> list[Path]:
    dirs = [user_profile_dir()]
    shipped = shipped_profile_dir()
    if shipped is not None:
        dirs.append(shipped)
    return dirs


def _natural(name: str) -> list[tuple[int, int | str]]:
    """ctx-32k before ctx-128k."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.findall(r"\d+|\D+", name)]


class ProfileEntry(BaseModel, defer_build=True):
    name: str
    path: Path
    origin: str
    """`user`, `shipped`, or the directory it came from."""


def atomic_write_text(path: Path, text: str, *, mode: int | None = None) -> None:
    """Replace `path` with `text` all at once (temp file + fsync + rename + directory fsync)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        try:
            mode = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class ProfileStore:
    def __init__(self, dirs: Sequence[Path] | None = None) -> None:
        self.dirs = [Path(d) for d in (dirs if dirs is not None else default_dirs())]
        self._user = user_profile_dir()
        self._shipped = shipped_profile_dir()

    def _origin(self, d: Path) -> str:
        if d == self._user:
            return "user"
        if self._shipped is not None and d == self._shipped:
            return "shipped"
        return str(d)

    def entries(self) -> list[ProfileEntry]:
        seen: dict[str, ProfileEntry] = {}
        for d in self.dirs:
            if not d.is_dir():
                continue
            for p in sorted(d.glob("*.toml")):
                if p.stem not in seen:
                    seen[p.stem] = ProfileEntry(name=p.stem, path=p, origin=self._origin(d))
        return sorted(seen.values(), key=lambda e: _natural(e.name))

    def find(self, name: str) -> ProfileEntry:
        """The entry for `name` (a profile name, or a path to a .toml file); ProfileError if none."""
        if name.endswith(".toml") or "/" in name:
            p = Path(name)
            if p.is_file():
                return ProfileEntry(name=p.stem, path=p, origin=str(p.parent))
            raise ProfileError(f"there is no profile file {name}.")
        for e in self.entries():
            if e.name == name:
                return e
        known = ", ".join(e.name for e in self.entries()) or "none"
        where = ", ".join(str(d) for d in self.dirs)
        raise ProfileError(f"there is no profile named {name!r} in {where} (known: {known}).")

    def read_text(self, entry: ProfileEntry) -> str:
        try:
            return entry.path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ProfileError(f"{entry.path} is not UTF-8 text.") from None
        except OSError as exc:
            raise ProfileError(f"{entry.path} cannot be read ({exc.strerror}).") from None

    def load(self, name: str) -> Profile:
        entry = self.find(name)
        return parse_profile(self.read_text(entry), name=entry.name, source=str(entry.path))

    def save_text(self, name: str, text: str) -> Path:
        """Write a profile's text into the first directory (the user's), atomically."""
        path = self.dirs[0] / f"{name}.toml"
        parse_profile(text, name=name, source=str(path))  # never save what cannot be read back
        atomic_write_text(path, text)
        return path

    def record_verified(self, name: str, verified: Verified) -> Path:
        """Record a verified restart in the profile's file, keeping the operator's comments. A shipped
        profile found outside the first (user) directory, such as a shipped example, is copied there with
        the result; the original is left alone."""
        entry = self.find(name)
        text = record_verified(self.read_text(entry), verified)
        if entry.path.parent != self.dirs[0]:
            return self.save_text(entry.name, text)
        parse_profile(text, name=entry.name, source=str(entry.path))
        atomic_write_text(entry.path, text)
        return entry.path


def applied_profile(entries: Iterable[AuditEntry]) -> str | None:
    """The profile in force on the host by its audit trail: that of the last apply that ended ok, unless a
    rollback that ended ok came after it. A rollback names the profile it put back (from the kept
    drop-in's header), else where it went in words (the previous drop-in, the unit's own ExecStart): then
    no profile is known to be in force."""
    from console.core.rollback_target import PREVIOUS_DROPIN, UNIT_DEFAULT

    applied: str | None = None
    for e in entries:
        if e.outcome != "ok":
            continue
        if e.action == "apply" and e.profile:
            applied = e.profile
        elif e.action == "rollback":
            applied = e.profile if e.profile not in (None, "", PREVIOUS_DROPIN, UNIT_DEFAULT) else None
    return applied


def applied_target(
    entries: Iterable[AuditEntry], store: ProfileStore | None = None
) -> tuple[str | None, int | None]:
    """The profile the audit trail says the host was last applied with, and that profile's target
    context (None when the profile has since been deleted or broken): the one place `export` and
    `snapshot` take a host's target from when none is given (`snapshot --json` said null where
    `export` said the applied ctx-200k's 200,000)."""
    name = applied_profile(entries)
    if name is None:
        return None, None
    try:
        return name, (store or ProfileStore()).load(name).target_context
    except Exception:  # a profile deleted or broken since it was applied: no target, not a crash
        return name, None


__all__ = [
    "ProfileEntry",
    "ProfileStore",
    "applied_profile",
    "applied_target",
    "atomic_write_text",
    "default_dirs",
    "shipped_profile_dir",
    "user_profile_dir",
]
