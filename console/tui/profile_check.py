"""What the profile editor shows about the text being typed: is it a readable profile, what SGLang would
say about its flags, what the capacity model predicts on this host (`core.apply.planner_verdict`, the
check `apply` itself makes), and what it changes against the running `ExecStart`. Pure: no Textual, no clock, no I/O, so the tests check the figures directly and the
editor can run it on every (debounced) keystroke.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from console.core.apply import PlannerVerdict, host_profile, planner_verdict
from console.core.capacity import DEFAULT_MIN_HEADROOM_GIB
from console.core.flagdrift import version_drift
from console.core.flags import FlagList, UnknownVersion, load_flag_list
from console.core.issues import Issue
from console.core.profiles import (
    Profile,
    ProfileError,
    diff_against_argv,
    parse_profile,
    validate_profile,
)
from console.core.state import Boot
from console.core.tomlread import TomlTooDeep, load_toml


class ProfileCheck(BaseModel, defer_build=True):
    """Everything the editor shows beside the text."""

    model_config = ConfigDict(frozen=True)

    name: str
    profile: Profile | None = None
    """None when the text is not a readable profile (then `issues` holds the TOML error with its line)."""
    issues: tuple[Issue, ...] = ()
    whatif: PlannerVerdict | None = None
    """The planner's verdict, the very one `apply` checks before it touches the host."""
    diff: tuple[str, ...] = ()
    diff_note: str | None = None
    """Why there is no diff (no running ExecStart known), or words SGLang would not take in it."""
    argv: tuple[str, ...] = Field(default_factory=tuple)

    @property
    def errors(self) -> list[Issue]:
        return [i for i in self.issues if i.level == "error"]

    @property
    def ok(self) -> bool:
        return self.profile is not None and not self.errors


def named_in(text: str, default: str) -> str:
    """The `name = ...` the text declares (so editing it saves under a new name), else `default`."""
    try:
        data = load_toml(text)
    except (tomllib.TOMLDecodeError, TomlTooDeep):  # the check below says what is wrong with it
        return default
    name = data.get("name")
    return name if isinstance(name, str) and name else default


def _flag_list(profile: Profile) -> tuple[FlagList | None, str | None]:
    try:
        return load_flag_list(profile.sglang_version), None
    except UnknownVersion as exc:
        return None, str(exc)


def _drift(
    profile: Profile, written_for: FlagList | None, host: FlagList, problem: str | None
) -> list[Issue]:
    """A profile written for another SGLang than the host runs: one warning, and one per flag that
    differs there (renamed, removed, retired, deprecated)."""
    if written_for is None:
        said = f"{problem or 'unknown SGLang version'}; checked against SGLang {host.sglang_version}, which the host runs"
        return [Issue(level="warning", where="sglang_version", message=said)]
    found = version_drift(profile.flags, written_for, host)
    if found.same_version:
        return []
    head = Issue(level="warning", where="sglang_version", message=found.summary())
    return [
        head,
        *(
            Issue(level="warning", where=f"flags.{d.flag.lstrip('-')}", message=d.sentence)
            for d in found.profile_flags
        ),
    ]


def check_profile_text(
    text: str,
    name: str,
    *,
    boots: Sequence[Boot] = (),
    running_argv: Sequence[str] | None = None,
    model: str | None = None,
    host_flags: FlagList | None = None,
    min_headroom_gib: float = DEFAULT_MIN_HEADROOM_GIB,
) -> ProfileCheck:
    """The editor's verdict on `text` (saved as `name` unless the text names itself otherwise). With
    `host_flags` (the flag list of the SGLang the host runs) the flags are checked against what will run
    them, and a profile written for another version says which of its flags differ there."""
    name = named_in(text, name)
    try:
        profile = parse_profile(text, name=name)
    except ProfileError as exc:
        return ProfileCheck(name=name, issues=(Issue(level="error", where="toml", message=str(exc)),))
    flag_list, problem = _flag_list(profile)
    drift: list[Issue] = []
    if host_flags is not None:
        drift = _drift(profile, flag_list, host_flags, problem)
        flag_list = host_flags
    if flag_list is None:
        issue = Issue(level="error", where="sglang_version", message=problem or "unknown SGLang version")
        return ProfileCheck(name=name, profile=profile, issues=(issue,))
    validation = validate_profile(profile, flag_list)
    issues = (*drift, *validation.issues)
    whatif = planner_verdict(profile, flag_list, boots, model=model, min_headroom_gib=min_headroom_gib)
    diff: tuple[str, ...] = ()
    note: str | None
    if running_argv:
        # As apply will run it: the unit keeps its interpreter, --host and --port.
        hosted, kept = host_profile(profile, flag_list, running_argv)
        d = diff_against_argv(running_argv, hosted, flag_list)
        diff = tuple(d.lines())
        notes = [*kept, *d.problems] or (["no change against the running ExecStart."] if d.empty else [])
        note = " ".join(notes) or None
    else:
        note = "the running ExecStart is not known (not connected yet)."
    return ProfileCheck(
        name=name,
        profile=profile,
        issues=issues,
        whatif=whatif,
        diff=diff,
        diff_note=note,
        argv=tuple(validation.argv),
    )


class EditDiff(BaseModel, defer_build=True):
    """What saving the editor's text changes in the file: the lines, and whether any of it reaches the
    host (a blank line or a comment changes the file, not the flags a restart would run)."""

    model_config = ConfigDict(frozen=True)

    name: str
    """The profile the text is saved as."""
    renamed_from: str | None = None
    """The profile the text was opened as, when its `name = ...` now says another (a new profile)."""
    lines: tuple[str, ...] = ()
    """`line N: + text` / `line N: - text`, in file order; a blank line is said in words."""
    profile_changed: bool | None = None
    """Whether the profile read from the text differs from the one read from the file (flags, target,
    version, notes); None when either does not read as a profile."""

    @property
    def empty(self) -> bool:
        return not self.lines and self.renamed_from is None


EDIT_LINES_SHOWN = 12
"""Lines of an edit the save dialog lists; past them it says how many more."""


def _shown(line: str) -> str:
    return line if line.strip() else "(blank line)"


def edit_diff(saved: str, text: str, name: str) -> EditDiff:
    """The edit `text` makes to the saved file `saved` of profile `name`, line by line (numbered as in
    the edited text for additions, as in the file for removals), for the dialog that asks before
    saving: an edit made by a stray key (an Enter that was meant for the list) must be seen before it is
    written."""
    old, new = saved.split("\n"), text.split("\n")
    lines: list[str] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        lines += [f"line {i + 1}: - {_shown(old[i])}" for i in range(i1, i2)]
        lines += [f"line {j + 1}: + {_shown(new[j])}" for j in range(j1, j2)]
    target = named_in(text, name)
    changed: bool | None = None
    try:
        before = parse_profile(saved, name=named_in(saved, name))
        after = parse_profile(text, name=target)
    except ProfileError:
        pass
    else:
        changed = before.model_dump(exclude={"name"}) != after.model_dump(exclude={"name"})
    return EditDiff(
        name=target,
        renamed_from=name if target != name else None,
        lines=tuple(lines),
        profile_changed=changed,
    )


__all__ = ["EditDiff", "Issue", "ProfileCheck", "check_profile_text", "edit_diff", "named_in"]
