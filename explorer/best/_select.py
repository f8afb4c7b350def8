"""Which trial is the study's best, and which runners-up are within its measurement noise."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from explorer.report import feasible_ranking
from explorer.study._objectives import objective_value

if TYPE_CHECKING:
    import optuna

__all__ = ["MIN_TOLERANCE", "Selection", "noise_tolerance", "select_best"]

MIN_TOLERANCE = 0.02
"""Runners-up within this fraction of the best are reported even when the best's CI is tighter."""


@dataclass(frozen=True)
class Selection:
    """The best feasible trial and the feasible trials that are as good within noise."""

    best: optuna.trial.FrozenTrial
    runners_up: list[optuna.trial.FrozenTrial]
    """Feasible trials (best first) whose value is at least ``(1 - tolerance)`` of the best's."""
    tolerance: float
    """The relative tolerance used: the larger of 2% and the best's ``step_time_rel_ci``."""


def noise_tolerance(best: optuna.trial.FrozenTrial) -> float:
    """The larger of :data:`MIN_TOLERANCE` and the best trial's relative step-time CI, if any.

    Args:
        best: A measured trial (its ``step_time_rel_ci`` user attribute may be missing or None).

    Returns:
        A fraction of the best trial's value.
    """
    ci = best.user_attrs.get("step_time_rel_ci")
    return max(MIN_TOLERANCE, float(ci)) if isinstance(ci, int | float) else MIN_TOLERANCE


def select_best(study: optuna.Study) -> Selection | None:
    """The best measured feasible trial of ``study`` and its runners-up within noise.

    Args:
        study: An Optuna study written by ``explorer optimize``.

    Returns:
        ``None`` when the study has no feasible (status ``ok``) measured trial.
    """
    ranking = feasible_ranking(study)
    if not ranking:
        return None
    best = ranking[0]
    tolerance = noise_tolerance(best)
    floor = (objective_value(best) or 0.0) * (1.0 - tolerance)
    runners_up = [t for t in ranking[1:] if (objective_value(t) or 0.0) >= floor]
    return Selection(best=best, runners_up=runners_up, tolerance=tolerance)
