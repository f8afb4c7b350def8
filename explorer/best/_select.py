"""Which trial is the study's best, and which runners-up are within its measurement noise."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from explorer.report import MIN_TOLERANCE, MemoryFlag, feasible_ranking, memory_flag, noise_tolerance
from explorer.study._confirm import named_best, verdict_lines
from explorer.study._objectives import objective_value

if TYPE_CHECKING:
    import optuna

    from explorer.space import SearchSpace

__all__ = ["MIN_TOLERANCE", "Selection", "noise_tolerance", "select_best"]


@dataclass(frozen=True)
class Selection:
    """The best feasible trial and the feasible trials that are as good within noise."""

    best: optuna.trial.FrozenTrial
    runners_up: list[optuna.trial.FrozenTrial]
    """Feasible trials (best first) whose value is at least ``(1 - tolerance)`` of the best's."""
    tolerance: float
    """The relative tolerance used: the larger of 2% and the best's ``step_time_rel_ci``."""
    memory: MemoryFlag | None = None
    """Set when the best came within the study's ``memory_margin`` of its memory limit."""
    verdict: list[str] = field(default_factory=list)
    """What the confirmation says: confirmed, tied (and the one recommended), a clear lead, or
    not confirmed (and the command that confirms)."""
    unconfirmed: bool = False
    """The best's interval is wider than its lead over a rival and no confirmation judged it: it
    leads, and is not named the best."""


def select_best(
    study: optuna.Study,
    *,
    margin: float | None = None,
    cap_gib: float | None = None,
    space: SearchSpace | None = None,
    file: str = "STUDY.yaml",
) -> Selection | None:
    """The best measured feasible trial of ``study`` and its runners-up within noise.

    Args:
        study: An Optuna study written by ``explorer optimize``.
        margin: The study's ``memory_margin`` (``None``: no memory flag).
        cap_gib: The study's ``device_memory_gib``, for trials stored without their limit.
        space: The study file's search space: only its configurations are chosen from (a space
            narrowed since the trials ran leaves the others out).
        file: The study file, as the command that confirms names it.

    Returns:
        ``None`` when the study has no feasible (status ``ok``) measured trial.
    """
    ranking = feasible_ranking(study)
    if space is not None:
        from explorer.study import config_of

        ranking = [t for t in ranking if space.contains(config_of(t))]
    if not ranking:
        return None
    chosen, unconfirmed = named_best(study)  # confirmed, or the most robust of a tie
    best = next((t for t in ranking if t.number == chosen), ranking[0])
    ranking = [best, *(t for t in ranking if t is not best)]
    tolerance = noise_tolerance(best)
    top = objective_value(best) or 0.0
    runners_up = [t for t in ranking[1:] if abs((objective_value(t) or 0.0) - top) <= tolerance * abs(top)]
    flag = memory_flag(ranking, margin=margin, cap_gib=cap_gib) if margin is not None else None
    return Selection(
        best=best,
        runners_up=runners_up,
        tolerance=tolerance,
        memory=flag,
        verdict=verdict_lines(study, file),
        unconfirmed=unconfirmed,
    )
