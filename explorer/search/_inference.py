"""OOM inference: a configuration that needs at least the memory of a known OOM is infeasible.

Per-device memory grows monotonically along some axes when everything else is held equal:

* a larger per-device batch (``batch_size // number_gpus``);
* a longer ``model_max_length``;
* activation checkpointing off rather than on;
* less sharding, within one FSDP version: FULL_SHARD < SHARD_GRAD_OP < NO_SHARD;
* fewer GPUs when parameters, gradients or optimizer state are sharded (FULL_SHARD, SHARD_GRAD_OP).

``a`` *dominates* ``b`` when it is at least as hungry along every axis and equal in everything
else (backend, FSDP version, LoRA rank, optimizer, compile, gradient accumulation, nodes, and
any knob whose memory direction is unknown). Each knob declares its direction in
:mod:`explorer.knobs` (``memory``); this module only combines them. DDP
and single-process trials replicate the model, so their GPU count does not matter. HYBRID_SHARD is
compared only with itself. If ``b`` ran out of memory, so will ``a``; the mirror case (``b``
fitted and dominates ``a``) says that ``a`` fits, which :func:`fits_by_dominance` reports but the
study still measures.
"""

from __future__ import annotations

from collections.abc import Iterable

from explorer.knobs import knobs
from explorer.trial_config import TrialConfig

__all__ = ["fits_by_dominance", "inferred_oom", "memory_dominates"]


def memory_dominates(a: TrialConfig, b: TrialConfig) -> bool:
    """Whether ``a`` needs at least as much memory per device as ``b``: along every knob's
    memory direction (:attr:`explorer.knobs.Knob.memory`), ``a`` is at least ``b``."""
    return all(k.memory_at_least(a, b) for k in knobs())


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
