"""How a trial's outcome is written into Optuna: values, constraint, state and its record
(:mod:`explorer.record`).

* ok: COMPLETE, value = dataset_tokens_per_second_per_gpu, constraint 0 (feasible).
* oom / invalid: COMPLETE with the placeholder value 0.0 and constraint 1 (infeasible), so that
  TPE and GP learn from it (a FAIL would be ignored and resampled; GP reads COMPLETE trials only).

The constraint is written as Optuna's list form, the trial system attribute ``constraints``
(:data:`~explorer.record.CONSTRAINTS_KEY`): Optuna's samplers read it as one constraint, as
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

import os
import socket
from typing import TYPE_CHECKING, Any

from explorer.measurement import Measurement, Outcome
from explorer.record import (
    CONSTRAINTS_KEY,
    COUNTED,
    Key,
    Status,
    TrialRecord,
    answered_without_running,
    counts,
    infeasibility,
    status_of,
    write,
)
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
    "record_from_store",
    "record_inferred_oom",
    "record_reuse",
    "record_outcome",
    "status_of",
]

MAX_ERROR_CHARS = 2000
REUSED_ATTRS = (Key.STATUS, Key.IS_VALID, Key.ERROR, Key.PER_GPU, Key.PEAK_MEMORY_GIB, Key.MFU)
"""What a reused answer copies from the trial that measured it (besides value and constraint)."""


def frozen(study: optuna.Study, trial: optuna.Trial) -> optuna.trial.FrozenTrial:
    """The stored state of a live trial (one storage read, not the whole study)."""
    return study._storage.get_trial(trial._trial_id)


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
    attrs = TrialRecord.of(source).fields(REUSED_ATTRS)
    write(
        trial,
        {**attrs, Key.REUSED_FROM: source.number, Key.WALL_SECONDS: 0.0},
        system=feasibility(infeasibility(source)),
    )
    write_trial_note(study, trial, study.tell(trial, source.values))
    return str(status_of(source))


def record_from_store(study: optuna.Study, trial: optuna.Trial, stored: StoredMeasurement) -> str:
    """Answer ``trial`` from a stored measurement, as if it had been measured now (every property,
    value and constraint), with ``reused_from_store`` naming the study and trial that measured it
    and ``wall_seconds`` 0. It counts towards ``n_trials``; returns the status written."""
    import dataclasses

    write(trial, {Key.REUSED_FROM_STORE: {"study": stored.study_name, "trial": stored.trial_number}})
    return record_outcome(study, trial, dataclasses.replace(stored.measurement, wall_seconds=0.0))


def record_inferred_oom(study: optuna.Study, trial: optuna.Trial, source: int) -> str:
    """Record ``trial`` as OOM without running it: it dominates trial ``source``, which ran out of
    memory. It does not count towards ``n_trials``."""
    write(
        trial,
        {
            Key.INFERRED_FROM: source,
            Key.WALL_SECONDS: 0.0,
            Key.IS_VALID: 0,
            Key.STATUS: Status.OOM,
            Key.ERROR: f"inferred: needs at least the memory of trial {source}, which ran out",
        },
        system=feasibility(1.0),
    )
    values = trial_values(study, None, number_gpus=TrialRecord.of(trial).number_gpus)
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


def config_of(trial: optuna.trial.FrozenTrial) -> TrialConfig:
    """The configuration a trial ran (from the record :func:`record_driver` wrote)."""
    return TrialConfig.from_dict(TrialRecord.of(trial).fields(field_names()))


def record_driver(trial: optuna.Trial, config: TrialConfig, attempt: int) -> None:
    """Tag a just-asked trial with its configuration and the process that runs it."""
    import psutil

    me = psutil.Process()
    write(
        trial,
        {
            Key.DRIVER: {"host": socket.gethostname(), "pid": os.getpid(), "start": me.create_time()},
            Key.ATTEMPT: attempt,
            Key.CONFIG_KEY: config.key(),
            **config.to_dict(),
        },
    )


def record_outcome(
    study: optuna.Study, trial: optuna.Trial, measurement: Measurement, *, retry: bool = False
) -> str:
    """Write ``measurement`` into ``trial`` and finish it; returns the status written."""
    import optuna

    attrs: dict[str, Any] = {
        Key.IS_VALID: measurement.is_valid,
        Key.WALL_SECONDS: round(measurement.wall_seconds, 3),
    }
    attrs.update({k: v for k, v in measurement.extra.items()})
    if measurement.error:
        attrs[Key.ERROR] = measurement.error[:MAX_ERROR_CHARS]
    if measurement.properties is not None:
        attrs.update(measurement.properties.to_dict())
    outcome = measurement.outcome
    status = Status.RETRY if outcome is Outcome.FAILED and retry else outcome.value
    attrs[Key.STATUS] = status
    feasible = outcome is Outcome.OK
    failed = outcome is Outcome.FAILED
    write(trial, attrs, system=None if failed else feasibility(0.0 if feasible else 1.0))
    if failed:
        write_trial_note(study, trial, study.tell(trial, state=optuna.trial.TrialState.FAIL))
        return status
    properties = measurement.properties if feasible else None
    record = TrialRecord.of(trial)  # gpu_model: where the study searches the GPU model
    values = trial_values(study, properties, number_gpus=record.number_gpus, gpu_model=record.gpu_model)
    write_trial_note(study, trial, study.tell(trial, values))
    return status
