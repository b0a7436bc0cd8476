"""`k26-console profiles list|show|diff|validate`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from console.cli.main import main

SHIPPED = Path(__file__).resolve().parent.parent / "profiles"


@pytest.fixture
def pdir(tmp_path: Path) -> Path:
    for p in SHIPPED.glob("*.toml"):
        shutil.copy(p, tmp_path / p.name)
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_list(pdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "profiles", "--dir", str(pdir), "list")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split()[:3] == ["name", "target", "sglang"]
    assert [line.split()[0] for line in rows] == ["ctx-32k", "ctx-128k", "ctx-200k", "ctx-256k"]
    code, out, _ = run(capsys, "profiles", "--dir", str(pdir), "list", "--json")
    rows = json.loads(out)
    assert {r["name"]: r["target_context"] for r in rows}["ctx-200k"] == 200_000


def test_show(pdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "profiles", "--dir", str(pdir), "show", "ctx-200k", "--unit", "kimi")
    assert code == 0
    assert "/etc/systemd/system/kimi.service.d/50-k26-console.conf" in out
    assert "--mem-fraction-static 0.93" in out
    assert '\nExecStart=\nExecStart="python3"' in out
    code, out, _ = run(capsys, "profiles", "--dir", str(pdir), "show", "ctx-200k", "--json")
    data = json.loads(out)
    assert data["argv"][:3] == ["python3", "-m", "sglang.launch_server"]


def test_diff(pdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "profiles", "--dir", str(pdir), "diff", "ctx-200k", "ctx-256k")
    assert code == 0
    assert "~ --mem-fraction-static 0.93 → 0.88" in out
    assert "+ --kv-cache-dtype fp8_e4m3" in out
    code, out, _ = run(capsys, "profiles", "--dir", str(pdir), "diff", "ctx-200k", "ctx-200k")
    assert out.strip() == "ctx-200k and ctx-200k run the same server."


def test_validate_ok_and_json(pdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "profiles", "--dir", str(pdir), "validate", "ctx-200k")
    assert code == 0 and out.strip() == "ctx-200k is valid for SGLang v0.5.12.post1."
    code, out, _ = run(
        capsys, "profiles", "--dir", str(pdir), "validate", "ctx-256k", "--sglang-version", "0.5.23", "--json"
    )
    data = json.loads(out)
    assert code == 0 and data["ok"] is True and data["sglang_version"] == "v0.5.23"


def test_validate_refuses_bad_flags(pdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (
        (pdir / "ctx-200k.toml").read_text().replace("chunked-prefill-size = 8192", "cuda-graph-max-bs = 8")
    )
    text = text.replace('name = "ctx-200k"', 'name = "bad"')
    (pdir / "bad.toml").write_text(text)
    code, out, _ = run(capsys, "profiles", "--dir", str(pdir), "validate", "bad")
    assert code == 0  # fine on 0.5.12.post1
    code, out, _ = run(
        capsys, "profiles", "--dir", str(pdir), "validate", "bad", "--sglang-version", "v0.5.23"
    )
    assert code == 1
    assert "error: --cuda-graph-max-bs is ambiguous: it could mean --cuda-graph-max-bs-decode" in out
    assert out.splitlines()[-1] == "bad would not start on SGLang v0.5.23: 1 error."


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["show", "nope"], "there is no profile named 'nope'"),
        (["validate", "broken"], "broken.toml line 2 is not valid TOML"),
        (["validate", "ctx-200k", "--sglang-version", "0.0.1"], "no shipped flag list for SGLang v0.0.1"),
        (["show", "renamed"], "renamed.toml line 1 says name = 'x', but a profile is named by its file"),
        (["diff", "ctx-200k", "nope"], "there is no profile named 'nope'"),
    ],
)
def test_bad_input_is_one_sentence_exit_2(
    pdir: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    (pdir / "broken.toml").write_text('name = "broken"\ntarget_context = = 5\n')
    (pdir / "renamed.toml").write_text('name = "x"\ntarget_context = 5\n')
    code, out, err = run(capsys, "profiles", "--dir", str(pdir), *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("k26-console: ") and needle in err
    assert "Traceback" not in err


def test_list_marks_unreadable_profiles(pdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (pdir / "broken.toml").write_text("target_context = [\n")
    code, out, _ = run(capsys, "profiles", "--dir", str(pdir), "list")
    assert code == 0 and "broken  unreadable:" in out.replace("   ", " ").replace(
        "  unreadable", "  unreadable"
    )
