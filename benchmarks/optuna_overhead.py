"""The optimize loop's own cost per trial (ask, tell, storage, inference), on a replayed table.

Replays ``benchmarks/results/tables/model-granite-3.1-2b.csv`` through a sqlite file, so that the
launcher costs nothing and what is left is explorer and Optuna. Issue 4's target: 50 ms a trial.

    .venv/bin/python benchmarks/optuna_overhead.py [N_TRIALS] [--storage URL]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

from explorer.spec import load_study
from explorer.study import optimize

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("n_trials", type=int, nargs="?", default=150)
    parser.add_argument("--storage", help="default: a sqlite file in a temporary folder")
    args = parser.parse_args()
    loaded = load_study(
        ROOT / "benchmarks" / "search_studies" / "granite-3.1-2b.yaml",
        replay_table=ROOT / "benchmarks" / "results" / "tables" / "model-granite-3.1-2b.csv",
    )
    with tempfile.TemporaryDirectory() as tmp:
        url = args.storage or f"sqlite:///{tmp}/overhead.db"
        spec = loaded.spec.model_copy(update={"n_trials": args.n_trials})
        run = dataclasses.replace(loaded, spec=spec, storage_url=url)
        started = time.perf_counter()
        result = optimize(run, printer=lambda _: None)
        wall = time.perf_counter() - started
    trials = sum(result.statuses.values())
    print(f"{trials} trials ({result.statuses}) in {wall:.1f} s: {1000 * wall / trials:.1f} ms a trial")
    return 0


if __name__ == "__main__":
    sys.exit(main())
