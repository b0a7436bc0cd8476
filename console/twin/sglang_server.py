"""The twin's simulated SGLang server process: `python -m console.twin.sglang_server ARGS...`.

It reads its argv like `python -m sglang.launch_server` (v0.5.12.post1's real flag list), prints that
version's startup lines per TP rank with the restart timing scaled, sizes the KV pool from the scenario's
hidden constants, fails like SGLang fails (not enough memory, CUDA OOM during graph capture), then serves
SGLang's HTTP API on --host/--port until SIGTERM.

Twin-only settings come from the environment, so the argv stays SGLang's:
  K26_TWIN_SCENARIO      scenario name (default `kimi-k26-rtx6000`; see `console.twin.scenarios`)
  K26_TWIN_TIME_SCALE    multiplier of startup/prefill time (default 0.0167: a 5-minute restart in ~5 s)
  K26_TWIN_DECODE_SCALE  multiplier of decode time (default 1.0: decode runs in real time)
  K26_TWIN_STATE_DIR     where `gpus.json` is written (nothing is written when unset)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from console.twin.scenarios import Scenario, get_scenario
from console.twin.server_argspec import parse_argv, server_args_repr
from console.twin.server_engine import Engine, EngineConfig
from console.twin.server_http import TwinHttpServer
from console.twin.server_logs import (
    LogWriter,
    cuda_oom_message,
    cuda_oom_traceback,
    not_enough_memory_traceback,
    shard_progress_line,
    tqdm_line,
)
from console.twin.server_memory import (
    GpuMemoryModel,
    PoolPlan,
    build_gpu_state,
    gib,
    hold_gpus,
    write_gpu_state,
)
from console.twin.server_warmup import warmup

DEFAULT_TIME_SCALE = 0.0167
IMPORT_S = 5.0


class StartupFailed(Exception):
    """The launch failed the way SGLang's does (the lines are already printed)."""


@dataclass
class TwinEnv:
    scenario: Scenario
    time_scale: float
    decode_scale: float
    state_dir: Path | None

    @classmethod
    def from_environ(cls) -> TwinEnv:
        state = os.environ.get("K26_TWIN_STATE_DIR")
        return cls(
            scenario=get_scenario(os.environ.get("K26_TWIN_SCENARIO") or None),
            time_scale=_env_float("K26_TWIN_TIME_SCALE", DEFAULT_TIME_SCALE),
            decode_scale=_env_float("K26_TWIN_DECODE_SCALE", 1.0),
            state_dir=Path(state) if state else None,
        )


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return max(float(raw), 0.0)
    except ValueError:
        sys.stderr.write(f"{name}={raw!r} is not a number; using {default}\n")
        return default


