"""A memory prior learned from a study's own measurements (issue 4, optional; not used by the
search: ordering local search's neighbours by it made no measured difference), and its error on
the measured CPU table.

The model: per-device peak memory of a configuration not yet run, from the peaks of those that ran: per-device peak memory of a
configuration not yet run, from the peaks of those that ran.

    peak (GiB) ~ k + p * params_share + r * rest_share + a * tokens (checkpointing off)
                   + c * tokens (checkpointing on)

``params_share`` is the share of the parameters a device holds (1, or 1/N when FSDP FULL_SHARD
shards them over N GPUs); ``rest_share`` that of gradients and optimizer state (1, or 1/N under
FULL_SHARD and SHARD_GRAD_OP); ``tokens`` is the per-device batch times the sequence length.
These are what each strategy shards, not any model's byte counts: the coefficients are
non-negative least squares on the measured peaks of the feasible trials.

A configuration predicted below the largest measured peak is taken to fit; one predicted at or
above the smallest prediction for a configuration that ran out of memory is taken not to; between
the two, it is unknown.

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
import dataclasses
import json
import math
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from explorer.trial_config import TrialConfig

MIN_POINTS = 5
"""Fewest measured peaks to fit the five coefficients."""


def _features(c: TrialConfig) -> list[float]:
    n = c.number_gpus
    strategy = c.fsdp_sharding_strategy if c.distributed_backend == "FSDP" else None
    params = 1.0 / n if strategy == "FULL_SHARD" else 1.0
    rest = 1.0 / n if strategy in ("FULL_SHARD", "SHARD_GRAD_OP") else 1.0
    tokens = c.per_device_batch_size * c.model_max_length / 1e3
    return [
        1.0,
        params,
        rest,
        0.0 if c.gradient_checkpointing else tokens,
        tokens if c.gradient_checkpointing else 0.0,
    ]


@dataclass(frozen=True, kw_only=True)
class MemoryModel:
    """Per-device peak memory, fitted to measured peaks (see the module docstring)."""

    coefficients: tuple[float, ...]
    fits_below: float
    """The largest measured peak: a prediction below it is taken to fit."""
    ooms_above: float
    """The smallest prediction for a configuration that ran out of memory (``inf``: none)."""

    @classmethod
    def fit(
        cls, peaks: Sequence[tuple[TrialConfig, float]], ooms: Sequence[TrialConfig]
    ) -> MemoryModel | None:
        """The model of these measurements; ``None`` with fewer than :data:`MIN_POINTS` peaks."""
        points = [(c, p) for c, p in peaks if math.isfinite(p) and p > 0]
        if len(points) < MIN_POINTS:
            return None
        import numpy as np
        from scipy.optimize import nnls

        x = np.array([_features(c) for c, _ in points])
        y = np.array([p for _, p in points])
        coef, _ = nnls(x, y)
        model = cls(
            coefficients=tuple(float(v) for v in coef), fits_below=float(y.max()), ooms_above=math.inf
        )
        above = min((model.predict(c) for c in ooms), default=math.inf)
        return cls(coefficients=model.coefficients, fits_below=model.fits_below, ooms_above=above)

    def predict(self, c: TrialConfig) -> float:
        """Predicted per-device peak memory of ``c``, in the unit of the measured peaks."""
        return sum(w * f for w, f in zip(self.coefficients, _features(c), strict=True))

    def fits(self, c: TrialConfig) -> bool | None:
        """``True``: predicted to fit; ``False``: predicted to run out of memory; ``None``: unknown."""
        m = self.predict(c)
        if m <= self.fits_below:
            return True
        if m >= self.ooms_above:
            return False
        return None


def _table_rows(path: Path) -> list[tuple[TrialConfig, bool, float | None]]:
    from explorer.launch._replay import PARAMETERS, _normalise, _parse

    names = {f.name for f in dataclasses.fields(TrialConfig)}
    out = []
    with path.open(newline="") as fh:
        for r in csv.DictReader(fh):
            p = _normalise({c: _parse(c, r[c] or "") for c in r if c in PARAMETERS})
            p = {k: v for k, v in p.items() if k in names and v is not None}
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
