"""GPU samplers: one batched `HostGpuSample` per tick, from whichever back-end the host allows.

Three back-ends, one interface (`GpuSampler.sample()`), chosen automatically by `open_sampler`:

- `NvmlSampler` — local NVML through nvidia-ml-py, when the console runs on the GPU host itself. NVML
  calls block (a GPU in trouble can take seconds to answer), so they run in a worker thread.
- `AgentSampler` — the same NVML reading, run on the remote host as `python3 -c SCRIPT` over SSH; the
  script prints one JSON sample per tick (nvidia-ml-py ships with SGLang, so the host's python3 usually
  has it). One long-lived channel instead of a command per tick.
- `NvidiaSmiSampler` — `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` and
  `--query-compute-apps=...`, the fallback that needs nothing but the driver, run per tick (locally).
- `NvidiaSmiStreamSampler` — the same two queries over SSH from one long-lived `sh` loop on the host:
  a command per tick cost two SSH channels a second (open, exec, close: about a quarter of the
  console's idle CPU) where one channel's lines now do.

The NVML reading code exists once (`_nvml_start`, `_nvml_sample` below): the local sampler calls it, and
the agent script is built from its source text, so both back-ends report the same fields the same way.
A missing NVML (`NVMLError_LibraryNotFound`) is the state `nvml_missing`, never an exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Literal, Protocol

from console.core.amd import (
    AMD_SMI_HEALTH_ARGV,
    AMD_SMI_METRIC_ARGV,
    AMD_SMI_PROCESS_ARGV,
    AMD_SMI_STATIC_ARGV,
    AMD_SMI_STATIC_HEALTH_ARGV,
    ROCM_SMI_ARGV,
    AmdFormatError,
    parse_amd_smi,
    parse_rocm_smi,
)
from console.core.gpus import (
    APPS_QUERY_FIELDS,
    SMI_QUERY_FIELDS,
    HostGpuSample,
    SamplerState,
    nvidia_smi_lost,
    parse_nvidia_smi_gpus,
    sample_from_agent_line,
    smi_fields_without,
)
from console.sources.bounded import CutLine, stream_lines
from console.sources.gpu_agent import (
    _nvml_sample,
    _nvml_start,
    _nvml_xid_wait,
    _nvml_xid_watch,
    agent_argv,
    nvidia_smi_apps_argv,
    nvidia_smi_argv,
)
from console.sources.transport import CommandResult, Transport, TransportError

MIN_INTERVAL_S = 0.25
DEFAULT_INTERVAL_S = 1.0
LINE_MAX_BYTES = 1 << 20
"""The longest line read from a GPU stream (1 MiB): the agent's sample of 64 GPUs with their processes is a
few tens of KB. A longer line is not read; its tick is an error sample saying so."""

BackendChoice = Literal["auto", "nvml", "agent", "nvidia-smi", "amd-smi"]


# ---- samplers -----------------------------------------------------------------------------------------


class GpuSampler(Protocol):
    # Read-only in the protocol: each sampler narrows it to its own literal.
    @property
    def backend(self) -> Literal["nvml", "agent", "nvidia-smi", "amd-smi", "rocm-smi"]: ...
    @property
    def self_paced(self) -> bool:
        """True when the host keeps the schedule (a stream): waiting for its next sample is the tick."""
        ...

    async def sample(self) -> HostGpuSample: ...

    async def close(self) -> None: ...


class Runner(Protocol):
    async def run(self, argv: Sequence[str], *, timeout: float | None = ...) -> CommandResult: ...


class LocalRunner:
    """Runs a command on this machine with the same result type as `Transport.run`."""

    async def run(self, argv: Sequence[str], *, timeout: float | None = 30.0) -> CommandResult:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except FileNotFoundError:
            return CommandResult(argv=tuple(argv), exit_status=127, stdout="", stderr=f"{argv[0]}: not found")
        try:
            async with asyncio.timeout(timeout):
                out, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise TransportError(f"{argv[0]} did not finish within {timeout:g} s") from None
        return CommandResult(
            argv=tuple(argv),
            exit_status=proc.returncode,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
        )


def _stamp(sample: HostGpuSample, host: str | None) -> HostGpuSample:
    # Receipt time on the console's clock: remote clocks drift, and a sample is "now" when it arrives.
    return sample.model_copy(update={"ts": time.time(), "host": host})


class NvmlSampler:
    """Local NVML. `nvml` is the pynvml module, or a stand-in object with the same functions (tests)."""

    backend: Literal["nvml"] = "nvml"
    self_paced = False

    def __init__(self, nvml: Any = None, *, host: str | None = None) -> None:
        self._nvml = nvml
        self._host = host
        self._failed: dict[str, Any] | None = None
        self._started = False
        self._events: Any = None
        self._xids: list[list[Any]] = []

    def _read(self) -> dict[str, Any]:
        if not self._started:
            if self._nvml is None:
                try:
                    import pynvml
                except ImportError:
                    return {"state": "nvml_missing", "detail": "nvidia-ml-py is not installed."}
                self._nvml = pynvml
            self._failed = _nvml_start(self._nvml)
            self._started = True
            if self._failed is None:
                self._events = _nvml_xid_watch(self._nvml)
        if self._failed is not None:
            return self._failed
        # The XID events since the last tick (none waited for: the poller keeps the schedule).
        if self._events is not None and not _nvml_xid_wait(self._nvml, self._events, 0.0, self._xids):
            self._events = None
        return _nvml_sample(self._nvml, self._xids)

    async def sample(self) -> HostGpuSample:
        data = await asyncio.to_thread(self._read)
        return HostGpuSample.model_validate(
            {**data, "backend": "nvml", "host": self._host, "ts": time.time()}
        )

    async def close(self) -> None:
        if self._started and self._failed is None and self._nvml is not None:
            if self._events is not None:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self._nvml.nvmlEventSetFree, self._events)
                self._events = None
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._nvml.nvmlShutdown)
        self._started = False


class NvidiaSmiSampler:
    """`nvidia-smi` run per tick (both queries at once), locally or over SSH. An older driver that refuses
    a field is asked again without it (or by its older name) at once, and from then on."""

    backend: Literal["nvidia-smi"] = "nvidia-smi"
    self_paced = False

    def __init__(self, runner: Runner, *, host: str | None = None, timeout_s: float = 10.0) -> None:
        self._runner = runner
        self._host = host
        self.timeout_s = timeout_s
        self.fields: tuple[str, ...] = SMI_QUERY_FIELDS
        """The --query-gpu fields this host's nvidia-smi takes, as learned."""

    def _sample(self, state: SamplerState, detail: str | None = None, **fields: Any) -> HostGpuSample:
        return HostGpuSample(
            state=state, backend="nvidia-smi", detail=detail, host=self._host, ts=time.time(), **fields
        )

    async def sample(self) -> HostGpuSample:
        try:
            gpus, apps = await asyncio.gather(
                self._runner.run(nvidia_smi_argv(self.fields), timeout=self.timeout_s),
                self._runner.run(nvidia_smi_apps_argv(), timeout=self.timeout_s),
            )
            for _ in range(len(SMI_QUERY_FIELDS)):
                fewer = None if gpus.ok else smi_fields_without(self.fields, gpus.stdout + gpus.stderr)
                if fewer is None:
                    break
                self.fields = fewer
                gpus = await self._runner.run(nvidia_smi_argv(self.fields), timeout=self.timeout_s)
        except TransportError as exc:
            return self._sample(SamplerState.ERROR, f"{exc}.")
        return nvidia_smi_sample(gpus, apps, self._host, self.fields)

    async def close(self) -> None:
        return None


