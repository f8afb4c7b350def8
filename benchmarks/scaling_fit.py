"""The scaling model of ``explorer/plan/_scaling.py`` on the project's tables, and its error on
measured points it was not fitted on (held back).

The GPU tables (``benchmarks/results/tables/model-*.csv``) are *modelled* by
``benchmarks/search_tables.py`` (a memory and throughput model of one 8 x H100 node), not measured
on a GPU; ``cpu-quickstart.csv`` is a real CPU run of ``studies/cpu-table.yaml`` (explorer export).
A row is a point when ``is_valid`` is 1 and ``dataset_tokens_per_second_per_gpu`` > 0 (and, where
the columns exist, ``status`` is ok and ``reused_from`` is empty). Its family is the tuple of its
configuration columns (the knobs in the header) without number_gpus / number_nodes, with the global
``batch_size`` replaced by the per-device batch (``batch_size // number_gpus``, as the worker runs
it): the model is one of weak scaling. Its strategy comes from distributed_backend, fsdp_version
and fsdp_sharding_strategy, and fsdp_cpu_offload where the table has it (``strategy_of``).

Writes ``benchmarks/results/scaling_fit.json``: per table, each strategy's fit, every held-back row
and the summary; ``tests/test_scaling_fit_results.py`` recomputes the summary from the rows.

    .venv/bin/python benchmarks/scaling_fit.py [--out JSON]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from explorer.knobs import knobs  # noqa: E402
from explorer.plan._scaling import HeldBack, ScalingFit, ScalingPoint, fit_scaling, held_back  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "scaling_fit.json"
TABLES = ROOT / "benchmarks" / "results" / "tables"
NAMES = (
    "model-granite-3.1-2b",
    "model-llama-3.1-8b",
    "model-granite-3.1-2b-wide",
    "model-granite-3.1-2b-knobs",
    "cpu-quickstart",
)
LEVEL = 0.9


def strategy_of(row: dict[str, str]) -> str:
    """``"single GPU"``, ``"DDP"`` or ``"FSDP<version> <sharding>"``, with ``" + CPU offload"`` when
    ``fsdp_cpu_offload`` is on: offloaded states move over PCIe in 1/N per GPU, so their per-GPU
    scaling differs from the same strategy on the GPU (x1.58 against x0.99 per doubling in the
    knobs table) and one slope for both fits neither."""
    backend = row["distributed_backend"]
    if backend == "NONE":
        return "single GPU"
    if backend == "FSDP":
        offload = " + CPU offload" if row.get("fsdp_cpu_offload") == "True" else ""
        return f"FSDP{row['fsdp_version']} {row['fsdp_sharding_strategy']}{offload}"
    return backend


def is_point(row: dict[str, str]) -> bool:
    """A valid, measured (not reused) row with a positive throughput."""
    if row.get("is_valid") != "1" or row.get("status", "ok") != "ok" or row.get("reused_from"):
        return False
    return float(row["dataset_tokens_per_second_per_gpu"] or 0) > 0


def family_of(row: dict[str, str], columns: list[str]) -> tuple[tuple[str, str], ...]:
    """The configuration without its GPU and node counts, at the same per-device batch."""
    gpus = int(row["number_gpus"])
    pairs = [(c, row[c]) for c in columns if c not in ("number_gpus", "number_nodes", "batch_size")]
    return (("per_device_batch_size", str(int(row["batch_size"]) // gpus)), *pairs)


def load(name: str) -> tuple[list[ScalingPoint], int]:
    """The table's points, and the rows read."""
    from explorer.paths import open_table

    with open_table(TABLES / f"{name}.csv") as fh:
        reader = csv.DictReader(fh)
        header = list(reader.fieldnames or [])
        rows = list(reader)
    names = {k.name for k in knobs()}
    columns = [c for c in header if c in names]
    points = [
        ScalingPoint(
            family=family_of(r, columns),
            strategy=strategy_of(r),
            number_gpus=int(r["number_gpus"]),
            number_nodes=int(r.get("number_nodes") or 1),
            per_gpu=float(r["dataset_tokens_per_second_per_gpu"]),
        )
        for r in rows
        if is_point(r)
    ]
    return points, len(rows)


