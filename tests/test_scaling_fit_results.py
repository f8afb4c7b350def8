"""``benchmarks/results/scaling_fit.json`` (``benchmarks/scaling_fit.py``): each table's held-back
summary recomputes from its own rows, and the smallest table's fit reruns to the recorded figures."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "scaling_fit.json"
DATA = json.loads(RESULTS.read_text())


def _bench():
    spec = importlib.util.spec_from_file_location("scaling_fit_bench", ROOT / "benchmarks" / "scaling_fit.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _close(fresh, recorded, *, abs_tol: float = 2e-6) -> bool:
    if recorded is None:
        return fresh is None or not math.isfinite(fresh)
    return fresh == pytest.approx(recorded, rel=1e-5, abs=abs_tol)


def test_every_table_is_there_and_says_what_it_is():
    assert set(DATA["tables"]) == set(_bench().NAMES)
    for name, table in DATA["tables"].items():
        assert table["kind"].startswith("measured on CPU" if name.startswith("cpu") else "modelled")
        assert table["held_back"]["summary"]["points"] == len(table["held_back"]["rows"])


@pytest.mark.parametrize("name", sorted(DATA["tables"]))
def test_held_back_summary_recomputes_from_its_rows(name):
    back = DATA["tables"][name]["held_back"]
    col = {c: i for i, c in enumerate(back["columns"])}
    rows = back["rows"]
    errors = []
    for r in rows:
        measured, predicted, low, high = (r[col[k]] for k in ("measured", "predicted", "low", "high"))
        assert r[col["rel_error"]] == pytest.approx(predicted / measured - 1, abs=2e-6)
        assert r[col["extrapolated"]]  # the largest GPU count of its family: always beyond the rest
        assert len(r[col["family"]]) == len(back["family_columns"])
        if high is not None:
            assert r[col["inside_band"]] == (low <= measured <= high)
        errors.append(abs(r[col["rel_error"]]))
    banded = [r[col["inside_band"]] for r in rows if r[col["high"]] is not None]
    summary = back["summary"]
    assert _close(sum(errors) / len(errors) if errors else None, summary["mean_abs_rel_error"])
    assert _close(max(errors) if errors else None, summary["max_abs_rel_error"])
    assert _close(sum(banded) / len(banded) if banded else None, summary["inside_band"], abs_tol=1e-6)


def test_the_smallest_table_reruns_to_the_recorded_figures():
    bench = _bench()
    fresh = bench.run_table("model-granite-3.1-2b")
    recorded = DATA["tables"]["model-granite-3.1-2b"]
    assert fresh["points"] == recorded["points"] and fresh["unfitted"] == recorded["unfitted"]
    for key, value in recorded["held_back"]["summary"].items():
        assert _close(fresh["held_back"]["summary"][key], value), key
    assert len(fresh["strategies"]) == len(recorded["strategies"])
    for new, old in zip(fresh["strategies"], recorded["strategies"], strict=True):
        assert new["strategy"] == old["strategy"] and new["points"] == old["points"]
        assert _close(new["per_doubling"], old["per_doubling"]) and _close(
            new["residual_sd"], old["residual_sd"]
        )


def test_the_modelled_tables_error_is_small_where_the_power_law_holds():
    """The figures docs/scaling.md quotes: under 1% mean held-back error on the three small modelled
    tables, and on the knobs table's strategies without CPU offload."""
    for name in ("model-granite-3.1-2b", "model-llama-3.1-8b", "model-granite-3.1-2b-wide"):
        assert DATA["tables"][name]["held_back"]["summary"]["mean_abs_rel_error"] < 0.01
    back = DATA["tables"]["model-granite-3.1-2b-knobs"]["held_back"]
    col = {c: i for i, c in enumerate(back["columns"])}
    on_gpu = [abs(r[col["rel_error"]]) for r in back["rows"] if "offload" not in r[col["strategy"]]]
    assert on_gpu and sum(on_gpu) / len(on_gpu) < 0.02