def nvidia_smi_sample(
    gpus: CommandResult,
    apps: CommandResult,
    host: str | None,
    fields: tuple[str, ...] = SMI_QUERY_FIELDS,
) -> HostGpuSample:
    """One sample from the two queries' results (`fields` the GPU query's): GPUs with their processes,
    or what went wrong."""

    def sample(state: SamplerState, detail: str | None = None, **fields: Any) -> HostGpuSample:
        return HostGpuSample(
            state=state, backend="nvidia-smi", detail=detail, host=host, ts=time.time(), **fields
        )

    said_all = gpus.stdout + "\n" + gpus.stderr
    if not gpus.ok and nvidia_smi_lost(said_all):
        # A GPU fell off the bus: nvidia-smi fails, but names it, and still lists the others.
        apps_text = apps.stdout if apps.ok else apps.stdout + "\n" + apps.stderr
        parsed = parse_nvidia_smi_gpus(said_all, apps_text, fields)
        return sample(SamplerState.OK, gpus=tuple(parsed))
    if not gpus.ok:
        said = gpus.first_error_line()
        lower = said.lower()
        if gpus.exit_status == 127 or "not found" in lower:
            return sample(SamplerState.NVML_MISSING, "nvidia-smi is not installed on the host.")
        if "no devices were found" in lower:
            return sample(SamplerState.NO_GPUS, "nvidia-smi found no GPUs.")
        if "couldn't communicate with the nvidia driver" in lower or "nvml" in lower:
            return sample(SamplerState.NVML_MISSING, f"nvidia-smi cannot reach the driver: {said}.")
        return sample(SamplerState.ERROR, f"nvidia-smi failed: {said}.")
    parsed = parse_nvidia_smi_gpus(gpus.stdout, apps.stdout if apps.ok else "", fields)
    if not parsed:
        return sample(SamplerState.NO_GPUS, "nvidia-smi lists no GPUs.")
    return sample(SamplerState.OK, gpus=tuple(parsed))


