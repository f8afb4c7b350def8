"""Several ``explorer optimize`` processes on one study: what the other drivers are doing, read from
the storage, so that together they run ``n_trials`` counted trials and measure no configuration
twice.

* Each driver asks for a trial only in its *turn* (:class:`Drivers`): on PostgreSQL a
  transaction-scoped advisory lock per study (``pg_advisory_xact_lock``; released when the
  transaction ends, or when a killed driver's connection drops); on a sqlite file a POSIX lock on
  a file next to the database (``<db>.explorer.lock``; released when the process dies, however it
  dies). Inside it the driver re-reads the study (trials counted, trials RUNNING that may still
  count, configurations measured by anyone), asks, and tags the new trial with its configuration
  and driver, so the next driver's turn sees it.
* A driver re-reads the study only while it may have company: on PostgreSQL always (drivers on
  other hosts cannot be seen), on sqlite while another live process holds the same lock file (a
  lock probe, no storage read, so a driver alone pays nothing). An in-memory study has no peers.
  MySQL: a session lock (``GET_LOCK``) held for the driver's life refuses a second driver.
* A configuration that another live driver is measuring right now is not started again: the new
  trial records ``waits_for`` (that trial's number) and is answered from it when it ends (see
  :func:`settled`). Trials with ``waits_for`` do not count towards the room left, as they will be
  free answers.
* A trial that stops waiting (its answer never came: that trial failed and is retried, or its
  driver died) takes the configuration over in the driver's turn too (:func:`claim`): checked
  against the other drivers' RUNNING trials and recorded as measuring it (``waits_for`` cleared)
  in one turn, so that a driver asking the same configuration (the failed trial's retry) sees it,
  or is seen by it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from explorer.record import Key, Status, TrialRecord, write
from explorer.study._known import Known
from explorer.study._record import config_of
from explorer.study._recover import driver_alive

if TYPE_CHECKING:
    import optuna

__all__ = [
    "HEARTBEAT_S",
    "STALE_AFTER_S",
    "WAITS_FOR",
    "beat",
    "claim",
    "dead_running",
    "Drivers",
    "Room",
    "is_mine",
    "learn",
    "occupancy",
    "running_elsewhere",
    "settled",
    "stale_trials",
]

HEARTBEAT_S = 10.0
"""How often a driver records a heartbeat for each trial it has open (Optuna's trial_heartbeats)."""
STALE_AFTER_S = 90.0
"""A RUNNING trial whose last heartbeat is older than this has lost its driver (any host): another
driver reclaims it, as a resume does the trials of a driver that died."""

WAITS_FOR = Key.WAITS_FOR
"""Record key of a trial waiting for another trial of the same configuration (its number)."""


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
    driver = TrialRecord.of(trial).driver
    return driver is not None and (driver.get("host"), driver.get("pid")) == (
        socket.gethostname(),
        os.getpid(),
    )


class Drivers:
    """This process's place among the drivers of one study: its turn to ask (:meth:`turn`) and
    whether other drivers may be at work (:meth:`others`). Made by :meth:`join`; :meth:`leave`
    when the driver ends (a dead process leaves by itself: its locks go with it)."""

    def __init__(
        self,
        *,
        study_name: str,
        engine: Any = None,
        lock_fd: int | None = None,
        mysql_conn: Any = None,
    ) -> None:
        self._key = zlib.crc32(f"explorer-driver:{study_name}".encode())
        self._engine = engine  # PostgreSQL: every driver may have company
        self._fd = lock_fd  # sqlite: the lock file next to the database
        self._mysql = mysql_conn  # MySQL: the connection holding this driver's session lock
        self._turn_at = 2 * (self._key % (1 << 30))  # byte ranges of this study in the lock file
        self._presence_at = self._turn_at + 1

    @classmethod
    def join(cls, study: optuna.Study) -> Drivers:
        """Join ``study``'s drivers (a sqlite driver marks itself present for its life).

        Raises:
            SpecError: MySQL, and another driver holds the study.
        """
        from optuna.storages import RDBStorage

        backend = getattr(study._storage, "_backend", study._storage)  # _CachedStorage wraps RDB
        if not isinstance(backend, RDBStorage):
            return cls(study_name=study.study_name)  # in memory: no peers
        engine = backend.engine
        if engine.name == "postgresql":
            return cls(study_name=study.study_name, engine=engine)
        if engine.name == "mysql":
            return cls._join_mysql(study.study_name, engine)
        database = engine.url.database or ""
        if engine.name != "sqlite" or database in ("", ":memory:"):
            return cls(study_name=study.study_name)
        fd = os.open(f"{database}.explorer.lock", os.O_RDWR | os.O_CREAT, 0o600)
        drivers = cls(study_name=study.study_name, lock_fd=fd)
        fcntl.lockf(fd, fcntl.LOCK_SH, 1, drivers._presence_at)  # held until this process ends
        return drivers

    @classmethod
    def _join_mysql(cls, study_name: str, engine: Any) -> Drivers:
        import sqlalchemy

        from explorer.errors import SpecError

        conn = engine.connect()
        key = f"explorer-driver:{study_name}"
        if conn.execute(sqlalchemy.text("SELECT GET_LOCK(:k, 0)"), {"k": key}).scalar() != 1:
            conn.close()
            raise SpecError(
                file="storage",
                field="",
                problem=f"another explorer process drives study {study_name!r} in this MySQL storage, "
                "and MySQL studies take one driver at a time; wait for it, or use PostgreSQL",
            )
        return cls(study_name=study_name, mysql_conn=conn)

    def others(self) -> bool:
        """Whether other drivers may be at work on the study now (PostgreSQL: always)."""
        if self._engine is not None:
            return True
        if self._fd is None:
            return False
        try:  # another process present holds a shared lock on the byte: no exclusive one then
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, self._presence_at)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                return True
            raise
        fcntl.lockf(self._fd, fcntl.LOCK_SH, 1, self._presence_at)  # back to merely present
        return False

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Hold the study's driver lock for one ask (and what must not race with another driver)."""
        if self._fd is not None:
            fcntl.lockf(self._fd, fcntl.LOCK_EX, 1, self._turn_at)
            try:
                yield
            finally:
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, self._turn_at)
            return
        if self._engine is None:
            yield
            return
        import sqlalchemy

        with self._engine.begin() as conn:  # the lock ends with this transaction
            conn.execute(sqlalchemy.text("SELECT pg_advisory_xact_lock(:key)"), {"key": self._key})
            yield

    def leave(self) -> None:
        """Give up this driver's locks."""
        if self._fd is not None:
            os.close(self._fd)  # every POSIX lock of this process on the file goes with it
            self._fd = None
        if self._mysql is not None:
            self._mysql.close()
            self._mysql = None


