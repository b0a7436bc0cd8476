"""The twin's GPU memory: what each rank holds in each startup phase, and `gpus.json` for nvidia-smi.

All sizes are bytes per rank. "Free" is what `torch.cuda.mem_get_info()` would report, and the numbers
SGLang prints ("GB", really GiB) are these divided by 2**30. The pool is sized with SGLang v0.5.12.post1's
own arithmetic (`_profile_available_bytes` + `DefaultPoolConfigurator.calculate_pool_sizes`), in floating
point like the original, from the min-over-ranks free memory before and after the weights.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from console.twin.scenarios import GIB, MIB, Scenario

KV_DTYPE_BYTES = {
    "auto": 2,
    "bf16": 2,
    "bfloat16": 2,
    "fp8_e5m2": 1,
    "fp8_e4m3": 1,
    "fp4_e2m1": 1,
}


def gib(nbytes: int | float) -> float:
    return nbytes / GIB


@dataclass
class RankMemory:
    """Bytes held on one GPU by the server, split the way the breakdown reports them."""

    context: int = 0
    dist: int = 0
    weights: int = 0
    kv_pool: int = 0
    pool_other: int = 0
    workspace: int = 0
    cuda_graphs: int = 0
    activations: int = 0

    def used(self) -> int:
        return (
            self.context
            + self.dist
            + self.weights
            + self.kv_pool
            + self.pool_other
            + self.workspace
            + self.cuda_graphs
            + self.activations
        )


@dataclass
class PoolPlan:
    """The outcome of SGLang's profiling for one launch (shared by all ranks)."""

    pre_min: float
    post_min: float
    profiled_tokens: int
    max_total_num_tokens: int
    max_running_requests: int
    context_len: int
    max_req_input_len: int
    cell_bytes: int
    kv_bytes: int
    k_bytes: int
    v_bytes: int
    req_to_token_bytes: int
    draft_kv_k_bytes: int
    capture_bs: list[int]
    graph_bytes: int
    draft_graph_bytes: int
    clamped_from: int | None = None


