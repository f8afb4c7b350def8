"""Resume: trials left RUNNING by a driver that died are failed and their configuration re-run.

Optuna's heartbeat only works inside ``study.optimize``, not with ask/tell, so explorer tags every
trial with the driver process (host, pid, start time) and reclaims a RUNNING trial when that
process is gone.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psutil

from explorer.measurement import Measurement, Outcome
from explorer.record import Key, Status, TrialRecord, enqueue, write, write_status

if TYPE_CHECKING:
    import optuna

__all__ = [
    "ORPHAN_AFTER_S",
    "SURPLUS",
    "Reclaimed",
    "close_surplus",
    "driver_alive",
    "reclaim_interrupted",
    "reclaim_orphans",
    "requeue",
]

SURPLUS = Status.SURPLUS
"""Status of a re-run that was never needed: the study had counted its n_trials when it came up
(the trial it re-runs was interrupted by a driver's death, and other trials counted meanwhile)."""

ORPHAN_AFTER_S = 3.0
"""A RUNNING trial with no driver recorded this long after it was asked is an orphan: its driver
records itself right after asking (milliseconds), so that driver died in between."""


@dataclass
class Reclaimed:
    """What a resume found RUNNING (trial numbers)."""

    requeued: list[int] = field(default_factory=list)
    """Failed as ``interrupted`` (or found failed with no re-run enqueued); their configuration
    runs again."""
    recovered: list[int] = field(default_factory=list)
    """Finished before the driver died (their measurement was on disk): recorded, not re-run."""
    left: list[int] = field(default_factory=list)
    """Left alone: their driver may be alive (another explorer process)."""
    abandoned: list[int] = field(default_factory=list)
    """Asked but never started: their driver died between asking and recording them."""


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
    enqueue(
        study, trial.params, {Key.ATTEMPT: attempt, Key.REQUEUED_FROM: trial.number, Key.REQUEUED_WHY: why}
    )


def reclaim_interrupted(
    study: optuna.Study,
    *,
    force: bool = False,
    recover: Callable[[optuna.trial.FrozenTrial], Measurement | None] | None = None,
    stale: Collection[int] = (),
    live: bool = False,
    max_retries: int = 0,
) -> Reclaimed:
    """Finish the RUNNING trials whose driver is dead: recovered from disk, else re-enqueued.

    Args:
        force: Also reclaim trials of drivers on other hosts (whose liveness cannot be checked).
        recover: The finished measurement a dead driver left on disk for a trial, if any
            (:func:`explorer.study._journal.read_ahead`).
        stale: Trials whose heartbeat stopped (:func:`explorer.study._peers.stale_trials`):
            their driver is dead, on whatever host.
        live: Called by a running driver while other drivers may be at work: a failed attempt
            with no re-run is re-enqueued only when its driver is dead (a live one is about to).
        max_retries: The launcher's ``max_retries``: a failed attempt recovered from disk is
            retried as the driver would have (``retry`` and re-enqueued) while attempts remain.
    """
    import optuna

    from explorer.study._record import record_outcome

    out = Reclaimed()
    trials = study.get_trials(deepcopy=False)
    records = {t.number: TrialRecord.of(t) for t in trials}
    followed = {r.requeued_from for r in records.values()}
    for t in trials:  # a driver killed between failing an attempt and enqueueing its re-run
        record = records[t.number]
        if live and driver_alive(record.driver) is not False:
            continue
        if t.state is optuna.trial.TrialState.FAIL and t.number not in followed:
            status = record.status
            if status in (Status.RETRY, Status.INTERRUPTED):
                requeue(study, t, attempt=record.attempt + (status == Status.RETRY), why=status)
                out.requeued.append(t.number)
    for t in (t for t in trials if t.state is optuna.trial.TrialState.RUNNING):
        record = records[t.number]
        if record.driver is None:
            if _abandon_orphan(study, t):
                out.abandoned.append(t.number)
            continue
        alive = driver_alive(record.driver) and t.number not in stale
        if alive or (alive is None and not force and t.number not in stale):
            out.left.append(t.number)
            continue
        handle = optuna.Trial(study, t._trial_id)
        measurement = recover(t) if recover is not None else None
        if measurement is not None:
            write(handle, {Key.RECOVERED: "the driver died after the trial finished"})
            retry = measurement.outcome is Outcome.FAILED and record.attempt < max_retries
            record_outcome(study, handle, measurement, retry=retry)
            out.recovered.append(t.number)
            if retry:
                requeue(study, t, attempt=record.attempt + 1, why="failed")
                out.requeued.append(t.number)
            continue
        write_status(
            handle, Status.INTERRUPTED, "the explorer process running this trial died; re-run on resume"
        )
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        requeue(study, t, attempt=record.attempt, why=Status.INTERRUPTED)
        out.requeued.append(t.number)
    return out


def reclaim_orphans(study: optuna.Study, turn: Callable[[], AbstractContextManager[None]]) -> list[int]:
    """Fail RUNNING trials that no driver recorded within :data:`ORPHAN_AFTER_S` (see
    :func:`_abandon_orphan`); returns their numbers. Cheap enough to run every few seconds.

    Runs in the drivers' ``turn``: a driver asks a trial and records itself on it in its turn, so a
    trial seen there without a driver was asked by a driver that died, never by one whose ask is
    merely slow (a busy storage, a long proposal)."""
    import optuna

    with turn():
        running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        return [t.number for t in running if TrialRecord.of(t).driver is None and _abandon_orphan(study, t)]


def _abandon_orphan(study: optuna.Study, t: optuna.trial.FrozenTrial) -> bool:
    """Fail ``t`` as ``abandoned`` if it is an orphan; an enqueued one (a retry, a resume, a
    proposal) is enqueued again with the same attributes, so that its configuration still runs."""
    import datetime

    import optuna

    started = t.datetime_start
    if started is None or (datetime.datetime.now() - started).total_seconds() < ORPHAN_AFTER_S:
        return False
    handle = optuna.Trial(study, t._trial_id)
    write_status(
        handle, Status.ABANDONED, "asked but never started: the explorer process that asked for it died first"
    )
    study.tell(t.number, state=optuna.trial.TrialState.FAIL)
    fixed = t.system_attrs.get("fixed_params")
    if fixed:
        attrs = TrialRecord.of(t).attrs
        enqueue(
            study, dict(fixed), {**attrs, Key.REQUEUED_FROM: t.number, Key.REQUEUED_WHY: Status.ABANDONED}
        )
    return True


def close_surplus(study: optuna.Study, n_trials: int) -> list[int]:
    """Fail the re-runs still WAITING once ``n_trials`` trials count (``surplus``): nobody asks
    for them any more, and a study that is done leaves nothing waiting. Call it in the driver's
    turn; a re-run another driver takes at the same moment is left to it.

    Returns:
        Their numbers.
    """
    import optuna

    from explorer.study._record import counted_trials

    State = optuna.trial.TrialState
    waiting = [
        t
        for t in study.get_trials(deepcopy=False, states=(State.WAITING,))
        if TrialRecord.of(t).requeued_from is not None
    ]
    if not waiting or len(counted_trials(study)) < n_trials:
        return []
    closed = []
    for t in waiting:
        if not study._storage.set_trial_state_values(t._trial_id, state=State.RUNNING):
            continue  # another driver took it
        handle = optuna.Trial(study, t._trial_id)
        write_status(handle, SURPLUS, f"not run: {n_trials} trials counted before this re-run came up")
        study.tell(t.number, state=State.FAIL)
        closed.append(t.number)
    return closed
