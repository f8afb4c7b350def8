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
from typing import TYPE_CHECKING, Any

from explorer.errors import SpecError
from explorer.secrets import mask_url
from explorer.spec import LoadedStudy
from explorer.store import job_identity

if TYPE_CHECKING:
    import optuna

__all__ = ["IDENTITY_ATTR", "check_identity", "first_difference"]

IDENTITY_ATTR = "identity"
"""Study user attr: the job the study measures (:func:`explorer.store.job_identity`)."""
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
    stored = study.user_attrs.get(IDENTITY_ATTR)
    if not isinstance(stored, dict):  # a new study, or one stored before identities
        study.set_user_attr(IDENTITY_ATTR, new)
        return
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
