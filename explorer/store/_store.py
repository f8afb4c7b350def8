"""The measurement store: one SQLAlchemy table next to the Optuna tables of the study's storage.

Table ``explorer_measurements``, one row per measurement a study made (appended, never updated):
``config_key``, ``workload_key``, ``hardware_key`` (see :mod:`explorer.store._keys`), ``status``
(``ok`` or ``oom``), ``value`` (the objective; NULL for an OOM), ``measurement_json``
(:meth:`~explorer.measurement.Measurement.to_json`), ``study_name``, ``trial_number`` and
``created_at``. Only measured outcomes are stored: a failed trial is not a measurement, an invalid
one was never launched, and reused or inferred answers are not measurements of their own.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa

from explorer.measurement import Measurement, Outcome
from explorer.store._keys import StoreScope

if TYPE_CHECKING:
    import optuna

__all__ = ["TABLE_NAME", "MeasurementStore", "StoredMeasurement"]

TABLE_NAME = "explorer_measurements"
STORED_OUTCOMES = frozenset({Outcome.OK, Outcome.OOM})

_METADATA = sa.MetaData()
_TABLE = sa.Table(
    TABLE_NAME,
    _METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("config_key", sa.String(512), nullable=False),
    sa.Column("workload_key", sa.String(64), nullable=False),
    sa.Column("hardware_key", sa.String(64), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("value", sa.Float, nullable=True),
    sa.Column("measurement_json", sa.Text, nullable=False),
    sa.Column("study_name", sa.String(512), nullable=False),
    sa.Column("trial_number", sa.Integer, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Index("ix_explorer_measurements_key", "workload_key", "hardware_key", "config_key"),
)


@dataclass(frozen=True, kw_only=True)
class StoredMeasurement:
    """A measurement read back from the store, with the trial that made it."""

    measurement: Measurement
    study_name: str
    trial_number: int
    created_at: dt.datetime


class MeasurementStore:
    """Measurements keyed by configuration, workload and hardware, in one SQL database."""

    def __init__(self, *, engine: sa.engine.Engine) -> None:
        """Bind to ``engine``'s database, creating the table (and its index) if it is missing."""
        self.engine = engine
        try:
            _METADATA.create_all(engine, checkfirst=True)
        except sa.exc.DatabaseError:
            # another process created it between the check and the CREATE: that is as good
            if not sa.inspect(engine).has_table(TABLE_NAME):
                raise

    @classmethod
    def for_storage(cls, storage: optuna.storages.BaseStorage) -> MeasurementStore | None:
        """The store in the database of an Optuna ``RDBStorage``; ``None`` for any other storage
        (in memory, journal files), which has no database to put it in."""
        import optuna

        if not isinstance(storage, optuna.storages.RDBStorage):
            return None
        return cls(engine=storage.engine)

    def put(
        self,
        *,
        config_key: str,
        scope: StoreScope,
        measurement: Measurement,
        study_name: str,
        trial_number: int,
    ) -> None:
        """Append a measurement.

        Raises:
            ValueError: the outcome is not ok or oom (failed and invalid outcomes are not
                measurements), or an ok measurement has no properties.
        """
        if measurement.outcome not in STORED_OUTCOMES:
            raise ValueError(f"only ok and oom measurements are stored, not {measurement.outcome.value}")
        if measurement.outcome is Outcome.OK and measurement.properties is None:
            raise ValueError("an ok measurement without properties cannot be stored")
        value = (
            measurement.properties.dataset_tokens_per_second_per_gpu
            if measurement.properties is not None and measurement.outcome is Outcome.OK
            else None
        )
        row = {
            "config_key": config_key,
            "workload_key": scope.workload_key,
            "hardware_key": scope.hardware_key,
            "status": measurement.outcome.value,
            "value": value,
            "measurement_json": measurement.to_json(),
            "study_name": study_name,
            "trial_number": trial_number,
            "created_at": dt.datetime.now(dt.timezone.utc),
        }
        with self.engine.begin() as conn:
            conn.execute(_TABLE.insert().values(**row))

    def lookup(self, *, config_key: str, scope: StoreScope) -> StoredMeasurement | None:
        """The newest measurement of ``config_key`` in ``scope`` (the last one stored), if any."""
        query = (
            sa.select(_TABLE)
            .where(
                _TABLE.c.workload_key == scope.workload_key,
                _TABLE.c.hardware_key == scope.hardware_key,
                _TABLE.c.config_key == config_key,
                _TABLE.c.status.in_([o.value for o in STORED_OUTCOMES]),
            )
            .order_by(_TABLE.c.id.desc())
            .limit(1)
        )
        with self.engine.connect() as conn:
            row = conn.execute(query).mappings().first()
        if row is None:
            return None
        return StoredMeasurement(
            measurement=Measurement.from_json(row["measurement_json"]),
            study_name=row["study_name"],
            trial_number=row["trial_number"],
            created_at=row["created_at"],
        )

    def count(self, *, scope: StoreScope | None = None) -> int:
        """Rows stored (in ``scope``, if given)."""
        query = sa.select(sa.func.count()).select_from(_TABLE)
        if scope is not None:
            query = query.where(
                _TABLE.c.workload_key == scope.workload_key, _TABLE.c.hardware_key == scope.hardware_key
            )
        with self.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())