def learn(study: optuna.Study, known: Known) -> list[optuna.trial.FrozenTrial]:
    """Read the study's trials, teach ``known`` what other drivers measured; returns the trials."""
    trials = study.get_trials(deepcopy=False)
    for t in trials:
        record = TrialRecord.of(t)
        key = record.config_key
        measured = record.status in (Status.OK, Status.OOM) and not record.answered_without_running
        if key and key not in known.measured and measured:
            known.learn(t, config_of(t))
    return trials


def occupancy(study: optuna.Study, known: Known) -> Room:
    """Trials counted and RUNNING (that may count), read from the storage; ``known`` learns what
    other drivers measured."""
    import optuna

    counted = running = 0
    for t in learn(study, known):
        record = TrialRecord.of(t)
        if record.counts:
            counted += 1
        elif (
            t.state == optuna.trial.TrialState.RUNNING
            and record.waits_for is None
            and driver_alive(record.driver) is not False
        ):
            running += 1
    return Room(counted=counted, running=running)


def running_elsewhere(study: optuna.Study, known: Known, config_key: str) -> optuna.trial.FrozenTrial | None:
    """The RUNNING trial of another live driver that measures ``config_key`` (not a waiting twin);
    ``known`` learns what other drivers measured meanwhile."""
    import optuna

    for t in learn(study, known):
        record = TrialRecord.of(t)
        if (
            t.state == optuna.trial.TrialState.RUNNING
            and record.config_key == config_key
            and record.waits_for is None
            and not is_mine(t)
            and driver_alive(record.driver) is not False
        ):
            return t
    return None


