"""The alert rules and their evaluator (console/core/alerts.py), on real readings: corpus boots, the twin
engine's own /metrics, GPU samples."""

from __future__ import annotations

import pytest

from console.core.alerts import (
    DEFAULT_RULES,
    METRICS,
    AlertError,
    Severity,
    TransitionKind,
    alert_inputs,
    default_rules,
    evaluate,
    parse_rule,
    parse_rules,
)
from console.core.serving import serving_figures
from console.tui.view import display_boot
from tests.test_serving_core import engine, scrape, serve
from tests.tui_support import corpus_events, gpu_sample, snapshot


def test_rules_read_to_their_normal_form() -> None:
    rule = parse_rule("  ttft_p99_s>5 ")
    assert (rule.key, rule.metric, rule.op, rule.threshold, rule.severity) == (
        "ttft_p99_s > 5",
        "ttft_p99_s",
        ">",
        5.0,
        Severity.WARNING,
    )
    assert parse_rule("gpu_mem_free_gib <= 0.5").key == "gpu_mem_free_gib <= 0.5"
    assert parse_rule("error").severity is Severity.CRITICAL
    assert parse_rule("queue > 16", "critical").severity is Severity.CRITICAL
    # Duplicates in the config are one rule.
    assert [r.key for r in parse_rules(["queue > 16", "queue>16.0", {"when": "error"}])] == [
        "queue > 16",
        "error",
    ]
    assert [r.key for r in default_rules()] == [parse_rule(r).key for r in DEFAULT_RULES]
    assert {"ttft_p99_s", "queue", "kv_used_pct", "gpu_mem_free_gib"} <= set(METRICS)


@pytest.mark.parametrize(
    ("rule", "says"),
    [
        ("ttft_p99 > 5", "unknown metric 'ttft_p99'"),
        ("queue => 16", "is not `metric op number`"),
        ("queue > lots", "is not `metric op number`"),
        ("queue > 1e999", "no finite threshold"),
        ("", "is not `metric op number`"),
        (16, "must be a string"),
        ({"when": "queue > 1", "severity": "dire"}, "severity must be one of warning, critical"),
        ({"rule": "queue > 1"}, "unknown key 'rule'"),
        ({"severity": "warning"}, "needs `when`"),
    ],
)
def test_a_bad_rule_is_one_sentence(rule: object, says: str) -> None:
    with pytest.raises(AlertError) as err:
        parse_rules([rule])
    assert says in str(err.value)
    text = str(err.value)
    assert "\n" not in text and text.endswith(".") and text.count(". ") == 0, text


def test_error_and_service_rules_fire_and_clear_on_real_boots() -> None:
    rules = parse_rules(["error", "service_not_active"])
    crashed = snapshot(corpus_events("case-01"), None)  # a boot that logged a scheduler exception
    inputs = alert_inputs(crashed, boot=display_boot(crashed.state))
    first = evaluate(rules, inputs, host="gpu1", ts=1.0)
    assert [(t.rule, t.state) for t in first.transitions] == [("error", TransitionKind.FIRED)]
    assert first.transitions[0].value == 2.0
    assert "newest: sigquit: Received sigquit" in first.transitions[0].message
    # The same reading again: still firing, nothing new.
    again = evaluate(rules, inputs, first.firing, host="gpu1", ts=2.0)
    assert again.transitions == () and set(again.firing) == {"error"}
    assert again.firing["error"].ts == 1.0
    # A clean boot that is serving: the error clears.
    ready = snapshot(corpus_events("case-31"), None)
    cleared = evaluate(
        rules, alert_inputs(ready, boot=display_boot(ready.state)), again.firing, host="gpu1", ts=3.0
    )
    assert [(t.rule, t.state) for t in cleared.transitions] == [("error", TransitionKind.CLEARED)]
    assert cleared.firing == {}
    # systemd's own word, as `snapshot` reads it.
    down = evaluate(
        rules, alert_inputs(ready, service_state="failed", service_detail="exit-code"), host="h", ts=4.0
    )
    assert [t.message for t in down.transitions] == ["the service is failed (exit-code), not active"]
    assert down.worst() is not None and down.worst().severity is Severity.CRITICAL  # type: ignore[union-attr]


def test_an_absent_figure_neither_fires_nor_clears() -> None:
    rules = parse_rules(["gpu_mem_free_gib < 1", "queue > 16"])
    events = corpus_events("case-31")
    full = snapshot(events, gpu_sample([24_000.0, 23_900.0], 24_564.0))  # 0.55 GiB free on GPU0
    fired = evaluate(rules, alert_inputs(full), host="gpu1", ts=1.0)
    assert [t.rule for t in fired.transitions] == ["gpu_mem_free_gib < 1"]
    assert fired.transitions[0].value == pytest.approx(564 / 1024)
    # No GPU sample and no /metrics: unknown, so the alert keeps firing and `queue` never fires.
    blind = evaluate(rules, alert_inputs(snapshot(events, None)), fired.firing, host="gpu1", ts=2.0)
    assert blind.transitions == () and set(blind.firing) == {"gpu_mem_free_gib < 1"}
    freed = snapshot(events, gpu_sample([12_000.0, 12_000.0], 24_564.0))
    cleared = evaluate(rules, alert_inputs(freed), blind.firing, host="gpu1", ts=3.0)
    assert [(t.rule, t.state) for t in cleared.transitions] == [
        ("gpu_mem_free_gib < 1", TransitionKind.CLEARED)
    ]


async def test_latency_rules_read_the_twin_engines_metrics() -> None:
    eng = engine()
    try:
        first = scrape(eng, 0.0)
        await serve(eng, n=8, prompt=2000, new_tokens=16)
        figures = serving_figures([first, scrape(eng, 10.0)], window_s=300.0, version="0.5.12.post1")
    finally:
        await eng.stop()
    assert figures.ttft is not None and figures.ttft.p99 is not None
    p99 = figures.ttft.p99
    rules = parse_rules([f"ttft_p99_s > {p99 / 2:.6g}", f"ttft_p99_s > {p99 * 2:.6g}", "queue > 0"])
    inputs = alert_inputs(None, figures)
    assert inputs.figures["ttft_p99_s"] == p99
    assert inputs.figures["queue"] == 0.0
    result = evaluate(rules, inputs, host="twin", ts=1.0)
    assert [t.rule for t in result.transitions] == [rules[0].key]
    assert result.transitions[0].model_dump(mode="json")["state"] == "fired"


def test_the_docs_list_every_rule_name_and_the_default_set() -> None:
    from pathlib import Path

    from console.core.alerts import STATE_RULES

    doc = (Path(__file__).resolve().parent.parent / "docs" / "alerts.md").read_text()
    for name in (*METRICS, *STATE_RULES):
        assert f"| `{name}` |" in doc, name
    defaults = doc.split("## The default set", 1)[1].split("##", 1)[0]
    for rule in DEFAULT_RULES:
        assert f"| `{rule}` | {parse_rule(rule).severity} |" in defaults, rule
