"""Extract SGLang's server flags from its source with `ast`, never importing sglang.

`import sglang.srt.server_args` needs torch in every version, so this reads the files instead:

- monolithic layout (≤ v0.5.14): every `parser.add_argument(...)` call in `ServerArgs.add_cli_args`
  of `srt/server_args.py`; `default=ServerArgs.x` is resolved from the dataclass field.
- fields layout (0.5.2x): every `name: A[Type, "help" | Arg(...)] = default` field of the namespace
  classes (those with `_NS_PATH`) in `srt/arg_groups/fields/*.py`, mapped to argparse the way
  `arg_utils.add_cli_args_from_dataclass` does, plus the few flags `add_cli_args` registers by hand.

Names used for `choices`, defaults and help (module constants, class attributes, small helper functions,
`list(DICT.keys())`, `A + B`, enum members) are looked up across the source tree; what cannot be resolved
statically is kept as its expression (`choices_expr`, `default_expr`) and the validator accepts any value.

The module is one stdlib-only file, so it also runs where nothing of the console is installed: the
console sends it over SSH to the Python that runs a host's SGLang (`python3 - SITE_PACKAGES` with this
file on stdin) and reads the flag list from stdout (`console.sources.hostinfo`).

Usage::

    pip download --no-deps sglang==0.5.23 -d /tmp/w
    python -m console.tools.extract_sglang_args /tmp/w/sglang-0.5.23-*.whl -o console/data/sglang-args/
    python -m console.tools.extract_sglang_args path/to/sglang/checkout --version v0.5.12.post1 -o out.json

SOURCE may be a wheel, an sdist (`.tar.gz`), or a directory holding `sglang/srt/server_args.py`
(directly, or under `python/` as in the git repository).
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import os
import sys
import tarfile
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
HELP_MAX = 240


class ExtractError(Exception):
    """The source tree does not look like SGLang, or a file in it does not parse."""


class Unresolved(Exception):
    """An expression that cannot be evaluated statically."""


# --------------------------------------------------------------------------------------------------
# Source tree: module name -> source text, from a directory, a wheel or an sdist
# --------------------------------------------------------------------------------------------------


def _wanted(name: str) -> bool:
    """Archive members worth reading: SGLang's Python sources (choices may live outside srt/)."""
    return name.endswith(".py") and "sglang/" in name and "/test/" not in name


