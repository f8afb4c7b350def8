"""The persistent Optuna study: storage, sampler, recording outcomes, resume, and the optimize loop."""

from explorer.study._optimize import OptimizeResult, describe, open_study, optimize
from explorer.study._record import (
    COUNTED,
    OBJECTIVE,
    config_of,
    counted_trials,
    record_outcome,
    status_of,
)
from explorer.study._recover import reclaim_interrupted
from explorer.study._storage import mask_url, open_storage

__all__ = [
    "COUNTED",
    "OBJECTIVE",
    "OptimizeResult",
    "config_of",
    "counted_trials",
    "describe",
    "mask_url",
    "open_storage",
    "open_study",
    "optimize",
    "reclaim_interrupted",
    "record_outcome",
    "status_of",
]
