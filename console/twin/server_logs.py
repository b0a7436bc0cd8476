"""Log lines of the simulated server, in SGLang v0.5.12.post1's formats.

Scheduler (GPU worker) lines carry `[YYYY-MM-DD HH:MM:SS TPn]`, main-process lines `[YYYY-MM-DD HH:MM:SS]`
(uvicorn's lines too, SGLang configures its formatter that way); tqdm bars and traceback bodies carry no
prefix. Everything goes to stdout, one flushed line at a time, so a journal receives whole lines.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

SITE = "/usr/local/lib/python3.12/dist-packages"
SRT = f"{SITE}/sglang/srt"


def now_stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())


class LogWriter:
    """Thread-safe writer of whole lines to stdout (or any text stream)."""

    def __init__(self, stream: TextIO | None = None, tp_size: int = 1) -> None:
        self._stream = stream or sys.stdout
        self._lock = threading.Lock()
        self.tp_size = tp_size

    def raw(self, text: str) -> None:
        with self._lock:
            try:
                self._stream.write(text if text.endswith("\n") else text + "\n")
                self._stream.flush()
            except (BrokenPipeError, ValueError):
                pass

    def main(self, message: str) -> None:
        """A main-process line: `[date time] message`."""
        self.raw(f"[{now_stamp()}] {message}")

    def rank(self, rank: int, message: str) -> None:
        """A scheduler line: `[date time TPn] message` (no TP tag when tp_size is 1)."""
        tag = f" TP{rank}" if self.tp_size > 1 else ""
        self.raw(f"[{now_stamp()}{tag}] {message}")


def fmt_clock(seconds: float) -> str:
    seconds = int(seconds)
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def shard_progress_line(done: int, total: int, elapsed: float, per_item: float) -> str:
    """sglang's safetensors loading bar (`{desc}: {percentage:3.0f}% Completed | n/total [...]`)."""
    pct = 100.0 * done / total if total else 100.0
    if done == 0:
        rate, remaining = "?it/s", "?"
    else:
        rate = f"{per_item:5.2f}s/it" if per_item >= 1 else f"{1 / per_item:5.2f}it/s"
        remaining = fmt_clock(per_item * (total - done))
    return (
        f"Loading safetensors checkpoint shards: {pct:3.0f}% Completed | {done}/{total} "
        f"[{fmt_clock(elapsed)}<{remaining}, {rate}]"
    )


def tqdm_line(desc: str, done: int, total: int, elapsed: float) -> str:
    """A default tqdm bar as printed to a non-terminal (10-character bar)."""
    frac = done / total if total else 1.0
    filled = int(frac * 10)
    partial = "▏▎▍▌▋▊▉"
    rest = frac * 10 - filled
    bar = "█" * filled
    if filled < 10:
        idx = int(rest * 8)
        bar += (partial[idx - 1] if idx > 0 else " ") + " " * (10 - filled - 1)
    if done == 0 or elapsed <= 0:
        tail = "?it/s]"
        remaining = "?"
    else:
        rate = done / elapsed
        remaining = fmt_clock((total - done) / rate) if rate > 0 else "?"
        tail = f"{rate:5.2f}it/s]" if rate >= 1 else f"{1 / rate:5.2f}s/it]"
    return f"{desc}: {100 * frac:3.0f}%|{bar}| {done}/{total} [{fmt_clock(elapsed)}<{remaining}, {tail}"


CUDA_GRAPH_CAPTURE_FAILED_MSG = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
    "3. disable torch compile by not using --enable-torch-compile\n"
    "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)

_SCHEDULER_FRAMES = [
    (f"{SRT}/managers/scheduler.py", 4025, "run_scheduler_process", "    scheduler = Scheduler("),
    (f"{SRT}/managers/scheduler.py", 437, "__init__", "    self.init_model_worker()"),
    (f"{SRT}/managers/scheduler.py", 718, "init_model_worker", "    self.init_tp_model_worker()"),
    (
        f"{SRT}/managers/scheduler.py",
        673,
        "init_tp_model_worker",
        "    self.tp_worker = TpModelWorker(**worker_kwargs)",
    ),
    (f"{SRT}/managers/tp_worker.py", 262, "__init__", "    self._init_model_runner()"),
    (f"{SRT}/managers/tp_worker.py", 347, "_init_model_runner", "    self._model_runner = ModelRunner("),
    (f"{SRT}/model_executor/model_runner.py", 535, "__init__", "    self.initialize(pre_model_load_memory)"),
]


