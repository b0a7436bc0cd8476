"""SGLang's command-line flags: the shipped flag lists, argparse-exact resolution, value conversion and
rendering, and reading an argv back into flags. Validation of a profile is `console.core.flag_validation`.

The flag lists in `console/data/sglang-args/v<version>.json` are extracted from SGLang's own source by
`console/tools/extract_sglang_args.py` (one object per argparse action: `flag`, `aliases`, `negation`,
`nargs`, `type`, `choices`, `default`, `deprecated`, `help`, `src`).

SGLang builds a stock `argparse.ArgumentParser` (abbreviations allowed, `-h/--help` added), so an option
on the command line is resolved the way argparse does it (CPython 3.11 `_parse_optional`): an exact
option string wins; otherwise every option string that starts with what was typed is a candidate, and
more than one candidate is an error even when they are aliases of one flag. `--tp 8` therefore means
`--tp-size 8` where nothing else starts with `--tp`, and `--cuda-graph-max-bs` is an error on 0.5.23
(`--cuda-graph-max-bs-decode`, `--cuda-graph-max-bs-prefill`).
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

DEFAULT_SGLANG_VERSION = "v0.5.12.post1"
HELP_OPTIONS = ("-h", "--help")

FlagValue = bool | int | float | str | list[Any] | dict[str, Any]
Canonical = dict[str, tuple[str, ...] | bool]
"""Parsed flags keyed by primary option string: value words, True for a switch, False for `--no-x`."""

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class FlagSpec(BaseModel, defer_build=True):
    """One argparse action of SGLang's server parser."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    flag: str
    aliases: list[str] = Field(default_factory=list)
    negation: list[str] = Field(default_factory=list)
    dest: str | None = None
    nargs: int | str | None = None
    type: str = "str"
    type_src: str | None = None
    choices: list[Any] | None = None
    choices_expr: str | None = None
    default: Any = None
    default_expr: str | None = None
    required: bool = False
    deprecated: Literal["warn", "error"] | None = None
    help: str = ""
    src: str = ""

    @property
    def option_strings(self) -> list[str]:
        return [self.flag, *self.aliases, *self.negation]

    @property
    def switch(self) -> bool:
        """Takes no value (store_true and friends)."""
        return self.nargs == 0

    @property
    def target(self) -> str:
        return self.dest or self.flag.lstrip("-").replace("-", "_")


class FlagError(ValueError):
    """An option that argparse would reject: unknown, or an ambiguous abbreviation."""

    def __init__(self, option: str, kind: Literal["unknown", "ambiguous"], candidates: list[str]) -> None:
        self.option = option
        self.kind = kind
        self.candidates = candidates
        if kind == "ambiguous":
            shown = ", ".join(candidates[:6]) + (
                f" and {len(candidates) - 6} more" if len(candidates) > 6 else ""
            )
            msg = f"{option} is ambiguous: it could mean {shown}"
        elif candidates:
            msg = f"{option} is not an SGLang flag (did you mean {' or '.join(candidates)}?)"
        else:
            msg = f"{option} is not an SGLang flag"
        super().__init__(msg)


class Resolution(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True)

    spec: FlagSpec | None
    """None for argparse's own `-h/--help`."""
    option: str
    """The option string that matched (an alias or a `--no-` form when that is what matched)."""
    how: Literal["exact", "prefix"]
    negated: bool = False
    explicit: str | None = None
    """The value after `=` in `--flag=value`."""


