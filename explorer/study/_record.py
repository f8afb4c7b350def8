"""How a trial's outcome is written into Optuna: values, constraint, state and user_attrs.

* ok: COMPLETE, value = dataset_tokens_per_second_per_gpu, constraint 0 (feasible).
* oom / invalid: COMPLETE with the placeholder value 0.0 and constraint 1 (infeasible), so that
  TPE and GP learn from it (a FAIL would be ignored and resampled; GP reads COMPLETE trials only).

The constraint is written as Optuna's list form, the trial system attribute ``constraints``
(:data:`~explorer.study._attrs.CONSTRAINTS_KEY`): Optuna's samplers read it as one constraint, as
they read ``Trial.set_constraint``'s per-key form, and optuna-dashboard reads only the list, so an
oom or invalid trial shows there as infeasible (greyed out in the plots) instead of a real 0.

Every finished trial also gets a dashboard note with its configuration in user units (see
:mod:`explorer.study._notes`).
* failed: FAIL, with the error text; re-enqueued while retries remain (status ``retry``).
* interrupted: FAIL, re-enqueued on resume (status ``interrupted``).

Statuses that count towards ``n_trials``: ok, oom, invalid, failed. A configuration proposed again
after it was measured (ok or oom) is answered from that measurement without running
(``reused_from``) and does not count; nor does an OOM inferred from a measured one
(``inferred_from``, see :mod:`explorer.search._inference`).

A configuration answered from the measurement store (``reused_from_store``: measured by another
study, or by an earlier run of this one, with the same workload on the same hardware; see
:mod:`explorer.store`) is recorded as if measured, with every property, and counts: it is this
study's first answer for that configuration, so the sampler's budget is spent as before, without
the wait.
"""

from __future__ import annotations

import json
import os
import socket
from typing import TYPE_CHECKING, Any

from explorer.measurement import Measurement, Outcome
from explorer.study._attrs import CONSTRAINTS_KEY, answered_without_running, infeasibility, status_of
from explorer.study._notes import write_trial_note
from explorer.study._objectives import INFEASIBLE_PLACEHOLDER, OBJECTIVE, trial_values
from explorer.trial_config import TrialConfig, field_names

if TYPE_CHECKING:
    import optuna

    from explorer.store import StoredMeasurement

__all__ = [
    "COUNTED",
    "INFEASIBLE_PLACEHOLDER",
    "OBJECTIVE",
    "config_of",
    "counted_trials",
    "counts",
    "frozen",
    "feasibility",
    "mark_feasibility",
    "answered_without_running",
    "record_driver",
    "set_user_attrs",
    "record_from_store",
    "record_inferred_oom",
    "record_reuse",
    "record_outcome",
    "status_of",
]

COUNTED = frozenset({"ok", "oom", "invalid", "failed"})
MAX_ERROR_CHARS = 2000
REUSED_ATTRS = ("status", "is_valid", "error", OBJECTIVE, "peak_memory_gib", "mfu")
"""What a reused answer copies from the trial that measured it (besides value and constraint)."""


def frozen(study: optuna.Study, trial: optuna.Trial) -> optuna.trial.FrozenTrial:
    """The stored state of a live trial (one storage read, not the whole study)."""
    return study._storage.get_trial(trial._trial_id)


