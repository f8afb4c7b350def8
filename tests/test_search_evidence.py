"""The evidence tables' search figures (``benchmarks/results/search_benchmark.evidence.json``, and
``search_benchmark.evidence-held-out.json`` for the held-out family): recomputable from the
per-seed sequences they record, each sequence's scores those of the table it ran on, and a table
rebuilt from its model (``benchmarks/search_tables.py``) equal to the committed CSV."""

from __future__ import annotations

import csv
import importlib
import io
import json
import math
import statistics
import sys
from functools import cache
from pathlib import Path

import pytest

from explorer.search_benchmark import NOISE_FREE, runs_of, summarize_runs

ROOT = Path(__file__).resolve().parents[1]
RESULTS = {
    "evidence": ROOT / "benchmarks" / "results" / "search_benchmark.evidence.json",
    "held-out": ROOT / "benchmarks" / "results" / "search_benchmark.evidence-held-out.json",
}
TABLES = ROOT / "benchmarks" / "results" / "tables"
SMALLEST = "evidence-qwen3b-l4x2-lora"
SMALLEST_HELD_OUT = "evidence-mistral7b-rtx4090x4-lora"


@cache
def _module():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module("search_tables")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


@cache
def _result(family: str = "evidence") -> dict:
    return json.loads(RESULTS[family].read_text())


def _scenarios(family: str) -> tuple:
    st = _module()
    return st.EVIDENCE_SCENARIOS if family == "evidence" else st.EVIDENCE_HELD_OUT_SCENARIOS


@pytest.mark.parametrize("family", sorted(RESULTS))
def test_every_evidence_table_was_run_with_both_variants(family: str):
    names = {f"evidence-{sc.name}.csv" for sc in _scenarios(family)}
    assert len(names) >= 7
    assert set(_result(family)) == names
    for figures in _result(family).values():
        assert set(figures["variants"]) == {"default", "optuna"}
        assert figures["scored_by"] == NOISE_FREE


def test_the_held_out_family_shares_no_table_with_the_seven():
    st = _module()
    seven = {sc.name for sc in st.EVIDENCE_SCENARIOS}
    assert seven.isdisjoint(sc.name for sc in st.EVIDENCE_HELD_OUT_SCENARIOS)
    assert {sc.activations for sc in st.EVIDENCE_SCENARIOS} == {"korthikanti"}
    assert {sc.activations for sc in st.EVIDENCE_HELD_OUT_SCENARIOS} == {"counted"}


def test_the_counted_activations_are_the_counted_layer():
    """The held-out family's ``30h + 4kv + 8I`` against ``activation_bytes.cpu.json``'s count of a
    granite-3.1-2b layer under bf16 autocast (the Trainer's ``bf16=True``)."""
    counted = json.loads((ROOT / "benchmarks" / "results" / "activation_bytes.cpu.json").read_text())
    per_h, per_kv, per_i = _module().COUNTED_ACTIVATIONS
    formula = per_h * counted["hidden"] + per_kv * counted["kv"] + per_i * counted["intermediate"]
    assert formula == pytest.approx(counted["variants"]["mixed"]["layer_bytes_per_token"], rel=0.02)


@pytest.mark.parametrize("family", sorted(RESULTS))
@pytest.mark.parametrize("variant", ["default", "optuna"])
def test_figures_recompute_from_the_recorded_sequences(family: str, variant: str):
    medians, after = [], []
    for figures in _result(family).values():
        recorded = figures["variants"][variant]
        runs = runs_of(variant, recorded["sequences"])
        assert len(runs) == recorded["runs"] == figures["seeds"][1] - figures["seeds"][0] + 1
        assert all(0 < len(r.values) <= figures["n_trials"] for r in runs)
        again = summarize_runs(runs, best=figures["best"])
        median = again["median_trials_to_98pct"]
        assert (None if median == float("inf") else median) == recorded["median_trials_to_98pct"]
        assert again["mean_best_after_20_over_best"] == pytest.approx(
            recorded["mean_best_after_20_over_best"]
        )
        assert again["trials_to_98pct"] == recorded["trials_to_98pct"]
        medians.append(median)
        after.append(again["mean_best_after_20_over_best"])
    # the family's figures (README, docs/benchmarks.md) follow from the per-table ones
    if variant == "default":
        assert statistics.median(medians) <= 10 and max(medians) <= 20
        assert statistics.mean(after) >= 0.99


@pytest.mark.parametrize(("family", "smallest"), [("evidence", SMALLEST), ("held-out", SMALLEST_HELD_OUT)])
def test_recorded_scores_are_the_tables_noise_free_values(family: str, smallest: str):
    from explorer.search_benchmark import valid_index
    from explorer.study_file import load_study

    name = f"{smallest}.csv"
    loaded = load_study(
        ROOT / "benchmarks" / "search_studies" / f"{smallest}.yaml",
        replay_table=TABLES / name,
        check_model=False,
    )
    index = valid_index(loaded)
    with (TABLES / name).open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(index)
    by_index = {}
    for config in loaded.space.enumerate():
        if config.key() in index:
            (row,) = (_row_value(r) for r in loaded.replay_table.lookup(config))
            by_index[index[config.key()]] = row
    figures = _result(family)[name]
    best = max(v for v in by_index.values() if v is not None)
    assert figures["best"] == pytest.approx(best)
    for variant in ("default", "optuna"):
        for seq in figures["variants"][variant]["sequences"]:
            for i, scored in zip(seq["config"], seq["score"], strict=True):
                assert scored == (None if by_index[i] is None else pytest.approx(by_index[i]))