class SimulatedServer:
    """One launch of the simulated server."""

    def __init__(self, env: TwinEnv, args: dict[str, Any]) -> None:
        self.env = env
        self.sc = env.scenario
        self.args = args
        self.tp = int(args["tp_size"])
        self.pid = os.getpid()
        self.log = LogWriter(tp_size=self.tp)
        self.mem = GpuMemoryModel(
            self.sc, self.tp, float(args["mem_fraction_static"]), args["kv_cache_dtype"]
        )
        self.plan: PoolPlan | None = None
        self.engine: Engine | None = None
        self.http: TwinHttpServer | None = None
        self.stop_event = asyncio.Event()
        self.utilization = 0
        self._rng = random.Random(self.pid)
        self.weight_usage_gib = 0.0
        self.graph_usage_gib = 0.0
        self._gpu_writer: asyncio.Task[None] | None = None
        self._gpu_hold = hold_gpus(env.state_dir) if env.state_dir is not None else None

    # ------------------------------------------------------------------ helpers
    async def sleep(self, real_seconds: float) -> None:
        """Sleep the scaled equivalent of `real_seconds` of a real launch (returns early on SIGTERM)."""
        delay = real_seconds * self.env.time_scale
        if delay <= 0:
            await asyncio.sleep(0)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self.stop_event.wait()
        if self.stop_event.is_set():
            raise asyncio.CancelledError

    def ranks_shuffled(self) -> list[int]:
        order = list(range(self.tp))
        self._rng.shuffle(order)
        return order

    def write_gpus(self) -> None:
        if self.env.state_dir is None:
            return
        with contextlib.suppress(OSError):
            write_gpu_state(
                self.env.state_dir, build_gpu_state(self.sc, self.mem, self.pid, self.utilization)
            )

    # ------------------------------------------------------------------ startup
    async def launch(self) -> None:
        args = self.args
        await self.sleep(IMPORT_S * 0.6)
        self.log.main(f"server_args={server_args_repr(args)}")
        if self.tp > self.sc.gpu_count:
            await self.sleep(IMPORT_S * 0.4)
            self._fail_invalid_device()
        await self.sleep(IMPORT_S * 0.4)

        # CUDA context per rank, then distributed init.
        for r in range(self.tp):
            self.mem.ranks[r].context = self.mem.context_bytes(r)
        self.utilization = 0
        self.write_gpus()
        for r in self.ranks_shuffled():
            self.log.rank(r, "Init torch distributed begin.")
        await self.sleep(self.sc.dist_init_s)
        for r in self.ranks_shuffled():
            self.mem.ranks[r].dist = self.mem.dist_bytes(r)
            elapsed = self.sc.dist_init_s * (0.97 + 0.05 * self._rng.random())
            self.log.rank(
                r,
                f"Init torch distributed ends. elapsed={elapsed:.2f} s, mem usage={gib(self.mem.ranks[r].dist):.2f} GB",
            )
        self.write_gpus()
        await self.sleep(0.6)

        await self._load_weights()
        await self._init_pool()
        await self._capture_graphs()
        if self.sc.draft is not None and args.get("speculative_algorithm"):
            await self._init_draft()
        self._summary()

    async def _load_weights(self) -> None:
        sc = self.sc
        for r in self.ranks_shuffled():
            self.log.rank(r, f"Load weight begin. avail mem={self.mem.free_gib(r):.2f} GB")
        shards = sc.num_weight_shards
        per = sc.weight_load_s / shards
        step = max(shards // 8, 1)
        weights = self.mem.weights_bytes()
        self.log.raw(shard_progress_line(0, shards, 0.0, per))
        done = 0
        while done < shards:
            n = min(step, shards - done)
            await self.sleep(per * n)
            done += n
            for r in range(self.tp):
                self.mem.ranks[r].weights = weights * done // shards
            self.utilization = 3
            self.write_gpus()
            self.log.raw(shard_progress_line(done, shards, per * done, per))
        self.log.raw(shard_progress_line(shards, shards, per * shards, per * 0.68))
        self.log.raw("")
        self.weight_usage_gib = gib(weights)
        quant = f"{sc.quant_str}, " if sc.quant_str else ""
        for r in self.ranks_shuffled():
            elapsed = sc.weight_load_s * (0.985 + 0.03 * self._rng.random())
            self.log.rank(
                r,
                f"Load weight end. elapsed={elapsed:.2f} s, type={sc.architecture}, {quant}"
                f"avail mem={self.mem.free_gib(r):.2f} GB, mem usage={gib(weights):.2f} GB.",
            )
        self.utilization = 0
        self.write_gpus()

    async def _init_pool(self) -> None:
        plan = self.mem.plan_pool(self.args)
        self.plan = plan
        if plan.clamped_from is not None:
            for r in self.ranks_shuffled():
                self.log.rank(
                    r,
                    f"max_total_tokens={plan.clamped_from} is larger than the profiled value "
                    f"{plan.profiled_tokens}. Use the profiled value instead.",
                )
        if plan.max_total_num_tokens <= 0:
            await self.sleep(0.2)
            ranks = self.ranks_shuffled()
            for r in ranks[:1]:
                self._scheduler_exception(r, not_enough_memory_traceback())
            self._sigquit()
            for r in ranks[1:]:
                self._scheduler_exception(r, not_enough_memory_traceback())
            raise StartupFailed
        await self.sleep(self.sc.pool_init_s)
        for r in self.ranks_shuffled():
            rank = self.mem.ranks[r]
            rank.kv_pool = plan.kv_bytes
            rank.pool_other = plan.req_to_token_bytes + self.sc.pool_misc_bytes
            if self.sc.attention == "mla":
                kv_line = f"KV Cache is allocated. #tokens: {plan.max_total_num_tokens}, KV size: {gib(plan.kv_bytes):.2f} GB"
            else:
                kv_line = (
                    f"KV Cache is allocated. #tokens: {plan.max_total_num_tokens}, "
                    f"K size: {gib(plan.k_bytes):.2f} GB, V size: {gib(plan.v_bytes):.2f} GB"
                )
            self.log.rank(r, kv_line)
            self.log.rank(r, f"Memory pool end. avail mem={self.mem.free_gib(r):.2f} GB")
        self.write_gpus()

    async def _capture_graphs(self) -> None:
        assert self.plan is not None
        plan = self.plan
        sc = self.sc
        if self.args.get("disable_cuda_graph"):
            for r in range(self.tp):
                self.mem.ranks[r].workspace = sc.attn_workspace_bytes
            return
        await self.sleep(0.8)
        for r in range(self.tp):
            self.mem.ranks[r].workspace = sc.attn_workspace_bytes
        before = {r: self.mem.free_gib(r) for r in range(self.tp)}
        for r in self.ranks_shuffled():
            self.log.rank(
                r,
                f"Capture cuda graph begin. This can take up to several minutes. avail mem={before[r]:.2f} GB",
            )
        self.log.rank(0, f"Capture cuda graph bs {plan.capture_bs}")
        self.utilization = 45
        self.write_gpus()
        await self._capture_progress(plan.capture_bs, plan.graph_bytes, draft=False)
        elapsed = 2.0 + sc.graph_capture_s_per_bs * len(plan.capture_bs)
        for r in self.ranks_shuffled():
            self.mem.ranks[r].cuda_graphs = plan.graph_bytes
            after = self.mem.free_gib(r)
            self.log.rank(
                r,
                f"Capture cuda graph end. Time elapsed: {elapsed * (0.98 + 0.04 * self._rng.random()):.2f} s. "
                f"mem usage={before[r] - after:.2f} GB. avail mem={after:.2f} GB.",
            )
        self.graph_usage_gib = gib(plan.graph_bytes)
        if not self.args.get("disable_piecewise_cuda_graph"):
            await self._capture_piecewise()
        self.utilization = 0
        self.write_gpus()

    async def _capture_piecewise(self) -> None:
        tokens = list(self.args["piecewise_cuda_graph_tokens"])
        extra = 8 * len(tokens) * (1 << 20) // 2
        before = {r: self.mem.free_gib(r) for r in range(self.tp)}
        for r in self.ranks_shuffled():
            self.log.rank(r, f"Capture piecewise CUDA graph begin. avail mem={before[r]:.2f} GB")
        elapsed = 0.12 * len(tokens)
        desc = f"Capturing num tokens (num_tokens={max(tokens)} avail_mem={before[0]:.2f} GB)"
        self.log.raw(tqdm_line(desc, 0, len(tokens), 0.0))
        await self.sleep(elapsed)
        self.log.raw(tqdm_line(desc, len(tokens), len(tokens), elapsed))
        for r in self.ranks_shuffled():
            self.mem.ranks[r].cuda_graphs += extra
            after = self.mem.free_gib(r)
            self.log.rank(
                r,
                f"Capture piecewise CUDA graph end. Time elapsed: {elapsed:.2f} s. "
                f"mem usage={before[r] - after:.2f} GB. avail mem={after:.2f} GB.",
            )

    async def _capture_progress(self, capture_bs: list[int], graph_bytes: int, draft: bool) -> None:
        """tqdm lines of rank 0, largest batch first; the OOM check happens on the first (largest) bs."""
        sc = self.sc
        order = list(reversed(capture_bs))
        total = len(order)
        per = sc.graph_capture_s_per_bs
        desc = "Capturing batches (bs={bs} avail_mem={mem:.2f} GB)"
        self.log.raw(tqdm_line(desc.format(bs=order[0], mem=self.mem.free_gib(0)), 0, total, 0.0))
        short = {r: self.mem.capture_shortfall(r, graph_bytes) for r in range(self.tp)}
        failing = sorted((r for r in range(self.tp) if short[r] > 0), key=lambda r: self.mem.free(r))
        if failing:
            await self.sleep(per * 1.5)
            self._fail_oom(failing, draft, graph_bytes)
        step_every = max(total // 6, 1)
        for i, bs in enumerate(order, start=1):
            await self.sleep(per)
            for r in range(self.tp):
                self.mem.ranks[r].cuda_graphs = (self.mem.ranks[r].cuda_graphs if draft else 0) + (
                    graph_bytes * i // total if not draft else 0
                )
            if i % step_every == 0 or i == total:
                mem = self.mem.free_gib(0)
                self.log.raw(tqdm_line(desc.format(bs=bs, mem=mem), i, total, per * i))
        self.log.raw("")

    async def _init_draft(self) -> None:
        assert self.plan is not None and self.sc.draft is not None
        draft = self.sc.draft
        plan = self.plan
        for r in self.ranks_shuffled():
            self.log.rank(r, f"Load weight begin. avail mem={self.mem.free_gib(r):.2f} GB")
        await self.sleep(draft.load_s)
        for r in self.ranks_shuffled():
            self.mem.ranks[r].weights += draft.weights_bytes_per_rank
            self.log.rank(
                r,
                f"Load weight end. elapsed={draft.load_s * (0.97 + 0.06 * self._rng.random()):.2f} s, "
                f"type={draft.architecture}, avail mem={self.mem.free_gib(r):.2f} GB, "
                f"mem usage={gib(draft.weights_bytes_per_rank):.2f} GB.",
            )
        self.write_gpus()
        await self.sleep(0.3)
        size = gib(plan.draft_kv_k_bytes)
        for r in self.ranks_shuffled():
            self.mem.ranks[r].kv_pool += 2 * plan.draft_kv_k_bytes
            self.log.rank(
                r,
                f"KV Cache is allocated. #tokens: {plan.max_total_num_tokens}, K size: {size:.2f} GB, V size: {size:.2f} GB",
            )
            self.log.rank(r, f"Memory pool end. avail mem={self.mem.free_gib(r):.2f} GB")
        self.write_gpus()
        await self.sleep(0.5)
        for label in ("draft cuda graph", "draft extend cuda graph"):
            graph = plan.draft_graph_bytes if label == "draft cuda graph" else plan.draft_graph_bytes // 3
            before = {r: self.mem.free_gib(r) for r in range(self.tp)}
            for r in self.ranks_shuffled():
                self.log.rank(
                    r,
                    f"Capture {label} begin. This can take up to several minutes. avail mem={before[r]:.2f} GB",
                )
            failing = sorted(
                (r for r in range(self.tp) if self.mem.capture_shortfall(r, graph) > 0), key=self.mem.free
            )
            if failing:
                await self.sleep(1.0)
                self._fail_oom(failing, draft=True, graph_bytes=graph)
            elapsed = 1.0 + 0.2 * len(plan.capture_bs)
            await self.sleep(elapsed)
            for r in self.ranks_shuffled():
                self.mem.ranks[r].cuda_graphs += graph
                after = self.mem.free_gib(r)
                self.log.rank(
                    r,
                    f"Capture {label} end. Time elapsed: {elapsed:.2f} s. mem usage={before[r] - after:.2f} GB. "
                    f"avail mem={after:.2f} GB.",
                )
            self.write_gpus()

    def _summary(self) -> None:
        assert self.plan is not None
        p = self.plan
        self.log.rank(
            0,
            f"max_total_num_tokens={p.max_total_num_tokens}, chunked_prefill_size={self.args['chunked_prefill_size']}, "
            f"max_prefill_tokens={self.args['max_prefill_tokens']}, max_running_requests={p.max_running_requests}, "
            f"context_len={p.context_len}, available_gpu_mem={self.mem.free_gib(0):.2f} GB",
        )

    # ------------------------------------------------------------------ failures
    def _scheduler_exception(self, rank: int, lines: list[str]) -> None:
        self.log.rank(rank, f"Scheduler hit an exception: {lines[0]}")
        for line in lines[1:]:
            self.log.raw(line)
        self.log.raw("")

    def _sigquit(self) -> None:
        self.log.main("Received sigquit from a child process. It usually means the child failed.")

    def _fail_oom(self, failing: list[int], draft: bool, graph_bytes: int) -> None:
        sc = self.sc
        total_gib = gib(sc.gpu_total_bytes())
        tried = sc.capture_activation_peak_bytes // 2
        for i, r in enumerate(failing):
            # What is left when the failing allocation is made: the graphs and the rest of the activations
            # are already allocated; negative room means the allocator could not even get this far.
            room = (
                self.mem.free(r)
                - graph_bytes
                - (sc.capture_activation_peak_bytes - tried)
                - sc.capture_reserve_bytes
            )
            free = min(max(room, 0) + (18 + 7 * r) * (1 << 20), tried - (1 << 20))
            in_use = gib(sc.gpu_total_bytes() - sc.gpu_idle_used_mib * (1 << 20) - free)
            msg = cuda_oom_message(r, gib(tried), total_gib, free / (1 << 20), in_use)
            self._scheduler_exception(r, cuda_oom_traceback(msg, sc.attention == "mla", draft))
            if i == 0:
                self._sigquit()
        raise StartupFailed

    def _fail_invalid_device(self) -> None:
        lines = [
            "Traceback (most recent call last):",
            '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 4025, in run_scheduler_process',
            "    scheduler = Scheduler(",
            "torch.AcceleratorError: CUDA error: invalid device ordinal",
            "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
            "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
        ]
        self._scheduler_exception(self.sc.gpu_count, lines)
        self._sigquit()
        raise StartupFailed

    # ------------------------------------------------------------------ serving
    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.args["model_path"],
            "tokenizer_path": self.args["tokenizer_path"],
            "is_generation": True,
            "preferred_sampling_params": self.args["preferred_sampling_params"],
            "weight_version": self.args["weight_version"],
            "has_image_understanding": self.sc.is_multimodal,
            "has_audio_understanding": False,
            "model_type": self.sc.model_type,
            "architectures": [self.sc.architecture],
        }

    def internal_state(self) -> dict[str, Any]:
        assert self.plan is not None
        engine = self.engine
        return {
            **self.args,
            "last_gen_throughput": engine.last_gen_throughput if engine else 0.0,
            "memory_usage": {
                "weight": round(self.weight_usage_gib, 2),
                "kvcache": round(gib(self.plan.kv_bytes), 2),
                "token_capacity": int(self.plan.max_total_num_tokens),
                "graph": round(self.graph_usage_gib, 2),
            },
            "effective_max_running_requests_per_dp": self.plan.max_running_requests,
        }

    async def serve(self) -> None:
        assert self.plan is not None
        p = self.plan
        args = self.args
        self.engine = Engine(
            self.sc,
            EngineConfig(
                max_total_num_tokens=p.max_total_num_tokens,
                max_running_requests=p.max_running_requests,
                context_len=p.context_len,
                max_req_input_len=p.max_req_input_len,
                chunked_prefill_size=int(args["chunked_prefill_size"]),
                max_prefill_tokens=int(args["max_prefill_tokens"]),
                decode_log_interval=int(args["decode_log_interval"]),
                tp_size=self.tp,
                time_scale=self.env.time_scale,
                decode_scale=self.env.decode_scale,
                disable_radix_cache=bool(args["disable_radix_cache"]),
                served_model_name=str(args["served_model_name"]),
                page_size=int(args["page_size"]),
            ),
            self.log,
        )
        self.engine.start()
        self.http = TwinHttpServer(
            lambda: self.engine,
            server_args=args,
            scheduler_info={
                "status": "ready",
                "max_total_num_tokens": p.max_total_num_tokens,
                "max_req_input_len": p.max_req_input_len,
            },
            model_info=self.model_info(),
            internal_state=self.internal_state,
            log_main=self.log.main,
        )
        await self.sleep(self.sc.http_start_s * 0.5)
        host, port = str(args["host"]), int(args["port"])
        try:
            await self.http.start(host, port)
        except OSError as exc:
            self.log.main(
                f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address ({host!r}, {port}): {exc.strerror}"
            )
            raise StartupFailed from exc
        self.log.main(f"INFO:     Started server process [{self.pid}]")
        self.log.main("INFO:     Waiting for application startup.")
        self.log.main("INFO:     Application startup complete.")
        self.log.main(f"INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")
        self._gpu_writer = asyncio.get_running_loop().create_task(self._gpu_loop())
        if not args["skip_server_warmup"]:
            await self.sleep(self.sc.http_start_s * 0.5)
            await asyncio.get_running_loop().run_in_executor(None, self._warmup, host, port)
        self.http.ready = True
        self.log.main("The server is fired up and ready to roll!")
        await self.stop_event.wait()

    def _warmup(self, host: str, port: int) -> None:
        warmup(
            host,
            port,
            multimodal=self.sc.is_multimodal,
            served_model_name=str(self.args["served_model_name"]),
        )

    async def _gpu_loop(self) -> None:
        while True:
            engine = self.engine
            busy = engine is not None and engine.busy()
            self.utilization = 100 if busy else 0
            self.write_gpus()
            await asyncio.sleep(1.0)

    async def shutdown(self) -> None:
        if self.http is not None:
            self.http.shutting_down = True
        if self._gpu_writer is not None:
            self._gpu_writer.cancel()
        if self.engine is not None:
            await self.engine.stop()
        if self.http is not None:
            await self.http.close()


async def _amain(env: TwinEnv, args: dict[str, Any]) -> int:
    server = SimulatedServer(env, args)
    loop = asyncio.get_running_loop()
    sigterm = {"seen": False}

    def on_sigterm() -> None:
        if sigterm["seen"]:
            return
        sigterm["seen"] = True
        if server.http is not None:
            server.log.main(
                "SIGTERM received. signum=None frame=None. Draining requests and shutting down..."
            )
        server.stop_event.set()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    loop.add_signal_handler(signal.SIGINT, on_sigterm)
    try:
        await server.launch()
        await server.serve()
    except StartupFailed:
        await server.shutdown()
        return -signal.SIGKILL
    except asyncio.CancelledError:
        pass
    if server.http is not None:
        engine = server.engine
        remaining = [r.rid for r in (engine.running + list(engine.waiting))] if engine else []
        server.log.main(
            f"Gracefully exiting... Remaining number of requests {len(remaining)}. Remaining requests remaining_rids={remaining}."
        )
        server.log.main("INFO:     Shutting down")
        await server.shutdown()
        server.log.main("INFO:     Waiting for application shutdown.")
        server.log.main("INFO:     Application shutdown complete.")
        server.log.main(f"INFO:     Finished server process [{server.pid}]")
    else:
        await server.shutdown()
    return 0


def write_idle_gpus(env: TwinEnv) -> None:
    """GPUs back to idle: what nvidia-smi shows once the server process is gone."""
    if env.state_dir is None:
        return
    with contextlib.suppress(OSError):
        write_gpu_state(env.state_dir, build_gpu_state(env.scenario, None, os.getpid()))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        env = TwinEnv.from_environ()
    except KeyError as exc:
        sys.stderr.write(f"{exc.args[0]}\n")
        return 2
    args = parse_argv(argv, env.scenario)  # exits 2 with argparse's usage + error on bad flags
    try:
        code = asyncio.run(_amain(env, args))
    finally:
        write_idle_gpus(env)
    if code < 0:
        # SGLang's launch-phase SIGQUIT handler kills the whole process tree, itself included.
        sys.stdout.flush()
        os.kill(os.getpid(), -code)
        time.sleep(1)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