class FlagList(BaseModel, defer_build=True):
    """The flags one SGLang version accepts."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    sglang_version: str
    layout: str = ""
    source: str = ""
    flags: list[FlagSpec]

    _options: dict[str, FlagSpec | None] = PrivateAttr(default_factory=dict)

    def model_post_init(self, __context: Any) -> None:
        options: dict[str, FlagSpec | None] = {}
        for spec in self.flags:
            for name in spec.option_strings:
                options[name] = spec
        for name in HELP_OPTIONS:
            options.setdefault(name, None)
        self._options = options

    @classmethod
    def from_json(cls, text: str | bytes) -> FlagList:
        return cls.model_validate_json(text)

    @property
    def option_strings(self) -> list[str]:
        """Every option string, in the parser's registration order (`-h/--help` first, as argparse)."""
        return [*HELP_OPTIONS, *[o for s in self.flags for o in s.option_strings]]

    def spec(self, flag: str) -> FlagSpec | None:
        return self._options.get(flag)

    def _prefix_candidates(self, word: str) -> list[str]:
        """argparse `_get_option_tuples` (allow_abbrev=True): the option strings `word` abbreviates."""
        if len(word) < 2:
            return []
        if word[1] == "-":
            prefix = word.split("=", 1)[0]
            return [o for o in self.option_strings if o.startswith(prefix)]
        short = word[:2]
        return [o for o in self.option_strings if o == short or o.startswith(word)]

    def resolve(self, word: str) -> Resolution:
        """Resolve an option word as argparse would; raise FlagError when argparse would refuse it."""
        if word in self._options:
            return self._resolution(word, "exact", None)
        explicit: str | None
        if "=" in word:
            name, explicit = word.split("=", 1)
            if name in self._options:
                return self._resolution(name, "exact", explicit)
        candidates = self._prefix_candidates(word)
        if len(candidates) > 1:
            raise FlagError(word.split("=", 1)[0], "ambiguous", candidates)
        if len(candidates) == 1:
            explicit = word.split("=", 1)[1] if "=" in word and word.startswith("--") else None
            if not word.startswith("--") and candidates[0] == word[:2] and len(word) > 2:
                explicit = word[2:]
            return self._resolution(candidates[0], "prefix", explicit)
        name = word.split("=", 1)[0]
        close = difflib.get_close_matches(name, [o for o in self.option_strings if o.startswith("--")], n=2)
        raise FlagError(name, "unknown", close)

    def _resolution(self, option: str, how: Literal["exact", "prefix"], explicit: str | None) -> Resolution:
        spec = self._options[option]
        negated = spec is not None and option in spec.negation
        return Resolution(spec=spec, option=option, how=how, negated=negated, explicit=explicit)

    def classify(self, word: str) -> Literal["option", "value", "end", "ambiguous"]:
        """How argparse reads one argv word (`_parse_optional`): an option, a value, or the `--` marker."""
        if word == "--":
            return "end"
        if not word or word[0] != "-":
            return "value"
        if word in self._options:
            return "option"
        if len(word) == 1:
            return "value"
        if "=" in word and word.split("=", 1)[0] in self._options:
            return "option"
        candidates = self._prefix_candidates(word)
        if len(candidates) > 1:
            return "ambiguous"
        if len(candidates) == 1:
            return "option"
        if _NEGATIVE_NUMBER.match(word):
            return "value"  # SGLang has no option that looks like a negative number
        if " " in word:
            return "value"
        return "option"


# --------------------------------------------------------------------------------------------------
# Shipped lists
# --------------------------------------------------------------------------------------------------


def canonical_version(version: str) -> str:
    v = version.strip()
    return v if v.startswith("v") else "v" + v


def _data_dir() -> Path:
    # Beside the package's modules, as every install puts it (as console/cli/shape.py reads its file):
    # importlib.resources cost every command that validates flags ~5 ms to import.
    return Path(__file__).resolve().parent.parent / "data" / "sglang-args"


def available_versions() -> list[str]:
    """The SGLang versions with a shipped flag list, oldest first."""
    names = [p.name[: -len(".json")] for p in _data_dir().iterdir() if p.name.endswith(".json")]
    return sorted(names, key=_version_key)


def _version_key(v: str) -> tuple[Any, ...]:
    parts = re.findall(r"\d+|[a-z]+", v.lstrip("v"))
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in parts)


class UnknownVersion(ValueError):
    def __init__(self, version: str) -> None:
        self.version = version
        super().__init__(
            f"there is no shipped flag list for SGLang {version} (known: {', '.join(available_versions())})"
        )


def load_flag_list(version: str = DEFAULT_SGLANG_VERSION) -> FlagList:
    """The shipped flag list of `version` ("v0.5.12.post1" or "0.5.12.post1"), read once."""
    return _load_flag_list(canonical_version(version))


@functools.cache
def _load_flag_list(name: str) -> FlagList:
    path = _data_dir() / f"{name}.json"
    if not path.is_file():
        raise UnknownVersion(name)
    return FlagList.from_json(path.read_bytes())


# --------------------------------------------------------------------------------------------------
# Value conversion, as SGLang's argparse `type=` callables do it
# --------------------------------------------------------------------------------------------------


def human_readable_int(value: str) -> int:
    """SGLang's `human_readable_int`: `200000`, `200k`, `25.6k`, `128Ki` (suffixes case-sensitive)."""
    text = value.strip()
    si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", text)
    if match:
        number, suffix = match.groups()
        if suffix in iec:
            if "." in number:
                raise ValueError(f"decimals are not allowed with the IEC suffix {suffix}")
            return int(number) * iec[suffix]
        try:
            return int(Decimal(number) * si[suffix])
        except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
            raise ValueError(str(exc)) from exc
    return int(text)


def convert(spec: FlagSpec, word: str) -> Any:
    """Convert one value word with the flag's argparse type; ValueError when argparse would refuse it."""
    t = spec.type
    if t == "int":
        return int(word)
    if t == "float":
        return float(word)
    if t == "human_int":
        return human_readable_int(word)
    if t == "json":
        try:
            return json.loads(word)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON ({exc.msg})") from exc
    if t == "nullable_str":
        return None if not word or word == "None" else word
    return word


TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "human_int": "an integer (200000, 200k or 128Ki)",
    "json": "JSON",
}


def value_words(value: FlagValue) -> list[str]:
    """The argv words of one non-boolean profile value (a list gives one word per element)."""
    if isinstance(value, list):
        return [_scalar_word(v) for v in value]
    return [_scalar_word(value)]