def _python_files(root: Path) -> dict[str, Path]:
    """The `.py` files under a directory, by relative path. A directory that holds the `sglang` package
    itself (a site-packages, as on a host) is read only under `sglang/`; links are followed (a venv or a
    conda env may link its packages in) but each real directory is entered once."""
    top = root / "sglang" if (root / "sglang" / "srt").is_dir() else root
    files: dict[str, Path] = {}
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(top, followlinks=True):
        st = os.stat(dirpath)
        if (st.st_dev, st.st_ino) in seen:
            dirnames[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirnames[:] = [d for d in dirnames if d not in ("__pycache__", "test")]
        for name in filenames:
            if name.endswith(".py"):
                full = Path(dirpath) / name
                files[full.relative_to(root).as_posix()] = full
    return files


class SourceTree:
    def __init__(self, files: dict[str, Callable[[], str]], origin: str) -> None:
        self._files = files  # "sglang/srt/server_args.py" -> reader
        self._parsed: dict[str, ast.Module | None] = {}
        self.origin = origin

    @classmethod
    def from_path(cls, path: Path) -> SourceTree:
        if path.is_dir():
            return cls._from_names(
                _python_files(path),
                lambda p: p.read_text(encoding="utf-8", errors="replace"),
                path.name,
            )
        if not path.is_file():
            raise ExtractError(f"{path} does not exist")
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                texts = {n: zf.read(n).decode("utf-8", "replace") for n in zf.namelist() if _wanted(n)}
            return cls._from_names(texts, lambda t: t, path.name)
        if tarfile.is_tarfile(path):
            texts = {}
            with tarfile.open(path) as tf:
                for m in tf.getmembers():
                    fh = tf.extractfile(m) if m.isfile() and _wanted(m.name) else None
                    if fh is not None:
                        texts[m.name] = fh.read().decode("utf-8", "replace")
            return cls._from_names(texts, lambda t: t, path.name)
        raise ExtractError(f"{path} is neither a directory, a wheel nor a tar archive")

    @classmethod
    def _from_names(cls, names: dict[str, Any], read: Callable[[Any], str], origin: str) -> SourceTree:
        roots = sorted(
            (
                n[: -len("sglang/srt/server_args.py")]
                for n in names
                if n.endswith("sglang/srt/server_args.py")
            ),
            key=len,
        )
        roots = [r for r in roots if r == "" or r.endswith("/")]
        if not roots:
            raise ExtractError(f"no sglang/srt/server_args.py in {origin}")
        root = roots[0]
        files: dict[str, Callable[[], str]] = {}
        for name, handle in names.items():
            if name.startswith(root + "sglang/"):
                files[name[len(root) :]] = functools.partial(read, handle)
        return cls(files, origin)

    def module_file(self, module: str) -> str | None:
        base = module.replace(".", "/")
        for cand in (base + ".py", base + "/__init__.py"):
            if cand in self._files:
                return cand
        return None

    def parse(self, module: str) -> ast.Module | None:
        if module not in self._parsed:
            path = self.module_file(module)
            tree = None
            if path is not None:
                try:
                    tree = ast.parse(self._files[path](), filename=path)
                except SyntaxError as exc:
                    raise ExtractError(f"{path} does not parse: {exc.msg} (line {exc.lineno})") from exc
            self._parsed[module] = tree
        return self._parsed[module]

    def modules_under(self, package: str) -> list[str]:
        prefix = package.replace(".", "/") + "/"
        out = []
        for path in self._files:
            if path.startswith(prefix) and "/" not in path[len(prefix) :]:
                stem = path[len(prefix) : -3]
                if stem != "__init__":
                    out.append(package + "." + stem)
        return sorted(out)

    def version(self) -> str | None:
        for module in ("sglang.version", "sglang._version"):
            tree = self.parse(module)
            if tree is None:
                continue
            for node in tree.body:
                if isinstance(node, ast.Assign | ast.AnnAssign):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for t in targets:
                        if (
                            isinstance(t, ast.Name)
                            and t.id in ("__version__", "version")
                            and isinstance(node.value, ast.Constant)
                            and isinstance(node.value.value, str)
                        ):
                            return node.value.value
        return None


# --------------------------------------------------------------------------------------------------
# A small static evaluator
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnumMember:
    name: str
    value: Any


@dataclass
class ClassRef:
    module: str
    node: ast.ClassDef


@dataclass
class FuncRef:
    module: str
    node: ast.FunctionDef


@dataclass
class ModuleRef:
    module: str


@dataclass
class Scope:
    module: str
    local: dict[str, Any] = field(default_factory=dict)  # name -> ast node or ("value", v)


def _resolve_relative(module: str, level: int, target: str | None, is_package: bool) -> str:
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


class Evaluator:
    def __init__(self, tree: SourceTree) -> None:
        self.tree = tree
        self._bindings: dict[str, dict[str, list[ast.AST]]] = {}
        self._busy: set[tuple[str, str]] = set()

    # module-level bindings: name -> list of statements that bind/extend it, in order
    def bindings(self, module: str) -> dict[str, list[ast.AST]]:
        if module in self._bindings:
            return self._bindings[module]
        out: dict[str, list[ast.AST]] = {}
        tree = self.tree.parse(module)
        if tree is not None:
            _collect_bindings(tree.body, out)
        self._bindings[module] = out
        return out

    def is_package(self, module: str) -> bool:
        path = self.tree.module_file(module)
        return bool(path and path.endswith("__init__.py"))

    def lookup(self, name: str, scope: Scope) -> Any:
        if name in scope.local:
            entry = scope.local[name]
            if isinstance(entry, tuple) and entry and entry[0] == "value":
                return entry[1]
            return self._eval_binding([entry], name, Scope(scope.module, dict(scope.local)), local=True)
        return self.lookup_global(name, scope.module)

    def lookup_global(self, name: str, module: str) -> Any:
        stmts = self.bindings(module).get(name)
        if not stmts:
            builtins = {"None": None, "True": True, "False": False}
            if name in builtins:
                return builtins[name]
            raise Unresolved(name)
        key = (module, name)
        if key in self._busy:
            raise Unresolved(f"recursive {name}")
        self._busy.add(key)
        try:
            return self._eval_binding(stmts, name, Scope(module))
        finally:
            self._busy.discard(key)

    def _eval_binding(self, stmts: list[ast.AST], name: str, scope: Scope, local: bool = False) -> Any:
        value: Any = None
        have = False
        for stmt in stmts:
            if isinstance(stmt, ast.Assign | ast.AnnAssign):
                if stmt.value is None:
                    continue
                if local:
                    scope.local.pop(name, None)
                value, have = self.eval(stmt.value, scope), True
            elif isinstance(stmt, ast.AugAssign) and have:
                value = _binop(stmt.op, value, self.eval(stmt.value, scope))
            elif isinstance(stmt, ast.Expr) and have and isinstance(stmt.value, ast.Call):
                method = stmt.value.func.attr  # type: ignore[attr-defined]
                args = [self.eval(a, scope) for a in stmt.value.args]
                if method == "append" and isinstance(value, list):
                    value = [*value, *args]
                elif method == "extend" and isinstance(value, list):
                    value = [*value, *args[0]]
                elif method in ("add", "update") and isinstance(value, set | frozenset):
                    value = set(value) | ({args[0]} if method == "add" else set(args[0]))
                elif method == "update" and isinstance(value, dict):
                    value = {**value, **args[0]}
                else:
                    raise Unresolved(f"{name}.{method}()")
            elif isinstance(stmt, ast.ImportFrom):
                for alias in stmt.names:
                    if (alias.asname or alias.name) != name:
                        continue
                    target = stmt.module or ""
                    if stmt.level:
                        target = _resolve_relative(
                            scope.module, stmt.level, stmt.module, self.is_package(scope.module)
                        )
                    sub = f"{target}.{alias.name}"
                    if self.tree.module_file(sub) is not None:
                        value, have = ModuleRef(sub), True
                    else:
                        value, have = self.lookup_global(alias.name, target), True
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname == name:
                        value, have = ModuleRef(alias.name), True
                    elif alias.asname is None and alias.name.split(".")[0] == name:
                        value, have = ModuleRef(name), True
            elif isinstance(stmt, ast.ClassDef):
                value, have = ClassRef(scope.module, stmt), True
            elif isinstance(stmt, ast.FunctionDef):
                value, have = FuncRef(scope.module, stmt), True
        if not have:
            raise Unresolved(name)
        return value

    def class_attr(self, cls: ClassRef, attr: str) -> Any:
        body: dict[str, list[ast.AST]] = {}
        _collect_bindings(cls.node.body, body)
        if attr not in body:
            raise Unresolved(f"{cls.node.name}.{attr}")
        local = {k: v[-1] for k, v in body.items() if isinstance(v[-1], ast.Assign | ast.AnnAssign)}
        value = self._eval_binding(body[attr], attr, Scope(cls.module, local), local=True)
        if self._is_enum(cls) and not isinstance(value, EnumMember):
            return EnumMember(attr, value)
        return value

    def _is_enum(self, cls: ClassRef) -> bool:
        return any(
            (isinstance(b, ast.Name) and "Enum" in b.id)
            or (isinstance(b, ast.Attribute) and "Enum" in b.attr)
            for b in cls.node.bases
        )

    def enum_members(self, cls: ClassRef) -> list[EnumMember]:
        if not self._is_enum(cls):
            raise Unresolved(f"iterate {cls.node.name}")
        out = []
        for stmt in cls.node.body:
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
            ):
                name = stmt.targets[0].id
                if not name.startswith("_"):
                    out.append(EnumMember(name, self.eval(stmt.value, Scope(cls.module))))
        return out

    def call_function(self, fn: FuncRef) -> Any:
        if fn.node.args.args or fn.node.args.posonlyargs:
            raise Unresolved(f"{fn.node.name}() takes arguments")
        local: dict[str, Any] = {}
        result: ast.expr | None = None
        for stmt in fn.node.body:
            if isinstance(stmt, ast.Assign | ast.ImportFrom | ast.Import | ast.AnnAssign):
                _collect_local(stmt, local, fn.module, self)
            elif isinstance(stmt, ast.Return) and stmt.value is not None:
                result = stmt.value
        if result is None:
            raise Unresolved(f"{fn.node.name}() has no return")
        return self.eval(result, Scope(fn.module, local))

    def eval(self, node: ast.AST, scope: Scope) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.List | ast.Tuple):
            out = []
            for elt in node.elts:
                if isinstance(elt, ast.Starred):
                    out.extend(self.iterate(self.eval(elt.value, scope)))
                else:
                    out.append(self.eval(elt, scope))
            return out
        if isinstance(node, ast.Set):
            return {_hashable(self.eval(e, scope)) for e in node.elts}
        if isinstance(node, ast.Dict):
            out_d: dict[Any, Any] = {}
            for k, v in zip(node.keys, node.values, strict=True):
                if k is None:
                    out_d.update(self.eval(v, scope))
                else:
                    out_d[_hashable(self.eval(k, scope))] = self.eval(v, scope)
            return out_d
        if isinstance(node, ast.Name):
            return self.lookup(node.id, scope)
        if isinstance(node, ast.Attribute):
            base = self.eval(node.value, scope)
            if isinstance(base, ClassRef):
                return self.class_attr(base, node.attr)
            if isinstance(base, ModuleRef):
                return self.lookup_global(node.attr, base.module)
            if isinstance(base, EnumMember) and node.attr in ("name", "value"):
                return getattr(base, node.attr)
            raise Unresolved(ast.unparse(node))
        if isinstance(node, ast.BinOp):
            return _binop(node.op, self.eval(node.left, scope), self.eval(node.right, scope))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self.eval(node.operand, scope)
        if isinstance(node, ast.Subscript):
            base = self.eval(node.value, scope)
            index = self.eval(node.slice, scope)
            try:
                return base[index]
            except (TypeError, KeyError, IndexError) as exc:
                raise Unresolved(ast.unparse(node)) from exc
        if isinstance(node, ast.JoinedStr):
            parts = []
            for v in node.values:
                if isinstance(v, ast.Constant):
                    parts.append(str(v.value))
                elif isinstance(v, ast.FormattedValue):
                    parts.append(str(self.eval(v.value, scope)))
            return "".join(parts)
        if isinstance(node, ast.ListComp | ast.SetComp) and len(node.generators) == 1:
            gen = node.generators[0]
            if not isinstance(gen.target, ast.Name) or gen.ifs:
                raise Unresolved(ast.unparse(node))
            items = []
            for item in self.iterate(self.eval(gen.iter, scope)):
                inner = Scope(scope.module, {**scope.local, gen.target.id: ("value", item)})
                items.append(self.eval(node.elt, inner))
            return items if isinstance(node, ast.ListComp) else set(items)
        if isinstance(node, ast.Call):
            return self._eval_call(node, scope)
        raise Unresolved(ast.unparse(node))

    def iterate(self, value: Any) -> list[Any]:
        if isinstance(value, ClassRef):
            return list(self.enum_members(value))
        if isinstance(value, dict):
            return list(value)
        if isinstance(value, set | frozenset):
            return sorted(value, key=str)
        if isinstance(value, list | tuple | str):
            return list(value)
        raise Unresolved(f"iterate {type(value).__name__}")

    def _eval_call(self, node: ast.Call, scope: Scope) -> Any:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("list", "tuple", "sorted", "set", "frozenset"):
            if not node.args:
                return set() if func.id in ("set", "frozenset") else []
            items = self.iterate(self.eval(node.args[0], scope))
            if func.id == "sorted":
                return sorted(items, key=str)
            if func.id in ("set", "frozenset"):
                return {_hashable(i) for i in items}
            return items
        if isinstance(func, ast.Name) and func.id == "dict" and not node.args:
            return {kw.arg: self.eval(kw.value, scope) for kw in node.keywords if kw.arg}
        if isinstance(func, ast.Attribute):
            if func.attr in ("keys", "values", "items", "copy", "lower", "upper", "strip") and not node.args:
                base = self.eval(func.value, scope)
                if func.attr == "keys" and isinstance(base, dict):
                    return list(base)
                if func.attr == "values" and isinstance(base, dict):
                    return list(base.values())
                if func.attr == "items" and isinstance(base, dict):
                    return [list(kv) for kv in base.items()]
                if func.attr == "copy" and isinstance(base, list | dict | set):
                    return base.copy()
                if func.attr in ("lower", "upper", "strip") and isinstance(base, str):
                    return getattr(base, func.attr)()
            if func.attr == "join" and len(node.args) == 1:
                sep = self.eval(func.value, scope)
                return str(sep).join(str(x) for x in self.iterate(self.eval(node.args[0], scope)))
            if func.attr == "field" or (
                isinstance(func.value, ast.Name) and func.value.id in ("msgspec", "dataclasses")
            ):
                return self._field_default(node, scope)
        if isinstance(func, ast.Name) and func.id == "field":
            return self._field_default(node, scope)
        target = self.eval(func, scope) if isinstance(func, ast.Name | ast.Attribute) else None
        if isinstance(target, FuncRef) and not node.args and not node.keywords:
            return self.call_function(target)
        raise Unresolved(ast.unparse(node))

    def _field_default(self, node: ast.Call, scope: Scope) -> Any:
        for kw in node.keywords:
            if kw.arg == "default":
                return self.eval(kw.value, scope)
            if kw.arg == "default_factory":
                if isinstance(kw.value, ast.Name) and kw.value.id in ("list", "dict", "set"):
                    return {"list": [], "dict": {}, "set": set()}[kw.value.id]
                if isinstance(kw.value, ast.Lambda):
                    return self.eval(kw.value.body, scope)
        raise Unresolved(ast.unparse(node))


