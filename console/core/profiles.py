"""Flag profiles: the model, TOML text in and out, rendering, validation and diffs. No disk I/O here
(see `profile_store` for the files).

A profile is a TOML file the operator keeps and comments::

    name = "ctx-200k"
    target_context = 200000          # the longest request this profile must serve
    sglang_version = "v0.5.12.post1" # which shipped flag list validates it
    notes = "..."
    command = ["python3", "-m", "sglang.launch_server"]

    [flags]                          # as on the command line, without the dashes
    model-path = "moonshotai/Kimi-K2.6"
    tp-size = 8
    mem-fraction-static = 0.93
    enable-metrics = true            # true → bare flag; false → left out
    cuda-graph-bs = [1, 2, 4, 8]     # lists → one word each (nargs='+')

    [verified]                       # written by the console after a verified restart
    pool_tokens = 205444
    headroom_gib = 4.9
    when = 2026-05-30T22:14:46Z
    host = "gpu-01"
    tok_s_at_depth = { "1000" = 41.0, "185000" = 0.7 }

It is read with `tomllib`; changes are written with `tomlkit` into the operator's text, so comments,
order and spacing survive.
"""

from __future__ import annotations

import itertools
import posixpath
import re
import shlex
import tomllib
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from console.core.flag_validation import ValidationReport, validate_flags
from console.core.flags import (
    DEFAULT_SGLANG_VERSION,
    FlagList,
    FlagSpec,
    FlagValue,
    human_readable_int,
    parse_argv,
    render_flags,
    same_value,
    split_command,
)
from console.core.issues import Findings, Issue
from console.core.systemd import ExecStartError, argv_size_problems, render_dropin, render_exec_start
from console.core.tomlread import TomlTooDeep, load_toml

if TYPE_CHECKING:
    import tomlkit

DEFAULT_COMMAND = ("python3", "-m", "sglang.launch_server")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ProfileError(ValueError):
    """A profile that cannot be read; the message is one sentence naming the file and, for TOML, the line."""


class Verified(BaseModel, defer_build=True):
    """What the last verified restart with this profile measured."""

    model_config = ConfigDict(extra="forbid")

    pool_tokens: int | None = Field(default=None, ge=0)
    headroom_gib: float | None = None
    tok_s_at_depth: dict[int, float] = Field(default_factory=dict)
    """Decode tokens/s by context depth (tokens)."""
    when: datetime | None = None
    host: str | None = None
    sglang_version: str | None = None


class Profile(BaseModel, defer_build=True):
    model_config = ConfigDict(extra="forbid")

    name: str
    target_context: int = Field(gt=0)
    sglang_version: str = DEFAULT_SGLANG_VERSION
    notes: str = ""
    command: list[str] = Field(default_factory=lambda: list(DEFAULT_COMMAND), min_length=1)
    flags: dict[str, FlagValue] = Field(default_factory=dict)
    verified: Verified | None = None

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("a profile name is letters, digits, '.', '_' and '-'")
        return v

    @field_validator("flags", mode="before")
    @classmethod
    def _flags_plain(cls, v: Any) -> Any:
        if isinstance(v, Mapping):
            return {str(k).removeprefix("--"): _plain(x) for k, x in v.items()}
        return v


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


# --------------------------------------------------------------------------------------------------
# TOML in
# --------------------------------------------------------------------------------------------------

_TOML_POS = re.compile(r"\s*\(at line (\d+), column (\d+)\)")


def _line_of(text: str, key: str) -> int | None:
    pat = re.compile(rf"^\s*(\"?){re.escape(key)}\1\s*=|^\s*\[{re.escape(key)}[\].]", re.M)
    m = pat.search(text)
    return text.count("\n", 0, m.start()) + 1 if m else None


def parse_profile(text: str, *, name: str, source: str | None = None) -> Profile:
    """A profile from TOML text. `name` is the file's stem; a `name` key in the file must agree with it.
    Raises ProfileError with one sentence: the file, the line when known, what is wrong."""
    where = source or f"{name}.toml"
    try:
        data = load_toml(text)
    except TomlTooDeep as exc:
        raise ProfileError(f"{where} {exc}.") from None
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = _TOML_POS.search(msg)
        detail = _TOML_POS.sub("", msg).rstrip(".")
        if m:
            raise ProfileError(f"{where} line {m.group(1)} is not valid TOML: {detail}.") from None
        raise ProfileError(f"{where} is not valid TOML: {detail}.") from None
    named = data.setdefault("name", name)
    if named != name:
        line = _line_of(text, "name")
        at = f" line {line}" if line else ""
        raise ProfileError(
            f"{where}{at} says name = {named!r}, but a profile is named by its file: "
            f"rename the file to {named}.toml or the name to {name!r}."
        )
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(p) for p in first["loc"]]
        key = loc[0] if loc else ""
        line = _line_of(text, loc[-1] if len(loc) > 1 and loc[0] in ("flags", "verified") else key)
        if line is None and key:
            line = _line_of(text, key)
        field = ".".join(loc) or "the file"
        if first["type"] == "extra_forbidden":
            what = f"{field} is not a profile setting (SGLang flags go under [flags])"
        elif first["type"] == "missing":
            what = f"{field} is missing"
        else:
            what = f"{field}: {first['msg'][0].lower() + first['msg'][1:]}"
        at = f" line {line}" if line else ""
        raise ProfileError(f"{where}{at}: {what}.") from None


