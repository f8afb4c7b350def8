"""The names a trial's and a study's record are stored under in Optuna, and a trial's statuses.

Stored studies keep these spellings: a key renamed here would leave every older study unread.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CONSTRAINTS_KEY", "COUNTED", "Key", "Status", "StudyKey"]


class Status:
    """What became of a trial (its ``status``)."""

    OK: Final = "ok"
    """Measured: it ran and fit."""
    OOM: Final = "oom"
    """Ran out of memory (measured, or inferred from a measured OOM)."""
    INVALID: Final = "invalid"
    """Cannot run on the study's resources (refused before launch, or by the run)."""
    FAILED: Final = "failed"
    """Failed for good: its retries ran out."""
    RETRY: Final = "retry"
    """A failed attempt that runs again (re-enqueued)."""
    INTERRUPTED: Final = "interrupted"
    """Cut short by Ctrl-C or by its driver's death; runs again on resume."""
    ABANDONED: Final = "abandoned"
    """Asked, never started: the driver that asked died first."""
    SURPLUS: Final = "surplus"
    """A re-run nobody needed: the study had counted its ``n_trials`` when it came up."""


COUNTED: Final = frozenset({Status.OK, Status.OOM, Status.INVALID, Status.FAILED})
"""The statuses that count towards ``n_trials`` (unless the answer was free: reused, inferred)."""


class Key:
    """The keys of a trial's record (besides every configuration field and measured property,
    each stored under its own name)."""

    STATUS: Final = "status"
    ERROR: Final = "error"
    IS_VALID: Final = "is_valid"
    WALL_SECONDS: Final = "wall_seconds"
    ATTEMPT: Final = "attempt"
    """Which attempt of its configuration the trial is (0: the first)."""
    DRIVER: Final = "driver"
    """The explorer process running the trial: ``{"host", "pid", "start"}``."""
    CONFIG_KEY: Final = "config_key"
    PROPOSED_BY: Final = "proposed_by"
    """Who enqueued it (``frontier``, ``start``, ``model``, ...); absent: the sampler."""
    REUSED_FROM: Final = "reused_from"
    """The trial whose measurement of the same configuration answered it, without running."""
    REUSED_FROM_STORE: Final = "reused_from_store"
    """``{"study", "trial"}`` of the measurement store's answer (counted as if measured)."""
    INFERRED_FROM: Final = "inferred_from"
    """The measured OOM trial it was inferred OOM from, without running."""
    REQUEUED_FROM: Final = "requeued_from"
    """The trial whose configuration it runs again."""
    REQUEUED_WHY: Final = "requeued_why"
    RECOVERED: Final = "recovered"
    """Recorded on resume from the write-ahead file its dead driver left."""
    INJECTED_FAULT: Final = "injected_fault"
    WAITS_FOR: Final = "waits_for"
    """The trial of another driver measuring the same configuration, which will answer it."""
    LOG_FILE: Final = "log_file"
    NODES: Final = "nodes"
    RANKS: Final = "ranks"
    DEVICE: Final = "device"
    NUMBER_GPUS: Final = "number_gpus"
    GPU_MODEL: Final = "gpu_model"
    PER_GPU: Final = "dataset_tokens_per_second_per_gpu"
    """Measured dataset tokens per second per GPU (the default objective)."""
    TOTAL: Final = "dataset_tokens_per_second"
    """Measured dataset tokens per second, all GPUs together."""
    PEAK_MEMORY_GIB: Final = "peak_memory_gib"
    MEMORY_LIMIT_GIB: Final = "memory_limit_gib"
    MFU: Final = "mfu"
    STEP_TIME_MEAN: Final = "step_time_mean"
    STEP_TIME_REL_CI: Final = "step_time_rel_ci"
    TRAINER: Final = "trainer"
    """The trainer that measured: ``{"name"`` (``transformers`` or ``trl``), ``"version"``,
    ``"class"}``; under TRL also how its batches were made (``padding_free``, ``packing``,
    ``max_length``, ``pad_to_multiple_of``)."""


class StudyKey:
    """The keys of a study's record."""

    IDENTITY: Final = "identity"
    """The job the study measures (:func:`explorer.store.job_identity`)."""
    RUN_FOLDER: Final = "run_folder"
    """The absolute path of the study's run folder."""
    N_TRIALS: Final = "n_trials"
    """The ``n_trials`` the last ``optimize`` run used (the file's, or ``--n-trials``)."""
    STOPPED_EARLY: Final = "stopped_early"
    """``{"counted", "why"}``: why the last run ended short of ``n_trials`` (``None``: it did not)."""
    SETTINGS: Final = "objective_settings"
    """The prices, token budget and GPU model the objectives are computed with."""
    DOCTOR: Final = "doctor"
    """``explorer doctor``'s findings: invalid values by node type."""
    CONFIRMATION: Final = "confirmation"
    """The last confirmation of the best (:mod:`explorer.study._confirm`): ``{"verdict"``
    (``confirmed`` or ``tied``), ``"best"``, ``"tied"``, ``"within"``, ``"recommended"``, ``"why"``,
    ``"counted"`` (the counted trials it judged), ``"candidates"``, ``"measurements"`` (each
    ``{"trial", "job", "status", "value", "gpu_seconds"}``: a re-measurement of that trial's
    configuration, run as launcher job ``job``; never a trial of the study), ``"gpu_seconds"``,
    ``"budget_gpu_s"``, ``"rounds"}``."""


CONSTRAINTS_KEY: Final = "constraints"
"""The trial system attribute that holds a trial's constraint values as a list, > 0 infeasible
(``optuna.study._constrained_optimization._CONSTRAINTS_KEY``). Optuna's samplers read it as the
constraint named ``"0"``; optuna-dashboard (0.21) reads only this form, not the per-key
``constraints:<name>`` that ``Trial.set_constraint`` writes."""
