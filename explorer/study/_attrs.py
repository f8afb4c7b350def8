"""How a trial's outcome reads back from its user attrs (written by :mod:`explorer.study._record`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optuna

__all__ = ["answered_without_running", "status_of"]


def status_of(trial: optuna.trial.FrozenTrial) -> str | None:
    status = trial.user_attrs.get("status")
    return str(status) if status is not None else None


def answered_without_running(trial: optuna.trial.FrozenTrial) -> bool:
    """Reused within the study or inferred: a free answer, which does not count.

    An answer from the measurement store is not one of these: it counts, as the study's first
    answer for its configuration (see the module docstring).
    """
    return "reused_from" in trial.user_attrs or "inferred_from" in trial.user_attrs
