"""`k26-console plan` and `k26-console verify` end to end, in process, on the seed journals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import run_main as run

INCIDENT = [(0.85, 101_134), (0.92, 192_406), (0.94, 218_484)]
CELL = 70_272


def one_sentence(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("k26-console: ")
    assert "Traceback" not in err
    return lines[0]


def line_through_all_three() -> tuple[float, float]:
    n = len(INCIDENT)
    mx = sum(f for f, _ in INCIDENT) / n
    my = sum(t for _, t in INCIDENT) / n
    slope = sum((f - mx) * (t - my) for f, t in INCIDENT) / sum((f - mx) ** 2 for f, _ in INCIDENT)
    return slope, my - slope * mx


def test_done_when_plan_reaches_200k_in_one_restart(
    corpus_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        [
            "plan",
            "--target-context",
            "200000",
            "--journal",
            str(corpus_dir / "seed-restart-ctx-only.journal"),
            "--model",
            "kimi-k2.6",
            "--mem-fraction-static",
            "0.85",
            "--gpu-mem-gib",
            "95.59",
            "--json",
        ],
        capsys,
    )
    assert code == 0
    result = json.loads(out)
    for field in (
        "predicted_max_total_num_tokens",
        "recommended_mem_fraction_static",
        "predicted_tokens_at_recommended",
        "headroom_gib_at_recommended",
        "calibration",
        "fits",
        "notes",
    ):
        assert field in result
    assert result["calibration"] == "band" and result["fits"] is True
    assert result["predicted_max_total_num_tokens"] == 101_134
    assert all(isinstance(n, str) and n for n in result["notes"])
    f = result["recommended_mem_fraction_static"]
    slope, intercept = line_through_all_three()
    assert slope * f + intercept >= 200_000  # reaches the target in the restart it recommends
    assert slope * CELL / 2**30 * (1 - f) - result["req_to_token_gib_at_recommended"] >= 3.0
    assert result["headroom_gib_at_recommended"] >= 3.0


def test_plan_text_and_a_refusal(corpus_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--journal", str(corpus_dir / "seed-restart-ctx-only.journal"), "--model", "kimi-k2.6"]
    base += ["--mem-fraction-static", "0.85", "--gpu-mem-gib", "95.59"]
    code, out, _ = run([*base, "--target-context", "200k"], capsys)
    assert code == 0
    assert "recommended: --mem-fraction-static 0.935" in out
    assert "--context-length only sets the longest request" in out
    code, out, _ = run([*base, "--target-context", "400000", "--json"], capsys)
    assert code == 1
    result = json.loads(out)
    assert result["fits"] is False and result["recommended_mem_fraction_static"] is None
    assert result["reasons"] and any("fp8" in a for a in result["alternatives"])


def test_plan_calibrates_exactly_on_a_journal_with_weight_lines(
    corpus_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # case-01: Kimi K2.5 on 8x MI355X; the model is recognised from the server_args dump
    code, out, _ = run(
        [
            "plan",
            "--target-context",
            "1000000",
            "--journal",
            str(corpus_dir / "public/case-01.log"),
            "--json",
        ],
        capsys,
    )
    assert code == 0
    result = json.loads(out)
    assert result["calibration"] == "exact" and result["model"] == "kimi-k2.5"
    assert result["mem_fraction_static"] == pytest.approx(0.8260405859375)
    assert abs(result["predicted_max_total_num_tokens"] - 2_454_421) / 2_454_421 < 0.005
    assert result["recommended_mem_fraction_static"] < 0.83


def test_plan_reads_a_profile_and_a_model_config(
    tmp_path: Path, corpus_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "ctx-200k.toml"
    profile.write_text(
        'name = "ctx-200k"\ntarget_context = 200000\n[flags]\nmem-fraction-static = 0.94\nmax-running-requests = 8\n'
    )
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "kimi_k25",
                "text_config": {
                    "num_hidden_layers": 61,
                    "kv_lora_rank": 512,
                    "qk_rope_head_dim": 64,
                    "num_attention_heads": 64,
                },
            }
        )
    )
    argv = [
        "plan",
        "--target-context",
        "200000",
        "--journal",
        str(corpus_dir / "seed-restart-mfs094.journal"),
    ]
    code, out, _ = run(
        [
            *argv,
            "--profile",
            str(profile),
            "--model-config",
            str(config),
            "--journal-mem-fraction-static",
            "0.94",
            "--gpu-mem-gib",
            "95.59",
            "--json",
        ],
        capsys,
    )
    result = json.loads(out)
    assert code == 0
    assert result["cell_bytes"] == CELL
    assert result["mem_fraction_static"] == 0.94 and result["predicted_max_total_num_tokens"] == 218_484
    assert result["max_running_requests_at_recommended"] == 8


def test_done_when_verify(corpus_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        [
            "verify",
            "--target-context",
            "200000",
            "--journal",
            str(corpus_dir / "seed-restart-mfs094.journal"),
        ],
        capsys,
    )
    assert code == 0 and err == ""
    assert out.startswith("ok: the pool holds 218,484 tokens")

    code, out, err = run(
        [
            "verify",
            "--target-context",
            "200000",
            "--journal",
            str(corpus_dir / "seed-restart-ctx-only.journal"),
        ],
        capsys,
    )
    assert code == 1 and out == ""
    sentence = one_sentence(err)
    assert "101,134 tokens" in sentence and "short of the 200,000 target" in sentence


def test_verify_json_fields(corpus_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        [
            "verify",
            "--target-context",
            "200000",
            "--journal",
            str(corpus_dir / "seed-restart-mfs094.journal"),
            "--json",
        ],
        capsys,
    )
    assert code == 0
    verdict = json.loads(out)
    assert verdict["ok"] is True and verdict["ready"] is True
    assert verdict["max_total_num_tokens"] == 218_484 and verdict["target_context"] == 200_000
    assert verdict["errors"] == [] and verdict["stale_errors"] == []
    assert verdict["available_gpu_mem_gb"] == 4.24


def _journal(*boots: list[str]) -> str:
    out: list[str] = []
    for i, body in enumerate(boots):
        clock = f"22:{10 * i:02d}:00"
        out += [f"May 30 {clock} gpu1 systemd[1]: Started sglang.service - SGLang."]
        out += [
            f"May 30 {clock} gpu1 python[{100 * (i + 1)}]: [2026-05-30 {clock} TP0] {msg}" for msg in body
        ]
    return "\n".join(out) + "\n"


SUMMARY = "max_total_num_tokens=218484, max_running_requests=8, context_len=200000, available_gpu_mem=4.24 GB"
NCCL = "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for 600020 milliseconds before timing out."


def test_verify_stale_errors_do_not_fail_but_errors_since_this_boot_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "stale.journal"
    stale.write_text(_journal([SUMMARY, NCCL], [SUMMARY]))
    code, out, _ = run(["verify", "--target-context", "200000", "--journal", str(stale), "--json"], capsys)
    verdict = json.loads(out)
    assert code == 0 and verdict["ok"] and verdict["errors"] == []
    assert len(verdict["stale_errors"]) == 1 and verdict["stale_errors"][0]["boot"] == 0

    fresh = tmp_path / "fresh.journal"
    fresh.write_text(_journal([SUMMARY], [SUMMARY, NCCL]))
    code, _, err = run(["verify", "--target-context", "200000", "--journal", str(fresh)], capsys)
    assert code == 1
    assert "1 error(s) since this boot" in one_sentence(err)


def test_verify_a_boot_that_died(corpus_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        ["verify", "--target-context", "100000", "--journal", str(corpus_dir / "public/case-01.log")], capsys
    )
    assert code == 1
    sentence = one_sentence(err)
    assert "not ready" in sentence and "scheduler_exception" in sentence


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["verify", "--target-context", "1", "--journal", "{empty}"], "is empty"),
        (["plan", "--target-context", "1", "--journal", "{empty}", "--model", "kimi-k2.6"], "is empty"),
        (["verify", "--target-context", "1", "--journal", "{noboot}"], "no SGLang boot"),
        (
            ["plan", "--target-context", "1", "--journal", "{noboot}", "--model", "kimi-k2.6"],
            "no SGLang boot",
        ),
        (["verify", "--target-context", "1", "--journal", "{missing}"], "there is no file"),
        (["verify", "--target-context", "1"], "--journal"),
        (
            [
                "plan",
                "--target-context",
                "1",
                "--journal",
                "{seed}",
                "--model",
                "kimi-k2.6",
                "--mem-fraction-static",
                "1.2",
            ],
            "between 0 and 1",
        ),
        (
            [
                "plan",
                "--target-context",
                "1",
                "--journal",
                "{seed}",
                "--model",
                "kimi-k2.6",
                "--mem-fraction-static",
                "0",
            ],
            "between 0 and 1",
        ),
        (
            ["plan", "--target-context", "1", "--journal", "{seed}", "--model", "gpt-5"],
            "unknown model 'gpt-5'",
        ),
        (
            ["plan", "--target-context", "1", "--journal", "{seed}", "--model-config", "{badjson}"],
            "not valid JSON",
        ),
        (
            ["plan", "--target-context", "1", "--journal", "{seed}", "--model-config", "{nolayers}"],
            "num_hidden_layers",
        ),
        (["plan", "--target-context", "1", "--journal", "{seed}"], "name the model"),
        (["plan", "--target-context", "lots", "--model", "kimi-k2.6"], "not a whole number"),
        (
            ["plan", "--target-context", "1", "--model", "kimi-k2.6", "--profile", "{badtoml}"],
            "not valid TOML",
        ),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(
    argv: list[str], needle: str, tmp_path: Path, corpus_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = {
        "{empty}": "",
        "{noboot}": "May 30 22:00:00 gpu1 sshd[5]: Accepted publickey for ops\nnothing to see here\n",
        "{badjson}": "{ not json",
        "{nolayers}": json.dumps({"hidden_size": 7168}),
        "{badtoml}": "mem-fraction-static = = 0.9",
    }
    paths = {
        "{seed}": str(corpus_dir / "seed-restart-ctx-only.journal"),
        "{missing}": str(tmp_path / "nope.journal"),
    }
    for name, text in files.items():
        path = tmp_path / name.strip("{}")
        path.write_text(text)
        paths[name] = str(path)
    code, out, err = run([paths.get(a, a) for a in argv], capsys)
    assert code == 2
    assert needle in one_sentence(err)
    assert out == ""


def test_plan_without_a_journal_says_what_it_needs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", "--target-context", "200000", "--model", "kimi-k2.6", "--json"], capsys)
    result = json.loads(out)
    assert code == 1 and result["calibration"] == "none" and result["fits"] is False
    assert "--journal" in result["reasons"][0]


def test_a_proposal_does_not_change_how_the_old_boot_is_read(
    tmp_path: Path, corpus_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The journal's boot ran bf16 at f=0.85; a profile proposing fp8 at the same f doubles the pool."""
    profile = tmp_path / "fp8.toml"
    profile.write_text(
        'target_context = 200000\n[flags]\nmodel-path = "moonshotai/Kimi-K2.6"\n'
        'kv-cache-dtype = "fp8_e4m3"\nmem-fraction-static = 0.85\n'
    )
    argv = [
        "plan",
        "--target-context",
        "200000",
        "--journal",
        str(corpus_dir / "seed-restart-ctx-only.journal"),
    ]
    argv += ["--profile", str(profile), "--gpu-mem-gib", "95.59", "--json"]
    code, out, _ = run(argv, capsys)
    result = json.loads(out)
    assert result["calibration"] == "none" and code == 1  # the profile's f is a proposal, not the boot's
    code, out, _ = run([*argv, "--journal-mem-fraction-static", "0.85"], capsys)
    result = json.loads(out)
    assert code == 0 and result["cell_bytes"] == CELL // 2 and result["model"] == "kimi-k2.6"
    assert abs(result["predicted_max_total_num_tokens"] - 2 * 101_134) <= 2
    assert result["recommended_mem_fraction_static"] == 0.85  # 202,268 tokens already at 0.85


