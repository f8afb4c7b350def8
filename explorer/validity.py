"""The seeds' is_valid rules, checked before anything is launched.

A configuration that breaks one is recorded as infeasible (``invalid``) with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from explorer.record import StudyKey
from explorer.spec import ResourcesSpec
from explorer.trial_config import TrialConfig

if TYPE_CHECKING:
    from explorer.space import SearchSpace

__all__ = [
    "DOCTOR_ATTR",
    "attach_findings",
    "doctor_reason",
    "invalid_reason",
    "invalid_reasons",
    "nothing_runs",
]

DOCTOR_ATTR = StudyKey.DOCTOR
"""The study's record key where ``explorer doctor`` records what each node type cannot run:
``{"invalid": {gpu_model: {knob: {json(value): reason}}}, "nodes": {gpu_model: {...}}}``."""
_FINDINGS = "_explorer_doctor_findings"


def attach_findings(resources: ResourcesSpec, recorded: Mapping[str, Any] | None) -> None:
    """Make :func:`invalid_reason` on ``resources`` (this very object) also refuse what
    ``explorer doctor`` recorded (``recorded``: the study's :data:`DOCTOR_ATTR`).

    The findings live in the study's storage, not in the study file, yet every validity check of a
    run (the loop's, the local search's, the proposals') is made on the study's ``resources``: so
    ``optimize`` attaches them there once, as a plain attribute outside the model's fields (never
    dumped, compared or sent to a trial)."""
    object.__setattr__(resources, _FINDINGS, recorded or None)


def nothing_runs(space: SearchSpace, resources: ResourcesSpec) -> str | None:
    """Why no configuration of ``space`` may run on ``resources`` (``explorer doctor``'s findings
    attached), or ``None`` when one may: the knobs whose every value the doctor found failing,
    and how to clear that."""
    if any(invalid_reason(c, resources) is None for c in space.enumerate()):
        return None
    model = resources.model
    found = (getattr(resources, _FINDINGS, None) or {}).get("invalid", {}).get(model, {})
    blocked = [
        f"{name} ({next(iter(found[name].values()))})"
        for name, domain in space.domains.items()
        if name in found and all(json.dumps(v) in found[name] for v in domain.values)
    ]
    if blocked:
        return (
            f"no configuration can run on {model}: explorer doctor found every value of "
            + "; of ".join(blocked)
            + " failing; once the node is fixed, run explorer doctor again (its findings replace these)"
        )
    return f"no configuration can run on {model}: each breaks a validity rule or a value explorer doctor found failing"


def invalid_reason(config: TrialConfig, resources: ResourcesSpec) -> str | None:
    """Why ``config`` cannot run on ``resources`` (the first rule it breaks), or ``None`` if it may.

    Rules from ado's SFTTrainer (seed 001, "Validation"), plus the limits of what FSDP2 can express
    (its sharding strategies; an optimizer whose states are not DTensors).
    """
    return next(invalid_reasons(config, resources), None)


def invalid_reasons(config: TrialConfig, resources: ResourcesSpec) -> Iterator[str]:
    """Every rule of :func:`invalid_reason` that ``config`` breaks, in order."""
    if config.batch_size < 1:
        yield "batch_size is less than 1"
    if config.number_nodes < 1:
        yield "number_nodes is less than 1"
        return  # the rules below divide by it
    if config.number_gpus % config.number_nodes:
        yield f"number_gpus {config.number_gpus} is not divisible by number_nodes {config.number_nodes}"
    if config.batch_size % config.number_gpus:
        yield f"batch_size {config.batch_size} is not divisible by number_gpus {config.number_gpus}"
    if config.number_gpus > 0 and not resources.gpu_model:
        yield "gpu_model is empty"
    if resources.gpu_models and resources.gpus_of(config.gpu_model) == 0:
        yield f"gpu_model {config.gpu_model} is not one of resources.gpu_models"
    if resources.gpu_models and config.number_gpus > resources.gpus_of(config.gpu_model):
        model = resources.model_of(config.gpu_model)
        yield f"number_gpus {config.number_gpus} exceeds the {resources.gpus_of(model)} GPUs of {model}"
    if config.number_gpus > resources.total_gpus:
        yield f"number_gpus {config.number_gpus} exceeds the {resources.total_gpus} GPUs of the resources"
    if config.number_nodes > resources.nodes:
        yield f"number_nodes {config.number_nodes} exceeds the {resources.nodes} nodes of the resources"
    if config.number_gpus // config.number_nodes > resources.gpus_per_node:
        yield (
            f"{config.number_gpus // config.number_nodes} GPUs per node exceeds "
            f"gpus_per_node {resources.gpus_per_node}"
        )
    if config.number_gpus == 1 and config.distributed_backend == "FSDP" and not config.fsdp_cpu_offload:
        yield (
            "FSDP on one GPU only with fsdp_cpu_offload: without it one GPU holds what one "
            "process does, plus FSDP's gathers"
        )
    if config.fsdp_version == 2 and config.fsdp_sharding_strategy in ("NO_SHARD", "HYBRID_SHARD"):
        yield (
            f"FSDP2 has no {config.fsdp_sharding_strategy}: accelerate's FSDP2 only reshards "
            "after forward (FULL_SHARD) or not (SHARD_GRAD_OP)"
        )
    if config.fsdp_version == 2 and config.optim == "adafactor":
        yield (
            "optim adafactor cannot run under FSDP2: transformers' Adafactor keeps its factored "
            "second moments as plain tensors, which FSDP2's sharded (DTensor) parameters refuse"
        )
    if config.fsdp_version == 2 and config.optim == "adamw_bnb_8bit":
        yield (
            "optim adamw_bnb_8bit cannot run under FSDP2: bitsandbytes' 8-bit AdamW steps on FSDP2's "
            "sharded (DTensor) parameters end in an illegal memory access (bitsandbytes#1633, open)"
        )
    found = doctor_reason(config, getattr(resources, _FINDINGS, None), resources)
    if found:
        yield found


def doctor_reason(
    config: TrialConfig, recorded: Mapping[str, Any] | None, resources: ResourcesSpec
) -> str | None:
    """Why ``config`` cannot run: ``explorer doctor`` found one of its values failing (or not
    importable) on the node type it runs on (``recorded``: the study's :data:`DOCTOR_ATTR`)."""
    if not recorded:
        return None
    model = resources.model_of(config.gpu_model)
    for name, values in recorded.get("invalid", {}).get(model, {}).items():
        value = config.to_dict().get(name)
        reason = values.get(json.dumps(value))
        if reason:
            return f"explorer doctor found {name}={value} failing on {model}: {reason}"
    return None
