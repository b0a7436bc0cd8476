"""SGLang v0.5.12.post1's command line, rebuilt from its real flag list, and the `ServerArgs` it resolves to.

`build_parser()` registers every one of the 387 `add_argument` calls of v0.5.12.post1 (399 option strings)
from `data/args_v0.5.12.post1.json`, so unknown flags fail with argparse's own usage + error (exit 2) and
prefix matching (`--tp 8`, `--mem-frac 0.9`) resolves exactly as in SGLang (`prog="sglang serve"`, no
`allow_abbrev=False`). Choice lists that SGLang builds from module constants are not validated.

`resolve_server_args()` then applies the part of `ServerArgs.__post_init__` that the twin needs (aliases,
tokenizer/served-model defaults, the GPU-memory heuristics for chunked prefill, CUDA-graph batch sizes and
the default `mem_fraction_static`), and `server_args_repr()` prints the dataclass repr in field order.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from decimal import Decimal
from functools import cache
from importlib import resources
from typing import Any

from console.twin.scenarios import Scenario

ARGS_FILE = "args_v0.5.12.post1.json"
FIELDS_FILE = "server_args_fields_v0.5.12.post1.json"
PROG = "sglang serve"

_HUMAN_INT_DOC = (
    "Supports standard SI suffixes (k, M, G, T) and IEC suffixes (Ki, Mi, Gi, Ti). Suffixes are "
    "case-sensitive. Decimals are allowed for SI suffixes only."
)


def _read_data(name: str) -> Any:
    return json.loads(resources.files("console.twin").joinpath("data", name).read_text(encoding="utf-8"))


@cache
def arg_specs() -> list[dict[str, Any]]:
    return list(_read_data(ARGS_FILE))


@cache
def server_args_fields() -> list[tuple[str, Any]]:
    return [(name, default) for name, default in _read_data(FIELDS_FILE)["fields"]]


# ------------------------------------------------------------------------------ argparse types/actions
def human_readable_int(value: str) -> int:
    """SGLang's `human_readable_int`: `200k`, `128Ki`, `25.6k` or a plain integer."""
    value = value.strip()
    si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. "
                    f"Use an integer IEC value such as '{int(Decimal(number))}{suffix}', "
                    f"or an SI value such as '{number}{suffix[0]}'."
                )
            return int(number) * iec[suffix]
        return int(Decimal(number) * si[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. Expected an integer or a value with a suffix "
            "(k, M, G, T, Ki, Mi, Gi, Ti)."
        ) from None


def nullable_str(val: str) -> str | None:
    if not val or val == "None":
        return None
    return val


def json_list_type(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(
            f"Invalid JSON list: {value}. Please provide a valid JSON list."
        ) from None


def _json_loads(value: str) -> Any:
    return json.loads(value)


_json_loads.__name__ = "loads"

_TYPES: dict[str, Any] = {
    "str": str,
    "int": int,
    "float": float,
    "json.loads": _json_loads,
    "human_readable_int": human_readable_int,
    "json_list_type": json_list_type,
    "nullable_str": nullable_str,
}


def _deprecated_warning(message: str) -> None:
    sys.stdout.write(f"\033[1;33m{message}\033[0m\n")
    sys.stdout.flush()


class DeprecatedAction(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, nargs: Any = 0, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        _deprecated_warning(
            f"The command line argument '{option_string}' is deprecated and will be removed in future versions."
        )


class DeprecatedStoreTrueAction(argparse.Action):
    def __init__(
        self,
        option_strings: list[str],
        dest: str,
        new_flag: str | None = None,
        nargs: Any = 0,
        const: Any = True,
        default: Any = False,
        **kwargs: Any,
    ) -> None:
        self.new_flag = new_flag
        super().__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        _deprecated_warning(
            f"'{option_string}' is deprecated and will be removed in a future release.{replacement}"
        )
        setattr(namespace, self.dest, True)


class LoRAPathAction(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        paths: list[Any] = []
        for item in values or []:
            item = item.strip()
            paths.append(json.loads(item) if item.startswith("{") and item.endswith("}") else item)
        setattr(namespace, self.dest, paths)


_ACTIONS: dict[str, Any] = {
    "DeprecatedAction": DeprecatedAction,
    "DeprecatedStoreTrueAction": DeprecatedStoreTrueAction,
    "argparse.BooleanOptionalAction": argparse.BooleanOptionalAction,
    "LoRAPathAction": LoRAPathAction,
}

_SYMBOLIC_DEFAULTS: dict[str, Any] = {
    "list(DEFAULT_UVICORN_ACCESS_LOG_EXCLUDE_PREFIXES)": [],
    "10 * 1000 * 1000": 10_000_000,
    "ENCODER_TRANSFER_BACKEND_CHOICES[0]": "zmq_to_scheduler",
}


def _help_text(raw: Any) -> str:
    if isinstance(raw, str):
        return raw.replace("%", "%%")
    expr = raw.get("expr", "") if isinstance(raw, dict) else ""
    if expr == "argparse.SUPPRESS":
        return argparse.SUPPRESS
    pieces = re.findall(r'"((?:[^"\\]|\\.)*)"', expr)
    text = "".join(pieces).replace("{human_readable_int.__doc__}", _HUMAN_INT_DOC)
    return re.sub(r"\{[^}]*\}", "", text).replace("\\n", " ").replace("%", "%%").strip()


def build_parser() -> argparse.ArgumentParser:
    """An argparse parser with exactly SGLang v0.5.12.post1's options."""
    parser = argparse.ArgumentParser(prog=PROG)
    for spec in arg_specs():
        kwargs: dict[str, Any] = {"help": _help_text(spec.get("help", ""))}
        action = spec.get("action")
        if isinstance(action, dict):
            kwargs["action"] = _ACTIONS[action["expr"]]
            if action["expr"] == "DeprecatedStoreTrueAction" and "new_flag" in spec:
                kwargs["new_flag"] = spec["new_flag"]
        elif action is not None:
            kwargs["action"] = action
        if "type" in spec:
            kwargs["type"] = _TYPES[spec["type"]]
        if "default" in spec:
            default = spec["default"]
            if isinstance(default, dict) and "expr" in default:
                default = _SYMBOLIC_DEFAULTS[default["expr"]]
            kwargs["default"] = default
        choices = spec.get("choices")
        if isinstance(choices, list):
            kwargs["choices"] = choices
        for key in ("nargs", "const", "dest", "required"):
            if key in spec:
                kwargs[key] = spec[key]
        parser.add_argument(*spec["names"], **kwargs)
    return parser


# ------------------------------------------------------------------------------ ServerArgs resolution
_ALIASED_DESTS = {
    "tensor_parallel_size": "tp_size",
    "pipeline_parallel_size": "pp_size",
    "data_parallel_size": "dp_size",
    "expert_parallel_size": "ep_size",
    "attention_context_parallel_size": "attn_cp_size",
    "moe_data_parallel_size": "moe_dp_size",
}


def _cuda_graph_batch_sizes(max_bs: int, speculative: bool, no_padding: bool) -> list[int]:
    if no_padding:
        capture = list(range(1, max_bs + 1))
    elif not speculative:
        capture = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    else:
        capture = (
            list(range(1, 9))
            + list(range(10, 33, 2))
            + list(range(40, 65, 4))
            + list(range(72, 257, 8))
            + list(range(272, max_bs + 1, 16))
        )
    capture = [bs for bs in capture if bs <= max_bs]
    if max_bs not in capture:
        capture.append(max_bs)
    return capture


def _piecewise_tokens(max_tokens: int) -> list[int]:
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
        + list(range(4608, max_tokens + 1, 512))
    )
    return [s for s in sizes if s <= max_tokens]


def resolve_server_args(ns: argparse.Namespace, scenario: Scenario) -> dict[str, Any]:
    """The `ServerArgs` fields after SGLang's post-init for this host (a plain dict in field order)."""
    raw = vars(ns).copy()
    for cli_dest, field in _ALIASED_DESTS.items():
        raw[field] = raw.pop(cli_dest)
    args: dict[str, Any] = {}
    for name, default in server_args_fields():
        args[name] = raw.get(name, default)

    if args["tokenizer_path"] is None:
        args["tokenizer_path"] = args["model_path"]
    if args["served_model_name"] is None:
        args["served_model_name"] = args["model_path"]
    if args["random_seed"] is None:
        args["random_seed"] = random.randint(0, 1 << 30)
    if args["device"] is None:
        args["device"] = "cuda"
    if args["attention_backend"] is None:
        args["attention_backend"] = scenario.attention_backend
    if args["sampling_backend"] is None:
        args["sampling_backend"] = "flashinfer"
    if args["grammar_backend"] is None:
        args["grammar_backend"] = "xgrammar"
    if args["page_size"] is None:
        args["page_size"] = 1

    spec_algo = args["speculative_algorithm"]
    if spec_algo is not None:
        if args["speculative_num_steps"] is None:
            args["speculative_num_steps"] = 3
        if args["speculative_eagle_topk"] is None:
            args["speculative_eagle_topk"] = 1
        if args["speculative_num_draft_tokens"] is None:
            args["speculative_num_draft_tokens"] = 4

    if scenario.is_multimodal or args["enable_dp_attention"] or args["pp_size"] > 1:
        args["disable_piecewise_cuda_graph"] = True

    gpu_mem = scenario.gpu_total_mib
    tp = args["tp_size"]
    if gpu_mem < 20 * 1024:
        chunk, max_bs = 2048, 8
    elif gpu_mem < 35 * 1024:
        chunk, max_bs = 2048, (24 if tp < 4 else 80)
    elif gpu_mem < 60 * 1024:
        chunk, max_bs = 4096, (32 if tp < 4 else 160)
    elif gpu_mem < 160 * 1024:
        chunk, max_bs = 8192, (256 if tp < 4 else 512)
    else:
        chunk, max_bs = 16384, 512
    if args["chunked_prefill_size"] is None:
        args["chunked_prefill_size"] = chunk
    if args["cuda_graph_max_bs"] is None:
        args["cuda_graph_max_bs"] = max_bs
    if args["cuda_graph_bs"] is None:
        args["cuda_graph_bs"] = _cuda_graph_batch_sizes(
            args["cuda_graph_max_bs"], spec_algo is not None, args["disable_cuda_graph_padding"]
        )
    else:
        args["cuda_graph_max_bs"] = max(args["cuda_graph_bs"])
    if args["piecewise_cuda_graph_max_tokens"] is None:
        pw = args["chunked_prefill_size"] if scenario.attention != "mla" else 2048
        if args["max_total_tokens"] is not None:
            pw = min(pw, args["max_total_tokens"])
        args["piecewise_cuda_graph_max_tokens"] = pw
    if args["piecewise_cuda_graph_tokens"] is None:
        args["piecewise_cuda_graph_tokens"] = _piecewise_tokens(args["piecewise_cuda_graph_max_tokens"])

    if args["mem_fraction_static"] is None:
        args["mem_fraction_static"] = _default_mem_fraction(args, scenario)
    return args


def _default_mem_fraction(args: dict[str, Any], scenario: Scenario) -> float:
    gpu_mem = scenario.gpu_total_mib
    reserved: float = 512
    chunk = args["chunked_prefill_size"]
    reserved += max(chunk if chunk > 0 else args["max_prefill_tokens"], 2048) * 1.5
    reserved += args["cuda_graph_max_bs"] * 2
    reserved += args["tp_size"] * args["pp_size"] / 8 * 1024
    if args["enable_dp_attention"]:
        reserved += args["cuda_graph_max_bs"] * args["dp_size"] * 3
        if args["cuda_graph_max_bs"] > 300:
            reserved += args["cuda_graph_max_bs"] * args["dp_size"] * 1.5
    if not args["disable_piecewise_cuda_graph"]:
        if scenario.attention != "mla":
            reserved += len(args["piecewise_cuda_graph_tokens"]) * 8
        else:
            reserved += 1.5 * 1024
    if gpu_mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    algo = args["speculative_algorithm"]
    if algo is not None:
        if algo == "STANDALONE":
            reserved += 6 * 1024
        elif algo != "NGRAM":
            reserved += 4 * 1024
    fraction = round((gpu_mem - reserved) / gpu_mem, 3)
    if scenario.is_multimodal and not args["language_only"]:
        # KimiK25VisionConfig defaults: 27 layers, hidden 1152 (adjust_mem_fraction_for_vlm).
        vit_params = 27 * 1152 * 1152 / (24 * 1024 * 1024)
        factor = min(max(1 - 0.1 * (vit_params - 1), 0.8), 1.05)
        fraction = round(fraction * 0.95 * factor, 3)
    return fraction


def server_args_repr(args: dict[str, Any]) -> str:
    """`ServerArgs(model_path='...', ...)` exactly as the dataclass repr prints it."""
    return "ServerArgs(" + ", ".join(f"{name}={args[name]!r}" for name in args) + ")"


def parse_argv(argv: list[str], scenario: Scenario) -> dict[str, Any]:
    """Parse like `sglang serve` (exit 2 with usage on bad flags) and resolve the server args."""
    return resolve_server_args(build_parser().parse_args(argv), scenario)
