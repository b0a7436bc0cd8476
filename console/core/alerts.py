"""Alerts: rules read from the config, evaluated on each reading of a host, fire/clear transitions.

A rule is `metric op number` (`ttft_p99_s > 5`, `queue > 16`, `kv_used_pct > 95`, `gpu_mem_free_gib < 1`)
with `metric` a name of the fixed table `METRICS` (each mapped to a figure of `ServingFigures` or of the
host's snapshot) and `op` one of `>`, `>=`, `<`, `<=`; or one of the state rules `error` (the current boot
has logged errors) and `service_not_active` (systemd says the unit is not `active`).

A figure the reading does not have (the server does not export it, one scrape only, no GPU sample) never
makes a rule fire; an alert already firing stays firing until the figure is read again and the condition
is false, so a server that stops answering does not "clear" its own latency alert. Transitions have no
hysteresis: the first reading past the threshold fires, the first one back clears. `evaluate` is pure:
it takes the rules, one reading and the firing set, and returns the new firing set and the transitions.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from console.core import gpuhealth
from console.core.gpus import XID_KEEP_S

if TYPE_CHECKING:
    # Named in signatures only. Every command that reads hosts.toml parses its [alerts] rules here, and
    # the snapshot would bring the serving figures and the metric table built at import (`verify HOST`
    # paid ~10 ms for them).
    from console.core.gpus import GpuSample
    from console.core.serving import Latency, ServingFigures
    from console.core.snapshot import HostSnapshot
    from console.core.state import Boot


class AlertError(ValueError):
    """A rule that cannot be read; `str()` is one sentence for the operator."""


class Severity(StrEnum):
    WARNING = "warning"
    CRITICAL = "critical"


_RANK = {Severity.WARNING: 1, Severity.CRITICAL: 2}


class AlertInputs(BaseModel, defer_build=True):
    """One reading of a host, as the rules see it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    figures: dict[str, float] = Field(default_factory=dict)
    """Metric name (of `METRICS`) → value; a figure the reading lacks is not in it."""
    service_state: str | None = None
    """systemd's ActiveState of the unit (`active`, `inactive`, `failed`, …); None when unknown."""
    service_detail: str | None = None
    errors: tuple[str, ...] = ()
    """The current boot's errors (`category: message`), oldest first."""
    errors_known: bool = True
    """False when the journal could not be read: the `error` rule neither fires nor clears."""
    details: dict[str, str] = Field(default_factory=dict)
    """Metric name → what the figure counts, in words (`GPU3 XID 79: GPU has fallen off the bus`)."""


@dataclass(frozen=True)
class MetricDef:
    description: str
    read: Callable[[ServingFigures | None, HostSnapshot | None], float | None]
    severity: Severity = Severity.WARNING
    """A rule on this metric's severity unless the config says otherwise."""
    explain: Callable[[HostSnapshot | None], str | None] | None = None
    """What the figure counts, in words, for the alert's message (the GPU faults: which GPU, why)."""


def _latency(attr: str, q: str) -> Callable[[ServingFigures | None, HostSnapshot | None], float | None]:
    def read(s: ServingFigures | None, _: HostSnapshot | None) -> float | None:
        lat: Latency | None = getattr(s, attr) if s is not None else None
        return getattr(lat, q) if lat is not None else None

    return read


def _gauge(attr: str) -> Callable[[ServingFigures | None, HostSnapshot | None], float | None]:
    """A gauge of the serving figures, else the same gauge of the snapshot's newest `/metrics` reading."""
    fallback = {"queued": "num_queue_reqs", "running": "num_running_reqs"}.get(attr)

    def read(s: ServingFigures | None, snap: HostSnapshot | None) -> float | None:
        value: float | None = getattr(s, attr) if s is not None else None
        if value is None and fallback is not None and snap is not None and snap.server is not None:
            metrics = snap.server.metrics
            value = getattr(metrics, fallback) if metrics is not None else None
        return value

    return read


def _kv_used_pct(s: ServingFigures | None, snap: HostSnapshot | None) -> float | None:
    if s is not None:
        if s.kv_used is not None and s.kv_pool:
            return 100.0 * s.kv_used / s.kv_pool
        if s.token_usage is not None:
            return 100.0 * s.token_usage
    metrics = snap.server.metrics if snap is not None and snap.server is not None else None
    if metrics is None:
        return None
    used = metrics.kv_used_tokens if metrics.kv_used_tokens is not None else metrics.num_used_tokens
    if used is not None and metrics.max_total_num_tokens:
        return 100.0 * used / metrics.max_total_num_tokens
    return 100.0 * metrics.token_usage if metrics.token_usage is not None else None


