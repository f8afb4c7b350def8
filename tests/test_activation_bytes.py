"""benchmarks/activation_bytes.py on the CPU: what a real transformers decoder layer keeps for the
backward, counted by autograd's saved-tensor hooks, and the figures docs/estimate.md quotes."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "benchmarks" / "gpu_kit_cpu.yaml"
"""A 2-layer granite (hidden 64, intermediate 128, 4 heads over 2 key-value heads of 16)."""
RECORDED = ROOT / "benchmarks" / "results" / "activation_bytes.cpu.json"


def _script():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    return importlib.import_module("activation_bytes")


@pytest.fixture(scope="module")
def counted() -> dict:
    return _script().run(TINY, layers=2, batch=2, seq=100, device="cpu")


def test_a_bf16_layer_keeps_its_tensors_and_autocast_keeps_fp32_norms_and_a_cast_per_projection(counted):
    """transformers' granite layer in bf16 keeps, a token: each RMSNorm's fp32 upcast and bf16
    normalized tensor (4h + 2h, twice), the attention's input (2h), q (2h), k and v (2kv each), the
    attention output (2h), the MLP's input (2h) and four intermediate-width tensors (8I): 20h + 4kv
    + 8I bytes, plus sdpa's log-sum-exp. Under autocast the norms keep fp32 tensors (8h each) and
    every projection casts its input anew (q, k, v three bf16 copies, gate and up two): 30h + 4kv +
    8I. Each layer counts the same but for the rotary tables the first one keeps."""
    h, kv, inter = counted["hidden"], counted["kv"], counted["intermediate"]
    variants = counted["variants"]
    assert set(variants) == {"mixed", "pure_bf16"}
    for name, formula in (("pure_bf16", 20 * h + 4 * kv + 8 * inter), ("mixed", 30 * h + 4 * kv + 8 * inter)):
        last = variants[name]["per_layer"][-1]
        assert last == pytest.approx(formula, rel=0.02), (name, last, formula)
        assert variants[name]["per_layer"][0] == pytest.approx(last, rel=0.03)
        assert variants[name]["ratio"] == pytest.approx(
            variants[name]["layer_bytes_per_token"] / variants[name]["physics_layer_bytes_per_token"]
        )


def test_autocasts_weight_copies_are_counted_apart(counted):
    """Autocast's bf16 copy of every linear weight (the layers' and the tied LM head's), 2 bytes a
    parameter, is a weight, not an activation; a bf16 model has none."""
    h, kv, inter, layers = counted["hidden"], counted["kv"], counted["intermediate"], counted["layers"]
    vocab = 4096  # benchmarks/gpu_kit_cpu.yaml's, its LM head tied to the embeddings
    linear = layers * (2 * h * h + 2 * h * kv + 3 * h * inter) + vocab * h
    assert counted["variants"]["mixed"]["weight_copy_bytes"] == 2 * linear
    assert counted["variants"]["pure_bf16"]["weight_copy_bytes"] == 0


def test_a_variant_that_cannot_run_records_its_error_and_the_others_are_counted(tmp_path, monkeypatch):
    """Liger's variants where Liger cannot run (no CUDA here: its check is overridden, the one
    fake): each records its error's first line, the bf16 and mixed counts are still written, and
    the command exits 1."""
    script = _script()
    monkeypatch.setattr(script, "liger_runs", lambda device: True)
    out = tmp_path / "counted.json"
    rc = script.main(["--study", str(TINY), "--seq", "100", "--device", "cpu", "--json", str(out)])
    variants = json.loads(out.read_text())["variants"]
    assert rc == 1
    assert list(variants) == ["pure_bf16+liger", "mixed+liger", "pure_bf16", "mixed"]
    assert all(
        variants[n]["error"] and "\n" not in variants[n]["error"] for n in ("pure_bf16+liger", "mixed+liger")
    )
    assert (
        variants["pure_bf16"]["layer_bytes_per_token"] > 0 and variants["mixed"]["layer_bytes_per_token"] > 0
    )
    if importlib.util.find_spec("liger_kernel") is None:  # each got as far as Liger's patch
        assert {variants[n]["error"] for n in ("pure_bf16+liger", "mixed+liger")} == {
            "ModuleNotFoundError: No module named 'liger_kernel'"
        }


def test_the_recorded_granite_count_and_the_docs_figures():
    """benchmarks/results/activation_bytes.cpu.json (granite-3.1-2b's shape, two layers, 1000
    tokens): each layer within 1% of the formulas above, and docs/estimate.md's figures (bytes a
    token-layer, a token-layer-hidden unit, and over the physics) recomputed from it."""
    data = json.loads(RECORDED.read_text())
    h, inter, kv = data["hidden"], data["intermediate"], data["kv"]
    doc = (ROOT / "docs" / "estimate.md").read_text()
    for name, formula in (("pure_bf16", 20 * h + 4 * kv + 8 * inter), ("mixed", 30 * h + 4 * kv + 8 * inter)):
        v = data["variants"][name]
        assert v["per_layer"][-1] == pytest.approx(formula, rel=0.01)
        mean = sum(v["per_layer"]) / len(v["per_layer"])
        assert v["layer_bytes_per_token"] == pytest.approx(mean)
        quoted = f"{mean:,.0f} bytes a token and layer ({mean / h:.1f} a hidden unit, {mean / v['physics_layer_bytes_per_token']:.2f}x"
        assert quoted in re.sub(r"\s+", " ", doc), quoted
    assert f"{data['variants']['mixed']['physics_layer_bytes_per_token']:,.0f}" in doc
    # docs/benchmarks.md quotes the autocast figure a hidden unit against the granite table's model
    mixed = data["variants"]["mixed"]
    bench = re.sub(r"\s+", " ", (ROOT / "docs" / "benchmarks.md").read_text())
    assert (
        f"keeps {mixed['layer_bytes_per_token'] / data['hidden']:.1f} under the Trainer's bf16 autocast"
        in bench
    )


def test_the_recorded_count_is_priced_by_the_physics_as_it_is(tmp_path):
    """``--reprice`` leaves the recorded file as it is: its physics figures are the package's now
    (a change of the physics re-prices it), and the counts are not touched."""
    copy = tmp_path / "count.json"
    copy.write_text(RECORDED.read_text())
    assert _script().main(["--reprice", str(copy)]) == 0
    assert json.loads(copy.read_text()) == json.loads(RECORDED.read_text())
