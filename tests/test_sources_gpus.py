"""GPU samplers: the three back-ends give the same `HostGpuSample` for the same GPUs.

NVML is played by a stand-in module (`pynvml.py` written to a temp dir) with the functions the samplers
call: the local sampler imports it, and the agent script finds it on the PYTHONPATH of a real `python3`.
nvidia-smi is played by a script on PATH printing what the real one prints for the same GPUs.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from console.core.gpus import (
    GPU_QUERY_FIELDS,
    GpuProcess,
    GpuSample,
    HostGpuSample,
    SamplerState,
    parse_nvidia_smi_gpus,
    sample_from_agent_line,
)
from console.sources.gpu_agent import agent_argv, agent_script
from console.sources.gpus import (
    AgentSampler,
    GpuPoller,
    LocalRunner,
    NvidiaSmiBlocks,
    NvidiaSmiSampler,
    NvmlSampler,
    nvidia_smi_loop_argv,
    nvidia_smi_sample,
    open_sampler,
)

MIB = 1024 * 1024

# Two H100s; GPU 1 cannot report its utilization ("[N/A]" / NVMLError_NotSupported).
STANDIN = """
class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


MISSING = False
COUNT = 2
CALLS = []


class _Mem:
    def __init__(self, used, total):
        self.used, self.total, self.free = used, total, total - used


class _Util:
    gpu = 37
    memory = 12


class _Proc:
    def __init__(self, pid, used):
        self.pid, self.usedGpuMemory = pid, used


def nvmlInit():
    CALLS.append("init")
    if MISSING:
        raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")


def nvmlShutdown():
    CALLS.append("shutdown")


def nvmlDeviceGetCount():
    return COUNT


def nvmlDeviceGetHandleByIndex(i):
    return i


def nvmlDeviceGetName(h):
    return b"NVIDIA H100 80GB HBM3"  # older nvidia-ml-py returns bytes


def nvmlDeviceGetUUID(h):
    return "GPU-%08d-aaaa-bbbb-cccc-000000000000" % h


def nvmlDeviceGetMemoryInfo(h):
    return _Mem((40123 + h) * 1048576, 81559 * 1048576)


def nvmlDeviceGetUtilizationRates(h):
    if h == 1:
        raise NVMLError_NotSupported("Not Supported")
    return _Util()


def nvmlDeviceGetComputeRunningProcesses(h):
    return [_Proc(7400 + h, 39000 * 1048576)]


def nvmlSystemGetProcessName(pid):
    return "sglang::scheduler_TP%d" % (pid - 7400)
