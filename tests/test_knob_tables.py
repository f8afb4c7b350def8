"""The issue-23 tables (benchmarks/knob_tables.py): recorded as written, recomputable from their
model, and able to say no to the registry's orders (each failure mode holds in some table); their
certified versions, whose varying-shape rows carry the worst-case step's peak as a trial does."""

from __future__ import annotations

import csv
import gzip
import hashlib
import importlib
import json
import sys
from functools import cache
from pathlib import Path

import pytest

from explorer.paths import open_table, table_file

ROOT = Path(__file__).resolve().parents[1]
TABLES = ROOT / "benchmarks" / "results" / "tables"
CLEAN = "dataset_tokens_per_second_per_gpu_noise_free"


@cache
def _module():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module("knob_tables")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


@cache
def _rows(name: str) -> list[dict[str, str]]:
    with open_table(TABLES / f"knobs-{name}.csv") as fh:
        return list(csv.DictReader(fh))


def _key(row: dict[str, str], *, but: tuple[str, ...]) -> tuple[str, ...]:
    # the table's configuration columns (benchmarks/knob_tables.py); the length is fixed per table
    return tuple(row.get(k, "") for k in _module().COLUMNS if k != "model_max_length" and k not in but)


def _pairs(
    name: str, knob: str, a: str, b: str, *, also: tuple[str, ...] = ()
) -> list[tuple[dict[str, str], dict[str, str]]]:
    """Rows that differ only in ``knob`` (``a`` against ``b``) and the knobs ``also``."""
    by: dict[tuple[str, ...], dict[str, dict[str, str]]] = {}
    for r in _rows(name):
        by.setdefault(_key(r, but=(knob, *also)), {})[r[knob]] = r
    return [(v[a], v[b]) for v in by.values() if a in v and b in v]


@pytest.mark.parametrize("suffix", ["", "-certified"])
def test_each_table_is_the_one_recorded_and_small_enough_for_git(suffix: str):
    recorded = json.loads((TABLES / f"knobs{suffix}-tables.sha256.json").read_text())
    assert len(recorded) >= 6
    for name, facts in recorded.items():
        packed = table_file(TABLES / f"knobs-{name}{suffix}.csv")  # kept gzipped: the tree travels to GPUs
        data = gzip.decompress(packed.read_bytes()) if packed.suffix == ".gz" else packed.read_bytes()
        assert hashlib.sha256(data).hexdigest() == facts["sha256"], name
        assert packed.stat().st_size < 2**20 and facts["configurations"] > 10_000, name


@pytest.mark.slow
def test_a_sample_of_rows_follows_from_the_model():
    """Every 701st configuration of one table recomputed from the model."""
    from explorer.study_file import load_study
    from explorer.validity import invalid_reason
    from explorer.worker._data import entry_length

    tables = _module()
    (sc,) = [s for s in tables.SCENARIOS if s.name == "llama-8b-a100-40x2-full"]
    loaded = load_study(tables.STUDIES / f"{sc.name}.yaml", replay_table=TABLES / f"knobs-{sc.name}.csv")
    table = loaded.replay_table
    spec = loaded.spec.workload.dataset
    entries = tables.Entries(tuple(sorted(entry_length(spec, i) for i in range(spec.entries))))
    configs = [c for c in loaded.space.enumerate() if invalid_reason(c, loaded.spec.resources) is None]
    assert len(table.rows) == len(configs)
    assert any(c.number_gpus == 1 and c.distributed_backend == "FSDP" for c in configs[::701])
    for c in configs[::701]:
        (row,) = table.lookup(c)
        fresh = tables.row_of(sc, entries, c, {})
        assert row.valid == bool(fresh["is_valid"]), c.key()
        assert row.values.get(CLEAN, 0.0) == pytest.approx(fresh[CLEAN], rel=1e-6)
        assert row.values["wall_seconds"] == pytest.approx(fresh["wall_seconds"], rel=1e-6)