def _running_pct(s: ServingFigures | None, snap: HostSnapshot | None) -> float | None:
    running = _gauge("running")(s, snap)
    if running is None or s is None or not s.max_running:
        return None
    return 100.0 * running / s.max_running


def _gpu_mem_free_gib(_: ServingFigures | None, snap: HostSnapshot | None) -> float | None:
    """The least free memory of any GPU of the host (GiB)."""
    if snap is None or snap.gpus is None:
        return None
    free = [g.memory_free_mib for g in snap.gpus.gpus if g.memory_free_mib is not None]
    return min(free) / 1024.0 if free else None


def _gpu_util_pct(_: ServingFigures | None, snap: HostSnapshot | None) -> float | None:
    """The least busy GPU's utilization (%): a GPU idle while others work."""
    if snap is None or snap.gpus is None:
        return None
    util = [g.utilization_pct for g in snap.gpus.gpus if g.utilization_pct is not None]
    return min(util) if util else None


def _gpus(snap: HostSnapshot | None) -> tuple[GpuSample, ...] | None:
    if snap is None or snap.gpus is None or not snap.gpus.gpus:
        return None
    return snap.gpus.gpus


def _gpu_label(pos: int, gpu: GpuSample) -> str:
    return f"GPU{gpu.index if gpu.index is not None else pos}"


def _gpu_count(judge: str) -> Callable[[ServingFigures | None, HostSnapshot | None], float | None]:
    def read(_: ServingFigures | None, snap: HostSnapshot | None) -> float | None:
        gpus = _gpus(snap)
        return gpuhealth.count(gpus, judge) if gpus is not None else None

    return read


def _gpu_sum(
    attr: str, *, flag: bool = False
) -> Callable[[ServingFigures | None, HostSnapshot | None], float | None]:
    """The sum of one health figure (a count, or GPUs whose flag is set) over the GPUs that read it."""

    def read(_: ServingFigures | None, snap: HostSnapshot | None) -> float | None:
        values = [getattr(g, attr) for g in _gpus(snap) or ()]
        known = [v for v in values if v is not None]
        if not known:
            return None
        return float(sum(bool(v) for v in known) if flag else sum(known))

    return read


def _gpu_lost(_: ServingFigures | None, snap: HostSnapshot | None) -> float | None:
    """GPUs that no longer answer (`gpuhealth.lost`); None without a sample of GPUs."""
    gpus = _gpus(snap)
    return float(sum(gpuhealth.lost(g) for g in gpus)) if gpus is not None else None


def _gpu_temp_c(_: ServingFigures | None, snap: HostSnapshot | None) -> float | None:
    """The hottest GPU's temperature (°C)."""
    temps = [g.temperature_c for g in _gpus(snap) or () if g.temperature_c is not None]
    return max(temps) if temps else None


def _gpu_xid(_: ServingFigures | None, snap: HostSnapshot | None) -> float | None:
    """XID events of the last hour over all GPUs; None where no back-end watches for them (nvidia-smi)."""
    gpus = _gpus(snap)
    if gpus is None or snap is None or snap.gpus is None or snap.gpus.backend == "nvidia-smi":
        return None
    return float(sum(1 for g in gpus for x in g.xids if x.age_s is None or x.age_s <= XID_KEEP_S))


def _explain(kinds: tuple[str, ...]) -> Callable[[HostSnapshot | None], str | None]:
    """The faults of these kinds, GPU by GPU, in words: what the operator reads in the alert."""

    def explain(snap: HostSnapshot | None) -> str | None:
        said = [
            f"{_gpu_label(pos, g)} {f.words}"
            for pos, g in enumerate(_gpus(snap) or ())
            for f in gpuhealth.faults(g)
            if f.kind in kinds
        ]
        if not said:
            return None
        more = f"; and {len(said) - 3} more" if len(said) > 3 else ""
        return "; ".join(said[:3]) + more

    return explain


def _serving(
    attr: str, scale: float = 1.0
) -> Callable[[ServingFigures | None, HostSnapshot | None], float | None]:
    def read(s: ServingFigures | None, _: HostSnapshot | None) -> float | None:
        value: float | None = getattr(s, attr) if s is not None else None
        return None if value is None else value * scale

    return read


