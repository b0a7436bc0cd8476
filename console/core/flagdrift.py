"""What changed in SGLang's flags between the version a profile was written for and the host's version.

A profile names the SGLang version whose parser it was checked against (`sglang_version`). When the
host runs another version, the same `[flags]` may mean something else or nothing at all: a flag was
renamed (the old spelling is gone, a flag with the same destination took its place), retired (the
server refuses it) or removed, and a flag the profile leaves alone may have a new default. This module
compares the two flag lists (both extracted from SGLang's own source) and says which of these apply.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field

from console.core.flags import FlagError, FlagList, FlagSpec

DriftKind = Literal["renamed", "removed", "retired", "deprecated", "default_changed"]


class FlagDrift(BaseModel, defer_build=True):
    kind: DriftKind
    flag: str
    """As the profile (or the older list) spells it: `--cuda-graph-max-bs`."""
    now: str | None = None
    """The host version's spelling of a renamed flag."""
    old_default: Any = None
    new_default: Any = None
    sentence: str


class VersionDrift(BaseModel, defer_build=True):
    written_for: str
    host_version: str
    profile_flags: list[FlagDrift] = Field(default_factory=list)
    """The profile's own flags that are renamed, removed, retired or deprecated on the host's version."""
    defaults: list[FlagDrift] = Field(default_factory=list)
    """Flags the profile leaves unset whose default differs on the host's version."""

    @property
    def same_version(self) -> bool:
        return self.written_for == self.host_version

    @property
    def differs(self) -> bool:
        return bool(self.profile_flags or self.defaults)

    def summary(self) -> str:
        """One sentence for the operator."""
        if self.same_version:
            return f"the profile was written for SGLang {self.written_for}, the version the host runs."
        head = f"the profile was written for SGLang {self.written_for}; the host runs {self.host_version}"
        if not self.differs:
            return f"{head}, and none of its flags nor any default differs."
        parts = []
        if self.profile_flags:
            parts.append(f"{len(self.profile_flags)} of its flags differ")
        if self.defaults:
            parts.append(f"{len(self.defaults)} flag(s) it leaves unset have new defaults")
        return f"{head}: {' and '.join(parts)}."


def _option(key: str) -> str:
    return "--" + key.lstrip("-")


def _resolve(flag_list: FlagList, option: str) -> FlagSpec | None:
    try:
        return flag_list.resolve(option).spec
    except FlagError:
        return None


def _successor(new: FlagList, option: str, old_spec: FlagSpec | None) -> FlagSpec | None:
    """The host version's flag that took the place of a spelling it no longer accepts: one listing the
    old spelling as an alias, else one with the old flag's destination."""
    for spec in new.flags:
        if option in spec.aliases:
            return spec
    if old_spec is not None:
        for spec in new.flags:
            if spec.target == old_spec.target:
                return spec
    return None


def _plain(spec: FlagSpec) -> str:
    # An on/off flag left unset is off whether its list says None or False.
    value = bool(spec.default) if spec.switch else spec.default
    return json.dumps(value, sort_keys=True, default=str)


def version_drift(profile_flags: Mapping[str, Any], old: FlagList, new: FlagList) -> VersionDrift:
    """How `profile_flags`, written against `old`, fare on `new`, and which unset defaults moved."""
    drift = VersionDrift(written_for=old.sglang_version, host_version=new.sglang_version)
    if drift.same_version:
        return drift
    set_targets: set[str] = set()
    ver = new.sglang_version
    for key in profile_flags:
        option = _option(key)
        old_spec = _resolve(old, option)
        if old_spec is not None:
            set_targets.add(old_spec.target)
        new_spec = _resolve(new, option)
        if new_spec is None:
            successor = _successor(new, option, old_spec)
            if successor is not None:
                drift.profile_flags.append(
                    FlagDrift(
                        kind="renamed",
                        flag=option,
                        now=successor.flag,
                        sentence=f"{option} is {successor.flag} on SGLang {ver}.",
                    )
                )
            else:
                why = f"{option} is not a flag of SGLang {ver}"
                try:
                    new.resolve(option)
                except FlagError as exc:
                    if exc.kind == "ambiguous":
                        why = f"{exc} on SGLang {ver}"
                drift.profile_flags.append(FlagDrift(kind="removed", flag=option, sentence=f"{why}."))
            continue
        set_targets.add(new_spec.target)
        if new_spec.deprecated in ("error", "warn"):
            retired = new_spec.deprecated == "error"
            what = "retired (the server refuses it)" if retired else "deprecated"
            drift.profile_flags.append(
                FlagDrift(
                    kind="retired" if retired else "deprecated",
                    flag=option,
                    sentence=f"{option} is {what} on SGLang {ver}"
                    + (f": {new_spec.help}" if new_spec.help else "."),
                )
            )
    new_by_target = {spec.target: spec for spec in new.flags}
    for spec in old.flags:
        if spec.target in set_targets:
            continue
        other = new_by_target.get(spec.target)
        if other is None or spec.default_expr or other.default_expr:
            continue
        if _plain(spec) != _plain(other):
            drift.defaults.append(
                FlagDrift(
                    kind="default_changed",
                    flag=other.flag,
                    old_default=spec.default,
                    new_default=other.default,
                    sentence=f"{other.flag} defaults to {other.default!r} on SGLang {ver} "
                    f"({spec.default!r} on {old.sglang_version}).",
                )
            )
    return drift


__all__ = ["DriftKind", "FlagDrift", "VersionDrift", "version_drift"]
