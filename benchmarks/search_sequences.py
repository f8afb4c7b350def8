"""Record the trial sequences `explorer benchmark-search` walks on the project's own tables.

For each table study, variant and seed: every trial of the run in order, as its configuration key
and status (measured, reused, inferred, invalid, OOM). A refactoring of the space, the search or
the optimize loop must leave these unchanged: ``tests/test_search_sequences.py`` recomputes a
part of them and compares.

    .venv/bin/python benchmarks/search_sequences.py            # writes the JSON below
    .venv/bin/python benchmarks/search_sequences.py --check    # compares, exit 1 on a difference
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from explorer.search_benchmark import VARIANTS, trial_sequence  # noqa: E402
from explorer.study_file import load_study  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "search_sequences.json"
STUDIES = {
    "granite-3.1-2b": ("benchmarks/search_studies/granite-3.1-2b.yaml", "model-granite-3.1-2b.csv"),
    "granite-3.1-2b-wide": (
        "benchmarks/search_studies/granite-3.1-2b-wide.yaml",
        "model-granite-3.1-2b-wide.csv",
    ),
    "llama-3.1-8b": ("benchmarks/search_studies/llama-3.1-8b.yaml", "model-llama-3.1-8b.csv"),
    "cpu-quickstart": ("studies/quickstart.yaml", "cpu-quickstart.csv"),
}
RECORDED = tuple(v for v in VARIANTS if v != "gp")
"""The strategies recorded (:data:`explorer.search_benchmark.VARIANTS` but Optuna's GPSampler):
explorer's own searches and Optuna's TPE and random samplers. Re-recorded when issue 23 made the
joint models the default: ``walk`` walks what ``default`` walked before. A strategy added later is
not recorded until it is named here and the file written again."""
SEEDS = (0, 1, 2)
N_TRIALS = 20


def record(names: list[str]) -> dict[str, dict[str, list[list[str]]]]:
    """``{study: {"variant/seed": [[key, status], ...]}}`` for the given studies."""
    out: dict[str, dict[str, list[list[str]]]] = {}
    for name in names:
        study, table = STUDIES[name]
        loaded = load_study(ROOT / study, replay_table=ROOT / "benchmarks/results/tables" / table)
        out[name] = {
            f"{variant}/{seed}": [list(t) for t in trial_sequence(loaded, variant, seed, n_trials=N_TRIALS)]
            for variant in RECORDED
            for seed in SEEDS
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the recorded file")
    args = parser.parse_args()
    now = record(list(STUDIES))
    if args.check:
        recorded = json.loads(OUT.read_text())["sequences"]
        differ = [f"{s}:{r}" for s in now for r in now[s] if now[s][r] != recorded.get(s, {}).get(r)]
        print("same" if not differ else f"different: {differ}")
        return 1 if differ else 0
    OUT.write_text(json.dumps({"n_trials": N_TRIALS, "sequences": now}, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