# --------------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------------


def profile_argv(profile: Profile, flag_list: FlagList | None = None) -> list[str]:
    """command + flags as the server's argv (booleans become bare flags; false is left out)."""
    return [*profile.command, *render_flags(profile.flags, flag_list)]


def argv_lines(argv: Sequence[str]) -> list[str]:
    """An argv for reading: the command on the first line, then one option (with its values) a line,
    each word shell-quoted."""
    lines: list[list[str]] = [[]]
    for i, word in enumerate(argv):
        if word.startswith("--") and i > 0 and lines[-1]:
            lines.append([])
        lines[-1].append(shlex.quote(word))
    return [" ".join(words) for words in lines if words]


def profile_dropin(profile: Profile, flag_list: FlagList | None = None, *, when: str | None = None) -> str:
    """The systemd drop-in text that makes the unit run this profile."""
    header = [
        f"Written by k26-console: profile {profile.name} (target context {profile.target_context:,} tokens,",
        f"SGLang {profile.sglang_version}). Edit the profile, not this file; remove it to restore the unit.",
    ]
    if when:
        header.append(f"Written {when}.")
    return render_dropin(profile_argv(profile, flag_list), header=header)


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------


class ProfileValidation(Findings, defer_build=True):
    profile: str
    sglang_version: str
    argv: list[str] = Field(default_factory=list)


def _flag_value(profile: Profile, report: ValidationReport, flag: str) -> Any:
    for key, canonical in report.resolved.items():
        if canonical == flag:
            return profile.flags.get(key)
    return None


def is_sglang_launcher(command: Sequence[str]) -> bool:
    """`python3 -m sglang.launch_server` (any python, any interpreter options) or `sglang serve`."""
    words = list(command)
    if not words:
        return False
    program = posixpath.basename(words[0])
    if program.startswith("python"):
        return any(a == "-m" and b == "sglang.launch_server" for a, b in itertools.pairwise(words))
    return program == "sglang" and words[1:2] == ["serve"]


def validate_profile(profile: Profile, flag_list: FlagList) -> ProfileValidation:
    """The profile against one SGLang version's parser, plus what the console itself insists on: a
    command systemd can run, a context length that reaches the target, a last verified pool that does."""
    report = validate_flags(profile.flags, flag_list)
    out = ProfileValidation(profile=profile.name, sglang_version=flag_list.sglang_version)
    for i in report.issues:
        out.issues.append(i.model_copy(update={"where": f"flags.{i.where}"}))

    argv = profile_argv(profile, flag_list)
    sizes = argv_size_problems(argv)
    for index, sentence in sizes:
        where = "command"
        if index >= len(profile.command) and argv[index - 1].startswith("--"):
            where = f"flags.{argv[index - 1][2:]}"
        out.issues.append(Issue(where=where, level="error", code="too_long", message=f"{sentence}."))
    if not sizes:
        try:
            render_exec_start(argv)
            out.argv = argv
        except ExecStartError as exc:
            out.issues.append(Issue(where="command", level="error", code="exec_start", message=f"{exc}."))
    if not is_sglang_launcher(profile.command):
        out.issues.append(
            Issue(
                where="command",
                level="warning",
                code="not_sglang_launcher",
                message=f"the command {shlex.join(profile.command)} is not SGLang's launcher (python3 -m "
                "sglang.launch_server): the flags are checked against SGLang's parser, but what that program "
                "does with them is not.",
            )
        )

    ctx_spec = _spec_for(flag_list, "--context-length")
    ctx = _flag_value(profile, report, ctx_spec.flag) if ctx_spec else None
    if ctx is None:
        out.issues.append(
            Issue(
                where="flags.context-length",
                level="warning",
                code="no_context_length",
                message=f"context-length is not set, so the server uses the model's own limit rather than "
                f"the target {profile.target_context:,}.",
            )
        )
    elif not isinstance(ctx, bool):
        try:
            n = human_readable_int(str(ctx))
        except ValueError:
            n = None  # reported by the flag check
        if n is not None and n < profile.target_context:
            out.issues.append(
                Issue(
                    where="flags.context-length",
                    level="error",
                    code="context_below_target",
                    message=f"context-length {n:,} is below the profile's target_context {profile.target_context:,}.",
                )
            )
    v = profile.verified
    if v is not None and v.pool_tokens is not None and v.pool_tokens < profile.target_context:
        out.issues.append(
            Issue(
                where="verified.pool_tokens",
                level="warning",
                code="verified_pool_below_target",
                message=f"the last verified pool ({v.pool_tokens:,} tokens) was below target_context "
                f"{profile.target_context:,}.",
            )
        )
    return out


