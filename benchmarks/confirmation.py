"""Does confirming the best pick the truly best configuration more often on a noisy machine, and at what cost?

Each table study is replayed with 10% log-normal noise on every measurement (``launcher.noise:
0.1``, seeded anew per seed, sampler seeded the same): one optimize run per seed, whose search is
the same with or without confirmation (confirmation comes after ``n_trials``). For each run:

* without confirmation: the trial with the highest measured value is named best;
* with confirmation: the trial the verdict names (confirmed, or the most robust of a tie);

each scored by its configuration's true (noise-free) value in the table: a hit when within 2% of
the table's true best, and (``found``) of the truly best configuration the search measured. The
confirmation's GPU-seconds are the extra cost. The same studies replayed without noise give the
cost of confirmation where measurements repeat exactly.

    .venv/bin/python benchmarks/confirmation.py           # writes benchmarks/results/confirmation.json
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from explorer.study_file import load_study  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "confirmation.json"
TABLES = ROOT / "benchmarks" / "results" / "tables"
STUDIES = {
    "cpu-quickstart": ("studies/quickstart.yaml", "cpu-quickstart.csv"),
    "llama-8b-h100x4-lora-long": (
        "benchmarks/search_studies/knobs/llama-8b-h100x4-lora-long.yaml",
        "knobs-llama-8b-h100x4-lora-long.csv.gz",
    ),
}
NOISE = 0.1
SEEDS = range(20)
NOISE_FREE_SEEDS = range(5)
N_TRIALS = 20
WITHIN = 0.02
"""A named best within this fraction of the table's true best is a hit."""


def run_one(name: str, seed: int, noise: float) -> dict[str, Any]:
    """One optimize run of study ``name`` on its table with ``noise``; what was named best with
    and without confirmation, their true values, and the confirmation's cost."""
    import optuna

    from explorer.search_benchmark import best_in_table, score
    from explorer.spec import SamplerSpec
    from explorer.study import config_of, named_best, open_study, optimize
    from explorer.study._confirm import ranking, study_gpu_seconds

    study_file, table = STUDIES[name]
    loaded = load_study(ROOT / study_file, replay_table=TABLES / table)
    spec = loaded.spec
    launcher = spec.launcher.model_copy(update={"noise": noise, "noise_seed": seed})
    update = {
        "n_trials": N_TRIALS,
        "launcher": launcher,
        "sampler": SamplerSpec(seed=seed, strategy="default"),
    }
    run = dataclasses.replace(loaded, spec=spec.model_copy(update=update))
    storage = optuna.storages.InMemoryStorage()
    optimize(run, printer=lambda _: None, storage=storage, write_ahead=False)
    study = open_study(run, create=False, storage=storage)
    assert loaded.replay_table is not None
    true_best = best_in_table(run, loaded.replay_table)[0]
    ranked = ranking(study)

    def true(trial: optuna.trial.FrozenTrial) -> float:
        return score(loaded.replay_table, config_of(trial)) or 0.0  # type: ignore[arg-type]

    chosen, _ = named_best(study)
    confirmed = next(t for t in ranked if t.number == chosen)
    verdict = study.user_attrs.get("confirmation") or {}
    return {
        "seed": seed,
        "true_best": true_best,
        "found": max(true(t) for t in ranked),
        "without": true(ranked[0]),
        "with": true(confirmed),
        "verdict": verdict.get("verdict"),
        "candidates": len(verdict.get("candidates") or []),
        "rounds": verdict.get("rounds", 0),
        "confirm_gpu_s": verdict.get("gpu_seconds", 0.0),
        "study_gpu_s": study_gpu_seconds(study),
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Hit rates with and without confirmation, and the cost, over ``runs``."""

    def rate(key: str, of: str) -> float:
        return sum(r[key] >= (1 - WITHIN) * r[of] for r in runs) / len(runs)

    extra = [r["confirm_gpu_s"] for r in runs]
    return {
        "runs": len(runs),
        "hit_without": rate("without", "true_best"),
        "hit_with": rate("with", "true_best"),
        "found_without": rate("without", "found"),
        "found_with": rate("with", "found"),
        "search_found": rate("found", "true_best"),
        "confirm_gpu_s_mean": statistics.fmean(extra),
        "confirm_gpu_s_max": max(extra),
        "confirm_share": sum(extra) / sum(r["study_gpu_s"] for r in runs),
        "tied": sum(r["verdict"] == "tied" for r in runs),
    }


def main() -> int:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out: dict[str, Any] = {"noise": NOISE, "n_trials": N_TRIALS, "within": WITHIN, "studies": {}}
    for name in STUDIES:
        noisy = [run_one(name, seed, NOISE) for seed in SEEDS]
        clean = [run_one(name, seed, 0.0) for seed in NOISE_FREE_SEEDS]
        out["studies"][name] = {
            "noisy": {"summary": summarize(noisy), "runs": noisy},
            "noise_free": {"summary": summarize(clean), "runs": clean},
        }
        s, c = out["studies"][name]["noisy"]["summary"], out["studies"][name]["noise_free"]["summary"]
        print(
            f"{name}: within {100 * WITHIN:g}% of the true best {100 * s['hit_without']:.0f}% -> "
            f"{100 * s['hit_with']:.0f}% of {s['runs']} runs; +{s['confirm_gpu_s_mean']:.0f} GPU-s a run "
            f"({100 * s['confirm_share']:.1f}% of the search); noise-free: {c['confirm_gpu_s_mean']:.1f} GPU-s"
        )
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