def claim(
    study: optuna.Study,
    known: Known,
    trial: optuna.Trial,
    config_key: str,
    turn: Callable[[], contextlib.AbstractContextManager[None]],
) -> optuna.trial.FrozenTrial | None:
    """Take ``config_key`` over for ``trial``, which waited for another trial of it, in the
    driver's ``turn``: the RUNNING trial of another live driver that measures it now, which
    ``trial`` then waits for (``waits_for``); else ``None``, and ``trial`` is recorded as measuring
    it (``waits_for`` cleared) before the turn ends.

    A check outside the turn races with another driver's ask of the same configuration (the
    failed trial's retry, enqueued meanwhile): each sees the other still waiting, or not yet
    tagged with its configuration, and both measure it."""
    with turn():
        other = running_elsewhere(study, known, config_key)
        write(trial, {WAITS_FOR: None if other is None else other.number})
    return other


def settled(study: optuna.Study, source: optuna.trial.FrozenTrial) -> optuna.trial.FrozenTrial | None:
    """``source`` as stored now, once it is no longer running (or its driver died); else ``None``."""
    import optuna

    now = study._storage.get_trial(source._trial_id)
    if now.state == optuna.trial.TrialState.RUNNING and driver_alive(TrialRecord.of(now).driver) is not False:
        return None
    return now


def dead_running(study: optuna.Study, source: optuna.trial.FrozenTrial) -> bool:
    """``source`` is still RUNNING in the storage while its driver, on this host, is dead."""
    now = settled(study, source)
    return now is not None and not now.state.is_finished()


def _rdb(study: optuna.Study) -> Any:
    """The study's RDBStorage, or ``None`` (in memory)."""
    from optuna.storages import RDBStorage

    backend = getattr(study._storage, "_backend", study._storage)
    return backend if isinstance(backend, RDBStorage) else None


def beat(study: optuna.Study, trial_ids: list[int]) -> None:
    """Record a heartbeat now for each of this driver's open trials (by storage id)."""
    storage = _rdb(study)
    if storage is None:
        return
    for trial_id in trial_ids:
        storage.record_heartbeat(trial_id)


def stale_trials(study: optuna.Study, after_s: float = STALE_AFTER_S) -> set[int]:
    """Numbers of the RUNNING trials of ``study`` whose last heartbeat is older than ``after_s``
    (by the database's clock, as Optuna compares them); a trial with no heartbeat is not stale."""
    import sqlalchemy

    storage = _rdb(study)
    if storage is None:
        return set()
    query = sqlalchemy.text(
        "SELECT t.number, h.heartbeat FROM trials t JOIN trial_heartbeats h ON h.trial_id = t.trial_id "
        "WHERE t.study_id = :study AND t.state = 'RUNNING'"
    )
    with storage.engine.connect() as conn:
        now = conn.execute(sqlalchemy.select(sqlalchemy.func.now())).scalar()
        rows = conn.execute(query, {"study": study._study_id}).all()
    if now is None:
        return set()
    now = _naive(now)
    return {int(number) for number, at in rows if (now - _naive(at)).total_seconds() > after_s}


def _naive(at: Any) -> Any:
    """A database timestamp as a naive datetime (sqlite returns text, PostgreSQL datetimes)."""
    import datetime

    if isinstance(at, str):
        at = datetime.datetime.fromisoformat(at)
    return at.replace(tzinfo=None)
