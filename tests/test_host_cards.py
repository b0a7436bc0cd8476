"""The card table: peak bandwidth by the name the GPU sampler reads, unknown cards named as unknown."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.core.cards import card_bandwidth, known_cards
from console.core.gpus import parse_nvidia_smi_gpus

DOCS = Path(__file__).resolve().parents[1] / "docs" / "gpu-bandwidth.md"


@pytest.mark.parametrize(
    ("smi_name", "card", "peak"),
    [
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX PRO 6000 Blackwell", 1792.0),
        ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "RTX PRO 6000 Blackwell", 1792.0),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 3350.0),
        ("NVIDIA H100 PCIe", "H100 PCIe", 2000.0),
        ("NVIDIA H100 NVL", "H100 NVL", 3900.0),
        ("NVIDIA H200", "H200", 4800.0),
        ("NVIDIA H200 NVL", "H200", 4800.0),
        ("NVIDIA B200", "B200", 8000.0),
        ("NVIDIA B300 SXM6 AC", "B300", 8000.0),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 2039.0),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 1935.0),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB", 1555.0),
        ("NVIDIA L40S", "L40S", 864.0),
        ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090", 1008.0),
        ("NVIDIA GeForce RTX 5090", "GeForce RTX 5090", 1792.0),
        ("AMD Instinct MI300X", "Instinct MI300X", 5300.0),
        ("AMD Instinct MI355X", "Instinct MI355X", 8000.0),
    ],
)
def test_every_card_of_the_issue_is_in_the_table(smi_name: str, card: str, peak: float) -> None:
    entry = card_bandwidth(smi_name)
    assert entry is not None and (entry.name, entry.peak_gbs) == (card, peak)
    assert entry.source


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA RTX 6000 Ada Generation",  # not the Blackwell RTX PRO 6000
        "NVIDIA H20",  # not an H200
        "NVIDIA H800",
        "NVIDIA GB200",  # a Grace-Blackwell module: not guessed as a B200
        "NVIDIA GeForce RTX 4080",
        "AMD Instinct MI250X",
        "",
        "   ",
        None,
    ],
)
def test_a_card_the_table_does_not_name_is_unknown(name: str | None) -> None:
    assert card_bandwidth(name) is None
    assert card_bandwidth(name, 81_920) is None


def test_an_a100_without_its_size_in_the_name_is_told_by_its_memory() -> None:
    assert card_bandwidth("NVIDIA A100-SXM4", 81_920) == card_bandwidth("NVIDIA A100-SXM4-80GB")
    assert card_bandwidth("NVIDIA A100-SXM4", 40_960) == card_bandwidth("NVIDIA A100-SXM4-40GB")
    assert card_bandwidth("NVIDIA A100-SXM4") is None  # neither size nor memory: unknown


def test_the_samplers_name_maps_to_the_table() -> None:
    # The GPU sampler's own parse of an nvidia-smi line (a real RTX PRO 6000 host's query output).
    csv = "0, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-1d2e, 0, 97034, 97887\n"
    gpu = parse_nvidia_smi_gpus(csv)[0]
    entry = card_bandwidth(gpu.name, gpu.memory_total_mib)
    assert entry is not None and entry.peak_gbs == 1792.0 and entry.memory == "GDDR7"


def test_every_figure_is_in_the_docs_with_its_source() -> None:
    text = DOCS.read_text()
    for entry in known_cards():
        row = next((line for line in text.splitlines() if line.startswith(f"| {entry.name} |")), None)
        assert row is not None, entry.name
        assert f"{entry.peak_gbs:,.0f}" in row and "http" in row, row
