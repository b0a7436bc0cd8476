"""Validation of a profile's flags against one SGLang version's flag list, as the server would check its argv
when it parses it: unknown and ambiguous options, values that do not convert, values outside `choices`,
switches given a value, the wrong number of values, retired flags, missing required flags, and two profile
keys that set the same flag. The flag lists and argparse-exact resolution are `console.core.flags`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from console.core.flags import KEY, TYPE_WORDS, FlagError, FlagList, FlagSpec, convert, value_words
from console.core.issues import Findings, Issue


class ValidationReport(Findings, defer_build=True):
    """The flags against one SGLang version's parser: an issue's `where` is the key as the profile writes
    it (`tp`, `mem-fraction-static`), or the argv word."""

    sglang_version: str
    resolved: dict[str, str] = Field(default_factory=dict)
    """Profile key → the primary option string it means on this version."""


def _is_scalar(v: Any) -> bool:
    return isinstance(v, int | float | str) and not isinstance(v, bool)


def validate_flags(flags: Mapping[str, Any], flag_list: FlagList) -> ValidationReport:
    """Check a profile's `[flags]` table against one SGLang version's parser."""
    report = ValidationReport(sglang_version=flag_list.sglang_version)
    issues = report.issues
    seen: dict[str, str] = {}

    def err(key: str, code: str, msg: str) -> None:
        issues.append(Issue(where=key, level="error", code=code, message=msg))

    def warn(key: str, code: str, msg: str) -> None:
        issues.append(Issue(where=key, level="warning", code=code, message=msg))

    for key, value in flags.items():
        shown = "--" + key.lstrip("-")
        if not KEY.match(key.lstrip("-")):
            err(
                key,
                "bad_name",
                f"{key!r} is not a flag name (write it as on the command line, without a value).",
            )
            continue
        try:
            res = flag_list.resolve(shown)
        except FlagError as exc:
            err(key, exc.kind, f"{exc} on SGLang {flag_list.sglang_version}.")
            continue
        spec = res.spec
        if spec is None:
            err(key, "help", f"{shown} is argparse's help option, not a server setting.")
            continue
        report.resolved[key] = spec.flag
        if res.how == "prefix":
            warn(key, "abbreviation", f"{shown} is an abbreviation of {res.option}; write the full name.")
        if spec.target in seen:
            err(
                key,
                "duplicate",
                f"{shown} sets the same flag as {'--' + seen[spec.target].lstrip('-')} ({spec.flag}).",
            )
            continue
        seen[spec.target] = key
        if spec.deprecated == "error":
            err(
                key,
                "retired",
                f"{shown} was retired in SGLang {flag_list.sglang_version}: {spec.help or 'the server refuses it.'}",
            )
            continue
        if spec.deprecated == "warn":
            warn(
                key,
                "deprecated",
                f"{shown} is deprecated in SGLang {flag_list.sglang_version}: {spec.help or 'it may go away.'}",
            )
        _check_value(key, shown, value, spec, res.negated, flag_list, err)

    present = {flag_list.spec(flag).target for flag in report.resolved.values() if flag_list.spec(flag)}  # type: ignore[union-attr]
    for spec in flag_list.flags:
        if spec.required and spec.target not in present:
            err(
                spec.flag.lstrip("-"),
                "required",
                f"{spec.flag} is required by SGLang and the profile does not set it.",
            )
    return report


def _check_value(
    key: str, shown: str, value: Any, spec: FlagSpec, negated: bool, fl: FlagList, err: Any
) -> None:
    if spec.switch:
        if not isinstance(value, bool):
            err(
                key,
                "switch_value",
                f"{shown} is an on/off flag and takes no value; write true or false, not {value!r}.",
            )
        return
    if isinstance(value, bool):
        if spec.nargs == "?" and value:
            return
        what = TYPE_WORDS.get(spec.type, "a value")
        err(key, "needs_value", f"{shown} takes {what}, not {'true' if value else 'false'}.")
        return
    if isinstance(value, dict) and spec.type not in ("json", "str", "nullable_str"):
        err(key, "bad_type", f"{shown} takes {TYPE_WORDS.get(spec.type, 'a value')}, not a table.")
        return
    nargs = spec.nargs
    if isinstance(value, list):
        if nargs in (None, "?"):
            err(key, "one_value", f"{shown} takes one value, not a list.")
            return
        if any(not _is_scalar(v) for v in value):
            err(key, "bad_type", f"{shown} takes a list of strings or numbers.")
            return
        if nargs == "+" and not value:
            err(key, "nargs", f"{shown} needs at least one value.")
            return
        if isinstance(nargs, int) and len(value) != nargs:
            err(key, "nargs", f"{shown} takes exactly {nargs} values, not {len(value)}.")
            return
    elif isinstance(nargs, int) and nargs != 1:
        err(key, "nargs", f"{shown} takes exactly {nargs} values.")
        return
    if isinstance(value, float) and not math.isfinite(value):
        err(key, "bad_value", f"{shown} = {value!r} is not a usable number.")
        return
    for word in value_words(value):
        kind = fl.classify(word)
        if kind != "value":
            err(
                key,
                "looks_like_option",
                f"{shown} value {word!r} would be read by argparse as an option, not a value.",
            )
            return
        try:
            converted = convert(spec, word)
        except (ValueError, OverflowError) as exc:
            err(
                key,
                "bad_type",
                f"{shown} takes {TYPE_WORDS.get(spec.type, 'a value')}, not {word!r} ({exc}).",
            )
            return
        if spec.choices is not None and spec.type != "json" and converted not in spec.choices:
            shown_choices = ", ".join(str(c) for c in spec.choices)
            err(key, "choice", f"{shown} = {word!r} is not one of: {shown_choices}.")
            return