def _spec_for(flag_list: FlagList, option: str) -> FlagSpec | None:
    return flag_list.spec(option)


# --------------------------------------------------------------------------------------------------
# Diffs
# --------------------------------------------------------------------------------------------------


class Change(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True)

    key: str
    """A profile setting (`target_context`, `command`, ...) or a flag (`--mem-fraction-static`)."""
    kind: Literal["added", "removed", "changed"]
    before: str | None = None
    after: str | None = None


class ProfileDiff(BaseModel, defer_build=True):
    before: str
    after: str
    changes: list[Change] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)
    """Words of a running argv that SGLang would not accept (reported, not compared)."""

    @property
    def empty(self) -> bool:
        return not self.changes

    def lines(self) -> list[str]:
        out = []
        for c in self.changes:
            if c.kind == "added":
                out.append(f"+ {c.key} {c.after}".rstrip())
            elif c.kind == "removed":
                out.append(f"- {c.key} {c.before}".rstrip())
            else:
                out.append(f"~ {c.key} {c.before} → {c.after}")
        return out


def _show(value: tuple[str, ...] | bool) -> str:
    if value is True:
        return "on"
    if value is False:
        return "off"
    return " ".join(shlex.quote(w) for w in value)


def _diff_flags(
    a: Mapping[str, tuple[str, ...] | bool],
    b: Mapping[str, tuple[str, ...] | bool],
    fl: FlagList,
) -> list[Change]:
    out: list[Change] = []
    for flag in [*a, *[f for f in b if f not in a]]:
        if flag not in b:
            out.append(Change(key=flag, kind="removed", before=_show(a[flag])))
        elif flag not in a:
            out.append(Change(key=flag, kind="added", after=_show(b[flag])))
        elif not same_value(fl.spec(flag), a[flag], b[flag]):
            out.append(Change(key=flag, kind="changed", before=_show(a[flag]), after=_show(b[flag])))
    return out


def canonical_flags(
    profile: Profile, flag_list: FlagList
) -> tuple[dict[str, tuple[str, ...] | bool], list[str]]:
    parsed = parse_argv(render_flags(profile.flags, flag_list), flag_list)
    return dict(parsed.values), parsed.problems


def diff_profiles(a: Profile, b: Profile, flag_list: FlagList) -> ProfileDiff:
    """What changes going from profile `a` to profile `b`, flags compared as SGLang `flag_list` reads them
    (`tp = 8` equals `tp-size = 8`, `0.940` equals `0.94`)."""
    diff = ProfileDiff(before=a.name, after=b.name)
    for field in ("target_context", "sglang_version", "command"):
        va, vb = getattr(a, field), getattr(b, field)
        if va != vb:
            show = (lambda v: shlex.join(v)) if field == "command" else str
            diff.changes.append(Change(key=field, kind="changed", before=show(va), after=show(vb)))
    fa, pa = canonical_flags(a, flag_list)
    fb, pb = canonical_flags(b, flag_list)
    diff.changes.extend(_diff_flags(fa, fb, flag_list))
    diff.problems.extend(pa + pb)
    return diff


def diff_against_argv(running: Sequence[str], profile: Profile, flag_list: FlagList) -> ProfileDiff:
    """What applying `profile` changes relative to a running argv (e.g. the unit's current ExecStart)."""
    diff = ProfileDiff(before="running", after=profile.name)
    command, words = split_command(running)
    if command != profile.command:
        diff.changes.append(
            Change(
                key="command", kind="changed", before=shlex.join(command), after=shlex.join(profile.command)
            )
        )
    parsed = parse_argv(words, flag_list)
    diff.problems.extend(parsed.problems)
    fb, pb = canonical_flags(profile, flag_list)
    diff.problems.extend(pb)
    diff.changes.extend(_diff_flags(parsed.values, fb, flag_list))
    return diff