def counts(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether ``trial`` counts towards ``n_trials``: finished for good, and not a free reuse."""
    return status_of(trial) in COUNTED and not answered_without_running(trial)


def counted_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Trials that count towards ``n_trials``."""
    return [t for t in study.get_trials(deepcopy=False) if counts(t)]


def record_reuse(study: optuna.Study, trial: optuna.Trial, source: optuna.trial.FrozenTrial) -> str:
    """Answer a repeated proposal from the trial that already measured the same configuration.

    The new trial gets the source's value and constraint (the sampler sees the point again, as if
    re-measured), its status and headline figures, and ``reused_from``, which leads to every other
    property; it does not count towards ``n_trials``. (Copying every property made each reuse
    about 50 storage commits; sampled spaces are re-proposed often.)
    """
    attrs = {key: source.user_attrs[key] for key in REUSED_ATTRS if key in source.user_attrs}
    set_user_attrs(
        trial,
        {**attrs, "reused_from": source.number, "wall_seconds": 0.0},
        system=feasibility(infeasibility(source)),
    )
    write_trial_note(study, trial, study.tell(trial, source.values))
    return str(status_of(source))


def record_from_store(study: optuna.Study, trial: optuna.Trial, stored: StoredMeasurement) -> str:
    """Answer ``trial`` from a stored measurement, as if it had been measured now (every property,
    value and constraint), with ``reused_from_store`` naming the study and trial that measured it
    and ``wall_seconds`` 0. It counts towards ``n_trials``; returns the status written."""
    import dataclasses

    trial.set_user_attr("reused_from_store", {"study": stored.study_name, "trial": stored.trial_number})
    return record_outcome(study, trial, dataclasses.replace(stored.measurement, wall_seconds=0.0))


def record_inferred_oom(study: optuna.Study, trial: optuna.Trial, source: int) -> str:
    """Record ``trial`` as OOM without running it: it dominates trial ``source``, which ran out of
    memory. It does not count towards ``n_trials``."""
    set_user_attrs(
        trial,
        {
            "inferred_from": source,
            "wall_seconds": 0.0,
            "is_valid": 0,
            "status": Outcome.OOM.value,
            "error": f"inferred: needs at least the memory of trial {source}, which ran out",
        },
        system=feasibility(1.0),
    )
    values = trial_values(study, None, number_gpus=int(trial.user_attrs.get("number_gpus", 1)))
    write_trial_note(study, trial, study.tell(trial, values))
    return Outcome.OOM.value


def feasibility(value: float) -> dict[str, list[float]]:
    """The system attr that sets a trial's constraint: ``value`` > 0 infeasible, else feasible.

    Written as the list form (:data:`CONSTRAINTS_KEY`), the one optuna-dashboard reads; Optuna's
    samplers read it as ``trial.constraints == {"0": value}``, one constraint as before.
    """
    return {CONSTRAINTS_KEY: [float(value)]}


def mark_feasibility(study: optuna.Study, trial: optuna.Trial, value: float) -> None:
    """Set the running ``trial``'s constraint (:func:`feasibility`) on its own."""
    study._storage.set_trial_system_attr(
        trial._trial_id, CONSTRAINTS_KEY, feasibility(value)[CONSTRAINTS_KEY]
    )


def set_user_attrs(
    trial: optuna.Trial, attrs: dict[str, Any], *, system: dict[str, Any] | None = None
) -> None:
    """Write several user attributes of a running trial (and its ``system`` attributes, such as
    the constraint: :func:`feasibility`) in one transaction.

    Optuna writes each ``set_user_attr`` in a transaction of its own; a trial has about 50, and
    the commits were most of the loop's cost on sqlite. On an RDB storage (behind Optuna's cache,
    which holds only finished trials) they go in one session through the storage's own
    ``_set_trial_attr_without_commit`` (private Optuna API, checked for; other storages, or an
    Optuna without it, get the public call per attribute).
    """
    from optuna.storages import RDBStorage

    storage = trial.study._storage
    backend = getattr(storage, "_backend", storage)  # optuna.storages._CachedStorage wraps RDB
    system = system or {}
    if isinstance(backend, RDBStorage) and hasattr(backend, "_set_trial_attr_without_commit"):
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        dialect = backend.engine.name
        with _create_scoped_session(backend.scoped_session, True) as session:
            if dialect not in ("sqlite", "postgresql"):
                for model, items in (
                    (models.TrialUserAttributeModel, attrs),
                    (models.TrialSystemAttributeModel, system),
                ):
                    for key, value in items.items():
                        backend._set_trial_attr_without_commit(session, model, trial._trial_id, key, value)
            else:  # one check that the trial is still running, then one upsert of every attribute
                row = models.TrialModel.find_or_raise_by_id(trial._trial_id, session)
                backend.check_trial_is_updatable(trial._trial_id, row.state)  # type: ignore[arg-type]
                for model, items in (
                    (models.TrialUserAttributeModel, attrs),
                    (models.TrialSystemAttributeModel, system),
                ):
                    if items:
                        _upsert(session, _dialect_insert(dialect)(model), trial._trial_id, items)
        trial._cached_frozen_trial.user_attrs.update(attrs)  # as Trial.set_user_attr keeps it
        return
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    for key, value in system.items():
        storage.set_trial_system_attr(trial._trial_id, key, value)


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


def config_of(trial: optuna.trial.FrozenTrial) -> TrialConfig:
    """The configuration a trial ran (from the user_attrs :func:`record_driver` wrote)."""
    names = field_names()
    return TrialConfig.from_dict({n: trial.user_attrs[n] for n in names if n in trial.user_attrs})


def record_driver(trial: optuna.Trial, config: TrialConfig, attempt: int) -> None:
    """Tag a just-asked trial with its configuration and the process that runs it."""
    import psutil

    me = psutil.Process()
    set_user_attrs(
        trial,
        {
            "driver": {"host": socket.gethostname(), "pid": os.getpid(), "start": me.create_time()},
            "attempt": attempt,
            "config_key": config.key(),
            **config.to_dict(),
        },
    )


def record_outcome(
    study: optuna.Study, trial: optuna.Trial, measurement: Measurement, *, retry: bool = False
) -> str:
    """Write ``measurement`` into ``trial`` and finish it; returns the status written."""
    import optuna

    attrs: dict[str, Any] = {
        "is_valid": measurement.is_valid,
        "wall_seconds": round(measurement.wall_seconds, 3),
    }
    attrs.update({k: v for k, v in measurement.extra.items()})
    if measurement.error:
        attrs["error"] = measurement.error[:MAX_ERROR_CHARS]
    if measurement.properties is not None:
        attrs.update(measurement.properties.to_dict())
    outcome = measurement.outcome
    status = "retry" if outcome is Outcome.FAILED and retry else outcome.value
    attrs["status"] = status
    feasible = outcome is Outcome.OK
    failed = outcome is Outcome.FAILED
    set_user_attrs(trial, attrs, system=None if failed else feasibility(0.0 if feasible else 1.0))
    if failed:
        write_trial_note(study, trial, study.tell(trial, state=optuna.trial.TrialState.FAIL))
        return status
    properties = measurement.properties if feasible else None
    gpus = int(trial.user_attrs.get("number_gpus", 1))
    model = trial.user_attrs.get("gpu_model")  # where the study searches the GPU model
    values = trial_values(
        study, properties, number_gpus=gpus, gpu_model=model if isinstance(model, str) else None
    )
    write_trial_note(study, trial, study.tell(trial, values))
    return status
