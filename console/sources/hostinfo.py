"""Learn a host over SSH: the SGLang its unit runs, the model it serves, the cards it has.

    facts = await learn_host(host, transport)          # a HostFacts (console.core.hostfacts)
    spec = facts.model.spec                            # what the capacity model takes
    flag_list = host_flag_list(facts)                  # the host's own flag list (or the shipped one)

1. The unit's ExecStart (`systemctl cat`, systemd's own quoting) names the program; its interpreter is
   that program when it is a Python, or the `#!` line of a console script (`sglang serve`).
2. That interpreter, with the unit's Environment= (PYTHONPATH, a venv), is sent a small script on
   stdin (`console/sources/remote_sglang.py`) that locates `sglang` and reads its version without
   importing it (importing pulls torch and CUDA).
3. The flag list of that version comes from the local cache (`console.sources.flagcache`),
   else from the project's AST extractor (`console/tools/extract_sglang_args.py`, stdlib only) sent to
   the same interpreter and run over the installation; it is cached per version. When any of this
   fails, the shipped list (the host's version if shipped, else the default) is used and a note says why.
4. The model's config.json is found as SGLang finds it: `--model-path` as a local directory (relative
   to the unit's WorkingDirectory), else the Hugging Face cache `models--ORG--NAME/snapshots/REV/` under
   HF_HUB_CACHE / HF_HOME / XDG_CACHE_HOME / ~/.cache of the unit's environment and user; it is read
   size-limited (`console.sources.modelconfig`). When it cannot be used the catalogue entry is, and a
   note says why.
5. The GPUs come from the sampler's nvidia-smi query; each is matched to the bandwidth table.

Nothing here changes the host, and nothing the host sends reaches a terminal unsanitised: the callers
print through `terminal_safe`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from console.core.cards import card_bandwidth
from console.core.flags import (
    FlagList,
    canonical_version,
)
from console.core.gpuhealth import peak_bandwidth_gbs
from console.core.hostfacts import (
    CONFIG_MAX_BYTES,
    FLAGS_MAX_BYTES,
    PROBE_MAX_BYTES,
    DraftFacts,
    FlagsFacts,
    GpuFacts,
    HostFacts,
    ModelArgs,
    ModelFacts,
    SglangFacts,
    draft_facts,
    hf_hub_dir,
    interpreter_of,
    is_repo_id,
    model_args,
    model_shape,
    parse_environment,
    shebang_interpreter,
)
from console.core.models import (
    ModelConfigError,
    ModelSpec,
    find_model,
    get_model,
)
from console.core.text import split_lines
from console.sources.bounded import OutputTooLarge, run_bounded
from console.sources.flagcache import (
    cache_path,
    default_cache_dir,
    host_flag_list,
    read_cached,
    shipped_flag_list,
    write_cached,
)
from console.sources.gpus import NvidiaSmiSampler, open_sampler
from console.sources.hosts import HostConfig
from console.sources.modelconfig import config_argv, read_config_answer
from console.sources.transport import CommandResult, Transport, TransportError
from console.sources.unit_commands import ServiceError, UnitCommands

_HERE = Path(__file__).resolve().parent
PROBE_SCRIPT = _HERE / "remote_sglang.py"
EXTRACTOR_SCRIPT = _HERE.parent / "tools" / "extract_sglang_args.py"

# The unit's own settings must decide, not the SSH user's shell: these are cleared before the unit's
# Environment= is applied (`env -u`), so a PYTHONPATH in the operator's login does not pick the package.
_CLEARED = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "HF_HOME", "HF_HUB_CACHE")


class HostInfoError(Exception):
    """The host cannot be learned at all (no such unit, no connection); one sentence."""


def _first_line(result: CommandResult) -> str:
    line = result.first_error_line() or next(iter(split_lines(result.stdout)), "")
    return line.strip()[:200] or f"exit status {result.exit_status}"


@dataclass(frozen=True)
class _Unit:
    """What systemd says the unit runs, and with which environment, directory and user."""

    argv: list[str]
    env: dict[str, str]
    working_directory: str
    user: str


class _Learner:
    def __init__(self, host: HostConfig, transport: Transport, cache_dir: Path, timeout_s: float) -> None:
        self.host = host
        self.transport = transport
        self.cache_dir = cache_dir
        self.timeout_s = timeout_s
        self.notes: list[str] = []

    async def run(
        self, argv: list[str], *, input: str | None = None, limit: int | None = None
    ) -> CommandResult:
        """A command on the host; with `limit`, its output is read only that far (OutputTooLarge past it)."""
        try:
            if limit is not None:
                return await run_bounded(
                    self.transport, argv, limit=limit, input=input, timeout=self.timeout_s
                )
            return await self.transport.run(argv, timeout=self.timeout_s, input=input)
        except TransportError as exc:
            raise HostInfoError(f"{str(exc).rstrip('.')}.") from None

    def python_argv(self, interpreter: str, env: dict[str, str], *args: str) -> list[str]:
        unset = [w for name in _CLEARED for w in ("-u", name)]
        return ["env", *unset, *(f"{k}={v}" for k, v in env.items()), interpreter, "-", *args]

    # ---- the unit ----------------------------------------------------------------------------

    async def unit(self) -> _Unit:
        controller = UnitCommands(self.host, self.transport, command_timeout_s=self.timeout_s)
        try:
            argv = await controller.running_argv()
        except ServiceError as exc:
            raise HostInfoError(str(exc)) from None
        props = await self.run(
            [
                "systemctl",
                "show",
                "-p",
                "Environment",
                "-p",
                "WorkingDirectory",
                "-p",
                "User",
                controller.unit,
            ]
        )
        values: dict[str, str] = {}
        for line in split_lines(props.stdout):
            key, sep, value = line.partition("=")
            if sep and key not in values:
                values[key] = value
        return _Unit(
            argv=argv,
            env=parse_environment(values.get("Environment", "")),
            working_directory=values.get("WorkingDirectory", ""),
            user=values.get("User", ""),
        )

    # ---- the interpreter and its SGLang --------------------------------------------------------

    async def interpreter(self, argv: list[str]) -> tuple[str | None, str]:
        interp = interpreter_of(argv)
        if interp.kind == "python":
            return interp.program, f"the unit's ExecStart runs {interp.program}"
        if interp.kind == "script":
            result = await self.run(
                ["sh", "-c", 'p=$(command -v "$1") && head -c 512 "$p"', "sh", interp.program], limit=4096
            )
            python = shebang_interpreter(result.stdout) if result.ok else None
            if python:
                return python, f"the #! line of {interp.program}, which the unit's ExecStart runs"
            return None, f"{interp.program}, which the unit's ExecStart runs, names no Python in its #! line"
        shown = interp.program or "nothing"
        return None, f"the unit's ExecStart runs {shown}, which is not a Python interpreter"

    async def sglang(self, python: str, env: dict[str, str]) -> tuple[dict[str, Any], str | None]:
        try:
            result = await self.run(
                self.python_argv(python, env), input=PROBE_SCRIPT.read_text(), limit=PROBE_MAX_BYTES
            )
        except OutputTooLarge:
            return (
                {},
                f"{python} answered with more than {PROBE_MAX_BYTES:,} characters, not the line a Python prints",
            )
        if result.exit_status == 127 and not result.stdout:
            return {}, f"{python} was not found on {self.host.name}"
        text = result.stdout
        try:
            data = json.loads(text.strip().split("\n")[-1]) if text.strip() else None
        except ValueError:
            data = None
        if not isinstance(data, dict) or data.get("k26") != 1:
            return {}, f"{python} did not answer as a Python interpreter ({_first_line(result)})"
        if data.get("error"):
            return data, f"{python} finds no usable sglang ({data['error']})"
        if not data.get("version"):
            return (
                data,
                f"{python} finds sglang at {data.get('path')} but no version in its metadata or files",
            )
        return data, None

    async def extract_flags(self, python: str, env: dict[str, str], root: str, version: str) -> FlagList:
        """The flag list of the host's installation: the project's extractor run there, over SSH."""
        try:
            result = await self.run(
                self.python_argv(python, env, root, "--version", version),
                input=EXTRACTOR_SCRIPT.read_text(),
                limit=FLAGS_MAX_BYTES,
            )
        except OutputTooLarge:
            raise ValueError(
                f"the extractor's answer passed the console's limit of {FLAGS_MAX_BYTES:,} characters"
            ) from None
        if not result.ok:
            raise ValueError(f"the extractor failed on {self.host.name} ({_first_line(result)})")
        try:
            flags = FlagList.from_json(result.stdout)
        except ValidationError:
            raise ValueError("the extractor's answer is not a flag list") from None
        if not flags.flags:
            raise ValueError("the extractor found no flags")
        write_cached(self.cache_dir, flags, result.stdout)
        return flags

    async def flags(
        self, python: str | None, env: dict[str, str], probe: dict[str, Any], why_not: str | None
    ) -> tuple[FlagsFacts, FlagList]:
        version = probe.get("version") if isinstance(probe.get("version"), str) else None
        if python and version and why_not is None:
            ver = canonical_version(version)
            cached = read_cached(self.cache_dir, ver)
            if cached is not None:
                path = cache_path(self.cache_dir, ver)
                return FlagsFacts(
                    flags_from="host",
                    version=cached.sglang_version,
                    source=f"extracted earlier from this SGLang {ver} and cached at {path}",
                    count=len(cached.flags),
                ), cached
            if probe.get("has_server_args"):
                try:
                    flags = await self.extract_flags(python, env, str(probe.get("root") or ""), ver)
                except ValueError as exc:
                    why_not = str(exc)
                else:
                    return FlagsFacts(
                        flags_from="host",
                        version=flags.sglang_version,
                        source=f"extracted over SSH from {probe.get('path')} by the console's AST extractor "
                        f"(cached at {cache_path(self.cache_dir, ver)})",
                        count=len(flags.flags),
                    ), flags
            else:
                why_not = f"{probe.get('path')} holds no srt/server_args.py to read the flags from"
        flags, which = shipped_flag_list(version)
        note = f"{why_not or 'the host SGLang could not be read'}: the flags are checked against {which}."
        self.notes.append(note)
        return FlagsFacts(
            flags_from="shipped",
            version=flags.sglang_version,
            source=which,
            count=len(flags.flags),
            note=note,
        ), flags

    # ---- the model ---------------------------------------------------------------------------

    async def read_config(
        self, model_path: str, revision: str | None, unit: _Unit
    ) -> tuple[ModelSpec | None, str | None, str]:
        """(spec, config path, where it came from or why not) for one model path."""
        hub, _ = hf_hub_dir(unit.env, "~")
        argv = config_argv(model_path, revision, hub, unit.working_directory, unit.user)
        try:
            result = await self.run(argv, limit=CONFIG_MAX_BYTES + 4096)  # + the status line
        except OutputTooLarge as exc:
            return None, None, f"the config.json lookup of {model_path} on {self.host.name} sent {exc}"
        return read_config_answer(result, model_path, self.host.name)

    def catalogue(self, model_path: str | None) -> ModelSpec | None:
        if self.host.model:
            with contextlib.suppress(ModelConfigError):
                return get_model(self.host.model)
        return find_model(model_path)

    async def model(self, args: ModelArgs, unit: _Unit) -> ModelFacts:
        """The served model: its config.json on the host, else the catalogue's entry, named as such."""
        spec: ModelSpec | None = None
        config_path: str | None = None
        source = "the unit's ExecStart names no --model-path"
        if args.model_path:
            spec, config_path, source = await self.read_config(args.model_path, args.revision, unit)
        config_from: Literal["host", "catalogue"] | None = "host" if spec is not None else None
        if spec is None:
            fallback = self.catalogue(args.model_path)
            if fallback is not None:
                source = f"{source}: the model's shape comes from the console's catalogue ({fallback.name})."
                spec, config_from = fallback, "catalogue"
            else:
                source = f"{source}, and the console's catalogue has no entry for it: the model's shape is unknown."
            self.notes.append(source)
        shape = None
        if spec is not None:
            try:
                shape = model_shape(spec, tp=args.tp_size, kv_cache_dtype=args.kv_cache_dtype)
            except ModelConfigError as exc:
                self.notes.append(str(exc))
        from_hub = bool(args.model_path and is_repo_id(args.model_path))
        hub, hub_source = hf_hub_dir(unit.env, "~")
        return ModelFacts(
            path=args.model_path,
            tokenizer_path=args.tokenizer_path,
            revision=args.revision,
            config_path=config_path,
            config_from=config_from,
            source=source,
            hub_cache=hub if from_hub else None,
            hub_cache_source=hub_source if from_hub else None,
            shape=shape,
            spec=spec,
        )

    async def draft(self, args: ModelArgs, unit: _Unit, target: ModelSpec | None) -> DraftFacts | None:
        """The speculative draft's pool: its own config.json, or the target's NEXTN layers."""
        if not args.speculative_algorithm:
            return None
        draft_spec = None
        draft_path = None
        source = "the target's own layers (no --speculative-draft-model-path)"
        if args.draft_model_path:
            draft_spec, draft_path, source = await self.read_config(
                args.draft_model_path, args.draft_revision, unit
            )
            if draft_spec is None:
                self.notes.append(f"{source}: the draft pool is not sized.")
        return draft_facts(
            args.speculative_algorithm,
            target,
            draft_spec,
            path=args.draft_model_path,
            config_path=draft_path,
            source=source,
            tp=args.tp_size,
            kv_cache_dtype=args.kv_cache_dtype,
        )

    async def gpus(self) -> tuple[list[GpuFacts], str]:
        """The host's cards, from one reading of its GPU sampler (the NVML agent where the host's python3
        has nvidia-ml-py, else nvidia-smi), with their peak bandwidth: NVML's own (2 × the maximum memory
        clock × the bus width / 8) where the back-end reads it, else the bandwidth table's; the two are
        checked against each other. An unknown card is named as unknown."""
        sampler, sample = await open_sampler(self.transport, interval_s=1.0, host=self.host.name)
        await sampler.close()
        if not sample.gpus and sampler.backend in ("agent", "nvml"):
            # the agent answered but without GPUs: what nvidia-smi says is the clearer sentence
            sample = await NvidiaSmiSampler(
                self.transport, host=self.host.name, timeout_s=self.timeout_s
            ).sample()
        via = {"agent": "NVML (the GPU agent)", "nvml": "NVML", "amd-smi": "amd-smi", "rocm-smi": "rocm-smi"}
        backend = via.get(sample.backend or "", "nvidia-smi")
        source = (
            f"{backend} on {self.host.name}" if sample.gpus else (sample.detail or f"{backend} gave no GPUs")
        )
        out: list[GpuFacts] = []
        for gpu in sample.gpus:
            entry = card_bandwidth(gpu.name, gpu.memory_total_mib)
            own = peak_bandwidth_gbs(gpu)
            if own is not None:
                facts = GpuFacts(
                    index=gpu.index,
                    name=gpu.name,
                    memory_total_mib=gpu.memory_total_mib,
                    peak_bandwidth_gbs=round(own, 1),
                    bandwidth_card=entry.name if entry else None,
                    bandwidth_source=(
                        f"NVML: 2 × max memory clock {gpu.clock_mem_max_mhz:,.0f} MHz × "
                        f"{gpu.memory_bus_width_bits:,}-bit bus / 8"
                    ),
                    peak_from="nvml",
                    table_peak_gbs=entry.peak_gbs if entry else None,
                )
            else:
                facts = GpuFacts(
                    index=gpu.index,
                    name=gpu.name,
                    memory_total_mib=gpu.memory_total_mib,
                    peak_bandwidth_gbs=entry.peak_gbs if entry else None,
                    bandwidth_card=entry.name if entry else None,
                    bandwidth_source=entry.source
                    if entry
                    else f"unknown: {gpu.name or 'this card'} is not in the bandwidth table",
                    peak_from="table" if entry else None,
                    table_peak_gbs=entry.peak_gbs if entry else None,
                )
            out.append(facts)
        apart = sorted(
            {
                f"{g.name}: NVML {g.peak_bandwidth_gbs:,.0f} GB/s, the table {g.table_peak_gbs:,.0f}"
                for g in out
                if g.peak_from == "nvml"
                and g.peak_bandwidth_gbs
                and g.table_peak_gbs
                and abs(g.peak_bandwidth_gbs - g.table_peak_gbs) > 0.05 * g.table_peak_gbs
            }
        )
        if apart:
            self.notes.append(
                f"the card's own peak and the bandwidth table's differ by more than 5% ({'; '.join(apart)}): "
                "the card's own is reported; check the table's row (docs/gpu-bandwidth.md)."
            )
        unknown = sorted({g.name or "?" for g in out if g.peak_bandwidth_gbs is None})
        if unknown:
            self.notes.append(
                f"{', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not in the bandwidth table: "
                "the peak bandwidth is unknown (docs/gpu-bandwidth.md lists the cards it knows)."
            )
        return out, source


