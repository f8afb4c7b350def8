"""The study's trials as typed points for the figures: outcome, configuration and measured figures."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from explorer.knobs import knob
from explorer.record import TrialRecord
from explorer.study import config_of

if TYPE_CHECKING:
    import optuna

    from explorer.trial_config import TrialConfig

__all__ = ["Kind", "TrialPoint", "measured_feasible", "points_of", "setting_of", "tokens_per_step"]


class Kind(enum.Enum):
    """How a trial is drawn in the optimization history."""

    FEASIBLE = "feasible (ok)"
    OOM = "infeasible: OOM"
    INFERRED = "infeasible: inferred OOM"
    INVALID = "infeasible: invalid"
    FAILED = "failed"


_KIND_OF_STATUS = {"ok": Kind.FEASIBLE, "oom": Kind.OOM, "invalid": Kind.INVALID, "failed": Kind.FAILED}


@dataclass(frozen=True)
class TrialPoint:
    """One finished trial, as the figures see it.

    Attributes:
        number: The Optuna trial number.
        kind: Its outcome.
        values: Optuna's values (one per study direction); ``None`` for a failed trial.
        config: The configuration it ran, if recorded.
        objective: ``dataset_tokens_per_second_per_gpu`` as measured (NaN unless feasible).
        total: ``dataset_tokens_per_second``, all GPUs together (NaN unless feasible).
        peak_memory_gib: The measured peak memory (NaN when not measured).
        repeat: Answered from an earlier trial of this study (``reused_from``): the same
            configuration again, so never counted twice.
    """

    number: int
    kind: Kind
    values: tuple[float, ...] | None
    config: TrialConfig | None
    objective: float
    total: float
    peak_memory_gib: float
    repeat: bool

    @property
    def measured(self) -> bool:
        """A measurement of its own: neither a repeat nor an inferred OOM."""
        return not self.repeat and self.kind is not Kind.INFERRED


def measured_feasible(points: list[TrialPoint]) -> list[tuple[TrialPoint, TrialConfig]]:
    """The feasible trials that measured a throughput of their own, with their configuration:
    the only points a throughput figure draws (an infeasible or failed trial has no throughput,
    and is never drawn as 0)."""
    return [
        (p, p.config)
        for p in points
        if p.kind is Kind.FEASIBLE and p.measured and p.config is not None and math.isfinite(p.objective)
    ]


def tokens_per_step(config: TrialConfig, *, per_device: bool) -> int:
    """Tokens a micro-step holds at most (batch x ``model_max_length``), on one device or on all of
    them together. (An optimizer step with gradient accumulation is that many micro-steps.)"""
    samples = config.per_device_batch_size if per_device else int(config.batch_size)
    return samples * int(config.model_max_length)


def _float(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def points_of(study: optuna.Study) -> list[TrialPoint]:
    """Every trial with a final outcome (ok, oom, invalid, failed), in trial-number order.

    Trials still running, and those re-enqueued (``retry``, ``interrupted``), are left out: their
    configuration is measured again by a later trial.
    """
    points = []
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        record = TrialRecord.of(t)
        kind = _KIND_OF_STATUS.get(record.status or "")
        if kind is None:
            continue
        if kind is Kind.OOM and record.inferred_from is not None:
            kind = Kind.INFERRED
        try:
            config: TrialConfig | None = config_of(t)
        except (TypeError, ValueError):  # a trial without its configuration (hand-made studies)
            config = None
        points.append(
            TrialPoint(
                number=t.number,
                kind=kind,
                values=tuple(t.values) if t.values is not None else None,
                config=config,
                objective=_float(record.per_gpu) if kind is Kind.FEASIBLE else math.nan,
                total=_float(record.total) if kind is Kind.FEASIBLE else math.nan,
                peak_memory_gib=_float(record.peak_memory_gib),
                repeat=record.reused_from is not None,
            )
        )
    return points


def setting_of(config: TrialConfig) -> str:
    """The (sharding strategy, checkpointing) setting of a configuration, as a legend label: the
    short forms of the two knobs (``single``, ``DDP`` or ``FSDP<version>/<strategy>``; then
    ``ckpt on|off``)."""
    strategy = knob("distributed_backend").short(config)
    checkpointing = str(knob("gradient_checkpointing").short(config)).replace("=", " ")
    return f"{strategy}, {checkpointing}"