class AmdSmiSampler:
    """An AMD host's GPUs, per tick: `amd-smi metric … --json` with its health sections and `amd-smi
    process --json` (the names, PCIe maxima, power cap and slowdown points from `amd-smi static --asic
    --bus --limit --json`, read once), or `rocm-smi … --json` where amd-smi is not installed (ROCm
    before 6). An amd-smi that refuses an option (argparse's exit status 2: an older one, or a platform
    without it) is asked without it from then on. Commands per tick, locally or over SSH (NVIDIA's
    nvidia-smi loop streams instead)."""

    self_paced = False

    def __init__(self, runner: Runner, *, host: str | None = None, timeout_s: float = 10.0) -> None:
        self._runner = runner
        self._host = host
        self.timeout_s = timeout_s
        self.backend: Literal["amd-smi", "rocm-smi"] = "amd-smi"
        self._names: str | None = None
        """`amd-smi static … --json`'s answer, once read."""
        self.metric_argv: tuple[str, ...] = AMD_SMI_HEALTH_ARGV
        self.processes = True
        """False once `amd-smi process` refused: the samples then have no processes."""

    def _sample(self, state: SamplerState, detail: str | None = None, **fields: Any) -> HostGpuSample:
        return HostGpuSample(
            state=state, backend=self.backend, detail=detail, host=self._host, ts=time.time(), **fields
        )

    @staticmethod
    def _missing(result: CommandResult) -> bool:
        return result.exit_status == 127 or "not found" in result.first_error_line().lower()

    async def _run(self, argv: Sequence[str]) -> CommandResult:
        return await self._runner.run(argv, timeout=self.timeout_s)

    async def _amd_smi(self) -> tuple[CommandResult, str]:
        """The metric reading and the process list (empty when not read) of this tick."""
        procs: CommandResult | None = None
        if self.processes:
            result, procs = await asyncio.gather(self._run(self.metric_argv), self._run(AMD_SMI_PROCESS_ARGV))
        else:
            result = await self._run(self.metric_argv)
        if result.exit_status == 2 and self.metric_argv != AMD_SMI_METRIC_ARGV:
            self.metric_argv = AMD_SMI_METRIC_ARGV  # an option it does not know: without them
            result = await self._run(self.metric_argv)
        if procs is not None and procs.exit_status == 2:
            self.processes = False
        if result.ok and self._names is None:
            names = await self._run(AMD_SMI_STATIC_HEALTH_ARGV)
            if names.exit_status == 2:
                names = await self._run(AMD_SMI_STATIC_ARGV)
            self._names = names.stdout if names.ok else ""
        return result, procs.stdout if procs is not None and procs.ok else ""

    async def sample(self) -> HostGpuSample:
        processes = ""
        try:
            if self.backend == "amd-smi":
                result, processes = await self._amd_smi()
                if self._missing(result):
                    self.backend = "rocm-smi"  # an older ROCm: from now on
            if self.backend == "rocm-smi":
                result = await self._run(ROCM_SMI_ARGV)
                if self._missing(result):
                    return self._sample(
                        SamplerState.NVML_MISSING, "neither amd-smi nor rocm-smi is installed on the host."
                    )
        except TransportError as exc:
            return self._sample(SamplerState.ERROR, f"{exc}.")
        if not result.ok:
            return self._sample(SamplerState.ERROR, f"{self.backend} failed: {result.first_error_line()}.")
        try:
            if self.backend == "amd-smi":
                try:
                    gpus = parse_amd_smi(result.stdout, self._names or "", processes)
                except AmdFormatError:
                    gpus = parse_amd_smi(result.stdout, self._names or "")  # a process list it cannot read
            else:
                gpus = parse_rocm_smi(result.stdout)
        except AmdFormatError as exc:
            return self._sample(SamplerState.ERROR, str(exc))
        if not gpus:
            return self._sample(SamplerState.NO_GPUS, f"{self.backend} lists no GPUs.")
        return self._sample(SamplerState.OK, gpus=tuple(gpus))

    async def close(self) -> None:
        return None


