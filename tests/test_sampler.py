"""Sampler choice, and grid search as enqueued configurations (respecting the conditional space)."""

from __future__ import annotations

import optuna
import pytest

from explorer.search._sampler import make_sampler
from explorer.spec import SamplerSpec
from explorer.study import open_study
from explorer.study._open import enqueue_grid
from explorer.study_file import load_study
from explorer.validity import invalid_reason


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        ("tpe", optuna.samplers.TPESampler),
        ("gp", optuna.samplers.GPSampler),
        ("random", optuna.samplers.RandomSampler),
        ("grid", optuna.samplers.RandomSampler),
    ],
)
def test_make_sampler(kind, cls):
    assert isinstance(make_sampler(SamplerSpec(kind=kind, seed=1)), cls)


def test_grid_enqueues_every_valid_configuration_once(write_study, tmp_path):
    loaded = load_study(write_study({"storage": f"sqlite:///{tmp_path}/g.db", "sampler": {"kind": "grid"}}))
    study = open_study(loaded, create=True)
    valid = [c for c in loaded.space.enumerate() if invalid_reason(c, loaded.spec.resources) is None]
    assert enqueue_grid(study, loaded) == len(valid) == 24
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    seen = set()
    for _ in waiting:
        trial = study.ask()
        seen.add(loaded.space.suggest(trial))
        study.tell(trial, 0.0)
    assert seen == set(valid)


@pytest.mark.parametrize("kind", ["tpe", "gp"])
def test_each_model_sampler_runs_past_its_start_up_trials(kind):
    """The model kicks in after the start-up trials (GP needs scipy: it once was missing)."""
    import dataclasses
    from pathlib import Path

    from explorer.study import optimize

    root = Path(__file__).resolve().parents[1]
    loaded = load_study(
        root / "benchmarks" / "search_studies" / "granite-3.1-2b.yaml",
        replay_table=root / "benchmarks" / "results" / "tables" / "model-granite-3.1-2b.csv",
    )
    spec = loaded.spec.model_copy(
        update={
            "n_trials": 10,
            "sampler": SamplerSpec(kind=kind, seed=0, n_startup_trials=3, local_search=False),
        }
    )
    storage = optuna.storages.InMemoryStorage()
    result = optimize(dataclasses.replace(loaded, spec=spec), printer=lambda _: None, storage=storage)
    assert result.counted == 10
