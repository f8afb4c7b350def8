"""How a trial's outcome reads back from its user attrs (written by :mod:`explorer.study._record`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optuna

__all__ = ["CONSTRAINTS_KEY", "answered_without_running", "infeasibility", "status_of"]

CONSTRAINTS_KEY = "constraints"
"""The trial system attribute that holds a trial's constraint values as a list, > 0 infeasible
(``optuna.study._constrained_optimization._CONSTRAINTS_KEY``). Optuna's samplers read it as the
constraint named ``"0"``; optuna-dashboard (0.21) reads only this form, not the per-key
``constraints:<name>`` that ``Trial.set_constraint`` writes."""


def status_of(trial: optuna.trial.FrozenTrial) -> str | None:
    status = trial.user_attrs.get("status")
    return str(status) if status is not None else None


def answered_without_running(trial: optuna.trial.FrozenTrial) -> bool:
    """Reused within the study or inferred: a free answer, which does not count.

    An answer from the measurement store is not one of these: it counts, as the study's first
    answer for its configuration (see the module docstring).
    """
    return "reused_from" in trial.user_attrs or "inferred_from" in trial.user_attrs


def infeasibility(trial: optuna.trial.FrozenTrial) -> float:
    """The largest constraint value of ``trial`` (> 0: infeasible; 0 where none is set), in
    either form: the list :data:`CONSTRAINTS_KEY` (written since the dashboard showed oom trials
    as real results) or ``constraints:infeasible`` (studies recorded before)."""
    return max(trial.constraints.values(), default=0.0)