def _frames(frames: list[tuple[str, int, str, str]]) -> list[str]:
    out: list[str] = []
    for path, line, func, code in frames:
        out.append(f'  File "{path}", line {line}, in {func}')
        out.append(f"  {code}")
    return out


def not_enough_memory_traceback() -> list[str]:
    """The body of `Scheduler hit an exception:` when the pool would be <= 0 tokens (v0.5.12.post1)."""
    frames = [
        *_SCHEDULER_FRAMES,
        (
            f"{SRT}/model_executor/model_runner.py",
            749,
            "initialize",
            "    self.init_memory_pool(pre_model_load_memory)",
        ),
        (
            f"{SRT}/model_executor/model_runner_kv_cache_mixin.py",
            902,
            "init_memory_pool",
            "    self.memory_pool_config = self._resolve_memory_pool_config(",
        ),
        (
            f"{SRT}/model_executor/model_runner_kv_cache_mixin.py",
            881,
            "_resolve_memory_pool_config",
            "    config = configurator.calculate_pool_sizes(available_bytes, page_size)",
        ),
        (
            f"{SRT}/model_executor/pool_configurator.py",
            187,
            "calculate_pool_sizes",
            "    return MemoryPoolConfig(max_total_num_tokens=max_total_num_tokens)",
        ),
        ("<string>", 12, "__init__", ""),
        (f"{SRT}/model_executor/pool_configurator.py", 56, "__post_init__", "    raise RuntimeError(msg)"),
    ]
    lines = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        lines.append(f'  File "{path}", line {line}, in {func}')
        if code:
            lines.append(f"  {code}")
    lines.append("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.")
    return lines