SMI_MARK = "@@k26-nvidia-smi"
SMI_BLOCK_LINES = 4096
"""A block longer than this is not nvidia-smi's answer (a GPU per line, a process per line)."""


def nvidia_smi_loop_argv(interval_s: float, fields: tuple[str, ...] = SMI_QUERY_FIELDS) -> list[str]:
    """`sh -c LOOP`: each tick, both queries in the background, each followed by a mark line with its
    exit status, while the loop sleeps `interval_s`; then it waits for them. A tick is the interval, or
    the queries' time when they take longer (sh has no sub-second clock: this is how it keeps time).
    The loop itself writes a `tick` mark each turn, so it dies of SIGPIPE once its channel is gone.
    A `sleep` without fractions (POSIX asks only for whole seconds) refuses `0.25`: the loop then ticks
    every second rather than ending."""
    gpu, apps = shlex.join(nvidia_smi_argv(fields)), shlex.join(nvidia_smi_apps_argv())
    loop = (
        f'while echo "{SMI_MARK} tick"; do '
        f'{{ {gpu} 2>&1; echo "{SMI_MARK} gpu $?"; {apps} 2>&1; echo "{SMI_MARK} apps $?"; }} & '
        '{ sleep "$1" 2>/dev/null || sleep 1; } || exit 1; wait; done'
    )
    return ["sh", "-c", loop, "k26-nvidia-smi", f"{interval_s:g}"]


class NvidiaSmiBlocks:
    """Turns the loop's lines back into the two queries' results, one pair per tick (no I/O); `fields`
    are the loop's GPU query's."""

    def __init__(self, fields: tuple[str, ...] = SMI_QUERY_FIELDS) -> None:
        self.fields = fields
        self._lines: list[str] = []
        self._gpus: CommandResult | None = None

    def feed(self, raw: bytes) -> tuple[CommandResult, CommandResult] | None:
        """Take one line; the (gpus, apps) results when it closes a tick, else None."""
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line.startswith(SMI_MARK):
            if len(self._lines) >= SMI_BLOCK_LINES:
                raise ValueError(f"nvidia-smi wrote over {SMI_BLOCK_LINES} lines without finishing a query")
            self._lines.append(line)
            return None
        _, which, status = [*line.split(), "", ""][:3]
        if which == "tick":
            return None
        exit_status = int(status) if status.isdigit() else None
        lines = self._lines
        if exit_status == 0:
            # stderr is merged into the block (an unread stderr would fill the channel's window and stall
            # the loop): a warning line among the rows is not a row, and rows have all their commas.
            width = len(self.fields if which == "gpu" else APPS_QUERY_FIELDS)
            lines = [x for x in lines if x.count(",") >= width - 1]
        result = CommandResult(
            argv=tuple(nvidia_smi_argv(self.fields) if which == "gpu" else nvidia_smi_apps_argv()),
            exit_status=exit_status,
            stdout="".join(x + "\n" for x in lines),
            stderr="",
        )
        self._lines = []
        if which == "gpu":
            self._gpus = result
            return None
        gpus, self._gpus = self._gpus, None
        return (gpus, result) if gpus is not None else None


