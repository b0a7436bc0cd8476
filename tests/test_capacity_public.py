"""The capacity model against public SGLang logs (shared/corpus/public, see its INDEX.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.core.capacity import GIB, PoolConfig, calibrate, observation_from_boot, sizing_rule_for
from console.core.models import get_model
from console.core.parser import parse_text
from console.core.state import Boot, fold_boots

# Facts INDEX.md states about the deployments (model, TP, SGLang version); the journal itself gives
# pre/post (Load weight begin/end), f (the server_args dump) and the observed pool.
EXACT_CASES = {
    "case-01": ("kimi-k2.5", 8, "0.5.8.post1"),  # 8x MI355X, f=0.826 auto, MLA
    "case-31": ("qwen3-0.6b", 1, "0.4.6.post2"),  # ~4 GB card, f=0.88 auto, MHA, the ≤ v0.5.6 rule
}


def latest_boot(corpus_dir: Path, case: str) -> Boot:
    boots = fold_boots(parse_text((corpus_dir / "public" / f"{case}.log").read_text()))
    assert len(boots) == 1
    return boots[0]


def test_the_exact_cases_are_all_public_cases_with_weight_and_pool_lines(corpus_dir: Path) -> None:
    qualifying = set()
    for path in sorted((corpus_dir / "public").glob("case-*.log")):
        kinds = {e.kind for e in parse_text(path.read_text())}
        if {"weights_begin", "weights_loaded", "kv_pool_allocated"} <= kinds:
            qualifying.add(path.stem)
    assert qualifying == set(EXACT_CASES)


@pytest.mark.parametrize("case", sorted(EXACT_CASES))
def test_exact_calibration_predicts_public_pools_within_half_a_percent(corpus_dir: Path, case: str) -> None:
    model, tp, version = EXACT_CASES[case]
    boot = latest_boot(corpus_dir, case)
    obs = observation_from_boot(boot)
    assert obs.mem_fraction_static is not None and obs.tokens is not None
    cfg = PoolConfig(model=get_model(model), tp=tp, rule=sizing_rule_for(version))
    cal = calibrate([obs], cfg)
    assert cal.kind == "exact"
    predicted = cal.predict(obs.mem_fraction_static, cfg)
    assert predicted is not None
    assert abs(predicted - obs.tokens) / obs.tokens < 0.005


def test_case_01_numbers(corpus_dir: Path) -> None:
    boot = latest_boot(corpus_dir, "case-01")
    assert boot.pre_gib == 283.53 and boot.post_gib == 209.96
    assert boot.mem_fraction_static == pytest.approx(0.8260405859375)
    assert boot.pool.tokens == 2_454_421
    # the MLA line's size is tokens · 70,272 B on every rank, whatever the TP
    assert round(2_454_421 * get_model("kimi-k2.5").cell_bytes(tp=8) / GIB, 2) == 160.63
    assert [e.category for e in boot.errors] == ["scheduler_exception", "sigquit"]  # it died in graph capture


def test_case_25_max_total_tokens_cap_is_a_negative_control(corpus_dir: Path) -> None:
    """--max-total-tokens 10000 capped this pool: memory alone predicts far more, the cap gives it exactly."""
    boot = latest_boot(corpus_dir, "case-25")
    assert boot.pre_gib == pytest.approx(46.86) and boot.post_gib == 33.80  # from Load weight end + usage
    obs = observation_from_boot(boot, 0.9)  # INDEX.md: --mem-fraction-static 0.9 on the command line
    uncapped = PoolConfig(model=get_model("deepseek-v3"), tp=2)
    capped = uncapped.model_copy(update={"max_total_tokens": 10_000})
    cal = calibrate([obs], uncapped)
    assert cal.kind == "exact"
    assert (cal.predict(0.9, uncapped) or 0) > 40 * 10_000
    assert cal.predict(0.9, capped) == boot.pool.tokens == 10_000
    assert round(10_000 * uncapped.cell_bytes / GIB, 2) == 0.65  # its `KV size: 0.65 GB`


def test_a_boot_capped_by_its_own_max_total_tokens_does_not_calibrate() -> None:
    text = "\n".join(
        [
            "[2026-01-23 09:10:00] server_args=ServerArgs(model_path='deepseek-ai/DeepSeek-V3', "
            "mem_fraction_static=0.9, max_total_tokens=10000, page_size=1)",
            "[2026-01-23 09:10:36 TP0] KV Cache is allocated. #tokens: 10000, KV size: 0.65 GB",
        ]
    )
    (boot,) = fold_boots(parse_text(text))
    obs = observation_from_boot(boot)
    assert obs.capped and obs.mem_fraction_static == 0.9
    cfg = PoolConfig(model=get_model("deepseek-v3"), tp=2)
    assert calibrate([obs], cfg, gpu_mem_gib=47.0).kind == "none"
    uncapped = observation_from_boot(boot.model_copy(update={"server_args": {"mem_fraction_static": 0.9}}))
    assert not uncapped.capped and calibrate([uncapped], cfg, gpu_mem_gib=47.0).kind == "band"