def test_verify_json_says_once_an_error_that_every_rank_repeats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A boot that failed with the CUDA OOM on its eight ranks: `verify --json` listed eight ~580-character
    messages that differ only in their numbers (issue 34). Written as the twin's SGLang writes them."""
    import io

    from console.twin.server_logs import LogWriter, cuda_oom_message, cuda_oom_traceback

    text = io.StringIO()
    log = LogWriter(text, tp_size=8)
    for rank in range(8):
        message = cuda_oom_message(rank, 0.95, 95.59, 650.79 + 11 * rank, 94.96 - 0.01 * rank)
        lines = cuda_oom_traceback(message, mla=True, draft=False)
        log.rank(rank, f"Scheduler hit an exception: {lines[0]}")
        for line in lines[1:]:
            log.raw(line)
    log.main("Received sigquit from a child process. It usually means the child failed.")
    journal = tmp_path / "oom.journal"
    journal.write_text(text.getvalue())
    code, out, _ = run(["verify", "--target-context", "200000", "--journal", str(journal), "--json"], capsys)
    verdict = json.loads(out)
    assert code == 1 and not verdict["ok"]
    oom, sigquit = verdict["errors"]
    assert oom["category"] == "cuda_oom" and oom["count"] == 8
    assert oom["ranks"] == [f"TP{r}" for r in range(8)] and "CUDA out of memory" in oom["message"]
    assert sigquit["category"] == "sigquit" and sigquit["count"] == 1
    assert len(out) < 3000, len(out)  # one message of each, not eight
    said = next(r for r in verdict["reasons"] if "error(s) since this boot" in r)
    assert said.startswith("9 error(s) since this boot: cuda_oom on TP0-TP7 (8 ranks): ")
    assert len(said) < 500, said
