"""``workload.training_arguments``: extra ``TrainingArguments`` a study passes to every trial.

A study may set any field of transformers' ``TrainingArguments`` that explorer does not decide
itself. explorer decides the fields that carry a trial's configuration (each knob's keyword, the
batch, the backend, sharding, checkpointing, precision and Liger: :mod:`explorer.settings`) and those the measurement relies on
(``max_steps``, no saving, no logging, no reporting): setting one of those is an error naming the
knob or the reason, so that a study never measures something other than what it records.
"""

from __future__ import annotations

import tempfile
from typing import Any

from explorer.errors import SpecError, did_you_mean
from explorer.knobs import knobs

__all__ = ["RESERVED", "check_training_arguments", "reserved_reason"]

_DECIDED_BY_TRIAL = (
    "per_device_train_batch_size",
    "bf16",
    "fp16",
    "use_cpu",
    "ddp_backend",
    "ddp_find_unused_parameters",
    "fsdp",
    "fsdp_config",
    "gradient_checkpointing",
    "gradient_checkpointing_kwargs",
    "activation_checkpointing",
    "activation_checkpointing_kwargs",
    "use_liger_kernel",
)
_DECIDED_BY_MEASUREMENT = (
    "output_dir",
    "max_steps",
    "num_train_epochs",
    "save_strategy",
    "logging_strategy",
    "report_to",
    "disable_tqdm",
)
RESERVED: dict[str, str] = {
    **{k: "set from the trial's configuration" for k in _DECIDED_BY_TRIAL},
    **{k: "set by the measurement (its step budget, no saving or logging)" for k in _DECIDED_BY_MEASUREMENT},
}
"""``TrainingArguments`` fields a study cannot pass through, with the reason (besides every
knob's own keyword, :func:`reserved_reason`)."""


def reserved_reason(key: str) -> str | None:
    """Why a study cannot set ``TrainingArguments.<key>``, or ``None`` if it may."""
    knob = next((k for k in knobs() if k.training_args == key), None)
    if knob is not None:
        return f"it is the knob {knob.name}: set it in the search space"
    return RESERVED.get(key)


def check_training_arguments(values: dict[str, Any], *, file: str) -> None:
    """Refuse an unknown ``TrainingArguments`` field, a field explorer decides, or a value
    transformers rejects, in one line. Imports transformers (about 2 s)."""
    from transformers import TrainingArguments

    field = "workload.training_arguments"
    names = TrainingArguments.__dataclass_fields__
    for key in values:
        if key not in names:
            hint = did_you_mean(key, names)
            raise SpecError(file=file, field=f"{field}.{key}", problem=f"not a TrainingArguments field{hint}")
        reason = reserved_reason(key)
        if reason:
            raise SpecError(file=file, field=f"{field}.{key}", problem=f"explorer decides it: {reason}")
    with tempfile.TemporaryDirectory(prefix="explorer-check-") as tmp:
        try:
            TrainingArguments(output_dir=tmp, use_cpu=True, report_to="none", **values)
        except (ValueError, TypeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SpecError(
                file=file, field=field, problem=f"TrainingArguments refuses it: {first}"
            ) from None