async def learn_host(
    host: HostConfig,
    transport: Transport,
    *,
    cache_dir: Path | None = None,
    timeout_s: float = 60.0,
    gpus: bool = True,
) -> HostFacts:
    """What the console can learn about `host` through a started `transport`; each fact says where it
    came from, and each fallback taken is a note. Raises HostInfoError only when the unit itself cannot
    be read."""
    learner = _Learner(host, transport, cache_dir or default_cache_dir(), timeout_s)
    unit = await learner.unit()
    argv, env = unit.argv, unit.env
    python, interpreter_source = await learner.interpreter(argv)
    probe: dict[str, Any] = {}
    why_not: str | None = None
    if python is None:
        why_not = interpreter_source
    else:
        probe, why_not = await learner.sglang(python, env)
    if python is None or not probe.get("path"):
        sglang = SglangFacts(source=why_not or interpreter_source)
    else:
        sglang = SglangFacts(
            version=probe.get("version"),
            path=probe.get("path"),
            source=why_not or f"{probe.get('version_from') or 'not found'}, asked of {python}",
        )
    flags, flag_list = await learner.flags(python, env, probe, why_not)
    args = model_args(argv, flag_list)
    learner.notes.extend(f"the running ExecStart: {p}" for p in args.problems)

    model = await learner.model(args, unit)
    draft = await learner.draft(args, unit, model.spec)
    gpu_facts, gpus_source = await learner.gpus() if gpus else ([], "not asked")

    return HostFacts(
        host=host.name,
        unit=host.unit,
        exec_start=argv,
        working_directory=unit.working_directory or None,
        interpreter=python,
        interpreter_source=interpreter_source,
        python_version=probe.get("python") if isinstance(probe.get("python"), str) else None,
        sglang=sglang,
        flags=flags,
        model=model,
        kv_cache_dtype=args.kv_cache_dtype,
        tp_size=args.tp_size,
        draft=draft,
        gpus=gpu_facts,
        gpus_source=gpus_source,
        notes=learner.notes,
    )


__all__ = [
    "EXTRACTOR_SCRIPT",
    "PROBE_SCRIPT",
    "HostInfoError",
    "default_cache_dir",
    "host_flag_list",
    "learn_host",
    "shipped_flag_list",
]


async def learn_with_flags(
    host: HostConfig, transport: Transport, *, cache_dir: Path | None = None
) -> tuple[HostFacts, FlagList]:
    """`learn_host` once the host answers, and the flag list its facts name (the host's own, from the
    local cache, else the shipped one): what the console's header and profile editor show."""
    await transport.wait_up(None)
    facts = await learn_host(host, transport, cache_dir=cache_dir, gpus=False)
    flags = await asyncio.to_thread(host_flag_list, facts, cache_dir)
    return facts, flags
