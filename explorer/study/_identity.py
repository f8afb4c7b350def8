"""A study's identity: the job it measures, stored with it, so that one study never mixes two jobs.

The identity is :func:`explorer.store.job_identity`: the workload (model and its architecture or
config, method, dataset and its content, sequence length, dtype, TrainingArguments passthrough)
and the hardware (GPU model or models, device, memory cap), field by field. ``optimize`` stores it
when it creates the study (or first opens one stored before identities were), and refuses a study
file whose identity differs, naming the first field that does. The search space is not part of
it: adding or removing searched values stays allowed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorer.errors import SpecError
from explorer.record import StudyKey, StudyRecord, write_study
from explorer.secrets import mask_url
from explorer.spec import LoadedStudy
from explorer.store import job_identity

if TYPE_CHECKING:
    import optuna

__all__ = [
    "IDENTITY_ATTR",
    "check_identity",
    "check_same_job",
    "first_difference",
    "refuse_other_job",
    "stored_identity",
]

IDENTITY_ATTR = StudyKey.IDENTITY
"""Study record key: the job the study measures (:func:`explorer.store.job_identity`)."""
_MISSING = object()


def first_difference(stored: dict[str, Any], new: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """The first field (in ``new``'s order, then ``stored``'s) whose value differs, with the
    stored and the new value (:data:`_MISSING` where a side has no such field); ``None``: same."""
    for field in [*new, *(k for k in stored if k not in new)]:
        old, now = stored.get(field, _MISSING), new.get(field, _MISSING)
        if old != now:
            return field, old, now
    return None


def _show(value: Any) -> str:
    if value is _MISSING:
        return "(not set)"
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= 120 else text[:117] + "..."


def check_identity(study: optuna.Study, loaded: LoadedStudy) -> None:
    """Store the study file's identity on a study without one; refuse one that differs.

    Raises:
        SpecError: the first differing field, its stored and its new value, and the ways on.
    """
    new = json.loads(json.dumps(job_identity(loaded)))  # as the storage gives it back
    stored = StudyRecord.of(study).identity
    if stored is None:  # a new study, or one stored before identities
        write_study(study, IDENTITY_ATTR, new)
        return
    _refuse(loaded, stored, new)


def check_same_job(study: optuna.Study, loaded: LoadedStudy) -> None:
    """For the verbs that only read a study (``best``, ``report``, ``export``, ``status``,
    ``audit``, ``plan``, ``dashboard``): refuse a study file whose job differs from the stored one,
    as ``optimize`` does, but never store anything (a study without an identity reads as it is).

    Raises:
        SpecError: as :func:`check_identity`.
    """
    stored = StudyRecord.of(study).identity
    if stored is not None:
        _refuse(loaded, stored, json.loads(json.dumps(job_identity(loaded))))


def stored_identity(storage_url: str, name: str) -> dict[str, Any] | None:
    """The identity stored with study ``name``, read without writing anything: an sqlite file is
    read through a plain connection (not switched to WAL, not created where it does not exist).
    ``None``: no such file or study, no identity stored, or a storage that cannot be read here
    (the commands that open it report why)."""
    import optuna
    import sqlalchemy
    from sqlalchemy.engine import make_url

    url = make_url(storage_url)
    database = url.database or ""
    sqlite = url.get_backend_name() == "sqlite"
    if sqlite and (database in ("", ":memory:") or not Path(database).is_file()):
        return None
    try:
        storage = optuna.storages.RDBStorage(
            storage_url,
            skip_compatibility_check=True,
            skip_table_creation=True,
            engine_kwargs={"connect_args": {"timeout": 10} if sqlite else {"connect_timeout": 10}},
        )
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError, ImportError):
        return None  # not readable here, or a fresh file another driver is still filling: open_storage's
    try:
        stored = StudyRecord.of(optuna.load_study(study_name=name, storage=storage)).identity
    except (KeyError, sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError):
        # no such study (yet), or no Optuna tables: e.g. a file another driver has just created
        # and is still filling (Optuna wraps that sqlite error in StorageInternalError); the
        # study's identity is checked again once it is open (check_identity)
        return None
    finally:
        storage.engine.dispose()
    return stored


def refuse_other_job(loaded: LoadedStudy) -> None:
    """:func:`check_identity` before the storage is opened for writing, where opening it writes:
    an sqlite file is switched to WAL as ``optimize`` opens it (:func:`explorer.study.open_storage`),
    which changes its bytes. Other storages are checked by :func:`check_identity` alone (opening an
    existing study there writes nothing).

    Raises:
        SpecError: as :func:`check_identity`.
    """
    if not loaded.storage_url.startswith("sqlite"):
        return
    stored = stored_identity(loaded.storage_url, loaded.spec.name)
    if stored is not None:
        _refuse(loaded, stored, json.loads(json.dumps(job_identity(loaded))))


def _refuse(loaded: LoadedStudy, stored: dict[str, Any], new: dict[str, Any]) -> None:
    """Raise the one line for the first field where ``new`` differs from ``stored``, if any."""
    found = first_difference(stored, new)
    if found is None:
        return
    field, old, now = found
    name = loaded.spec.name
    raise SpecError(
        file=str(loaded.file),
        field=field,
        problem=f"the stored study {name!r} measured {_show(old)}, this file says {_show(now)}: "
        f"one study never mixes two jobs; give this job another study name, or start over "
        f"(optuna delete-study --study-name {name} --storage {mask_url(loaded.storage_url)}); nothing written",
    )