def _metrics() -> dict[str, MetricDef]:
    table: dict[str, MetricDef] = {}
    for attr, words in (
        ("ttft", "time to first token"),
        ("itl", "inter-token latency"),
        ("e2e", "end-to-end request latency"),
        ("queue_time", "time in the queue"),
    ):
        for q in ("p50", "p90", "p99", "mean"):
            table[f"{attr}_{q}_s"] = MetricDef(f"{words}, {q} over the window (seconds)", _latency(attr, q))
    table["queue"] = MetricDef("requests waiting in the queue (summed over DP ranks)", _gauge("queued"))
    table["running"] = MetricDef("requests running", _gauge("running"))
    table["running_pct"] = MetricDef("requests running, % of max_running_requests", _running_pct)
    table["kv_used_pct"] = MetricDef(
        "KV tokens used, % of the pool (else SGLang's token usage)", _kv_used_pct
    )
    table["token_usage_pct"] = MetricDef(
        "the fullest pool's usage, % (kv, swa or mamba)", _serving("token_usage", 100.0)
    )
    table["gen_tok_s"] = MetricDef("generation tokens per second over the window", _serving("gen_tok_s"))
    table["prefill_tok_s"] = MetricDef("prefill tokens per second over the window", _serving("prefill_tok_s"))
    table["requests_s"] = MetricDef("requests per second over the window", _serving("requests_s"))
    table["cache_hit_pct"] = MetricDef(
        "prefix cache hit rate over the window, %", _serving("cache_hit_rate", 100.0)
    )
    table["gpu_mem_free_gib"] = MetricDef("the least free memory of any GPU (GiB)", _gpu_mem_free_gib)
    table["gpu_util_pct"] = MetricDef("the least busy GPU's utilization (%)", _gpu_util_pct)
    table["gpu_temp_c"] = MetricDef("the hottest GPU's temperature (°C)", _gpu_temp_c)
    table["gpu_thermal_slowdown"] = MetricDef(
        "working GPUs whose clocks are held down by heat (SW/HW thermal slowdown, HW slowdown)",
        _gpu_count("thermal"),
        explain=_explain(("thermal",)),
    )
    table["gpu_power_capped"] = MetricDef(
        "working GPUs whose clocks are held by their power limit (SW power cap, HW power brake)",
        _gpu_count("power"),
        explain=_explain(("power",)),
    )
    table["gpu_pcie_degraded"] = MetricDef(
        "GPUs whose PCIe link runs below its maximum (fewer lanes; a lower generation while working)",
        _gpu_count("pcie"),
        explain=_explain(("pcie",)),
    )
    table["gpu_ecc_uncorrected"] = MetricDef(
        "uncorrectable ECC errors since the driver loaded, all GPUs (volatile)",
        _gpu_sum("ecc_uncorrected_volatile"),
        Severity.CRITICAL,
        _explain(("ecc",)),
    )
    table["gpu_remap_pending"] = MetricDef(
        "GPUs with a memory row remap waiting for a reset",
        _gpu_sum("remap_pending", flag=True),
        explain=_explain(("remap_pending",)),
    )
    table["gpu_remap_failed"] = MetricDef(
        "GPUs where a memory row could not be remapped",
        _gpu_sum("remap_failed", flag=True),
        Severity.CRITICAL,
        _explain(("remap_failed",)),
    )
    table["gpu_lost"] = MetricDef(
        "GPUs that no longer answer their driver (fallen off the bus: NVML's GPU is lost, nvidia-smi's "
        "'Unable to determine the device handle', XID 79)",
        _gpu_lost,
        Severity.CRITICAL,
        _explain(("lost",)),
    )
    table["gpu_xid"] = MetricDef(
        "XID critical-error events in the last hour, all GPUs (NVML back-ends: local and the agent)",
        _gpu_xid,
        Severity.CRITICAL,
        _explain(("xid",)),
    )
    return table


METRICS: dict[str, MetricDef] = _metrics()
"""Every metric name a rule may use, with what it reads."""

STATE_RULES: dict[str, str] = {
    "error": "the current boot has logged errors (the journal's error lines and tracebacks)",
    "service_not_active": "systemd says the unit is not active (inactive, failed, deactivating, …)",
}

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
}
_RULE = re.compile(
    r"^\s*([a-z][a-z0-9_]*)\s*(>=|<=|>|<)\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*$"
)


