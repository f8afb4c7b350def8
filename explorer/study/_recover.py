"""Resume: trials left RUNNING by a driver that died are failed and their configuration re-run.

Optuna's heartbeat only works inside ``study.optimize``, not with ask/tell, so explorer tags every
trial with the driver process (host, pid, start time) and reclaims a RUNNING trial when that
process is gone.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    import optuna

__all__ = ["driver_alive", "reclaim_interrupted", "requeue"]


def driver_alive(driver: object) -> bool | None:
    """True/False for a driver on this host; ``None`` if it ran on another host (unknown)."""
    if not isinstance(driver, dict) or driver.get("host") != socket.gethostname():
        return None
    try:
        proc = psutil.Process(int(driver["pid"]))
        return abs(proc.create_time() - float(driver["start"])) < 1.0 and proc.is_running()
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, ValueError):
        return False


def requeue(study: optuna.Study, trial: optuna.trial.FrozenTrial, *, attempt: int, why: str) -> None:
    """Enqueue ``trial``'s parameters again, so that the same configuration runs next."""
    study.enqueue_trial(
        trial.params, user_attrs={"attempt": attempt, "requeued_from": trial.number, "requeued_why": why}
    )


def reclaim_interrupted(study: optuna.Study, *, force: bool = False) -> tuple[list[int], list[int]]:
    """Fail and re-enqueue RUNNING trials whose driver is dead.

    Args:
        force: Also reclaim trials of drivers on other hosts (whose liveness cannot be checked).

    Returns:
        (reclaimed trial numbers, RUNNING trials left alone because their driver may be alive).
    """
    import optuna

    reclaimed: list[int] = []
    left: list[int] = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        alive = driver_alive(t.user_attrs.get("driver"))
        if alive or (alive is None and not force):
            left.append(t.number)
            continue
        handle = optuna.Trial(study, t._trial_id)
        handle.set_user_attr("status", "interrupted")
        handle.set_user_attr("error", "the explorer process running this trial died; re-run on resume")
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        requeue(study, t, attempt=int(t.user_attrs.get("attempt", 0)), why="interrupted")
        reclaimed.append(t.number)
    return reclaimed, left