def _scalar_word(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


def render_flag(key: str, value: FlagValue, flag_list: FlagList | None = None) -> list[str]:
    """One profile entry as argv words: `true` → bare switch, `false` → nothing (or `--no-x` where the
    flag is a BooleanOptionalAction), lists → one word each. With a flag list the option is written with
    its full primary name; entries that do not resolve are written as given (validation reports them)."""
    option = "--" + key.lstrip("-")
    spec: FlagSpec | None = None
    negated = False
    if flag_list is not None:
        try:
            res = flag_list.resolve(option)
        except FlagError:
            res = None
        if res is not None and res.spec is not None and res.explicit is None:
            spec, negated = res.spec, res.negated
            option = res.option if not negated else spec.flag
    if isinstance(value, bool):
        if spec is not None and spec.negation:
            on = value != negated
            return [spec.flag] if on else [spec.negation[0]]
        if spec is not None and negated:
            return [spec.negation[0]] if value else []
        if spec is not None and spec.nargs == "?" and value:
            return [option]
        return [option] if value else []
    return [option, *value_words(value)]


def render_flags(flags: Mapping[str, FlagValue], flag_list: FlagList | None = None) -> list[str]:
    out: list[str] = []
    for key, value in flags.items():
        out.extend(render_flag(key, value, flag_list))
    return out


# --------------------------------------------------------------------------------------------------
# Parsing an argv (e.g. the running ExecStart) into canonical flags
# --------------------------------------------------------------------------------------------------


class ParsedArgv(BaseModel, defer_build=True):
    values: dict[str, tuple[str, ...] | bool] = Field(default_factory=dict)
    """Primary option string → value words; True for a switch; False for a `--no-x`."""
    problems: list[str] = Field(default_factory=list)
    """One sentence per word argparse would refuse (unknown, ambiguous, missing value, stray word)."""


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split an ExecStart argv into (command, flags): the flags start at the first word beginning with `-`
    after the program (`python3 -m sglang.launch_server --model-path …`)."""
    words = list(argv)
    i = 1
    while i < len(words):
        if words[i].startswith("--"):
            break
        if words[i] == "-m" and i + 1 < len(words):
            i += 2
            continue
        if words[i].startswith("-"):
            i += 1
            continue
        i += 1
    return words[:i], words[i:]


def parse_argv(words: Sequence[str], flag_list: FlagList) -> ParsedArgv:
    """Read flag words the way SGLang's parser would; later repeats win, as in argparse."""
    out = ParsedArgv()
    i = 0
    n = len(words)
    while i < n:
        word = words[i]
        kind = flag_list.classify(word)
        if kind == "end":
            out.problems.append("a bare -- ends the options; SGLang takes no positional arguments.")
            break
        if kind == "value":
            out.problems.append(f"{word!r} is not an option and belongs to none.")
            i += 1
            continue
        try:
            res = flag_list.resolve(word)
        except FlagError as exc:
            out.problems.append(f"{exc}.")
            i += 1
            continue
        i += 1
        spec = res.spec
        if spec is None:
            out.problems.append(f"{word} asks for help; the server would print it and exit.")
            continue
        if spec.switch:
            if res.explicit is not None:
                out.problems.append(f"{word} is an on/off flag and takes no value.")
            out.values[spec.flag] = not res.negated
            continue
        taken: list[str] = []
        if res.explicit is not None:
            taken = [res.explicit]
        else:
            want = spec.nargs
            while i < n and flag_list.classify(words[i]) == "value":
                if want in (None, "?") and taken:
                    break
                if isinstance(want, int) and len(taken) >= want:
                    break
                taken.append(words[i])
                i += 1
            if (want in (None, "+") and not taken) or (isinstance(want, int) and len(taken) != want):
                out.problems.append(f"{word} expects a value and none follows.")
                continue
        out.values[spec.flag] = tuple(taken)
    return out


def same_value(spec: FlagSpec | None, a: tuple[str, ...] | bool, b: tuple[str, ...] | bool) -> bool:
    """Equal as the server would see them (`0.940` == `0.94`, `200k` == `200000`)."""
    if a == b:
        return True
    if isinstance(a, bool) or isinstance(b, bool) or spec is None or len(a) != len(b):
        return False
    try:
        return all(convert(spec, x) == convert(spec, y) for x, y in zip(a, b, strict=True))
    except (ValueError, OverflowError):
        return False


__all__ = [
    "DEFAULT_SGLANG_VERSION",
    "Canonical",
    "FlagError",
    "FlagList",
    "FlagSpec",
    "FlagValue",
    "ParsedArgv",
    "Resolution",
    "UnknownVersion",
    "available_versions",
    "canonical_version",
    "convert",
    "human_readable_int",
    "load_flag_list",
    "parse_argv",
    "render_flag",
    "render_flags",
    "same_value",
    "split_command",
    "value_words",
]
