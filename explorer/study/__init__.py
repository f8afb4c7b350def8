"""The persistent Optuna study: storage, recording outcomes, resume, several drivers, and the
optimize loop (which asks :mod:`explorer.search` what to try)."""

from explorer.study._audit import Audit, audit
from explorer.study._confirm import named_best, verdict_lines
from explorer.study._identity import check_same_job
from explorer.study._optimize import OptimizeResult, describe, open_existing_study, open_study, optimize
from explorer.study._record import (
    COUNTED,
    OBJECTIVE,
    answered_without_running,
    config_of,
    counted_trials,
    record_outcome,
    status_of,
)
from explorer.study._recover import Reclaimed, reclaim_interrupted
from explorer.study._run_folder import check_writable, recorded_run_folder
from explorer.study._storage import is_read_only, load_readonly, open_storage, readonly_url
from explorer.study._utilization import Utilization, slots_of, study_utilization, utilization

__all__ = [
    "check_same_job",
    "Audit",
    "COUNTED",
    "OBJECTIVE",
    "OptimizeResult",
    "Utilization",
    "answered_without_running",
    "audit",
    "config_of",
    "counted_trials",
    "describe",
    "is_read_only",
    "load_readonly",
    "named_best",
    "open_storage",
    "readonly_url",
    "open_existing_study",
    "open_study",
    "optimize",
    "Reclaimed",
    "reclaim_interrupted",
    "record_outcome",
    "check_writable",
    "recorded_run_folder",
    "slots_of",
    "status_of",
    "study_utilization",
    "utilization",
    "verdict_lines",
]
