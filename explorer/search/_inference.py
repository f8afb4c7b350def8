"""OOM inference: a configuration that needs at least the memory of a known OOM is infeasible.

Per-device memory grows monotonically along some axes when everything else is held equal:

* a larger per-device batch (``batch_size // number_gpus``);
* a longer ``model_max_length``;
* activation checkpointing off rather than on;
* less sharding, within one FSDP version: FULL_SHARD < SHARD_GRAD_OP < NO_SHARD;
* fewer GPUs when parameters, gradients or optimizer state are sharded (FULL_SHARD, SHARD_GRAD_OP).

``a`` *dominates* ``b`` when it is at least as hungry along every axis and equal in everything
else (backend, FSDP version, LoRA rank, optimizer, compile, gradient accumulation, nodes). DDP
and single-process trials replicate the model, so their GPU count does not matter. HYBRID_SHARD is
compared only with itself. If ``b`` ran out of memory, so will ``a``; the mirror case (``b``
fitted and dominates ``a``) says that ``a`` fits, which :func:`fits_by_dominance` reports but the
study still measures.
"""

from __future__ import annotations

from collections.abc import Iterable

from explorer.trial_config import TrialConfig

__all__ = ["fits_by_dominance", "inferred_oom", "memory_dominates"]

_SHARDING = {"FULL_SHARD": 0, "SHARD_GRAD_OP": 1, "NO_SHARD": 2}
_EQUAL = (
    "distributed_backend",
    "fsdp_version",
    "lora_r",
    "optim",
    "torch_compile",
    "gradient_accumulation_steps",
    "number_nodes",
)


def memory_dominates(a: TrialConfig, b: TrialConfig) -> bool:
    """Whether ``a`` needs at least as much memory per device as ``b``."""
    if any(getattr(a, name) != getattr(b, name) for name in _EQUAL):
        return False
    if a.per_device_batch_size < b.per_device_batch_size or a.model_max_length < b.model_max_length:
        return False
    if a.gradient_checkpointing and not b.gradient_checkpointing:
        return False
    if a.distributed_backend != "FSDP":
        return True
    sa, sb = a.fsdp_sharding_strategy or "FULL_SHARD", b.fsdp_sharding_strategy or "FULL_SHARD"
    if "HYBRID_SHARD" in (sa, sb):
        return sa == sb and a.number_gpus == b.number_gpus
    if _SHARDING[sa] < _SHARDING[sb]:
        return False
    sharded = _SHARDING[sa] < _SHARDING["NO_SHARD"]
    return not sharded or a.number_gpus <= b.number_gpus


def inferred_oom(config: TrialConfig, ooms: Iterable[tuple[int, TrialConfig]]) -> int | None:
    """The number of a trial that ran out of memory and that ``config`` dominates, if any."""
    for number, oom in ooms:
        if memory_dominates(config, oom):
            return number
    return None


def fits_by_dominance(config: TrialConfig, fitted: Iterable[tuple[int, TrialConfig]]) -> int | None:
    """The number of a trial that fitted and dominates ``config`` (so ``config`` fits), if any."""
    for number, ok in fitted:
        if memory_dominates(ok, config):
            return number
    return None