@dataclass
class GpuMemoryModel:
    """Per-rank memory of the simulated server for one launch."""

    scenario: Scenario
    tp_size: int
    mem_fraction_static: float
    kv_cache_dtype: str = "auto"
    ranks: list[RankMemory] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ranks = [RankMemory() for _ in range(self.tp_size)]

    # -------------------------------------------------------------- phase quantities
    @property
    def total(self) -> int:
        return self.scenario.gpu_total_bytes()

    @property
    def idle(self) -> int:
        return self.scenario.gpu_idle_used_mib * MIB

    def free(self, rank: int) -> int:
        return self.total - self.idle - self.ranks[rank].used()

    def free_gib(self, rank: int) -> float:
        return gib(self.free(rank))

    def min_free_gib(self) -> float:
        return min(self.free_gib(r) for r in range(self.tp_size))

    def context_bytes(self, rank: int) -> int:
        ctx = self.scenario.cuda_context_bytes
        return ctx[rank % len(ctx)]

    def dist_bytes(self, rank: int) -> int:
        """Distributed-init cost: calibrated so that free-after-init is `pre_free_bytes` at default TP."""
        sc = self.scenario
        pre = sc.pre_free_bytes[rank % len(sc.pre_free_bytes)]
        at_default = self.total - self.idle - self.context_bytes(rank) - pre
        delta = (sc.default_tp - self.tp_size) * sc.dist_init_extra_bytes_per_peer
        return max(at_default - delta, 16 * MIB)

    def weights_bytes(self) -> int:
        return self.scenario.weights_bytes_per_rank(self.tp_size)

    def cell_bytes(self) -> int:
        return self.scenario.kv_cell_bytes(self.tp_size, KV_DTYPE_BYTES.get(self.kv_cache_dtype, 2))

    # -------------------------------------------------------------- SGLang's sizing
    def plan_pool(self, args: dict[str, Any]) -> PoolPlan:
        """Profile like `_resolve_memory_pool_config`; call after the weights are resident on all ranks."""
        sc = self.scenario
        pre_min = min(
            gib(self.total - self.idle - self.context_bytes(r) - self.dist_bytes(r))
            for r in range(self.tp_size)
        )
        post_min = self.min_free_gib()
        rest = post_min - pre_min * (1 - self.mem_fraction_static)
        available_bytes = int(rest * (1 << 30))
        page = int(args["page_size"])
        cell = self.cell_bytes()
        profiled = available_bytes // cell // page * page
        tokens = profiled
        clamped_from: int | None = None
        user_cap = args.get("max_total_tokens")
        if user_cap is not None and profiled > 0:
            if user_cap > profiled:
                clamped_from = user_cap
            tokens = min(profiled, user_cap) // page * page

        context_len = int(args["context_length"] or sc.model_context_len)
        estimated = max(min(int(tokens / context_len * 512), 4096), 2048) if tokens > 0 else 2048
        if args.get("max_running_requests") is not None:
            mrr = min(int(args["max_running_requests"]) // int(args["dp_size"]), estimated)
        else:
            mrr = min(estimated, max(tokens // 2, 1))
        max_req_len = min(context_len - 1, tokens - 1)
        extra = int(args.get("speculative_num_draft_tokens") or 0)
        r2t = (mrr + 1) * (context_len + 4 + extra) * 4

        rows = tokens + page
        if sc.attention == "mla":
            kv = rows * cell
            k_bytes = v_bytes = 0
        else:
            k_bytes = v_bytes = rows * cell // 2
            kv = k_bytes + v_bytes
        draft = sc.draft if args.get("speculative_algorithm") else None
        draft_k = rows * draft.k_cell_bytes if draft is not None else 0

        capture = [bs for bs in args["cuda_graph_bs"] if bs <= mrr]
        if max(args["cuda_graph_bs"]) > mrr:
            capture.append(mrr)
        capture = sorted(set(capture))
        graph = sc.graph_bytes_base + sc.graph_bytes_per_bs * max(capture)
        draft_graph = (
            draft.graph_bytes_base + draft.graph_bytes_per_bs * max(capture)
            if draft is not None and draft_k
            else 0
        )
        return PoolPlan(
            pre_min=pre_min,
            post_min=post_min,
            profiled_tokens=profiled,
            max_total_num_tokens=tokens,
            max_running_requests=mrr,
            context_len=context_len,
            max_req_input_len=max_req_len - 5,
            cell_bytes=cell,
            kv_bytes=kv,
            k_bytes=k_bytes,
            v_bytes=v_bytes,
            req_to_token_bytes=r2t,
            draft_kv_k_bytes=draft_k,
            capture_bs=capture,
            graph_bytes=graph,
            draft_graph_bytes=draft_graph,
            clamped_from=clamped_from,
        )

    def capture_shortfall(self, rank: int, graph_bytes: int) -> int:
        """Bytes missing to capture graphs on this rank (<= 0: capture fits)."""
        sc = self.scenario
        need = graph_bytes + sc.capture_activation_peak_bytes + sc.capture_reserve_bytes
        return need - self.free(rank)


# ---------------------------------------------------------------------------------------- gpus.json
class GpuProcess(BaseModel):
    pid: int
    name: str
    used_mib: int


class GpuBreakdown(BaseModel):
    weights: int = 0
    kv_pool: int = 0
    cuda_graphs: int = 0
    other: int = 0


class GpuEntry(BaseModel):
    index: int
    name: str
    uuid: str
    memory_total_mib: int
    memory_used_mib: int
    utilization_pct: int
    processes: list[GpuProcess]
    breakdown_mib: GpuBreakdown


class GpuState(BaseModel):
    updated: float
    pid: int = 0
    gpus: list[GpuEntry]


def _mib(nbytes: int) -> int:
    return round(nbytes / MIB)


def build_gpu_state(
    scenario: Scenario,
    model: GpuMemoryModel | None,
    pid: int,
    utilization: int = 0,
) -> GpuState:
    """The state of every GPU of the host; GPUs beyond the server's TP ranks (or all, if None) are idle."""
    gpus: list[GpuEntry] = []
    for index in range(scenario.gpu_count):
        rank = model.ranks[index] if model is not None and index < len(model.ranks) else None
        held = rank.used() if rank is not None else 0
        processes = [GpuProcess(pid=pid, name="python3", used_mib=_mib(held))] if held > 0 else []
        breakdown = GpuBreakdown()
        if rank is not None and held > 0:
            weights = _mib(rank.weights)
            kv = _mib(rank.kv_pool)
            graphs = _mib(rank.cuda_graphs)
            breakdown = GpuBreakdown(
                weights=weights,
                kv_pool=kv,
                cuda_graphs=graphs,
                other=max(_mib(held) - weights - kv - graphs, 0),
            )
        gpus.append(
            GpuEntry(
                index=index,
                name=scenario.gpu_name,
                uuid=scenario.gpu_uuid(index),
                memory_total_mib=scenario.gpu_total_mib,
                memory_used_mib=scenario.gpu_idle_used_mib + _mib(held),
                utilization_pct=utilization if held > 0 else 0,
                processes=processes,
                breakdown_mib=breakdown,
            )
        )
    return GpuState(updated=time.time(), pid=pid, gpus=gpus)


GPU_LOCK = "gpus.lock"


def hold_gpus(state_dir: Path) -> int | None:
    """Take `gpus.lock` for the life of this process (the kernel drops it when the process dies, however
    it dies). Readers tell a live server's `gpus.json` from a dead one's by it: the server's pid cannot
    tell, as under a real systemd the server runs in a pid namespace of its own."""

    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / GPU_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def gpus_held(state_dir: Path) -> bool | None:
    """True while a server holds `gpus.lock`, False once none does, None where no server ever took it."""

    try:
        fd = os.open(state_dir / GPU_LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def write_gpu_state(state_dir: Path, state: GpuState) -> Path:
    """Write `gpus.json` atomically (a temp file in the same folder, then `os.replace`)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    target = state_dir / "gpus.json"
    fd, tmp = tempfile.mkstemp(prefix=".gpus.", suffix=".tmp", dir=state_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(state.model_dump(mode="json"), handle)
            handle.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def idle_gpu_state(scenario: Scenario) -> GpuState:
    """All GPUs of the scenario with nothing on them (what nvidia-smi shows before the server starts)."""
    return build_gpu_state(scenario, None, 0)
