"""The one token-count reader: what `plan`, `verify`, `open` and `probe` take for a number of tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from console.core.capacity import MAX_TOKENS
from console.core.flags import human_readable_int
from console.core.token_count import TokenCountError, read_token_count
from tests.support.cli import one_sentence
from tests.support.cli import run_main as run


@pytest.mark.parametrize(
    ("word", "tokens"),
    [
        ("200000", 200_000),
        ("200k", 200_000),
        ("200K", 200_000),
        ("200,000", 200_000),
        ("200_000", 200_000),
        ("25.6k", 25_600),
        ("1M", 1_000_000),
        ("1.5M", 1_500_000),
        ("128Ki", 131_072),
        (" 200k ", 200_000),
        ("2,147,483,647", MAX_TOKENS),
    ],
)
def test_reads_the_spellings_people_and_sglang_use(word: str, tokens: int) -> None:
    assert read_token_count(word) == tokens


@pytest.mark.parametrize(
    ("word", "says"),
    [
        ("1G", "no context or KV pool reaches (did you mean 1M?)"),
        ("2Gi", "no context or KV pool reaches"),
        ("1T", "no context or KV pool reaches"),
        ("12m", "not one for tokens"),
        ("1,5k", "commas group thousands"),
        ("1.5", "a decimal needs k or M"),
        ("1.5Ki", "decimals are not allowed"),
        ("0.0005k", "SGLang would cut it to 0"),
        ("0", "not a positive number"),
        ("-5", "not a positive number"),
        ("lots", "not a whole number of tokens"),
        ("2147483648", "2,147,483,647"),
        ("9" * 5000, "2,147,483,647"),
    ],
)
def test_refuses_with_a_reason(word: str, says: str) -> None:
    with pytest.raises(TokenCountError) as caught:
        read_token_count(word)
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)


@given(
    st.one_of(
        st.integers(1, MAX_TOKENS).map(str),
        st.tuples(st.integers(0, 2_000_000), st.sampled_from(["k", "M", "Ki", "Mi"])).map(
            lambda t: f"{t[0]}{t[1]}"
        ),
        st.tuples(st.integers(0, 2_000), st.integers(0, 999), st.sampled_from(["k", "M"])).map(
            lambda t: f"{t[0]}.{t[1]}{t[2]}"
        ),
    )
)
def test_agrees_with_sglang_on_every_word_sglang_takes(word: str) -> None:
    """A word SGLang's parser takes means the same number to the console (or is refused with a reason)."""
    sglang = human_readable_int(word)
    try:
        ours = read_token_count(word)
    except TokenCountError as exc:
        assert not 0 < sglang <= MAX_TOKENS or "SGLang would cut it" in str(exc), (word, exc)
        return
    assert ours == sglang


@pytest.mark.parametrize("word", ["25.6k", "200K", "200,000"])
def test_plan_and_verify_take_the_same_words(
    word: str, corpus_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = str(corpus_dir / "seed-restart-mfs094.journal")
    code, out, _ = run(
        ["plan", "--target-context", word, "--journal", journal, "--model", "kimi-k2.6", "--json"], capsys
    )
    assert code in (0, 1) and json.loads(out)["target_context"] == read_token_count(word)
    code, out, _ = run(["verify", "--target-context", word, "--journal", journal, "--json"], capsys)
    assert code in (0, 1) and json.loads(out)["target_context"] == read_token_count(word)


def test_plan_refuses_1g_in_one_sentence_that_says_why(
    corpus_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["plan", "--target-context", "1G", "--model", "kimi-k2.6"], capsys)
    assert code == 2 and out == ""
    assert "did you mean 1M?" in one_sentence(err)
