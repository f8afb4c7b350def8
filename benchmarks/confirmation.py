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

    .venv/bin/python benchmarks/confirmation.py               # writes benchmarks/results/confirmation.json
    .venv/bin/python benchmarks/confirmation.py --summarize   # its summaries again, from its runs
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
CROWNED = 0.05
"""A named best more than this fraction below the table's true best was crowned by noise."""
BUDGETS = ("default", "large")
"""The default confirmation budget (a quarter of the search's GPU-seconds), then a large one."""
LARGE_BUDGET = 1.0
"""The large budget: this many times the search's GPU-seconds."""


def _remeasure(run: Any, study: Any, budget_gpu_s: float) -> dict[str, Any]:
    """Confirm ``study`` again from scratch with ``budget_gpu_s``, through a fresh replay launcher
    of the same noise (its jobs draw the same noise as the first confirmation's, then more)."""
    import tempfile

    from explorer.launch import launcher_for
    from explorer.record import StudyKey, write_study
    from explorer.study._confirm import confirm

    write_study(study, StudyKey.CONFIRMATION, None)
    spec = run.spec.model_copy(update={"confirm_budget_gpu_s": budget_gpu_s})
    with tempfile.TemporaryDirectory() as folder:
        launcher = launcher_for(run, output_dir=Path(folder))
        launcher.start()

        def measure(config: Any, job: int) -> Any:
            from explorer.job import TrialJob

            launcher.submit(TrialJob.for_study(run, config, trial_number=job))
            return next(m for n, m in launcher.wait(timeout_s=1.0) if n == job)

        return confirm(study, spec, measure, lambda _: None) or {}


def run_one(name: str, seed: int, noise: float) -> dict[str, Any]:
    """One optimize run of study ``name`` on its table with ``noise``; what was named best without
    confirmation and with it (the default budget, then :data:`LARGE_BUDGET` times the search's
    GPU-seconds), their true values, and each confirmation's cost."""
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
    table_ = loaded.replay_table
    assert table_ is not None
    ranked = ranking(study)

    def true(number: int) -> float:
        trial = next(t for t in ranked if t.number == number)
        return score(table_, config_of(trial)) or 0.0

    out: dict[str, Any] = {
        "seed": seed,
        "true_best": best_in_table(run, table_)[0],
        "found": max(true(t.number) for t in ranked),
        "without": true(ranked[0].number),
        "study_gpu_s": study_gpu_seconds(study),
    }
    for budget in BUDGETS:
        if budget != "default":
            _remeasure(run, study, LARGE_BUDGET * out["study_gpu_s"])
        verdict = study.user_attrs.get("confirmation") or {}
        out[budget] = {
            "with": true(named_best(study)[0] or ranked[0].number),
            "verdict": verdict.get("verdict"),
            "candidates": len(verdict.get("candidates") or []),
            "rounds": verdict.get("rounds", 0),
            "confirm_gpu_s": verdict.get("gpu_seconds", 0.0),
        }
    return out


def summarize(runs: list[dict[str, Any]], budget: str) -> dict[str, Any]:
    """Over ``runs``: how often the named best is within :data:`WITHIN` of the table's true best
    without and with confirmation (``budget``), its true value over the true best (mean, worst),
    and the confirmation's GPU-seconds."""
    without = [r["without"] / r["true_best"] for r in runs]
    with_ = [r[budget]["with"] / r["true_best"] for r in runs]
    extra = [r[budget]["confirm_gpu_s"] for r in runs]
    return {
        "runs": len(runs),
        "hit_without": sum(x >= 1 - WITHIN for x in without) / len(runs),
        "hit_with": sum(x >= 1 - WITHIN for x in with_) / len(runs),
        "crowned_without": sum(x < 1 - CROWNED for x in without) / len(runs),
        "crowned_with": sum(x < 1 - CROWNED for x in with_) / len(runs),
        "mean_without": statistics.fmean(without),
        "mean_with": statistics.fmean(with_),
        "worst_without": min(without),
        "worst_with": min(with_),
        "search_found": sum(r["found"] >= (1 - WITHIN) * r["true_best"] for r in runs) / len(runs),
        "confirm_gpu_s_mean": statistics.fmean(extra),
        "confirm_gpu_s_max": max(extra),
        "confirm_share": sum(extra) / sum(r["study_gpu_s"] for r in runs),
        "tied": sum(r[budget]["verdict"] == "tied" for r in runs),
    }


def main() -> int:
    import argparse

    import optuna

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--summarize", action="store_true", help="recompute the summaries of the recorded runs"
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out: dict[str, Any] = {
        "noise": NOISE,
        "n_trials": N_TRIALS,
        "within": WITHIN,
        "crowned": CROWNED,
        "large_budget": LARGE_BUDGET,
        "studies": {},
    }
    recorded = json.loads(OUT.read_text())["studies"] if args.summarize else {}
    for name in STUDIES:
        if args.summarize:
            noisy, clean = recorded[name]["noisy"]["runs"], recorded[name]["noise_free"]["runs"]
        else:
            noisy = [run_one(name, seed, NOISE) for seed in SEEDS]
            clean = [run_one(name, seed, 0.0) for seed in NOISE_FREE_SEEDS]
        parts = {
            "noisy": {"summary": {b: summarize(noisy, b) for b in BUDGETS}, "runs": noisy},
            "noise_free": {"summary": {"default": summarize(clean, "default")}, "runs": clean},
        }
        out["studies"][name] = parts
        for kind, part in parts.items():
            for budget, s in part["summary"].items():
                print(
                    f"{name} {kind} {budget}: within {100 * WITHIN:g}% of the true best "
                    f"{100 * s['hit_without']:.0f}% -> {100 * s['hit_with']:.0f}% of {s['runs']} runs; "
                    f"mean {s['mean_without']:.3f} -> {s['mean_with']:.3f}, worst {s['worst_without']:.3f} -> "
                    f"{s['worst_with']:.3f}; +{s['confirm_gpu_s_mean']:.0f} GPU-s a run "
                    f"({100 * s['confirm_share']:.1f}% of the search)"
                )
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
