"""The feasible trials ranked best first, each with its measured figures and why it lost to the best.

``explorer best`` picks the same trial (:func:`feasible_ranking`'s first) and calls the trials
within :func:`noise_tolerance` of it its runners-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from explorer.knobs import knobs
from explorer.record import TrialRecord
from explorer.report._headroom import trial_headroom
from explorer.study import answered_without_running, config_of, status_of
from explorer.study._objectives import objective_value, ranking_sign

if TYPE_CHECKING:
    import optuna

    from explorer.trial_config import TrialConfig

__all__ = [
    "MIN_TOLERANCE",
    "RankedTrial",
    "behind_best",
    "differences",
    "feasible_ranking",
    "noise_tolerance",
    "ranked_trials",
]

MIN_TOLERANCE = 0.02
"""Runners-up within this fraction of the best are reported even when the best's CI is tighter."""
MEMORY_TOLERANCE = 0.02
"""Peak memories closer than this fraction count as the same."""


def feasible_ranking(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Measured (status ok) trials, best first; a reused answer is not a second entry, and a trial
    whose stored peak exceeds its stored memory limit (negative headroom) is none: it did not fit."""
    ok = [
        t
        for t in study.get_trials(deepcopy=False)
        if status_of(t) == "ok"
        and objective_value(t) is not None
        and not answered_without_running(t)
        and (trial_headroom(t) or 0.0) >= 0.0
    ]
    sign = ranking_sign(study)
    return sorted(ok, key=lambda t: sign * (objective_value(t) or 0.0), reverse=True)


def noise_tolerance(best: optuna.trial.FrozenTrial) -> float:
    """The larger of :data:`MIN_TOLERANCE` and the best trial's relative step-time CI, if any.

    Args:
        best: A measured trial (its ``step_time_rel_ci`` user attribute may be missing or None).

    Returns:
        A fraction of the best trial's value.
    """
    ci = TrialRecord.of(best).step_time_rel_ci
    return max(MIN_TOLERANCE, ci) if ci is not None else MIN_TOLERANCE


def _number(value: object) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None  # type: ignore[arg-type]


@dataclass(frozen=True)
class RankedTrial:
    """One measured feasible trial, as the report's tables show it.

    Attributes:
        number: The Optuna trial number.
        config: The configuration it ran.
        per_gpu: ``dataset_tokens_per_second_per_gpu``.
        total: ``dataset_tokens_per_second`` (all GPUs), if recorded.
        mfu: Model FLOPs utilisation per device (a fraction), if recorded.
        peak_memory_gib: The largest peak over its processes, if recorded.
        step_time_s: Mean optimizer-step time in the measured window, if recorded.
        step_time_rel_ci: Half-width of the 95% CI of that mean, relative to it, if recorded.
    """

    number: int
    config: TrialConfig
    per_gpu: float
    total: float | None
    mfu: float | None
    peak_memory_gib: float | None
    step_time_s: float | None
    step_time_rel_ci: float | None

    @classmethod
    def of(cls, trial: optuna.trial.FrozenTrial) -> RankedTrial:
        record = TrialRecord.of(trial)
        return cls(
            number=trial.number,
            config=config_of(trial),
            per_gpu=record.per_gpu or 0.0,
            total=_number(record.total),
            mfu=_number(record.mfu),
            peak_memory_gib=_number(record.peak_memory_gib),
            step_time_s=_number(record.step_time_mean),
            step_time_rel_ci=_number(record.step_time_rel_ci),
        )


def ranked_trials(study: optuna.Study) -> list[RankedTrial]:
    """:func:`feasible_ranking` as :class:`RankedTrial` rows, best first."""
    return [RankedTrial.of(t) for t in feasible_ranking(study)]


def differences(config: TrialConfig, best: TrialConfig) -> list[str]:
    """The parameters where ``config`` differs from ``best``, each as ``config``'s short label
    (``bs=16``, ``ckpt=on``, ``FSDP1/FULL_SHARD``; ``name=value`` where a knob shows none)."""
    mine, theirs = config.to_dict(), best.to_dict()
    labels: list[str] = []
    for k in knobs():
        if mine.get(k.name) == theirs.get(k.name):
            continue
        label = k.short(config) or f"{k.name}={mine.get(k.name)}"
        if label not in labels:
            labels.append(label)
    return labels


def _speed_reason(row: RankedTrial, best: RankedTrial, tolerance: float) -> str:
    gap = 1.0 - row.per_gpu / best.per_gpu if best.per_gpu > 0 else 0.0
    if gap > tolerance:
        return f"{100 * gap:.0f}% slower per GPU" if gap >= 0.1 else f"{100 * gap:.1f}% slower per GPU"
    return f"same throughput within noise ({100 * gap:.1f}% below; noise {100 * tolerance:.1f}%)"


def _memory_reason(row: RankedTrial, best: RankedTrial) -> str | None:
    mine, theirs = row.peak_memory_gib, best.peak_memory_gib
    if mine is None or theirs is None or abs(mine - theirs) <= MEMORY_TOLERANCE * max(mine, theirs):
        return None
    more = "more" if mine > theirs else "less"
    return f"{more} memory ({mine:.3g} vs {theirs:.3g} GiB)"


def behind_best(row: RankedTrial, best: RankedTrial, tolerance: float) -> str:
    """Why ``row`` ranks below ``best``, computed: how much slower per GPU (or the same within
    ``tolerance``), the GPUs it uses where they differ, its peak memory where it differs by more
    than :data:`MEMORY_TOLERANCE`, and the parameters that differ."""
    reasons = [_speed_reason(row, best, tolerance)]
    if row.config.number_gpus != best.config.number_gpus:
        reasons.append(f"uses {row.config.number_gpus} GPUs (best: {best.config.number_gpus})")
    memory = _memory_reason(row, best)
    if memory:
        reasons.append(memory)
    diff = differences(row.config, best.config)
    reasons.append("differs: " + ", ".join(diff) if diff else "same configuration")
    return "; ".join(reasons)