def test_a_certified_table_is_the_first_with_its_varying_shape_rows_at_the_worst_case():
    """The certified table's rows against the first's: the same configurations and throughput; a
    ``max_length`` row the same peak; a ``longest`` or ``packed`` row the peak of ``b`` entries of
    ``s`` tokens (recomputed from the model for a sample), never below the sampled batches'."""
    from explorer.study_file import load_study
    from explorer.validity import invalid_reason

    tables = _module()
    name = "llama-8b-h100x4-lora-long"
    (sc,) = [s for s in tables.SCENARIOS if s.name == name]
    with open_table(TABLES / f"knobs-{name}-certified.csv") as fh:
        certified = list(csv.DictReader(fh))
    first = _rows(name)
    assert len(certified) == len(first)
    moved = 0
    for a, b in zip(first, certified, strict=True):
        assert _key(a, but=()) == _key(b, but=())
        if b["is_valid"] == "1":
            assert a["is_valid"] == "1" and a[CLEAN] == b[CLEAN]
            if a["padding"] == "max_length":
                assert a["peak_memory_gib"] == b["peak_memory_gib"]
            else:
                assert float(b["peak_memory_gib"]) >= float(a["peak_memory_gib"])
        elif a["is_valid"] == "1":
            moved += 1
            assert a["padding"] != "max_length"
    assert moved > 0.2 * sum(r["is_valid"] == "1" for r in first)
    loaded = load_study(tables.STUDIES / f"{name}.yaml", check_model=False)
    configs = [c for c in loaded.space.enumerate() if invalid_reason(c, loaded.spec.resources) is None]
    card = tables.ARCHS[sc.arch], tables.GPUS[sc.gpu]
    for c, row in list(zip(configs, certified, strict=True))[::997]:
        if c.padding == "max_length" or row["is_valid"] != "1":
            continue
        work = tables.worst_case_work(c.padding, c.per_device_batch_size, c.model_max_length)
        peak = tables.memory_gib(*card, c, work, sc.method == "lora")
        assert float(row["peak_memory_gib"]) == pytest.approx(peak, abs=0.006)


def test_the_first_tables_best_runs_out_of_memory_at_the_worst_case_step():
    """Each first table's best is a ``packed`` row that the worst-case step does not hold: the
    certified table does not have it among its fitting rows."""
    recorded = json.loads((TABLES / "knobs-tables.sha256.json").read_text())
    certified = json.loads((TABLES / "knobs-certified-tables.sha256.json").read_text())
    assert set(recorded) == set(certified)
    for name, facts in recorded.items():
        assert facts["best_configuration"]["padding"] == "packed", name
        assert certified[name]["fit"] < facts["fit"], name
        assert certified[name]["best"] <= facts["best"], name


def test_the_docs_figures_of_the_certified_tables():
    """docs/benchmarks.md's ranges (configurations that fit, best against the first tables'),
    recomputed from the two hash records."""
    import re

    first = json.loads((TABLES / "knobs-tables.sha256.json").read_text())
    certified = json.loads((TABLES / "knobs-certified-tables.sha256.json").read_text())
    fit = [certified[n]["fit"] for n in first]
    before = [first[n]["fit"] for n in first]
    ratio = {n: certified[n]["best"] / first[n]["best"] for n in first}
    rest = [
        v for n, v in ratio.items() if n not in ("granite-2b-h100x8-short", "granite-2b-a100-80x4-compile")
    ]
    said = (
        f"{min(fit):,} to {max(fit):,} configurations fit where the first tables have {min(before):,} to "
        f"{max(before):,}, and the best is {min(ratio.values()):.2f} to {max(ratio.values()):.2f} of the first "
        f"tables' (granite on 8 x H100 {ratio['granite-2b-h100x8-short']:.2f}, granite with compile "
        f"{ratio['granite-2b-a100-80x4-compile']:.2f}, the rest {min(rest):.2f} to {max(rest):.2f})"
    )
    page = re.sub(r"\s+", " ", (ROOT / "docs" / "benchmarks.md").read_text())
    assert said in page, said


def test_the_fastest_simple_start_cannot_hold_an_8b_full_fine_tune_on_40gb_cards():
    rows = _rows("llama-8b-a100-40x2-full")
    simple = [
        r
        for r in rows
        if r["number_gpus"] == "1"
        and r["distributed_backend"] == "NONE"
        and r["precision"] == "mixed"
        and r["optim"].startswith("adamw_torch")
    ]
    assert simple and not any(r["is_valid"] == "1" for r in simple)
    fits = [r for r in rows if r["is_valid"] == "1"]
    assert all(
        r["number_gpus"] == "2" or r["precision"] == "pure_bf16" or r["fsdp_cpu_offload"] == "True"
        for r in fits
    )