def _collect_bindings(body: list[ast.stmt], out: dict[str, list[ast.AST]]) -> None:
    for stmt in body:
        if isinstance(stmt, ast.Assign):
            for t in stmt.targets:
                if isinstance(t, ast.Name):
                    out.setdefault(t.id, []).append(stmt)
        elif isinstance(stmt, ast.AnnAssign | ast.AugAssign) and isinstance(stmt.target, ast.Name):
            out.setdefault(stmt.target.id, []).append(stmt)
        elif isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                out.setdefault(alias.asname or alias.name, []).append(stmt)
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                out.setdefault(alias.asname or alias.name.split(".")[0], []).append(stmt)
        elif isinstance(stmt, ast.ClassDef | ast.FunctionDef):
            out.setdefault(stmt.name, []).append(stmt)
        elif (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Attribute)
            and isinstance(stmt.value.func.value, ast.Name)
            and stmt.value.func.attr in ("append", "extend", "add", "update")
        ):
            out.setdefault(stmt.value.func.value.id, []).append(stmt)
        elif isinstance(stmt, ast.If | ast.Try):
            # Module-level `try: import x / except ImportError:` and feature gates: take the first branch.
            _collect_bindings(stmt.body, out)


def _collect_local(stmt: ast.stmt, local: dict[str, Any], module: str, ev: Evaluator) -> None:
    if isinstance(stmt, ast.Assign):
        for t in stmt.targets:
            if isinstance(t, ast.Name):
                local[t.id] = stmt
    elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
        local[stmt.target.id] = stmt
    elif isinstance(stmt, ast.ImportFrom):
        for alias in stmt.names:
            target = stmt.module or ""
            if stmt.level:
                target = _resolve_relative(module, stmt.level, stmt.module, ev.is_package(module))
            try:
                local[alias.asname or alias.name] = ("value", ev.lookup_global(alias.name, target))
            except Unresolved:
                local[alias.asname or alias.name] = ("value", ModuleRef(f"{target}.{alias.name}"))


