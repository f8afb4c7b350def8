"""A trial's record, and a study's: the statuses and keys explorer stores in Optuna, a typed view
to read them (:meth:`TrialRecord.of`, :meth:`StudyRecord.of`) and the writers. Nothing else in
explorer reads or writes a trial's or a study's user attributes."""

from explorer.record._keys import CONSTRAINTS_KEY, COUNTED, Key, Status, StudyKey
from explorer.record._view import (
    StudyRecord,
    TrialRecord,
    answered_without_running,
    copy_trial,
    counts,
    infeasibility,
    status_of,
)
from explorer.record._write import enqueue, write, write_status, write_study

__all__ = [
    "CONSTRAINTS_KEY",
    "COUNTED",
    "Key",
    "Status",
    "StudyKey",
    "StudyRecord",
    "TrialRecord",
    "answered_without_running",
    "copy_trial",
    "counts",
    "enqueue",
    "infeasibility",
    "status_of",
    "write",
    "write_status",
    "write_study",
]