# --------------------------------------------------------------------------------------------------
# TOML out (tomlkit: the operator's comments and order survive). tomlkit is imported where a profile is
# written, not with the module: 10 ms of every command's start that reads profiles and writes none.
# --------------------------------------------------------------------------------------------------


def _toml_value(v: Any) -> Any:
    import tomlkit

    if isinstance(v, dict):
        t = tomlkit.inline_table()
        for k, x in v.items():
            t[str(k)] = _toml_value(x)
        return t
    if isinstance(v, list):
        arr = tomlkit.array()
        for x in v:
            arr.append(_toml_value(x))
        return arr
    return v


def _load_doc(text: str) -> tomlkit.TOMLDocument:
    import tomlkit
    import tomlkit.exceptions

    try:
        return tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as exc:
        raise ProfileError(f"the profile line {exc.line} is not valid TOML: {exc}.") from None


def _set(table: Any, key: str, value: Any) -> None:
    """Set a key, keeping the comment that trails the old value."""
    import tomlkit
    import tomlkit.items

    new = _toml_value(value)
    if key in table:
        old = table.item(key) if hasattr(table, "item") else None
        if isinstance(old, tomlkit.items.Item) and old.trivia.comment:
            item = tomlkit.item(new)
            item.trivia.comment = old.trivia.comment
            item.trivia.comment_ws = old.trivia.comment_ws
            table[key] = item
            return
        if _same(table[key], value):
            return
    table[key] = new


def _same(old: Any, new: Any) -> bool:
    try:
        unwrapped = old.unwrap() if hasattr(old, "unwrap") else old
    except Exception:  # pragma: no cover - tomlkit internals
        return False
    return type(unwrapped) is type(new) and unwrapped == new


def update_profile_text(text: str, profile: Profile) -> str:
    """Write `profile` into the operator's TOML text: changed values in place (trailing comments kept),
    new keys appended, removed flags deleted, everything else untouched. An empty `text` gives a new file."""
    import tomlkit

    doc = _load_doc(text) if text.strip() else tomlkit.document()
    data = profile.model_dump(mode="python", exclude_none=True)
    for key in ("name", "target_context", "sglang_version", "notes", "command"):
        if key == "notes" and not data[key] and key not in doc:
            continue
        if key == "notes" and "\n" in data[key]:
            if key not in doc or doc[key] != data[key]:
                doc[key] = tomlkit.string(data[key], multiline=True)
            continue
        _set(doc, key, data[key])
    if "flags" not in doc:
        doc["flags"] = tomlkit.table()
    flags = doc["flags"]
    wanted = {k: v for k, v in profile.flags.items()}
    for key in list(flags.keys()):
        if key.removeprefix("--") not in wanted:
            del flags[key]
    existing = {k.removeprefix("--"): k for k in flags}
    for key, value in wanted.items():
        _set(flags, existing.get(key, key), value)
    if profile.verified is not None:
        text_now = tomlkit.dumps(doc)
        return record_verified(text_now, profile.verified)
    return tomlkit.dumps(doc)


def record_verified(text: str, verified: Verified) -> str:
    """Update the `[verified]` table of the operator's TOML text with what a verified restart measured;
    comments and order elsewhere (and inside the table) are kept."""
    import tomlkit

    doc = _load_doc(text)
    if "verified" not in doc:
        table = tomlkit.table()
        table.add(tomlkit.comment("Written by k26-console after a verified restart."))
        doc.add(tomlkit.nl())
        doc["verified"] = table
    table = doc["verified"]
    data = verified.model_dump(mode="python", exclude_none=True)
    depth = data.pop("tok_s_at_depth", {})
    for key, value in data.items():
        _set(table, key, value)
    if depth:
        existing = table.get("tok_s_at_depth")
        if existing is None:
            existing = tomlkit.inline_table()
            table["tok_s_at_depth"] = existing
            existing = table["tok_s_at_depth"]
        for d in sorted(depth):
            existing[str(d)] = depth[d]
    return tomlkit.dumps(doc)


__all__ = [
    "DEFAULT_COMMAND",
    "Change",
    "Issue",
    "Profile",
    "ProfileDiff",
    "ProfileError",
    "ProfileValidation",
    "Verified",
    "argv_lines",
    "canonical_flags",
    "diff_against_argv",
    "diff_profiles",
    "is_sglang_launcher",
    "parse_profile",
    "profile_argv",
    "profile_dropin",
    "record_verified",
    "update_profile_text",
    "validate_profile",
]