"""

SMI_GPUS = """\
0, NVIDIA H100 80GB HBM3, GPU-00000000-aaaa-bbbb-cccc-000000000000, 37, 40123, 81559
1, NVIDIA H100 80GB HBM3, GPU-00000001-aaaa-bbbb-cccc-000000000000, [N/A], 40124, 81559
"""
SMI_APPS = """\
GPU-00000000-aaaa-bbbb-cccc-000000000000, 7400, sglang::scheduler_TP0, 39000
GPU-00000001-aaaa-bbbb-cccc-000000000000, 7401, sglang::scheduler_TP1, 39000
"""

EXPECTED = tuple(
    GpuSample(
        index=i,
        name="NVIDIA H100 80GB HBM3",
        uuid=f"GPU-{i:08d}-aaaa-bbbb-cccc-000000000000",
        utilization_pct=37.0 if i == 0 else None,
        memory_used_mib=40123.0 + i,
        memory_total_mib=81559.0,
        # The stand-in is an old driver (no v2 memory info; its nvidia-smi refuses memory.reserved).
        memory_info="v1",
        processes=(GpuProcess(pid=7400 + i, name=f"sglang::scheduler_TP{i}", used_memory_mib=39000.0),),
    )
    for i in range(2)
)


@pytest.fixture
def standin_dir(tmp_path: Path) -> Path:
    (tmp_path / "pynvml.py").write_text(STANDIN)
    return tmp_path


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("pynvml_standin", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "gpus.csv").write_text(SMI_GPUS)
    (bindir / "apps.csv").write_text(SMI_APPS)
    script = bindir / "nvidia-smi"
    basic = ",".join(GPU_QUERY_FIELDS)
    # An old driver's nvidia-smi: it answers the basic fields and refuses the first field it does not
    # know, the whole query failing, as the real one does.
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f'  --query-gpu={basic}) cat "{bindir}/gpus.csv";;\n'
        f'  --query-gpu={basic},*) f="${{1#--query-gpu={basic},}}"; f="${{f%%,*}}"; '
        'echo "Field \\"$f\\" is not a valid field to query."; exit 2;;\n'
        f'  --query-compute-apps=gpu_uuid,pid,process_name,used_memory) cat "{bindir}/apps.csv";;\n'
        '  *) echo "unexpected: $*" >&2; exit 2;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return bindir


async def test_local_nvml_through_a_standin(standin_dir: Path) -> None:
    nvml = _load(standin_dir / "pynvml.py")
    sampler = NvmlSampler(nvml, host="gpu1")
    sample = await sampler.sample()
    assert sample.state is SamplerState.OK and sample.backend == "nvml" and sample.host == "gpu1"
    assert sample.gpus == EXPECTED
    assert sample.memory_used_mib == 80247.0
    await sampler.sample()
    await sampler.close()
    assert nvml.CALLS == ["init", "shutdown"]  # initialised once, not per tick


async def test_missing_nvml_library_is_a_state(standin_dir: Path) -> None:
    nvml = _load(standin_dir / "pynvml.py")
    nvml.MISSING = True
    sample = await NvmlSampler(nvml).sample()
    assert sample.state is SamplerState.NVML_MISSING and sample.gpus == ()
    assert sample.detail and "NVML" in sample.detail
    nvml.MISSING, nvml.COUNT = False, 0
    assert (await NvmlSampler(nvml).sample()).state is SamplerState.NO_GPUS


async def test_nvidia_smi_back_end(fake_smi: Path) -> None:
    sample = await NvidiaSmiSampler(LocalRunner(), host="gpu1").sample()
    assert sample.state is SamplerState.OK and sample.backend == "nvidia-smi"
    assert sample.gpus == EXPECTED


def _loop_samples(ticks: int, interval_s: float = 0.25) -> tuple[list[HostGpuSample], int]:
    """The SSH back-end's `sh` loop run here by a real `sh`: its lines through `NvidiaSmiBlocks`, one
    sample per tick; then its stdout is closed, as a closed channel would be, and its exit status read."""
    proc = subprocess.Popen(
        nvidia_smi_loop_argv(interval_s, GPU_QUERY_FIELDS), stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    assert proc.stdout is not None
    blocks, samples = NvidiaSmiBlocks(GPU_QUERY_FIELDS), []
    try:
        while len(samples) < ticks:
            line = proc.stdout.readline()
            assert line, "the loop ended early"
            pair = blocks.feed(line)
            if pair is not None:
                samples.append(nvidia_smi_sample(*pair, "gpu1", GPU_QUERY_FIELDS))
    finally:
        proc.stdout.close()
    return samples, proc.wait(5)  # its next write meets a closed pipe


def test_nvidia_smi_loop_gives_a_sample_per_tick_and_ends_with_its_channel(fake_smi: Path) -> None:
    samples, status = _loop_samples(3)
    assert all(s.state is SamplerState.OK and s.backend == "nvidia-smi" for s in samples)
    assert all(s.gpus == EXPECTED for s in samples)
    assert status != 0


@pytest.mark.serial  # the gap between ticks is timed: measured with no other test running
def test_nvidia_smi_loop_keeps_the_interval_when_the_queries_are_slow(fake_smi: Path) -> None:
    """Queries of 0.3 s each at a 0.7 s interval: a tick every ~0.7 s, not 0.7 s of sleep after 0.6 s of
    work (1.3 s), so a busy host's samples keep the schedule the operator asked for."""
    script = fake_smi / "nvidia-smi"
    script.write_text(script.read_text().replace("#!/bin/sh\n", "#!/bin/sh\nsleep 0.3\n"))
    proc = subprocess.Popen(
        nvidia_smi_loop_argv(0.7, GPU_QUERY_FIELDS), stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    assert proc.stdout is not None
    blocks, stamps = NvidiaSmiBlocks(GPU_QUERY_FIELDS), []
    try:
        while len(stamps) < 4:
            line = proc.stdout.readline()
            assert line, "the loop ended early"
            if blocks.feed(line) is not None:
                stamps.append(time.monotonic())
    finally:
        proc.stdout.close()
        proc.wait(5)
    gap = (stamps[-1] - stamps[0]) / 3
    assert 0.6 < gap < 1.05, gap


@pytest.mark.serial  # the loop's duration is timed: measured with no other test running
def test_nvidia_smi_loop_ticks_each_second_where_sleep_takes_whole_seconds_only(fake_smi: Path) -> None:
    """POSIX `sleep` needs only whole seconds; on a host whose `sleep` refuses 0.25 the loop keeps
    sampling, once a second, instead of ending at its first turn."""
    whole = fake_smi / "sleep"
    whole.write_text(
        "#!/bin/sh\n"
        'case "$1" in *[!0-9]*) echo "sleep: invalid time interval \'$1\'" >&2; exit 1;; esac\n'
        f'exec {shutil.which("sleep")} "$1"\n'
    )
    whole.chmod(0o755)
    started = time.monotonic()
    samples, _ = _loop_samples(3, interval_s=0.25)
    took = time.monotonic() - started
    assert all(s.state is SamplerState.OK and s.gpus == EXPECTED for s in samples)
    # Three samples need two whole-second sleeps between them (0.25 s sleeps would take ~0.5 s).
    assert 1.8 < took < 5, took


def test_nvidia_smi_loop_keeps_warnings_out_of_the_rows(fake_smi: Path) -> None:
    script = fake_smi / "nvidia-smi"
    script.write_text(
        script.read_text().replace(
            "#!/bin/sh\n", "#!/bin/sh\necho 'WARNING: infoROM is corrupted at gpu 0000:1B:00.0' >&2\n"
        )
    )
    samples, _ = _loop_samples(2)
    assert [s.gpus for s in samples] == [EXPECTED, EXPECTED]


def test_nvidia_smi_loop_reports_a_driver_it_cannot_reach(fake_smi: Path) -> None:
    (fake_smi / "nvidia-smi").write_text(
        '#!/bin/sh\necho "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\nexit 9\n'
    )
    samples, _ = _loop_samples(2)
    assert all(s.state is SamplerState.NVML_MISSING for s in samples)
    assert "couldn't communicate" in (samples[0].detail or "")


def test_nvidia_smi_blocks_need_both_queries_and_stay_bounded() -> None:
    blocks = NvidiaSmiBlocks(GPU_QUERY_FIELDS)
    # An apps block with no gpu block before it (the stream joined mid-tick) gives no sample.
    assert blocks.feed(b"GPU-0, 1, x, 2\n") is None
    assert blocks.feed(b"@@k26-nvidia-smi apps 0\n") is None
    for line in SMI_GPUS.splitlines():
        assert blocks.feed(line.encode() + b"\n") is None
    assert blocks.feed(b"@@k26-nvidia-smi gpu 0\n") is None
    for line in SMI_APPS.splitlines():
        assert blocks.feed(line.encode() + b"\n") is None
    pair = blocks.feed(b"@@k26-nvidia-smi apps 0\n")
    assert pair is not None and nvidia_smi_sample(*pair, "gpu1", GPU_QUERY_FIELDS).gpus == EXPECTED
    with pytest.raises(ValueError, match="without finishing"):
        for _ in range(5000):
            blocks.feed(b"0, 1, 2, 3, 4, 5\n")


@pytest.mark.serial  # three ticks are timed: measured with no other test running
async def test_agent_script_runs_on_a_real_python_with_the_standin(standin_dir: Path) -> None:
    """The script as sent over SSH, run by a real python3: one JSON sample per tick, then it exits
    when its stdin closes (the channel closing)."""
    argv = agent_argv(0.25, python=sys.executable)
    env = {**os.environ, "PYTHONPATH": str(standin_dir)}
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env
    )
    assert proc.stdout is not None and proc.stdin is not None
    loop = asyncio.get_running_loop()
    started = loop.time()
    lines = [await asyncio.wait_for(proc.stdout.readline(), 5) for _ in range(3)]
    elapsed = loop.time() - started
    proc.stdin.close()
    assert await asyncio.wait_for(proc.wait(), 5) == 0
    samples = [sample_from_agent_line(line, host="gpu1") for line in lines]
    assert all(s.state is SamplerState.OK and s.backend == "agent" for s in samples)
    assert samples[0].gpus == EXPECTED
    assert 0.4 <= elapsed < 2.0  # three ticks 0.25 s apart