def _binop(op: ast.operator, a: Any, b: Any) -> Any:
    try:
        if isinstance(op, ast.Add):
            if isinstance(a, list | tuple) and isinstance(b, list | tuple):
                return [*a, *b]
            return a + b
        if isinstance(op, ast.Mult):
            return a * b
        if isinstance(op, ast.Sub):
            return a - b
        if isinstance(op, ast.BitOr) and isinstance(a, set | frozenset | dict):
            return a | b
        if isinstance(op, ast.Pow):
            return a**b
        if isinstance(op, ast.FloorDiv):
            return a // b
        if isinstance(op, ast.Div):
            return a / b
    except TypeError as exc:
        raise Unresolved("operator") from exc
    raise Unresolved(type(op).__name__)


def _hashable(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def _jsonable(v: Any) -> Any:
    if isinstance(v, EnumMember):
        return _jsonable(v.value)
    if isinstance(v, set | frozenset):
        return sorted((_jsonable(x) for x in v), key=lambda x: (str(type(x)), str(x)))
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if v is None or isinstance(v, bool | int | float | str):
        if isinstance(v, float) and v != v:  # NaN
            raise Unresolved("nan")
        return v
    raise Unresolved(type(v).__name__)


# --------------------------------------------------------------------------------------------------
# Flag records
# --------------------------------------------------------------------------------------------------

_TYPE_NAMES = {
    "str": "str",
    "int": "int",
    "float": "float",
    "human_readable_int": "human_int",
    "json.loads": "json",
    "orjson.loads": "json",
    "json_list_type": "json",
    "nullable_str": "nullable_str",
}


def _type_name(expr: str) -> tuple[str, str | None]:
    """Map an argparse `type=` callable to the validator's type; unknown converters accept any string."""
    short = expr.rsplit(".", 1)[-1] if expr not in _TYPE_NAMES else expr
    if expr in _TYPE_NAMES:
        return _TYPE_NAMES[expr], None
    if short in _TYPE_NAMES:
        return _TYPE_NAMES[short], None
    return "str", expr


def _first_sentences(text: str) -> str:
    text = " ".join(text.split())
    if len(text) <= HELP_MAX:
        return text
    cut = text[:HELP_MAX]
    dot = cut.rfind(". ")
    return cut[: dot + 1] if dot > 40 else cut.rstrip() + "…"


@dataclass
class Rec:
    flag: str
    aliases: list[str]
    dest: str
    file: str
    line: int
    nargs: Any = None  # None = one value, 0 = switch, "+", "*", "?", int
    type: str = "str"
    type_src: str | None = None
    choices: list[Any] | None = None
    choices_expr: str | None = None
    default: Any = None
    default_expr: str | None = None
    required: bool = False
    negation: list[str] = field(default_factory=list)
    deprecated: str | None = None
    help: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"flag": self.flag}
        if self.aliases:
            out["aliases"] = self.aliases
        if self.negation:
            out["negation"] = self.negation
        if self.dest != self.flag.lstrip("-").replace("-", "_"):
            out["dest"] = self.dest
        if self.nargs is not None:
            out["nargs"] = self.nargs
        if self.nargs != 0 and self.type != "str":
            out["type"] = self.type
        if self.type_src:
            out["type_src"] = self.type_src
        if self.choices is not None:
            out["choices"] = self.choices
        if self.choices_expr:
            out["choices_expr"] = self.choices_expr
        if self.default is not None:
            out["default"] = self.default
        if self.default_expr:
            out["default_expr"] = self.default_expr
        if self.required:
            out["required"] = True
        if self.deprecated:
            out["deprecated"] = self.deprecated
        if self.help:
            out["help"] = self.help
        out["src"] = f"{self.file}:{self.line}"
        return out