class _AskAgain(Exception):
    """A stream's reader found that the host needs another command (nvidia-smi refused a field)."""


class _StreamSampler:
    """A sampler fed by one long-lived command on the host over SSH, a sample per line or block.

    `sample()` waits for the next sample; when none comes within the patience window (a hung host or
    driver) it returns an error sample on time instead of blocking the tick. Only the newest samples
    are kept. A dropped channel is restarted on the next call once the transport is up again.
    """

    backend: Literal["agent", "nvidia-smi"]
    self_paced = True
    what = "the GPU stream"
    """How the messages name the command."""

    def __init__(
        self, transport: Transport, *, interval_s: float = DEFAULT_INTERVAL_S, patience_s: float | None = None
    ) -> None:
        self.transport = transport
        self.interval_s = max(MIN_INTERVAL_S, interval_s)
        self._own_patience = patience_s is None
        self.patience_s = patience_s if patience_s is not None else max(3.0, 3 * self.interval_s)
        self._samples: asyncio.Queue[HostGpuSample | None] = asyncio.Queue(maxsize=4)
        self._reader: asyncio.Task[None] | None = None
        self._retired: set[asyncio.Task[None]] = set()
        """Streams replaced by `retune`: their end is not news (no error sample)."""
        self._last_exit: str | None = None
        self.streams_started = 0

    @property
    def _host(self) -> str:
        return self.transport.host.name

    def argv(self) -> list[str]:
        raise NotImplementedError

    def reader(self) -> Callable[[bytes], HostGpuSample | None]:
        """A fresh line → sample (or None while a sample is incomplete) for each stream started."""
        raise NotImplementedError

    def _put(self, item: HostGpuSample | None) -> None:
        if self._samples.full():
            # Keep only the newest: an old GPU sample has no value.
            with contextlib.suppress(asyncio.QueueEmpty):
                self._samples.get_nowait()
        self._samples.put_nowait(item)

    async def _read(self) -> None:
        self.streams_started += 1
        take = self.reader()
        again = False
        try:
            async with self.transport.stream(self.argv(), timeout=10) as stream:
                async for lines in stream_lines(stream, LINE_MAX_BYTES):
                    for line in lines:
                        sample: HostGpuSample | None
                        if type(line) is CutLine:
                            # not read: a line this long is no sample of a host's GPUs
                            sample = self._error(
                                f"{self.what} sent a line of {line.size:,} bytes, over the "
                                f"{LINE_MAX_BYTES:,}-byte limit: not read."
                            )
                        else:
                            sample = take(line)
                        if sample is not None:
                            self._put(sample)
                status = await stream.wait(2.0)
                text = (await stream.stderr_text()).strip().split("\n")
                self._last_exit = f"{self.what} ended (exit status {status})" + (
                    f": {text[-1]}" if text[-1] else ""
                )
        except _AskAgain:
            again = True
        except (ValueError, TransportError) as exc:
            self._last_exit = str(exc)
        finally:
            task = asyncio.current_task()
            if task in self._retired:
                self._retired.discard(task)
            elif again:
                # The host's command changed (fewer fields): the next stream takes over at once.
                self._reader = asyncio.get_running_loop().create_task(
                    self._read(), name=f"gpu-{self.backend}-{self._host}"
                )
            else:
                self._put(None)

    def retune(self, interval_s: float) -> None:
        """Sample every `interval_s` from now on: the host's loop keeps its own time, so the stream is
        started again with the new interval (one SSH channel closed, one opened); a `sample()` waiting
        meanwhile gets the new stream's first sample."""
        interval_s = max(MIN_INTERVAL_S, interval_s)
        if interval_s == self.interval_s:
            return
        self.interval_s = interval_s
        if self._own_patience:
            self.patience_s = max(3.0, 3 * interval_s)
        old = self._reader
        if old is not None and not old.done():
            self._retired.add(old)
            old.cancel()
            self._reader = asyncio.get_running_loop().create_task(
                self._read(), name=f"gpu-{self.backend}-{self._host}"
            )

    def _error(self, detail: str) -> HostGpuSample:
        return HostGpuSample(
            state=SamplerState.ERROR, backend=self.backend, detail=detail, host=self._host, ts=time.time()
        )

    async def sample(self) -> HostGpuSample:
        if self._reader is not None and self._reader.done() and self._samples.empty():
            self._reader = None
        if self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(
                self._read(), name=f"gpu-{self.backend}-{self._host}"
            )
        try:
            async with asyncio.timeout(self.patience_s):
                item = await self._samples.get()
        except TimeoutError:
            return self._error(f"no sample from {self.what} for {self.patience_s:g} s.")
        if item is None:
            return self._error(f"{self._last_exit or self.what + ' ended'}.")
        return item

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
            self._reader = None


