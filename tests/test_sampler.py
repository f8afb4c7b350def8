"""Sampler choice, and grid search as enqueued configurations (respecting the conditional space)."""

from __future__ import annotations

import optuna
import pytest

from explorer.spec import SamplerSpec, load_study
from explorer.study import open_study
from explorer.study._optimize import _enqueue_grid
from explorer.study._sampler import make_sampler
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
    assert _enqueue_grid(study, loaded) == len(valid) == 24
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    seen = set()
    for _ in waiting:
        trial = study.ask()
        seen.add(loaded.space.suggest(trial))
        study.tell(trial, 0.0)
    assert seen == set(valid)