def _row_value(row) -> float | None:
    return row.values[NOISE_FREE] if row.valid else None


@pytest.mark.parametrize("smallest", [SMALLEST, SMALLEST_HELD_OUT])
def test_a_table_rebuilt_from_the_model_is_the_committed_one(smallest: str):
    st = _module()
    scenarios = (*st.EVIDENCE_SCENARIOS, *st.EVIDENCE_HELD_OUT_SCENARIOS)
    (sc,) = [s for s in scenarios if f"evidence-{s.name}" == smallest]
    study = ROOT / "benchmarks" / "search_studies" / f"{smallest}.yaml"
    assert study.read_text() == st.evidence_study_text(sc)
    rows = st.evidence_rows(sc)
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    with (TABLES / f"{smallest}.csv").open(newline="") as fh:
        assert buf.getvalue() == fh.read()


def test_the_models_constants_come_from_the_evidence_rows():
    st = _module()
    speed, memory = st.compile_gain()
    assert speed == pytest.approx((6667 / 5762 + 6514 / 5605) / 2)
    assert memory == pytest.approx((77.0 / 82.4 + 62.0 / 67.0) / 2)
    # MPT-70B on H100 at micro-batch 8 and 2 (MFU 0.4088 and 0.3471): the solved half-point
    # gives back their ratio
    th = st.t_half()
    assert (16384 / (16384 + th)) / (4096 / (4096 + th)) == pytest.approx(0.4088 / 0.3471)
    h100 = st.card("NVIDIA-H100-80GB-HBM3")
    assert h100.capacity_gib == pytest.approx(79.18) and h100.peak == pytest.approx(989e12)
    assert st.card("NVIDIA-L4").capacity_gib == pytest.approx(22.03)


def test_a_slow_network_between_nodes_is_learned_apart_from_the_links_inside_a_node():
    import numpy as np

    from explorer.search._calibrate import PhysicsParts, fit_time_scales
    from explorer.search._surrogate import _across_nodes, _fit_with_fabric

    # compute, communication, offload, optimizer (s); two configurations on one node, two on two
    time = np.array([[1.0, 0.5, 0, 0.01], [2.0, 0.5, 0, 0.01], [1.0, 0.5, 0, 0.01], [2.0, 0.5, 0, 0.01]])
    parts = PhysicsParts(memory=np.ones((4, 4)), data=np.full(4, 1000.0), time=time)
    multi = np.array([False, False, True, True])
    truth = parts.time.copy()
    truth[2:, 1] *= 20  # the network is 20 times slower than the physics' guess
    step = truth[:, 0] + np.maximum(0, truth[:, 1] - 0.83 * truth[:, 0]) + truth[:, 3]
    measured = [(i, float(1000.0 / step[i])) for i in range(4)]
    scales, fabric = _fit_with_fabric(parts, multi, measured)
    assert fabric > 8
    logs = np.log([v for _, v in measured])
    fitted = _across_nodes(parts, multi, fabric).log_throughput(scales)
    assert np.abs(fitted - logs).max() < 0.1  # one node and two, each as measured
    # one multiplier of all the step's communication (the plain fit) cannot explain both
    plain = parts.log_throughput(fit_time_scales(parts, measured))
    assert np.abs(plain - logs).max() > 0.3
    # nothing measured across nodes: the plain fit, and the network as the physics says
    scales, fabric = _fit_with_fabric(parts, multi, measured[:2])
    assert fabric == 1.0
    assert scales == pytest.approx(fit_time_scales(parts, measured[:2]))


def _cell(median: float | None, p90: float | None = None) -> str:
    def one(x: float | None) -> str:
        return "never" if x is None or x == float("inf") else f"{x:g}"

    return one(median) if p90 is None else f"{one(median)} ({one(p90)})"


@pytest.mark.parametrize("family", sorted(RESULTS))
def test_the_docs_show_each_tables_recomputed_figures(family: str):
    """docs/benchmarks.md's tables of the evidence runs: each row's default median (p90) and best
    after 20, and TPE's median and best after 20, as recomputed from the recorded sequences."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    for table, figures in _result(family).items():
        cells = []
        for variant in ("default", "optuna"):
            again = summarize_runs(
                runs_of(variant, figures["variants"][variant]["sequences"]), best=figures["best"]
            )
            ranked = sorted(math.inf if n is None else n for n in again["trials_to_98pct"])
            p90 = ranked[math.ceil(0.9 * len(ranked)) - 1] if variant == "default" else None
            cells += [
                _cell(again["median_trials_to_98pct"], p90),
                f"{again['mean_best_after_20_over_best']:.3f}",
            ]
        row = f"| {table.removeprefix('evidence-').removesuffix('.csv')} | " + " | ".join(cells) + " |"
        assert row in text, row