class NvidiaSmiStreamSampler(_StreamSampler):
    """`nvidia-smi` over SSH from one long-lived channel (`nvidia_smi_loop_argv`): a sample per tick. An
    older driver that refuses a field gets the loop again without it (or with its older name)."""

    backend: Literal["nvidia-smi"] = "nvidia-smi"
    what = "the nvidia-smi loop"
    fields: tuple[str, ...] = SMI_QUERY_FIELDS

    def argv(self) -> list[str]:
        return nvidia_smi_loop_argv(self.interval_s, self.fields)

    def reader(self) -> Callable[[bytes], HostGpuSample | None]:
        blocks = NvidiaSmiBlocks(self.fields)

        def take(line: bytes) -> HostGpuSample | None:
            pair = blocks.feed(line)
            if pair is None:
                return None
            gpus = pair[0]
            fewer = None if gpus.ok else smi_fields_without(blocks.fields, gpus.stdout + gpus.stderr)
            if fewer is not None:
                self.fields = fewer
                raise _AskAgain
            return nvidia_smi_sample(*pair, self._host, blocks.fields)

        return take


class AgentSampler(_StreamSampler):
    """The NVML agent over SSH: one `python3 -c SCRIPT` channel printing one JSON sample per tick."""

    backend: Literal["agent"] = "agent"
    what = "the GPU agent"

    def __init__(
        self,
        transport: Transport,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        python: str = "python3",
        patience_s: float | None = None,
    ) -> None:
        super().__init__(transport, interval_s=interval_s, patience_s=patience_s)
        self.python = python

    def argv(self) -> list[str]:
        return agent_argv(self.interval_s, self.python)

    def reader(self) -> Callable[[bytes], HostGpuSample | None]:
        last: tuple[bytes, HostGpuSample] | None = None

        def take(line: bytes) -> HostGpuSample:
            # An idle host's GPUs read the same every second: the same line is the same sample, read
            # once (validating 8 GPUs' health fields was most of an idle sample's cost).
            nonlocal last
            if last is not None and last[0] == line:
                read = last[1]
            else:
                read = sample_from_agent_line(line, host=self._host)
                last = (line, read)
            return _stamp(read, self._host)

        return take


