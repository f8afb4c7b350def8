"""The study's objectives: by default dataset tokens per second per GPU (maximized, the seeds'
metric), and optionally a second.

``objective`` in the study file chooses the first, ``second_objective`` adds one. Each objective
(name, direction, whether it may stand first or second, what it is) is declared once, in
:data:`explorer.spec._objectives.OBJECTIVE_TABLE`; this module computes their values.

The prices, the budget and the GPU model are written into the study (:data:`SETTINGS_ATTR`) when
it is created, so every trial's value follows from the study alone, and a study whose file later
names other prices keeps the values it was searched with.

The objectives' names are the study's Optuna metric names, so a trial's values follow from the
study alone. An infeasible trial (oom, invalid) gets the worst placeholder of each objective (0
for a maximized throughput, :data:`INFEASIBLE_MINIMIZED` for peak memory) and its real GPU count,
with its constraint set above 0 (:func:`explorer.study._record.mark_feasibility`); Optuna's
constrained samplers rank it below every feasible trial either way, and optuna-dashboard shows it
as infeasible.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from explorer.measurement import Properties
from explorer.record import StudyKey, StudyRecord, answered_without_running, status_of
from explorer.spec._objectives import (
    NEEDS_SETTINGS,
    OBJECTIVE,
    OBJECTIVES,
    PER_GPU_RANKED,
    SECOND_OBJECTIVES,
    Direction,
)

if TYPE_CHECKING:
    import optuna

__all__ = [
    "Direction",
    "INFEASIBLE_MINIMIZED",
    "OBJECTIVE",
    "OBJECTIVES",
    "PER_GPU_RANKED",
    "SECOND_OBJECTIVES",
    "SETTINGS_ATTR",
    "best_feasible",
    "metric_names",
    "objective_settings",
    "ranking_sign",
    "pareto_front",
    "objective_value",
    "trial_values",
]

_METRIC_NAMES: weakref.WeakKeyDictionary[Any, list[str]] = weakref.WeakKeyDictionary()
SETTINGS_ATTR = StudyKey.SETTINGS
"""Study record key: the prices, token budget and GPU model the objectives are computed with."""
INFEASIBLE_PLACEHOLDER = 0.0
INFEASIBLE_MINIMIZED = 1e9
"""Peak memory written for a configuration that did not fit (a finite 'worse than any')."""


def objective_value(trial: optuna.trial.FrozenTrial) -> float | None:
    """The first objective (tokens per second per GPU) of a finished trial, single or multi."""
    values = trial.values
    return float(values[0]) if values else None


def objective_settings(
    *, prices: dict[str, float], gpu_model: str, total_tokens: float | None
) -> dict[str, Any]:
    """What :data:`SETTINGS_ATTR` holds: USD per GPU-hour by model, the study's GPU model, and
    the budget's tokens over every epoch (``None``: no budget)."""
    return {"prices": dict(prices), "gpu_model": gpu_model, "total_tokens": total_tokens}


def _metric(name: str, p: Properties, *, gpu_model: str | None, settings: dict[str, Any]) -> float:
    if name == "tokens_per_dollar":
        price = settings["prices"][gpu_model or settings["gpu_model"]]
        return 3600.0 * p.dataset_tokens_per_second_per_gpu / float(price)
    if name == "hours_for_budget":
        return float(settings["total_tokens"]) / p.dataset_tokens_per_second / 3600.0
    return float(getattr(p, name))


def trial_values(
    study: optuna.Study, properties: Properties | None, *, number_gpus: int, gpu_model: str | None = None
) -> list[float]:
    """The values to tell ``study`` for a trial with these properties (``None``: infeasible)."""
    names = metric_names(study) or [OBJECTIVE]
    settings = StudyRecord.of(study).settings if NEEDS_SETTINGS & set(names) else {}
    directions = [d.name.lower() for d in study.directions]
    values = []
    for name, direction in zip(names, directions, strict=True):
        if name == "number_gpus":
            values.append(float(number_gpus))
        elif properties is None:
            values.append(INFEASIBLE_MINIMIZED if direction == "minimize" else INFEASIBLE_PLACEHOLDER)
        else:
            values.append(_metric(name, properties, gpu_model=gpu_model, settings=settings))
    return values


def metric_names(study: optuna.Study) -> list[str] | None:
    """``study.metric_names``, read from the storage until they are set, then kept: they are written
    once (:func:`explorer.study.open_study`), and each read goes through every study system attr,
    the dashboard's trial notes included (a read per told trial grew with the study)."""
    names = _METRIC_NAMES.get(study)
    if names is None:
        names = study.metric_names
        if names is not None:
            _METRIC_NAMES[study] = names
    return names


def ranking_sign(study: optuna.Study) -> float:
    """``1.0`` when the first objective is maximized, ``-1.0`` when minimized: multiplied into a
    value, higher is better either way."""
    return -1.0 if study.directions[0].name.lower() == "minimize" else 1.0


def best_feasible(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The feasible trial with the highest first objective (``None``: no feasible trial yet)."""
    ok = [
        t for t in study.get_trials(deepcopy=False) if status_of(t) == "ok" and objective_value(t) is not None
    ]
    sign = ranking_sign(study)
    return max(ok, key=lambda t: (sign * (objective_value(t) or 0.0), -t.number), default=None)


def pareto_front(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The feasible trials on the Pareto front, each configuration once (repeats answered from
    another trial are left out), highest first objective first."""
    front = [t for t in study.best_trials if status_of(t) == "ok" and not answered_without_running(t)]
    sign = ranking_sign(study)
    return sorted(front, key=lambda t: (-sign * (objective_value(t) or 0.0), t.number))
