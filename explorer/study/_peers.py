"""Several ``explorer optimize`` processes on one study: what the other drivers are doing, read from
the storage, so that together they run ``n_trials`` counted trials and measure no configuration
twice.

* Each driver asks for a trial only in its *turn*: on PostgreSQL a transaction-scoped advisory
  lock per study (``pg_advisory_xact_lock``; released when the transaction ends, or when a killed
  driver's connection drops). Inside it the driver re-reads the study (trials counted, trials
  RUNNING that may still count, configurations measured by anyone), asks, and tags the new trial
  with its configuration and driver, so the next driver's turn sees it. Other storages take no
  lock: one driver per study (sqlite is a file on one machine; in-memory studies have no peers).
* A configuration that another live driver is measuring right now is not started again: the new
  trial records ``waits_for`` (that trial's number) and is answered from it when it ends (see
  :func:`settled`). Trials with ``waits_for`` do not count towards the room left, as they will be
  free answers.
"""

from __future__ import annotations

import contextlib
import os
import socket
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from explorer.study._known import Known
from explorer.study._record import answered_without_running, config_of, counts, status_of
from explorer.study._recover import driver_alive

if TYPE_CHECKING:
    import optuna

__all__ = [
    "WAITS_FOR",
    "Room",
    "is_mine",
    "learn",
    "occupancy",
    "running_elsewhere",
    "settled",
    "shared",
    "turn",
]

WAITS_FOR = "waits_for"
"""User attr of a trial waiting for another trial of the same configuration (its number)."""


@dataclass(frozen=True)
class Room:
    counted: int
    """Trials that count towards ``n_trials``, by every driver."""
    running: int
    """RUNNING trials of live drivers that may still count (not those waiting for a twin)."""

    def left(self, n_trials: int) -> int:
        return n_trials - self.counted - self.running


def is_mine(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether this process is the driver of ``trial``."""
    driver = trial.user_attrs.get("driver")
    return isinstance(driver, dict) and (driver.get("host"), driver.get("pid")) == (
        socket.gethostname(),
        os.getpid(),
    )


def shared(study: optuna.Study) -> bool:
    """Whether other drivers may share ``study``: its storage is PostgreSQL. (sqlite is one
    driver's file; an in-memory study has no peers.) Only then does a driver take turns and re-read
    what the others did; alone, it knows everything already."""
    from optuna.storages import RDBStorage

    storage = study._storage
    backend = getattr(storage, "_backend", storage)  # optuna.storages._CachedStorage wraps RDB
    return isinstance(backend, RDBStorage) and backend.engine.name == "postgresql"


@contextlib.contextmanager
def turn(study: optuna.Study) -> Iterator[None]:
    """Hold the study's driver lock (PostgreSQL; no lock on other storages) for one ask."""
    if not shared(study):
        yield
        return
    import sqlalchemy

    backend: Any = getattr(study._storage, "_backend", study._storage)

    key = zlib.crc32(f"explorer-driver:{study.study_name}".encode())
    with backend.engine.begin() as conn:  # the lock ends with this transaction
        conn.execute(sqlalchemy.text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
        yield


def learn(study: optuna.Study, known: Known) -> list[optuna.trial.FrozenTrial]:
    """Read the study's trials, teach ``known`` what other drivers measured; returns the trials."""
    trials = study.get_trials(deepcopy=False)
    for t in trials:
        key = t.user_attrs.get("config_key")
        measured = status_of(t) in ("ok", "oom") and not answered_without_running(t)
        if key and key not in known.measured and measured:
            known.learn(t, config_of(t))
    return trials


def occupancy(study: optuna.Study, known: Known) -> Room:
    """Trials counted and RUNNING (that may count), read from the storage; ``known`` learns what
    other drivers measured."""
    import optuna

    counted = running = 0
    for t in learn(study, known):
        if counts(t):
            counted += 1
        elif (
            t.state == optuna.trial.TrialState.RUNNING
            and t.user_attrs.get(WAITS_FOR) is None
            and driver_alive(t.user_attrs.get("driver")) is not False
        ):
            running += 1
    return Room(counted=counted, running=running)


def running_elsewhere(study: optuna.Study, known: Known, config_key: str) -> optuna.trial.FrozenTrial | None:
    """The RUNNING trial of another live driver that measures ``config_key`` (not a waiting twin);
    ``known`` learns what other drivers measured meanwhile."""
    import optuna

    for t in learn(study, known):
        if (
            t.state == optuna.trial.TrialState.RUNNING
            and t.user_attrs.get("config_key") == config_key
            and t.user_attrs.get(WAITS_FOR) is None
            and not is_mine(t)
            and driver_alive(t.user_attrs.get("driver")) is not False
        ):
            return t
    return None


def settled(study: optuna.Study, source: optuna.trial.FrozenTrial) -> optuna.trial.FrozenTrial | None:
    """``source`` as stored now, once it is no longer running (or its driver died); else ``None``."""
    import optuna

    now = study._storage.get_trial(source._trial_id)
    if (
        now.state == optuna.trial.TrialState.RUNNING
        and driver_alive(now.user_attrs.get("driver")) is not False
    ):
        return None
    return now