def _num(x: float) -> float | None:
    """JSON has no nan or inf: null."""
    return round(x, 6) if math.isfinite(x) else None


ROW_COLUMNS = (
    "family",
    "strategy",
    "number_gpus",
    "number_nodes",
    "measured",
    "predicted",
    "low",
    "high",
    "rel_error",
    "inside_band",
    "extrapolated",
)
"""One held-back row, as a list (the knobs table holds back 10,000 points); ``family`` is the list
of the values of ``family_columns``."""


def held_back_json(back: HeldBack) -> dict[str, Any]:
    """Every held-back row and the summary."""
    family_columns = [k for k, _ in back.rows[0].point.family] if back.rows else []  # type: ignore[attr-defined]
    rows = [
        [
            [v for _, v in r.point.family],  # type: ignore[attr-defined]
            r.point.strategy,
            r.point.number_gpus,
            r.point.number_nodes,
            _num(r.point.per_gpu),
            _num(r.prediction.per_gpu),
            _num(r.prediction.low),
            _num(r.prediction.high),
            _num(r.rel_error),
            r.inside_band,
            r.prediction.extrapolated,
        ]
        for r in back.rows
    ]
    summary = {
        "points": len(rows),
        "mean_abs_rel_error": _num(back.mean_abs_rel_error),
        "max_abs_rel_error": _num(back.max_abs_rel_error),
        "inside_band": _num(back.inside_band),
        "unpredicted": back.unpredicted,
    }
    return {"summary": summary, "columns": list(ROW_COLUMNS), "family_columns": family_columns, "rows": rows}


def dump(result: dict[str, Any]) -> str:
    """Indented JSON, each held-back row on one line."""
    rows = {name: t["held_back"].pop("rows") for name, t in result["tables"].items()}
    for name, t in result["tables"].items():
        t["held_back"]["rows"] = f"@rows:{name}@"
    text = json.dumps(result, indent=1)
    for name, table_rows in rows.items():
        lines = ",\n  ".join(json.dumps(r) for r in table_rows)
        text = text.replace(f'"@rows:{name}@"', f"[\n  {lines}\n ]" if table_rows else "[]")
        result["tables"][name]["held_back"]["rows"] = table_rows
    return text + "\n"


def fit_json(fit: ScalingFit) -> list[dict[str, Any]]:
    """Each fitted strategy's slope and counts."""
    return [
        {
            "strategy": s.strategy,
            "per_doubling": _num(s.per_doubling),
            "slope": _num(s.slope),
            "per_node_doubling": None if s.per_node_doubling is None else _num(s.per_node_doubling),
            "node_note": s.node_note,
            "points": s.points,
            "families": s.families,
            "dof": s.dof,
            "residual_sd": _num(s.residual_sd),
            "gpus": list(s.gpus),
            "nodes": list(s.nodes),
        }
        for s in fit.strategies()
    ]


def run_table(name: str) -> dict[str, Any]:
    """Fit and held-back check of one table."""
    points, read = load(name)
    fit = fit_scaling(points, level=LEVEL)
    back = held_back(points, level=LEVEL)
    return {
        "kind": "measured on CPU" if name.startswith("cpu") else "modelled (benchmarks/search_tables.py)",
        "rows": read,
        "points": len(points),
        "strategies": fit_json(fit),
        "unfitted": fit.unfitted(),
        "describe": fit.describe() + back.describe(),
        "held_back": held_back_json(back),
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    tables = {name: run_table(name) for name in NAMES}
    result = {"level": LEVEL, "model": "explorer/plan/_scaling.py", "tables": tables}
    args.out.write_text(dump(result))
    print(f"{'table':28s} {'points':>6s} {'held':>5s} {'mean|err|':>9s} {'max|err|':>9s} {'in band':>8s}")
    for name, t in tables.items():
        s = t["held_back"]["summary"]
        print(
            f"{name:28s} {t['points']:6d} {s['points']:5d} {_pct(s['mean_abs_rel_error']):>9s} "
            f"{_pct(s['max_abs_rel_error']):>9s} {_pct(s['inside_band']):>8s}"
        )
        for line in t["describe"]:
            print(f"    {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
