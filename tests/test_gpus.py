"""The one table of GPU facts equals the evidence CSV, each figure with its source; lookups and
declared figures for a card the table does not know."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from explorer.flops import peak_flops_for
from explorer.gpus import GPUS, gpu_figures, lookup, missing_figures
from explorer.search._physics import gpu_memory_gib

CSV = Path(__file__).resolve().parents[1] / "benchmarks" / "evidence" / "gpus.csv"
UNSOURCED = {("NVIDIA-A10G", "link_gbs")}
"""Figures whose CSV source says ``unsourced`` (the A10G's PCIe link, assumed from the A10 silicon)."""


def _rows() -> dict[str, dict[str, str]]:
    return {r["k8s_gpu_product_label"]: r for r in csv.DictReader(CSV.open())}


def _row_of(label: str, rows: dict[str, dict[str, str]]) -> dict[str, str]:
    return next(r for key, r in rows.items() if label in key.split(" / "))


def _number(text: str) -> float | None:
    return float(text) if text.strip() else None


def test_every_csv_card_is_in_the_table():
    labels = {g.label for g in GPUS}
    for key in _rows():
        assert all(part in labels for part in key.split(" / ")), key


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.label)
def test_the_table_equals_the_csv_with_a_source_per_figure(gpu):
    row = _row_of(gpu.label, _rows())
    assert gpu.nvml_name in row["nvml_name"]
    assert gpu.ray_type == row["ray_accelerator_type_detected"]
    assert gpu.bf16_tflops == _number(row["bf16_dense_tflops"])
    memory = row["memory_gb_marketed"]
    assert gpu.memory_gb == (float(memory) if memory.replace(".", "").isdigit() else gpu.memory_gb)
    assert str(int(gpu.memory_gb)) in memory
    assert gpu.cuda_gib == _number(row["cuda_total_gib"])
    assert gpu.bandwidth_tbs == float(row["mem_bandwidth_tbs"])
    assert gpu.link_gbs == float(row["link_gbs_per_gpu_bidir"])
    columns = {
        "bf16_tflops": "bf16_source",
        "memory_gb": "memory_source",
        "bandwidth_tbs": "bandwidth_source",
        "link_gbs": "link_source",
    }
    if gpu.cuda_gib is not None:
        columns["cuda_gib"] = "cuda_total_source"
    assert gpu.fabric_gbs == _number(row["fabric_gbs_per_gpu"])
    if gpu.fabric_gbs is not None:
        columns["fabric_gbs"] = "fabric_source"
    for name, column in columns.items():
        assert gpu.sources[name] == row[column]
        if (gpu.label, name) not in UNSOURCED:
            assert not gpu.sources[name].startswith("unsourced"), (gpu.label, name)
    assert gpu.link == ("nvlink" if gpu.link_gbs >= 300 else "pcie")


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("H100", "NVIDIA-H100-80GB-HBM3"),
        ("NVIDIA H100 PCIe", "NVIDIA-H100-PCIe"),
        ("NVIDIA-H100-NVL", "NVIDIA-H100-NVL"),
        ("NVIDIA GH200 480GB", "NVIDIA-GH200-480GB"),
        ("NVIDIA-GB200", "NVIDIA-GB200"),
        ("NVIDIA B200", "NVIDIA-B200"),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
        ("NVIDIA A100 80GB PCIe", "NVIDIA-A100-80GB-PCIe"),
        ("NVIDIA L4", "NVIDIA-L4"),
        ("NVIDIA-L40", "NVIDIA-L40"),
        ("NVIDIA L40S", "NVIDIA-L40S"),
        ("NVIDIA A10", "NVIDIA-A10"),
        ("NVIDIA A10G", "NVIDIA-A10G"),
        ("NVIDIA RTX A6000", "NVIDIA-RTX-A6000"),
        ("NVIDIA GeForce RTX 4090", "NVIDIA-GeForce-RTX-4090"),
        ("Tesla T4", "Tesla-T4"),
    ],
)
def test_names_find_their_row(name, label):
    gpu = lookup(name)
    assert gpu is not None and gpu.label == label


@pytest.mark.parametrize("name", ["NVIDIA-A800-80GB", "AMD-MI300X", "A100", "CPU-logical", "", None])
def test_an_unknown_or_ambiguous_name_finds_nothing(name):
    assert lookup(name) is None
    assert peak_flops_for(name or "x") is None


def test_gh200_memory_is_the_gpus_not_the_cpus():
    """``NVIDIA GH200 480GB``: 480 GB is the Grace CPU's LPDDR5X; the GPU has 96 GB."""
    assert gpu_memory_gib("NVIDIA-GH200-480GB") == 96.0


def test_blackwell_is_priced_at_its_own_peak_and_link():
    gb200 = lookup("NVIDIA-GB200")
    assert gb200 is not None and gb200.peak_flops == 2500e12 and gb200.nvlink


def test_an_unknown_card_names_the_missing_figures():
    line = missing_figures("NVIDIA-A800-80GB", {"bf16_tflops": 312})
    assert line is not None and "memory_gib, bandwidth_tbs, link_gbs" in line and "bf16_tflops" not in line
    assert "data sheet" in line
    assert gpu_figures("NVIDIA-A800-80GB", {"bf16_tflops": 312}) is None


def test_declared_figures_price_an_unknown_card_and_override_a_known_one():
    declared = {"bf16_tflops": 312, "memory_gib": 79.3, "bandwidth_tbs": 2.0, "link_gbs": 400}
    gpu = gpu_figures("NVIDIA-A800-80GB", declared)
    assert gpu is not None and gpu.peak_flops == 312e12 and gpu.memory_gb == 79.3 and gpu.nvlink
    assert missing_figures("NVIDIA-A800-80GB", declared) is None
    capped = gpu_figures("NVIDIA-H100-80GB-HBM3", {"bf16_tflops": 700})
    assert capped is not None and capped.peak_flops == 700e12 and capped.memory_gb == 80.0
    assert capped.sources["bf16_tflops"].startswith("declared")
    assert missing_figures("CPU-logical") is None


def test_the_simulated_cards_of_the_knob_tables_agree_with_the_table():
    """``benchmarks/knob_tables.py`` simulates the cards its recorded tables were drawn on: their
    data-sheet figures are the table's (its memory within 0.2 GiB of what CUDA reports)."""
    from benchmarks.knob_tables import GPUS as SIMULATED

    for name, card in SIMULATED.items():
        gpu = lookup(name)
        assert gpu is not None, name
        assert card.peak == pytest.approx(gpu.peak_flops), name
        assert card.hbm == pytest.approx(gpu.bandwidth_tbs * 1e12), name
        if gpu.cuda_gib is not None:
            assert card.capacity_gib == pytest.approx(gpu.cuda_gib, abs=0.2), name
        else:
            assert card.capacity_gib <= gpu.memory_gb, name
