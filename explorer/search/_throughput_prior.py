"""The throughput prior: which configuration should be at least as fast per GPU as another.

Dataset tokens per second *per GPU* can only lose from work that a single device does not do.
With everything else equal, the same per-device batch and the same sequence length, ``a`` is
expected at least as fast per GPU as ``b`` when it has:

* no more GPUs (and nodes): more of them only add communication; one GPU beats any backend;
* activation checkpointing off where ``b`` has it on (checkpointing recomputes the forward);
* no more sharding, within one backend and FSDP version: NO_SHARD >= SHARD_GRAD_OP >= FULL_SHARD
  (each step down adds a gather of the parameters). HYBRID_SHARD is compared only with itself.

These are the memory axes of :mod:`explorer.search._inference` turned around: what saves memory
costs time. The batch size is not an axis: a larger per-device batch is usually, not always,
faster (on the CPU table batch 32 is slower than 16 and 64).

Local search uses it as a ceiling: a neighbour that a measured configuration dominates cannot be
expected to beat that configuration's value, so if that value is below 98% of the best, the
neighbour goes after the others. It is never skipped: the prior is a rule of thumb, and a
measurement varies by a few percent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from explorer.trial_config import TrialConfig

__all__ = ["Ceilings", "throughput_dominates"]

_EQUAL = ("model_max_length", "lora_r", "optim", "torch_compile", "gradient_accumulation_steps")
_SHARDING = {"FULL_SHARD": 0, "SHARD_GRAD_OP": 1, "NO_SHARD": 2}


def _group(c: TrialConfig) -> tuple[object, ...]:
    """What two configurations must share to be compared."""
    return (c.per_device_batch_size, *(getattr(c, name) for name in _EQUAL))


def throughput_dominates(a: TrialConfig, b: TrialConfig) -> bool:
    """Whether ``a`` is expected at least as fast per GPU as ``b`` (see the module docstring)."""
    if _group(a) != _group(b):
        return False
    if a.gradient_checkpointing and not b.gradient_checkpointing:
        return False
    if a.number_gpus > b.number_gpus or a.number_nodes > b.number_nodes:
        return False
    if a.number_gpus == 1:
        return True
    if a.distributed_backend != b.distributed_backend or a.fsdp_version != b.fsdp_version:
        return False
    if a.distributed_backend != "FSDP":
        return True
    sa, sb = a.fsdp_sharding_strategy or "FULL_SHARD", b.fsdp_sharding_strategy or "FULL_SHARD"
    if "HYBRID_SHARD" in (sa, sb):
        return sa == sb
    return _SHARDING[sa] >= _SHARDING[sb]


@dataclass
class Ceilings:
    """Measured feasible configurations, grouped so that a ceiling looks only at comparable ones."""

    _groups: dict[tuple[object, ...], list[tuple[TrialConfig, float]]] = field(default_factory=dict)

    @classmethod
    def of(cls, feasible: Iterable[tuple[TrialConfig, float]]) -> Ceilings:
        ceilings = cls()
        for config, value in feasible:
            ceilings._groups.setdefault(_group(config), []).append((config, value))
        return ceilings

    def ceiling(self, c: TrialConfig) -> float | None:
        """The lowest value of a measured configuration that dominates ``c`` (``None``: none does)."""
        values = [v for a, v in self._groups.get(_group(c), ()) if throughput_dominates(a, c)]
        return min(values, default=None)