def cuda_oom_message(gpu: int, tried_gib: float, total_gib: float, free_mib: float, in_use_gib: float) -> str:
    allocated = in_use_gib * 0.97
    reserved_unalloc = max(in_use_gib - allocated, 0.0) * 1024
    return (
        f"CUDA out of memory. Tried to allocate {tried_gib:.2f} GiB. GPU {gpu} has a total capacity of "
        f"{total_gib:.2f} GiB of which {free_mib:.2f} MiB is free. Including non-PyTorch memory, this process "
        f"has {in_use_gib:.2f} GiB memory in use. Of the allocated memory {allocated:.2f} GiB is allocated by "
        f"PyTorch, and {reserved_unalloc:.2f} MiB is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
        "fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def cuda_oom_traceback(oom_message: str, mla: bool, draft: bool) -> list[str]:
    """`torch.OutOfMemoryError` inside graph capture, re-raised as `Capture cuda graph failed: ...`."""
    model_frames = (
        [
            (f"{SRT}/models/kimi_k25.py", 732, "forward", "    hidden_states = general_mm_embed_routine("),
            (
                f"{SRT}/managers/mm_utils.py",
                1106,
                "general_mm_embed_routine",
                "    hidden_states = language_model(",
            ),
            (f"{SRT}/models/deepseek_v2.py", 2485, "forward", "    hidden_states = self.model("),
            (
                f"{SRT}/models/deepseek_v2.py",
                2284,
                "forward",
                "    hidden_states, residual, topk_indices = layer(",
            ),
            (f"{SRT}/models/deepseek_v2.py", 1973, "forward", "    hidden_states = self.mlp("),
            (
                f"{SRT}/models/deepseek_v2.py",
                883,
                "forward_normal",
                "    final_hidden_states = self.experts(",
            ),
            (
                f"{SRT}/layers/moe/fused_moe_triton/layer.py",
                1062,
                "forward",
                "    return self.forward_impl(hidden_states, topk_output)",
            ),
            (
                f"{SRT}/layers/moe/fused_moe_triton/layer.py",
                1072,
                "forward_impl",
                "    combine_input = self.run_moe_core(",
            ),
            (f"{SRT}/layers/moe/moe_runner/triton.py", 93, "run", "    out = _fused_moe_kernel_sequence("),
            (
                f"{SRT}/layers/moe/moe_runner/triton_utils/fused_moe.py",
                478,
                "_fused_moe_kernel_sequence",
                "    intermediate_cache1 = torch.empty(",
            ),
        ]
        if mla
        else [
            (f"{SRT}/models/llama.py", 524, "forward", "    hidden_states = self.model("),
            (f"{SRT}/models/llama.py", 397, "forward", "    hidden_states, residual = layer("),
            (f"{SRT}/models/llama.py", 329, "forward", "    hidden_states = self.mlp(hidden_states)"),
            (f"{SRT}/models/llama.py", 117, "forward", "    gate_up, _ = self.gate_up_proj(x)"),
            (
                f"{SRT}/layers/linear.py",
                472,
                "forward",
                "    output_parallel = self.quant_method.apply(self, input_, bias)",
            ),
            (
                f"{SRT}/layers/quantization/unquant.py",
                160,
                "apply",
                "    return F.linear(x, layer.weight, bias)",
            ),
        ]
    )
    torch_frames = [
        (
            f"{SITE}/torch/nn/modules/module.py",
            1775,
            "_wrapped_call_impl",
            "    return self._call_impl(*args, **kwargs)",
        ),
        (
            f"{SITE}/torch/nn/modules/module.py",
            1786,
            "_call_impl",
            "    return forward_call(*args, **kwargs)",
        ),
    ]
    inner_frames = [
        (f"{SRT}/model_executor/cuda_graph_runner.py", 736, "__init__", "    self.capture()"),
        (f"{SRT}/model_executor/cuda_graph_runner.py", 918, "capture", "    _capture_one_stream()"),
        (
            f"{SRT}/model_executor/cuda_graph_runner.py",
            906,
            "_capture_one_stream",
            "  ) = self.capture_one_batch_size(bs, forward, stream_idx)",
        ),
        (f"{SRT}/model_executor/cuda_graph_runner.py", 1187, "capture_one_batch_size", "    run_once()"),
        (
            f"{SRT}/model_executor/cuda_graph_runner.py",
            1165,
            "run_once",
            "    logits_output_or_pp_proxy_tensors = forward(",
        ),
        (f"{SITE}/torch/utils/_contextlib.py", 120, "decorate_context", "    return func(*args, **kwargs)"),
    ]
    for i, frame in enumerate(model_frames[:-1]):
        inner_frames.append(frame)
        if i in (1, 2, 3):
            inner_frames.extend(torch_frames)
    inner_frames.append(model_frames[-1])

    lines = ["Traceback (most recent call last):"]
    lines += _frames(inner_frames)
    lines.append(f"torch.OutOfMemoryError: {oom_message}")
    lines.append("")
    lines.append("During handling of the above exception, another exception occurred:")
    lines.append("")
    lines.append("Traceback (most recent call last):")
    outer = list(_SCHEDULER_FRAMES)
    if draft:
        outer[2:] = [
            (f"{SRT}/managers/scheduler.py", 719, "init_model_worker", "    self.maybe_init_draft_worker()"),
            (
                f"{SRT}/managers/scheduler.py",
                703,
                "maybe_init_draft_worker",
                "    self.draft_worker = DraftWorkerClass(**draft_worker_kwargs)",
            ),
            (f"{SRT}/speculative/eagle_worker.py", 227, "__init__", "    self.init_cuda_graphs()"),
            (
                f"{SRT}/speculative/eagle_worker.py",
                289,
                "init_cuda_graphs",
                "    self.cuda_graph_runner = Device2DraftCudaGraphRunner[",
            ),
            (f"{SRT}/speculative/eagle_draft_cuda_graph_runner.py", 185, "__init__", "    raise Exception("),
        ]
    else:
        outer += [
            (f"{SRT}/model_executor/model_runner.py", 791, "initialize", "    self.init_device_graphs()"),
            (
                f"{SRT}/model_executor/model_runner.py",
                2965,
                "init_device_graphs",
                "    self.graph_runner = graph_runners[self.device](self)",
            ),
            (f"{SRT}/model_executor/cuda_graph_runner.py", 738, "__init__", "    raise Exception("),
        ]
    lines += _frames(outer)
    message = f"Exception: Capture cuda graph failed: {oom_message}\n{CUDA_GRAPH_CAPTURE_FAILED_MSG}"
    lines += message.split("\n")
    return lines