def test_fsdp_with_cpu_offload_holds_the_8b_full_fine_tune_on_one_40gb_card_slowly():
    """FSDP with CPU offload on one GPU (issue 23): fits in mixed precision with AdamW, where the
    single process cannot, at a fraction of the best (PCIe and the CPU optimizer step)."""
    rows = _rows("llama-8b-a100-40x2-full")
    offload = [r for r in rows if r["number_gpus"] == "1" and r["distributed_backend"] == "FSDP"]
    assert offload and all(r["fsdp_cpu_offload"] == "True" for r in offload)
    held = [
        r
        for r in offload
        if r["is_valid"] == "1" and r["precision"] == "mixed" and r["optim"] == "adamw_torch"
    ]
    assert held
    best = max(float(r[CLEAN]) for r in rows)
    assert max(float(r[CLEAN]) for r in held) < 0.5 * best


def test_fused_and_plain_adamw_need_the_same_memory():
    pairs = _pairs("llama-8b-a100-40x2-full", "optim", "adamw_torch", "adamw_torch_fused")
    assert pairs and all(a["peak_memory_gib"] == b["peak_memory_gib"] for a, b in pairs)
    assert any(a["is_valid"] == "1" for a, _ in pairs)


def test_packed_rows_under_dense_kernels_can_need_more_memory_and_run_slower():
    eager = [
        (p, m)
        for p, m in _pairs("qwen-0.5b-l40s-x4-short", "padding", "packed", "max_length")
        if p["attn_implementation"] == "eager"
    ]
    pairs = _pairs("llama-8b-h100x4-lora-long", "padding", "packed", "max_length")
    assert any(p["is_valid"] == "0" and m["is_valid"] == "1" for p, m in eager)
    sdpa = [
        (p, m)
        for p, m in pairs
        if p["attn_implementation"] == "sdpa" and p["is_valid"] == m["is_valid"] == "1"
    ]
    assert any(float(p[CLEAN]) < float(m[CLEAN]) for p, m in sdpa)


def test_under_compile_flash_can_lose_to_sdpa_and_liger_to_no_liger():
    name = "granite-2b-a100-80x4-compile"
    flash = [
        (f, s)
        for f, s in _pairs(name, "attn_implementation", "flash_attention_2", "sdpa")
        if f["torch_compile"] == "True" and f["is_valid"] == s["is_valid"] == "1"
    ]
    assert any(float(f[CLEAN]) < float(s[CLEAN]) for f, s in flash)
    liger = [
        (on, off)
        for on, off in _pairs(name, "liger_kernel", "True", "False")
        if on["torch_compile"] == "True" and on["is_valid"] == off["is_valid"] == "1"
    ]
    assert any(float(on[CLEAN]) < float(off[CLEAN]) for on, off in liger)


def test_near_the_limit_checkpointing_can_be_faster():
    """The allocator's retries near the limit cost more than recomputing half the layers."""
    pairs = _pairs(
        "granite-2b-h100x8-short", "gradient_checkpointing", "True", "False", also=("checkpoint_fraction",)
    )
    assert any(
        on["is_valid"] == off["is_valid"] == "1" and float(on[CLEAN]) > float(off[CLEAN]) for on, off in pairs
    )


def test_adafactor_under_fsdp1_needs_more_than_8bit_adamw():
    pairs = [
        (a, b)
        for a, b in _pairs("llama-8b-h100x8-full-long", "optim", "adafactor", "adamw_bnb_8bit")
        if a["fsdp_version"] == "1" and a["peak_memory_gib"] and b["peak_memory_gib"]
    ]
    assert pairs and all(float(a["peak_memory_gib"]) >= float(b["peak_memory_gib"]) for a, b in pairs)
    states_on_gpu = [
        (a, b) for a, b in pairs if a["fsdp_cpu_offload"] == "False" and a["precision"] == "mixed"
    ]
    assert states_on_gpu and all(
        float(a["peak_memory_gib"]) > float(b["peak_memory_gib"]) for a, b in states_on_gpu
    )


