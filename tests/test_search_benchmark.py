"""``explorer benchmark-search``: the figures of recorded runs, and the real command on a small table."""

from __future__ import annotations

import csv
import json
import math
import subprocess
from pathlib import Path

import pytest

from explorer.search_benchmark import VARIANTS, SearchRun, benchmark_search, summarize_runs, to_json
from tests.builders import run_cli

REPO = Path(__file__).resolve().parents[1]


def _search(study: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real ``explorer benchmark-search`` command."""
    return run_cli("benchmark-search", str(study), *args)


def test_figures_of_hand_made_runs():
    runs = [
        SearchRun(variant="v", seed=0, values=[None, 50.0, 99.0], inferred=1, reused=0),  # 98 reached at 3
        SearchRun(variant="v", seed=1, values=[100.0, None, None], inferred=0, reused=0),  # at 1
        SearchRun(variant="v", seed=2, values=[10.0, 20.0, 30.0], inferred=0, reused=2),  # never
    ]
    s = summarize_runs(runs, best=100.0, within=2, after=2)
    assert s["trials_to_98pct"] == [3, 1, None]
    assert s["median_trials_to_98pct"] == 3 and math.isinf(s["p90_trials_to_98pct"])
    assert s["share_reached_within_2"] == pytest.approx(1 / 3)
    assert s["mean_best_after_2_over_best"] == pytest.approx((0.5 + 1.0 + 0.2) / 3)
    assert s["share_infeasible_trials"] == pytest.approx(3 / 9)
    assert s["inferred_per_run"] == pytest.approx(1 / 3)


SMALL_SPACE = {
    "search_space": {
        "parameters": {
            "batch_size": {"values": [4, 8, 16, 32, 64, 128]},
            "number_gpus": {"values": [1, 2]},
            "distributed_backend": {"choices": ["DDP"]},
            "gradient_checkpointing": {"choices": [False, True]},
        }
    }
}
"""The space of :func:`_table`'s rows."""


def _table(path: Path) -> tuple[Path, float]:
    rows, best = [], 0.0
    for bs in (4, 8, 16, 32, 64, 128):
        for ckpt in (False, True):
            for gpus in (1, 2):
                fits = bs // gpus <= (32 if ckpt else 16)
                value = (100 + bs) * (0.8 if ckpt else 1.0) / gpus if fits else 0.0
                best = max(best, value)
                rows.append(
                    dict(
                        model_name="tiny-llama",
                        number_gpus=gpus,
                        distributed_backend="DDP" if gpus > 1 else "NONE",
                        batch_size=bs,
                        gradient_checkpointing=ckpt,
                        dataset_tokens_per_second_per_gpu=value,
                        is_valid=int(fits),
                    )
                )
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path, best


def test_the_command_replays_each_variant(write_study, tmp_path):
    table, best = _table(tmp_path / "t.csv")
    study = write_study(SMALL_SPACE)
    out = tmp_path / "out.json"
    done = _search(study, "--table", str(table), "--repeats", "2", "--n-trials", "8", "--json", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["best"] == best and result["configurations_in_table"] == 24
    assert tuple(result["variants"]) == VARIANTS  # every variant, by default
    assert set(VARIANTS) >= {"default", "no-priors", "cover-start", "tpe-every-3", "random", "optuna"}
    for figures in result["variants"].values():
        assert figures["runs"] == 2 and len(figures["trials_to_98pct"]) == 2
        assert all(n is None or 1 <= n <= 8 for n in figures["trials_to_98pct"])
    assert result["variants"]["random"]["inferred_per_run"] == 0
    assert result["variants"]["no-inference"]["inferred_per_run"] == 0
    assert "default" in done.stdout and "median" in done.stdout


def test_bad_arguments_are_one_line(write_study, tmp_path):
    study = write_study({})
    done = _search(study, "--table", str(tmp_path / "no.csv"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--table" in done.stderr
    table, _ = _table(tmp_path / "t.csv")
    done = _search(study, "--table", str(table), "--variants", "x")
    assert done.returncode == 2 and "--variants" in done.stderr and "Traceback" not in done.stderr


def test_merge_pools_other_seeds_and_joins_other_variants(write_study, tmp_path):
    """Runs of other seeds pool; a variant run apart (GPSampler, in processes of its own) joins;
    every figure is the one of the pooled runs."""
    from explorer.search_benchmark import merge, runs_of
    from explorer.study_file import load_study

    table, best = _table(tmp_path / "t.csv")
    study = write_study(SMALL_SPACE)
    loaded = load_study(study, replay_table=table)
    kw = {"repeats": 2, "n_trials": 6, "sequences": True}
    first = json.loads(to_json(benchmark_search(loaded, variants=("default", "random"), **kw)))
    second = json.loads(to_json(benchmark_search(loaded, variants=("default",), first_seed=2, **kw)))
    apart = json.loads(to_json(benchmark_search(loaded, variants=("optuna",), **kw)))
    merged = merge(merge(first, second), apart)
    assert list(merged["variants"]) == ["default", "random", "optuna"]
    assert merged["seeds"] == [0, 3]
    seeds = {v: sorted(s["seed"] for s in f["sequences"]) for v, f in merged["variants"].items()}
    assert seeds == {"default": [0, 1, 2, 3], "random": [0, 1], "optuna": [0, 1]}
    pooled = summarize_runs(runs_of("default", merged["variants"]["default"]["sequences"]), best=best)
    assert merged["variants"]["default"]["trials_to_98pct"] == pooled["trials_to_98pct"]