class Rule(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    """The rule in its normal form (`queue > 16`): what transitions and the firing set are keyed by."""
    metric: str
    op: str | None = None
    threshold: float | None = None
    severity: Severity = Severity.WARNING


def parse_rule(text: object, severity: Severity | str | None = None) -> Rule:
    """`metric op number`, `error` or `service_not_active`; anything else is an `AlertError`."""
    if not isinstance(text, str):
        raise AlertError(f'an alert rule must be a string such as "queue > 16", not {text!r}.')
    sev = _severity(severity)
    name = text.strip()
    if name in STATE_RULES:
        return Rule(key=name, metric=name, severity=sev or Severity.CRITICAL)
    match = _RULE.match(text)
    if match is None:
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise AlertError(
            f'the alert rule {shown!r} is not `metric op number` (such as "queue > 16") nor one of '
            f"{', '.join(STATE_RULES)}."
        )
    metric, op, number = match.groups()
    if metric not in METRICS:
        raise AlertError(
            f"the alert rule {text.strip()!r} names an unknown metric {metric!r}; known: {', '.join(METRICS)}, "
            f"{', '.join(STATE_RULES)}."
        )
    threshold = float(number)
    if not math.isfinite(threshold):
        raise AlertError(f"the alert rule {text.strip()!r} has no finite threshold.")
    return Rule(
        key=f"{metric} {op} {threshold:g}",
        metric=metric,
        op=op,
        threshold=threshold,
        severity=sev or METRICS[metric].severity,
    )


def _severity(value: Severity | str | None) -> Severity | None:
    if value is None or isinstance(value, Severity):
        return value
    try:
        return Severity(value)
    except ValueError:
        raise AlertError(
            f"an alert's severity must be one of {', '.join(s.value for s in Severity)}, not {value!r}."
        ) from None


DEFAULT_RULES: tuple[str, ...] = (
    "service_not_active",
    "error",
    "ttft_p99_s > 5",
    "queue > 16",
    "kv_used_pct > 95",
    "gpu_mem_free_gib < 1",
    "gpu_lost > 0",
    "gpu_xid > 0",
    "gpu_ecc_uncorrected > 0",
    "gpu_remap_failed > 0",
    "gpu_remap_pending > 0",
    "gpu_thermal_slowdown > 0",
    "gpu_power_capped > 0",
    "gpu_pcie_degraded > 0",
)
"""The rules used when the config has no `[alerts] rules`."""


def default_rules() -> tuple[Rule, ...]:
    return tuple(parse_rule(r) for r in DEFAULT_RULES)


def parse_rules(items: Sequence[object]) -> tuple[Rule, ...]:
    """Rules from the config: each a string, or a table `{ when = "...", severity = "critical" }`.
    Duplicates (same normal form) are one rule."""
    out: dict[str, Rule] = {}
    for item in items:
        if isinstance(item, dict):
            unknown = sorted(set(item) - {"when", "severity"})
            if unknown:
                raise AlertError(
                    f"an alert rule table has an unknown key {unknown[0]!r} (known: when, severity)."
                )
            if "when" not in item:
                raise AlertError('an alert rule table needs `when`, such as { when = "queue > 16" }.')
            rule = parse_rule(item["when"], item.get("severity"))
        else:
            rule = parse_rule(item)
        out.setdefault(rule.key, rule)
    return tuple(out.values())


# ------------------------------------------------------------------------------------------- readings


def service_state_of_boot(boot: Boot | None) -> str | None:
    """What systemd would say of the unit, from the boot the journal shows (the console's live view has
    no `systemctl show` of its own): stopping → deactivating, stopped → inactive, failed → failed; a boot
    in any other phase runs (active). None without a boot."""
    if boot is None:
        return None
    return {"stopping": "deactivating", "stopped": "inactive", "failed": "failed"}.get(
        str(boot.phase), "active"
    )


def alert_inputs(
    snap: HostSnapshot | None,
    serving: ServingFigures | None = None,
    *,
    boot: Boot | None = None,
    service_state: str | None = None,
    service_detail: str | None = None,
    errors_known: bool = True,
) -> AlertInputs:
    """The reading the rules see: every `METRICS` figure the serving figures or the snapshot hold, the
    service's state (given, else from the boot) and the boot's errors."""
    figures: dict[str, float] = {}
    details: dict[str, str] = {}
    for name, metric in METRICS.items():
        value = metric.read(serving, snap)
        if value is not None and math.isfinite(value):
            figures[name] = float(value)
            said = metric.explain(snap) if metric.explain is not None and value else None
            if said:
                details[name] = said
    if service_state is None:
        service_state = service_state_of_boot(boot)
        if service_state is not None and service_detail is None and boot is not None and boot.unit_result:
            service_detail = boot.unit_result
    errors = tuple(f"{e.category}: {e.message}" for e in boot.errors) if boot is not None else ()
    return AlertInputs(
        figures=figures,
        service_state=service_state,
        service_detail=service_detail,
        errors=errors,
        errors_known=errors_known,
        details=details,
    )


# ----------------------------------------------------------------------------------------- evaluation


class TransitionKind(StrEnum):
    FIRED = "fired"
    CLEARED = "cleared"


class Alert(BaseModel, defer_build=True):
    """One rule's verdict on one reading; the JSON the hook gets on stdin."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str
    rule: str
    severity: Severity
    state: TransitionKind
    value: float | None = None
    """The figure read (the error count for `error`); None for `service_not_active`."""
    message: str
    ts: float


class Evaluation(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True, extra="forbid")

    firing: dict[str, Alert] = Field(default_factory=dict)
    """Rule key → the alert that fired it, for every rule firing after this reading."""
    transitions: tuple[Alert, ...] = ()
    """What changed with this reading, in rule order."""

    def worst(self) -> Alert | None:
        return worst(self.firing.values())


def worst(alerts: Iterable[Alert]) -> Alert | None:
    """The most severe firing alert; the first of the equals (rule order)."""
    best: Alert | None = None
    for alert in alerts:
        if best is None or _RANK[alert.severity] > _RANK[best.severity]:
            best = alert
    return best


def _verdict(rule: Rule, inputs: AlertInputs) -> tuple[bool | None, float | None, str]:
    """(True/False, or None when unknown; the value; words for the feed)."""
    if rule.metric == "service_not_active":
        state = inputs.service_state
        if state is None:
            return None, None, "the service's state is unknown"
        detail = f" ({inputs.service_detail})" if inputs.service_detail else ""
        if state != "active":
            return True, None, f"the service is {state}{detail}, not active"
        return False, None, "the service is active"
    if rule.metric == "error":
        if not inputs.errors_known:
            return None, None, "the journal was not read"
        n = len(inputs.errors)
        if n:
            return True, float(n), f"{n} error(s) since this boot; newest: {inputs.errors[-1]}"
        return False, 0.0, "no error since this boot"
    value = inputs.figures.get(rule.metric)
    if value is None:
        return None, None, f"{rule.metric} is not available"
    assert rule.op is not None and rule.threshold is not None
    holds = _OPS[rule.op](value, rule.threshold)
    said = inputs.details.get(rule.metric)
    return holds, value, f"{rule.metric} = {value:.4g} ({rule.key})" + (f": {said}" if said else "")


def evaluate(
    rules: Sequence[Rule],
    inputs: AlertInputs,
    firing: dict[str, Alert] | None = None,
    *,
    host: str,
    ts: float,
) -> Evaluation:
    """Each rule on one reading. A rule fires on the first reading where it holds and clears on the first
    where it does not; an unknown figure leaves the rule as it was. `firing` is the previous evaluation's
    (rules no longer configured are dropped silently)."""
    before = firing or {}
    now: dict[str, Alert] = {}
    transitions: list[Alert] = []
    for rule in rules:
        holds, value, words = _verdict(rule, inputs)
        was = before.get(rule.key)
        if holds is None:
            if was is not None:
                now[rule.key] = was
            continue
        if holds:
            alert = Alert(
                host=host,
                rule=rule.key,
                severity=rule.severity,
                state=TransitionKind.FIRED,
                value=value,
                message=words,
                ts=ts,
            )
            now[rule.key] = was if was is not None else alert
            if was is None:
                transitions.append(alert)
        elif was is not None:
            transitions.append(
                Alert(
                    host=host,
                    rule=rule.key,
                    severity=rule.severity,
                    state=TransitionKind.CLEARED,
                    value=value,
                    message=words,
                    ts=ts,
                )
            )
    return Evaluation(firing=now, transitions=tuple(transitions))
