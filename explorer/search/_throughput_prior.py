"""The throughput prior: which configuration should be at least as fast per GPU as another.

Dataset tokens per second *per GPU* can only lose from work that a single device does not do.
With everything else equal, the same per-device batch and the same sequence length, ``a`` is
expected at least as fast per GPU as ``b`` when it has:

* no more GPUs (and nodes): more of them only add communication; one GPU beats any backend;
* activation checkpointing off where ``b`` has it on (checkpointing recomputes the forward);
* no more sharding, within one backend and FSDP version: NO_SHARD >= SHARD_GRAD_OP >= FULL_SHARD
  (each step down adds a gather of the parameters). HYBRID_SHARD is compared only with itself.

These are the memory axes of :mod:`explorer.search._inference` turned around: what saves memory
costs time. Each knob declares its role in :mod:`explorer.knobs` (``speed``; a knob without one
is compared only at the same value); this module only combines them. The batch size is not an axis: a larger per-device batch is usually, not always,
faster (on the CPU table batch 32 is slower than 16 and 64).

Local search uses it as a ceiling: a neighbour that a measured configuration dominates cannot be
expected to beat that configuration's value, so if that value is below 98% of the best, the
neighbour goes after the others. It is never skipped: the prior is a rule of thumb, and a
measurement varies by a few percent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from explorer.knobs import Axis, knobs
from explorer.trial_config import TrialConfig

__all__ = ["Ceilings", "throughput_dominates"]


def _group(c: TrialConfig) -> tuple[object, ...]:
    """What two configurations must share to be compared: every knob without a speed order (one
    dominates another only within its group)."""
    return tuple(k.compared(c) for k in knobs() if isinstance(k.speed, Axis) and k.speed.kind == "equal")


def throughput_dominates(a: TrialConfig, b: TrialConfig) -> bool:
    """Whether ``a`` is expected at least as fast per GPU as ``b``: along every knob's speed
    role (:attr:`explorer.knobs.Knob.speed`), ``a`` is at least ``b``."""
    return all(k.speed_at_least(a, b) for k in knobs())


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
