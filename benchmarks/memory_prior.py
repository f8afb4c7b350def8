"""The memory prior's error on the measured CPU table (issue 4).

The model (:mod:`explorer.search._memory_model`) predicts the per-device peak memory of a
configuration not yet run from the peaks of those that ran, by non-negative least squares on
what each strategy shards (parameters; gradients and optimizer state) and the tokens a device
holds with and without checkpointing. Local search orders the neighbours it predicts to run out
of memory last.

The benchmark: on ``tables/cpu-quickstart.csv`` (every configuration measured on this CPU), fit on
K feasible configurations and K/4 OOMs drawn at random (20 draws each for K = 10, 20, 40), then
predict every other one: the relative error of the predicted peaks of feasible configurations,
the share of feasible ones predicted to run out of memory (what a skip would have cost), and the
share of OOMs predicted as such. (On the modelled tables of ``search_tables.py`` the error is 0:
their memory is linear in these same features.)

    .venv/bin/python benchmarks/memory_prior.py     # writes results/memory_prior.json
"""

from __future__ import annotations

import csv
import json
import random
import statistics
import sys
from pathlib import Path

from explorer.search._memory_model import MemoryModel
from explorer.trial_config import TrialConfig


def _table_rows(path: Path) -> list[tuple[TrialConfig, bool, float | None]]:
    from explorer.launch._replay import _normalise, _parse, parameters

    out = []
    with path.open(newline="") as fh:
        for r in csv.DictReader(fh):
            p = _normalise(
                {c: _parse(c, r[c] or "") for c in r if c in parameters() and c != "gpu_model"}
            )  # one model
            p = {k: v for k, v in p.items() if v is not None}
            ok = r["is_valid"] in ("1", "True", "1.0")
            peak = float(r["peak_memory_gib"]) if ok and r.get("peak_memory_gib") else None
            out.append((TrialConfig(**p), ok, peak))
    return out


def evaluate(path: Path, *, sizes: tuple[int, ...] = (10, 20, 40), draws: int = 20) -> dict:
    rows = _table_rows(path)
    ok = [(c, m) for c, v, m in rows if v and m]
    ooms = [c for c, v, _ in rows if not v]
    out: dict = {"table": path.name, "feasible": len(ok), "ooms": len(ooms), "by_size": {}}
    for k in sizes:
        errors: list[float] = []
        fit_verdicts: list[bool | None] = []
        oom_verdicts: list[bool | None] = []
        for seed in range(draws):
            rng = random.Random(seed)
            train = rng.sample(ok, k)
            train_ooms = rng.sample(ooms, max(1, k // 4))
            model = MemoryModel.fit(train, train_ooms)
            assert model is not None
            test = [x for x in ok if x not in train]
            errors += [abs(model.predict(c) - p) / p for c, p in test]
            fit_verdicts += [model.fits(c) for c, _ in test]
            oom_verdicts += [model.fits(c) for c in ooms if c not in train_ooms]
        errors.sort()
        out["by_size"][k] = {
            "median_relative_error": statistics.median(errors),
            "p90_relative_error": errors[int(0.9 * len(errors))],
            "feasible_predicted_oom": sum(v is False for v in fit_verdicts) / len(fit_verdicts),
            "oom_predicted_oom": sum(v is False for v in oom_verdicts) / len(oom_verdicts),
            "oom_predicted_fit": sum(v is True for v in oom_verdicts) / len(oom_verdicts),
        }
    return out


def main() -> int:
    root = Path(__file__).resolve().parents[1]
    result = evaluate(root / "benchmarks" / "results" / "tables" / "cpu-quickstart.csv")
    (root / "benchmarks" / "results" / "memory_prior.json").write_text(json.dumps(result, indent=2))
    for k, v in result["by_size"].items():
        print(
            f"fit on {k}: median error {v['median_relative_error']:.1%}, p90 {v['p90_relative_error']:.1%}; "
            f"feasible predicted OOM {v['feasible_predicted_oom']:.1%}; OOMs predicted OOM "
            f"{v['oom_predicted_oom']:.1%}, predicted to fit {v['oom_predicted_fit']:.1%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
