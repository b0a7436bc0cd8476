"""One planning brain: `plan`, `apply`'s planner verdict (also `profiles validate` and the profile editor's
what-if) read a profile the same way and predict the same pool, on real boots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from console.cli.cmd_plan import read_boots
from console.core.apply import planner_verdict
from console.core.flags import load_flag_list
from console.core.models import get_model
from console.core.planning import PlanInputError, pick, pool_config, profile_source
from console.core.profiles import parse_profile
from tests.support.cli import one_sentence
from tests.support.cli import run_main as run

# case-19: Qwen3-32B (an MHA model, so the pool's bytes per token per GPU depend on TP) at TP4 on 4x B200;
# the boot sized its pool at 2,206,208 tokens (INDEX.md).
CASE_19_TOKENS = 2_206_208
QWEN_TP4 = """name = "qwen-tp4"
target_context = 131072
[flags]
model-path = "Qwen/Qwen3-32B"
{flags}
mem-fraction-static = 0.85
"""
PLAIN = "tp-size = 4\ncontext-length = 131072"
# The same flags as SGLang's parser also takes them: the `--tp` alias, IEC and SI token counts.
SGLANG_SPELLINGS = 'tp = 4\ncontext-length = "128Ki"\nmax-total-tokens = "3M"'


def _profile(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / "qwen-tp4.toml"
    path.write_text(QWEN_TP4.format(flags=flags))
    return path


def _plan(profile: Path, journal: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    argv = [
        "plan",
        "--target-context",
        "128Ki",
        "--journal",
        str(journal),
        "--profile",
        str(profile),
        "--json",
    ]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("flags", [PLAIN, SGLANG_SPELLINGS])
def test_plan_and_the_apply_verdict_predict_the_same_pool_at_the_boots_tp(
    flags: str, tmp_path: Path, corpus_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = corpus_dir / "public" / "case-19.log"
    path = _profile(tmp_path, flags)
    profile = parse_profile(path.read_text(), name="qwen-tp4")
    verdict = planner_verdict(profile, load_flag_list(profile.sglang_version), read_boots(str(journal)))
    assert verdict.checked and verdict.fits, verdict.reasons
    # The profile asks for what the boot ran (TP4, f=0.85 as calibrated): the pool it showed. Apply's
    # planner used to read `--tp-size` where the flag list names it `--tensor-parallel-size` and sized
    # TP1: 550,248 tokens.
    assert verdict.predicted_pool_tokens is not None
    assert abs(verdict.predicted_pool_tokens - CASE_19_TOKENS) / CASE_19_TOKENS < 0.01
    planned = _plan(path, journal, capsys)
    assert planned["predicted_max_total_num_tokens"] == verdict.predicted_pool_tokens
    assert planned["recommended_mem_fraction_static"] == verdict.recommended_mem_fraction_static


def test_a_profile_is_read_by_the_names_sglang_gives_its_flags(tmp_path: Path) -> None:
    profile = parse_profile(QWEN_TP4.format(flags=SGLANG_SPELLINGS), name="qwen-tp4")
    source = profile_source(profile)
    assert pick("tp_size", [source]) == 4
    assert pick("context_length", [source]) == 131_072
    assert pick("max_total_tokens", [source]) == 3_000_000
    cfg = pool_config(get_model("qwen3-32b"), [source], sglang_version=None, target_context=200_000)
    assert (cfg.tp, cfg.context_length, cfg.max_total_tokens) == (4, 131_072, 3_000_000)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ('tp-size = 4\nmax-total-tokens = "1G"', "did you mean 1M?"),
        ("tp-size = 0", "from 1 to 1,024"),
        ('tp-size = "four"', "not a whole number"),
        ("tp-size = 4\npage-size = 2.5", "not a whole number"),
    ],
)
def test_a_bad_profile_value_is_one_sentence_in_plan_and_a_reason_in_the_verdict(
    flags: str, says: str, tmp_path: Path, corpus_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = corpus_dir / "public" / "case-19.log"
    path = _profile(tmp_path, flags)
    argv = ["plan", "--target-context", "128k", "--journal", str(journal), "--profile", str(path), "--json"]
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    sentence = one_sentence(err)
    assert says in sentence and "the profile qwen-tp4" in sentence
    profile = parse_profile(path.read_text(), name="qwen-tp4")
    verdict = planner_verdict(profile, load_flag_list(profile.sglang_version), read_boots(str(journal)))
    assert not verdict.checked and any(says in r for r in verdict.reasons), verdict.reasons
    with pytest.raises(PlanInputError):
        pool_config(
            get_model("qwen3-32b"), [profile_source(profile)], sglang_version=None, target_context=131_072
        )