async def open_sampler(
    transport: Transport | None,
    *,
    backend: BackendChoice = "auto",
    interval_s: float = DEFAULT_INTERVAL_S,
    nvml: Any = None,
    host: str | None = None,
) -> tuple[GpuSampler, HostGpuSample]:
    """Pick the back-end for a host and take its first sample.

    `transport=None` means this machine: local NVML, then local nvidia-smi. Over SSH: the NVML agent,
    then nvidia-smi. A back-end is kept when its first sample is `ok` or `no_gpus`; when none works
    the last one tried is kept, and its first sample says why. A host with no NVIDIA driver at all
    (`nvml_missing`) is asked for AMD GPUs (amd-smi, else rocm-smi), kept when it has some: its
    failure would say less than nvidia-smi's.
    """
    name = host or (transport.host.name if transport is not None else None)
    runner: Runner = transport if transport is not None else LocalRunner()
    if backend == "amd-smi":
        amd = AmdSmiSampler(runner, host=name)
        return amd, await amd.sample()
    candidates: list[GpuSampler] = []
    if transport is None:
        if backend in ("auto", "nvml"):
            candidates.append(NvmlSampler(nvml, host=name))
        if backend in ("auto", "nvidia-smi"):
            candidates.append(NvidiaSmiSampler(LocalRunner(), host=name))
    else:
        if backend in ("auto", "agent"):
            candidates.append(AgentSampler(transport, interval_s=interval_s))
        if backend in ("auto", "nvidia-smi"):
            # A tick's answer may take a few ticks, never longer: a hung host reports an error on time.
            candidates.append(NvidiaSmiStreamSampler(transport, interval_s=interval_s))
        if backend == "nvml":
            raise ValueError("local NVML samples this machine only; use 'agent' for a remote host")
    if not candidates:
        raise ValueError(f"unknown GPU sampler back-end {backend!r}")
    first: HostGpuSample | None = None
    for sampler in candidates:
        first = await sampler.sample()
        if first.state in (SamplerState.OK, SamplerState.NO_GPUS) or sampler is candidates[-1]:
            for other in candidates:
                if other is not sampler:
                    await other.close()
            if backend == "auto" and first.state is SamplerState.NVML_MISSING:
                amd = AmdSmiSampler(runner, host=name)
                said = await amd.sample()
                if said.state in (SamplerState.OK, SamplerState.NO_GPUS):
                    await sampler.close()
                    return amd, said
            return sampler, first
        await sampler.close()
    raise AssertionError("unreachable: the loop returns on its last candidate")


class GpuPoller:
    """One `HostGpuSample` per tick (default 1 s, at least 0.25 s), on a fixed schedule.

    The sampler is chosen on the first tick. A tick that takes longer than the interval is not
    repeated to catch up: the schedule skips ahead, so samples stay current rather than queued.
    """

    def __init__(
        self,
        transport: Transport | None,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        backend: BackendChoice = "auto",
        nvml: Any = None,
        host: str | None = None,
    ) -> None:
        self.transport = transport
        self.interval_s = max(MIN_INTERVAL_S, interval_s)
        self.backend: BackendChoice = backend
        self._nvml = nvml
        self._host = host
        self.sampler: GpuSampler | None = None

    async def samples(self) -> AsyncIterator[HostGpuSample]:
        loop = asyncio.get_running_loop()
        try:
            self.sampler, first = await open_sampler(
                self.transport,
                backend=self.backend,
                interval_s=self.interval_s,
                nvml=self._nvml,
                host=self._host,
            )
            yield first
            next_at = loop.time() + self.interval_s
            while True:
                delay = next_at - loop.time()
                if delay > 0 and not self.sampler.self_paced:
                    # A stream keeps its own schedule on the host; waiting for its line is the tick.
                    await asyncio.sleep(delay)
                if isinstance(self.sampler, _StreamSampler) and self.sampler.interval_s != self.interval_s:
                    self.sampler.retune(self.interval_s)  # changed while the sampler was being chosen
                yield await self.sampler.sample()
                next_at = max(next_at + self.interval_s, loop.time())
        finally:
            await self.close()

    def set_interval(self, interval_s: float) -> None:
        """A new interval from the next tick on; a streaming sampler restarts its stream with it."""
        interval_s = max(MIN_INTERVAL_S, interval_s)
        if interval_s == self.interval_s:
            return
        self.interval_s = interval_s
        if isinstance(self.sampler, _StreamSampler):
            self.sampler.retune(interval_s)

    async def close(self) -> None:
        if self.sampler is not None:
            await self.sampler.close()
            self.sampler = None