async def test_agent_without_pynvml_or_library_says_so(tmp_path: Path, standin_dir: Path) -> None:
    for pythonpath, marker in ((str(tmp_path / "empty"), "pynvml"), (str(standin_dir), "NVML")):
        if marker == "NVML":
            (standin_dir / "pynvml.py").write_text(STANDIN.replace("MISSING = False", "MISSING = True"))
        env = {**os.environ, "PYTHONPATH": pythonpath}
        if marker == "pynvml":
            # Hide any real nvidia-ml-py of this interpreter: -S drops site-packages.
            argv = [sys.executable, "-S", *agent_argv(1.0)[1:]]
        else:
            argv = agent_argv(1.0, python=sys.executable)
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 5)
        sample = sample_from_agent_line(out.splitlines()[0])
        assert sample.state is SamplerState.NVML_MISSING, out
        assert marker in (sample.detail or "")


@pytest.mark.parametrize(
    ("slow", "state"),
    [
        ("import", SamplerState.NVML_MISSING),  # no nvidia-ml-py, found out slowly
        ("init", SamplerState.NVML_MISSING),  # no NVML library: nvmlInit fails, slowly
        ("sample", SamplerState.OK),  # a first sample that takes its time
    ],
)
async def test_the_agent_writes_its_verdict_before_it_honours_the_end_of_its_input(
    tmp_path: Path, slow: str, state: SamplerState
) -> None:
    """`communicate()` closes the agent's stdin at once (Python 3.12 on): the agent's stdin watcher saw the
    end of input and exited before the main thread had written anything (an empty answer on a 16-core
    machine, issue 31). Here the agent is slow on purpose (0.5 s), so the race is lost every time, not by
    chance; each time the agent's first line comes, then it ends."""
    module = tmp_path / "pynvml.py"
    if slow == "import":
        module.write_text("import time\ntime.sleep(0.5)\nraise ImportError('no nvidia-ml-py')\n")
    elif slow == "init":
        module.write_text(
            STANDIN.replace("MISSING = False", "MISSING = True").replace(
                'CALLS.append("init")', 'CALLS.append("init")\n    __import__("time").sleep(0.5)'
            )
        )
    else:
        module.write_text(
            STANDIN.replace("    return COUNT", "    __import__('time').sleep(0.5)\n    return COUNT")
        )
    proc = await asyncio.create_subprocess_exec(
        *agent_argv(1.0, python=sys.executable),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert proc.stdin is not None and proc.stdout is not None
    # What `communicate()` does from Python 3.12 on (3.11's leaves stdin open): the end of input at once.
    proc.stdin.close()
    out = await asyncio.wait_for(proc.stdout.read(), 10)
    await asyncio.wait_for(proc.wait(), 10)
    assert out.strip(), "the agent ended without a word"
    sample = sample_from_agent_line(out.splitlines()[0])
    assert sample.state is state, out
    assert proc.returncode == 0


def test_agent_script_is_self_contained_python() -> None:
    script = agent_script()
    compile(script, "<agent>", "exec")
    assert "from console" not in script and "import console" not in script  # not installed on the host
    assert "type: ignore" not in script


def test_nvidia_smi_odd_rows() -> None:
    gpus = parse_nvidia_smi_gpus(
        "0, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-x, [Not Supported], 12, 97887\n"
        "\n"
        "1, [N/A], [N/A], 5 %, 13 MiB, 97887 MiB\n"
        "2, short row\n",
        "GPU-x, 42, /usr/bin/python3 -m sglang.launch_server --a, --b, 12000\nGPU-y, nope, x, y\n",
    )
    assert [g.index for g in gpus] == [0, 1, 2]
    assert gpus[0].utilization_pct is None and gpus[0].memory_total_mib == 97887.0
    assert gpus[0].processes == (
        GpuProcess(pid=42, name="/usr/bin/python3 -m sglang.launch_server --a,--b", used_memory_mib=12000.0),
    )
    assert gpus[1].name is None and gpus[1].utilization_pct == 5.0 and gpus[1].memory_used_mib == 13.0
    assert gpus[2].name == "short row" and gpus[2].memory_total_mib is None


def test_agent_garbage_is_an_error_sample() -> None:
    for line in (b"Traceback (most recent call last):", b"[1, 2]", json.dumps({"state": "weird"})):
        sample = sample_from_agent_line(line, host="h")
        assert sample.state is SamplerState.ERROR and sample.host == "h" and sample.detail


def test_the_agent_reads_a_repeated_line_once_and_stamps_each_sample_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An idle host's agent prints the same line every second: it is validated once (8 GPUs' health
    fields were most of an idle sample's cost); each sample still gets its own receipt time, and a
    line that differs is read."""
    import console.sources.gpus as gpus_source

    read: list[object] = []

    def counted(line: str | bytes, *, host: str | None = None) -> HostGpuSample:
        read.append(line)
        return sample_from_agent_line(line, host=host)

    monkeypatch.setattr(gpus_source, "sample_from_agent_line", counted)
    transport = SimpleNamespace(host=SimpleNamespace(name="h"))
    take = AgentSampler(transport, interval_s=1.0).reader()  # type: ignore[arg-type]
    idle = json.dumps({"state": "ok", "gpus": [{"index": 0, "utilization_pct": 0, "memory_used_mib": 9.0}]})
    busy = idle.replace('"utilization_pct": 0', '"utilization_pct": 97')
    clock = iter(itertools.count(1000.0))
    monkeypatch.setattr(gpus_source.time, "time", lambda: next(clock))
    first, second = take(idle.encode()), take(idle.encode())
    assert first is not None and second is not None
    assert (
        len(read) == 1 and second.gpus is first.gpus and second.ts is not None and second.ts > (first.ts or 0)
    )
    third = take(busy.encode())
    assert len(read) == 2 and third is not None and third.gpus[0].utilization_pct == 97
    assert take(idle.encode()) is not None and len(read) == 3  # only the last line is kept


async def test_auto_choice_falls_back_to_nvidia_smi_when_nvml_is_missing(
    standin_dir: Path, fake_smi: Path
) -> None:
    nvml = _load(standin_dir / "pynvml.py")
    nvml.MISSING = True
    sampler, first = await open_sampler(None, nvml=nvml, host="local")
    assert sampler.backend == "nvidia-smi" and first.gpus == EXPECTED
    nvml.MISSING = False
    sampler, first = await open_sampler(None, nvml=_load(standin_dir / "pynvml.py"), host="local")
    assert sampler.backend == "nvml" and first.gpus == EXPECTED
    await sampler.close()


async def test_no_nvml_and_no_nvidia_smi_is_a_state(
    standin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(standin_dir))  # nothing called nvidia-smi here
    nvml = _load(standin_dir / "pynvml.py")
    nvml.MISSING = True
    _, first = await open_sampler(None, nvml=nvml)
    assert first.state is SamplerState.NVML_MISSING
    assert first.detail == "nvidia-smi is not installed on the host."


@pytest.mark.serial  # the gaps between ticks are timed: measured with no other test running
async def test_poller_ticks_on_schedule(standin_dir: Path) -> None:
    poller = GpuPoller(None, interval_s=0.1, nvml=_load(standin_dir / "pynvml.py"))
    assert poller.interval_s == 0.25  # the minimum
    loop = asyncio.get_running_loop()
    stamps = []
    async for sample in poller.samples():
        stamps.append(loop.time())
        assert sample.gpus == EXPECTED
        if len(stamps) == 5:
            break
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    assert all(0.2 <= g <= 0.4 for g in gaps), gaps


@pytest.mark.gpu
async def test_real_nvml_on_a_gpu_host() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        pytest.skip("no NVIDIA GPU on this machine")
    if count == 0:
        pytest.skip("NVML sees no GPU")
    sampler = NvmlSampler()
    sample = await sampler.sample()
    await sampler.close()
    assert sample.state is SamplerState.OK and len(sample.gpus) == count
    for gpu in sample.gpus:
        assert gpu.name and gpu.memory_total_mib and gpu.memory_total_mib > 1024
        assert gpu.memory_used_mib is not None and 0 <= gpu.memory_used_mib <= gpu.memory_total_mib
