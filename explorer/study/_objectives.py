"""The study's objectives: dataset tokens per second per GPU (maximized), and optionally a second.

``second_objective`` in the study file adds one of:

* ``dataset_tokens_per_second`` (maximized): the whole trial's throughput, all GPUs together;
* ``number_gpus`` (minimized): the GPUs a configuration holds;
* ``peak_memory_gib`` (minimized): the largest per-device peak.

The objectives' names are the study's Optuna metric names, so a trial's values follow from the
study alone. An infeasible trial (oom, invalid) gets the worst placeholder of each objective (0
for a maximized throughput, :data:`INFEASIBLE_MINIMIZED` for peak memory) and its real GPU count,
with its constraint set above 0 (:func:`explorer.study._record.mark_feasibility`); Optuna's
constrained samplers rank it below every feasible trial either way, and optuna-dashboard shows it
as infeasible.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from explorer.measurement import Properties
from explorer.study._attrs import answered_without_running, status_of

if TYPE_CHECKING:
    import optuna

__all__ = [
    "INFEASIBLE_MINIMIZED",
    "OBJECTIVE",
    "SECOND_OBJECTIVES",
    "best_feasible",
    "pareto_front",
    "objective_value",
    "trial_values",
]

OBJECTIVE = "dataset_tokens_per_second_per_gpu"
Direction = Literal["minimize", "maximize"]
SECOND_OBJECTIVES: dict[str, Direction] = {
    "dataset_tokens_per_second": "maximize",
    "number_gpus": "minimize",
    "peak_memory_gib": "minimize",
}
"""The second objectives a study file may ask for, and their directions."""
INFEASIBLE_PLACEHOLDER = 0.0
INFEASIBLE_MINIMIZED = 1e9
"""Peak memory written for a configuration that did not fit (a finite 'worse than any')."""


def objective_value(trial: optuna.trial.FrozenTrial) -> float | None:
    """The first objective (tokens per second per GPU) of a finished trial, single or multi."""
    values = trial.values
    return float(values[0]) if values else None


def trial_values(study: optuna.Study, properties: Properties | None, *, number_gpus: int) -> list[float]:
    """The values to tell ``study`` for a trial with these properties (``None``: infeasible)."""
    names = study.metric_names if len(study.directions) > 1 else [OBJECTIVE]
    values = []
    for name in names or [OBJECTIVE]:
        if name == "number_gpus":
            values.append(float(number_gpus))
        elif properties is None:
            values.append(INFEASIBLE_MINIMIZED if name == "peak_memory_gib" else INFEASIBLE_PLACEHOLDER)
        else:
            values.append(float(getattr(properties, name)))
    return values


def best_feasible(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The feasible trial with the highest first objective (``None``: no feasible trial yet)."""
    ok = [
        t for t in study.get_trials(deepcopy=False) if status_of(t) == "ok" and objective_value(t) is not None
    ]
    return max(ok, key=lambda t: (objective_value(t) or 0.0, -t.number), default=None)


def pareto_front(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The feasible trials on the Pareto front, each configuration once (repeats answered from
    another trial are left out), highest first objective first."""
    front = [t for t in study.best_trials if status_of(t) == "ok" and not answered_without_running(t)]
    return sorted(front, key=lambda t: (-(objective_value(t) or 0.0), t.number))
