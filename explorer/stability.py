"""Repeating one configuration: the seeds' stability fractions and the spread of its throughput."""

from __future__ import annotations

import math
from dataclasses import dataclass

from explorer.measurement import Measurement, Outcome

__all__ = ["Stability", "summarize"]


@dataclass(frozen=True)
class Stability:
    """Over ``n`` repeats (ado's ``finetune_full_stability`` names)."""

    n: int
    f_gpu_oom: float
    """Share of repeats that ran out of device memory."""
    f_other_error: float
    """Share that failed for any other reason."""
    f_no_error: float
    """Share that completed."""
    mean: float
    """Mean dataset_tokens_per_second_per_gpu of the completed repeats (0.0 if none)."""
    cv: float
    """Coefficient of variation (sample sd / mean) of that throughput (0.0 with fewer than 2)."""


def summarize(measurements: list[Measurement]) -> Stability:
    n = len(measurements)
    if n == 0:
        raise ValueError("no measurements")
    ok = [m.properties.dataset_tokens_per_second_per_gpu for m in measurements if m.properties is not None]
    oom = sum(m.outcome is Outcome.OOM for m in measurements)
    other = sum(m.outcome is Outcome.FAILED for m in measurements)
    mean = sum(ok) / len(ok) if ok else 0.0
    sd = math.sqrt(sum((x - mean) ** 2 for x in ok) / (len(ok) - 1)) if len(ok) > 1 else 0.0
    return Stability(
        n=n,
        f_gpu_oom=oom / n,
        f_other_error=other / n,
        f_no_error=len(ok) / n,
        mean=mean,
        cv=sd / mean if mean > 0 else 0.0,
    )
