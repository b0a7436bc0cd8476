"""SGLang's own message templates, read from its wheel's source: every f-string (and plain string) in
`sglang/`, as a regex whose placeholders match what their format spec can print. The twin's log lines are
checked against these, so the twin's formats are SGLang's, not the console parser's (which would agree with
the twin by construction)."""

from __future__ import annotations

import ast
import re
import string
from dataclasses import dataclass
from functools import cache
from pathlib import Path

_FIXED = re.compile(r"^[<>^=]?[+\- ]?\d*,?\.(\d+)f$")
_INT = re.compile(r"^[<>^=]?[+\- ]?\d*,?d$")


def _spec_pattern(spec: str) -> str:
    """What a format spec can print: a fixed-point number with its decimals, an integer, else anything."""
    if m := _FIXED.match(spec):
        decimals = int(m.group(1))
        return r"\s*-?[\d,]+" + (rf"\.\d{{{decimals}}}" if decimals else "")
    if _INT.match(spec):
        return r"\s*-?[\d,]+"
    return r".*?"


def _placeholder(value: ast.FormattedValue) -> str:
    spec = value.format_spec
    if spec is None:
        return r".*?"
    if isinstance(spec, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in spec.values):
        return _spec_pattern("".join(str(v.value) for v in spec.values if isinstance(v, ast.Constant)))
    return r".*?"


def _format_pieces(text: str) -> list[Piece] | None:
    """A plain string that is a `str.format` template (a tqdm `bar_format`, a `.format()` call's text): its
    fields as placeholders. None when it has no fields or is not a valid template."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError:
        return None
    if not any(field is not None for _, field, _, _ in parsed):
        return None
    out: list[Piece] = []
    for literal, field, spec, _ in parsed:
        if literal:
            out.append((True, literal))
        if field is not None:
            out.append((False, _spec_pattern(spec or "") if spec else r".*?"))
    return out


Piece = tuple[bool, str]
"""(True, literal text) or (False, the placeholder's regex)."""


def _pieces(node: ast.expr) -> list[Piece] | None:
    """The node as literal text and placeholders, or None if it is not a string expression."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [(True, node.value)]
    if isinstance(node, ast.JoinedStr):
        out: list[Piece] = []
        for v in node.values:
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                out.append((True, v.value))
            elif isinstance(v, ast.FormattedValue):
                out.append((False, _placeholder(v)))
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _pieces(node.left), _pieces(node.right)
        if left is not None and right is not None:
            return left + right
    return None


@dataclass(frozen=True)
class Template:
    path: str
    line: int
    regex: re.Pattern[str]
    literal: str
    """The template's literal text with its placeholders as `{}`: what a report shows."""


def _template(pieces: list[Piece], path: str, line: int) -> Template:
    rx = [re.escape(text) if literal else text for literal, text in pieces]
    lit = [text if literal else "{}" for literal, text in pieces]
    return Template(path, line, re.compile("".join(rx), re.S), "".join(lit))


@cache
def _file_templates(path: Path, root: Path) -> tuple[Template, ...]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except SyntaxError:
        return ()
    found: list[Template] = []
    seen: set[int] = set()
    for node in ast.walk(tree):
        # The outermost string expression only: its parts are walked too and would be templates of their own.
        if id(node) in seen or not isinstance(node, (ast.JoinedStr, ast.BinOp, ast.Constant)):
            continue
        pieces = _pieces(node)  # type: ignore[arg-type]
        if pieces is None:
            continue
        for sub in ast.walk(node):
            seen.add(id(sub))
        where = (str(path.relative_to(root)), getattr(node, "lineno", 0))
        variants = [pieces]
        if isinstance(node, ast.Constant) and (formatted := _format_pieces(pieces[0][1])):
            variants.append(formatted)
        for variant in variants:
            if len("".join(text for literal, text in variant if literal).strip()) >= 3:
                found.append(_template(variant, *where))
    return tuple(found)


@cache
def _sources(site: Path) -> tuple[tuple[Path, str], ...]:
    return tuple(
        (p, p.read_text(encoding="utf-8", errors="replace")) for p in sorted((site / "sglang").rglob("*.py"))
    )


def templates_with(site: Path, needle: str, *more: str, at_start: bool = False) -> list[Template]:
    """Every template of the files whose source contains `needle` (`at_start`: as the head of a string) and
    each of `more`."""
    rx = re.compile(r"[\"']" + re.escape(needle))
    files = [
        path
        for path, text in _sources(site)
        if needle in text and all(m in text for m in more) and (not at_start or rx.search(text))
    ]
    return [t for path in files for t in _file_templates(path, site)]


def matching_template(site: Path, message: str) -> Template | None:
    """A template of SGLang's that prints exactly `message`, or a run of one file's templates that does
    (SGLang builds some lines piece by piece: `msg += f"..."`). None when there is none.

    Where to look, most specific first: the files with the message's literal head (up to the first number
    or `=`) as the head of a string, then with its first two words so, then with all the head's words of five
    letters or more anywhere (SGLang splits a message over several f-strings, and a placeholder may sit in
    its head: `Capture {graph_backend} begin`)."""
    head = re.match(r"\[?[^\d=({\[]*", message)  # a leading "[" is a tag: `[http_server] Error: {e}`
    text = head.group(0).rstrip() if head else ""
    words = [w for w in re.findall(r"[A-Za-z][\w-]*", text) if len(w) >= 5]
    searches = [[text], [" ".join(text.split()[:2])], words]
    tried: set[tuple[str, ...]] = set()
    for i, search in enumerate(searches):
        if not search or len(search[0]) < 4 or tuple(search) in tried:
            continue
        tried.add(tuple(search))
        found = _matching(templates_with(site, *search, at_start=i < 2), message)
        if found is not None:
            return found
    return None


def _matching(candidates: list[Template], message: str) -> Template | None:
    for t in candidates:
        if t.regex.fullmatch(message):
            return t
    by_file: dict[str, list[Template]] = {}
    for t in candidates:
        chunks = [c for c in t.literal.split("{}") if c.strip()]
        if chunks and all(c in message for c in chunks):
            by_file.setdefault(t.path, []).append(t)
    for path, ts in by_file.items():
        run = re.compile("(?:" + "|".join(t.regex.pattern for t in ts) + ")+", re.S)
        if run.fullmatch(message):
            return Template(path, 0, run, " + ".join(t.literal for t in ts))
    return None
