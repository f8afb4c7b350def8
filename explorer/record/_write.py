"""Writing a trial's and a study's record: Optuna's user_attrs (and a trial's system attrs with them).

What is written when (a measurement, a reuse, a retry) is :mod:`explorer.study._record`'s; this
module only puts keys into the storage.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from explorer.record._keys import Key

if TYPE_CHECKING:
    import optuna

__all__ = ["enqueue", "write", "write_status", "write_study"]


def write(trial: optuna.Trial, attrs: Mapping[str, Any], *, system: Mapping[str, Any] | None = None) -> None:
    """Write several keys of a running trial's record (and its ``system`` attributes, such as
    the constraint) in one transaction.

    Optuna writes each ``set_user_attr`` in a transaction of its own; a trial has about 50, and
    the commits were most of the loop's cost on sqlite. On an RDB storage (behind Optuna's cache,
    which holds only finished trials) they go in one session through the storage's own
    ``_set_trial_attr_without_commit`` (private Optuna API, checked for; other storages, or an
    Optuna without it, get the public call per attribute).
    """
    from optuna.storages import RDBStorage

    storage = trial.study._storage
    backend = getattr(storage, "_backend", storage)  # optuna.storages._CachedStorage wraps RDB
    attrs, system = dict(attrs), dict(system or {})
    if isinstance(backend, RDBStorage) and hasattr(backend, "_set_trial_attr_without_commit"):
        _write_rdb(backend, trial._trial_id, attrs, system)
        trial._cached_frozen_trial.user_attrs.update(attrs)  # as Trial.set_user_attr keeps it
        return
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    for key, value in system.items():
        storage.set_trial_system_attr(trial._trial_id, key, value)


def _write_rdb(backend: Any, trial_id: int, attrs: dict[str, Any], system: dict[str, Any]) -> None:
    """:func:`write` on an RDB storage: one session, on sqlite and PostgreSQL one upsert per table."""
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    dialect = backend.engine.name
    tables = ((models.TrialUserAttributeModel, attrs), (models.TrialSystemAttributeModel, system))
    with _create_scoped_session(backend.scoped_session, True) as session:
        if dialect not in ("sqlite", "postgresql"):
            for model, items in tables:
                for key, value in items.items():
                    backend._set_trial_attr_without_commit(session, model, trial_id, key, value)
            return
        # one check that the trial is still running, then one upsert of every attribute
        row = models.TrialModel.find_or_raise_by_id(trial_id, session)
        backend.check_trial_is_updatable(trial_id, row.state)
        for model, items in tables:
            if items:
                _upsert(session, _dialect_insert(dialect)(model), trial_id, items)


def _upsert(session: Any, insert: Any, trial_id: int, items: dict[str, Any]) -> None:
    """Insert or update every ``key: value`` of ``items`` for ``trial_id``, in one statement."""
    values = [
        {"trial_id": trial_id, "key": key, "value_json": json.dumps(value)} for key, value in items.items()
    ]
    session.execute(
        insert.values(values).on_conflict_do_update(
            index_elements=["trial_id", "key"], set_={"value_json": insert.excluded.value_json}
        )
    )


def _dialect_insert(dialect: str) -> Any:
    """The insert with ``on_conflict_do_update`` of sqlite or PostgreSQL."""
    from sqlalchemy.dialects import postgresql, sqlite

    return sqlite.insert if dialect == "sqlite" else postgresql.insert


def write_status(trial: optuna.Trial, status: str, error: str) -> None:
    """Write a running trial's ``status`` and the ``error`` that says why (before it is failed)."""
    write(trial, {Key.STATUS: status, Key.ERROR: error})


def enqueue(study: optuna.Study, params: dict[str, Any], attrs: Mapping[str, Any]) -> None:
    """Enqueue a trial of ``params`` whose record starts with ``attrs``."""
    study.enqueue_trial(params, user_attrs=dict(attrs))


def write_study(study: optuna.Study, key: str, value: Any) -> None:
    """Write one key of the study's record (:class:`~explorer.record.StudyKey`)."""
    study.set_user_attr(key, value)
