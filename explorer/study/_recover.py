"""Resume: trials left RUNNING by a driver that died are failed and their configuration re-run.

Optuna's heartbeat only works inside ``study.optimize``, not with ask/tell, so explorer tags every
trial with the driver process (host, pid, start time) and reclaims a RUNNING trial when that
process is gone.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    import optuna

    from explorer.measurement import Measurement

__all__ = ["Reclaimed", "driver_alive", "reclaim_interrupted", "requeue"]


@dataclass
class Reclaimed:
    """What a resume found RUNNING (trial numbers)."""

    requeued: list[int] = field(default_factory=list)
    """Failed as ``interrupted``; their configuration runs again."""
    recovered: list[int] = field(default_factory=list)
    """Finished before the driver died (their measurement was on disk): recorded, not re-run."""
    left: list[int] = field(default_factory=list)
    """Left alone: their driver may be alive (another explorer process)."""


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


def reclaim_interrupted(
    study: optuna.Study,
    *,
    force: bool = False,
    recover: Callable[[optuna.trial.FrozenTrial], Measurement | None] | None = None,
) -> Reclaimed:
    """Finish the RUNNING trials whose driver is dead: recovered from disk, else re-enqueued.

    Args:
        force: Also reclaim trials of drivers on other hosts (whose liveness cannot be checked).
        recover: The finished measurement a dead driver left on disk for a trial, if any
            (:func:`explorer.study._journal.read_ahead`).
    """
    import optuna

    from explorer.study._record import record_outcome, set_user_attrs

    out = Reclaimed()
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        alive = driver_alive(t.user_attrs.get("driver"))
        if alive or (alive is None and not force):
            out.left.append(t.number)
            continue
        handle = optuna.Trial(study, t._trial_id)
        measurement = recover(t) if recover is not None else None
        if measurement is not None:
            set_user_attrs(handle, {"recovered": "the driver died after the trial finished"})
            record_outcome(study, handle, measurement)
            out.recovered.append(t.number)
            continue
        handle.set_user_attr("status", "interrupted")
        handle.set_user_attr("error", "the explorer process running this trial died; re-run on resume")
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        requeue(study, t, attempt=int(t.user_attrs.get("attempt", 0)), why="interrupted")
        out.requeued.append(t.number)
    return out
