"""The AST extractor on tiny synthetic SGLang trees (both source layouts), as a directory, wheel and sdist."""

from __future__ import annotations

import json
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from console.core.flag_validation import validate_flags
from console.core.flags import FlagList
from console.tools.extract_sglang_args import ExtractError, dump, extract, main

MONOLITHIC = {
    "sglang/version.py": '__version__ = "0.5.12.post1"\n',
    "sglang/srt/__init__.py": "",
    "sglang/srt/constants.py": """
        LOAD_FORMAT_CHOICES = ["auto", "pt"]
        LOAD_FORMAT_CHOICES += ["safetensors"]
        BACKENDS = {"triton": 1, "fa3": 2}
    """,
    "sglang/srt/server_args.py": """
        import argparse
        import dataclasses
        import torch  # never imported by the extractor
        from sglang.srt.constants import LOAD_FORMAT_CHOICES, BACKENDS

        KV = ["auto", "fp8_e4m3"]

        @dataclasses.dataclass
        class ServerArgs:
            tp_size: int = 1
            mem_fraction_static: float = None
            cuda_graph_bs: list = dataclasses.field(default_factory=list)

            @staticmethod
            def add_cli_args(parser: argparse.ArgumentParser):
                backends = list(BACKENDS.keys())
                parser.add_argument("--model-path", "--model", type=str, required=True, help="The model.")
                parser.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=ServerArgs.tp_size, help="TP " "size.")
                parser.add_argument("--mem-fraction-static", type=float, default=ServerArgs.mem_fraction_static)
                parser.add_argument("--load-format", type=str, default="auto", choices=LOAD_FORMAT_CHOICES)
                parser.add_argument("--kv-cache-dtype", type=str, default="auto", choices=KV + ["bf16"])
                parser.add_argument("--attention-backend", choices=backends)
                parser.add_argument("--context-length", type=human_readable_int)
                parser.add_argument("--cuda-graph-bs", type=int, nargs="+", default=ServerArgs.cuda_graph_bs)
                parser.add_argument("--enable-metrics", action="store_true")
                parser.add_argument("--enable-tf32", action=argparse.BooleanOptionalAction)
                parser.add_argument("--old-thing", action=DeprecatedAction, help="--old-thing is gone.")
                parser.add_argument("--weird", type=lambda s: s.upper(), default=10 * 1000)

        class DeprecatedAction(argparse.Action):
            def __init__(self, option_strings, dest, nargs=0, **kwargs):
                super().__init__(option_strings, dest, nargs=nargs, **kwargs)

            def __call__(self, parser, namespace, values, option_string=None):
                raise ValueError(self.help)
    """,
}

FIELDS = {
    "sglang/version.py": '__version__ = "0.5.23"\n',
    "sglang/srt/__init__.py": "",
    "sglang/srt/arg_groups/__init__.py": "",
    "sglang/srt/arg_groups/choices.py": """
        ATTENTION_BACKEND_CHOICES = ["triton", "fa3"]
        class Backend:
            FULL = "full"
            DISABLED = "disabled"
            ALL = (FULL, DISABLED)
    """,
    "sglang/srt/arg_groups/fields/__init__.py": "",
    "sglang/srt/arg_groups/fields/graph.py": """
        from typing import List, Literal, Optional
        import argparse
        import msgspec
        from sglang.srt.arg_groups.arg_utils import A, Arg
        from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, Backend

        class ExecGraph(msgspec.Struct):
            _NS_PATH = "graph"
            cuda_graph_max_bs_decode: A[Optional[int], "Max decode bs."] = None
            cuda_graph_max_bs_prefill: A[Optional[int], "Max prefill bs."] = None
            cuda_graph_backend_decode: A[Optional[str], Arg(help="Backend.", choices=Backend.ALL)] = None
            attention_backend: A[Optional[str], Arg(help="Attn.", choices=ATTENTION_BACKEND_CHOICES)] = None
            tp_size: A[int, Arg(help="TP.", aliases=["--tensor-parallel-size"])] = 1
            page_size: A[Optional[Literal[1, 64]], "Page."] = None
            cuda_graph_bs: A[Optional[List[int]], "Batch sizes."] = None
            enable_metrics: A[bool, "Metrics."] = False
            enable_fused: A[Optional[bool], Arg(help="Fused.", action=argparse.BooleanOptionalAction)] = None
            model_path: A[str, Arg(help="Model.", aliases=["--model"])]
            hidden: A[int, Arg(help="x", no_cli=True)] = 3
            internal: int = 5
            big: A[int, "Big."] = 1024 * 1024
            urls: A[List[str], "URLs."] = msgspec.field(default_factory=list)
    """,
    "sglang/srt/server_args.py": """
        import argparse
        from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES

        def _parsers():
            from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES as names
            return list(names)

        class ServerArgs:
            @staticmethod
            def add_cli_args(parser):
                add_cli_args_from_dataclass(parser, ServerArgs)
                parser.add_argument("--reasoning-parser", type=str, choices=["auto"] + _parsers())
                parser.add_argument("--config", type=str, help="Config file.")
    """,
}


