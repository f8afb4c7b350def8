"""GPU-slot utilization of a 100-trial replay study on an 8-GPU pool, trials of 1, 2, 4 and 8 GPUs.

Runs ``benchmarks/search_studies/gpu-pool-granite-3.1-2b.yaml`` (the modelled granite-3.1-2b table
of an 8 x H100 node, replayed on the launcher's virtual clock with simulated durations: 300 s a
measured trial, 60 s an OOM, each +-25%; 8 trials at most in flight) once per schedule and seed,
each in its own sqlite file, and reads every figure back from the stored trials' ``slot``
attributes (:func:`explorer.study.study_utilization`). Schedules:

* ``packing``: the study file as it is (lookahead 4, a waiting trial passed over 8 times is
  reserved for);
* ``packing-lookahead-8``: the same with 8 asked trials waiting at most;
* ``in-order``: lookahead 1, the loop before packing: one asked trial waits until it fits.

* ``random``: the packing schedule with a random sampler (trials of every size, evenly).

The study file's sampler is explorer's default (TPE with local search, seeds 0..S-1), with
``when_converged: explore`` so that it reaches its 100 counted trials. The JSON holds every run's
slots (trial, GPUs, start, end), from which ``tests/test_benchmark_results.py`` recomputes the
figures.

    .venv/bin/python benchmarks/gpu_pool_utilization.py [--seeds 5] [--out DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorer.spec import LoadedStudy, SamplerSpec
from explorer.study import open_study, optimize, slots_of, study_utilization
from explorer.study_file import load_study

if TYPE_CHECKING:
    import optuna

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "benchmarks" / "search_studies" / "gpu-pool-granite-3.1-2b.yaml"
RESULT = ROOT / "benchmarks" / "results" / "gpu_pool_utilization.json"
TARGET = 0.90

SCHEDULES: dict[str, dict[str, Any]] = {
    "packing": {},
    "packing-lookahead-8": {"lookahead": 8},
    "in-order": {"lookahead": 1},
    "random": {"sampler": "random"},
}
"""Each schedule's changes to the study file."""


def variant(loaded: LoadedStudy, schedule: str, seed: int, storage_url: str) -> LoadedStudy:
    """The study file with ``schedule``'s changes, sampler seed ``seed``, stored at ``storage_url``."""
    update = dict(SCHEDULES[schedule])
    kind = update.pop("sampler", loaded.spec.sampler.kind)
    update["sampler"] = SamplerSpec(kind=kind, seed=seed)
    return dataclasses.replace(loaded, spec=loaded.spec.model_copy(update=update), storage_url=storage_url)


def run_one(
    loaded: LoadedStudy,
    schedule: str,
    seed: int,
    storage_url: str,
    *,
    storage: optuna.storages.BaseStorage | None = None,
) -> dict[str, Any]:
    """Run one study to its end and read its figures back from storage.

    Args:
        storage: instead of ``storage_url`` (the test reruns a study in memory).
    """
    study_file = variant(loaded, schedule, seed, storage_url)
    result = optimize(study_file, printer=lambda _: None, storage=storage, write_ahead=False)
    stored = open_study(study_file, create=False, storage=storage)
    trials = stored.get_trials(deepcopy=False)
    used = study_utilization(stored)
    assert used is not None and used.fraction is not None
    by_number = {t.number: t for t in trials}
    slots = sorted(
        ((t.number, s) for t in trials for s in slots_of([t])), key=lambda pair: (pair[1].start, pair[0])
    )
    sizes: dict[str, int] = {}
    for _, s in slots:
        sizes[str(s.gpus)] = sizes.get(str(s.gpus), 0) + 1
    return {
        "schedule": schedule,
        "seed": seed,
        "sampler": study_file.spec.sampler.kind,
        "lookahead": study_file.spec.lookahead,
        "max_passed_over": study_file.spec.max_passed_over,
        "counted": result.counted,
        "statuses": dict(sorted(result.statuses.items())),
        "utilization": used.fraction,
        "busy_gpu_seconds": used.busy_gpu_seconds,
        "capacity_gpu_seconds": used.capacity_gpu_seconds,
        "makespan_s": used.makespan_s,
        "pool": used.pool,
        "trial_gpu_sizes": dict(sorted(sizes.items(), key=lambda kv: int(kv[0]))),
        "slots": [
            {
                "trial": n,
                "status": by_number[n].user_attrs.get("status"),
                "gpus": s.gpus,
                "start": s.start,
                "end": s.end,
            }
            for n, s in slots
        ],
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per schedule: utilization per seed, mean and least; makespan and trials with a slot."""
    out: dict[str, dict[str, Any]] = {}
    for schedule in SCHEDULES:
        mine = [r for r in runs if r["schedule"] == schedule]
        if not mine:
            continue
        values = [r["utilization"] for r in mine]
        out[schedule] = {
            "seeds": [r["seed"] for r in mine],
            "utilization": values,
            "mean_utilization": statistics.mean(values),
            "min_utilization": min(values),
            "makespan_s": [r["makespan_s"] for r in mine],
            "trials_on_gpus": [len(r["slots"]) for r in mine],
            "counted": [r["counted"] for r in mine],
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5, help="sampler seeds 0..S-1 per schedule")
    parser.add_argument("--out", help="folder for the sqlite files (default: a temporary folder)")
    parser.add_argument("--json", default=str(RESULT))
    args = parser.parse_args()
    loaded = load_study(STUDY)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        out.mkdir(parents=True, exist_ok=True)
        for schedule in SCHEDULES:
            for seed in range(args.seeds):
                db = out / f"{schedule}-seed{seed}.db"
                db.unlink(missing_ok=True)
                run = run_one(loaded, schedule, seed, f"sqlite:///{db}")
                runs.append(run)
                print(
                    f"{schedule:<20} seed {seed}: {100 * run['utilization']:.1f}% over "
                    f"{run['makespan_s']:.0f} s, {len(run['slots'])} trials on GPUs "
                    f"({run['counted']} counted), sizes {run['trial_gpu_sizes']}",
                    flush=True,
                )
    summary = summarize(runs)
    print()
    for schedule, s in summary.items():
        print(
            f"{schedule:<20} mean {100 * s['mean_utilization']:.1f}%  least {100 * s['min_utilization']:.1f}%"
            f"  median makespan {statistics.median(s['makespan_s']):.0f} s"
        )
    headline = runs[0]
    print(
        f"\nheadline (packing, seed 0): {100 * headline['utilization']:.1f}% "
        f"(target {100 * TARGET:.0f}%), makespan {headline['makespan_s']:.0f} s, "
        f"trial sizes {headline['trial_gpu_sizes']}"
    )
    spec = loaded.spec
    result = {
        "study": str(STUDY.relative_to(ROOT)),
        "table": spec.launcher.table,
        "pool_gpus": spec.resources.total_gpus,
        "n_trials": spec.n_trials,
        "parallel_trials": spec.parallel_trials,
        "durations": spec.launcher.durations.model_dump() if spec.launcher.durations else None,
        "target": TARGET,
        "headline": {k: v for k, v in headline.items() if k != "slots"},
        "summary": summary,
        "runs": runs,
    }
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
