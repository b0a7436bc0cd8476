"""SGLang's Prometheus `/metrics` text → numbers.

The Prometheus text exposition format (what `prometheus_client` writes for SGLang's multiprocess
registry) is read by `prometheus_client`'s own parser; here are `SglangMetrics`, the handful of `sglang:*` figures the console shows.

Every generation of SGLang's names is read as today's (`normalise`, the table in `serving_metrics`): the
2024-11 build's `num_requests_running`/`num_requests_waiting`, `name=` label and percent `cache_hit_rate`,
0.5.2's `queue_time_s`, and an `sglang_` re-export (a gRPC sidecar or an exporter that rewrites the colon);
`read_as` says what was read as what.

SGLang labels each series with `model_name`, `engine_type` (0.4.6 on), `tp_rank`, `pp_rank` (0.5.1 on),
`moe_ep_rank` (0.5.9 on), `dp_rank` (with data parallelism) and `priority` (with priority scheduling).
Series that differ only by `tp_rank`, `pp_rank` or `moe_ep_rank` are copies of one scheduler group's
figures (the first attention-TP rank reports them; `--enable-metrics-for-all-schedulers` makes every TP
rank repeat them, and every pipeline stage holds the same requests): one of them is read
(`MetricsText.replicas`). Groups that differ by anything else (`dp_rank`, `engine_type`, a re-export's
`worker_addr`, the model) are different replicas: counts add up across them, ratios average. A gauge's
`priority=""` series is the total of its `priority="<n>"` breakdown, which is then left out.

Every value is checked where a scrape becomes numbers (`MetricsText`, however it is made: parsed, or read
back from a recording): each of SGLang's figures is a count, a size, a time or a ratio, so a value that is
not a finite number from 0 to `VALUE_MAX` (NaN, ±Inf, negative, absurd) refuses its whole metric family,
every series of it (a sum or a mean over the rest would be wrong without saying so), and the family is
named in `refused` with the value: it reads as absent, with why, never as a number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from console.core.serving_metrics import DEV_2024_11_MARKERS, METRICS, RENAMED
from console.core.text import split_lines

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric


class MetricSample(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    value: float


VALUE_MAX = 1e15
"""The largest value read from `/metrics`: 10^15 tokens is 30 years at a million tokens a second, 10^15
bytes a petabyte. Past it (or below 0, or not finite) a metric family is refused."""

_SUFFIXES = ("_bucket", "_count", "_sum", "_created")


def family_of(name: str) -> str:
    """The metric family a sample belongs to: a histogram's buckets, count and sum are one."""
    if not name.endswith(_SUFFIXES):
        return name
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def sane_value(value: object) -> float | None:
    """`value` as a float when it is a finite number from 0 to `VALUE_MAX`, else None."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return number if 0.0 <= number <= VALUE_MAX else None  # NaN compares false


class MetricsText(BaseModel, defer_build=True):
    """Every sample of one scrape, with the declared types."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    samples: tuple[MetricSample, ...] = ()
    types: dict[str, str] = Field(default_factory=dict)
    skipped_lines: int = 0
    """Lines that were neither a comment nor a sample (kept as a count: a scrape is never an error)."""
    refused: dict[str, str] = Field(default_factory=dict)
    """Metric family → the first value out of range it held (`+Inf`, `-3`): its samples are left out."""
    read_as: dict[str, str] = Field(default_factory=dict)
    """A family (or label, or unit) as the server wrote it → how it was read (`normalise`)."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_out_of_range(cls, data: Any) -> Any:
        """The one check of every value a scrape holds, parsed or read back (see the module's doc)."""
        if not isinstance(data, dict) or not data.get("samples"):
            return data
        samples = list(data["samples"])
        refused = dict(data.get("refused") or {})
        values = [s.value if isinstance(s, MetricSample) else _field(s, "value") for s in samples]
        names = [s.name if isinstance(s, MetricSample) else _field(s, "name") for s in samples]
        for name, value in zip(names, values, strict=True):
            if sane_value(value) is None:
                refused.setdefault(family_of(str(name)), _shown(value))
        if not refused:
            return data
        kept = [s for s, name in zip(samples, names, strict=True) if family_of(str(name)) not in refused]
        return {**data, "samples": tuple(kept), "refused": refused}

    @cached_property
    def by_name(self) -> dict[str, tuple[MetricSample, ...]]:
        """The samples of each name, in the scrape's order: a figure looks up its series without
        scanning the whole scrape (each scrape is read for ~25 names, 2-3 times each)."""
        grouped: dict[str, list[MetricSample]] = {}
        for s in self.samples:
            grouped.setdefault(s.name, []).append(s)
        return {name: tuple(found) for name, found in grouped.items()}

    @cached_property
    def derived(self) -> dict[tuple[str, str], Any]:
        """Figures read off this scrape, each made once (`console.core.serving` reads each scrape twice,
        as the newer then the older of a pair)."""
        return {}

    def series(self, name: str, **labels: str) -> list[MetricSample]:
        found = self.by_name.get(name, ())
        if not labels:
            return list(found)
        return [s for s in found if all(s.labels.get(k) == v for k, v in labels.items())]

    def replicas(self, name: str, **labels: str) -> list[MetricSample]:
        """The series of `name` less copies: one per scheduler group (see the module's doc), and a
        gauge's `priority=""` total without its per-priority breakdown."""
        found = self.series(name, **labels)
        if len(found) < 2:
            return found
        if _may_be_gauge(name, self.types) and any(s.labels.get("priority") == "" for s in found):
            found = [s for s in found if s.labels.get("priority", "") == ""]
        kept: dict[tuple[tuple[str, str], ...], MetricSample] = {}
        for s in found:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k not in REPLICA_LABELS))
            other = kept.get(key)
            if other is None or _rank_order(s) < _rank_order(other):
                kept[key] = s
        return list(kept.values())

    def total(self, name: str, **labels: str) -> float | None:
        values = [s.value for s in self.replicas(name, **labels) if not math.isnan(s.value)]
        return sum(values) if values else None

    def mean(self, name: str, **labels: str) -> float | None:
        values = [s.value for s in self.replicas(name, **labels) if not math.isnan(s.value)]
        return sum(values) / len(values) if values else None

    def maximum(self, name: str, **labels: str) -> float | None:
        values = [s.value for s in self.replicas(name, **labels) if not math.isnan(s.value)]
        return max(values) if values else None

    def label_values(self, name: str, label: str) -> tuple[str, ...]:
        """The values `label` takes on `name`'s series, sorted (numbers by value)."""
        values = {s.labels[label] for s in self.series(name) if label in s.labels}
        return tuple(sorted(values, key=lambda v: (not v.isdigit(), int(v) if v.isdigit() else 0, v)))

    def histogram(self, name: str, **labels: str) -> Histogram | None:
        """Buckets summed across series (the `le` label kept apart); None when the metric is absent."""
        count = self.total(f"{name}_count", **labels)
        if count is None:
            return None
        buckets: dict[float, float] = {}
        for s in self.replicas(f"{name}_bucket", **labels):
            le = _float(s.labels.get("le", ""))
            if le is not None:
                buckets[le] = buckets.get(le, 0.0) + s.value
        return Histogram(
            count=count,
            sum=self.total(f"{name}_sum", **labels) or 0.0,
            buckets=tuple(sorted(buckets.items())),
        )