def write_tree(root: Path, files: dict[str, str], prefix: str = "") -> Path:
    for rel, text in files.items():
        p = root / prefix / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


def flags_of(data: dict) -> dict[str, dict]:
    return {f["flag"]: f for f in data["flags"]}


def test_monolithic_layout(tmp_path: Path) -> None:
    data = extract(write_tree(tmp_path, MONOLITHIC, "python"))
    assert data["sglang_version"] == "v0.5.12.post1" and data["layout"] == "monolithic"
    f = flags_of(data)
    assert list(f) == [
        "--model-path", "--tp-size", "--mem-fraction-static", "--load-format", "--kv-cache-dtype",
        "--attention-backend", "--context-length", "--cuda-graph-bs", "--enable-metrics", "--enable-tf32",
        "--old-thing", "--weird",
    ]  # fmt: skip
    assert f["--model-path"]["aliases"] == ["--model"] and f["--model-path"]["required"] is True
    assert (
        f["--tp-size"]["default"] == 1
        and f["--tp-size"]["type"] == "int"
        and f["--tp-size"]["help"] == "TP size."
    )
    assert "default" not in f["--mem-fraction-static"]
    assert f["--load-format"]["choices"] == ["auto", "pt", "safetensors"]
    assert f["--kv-cache-dtype"]["choices"] == ["auto", "fp8_e4m3", "bf16"]
    assert f["--attention-backend"]["choices"] == ["triton", "fa3"]
    assert f["--context-length"]["type"] == "human_int"
    assert f["--cuda-graph-bs"]["nargs"] == "+" and f["--cuda-graph-bs"]["default"] == []
    assert f["--enable-metrics"]["nargs"] == 0
    assert f["--enable-tf32"]["negation"] == ["--no-enable-tf32"]
    assert f["--old-thing"]["deprecated"] == "error" and f["--old-thing"]["nargs"] == 0
    assert f["--weird"]["type_src"].startswith("lambda") and f["--weird"]["default"] == 10_000
    assert data["counts"] == {
        "actions": 12,
        "option_strings": 15,
        "choices_unresolved": 0,
        "defaults_unresolved": 0,
    }


def test_fields_layout(tmp_path: Path) -> None:
    data = extract(write_tree(tmp_path, FIELDS))
    assert data["sglang_version"] == "v0.5.23" and data["layout"] == "fields"
    f = flags_of(data)
    assert "--hidden" not in f and "--internal" not in f
    assert f["--cuda-graph-backend-decode"]["choices"] == ["full", "disabled"]
    assert f["--attention-backend"]["choices"] == ["triton", "fa3"]
    assert f["--tp-size"]["aliases"] == ["--tensor-parallel-size"] and f["--tp-size"]["type"] == "int"
    assert f["--page-size"]["choices"] == [1, 64] and f["--page-size"]["type"] == "int"
    assert f["--cuda-graph-bs"]["nargs"] == "+" and f["--cuda-graph-bs"]["type"] == "int"
    assert f["--enable-metrics"]["nargs"] == 0
    assert f["--enable-fused"]["negation"] == ["--no-enable-fused"]
    assert f["--model-path"]["required"] is True and f["--model-path"]["aliases"] == ["--model"]
    assert f["--big"]["default"] == 1024 * 1024
    assert f["--urls"]["default"] == []
    assert f["--reasoning-parser"]["choices"] == ["auto", "triton", "fa3"]
    assert "--config" in f

    fl = FlagList.from_json(dump(data))
    report = validate_flags({"model": "m", "cuda-graph-max-bs": 8, "tp": 8, "page-size": 32}, fl)
    assert {i.code for i in report.errors} == {"ambiguous", "choice"}
    assert fl.resolve("--tp").option == "--tp-size"


def test_wheel_and_sdist_give_the_same_data(tmp_path: Path) -> None:
    src = write_tree(tmp_path / "src", FIELDS)
    whl = tmp_path / "sglang-0.5.23-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        for p in src.rglob("*.py"):
            zf.write(p, p.relative_to(src).as_posix())
    sdist = tmp_path / "sglang-0.5.23.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(src / "sglang", arcname="sglang-0.5.23/python/sglang")
    a, b, c = extract(src), extract(whl), extract(sdist)
    assert a["flags"] == b["flags"] == c["flags"]
    assert b["source"] == whl.name


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_tree(tmp_path / "src", MONOLITHIC)
    out = tmp_path / "out"
    out.mkdir()
    assert main([str(src), "--version", "0.5.12.post1", "-o", str(out)]) == 0
    data = json.loads((out / "v0.5.12.post1.json").read_text())
    assert data["counts"]["actions"] == 12
    assert main([str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_not_sglang(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("")
    with pytest.raises(ExtractError, match=r"no sglang/srt/server_args\.py"):
        extract(tmp_path)