def test_the_tables_activations_against_the_counted_layer_in_the_docs():
    """The tables price a layer's activations as counted (autocast ``30h + 4kv + 8I``, pure bf16
    ``20h + 4kv + 8I``); docs/benchmarks.md's ranges of the tables as first written, at
    Korthikanti's count, over the counted layer, and pure bf16's share of autocast's in both, over
    the tables' models."""
    from types import SimpleNamespace

    kt = _module()
    mixed, pure, share, counted = [], [], [], []
    for a in kt.ARCHS.values():
        h, i, kv = a.hidden, a.intermediate, a.kv
        cm, cp = 30 * h + 4 * kv + 8 * i, 20 * h + 4 * kv + 8 * i
        assert kt._activation_bytes(a, SimpleNamespace(precision="mixed", liger_kernel=False)) == cm
        assert kt._activation_bytes(a, SimpleNamespace(precision="pure_bf16", liger_kernel=False)) == cp
        p = 2 * (6 * h + 2 * kv + 3 * i)
        m = p + 4 * h
        mixed.append(m / cm)
        pure.append(p / cp)
        share.append(p / m)
        counted.append(cp / cm)
    doc = " ".join((ROOT / "docs" / "benchmarks.md").read_text().split())

    def span(xs: list[float]) -> str:
        return f"{min(xs):.2f}-{max(xs):.2f}"

    assert f"{span(mixed)} of the transformers layer counted under autocast" in doc
    assert f"{span(pure)} of it in pure bf16" in doc
    assert f"pure bf16 kept {span(share)} of autocast's activations there, {span(counted)} counted" in doc


def test_the_docs_certified_bests_near_the_card():
    """docs/benchmarks.md's peaks of two certified tables' bests against their cards: gemma's one
    L4 (two reach 0.972 of it with DDP) and granite-with-compile's best and its FULL_SHARD
    neighbour with and without compile."""
    kt = _module()
    text = " ".join((ROOT / "docs" / "benchmarks.md").read_text().split())

    def ranked(name: str) -> tuple[list[dict[str, str]], float]:
        rows = [r for r in _rows(f"{name}-certified") if r["is_valid"] == "1" and r[CLEAN]]
        rows.sort(key=lambda r: -float(r[CLEAN]))
        return rows, float(rows[0][CLEAN])

    gemma, best = ranked("gemma2-2b-l4x2-lora-long")
    l4 = kt.GPUS["NVIDIA-L4"].capacity_gib
    two = max((r for r in gemma if r["number_gpus"] == "2"), key=lambda r: float(r[CLEAN]))
    assert gemma[0]["number_gpus"] == "1" and two["distributed_backend"] == "DDP"
    said = (
        f"(21.1 GiB of {l4:.1f}), and two L4s reach {float(two[CLEAN]) / best:.3f} of it (DDP, "
        f"{two['batch_size']} packed rows a GPU)"
    )
    assert f"{float(gemma[0]['peak_memory_gib']):.1f}" == "21.1" and said in text, said
    granite, best = ranked("granite-2b-a100-80x4-compile")
    top = granite[0]
    a100 = kt.GPUS["NVIDIA-A100-SXM4-80GB"].capacity_gib
    assert f"no compile: {float(top['peak_memory_gib']):.1f} GiB of {a100:.1f})" in text
    but = ("fsdp_sharding_strategy", "torch_compile")
    rows = _rows("granite-2b-a100-80x4-compile-certified")
    full = [
        r
        for r in rows
        if r["fsdp_sharding_strategy"] == "FULL_SHARD" and _key(r, but=but) == _key(top, but=but)
    ]
    off = next(r for r in full if r["torch_compile"] == "False")
    on = next(r for r in full if r["torch_compile"] == "True")
    said = (
        f"FULL_SHARD neighbour ({float(off['peak_memory_gib']):.1f} GiB, {float(off[CLEAN]) / best:.3f}) measured "
        f"with compile ({float(on['peak_memory_gib']):.1f} GiB, {float(on[CLEAN]) / best:.2f} of the best"
    )
    assert said in text, said
