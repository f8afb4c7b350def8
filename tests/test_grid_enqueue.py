"""``sampler: grid`` enqueues every valid configuration once: a resumed study adds none of the
ones already waiting, asked or recorded, and the enqueue reads the trials once (Optuna's own
duplicate check reads them all for every enqueue: about 6 s for this 196-configuration grid)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import optuna

from explorer.study import optimize
from explorer.study._open import enqueue_grid
from explorer.study_file import load_study
from explorer.validity import invalid_reason

ROOT = Path(__file__).resolve().parents[1]


def test_a_resumed_grid_enqueues_no_configuration_twice(tmp_path):
    loaded = load_study(
        ROOT / "studies" / "cpu-table.yaml",
        storage=f"sqlite:///{tmp_path}/grid.db",
        replay_table=ROOT / "benchmarks" / "results" / "tables" / "cpu-quickstart.csv",
    )
    valid = [c for c in loaded.space.enumerate() if invalid_reason(c, loaded.spec.resources) is None]
    said: list[str] = []
    for n_trials in (1, 3):  # the second run resumes: one trial recorded, the rest waiting
        spec = loaded.spec.model_copy(update={"n_trials": n_trials})
        optimize(dataclasses.replace(loaded, spec=spec), printer=said.append, write_ahead=False)
    assert [line for line in said if line.startswith("grid:")] == [
        f"grid: enqueued {len(valid)} configurations"
    ]
    study = optuna.load_study(study_name=loaded.spec.name, storage=f"sqlite:///{tmp_path}/grid.db")
    held = [tuple(sorted(t.system_attrs.get("fixed_params", t.params).items())) for t in study.trials]
    assert len(held) == len(set(held)) == len(valid)
    assert enqueue_grid(study, loaded) == 0  # every configuration is in the study already
    assert len(study.trials) == len(valid)