class Extractor:
    def __init__(self, tree: SourceTree) -> None:
        self.tree = tree
        self.ev = Evaluator(tree)
        self.notes: list[str] = []

    # ---- shared helpers -------------------------------------------------------------------------

    def _try(self, node: ast.AST | None, scope: Scope) -> tuple[Any, str | None]:
        """(value, None) when the expression evaluates to JSON data, else (None, source text)."""
        if node is None:
            return None, None
        try:
            return _jsonable(self.ev.eval(node, scope)), None
        except (Unresolved, RecursionError, TypeError, ValueError, AttributeError):
            return None, " ".join(ast.unparse(node).split())

    def _help(self, node: ast.AST | None, scope: Scope) -> str:
        if node is None:
            return ""
        try:
            value = self.ev.eval(node, scope)
            if isinstance(value, str):
                return "" if value == "==SUPPRESS==" else _first_sentences(value)
        except (Unresolved, RecursionError, TypeError, ValueError, AttributeError):
            pass
        # Keep the literal pieces of a concatenation.
        pieces = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        return _first_sentences("".join(pieces))

    def _action(
        self, node: ast.AST, scope: Scope, kwargs: Mapping[str, ast.AST]
    ) -> tuple[str, Any, str | None]:
        """(kind, nargs, deprecated) for an `action=`: kind is store/switch/boolean_optional/custom."""
        if isinstance(node, ast.Constant):
            name = node.value
            if name in ("store_true", "store_false", "store_const", "count", "help", "version"):
                return "switch", 0, None
            if name in ("append_const",):
                return "switch", 0, None
            return "store", None, None
        text = ast.unparse(node)
        if text.endswith("BooleanOptionalAction"):
            return "boolean_optional", 0, None
        cls: Any = None
        try:
            cls = self.ev.eval(node, scope)
        except Unresolved:
            cls = None
        nargs: Any = None
        deprecated: str | None = "warn" if "Deprecated" in text else None
        if isinstance(cls, ClassRef):
            init = next(
                (s for s in cls.node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None
            )
            if init is not None:
                args = init.args.args
                defaults = init.args.defaults
                for a, d in zip(args[len(args) - len(defaults) :], defaults, strict=True):
                    if a.arg == "nargs" and isinstance(d, ast.Constant):
                        nargs = d.value
                # A keyword-only argument without a default has None in `kw_defaults`.
                for a, kd in zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True):
                    if a.arg == "nargs" and isinstance(kd, ast.Constant):
                        nargs = kd.value
            call = next(
                (s for s in cls.node.body if isinstance(s, ast.FunctionDef) and s.name == "__call__"), None
            )
            if call is not None:
                if any(isinstance(s, ast.Raise) for s in call.body):
                    deprecated = "error"
                elif any(
                    isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "error"
                    for n in ast.walk(call)
                ):
                    deprecated = "error" if "error_message" in kwargs else (deprecated or None)
        if "nargs" in kwargs:
            v, _ = self._try(kwargs["nargs"], scope)
            nargs = v
        return ("switch" if nargs == 0 else "custom"), nargs, deprecated

    # ---- monolithic layout ----------------------------------------------------------------------

    def monolithic(self) -> list[Rec]:
        module = "sglang.srt.server_args"
        tree = self.tree.parse(module)
        assert tree is not None
        server_args = next(
            (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"), None
        )
        if server_args is None:
            raise ExtractError("server_args.py has no class ServerArgs")
        add = next(
            (n for n in server_args.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args"), None
        )
        if add is None:
            return []
        local: dict[str, Any] = {}
        for stmt in ast.walk(add):
            if isinstance(stmt, ast.Assign | ast.AnnAssign | ast.ImportFrom):
                _collect_local(stmt, local, module, self.ev)
        scope = Scope(module, local)
        calls = [
            n
            for n in ast.walk(add)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "add_argument"
        ]
        calls.sort(key=lambda c: (c.lineno, c.col_offset))
        return [self._from_add_argument(c, scope, "server_args.py") for c in calls]

    def _from_add_argument(self, call: ast.Call, scope: Scope, file: str) -> Rec:
        names = []
        for a in call.args:
            v, expr = self._try(a, scope)
            if not isinstance(v, str):
                raise ExtractError(f"{file}:{call.lineno}: option name {expr!r} is not a literal")
            names.append(v)
        kw = {k.arg: k.value for k in call.keywords if k.arg}
        longs = [n for n in names if n.startswith("--")] or names
        dest_v, _ = self._try(kw.get("dest"), scope)
        dest = dest_v if isinstance(dest_v, str) else longs[0].lstrip("-").replace("-", "_")
        rec = Rec(flag=names[0], aliases=names[1:], dest=dest, file=file, line=call.lineno)
        kind, nargs = "store", None
        if "action" in kw:
            kind, nargs, rec.deprecated = self._action(kw["action"], scope, kw)
        elif "nargs" in kw:
            nargs, _ = self._try(kw["nargs"], scope)
        rec.nargs = nargs
        if kind == "boolean_optional":
            rec.negation = ["--no-" + n[2:] for n in names if n.startswith("--")]
        if "type" in kw:
            rec.type, rec.type_src = _type_name(ast.unparse(kw["type"]))
        if "choices" in kw:
            rec.choices, rec.choices_expr = self._try(kw["choices"], scope)
            if rec.choices is not None and not isinstance(rec.choices, list):
                rec.choices = _jsonable(list(rec.choices)) if isinstance(rec.choices, dict) else None
        if "default" in kw:
            rec.default, rec.default_expr = self._default(kw["default"], scope)
        if "required" in kw:
            v, _ = self._try(kw["required"], scope)
            rec.required = v is True
        rec.help = self._help(kw.get("help"), scope)
        if rec.deprecated == "warn" and "error_message" in kw:
            rec.deprecated = "error"
        return rec

    def _default(self, node: ast.AST, scope: Scope) -> tuple[Any, str | None]:
        # `default=ServerArgs.x` -> the dataclass field's default.
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "ServerArgs"
            and scope.module == "sglang.srt.server_args"
        ):
            tree = self.tree.parse(scope.module)
            assert tree is not None
            cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
            for stmt in cls.body:
                if (
                    isinstance(stmt, ast.AnnAssign)
                    and isinstance(stmt.target, ast.Name)
                    and stmt.target.id == node.attr
                ):
                    return self._try(stmt.value, Scope(scope.module))
        return self._try(node, scope)

    # ---- fields layout (0.5.2x) -----------------------------------------------------------------

    def fields(self) -> list[Rec]:
        recs: list[Rec] = []
        for module in self.tree.modules_under("sglang.srt.arg_groups.fields"):
            tree = self.tree.parse(module)
            if tree is None:
                continue
            file = module.removeprefix("sglang.srt.").replace(".", "/") + ".py"
            for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
                if not any(
                    isinstance(s, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "_NS_PATH" for t in s.targets)
                    for s in cls.body
                ):
                    continue
                for stmt in cls.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                        rec = self._from_field(stmt, Scope(module), file)
                        if rec is not None:
                            recs.append(rec)
        return recs

    def _from_field(self, stmt: ast.AnnAssign, scope: Scope, file: str) -> Rec | None:
        ann = stmt.annotation
        if not (
            isinstance(ann, ast.Subscript)
            and ast.unparse(ann.value) in ("A", "Annotated", "typing.Annotated")
        ):
            return None
        parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        raw_type, metas = parts[0], parts[1:]
        meta: dict[str, ast.AST] = {}
        found = False
        for m in metas:
            if isinstance(m, ast.Constant) and isinstance(m.value, str):
                meta = {"help": m}
                found = True
                break
            if isinstance(m, ast.JoinedStr | ast.BinOp):
                meta = {"help": m}
                found = True
                break
            if isinstance(m, ast.Call) and ast.unparse(m.func) in ("Arg", "arg_utils.Arg"):
                meta = {k.arg: k.value for k in m.keywords if k.arg}
                found = True
                break
        if not found:
            return None
        if "no_cli" in meta and isinstance(meta["no_cli"], ast.Constant) and meta["no_cli"].value:
            return None
        name = stmt.target.id  # type: ignore[union-attr]
        cli_v, _ = self._try(meta.get("cli_name"), scope)
        cli_name = cli_v if isinstance(cli_v, str) else "--" + name.replace("_", "-")
        aliases_v, _ = self._try(meta.get("aliases"), scope)
        aliases = [a for a in aliases_v or [] if isinstance(a, str)]
        rec = Rec(flag=cli_name, aliases=aliases, dest=name, file=file, line=stmt.lineno)
        rec.help = self._help(meta.get("help"), scope)
        has_default = stmt.value is not None
        if has_default:
            rec.default, rec.default_expr = self._try(stmt.value, scope)
        explicit_choices = meta.get("choices")

        def set_choices(node: ast.AST | None) -> None:
            if node is not None:
                rec.choices, rec.choices_expr = self._try(node, scope)
                if isinstance(rec.choices, dict):
                    rec.choices = list(rec.choices)

        if "action" in meta and not (
            isinstance(meta["action"], ast.Constant) and meta["action"].value is None
        ):
            action_kwargs = meta.get("action_kwargs")
            if isinstance(action_kwargs, ast.Dict):
                for k, v in zip(action_kwargs.keys, action_kwargs.values, strict=True):
                    if isinstance(k, ast.Constant) and isinstance(k.value, str):
                        meta[k.value] = v
            kind, rec.nargs, rec.deprecated = self._action(meta["action"], scope, meta)
            if "type" in meta:
                rec.type, rec.type_src = _type_name(ast.unparse(meta["type"]))
            set_choices(meta.get("choices"))
            if kind == "boolean_optional":
                rec.negation = ["--no-" + n[2:] for n in [cli_name, *aliases] if n.startswith("--")]
            return rec

        inner, _optional = _unwrap_optional(raw_type)
        type_parser = meta.get("type_parser")
        literal = _literal_values(inner)
        if literal is not None:
            rec.choices = literal
            set_choices(explicit_choices)
            if type_parser is not None:
                rec.type, rec.type_src = _type_name(ast.unparse(type_parser))
            else:
                first = literal[0] if literal else ""
                rec.type = "int" if isinstance(first, int) else "float" if isinstance(first, float) else "str"
            return rec
        list_elem = _list_elem(inner)
        if list_elem is not None and type_parser is None:
            rec.type = _infer_type(list_elem)
            nargs_v, _ = self._try(meta.get("nargs"), scope)
            rec.nargs = nargs_v if nargs_v is not None else "+"
            set_choices(explicit_choices)
            return rec
        if isinstance(inner, ast.Name) and inner.id == "bool":
            rec.nargs = 0
            return rec
        if type_parser is not None:
            rec.type, rec.type_src = _type_name(ast.unparse(type_parser))
        else:
            rec.type = _infer_type(inner)
        set_choices(explicit_choices)
        if "nargs" in meta:
            rec.nargs, _ = self._try(meta["nargs"], scope)
        required_v, _ = self._try(meta.get("required"), scope)
        rec.required = required_v is True or (required_v is None and not has_default)
        return rec

    def manual(self) -> list[Rec]:
        return self.monolithic()

    def run(self) -> tuple[str, list[Rec]]:
        if self.tree.module_file("sglang.srt.arg_groups.fields") is not None and self.fields_declared():
            recs = self.fields() + self.manual()
            layout = "fields"
        else:
            recs = self.monolithic()
            layout = "monolithic"
        seen: dict[str, Rec] = {}
        for rec in recs:
            for name in [rec.flag, *rec.aliases, *rec.negation]:
                if name in seen:
                    raise ExtractError(
                        f"{name} is declared twice ({seen[name].file}:{seen[name].line} and {rec.file}:{rec.line})"
                    )
                seen[name] = rec
        return layout, recs

    def fields_declared(self) -> bool:
        return bool(self.tree.modules_under("sglang.srt.arg_groups.fields"))


def _unwrap_optional(node: ast.AST) -> tuple[ast.AST, bool]:
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("Optional", "typing.Optional"):
        return node.slice, True
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("Union", "typing.Union"):
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        rest = [e for e in elts if not (isinstance(e, ast.Constant) and e.value is None)]
        if len(rest) == 1 and len(elts) == 2:
            return rest[0], True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        for a, b in ((node.left, node.right), (node.right, node.left)):
            if isinstance(b, ast.Constant) and b.value is None:
                return a, True
    return node, False


def _literal_values(node: ast.AST) -> list[Any] | None:
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("Literal", "typing.Literal"):
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if all(isinstance(e, ast.Constant) for e in elts):
            return [e.value for e in elts]  # type: ignore[attr-defined]
    return None


def _list_elem(node: ast.AST) -> ast.AST | None:
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("List", "list", "typing.List"):
        return node.slice
    if isinstance(node, ast.Name) and node.id in ("List", "list"):
        return ast.Name(id="str")
    return None


def _infer_type(node: ast.AST) -> str:
    # arg_utils._infer_type_func: str/int/float map to themselves, anything else parses as str.
    if isinstance(node, ast.Name) and node.id in ("int", "float"):
        return node.id
    return "str"


# --------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------


def normalize_version(version: str) -> str:
    v = version.strip()
    return v if v.startswith("v") else "v" + v


def extract(source: Path, version: str | None = None) -> dict[str, Any]:
    tree = SourceTree.from_path(source)
    ver = version or tree.version()
    if not ver:
        raise ExtractError(f"cannot tell the SGLang version of {source}; pass --version")
    extractor = Extractor(tree)
    layout, recs = extractor.run()
    option_strings = sum(1 + len(r.aliases) + len(r.negation) for r in recs)
    return {
        "format": FORMAT_VERSION,
        "sglang_version": normalize_version(ver),
        "layout": layout,
        "source": tree.origin,
        "counts": {
            "actions": len(recs),
            "option_strings": option_strings,
            "choices_unresolved": sum(1 for r in recs if r.choices_expr),
            "defaults_unresolved": sum(1 for r in recs if r.default_expr),
        },
        "flags": [r.to_json() for r in recs],
    }


def dump(data: dict[str, Any]) -> str:
    """One flag a line: compact, and still diffable in review."""
    head = {k: v for k, v in data.items() if k != "flags"}
    lines = ["{", *[f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}," for k, v in head.items()]]
    lines.append('  "flags": [')
    flags = data["flags"]
    for i, f in enumerate(flags):
        sep = "," if i < len(flags) - 1 else ""
        lines.append("    " + json.dumps(f, ensure_ascii=False, separators=(", ", ": ")) + sep)
    lines += ["  ]", "}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m console.tools.extract_sglang_args",
        description="Extract SGLang's server flags from a wheel, sdist or source tree (no import, no torch).",
    )
    parser.add_argument("source", type=Path, nargs="+", help="wheel, sdist or directory")
    parser.add_argument("--version", help="version label when it cannot be read from the source")
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        help="a .json file, or a directory (file named v<version>.json); default stdout",
    )
    args = parser.parse_args(argv)
    if args.version and len(args.source) > 1:
        parser.error("--version applies to a single source")
    for src in args.source:
        try:
            data = extract(src, args.version)
        except ExtractError as exc:
            sys.stderr.write(f"extract_sglang_args: {exc}.\n")
            return 2
        text = dump(data)
        if args.output is None:
            sys.stdout.write(text)
            continue
        out = args.output
        if out.is_dir() or (len(args.source) > 1 and not out.suffix):
            out.mkdir(parents=True, exist_ok=True)
            out = out / f"{data['sglang_version']}.json"
        out.write_text(text, encoding="utf-8")
        c = data["counts"]
        sys.stderr.write(
            f"{src.name}: {data['sglang_version']} ({data['layout']}): {c['actions']} flags, "
            f"{c['option_strings']} option strings, {c['choices_unresolved']} choices unresolved -> {out}\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["ExtractError", "dump", "extract", "main", "normalize_version"]
