"""The objectives beyond the seeds' per-GPU rate: total rate, tokens per dollar, hours for a budget.

Each runs the replay of ``benchmarks/plan_studies/replay-cpu-small.yaml`` (real CPU trials) with
another ``objective``; every trial's value is recomputed from its own measured properties, and
the study's best is the configuration the objective should favour.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from explorer.best import select_best
from explorer.cli import main
from explorer.study import open_existing_study, status_of
from explorer.study_file import load_study

ROOT = Path(__file__).resolve().parent.parent
FILES = ("benchmarks/results/tables/cpu-two-models.csv", "search_spaces/plan-cpu.yaml")
STUDY = "benchmarks/plan_studies/replay-cpu-small.yaml"


def _study(root: Path, **changes: object) -> Path:
    for rel in FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, root / rel)
    data = yaml.safe_load((ROOT / STUDY).read_text())
    data.update(changes)
    path = root / STUDY
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def _ok(path: Path) -> list:
    study = open_existing_study(load_study(path, check_model=False))
    return study, [t for t in study.get_trials(deepcopy=False) if status_of(t) == "ok"]


@pytest.mark.parametrize(
    ("objective", "direction", "value"),
    [
        ("dataset_tokens_per_second", "MAXIMIZE", lambda a: a["dataset_tokens_per_second"]),
        ("tokens_per_dollar", "MAXIMIZE", lambda a: 3600 * a["dataset_tokens_per_second_per_gpu"] / 1.0),
        ("hours_for_budget", "MINIMIZE", lambda a: 4e8 / a["dataset_tokens_per_second"] / 3600),
    ],
)
def test_each_objective_is_computed_from_the_trials_measurements(
    tmp_path: Path, objective: str, direction: str, value: object
) -> None:
    path = _study(tmp_path, objective=objective)
    assert main(["optimize", str(path)]) == 0
    study, ok = _ok(path)
    assert [d.name for d in study.directions] == [direction]
    assert study.metric_names == [objective]
    assert study.user_attrs["objectives"] == f"{objective} ({direction.lower()})"  # the dashboard's note
    assert len(ok) >= 8
    for t in ok:
        assert t.values[0] == pytest.approx(value(t.user_attrs), rel=1e-9)  # type: ignore[operator]
    best = select_best(study)
    assert best is not None
    total = max(ok, key=lambda t: t.user_attrs["dataset_tokens_per_second"])
    per_gpu = max(ok, key=lambda t: t.user_attrs["dataset_tokens_per_second_per_gpu"])
    # the per-GPU rate favours 1 GPU; total rate and time to a budget favour the fastest trial
    assert best.best.number == (per_gpu.number if objective == "tokens_per_dollar" else total.number)
    assert total.user_attrs["number_gpus"] == 2 and per_gpu.user_attrs["number_gpus"] == 1


def test_a_stored_study_keeps_its_objective(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _study(tmp_path)
    assert main(["optimize", str(path)]) == 0
    _study(tmp_path, objective="hours_for_budget")
    capsys.readouterr()
    assert main(["optimize", str(path)]) == 2
    err = capsys.readouterr().err
    assert "objective: the stored study 'plan-replay-cpu-small' has other objectives" in err


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        (
            {"objective": "tokens_per_dollar", "prices": {"CPU-large": 2.0}},
            "tokens_per_dollar needs a price for 'CPU-small'",
        ),
        ({"objective": "hours_for_budget", "budget": None}, "hours_for_budget needs budget.tokens"),
        ({"second_objective": "dataset_tokens_per_second_per_gpu"}, "second_objective"),
        ({"budget": {"tokens": "lots"}}, "'lots' is not a number"),
    ],
)
def test_objectives_without_what_they_need_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict, says: str
) -> None:
    path = _study(tmp_path, **changes)
    assert main(["validate", "--offline", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not list(tmp_path.rglob("*.db"))