REPLICA_LABELS = frozenset({"tp_rank", "pp_rank", "moe_ep_rank"})
"""Labels whose series are copies of one scheduler group's figures (see the module's doc)."""


def _may_be_gauge(name: str, types: Mapping[str, str]) -> bool:
    declared = types.get(family_of(name))
    if declared is not None:
        return declared == "gauge"
    return not name.endswith(("_total", "_bucket", "_count", "_sum", "_created"))


def _rank_order(sample: MetricSample) -> tuple[int, ...]:
    """Which copy is read: the lowest pipeline stage, then the lowest TP and EP rank."""
    return tuple(
        int(v) if (v := sample.labels.get(k, "0")).isdigit() else 1 << 30
        for k in ("pp_rank", "tp_rank", "moe_ep_rank")
    )


def _field(sample: object, name: str) -> object:
    return sample.get(name) if isinstance(sample, dict) else getattr(sample, name, None)


def _shown(value: object) -> str:
    """A refused value as the server wrote it, short (`+Inf`, `NaN`, `-3`, `1e+300`)."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return repr(value)[:40]
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    return f"{number:g}"


def refusal(family: str, value: str) -> str:
    """The sentence for a refused metric family."""
    return f"the server sent {value} for {family}: refused (not a finite number from 0 to {VALUE_MAX:g})"


class Histogram(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True, extra="forbid")

    count: float
    sum: float
    buckets: tuple[tuple[float, float], ...] = ()
    """(upper bound, cumulative count), ascending; the last bound is +inf."""

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None

    def quantile(self, q: float) -> float | None:
        """Upper bound of the bucket holding the q-quantile (what a dashboard's bucket bar shows)."""
        if not self.count or not self.buckets:
            return None
        rank = q * self.count
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                return bound
        return self.buckets[-1][0]


def text_string_to_metric_families(text: str) -> Iterable[Metric]:
    """prometheus_client's parser, imported when a scrape is first read: the package imports its HTTP
    exposition with it (urllib.request, http.server, wsgiref), 7-16 ms of CPU at the start of every
    command that only names these models (audit, verify, plan; docs/performance.md, "The command line's
    start")."""
    from prometheus_client.parser import text_string_to_metric_families as families

    return families(text)


def _float(text: str) -> float | None:
    try:
        return float(text)  # float() reads "+Inf", "-Inf", "NaN" and "1.5e+06" as Prometheus writes them
    except ValueError:
        return None


def _sample_line(line: str) -> list[MetricSample] | None:
    """One sample line on its own, through prometheus_client's parser; None when it is not one."""
    try:
        families = list(text_string_to_metric_families(line + "\n"))
    except (ValueError, TypeError, IndexError):
        return None
    out = [
        MetricSample(name=s.name, labels=dict(s.labels), value=float(s.value))
        for family in families
        for s in family.samples
    ]
    return out or None


_COLON = "sglang:"
_UNDERSCORE = "sglang_"
_READ_NAMES = frozenset(METRICS) | frozenset(RENAMED.values())
_HIT_RATE = "sglang:cache_hit_rate"
_UNDERSCORE_HIT_RATE = "sglang_cache_hit_rate"
_CONFIG_INFO = "sglang:cache_config_info"


def normalise(
    samples: list[MetricSample], types: dict[str, str]
) -> tuple[list[MetricSample], dict[str, str], dict[str, str]]:
    """The samples with every generation's names read as today's (serving_metrics' `ALIASES`), the
    declared types renamed alike, and what was read as what.

    - `sglang_<name>` (a re-export that rewrote the colon) as `sglang:<name>`, when the scrape holds no
      `sglang:` family (a re-export rewrites every name; 0.5.23's own `sglang_sidecar_*` sit beside
      `sglang:` ones and are left alone);
    - the 2024-11 build's `num_requests_running`/`num_requests_waiting`, 0.5.2's `queue_time_s`;
    - a `name=` label on a metric of the table (the 2024-11 PRs as published) as `model_name=` (SGLang's
      `func_latency_seconds` has a `name` label of its own, left alone);
    - `cache_hit_rate` in percent (the 2024-11 build, known by its own family names, or any value above 1,
      which a fraction never is) as a fraction;
    - 0.5.9–0.5.10's `cache_config_info{page_size,num_pages}` as the `page_size`/`num_pages` gauges.
    """
    read_as: dict[str, str] = {}
    names: set[str] = set()
    labelled = percent = False
    for s in samples:  # one pass: this runs on every scrape, and almost always finds nothing to do
        names.add(s.name)
        if "name" in s.labels and "model_name" not in s.labels:
            labelled = labelled or family_of(s.name).replace(_UNDERSCORE, _COLON, 1) in _READ_NAMES
        if s.value > 1.0 and (s.name == _HIT_RATE or s.name == _UNDERSCORE_HIT_RATE):
            percent = True
    colon = any(n.startswith(_COLON) for n in names)
    underscore = not colon and any(n.startswith(_UNDERSCORE) for n in names)
    families = {family_of(n) for n in names}
    dev_2024_11 = bool(families & DEV_2024_11_MARKERS)
    renames = bool(families & RENAMED.keys())
    percent = percent or dev_2024_11
    config_info = _CONFIG_INFO in families
    if not (underscore or renames or labelled or percent or config_info):
        return samples, types, read_as
    out: list[MetricSample] = []
    for s in samples:
        name, labels, value = s.name, s.labels, s.value
        if underscore and name.startswith(_UNDERSCORE):
            read_as.setdefault(family_of(name), _COLON + family_of(name)[len(_UNDERSCORE) :])
            name = _COLON + name[len(_UNDERSCORE) :]
        family = family_of(name)
        if family in RENAMED:
            read_as.setdefault(family, RENAMED[family])
            name = RENAMED[family] + name[len(family) :]
            family = RENAMED[family]
        if "name" in labels and "model_name" not in labels and family in _READ_NAMES:
            read_as.setdefault('label name="…"', 'label model_name="…"')
            labels = {("model_name" if k == "name" else k): v for k, v in labels.items()}
        if percent and name == _HIT_RATE:
            read_as.setdefault(_HIT_RATE, "a percent, read ÷ 100")
            value = value / 100.0
        if name == _CONFIG_INFO:
            out.extend(_config_info(labels, families, read_as))
            continue
        if name is s.name and labels is s.labels and value is s.value:
            out.append(s)
        else:
            out.append(MetricSample.model_construct(name=name, labels=labels, value=value))
    renamed_types = {}
    for family, kind in types.items():
        if underscore and family.startswith(_UNDERSCORE):
            family = _COLON + family[len(_UNDERSCORE) :]
        renamed_types[RENAMED.get(family, family)] = kind
    return out, renamed_types, read_as


def _config_info(labels: dict[str, str], families: set[str], read_as: dict[str, str]) -> list[MetricSample]:
    """`cache_config_info{page_size="16",num_pages="…"} 1` as the two gauges that replaced it."""
    rest = {k: v for k, v in labels.items() if k not in ("page_size", "num_pages")}
    out = []
    for label in ("page_size", "num_pages"):
        gauge = _COLON + label
        value = _float(labels.get(label, ""))
        if gauge in families or value is None:
            continue
        read_as.setdefault(f"{_CONFIG_INFO}{{{label}}}", gauge)
        out.append(MetricSample.model_construct(name=gauge, labels=rest, value=value))
    return out


def parse_prometheus(text: str) -> MetricsText:
    """Every sample of a Prometheus text scrape, read by `prometheus_client`'s own parser.

    A well-formed scrape (what SGLang serves) is parsed in one go. The parser refuses a whole text for
    one bad line, and a scrape is never an error here: then each sample line is read on its own, and
    the lines that are no sample are counted in `skipped_lines`.
    """
    types: dict[str, str] = {}
    lines = [raw.strip() for raw in split_lines(text)]
    for line in lines:
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
    try:
        samples = [
            MetricSample(name=s.name, labels=dict(s.labels), value=float(s.value))
            for family in text_string_to_metric_families("\n".join(lines) + "\n")
            for s in family.samples
        ]
        return _text(samples, types, 0)
    except (ValueError, TypeError, IndexError):
        pass
    samples = []
    skipped = 0
    for line in lines:
        if not line or line.startswith("#"):
            continue
        read = _sample_line(line)
        if read is None:
            skipped += 1
        else:
            samples.extend(read)
    return _text(samples, types, skipped)


def _text(samples: list[MetricSample], types: dict[str, str], skipped: int) -> MetricsText:
    samples, types, read_as = normalise(samples, types)
    return MetricsText(samples=tuple(samples), types=types, skipped_lines=skipped, read_as=read_as)


def _family_blocks(lines: list[str]) -> list[str]:
    """The text's lines in blocks, one per metric family: a block starts at a `# HELP` line, or at a
    `# TYPE` line of another family than the `# HELP` before it (samples before any are one block)."""
    blocks: list[list[str]] = [[]]
    family = None
    for line in lines:
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and (parts[1] == "HELP" or (parts[1] == "TYPE" and parts[2] != family)):
                if blocks[-1]:
                    blocks.append([])
                family = parts[2]
        blocks[-1].append(line)
    return ["\n".join(block) for block in blocks if block]


class PrometheusReader:
    """`parse_prometheus` with a memory of the previous scrape, for a client that scrapes one server
    again and again: a family whose lines are the same as in the previous scrape is not parsed again.

    prometheus_client's parser reads a character at a time (~4 ms for SGLang's 180 lines, most of the
    console's idle cost of a scrape every 2 s), while between two scrapes of an idle server only a
    few gauges change. A family is parsed alone, its block of lines from its `# HELP`: the samples are
    the same as the whole text's. A text the parser refuses is read by `parse_prometheus` (line by line)."""

    def __init__(self) -> None:
        self._blocks: dict[str, tuple[MetricSample, ...]] = {}
        self._last: tuple[str, MetricsText] | None = None
        self.parsed_blocks = 0
        """Blocks parsed since the reader was made (the others came from the previous scrape)."""

    def read(self, text: str) -> MetricsText:
        last = self._last
        if last is not None and last[0] == text:
            # An idle server's scrape, word for word the last one: the same (frozen) reading, whose
            # lookups by name are already made.
            return last[1]
        read = self._read(text)
        self._last = (text, read)
        return read

    def _read(self, text: str) -> MetricsText:
        lines = [raw.strip() for raw in split_lines(text)]
        types: dict[str, str] = {}
        for line in lines:
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 4 and parts[1] == "TYPE":
                    types[parts[2]] = parts[3].strip()
        kept: dict[str, tuple[MetricSample, ...]] = {}
        samples: list[MetricSample] = []
        try:
            for block in _family_blocks(lines):
                got = kept.get(block)
                if got is None:
                    got = self._blocks.get(block)
                if got is None:
                    self.parsed_blocks += 1
                    got = tuple(
                        MetricSample(name=s.name, labels=dict(s.labels), value=float(s.value))
                        for family in text_string_to_metric_families(block + "\n")
                        for s in family.samples
                    )
                kept[block] = got
                samples.extend(got)
        except (ValueError, TypeError, IndexError):
            self._blocks = {}
            return parse_prometheus(text)
        self._blocks = kept  # only the newest scrape's: the memory never grows
        return _text(samples, types, 0)


# How each figure combines across series: replicas' counts add up, ratios average, limits take the max.
_SUMMED = {
    "num_running_reqs": "sglang:num_running_reqs",
    "num_queue_reqs": "sglang:num_queue_reqs",
    "num_used_tokens": "sglang:num_used_tokens",
    "gen_throughput": "sglang:gen_throughput",
    "max_total_num_tokens": "sglang:max_total_num_tokens",
    "kv_used_tokens": "sglang:kv_used_tokens",
    "kv_available_tokens": "sglang:kv_available_tokens",
    "prompt_tokens_total": "sglang:prompt_tokens_total",
    "generation_tokens_total": "sglang:generation_tokens_total",
    "cached_tokens_total": "sglang:cached_tokens_total",
    "num_requests_total": "sglang:num_requests_total",
    "num_retracted_reqs": "sglang:num_retracted_reqs",
}
_AVERAGED = {
    "token_usage": "sglang:token_usage",
    "cache_hit_rate": "sglang:cache_hit_rate",
    "spec_accept_length": "sglang:spec_accept_length",
    "utilization": "sglang:utilization",
}
_MAXED = {
    "context_len": "sglang:context_len",
    "weight_memory_usage_gb": "sglang:weight_memory_usage_gb",
    "kv_cache_memory_usage_gb": "sglang:kv_cache_memory_usage_gb",
    "graph_memory_usage_gb": "sglang:graph_memory_usage_gb",
}
_HISTOGRAMS = {
    "time_to_first_token": "sglang:time_to_first_token_seconds",
    "inter_token_latency": "sglang:inter_token_latency_seconds",
    "time_per_output_token": "sglang:time_per_output_token_seconds",
    "e2e_request_latency": "sglang:e2e_request_latency_seconds",
}


_NUMBERS = (*_SUMMED, *_AVERAGED, *_MAXED)


class SglangMetrics(BaseModel, defer_build=True):
    """The `sglang:*` figures the console shows; None where this SGLang version does not export one."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_running_reqs: float | None = None
    num_queue_reqs: float | None = None
    num_used_tokens: float | None = None
    gen_throughput: float | None = None
    """Tokens per second, as SGLang's scheduler last measured it."""
    max_total_num_tokens: float | None = None
    kv_used_tokens: float | None = None
    kv_available_tokens: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    cached_tokens_total: float | None = None
    num_requests_total: float | None = None
    num_retracted_reqs: float | None = None
    token_usage: float | None = None
    cache_hit_rate: float | None = None
    spec_accept_length: float | None = None
    utilization: float | None = None
    context_len: float | None = None
    weight_memory_usage_gb: float | None = None
    kv_cache_memory_usage_gb: float | None = None
    graph_memory_usage_gb: float | None = None
    time_to_first_token: Histogram | None = None
    inter_token_latency: Histogram | None = None
    time_per_output_token: Histogram | None = None
    e2e_request_latency: Histogram | None = None
    model_names: tuple[str, ...] = ()
    series: int = 0
    """How many `sglang:` samples the scrape held (0: metrics off, or not SGLang)."""

    @model_validator(mode="before")
    @classmethod
    def _in_range(cls, data: Any) -> Any:
        """Figures read back from elsewhere than a scrape (a recording) are held to the scrape's range:
        one out of it is None, as its metric would have been."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name in _NUMBERS:
            if out.get(name) is not None and sane_value(out[name]) is None:
                out[name] = None
        for name in _HISTOGRAMS:
            hist = out.get(name)
            if isinstance(hist, Histogram):
                hist = {"count": hist.count, "sum": hist.sum}
            if isinstance(hist, dict) and (
                sane_value(hist.get("count")) is None or sane_value(hist.get("sum")) is None
            ):
                out[name] = None
        return out

    @classmethod
    def from_metrics(cls, metrics: MetricsText) -> SglangMetrics:
        fields: dict[str, object] = {}
        for field, name in _SUMMED.items():
            fields[field] = metrics.total(name)
        for field, name in _AVERAGED.items():
            fields[field] = metrics.mean(name)
        for field, name in _MAXED.items():
            fields[field] = metrics.maximum(name)
        for field, name in _HISTOGRAMS.items():
            fields[field] = metrics.histogram(name)
        sglang = [s for s in metrics.samples if s.name.startswith("sglang:")]
        fields["model_names"] = tuple(
            sorted({s.labels["model_name"] for s in sglang if "model_name" in s.labels})
        )
        fields["series"] = len(sglang)
        return cls.model_validate(fields)

    @classmethod
    def from_text(cls, text: str) -> SglangMetrics:
        return cls.from_metrics(parse_prometheus(text))


def as_numbers(metrics: MetricsText, prefix: str = "sglang:") -> Mapping[str, float]:
    """Every series under `prefix`, summed per name: a flat view for `--json` output and debugging."""
    out: dict[str, float] = {}
    for s in metrics.samples:
        if s.name.startswith(prefix) and not math.isnan(s.value):
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out
