"""The optimize loop's own cost per trial (ask, tell, storage, inference, local search), on a
replayed table through a sqlite file, so that what is left is explorer and Optuna.

The study is ``benchmarks/search_studies/granite-3.1-2b-wide.yaml``: 500 counted trials over the
762 configurations of ``tables/model-granite-3.1-2b-wide.csv`` (``when_converged: explore``, so
that TPE's repeats do not stop it early). The launcher's own time (table lookups) is measured
around its calls and taken out. Issue 4's target: 50 ms a trial. Keep the machine otherwise idle.

    .venv/bin/python benchmarks/optuna_overhead.py [--n-trials 500] [--storage URL] [--out JSON]

The JSON holds the raw figures (wall and launcher seconds, trials by status, each trial's start
and end); ``tests/test_benchmark_results.py`` recomputes the per-trial figures from them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

from explorer.launch import launcher_for
from explorer.study import open_study, optimize
from explorer.study_file import load_study

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "optuna_overhead.json"


class TimedLauncher:
    """The study's real launcher, with the seconds spent inside its calls added up."""

    def __init__(self, inner) -> None:  # noqa: ANN001 - any Launcher
        self.inner = inner
        self.seconds = 0.0

    def __getattr__(self, name: str):  # noqa: ANN204
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            started = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        return timed


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-trials", type=int, default=500)
    parser.add_argument("--storage", help="default: a sqlite file in a temporary folder")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    loaded = load_study(
        ROOT / "benchmarks" / "search_studies" / "granite-3.1-2b-wide.yaml",
        replay_table=ROOT / "benchmarks" / "results" / "tables" / "model-granite-3.1-2b-wide.csv",
    )
    with tempfile.TemporaryDirectory() as tmp:
        url = args.storage or f"sqlite:///{tmp}/overhead.db"
        spec = loaded.spec.model_copy(update={"n_trials": args.n_trials})
        run = dataclasses.replace(loaded, spec=spec, storage_url=url, output_dir=Path(tmp))
        launcher = TimedLauncher(launcher_for(run, output_dir=Path(tmp)))
        started = time.perf_counter()
        result = optimize(run, printer=lambda _: None, launcher=launcher)  # type: ignore[arg-type]
        wall = time.perf_counter() - started
        trials = open_study(run, create=False).get_trials(deepcopy=False)
        raw = {
            "storage": "sqlite" if url.startswith("sqlite") else url.split(":", 1)[0],
            "n_trials": args.n_trials,
            "counted": result.counted,
            "statuses": result.statuses,
            "wall_seconds": wall,
            "launcher_seconds": launcher.seconds,
            "trials": [
                [t.number, t.datetime_start.timestamp(), t.datetime_complete.timestamp()]
                for t in trials
                if t.datetime_start is not None and t.datetime_complete is not None
            ],
        }
    raw.update(summarize(raw))
    args.out.write_text(json.dumps(raw, indent=1))
    print(
        f"{raw['optuna_trials']} Optuna trials ({result.statuses}), {result.counted} counted, in "
        f"{wall:.1f} s ({launcher.seconds:.2f} s in the launcher): {raw['ms_per_counted_trial']:.1f} ms a "
        f"counted trial, {raw['ms_per_optuna_trial']:.1f} ms an Optuna trial"
    )
    return 0


def summarize(raw: dict) -> dict:
    """The per-trial figures, from the raw ones."""
    own = raw["wall_seconds"] - raw["launcher_seconds"]
    n = len(raw["trials"])
    return {
        "optuna_trials": n,
        "ms_per_counted_trial": 1000 * own / raw["counted"],
        "ms_per_optuna_trial": 1000 * own / n,
    }


if __name__ == "__main__":
    sys.exit(main())
