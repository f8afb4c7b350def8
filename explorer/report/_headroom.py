"""How close a trial came to its memory limit, and the flag on a winner that came too close.

A trial's headroom is ``1 - peak_memory_gib / memory_limit_gib`` (:func:`memory_headroom`), from
the raw figures it stored (the limit: the study's ``device_memory_gib`` cap, else the device's
memory; a trial stored without a limit takes the study's cap). A winner whose headroom is below
the study's ``memory_margin`` (5% by default) is flagged by ``explorer best``, ``report`` and
``plan``, with the best configuration that leaves the margin beside it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from explorer.measurement import memory_headroom
from explorer.record import TrialRecord

if TYPE_CHECKING:
    import optuna

__all__ = ["MemoryFlag", "memory_flag", "trial_headroom", "trial_memory"]


def _number(value: object) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None  # type: ignore[arg-type]


def trial_memory(
    trial: optuna.trial.FrozenTrial, cap_gib: float | None = None
) -> tuple[float | None, float | None]:
    """(peak, limit) in GiB as ``trial`` stored them; the limit falls back to ``cap_gib``."""
    record = TrialRecord.of(trial)
    return _number(record.peak_memory_gib), _number(record.memory_limit_gib) or cap_gib


def trial_headroom(trial: optuna.trial.FrozenTrial, cap_gib: float | None = None) -> float | None:
    """``trial``'s headroom, recomputed from its stored peak and limit (``None``: not known)."""
    return memory_headroom(*trial_memory(trial, cap_gib))


@dataclass(frozen=True)
class MemoryFlag:
    """A winner within ``margin`` of its memory limit, and the best trial that leaves the margin."""

    trial: optuna.trial.FrozenTrial
    headroom: float
    margin: float
    peak_gib: float
    limit_gib: float
    alternative: optuna.trial.FrozenTrial | None
    """The best-ranked trial whose headroom is at least ``margin`` (``None``: none measured)."""
    alternative_headroom: float | None

    def lines(self) -> list[str]:
        """What best, report and plan print: the flag, and the configuration with headroom."""
        from explorer.study import config_of, describe
        from explorer.study._objectives import objective_value

        lines = [
            f"near the memory limit: trial {self.trial.number} peaked at {self.peak_gib:.3f} of "
            f"{self.limit_gib:.3f} GiB (headroom {100 * self.headroom:.1f}%, under the "
            f"{100 * self.margin:g}% memory_margin): the real run may run out of memory"
        ]
        alt = self.alternative
        if alt is None or self.alternative_headroom is None:
            return [*lines, f"  with headroom: no measured configuration leaves {100 * self.margin:g}%"]
        top, value = objective_value(self.trial) or 0.0, objective_value(alt) or 0.0
        behind = f" ({100 * (value / top - 1):+.1f}%)" if top else ""
        return [
            *lines,
            f"  with headroom: trial {alt.number}, {value:.1f}{behind}, headroom "
            f"{100 * self.alternative_headroom:.1f}%: {describe(config_of(alt))}",
        ]


def memory_flag(
    ranking: Sequence[optuna.trial.FrozenTrial], *, margin: float, cap_gib: float | None = None
) -> MemoryFlag | None:
    """The flag on ``ranking[0]`` (best first) when its headroom is below ``margin``, else ``None``."""
    if not ranking:
        return None
    best = ranking[0]
    peak, limit = trial_memory(best, cap_gib)
    headroom = memory_headroom(peak, limit)
    if headroom is None or peak is None or limit is None or headroom >= margin:
        return None
    alternative = next((t for t in ranking[1:] if (trial_headroom(t, cap_gib) or -1.0) >= margin), None)
    return MemoryFlag(
        trial=best,
        headroom=headroom,
        margin=margin,
        peak_gib=peak,
        limit_gib=limit,
        alternative=alternative,
        alternative_headroom=trial_headroom(alternative, cap_gib) if alternative is not None else None,
    )
