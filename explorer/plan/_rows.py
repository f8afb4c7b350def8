"""The candidate runs of a plan: measured configurations, and extrapolations beyond them.

For each GPU model and GPU count, the candidate is the configuration with the highest dataset
tokens per second per GPU: with the GPUs and their price fixed, it is both the fastest and the
cheapest, so every other configuration at that count is dominated. A count the study measured
takes its best measured trial; a count above the largest measured one (up to ``max_gpus``) takes
the best prediction of the scaling fit (:mod:`explorer.plan._scaling`) over the measured
configurations, marked as extrapolated with its band.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from explorer.plan._scaling import NODES_UNMEASURED, Prediction, ScalingFit, ScalingPoint, fit_scaling
from explorer.trial_config import TrialConfig

if TYPE_CHECKING:
    import optuna

    from explorer.plan._job import PlanJob
    from explorer.spec import LoadedStudy

__all__ = [
    "PlanRow",
    "StudyRows",
    "candidates",
    "family_of",
    "scaling_points",
    "strategy_of",
    "study_rows",
    "to_bound",
]


@dataclass(frozen=True, kw_only=True)
class PlanRow:
    """One way to run the job: a configuration on some GPUs of one model, with its throughput."""

    study: str
    """The study it comes from."""
    gpu_model: str
    config: TrialConfig
    per_gpu: float
    """Dataset tokens per second per GPU: measured, or the fit's central prediction."""
    trial: int | None = None
    """The trial that measured it; ``None`` for an extrapolation."""
    low: float | None = None
    """Extrapolated: the low end of the prediction band (per GPU)."""
    high: float | None = None
    """Extrapolated: the high end of the band."""
    note: str = ""
    to_bound: str = ""
    """Why the row may not be marked fastest, cheapest or by the deadline, and what to measure so
    that it may ("" for a row that may be: measured, or extrapolated within a finite band from
    measured nodes)."""
    source_trial: int | None = None
    """Extrapolated: the measured trial it is extrapolated from."""
    headroom: float | None = None
    """The memory headroom of the trial it was measured in (or extrapolated from)."""
    margin: float = 0.05
    """Its study's ``memory_margin``."""

    @property
    def extrapolated(self) -> bool:
        return self.trial is None

    @property
    def markable(self) -> bool:
        """Whether the plan may mark it (see :attr:`to_bound`)."""
        return not self.to_bound

    @property
    def near_limit(self) -> bool:
        """Whether its trial came within its study's ``memory_margin`` of the memory limit."""
        return self.headroom is not None and self.headroom < self.margin

    @property
    def number_gpus(self) -> int:
        return int(self.config.number_gpus)

    @property
    def tokens_per_second(self) -> float:
        """Dataset tokens per second, all GPUs together."""
        return self.per_gpu * self.number_gpus

    def hours(self, job: PlanJob) -> float:
        """Predicted wall-clock hours of the whole run."""
        return job.hours(self.tokens_per_second)

    def hours_band(self, job: PlanJob) -> tuple[float, float] | None:
        """Extrapolated: the hours at the band's high and low throughput."""
        if self.low is None or self.high is None:
            return None
        slowest = job.hours(self.low * self.number_gpus) if self.low > 0 else math.inf
        return job.hours(self.high * self.number_gpus), slowest

    def gpu_hours(self, job: PlanJob) -> float:
        return self.hours(job) * self.number_gpus

    def cost(self, job: PlanJob) -> float | None:
        """USD: GPU-hours times the model's price (``None``: no price for the model)."""
        price = job.prices.get(self.gpu_model)
        return None if price is None else self.gpu_hours(job) * price

    def meets(self, job: PlanJob) -> bool | None:
        """Whether the predicted time is within the deadline (``None``: no deadline). An
        extrapolated row with an unbounded band (its slow end never finishes) never meets it."""
        if job.deadline_hours is None:
            return None
        band = self.hours_band(job)
        return self.hours(job) <= job.deadline_hours and (band is None or math.isfinite(band[1]))


_LAYOUT = ("number_gpus", "number_nodes", "distributed_backend", "fsdp_version", "fsdp_sharding_strategy")
"""The knobs a scaling family leaves out: the GPUs, and the strategy that spreads work over them."""


def family_of(config: TrialConfig) -> tuple[tuple[str, object], ...]:
    """The configuration without its GPUs and strategy: the per-device work (per-device batch,
    sequence length, checkpointing, ...) that the scaling fit follows from GPU count to GPU count
    (weak scaling: an extrapolated run keeps the per-device batch, so its global batch grows)."""
    values = {k: v for k, v in config.to_dict().items() if k not in _LAYOUT}
    values["batch_size"] = config.per_device_batch_size  # the knob is the global batch
    return tuple(values.items())


def strategy_of(config: TrialConfig) -> str:
    """``DDP``, ``FSDP2 FULL_SHARD``, ... (``single GPU`` without a backend)."""
    backend = config.distributed_backend
    if backend == "FSDP":
        return f"FSDP{config.fsdp_version} {config.fsdp_sharding_strategy}"
    return str(backend) if backend and backend != "NONE" else "single GPU"


@dataclass(frozen=True, kw_only=True)
class StudyRows:
    """One study's measured candidates, its scaling points and fit."""

    study: str
    gpu_model: str
    gpus_per_node: int
    nodes: int
    """The nodes the study declares (``resources.nodes``)."""
    measured: list[PlanRow]
    """Every measured feasible configuration (best first), one row each."""
    points: list[ScalingPoint]
    fit: ScalingFit


def study_rows(loaded: LoadedStudy, study: optuna.Study, *, level: float = 0.9) -> StudyRows:
    """The measured feasible configurations of ``study`` (the best trial of each) and its fit."""
    from explorer.record import TrialRecord
    from explorer.report import feasible_ranking, trial_headroom
    from explorer.study import config_of

    resources = loaded.spec.resources

    seen: set[str] = set()
    rows = []
    trials = [(t, TrialRecord.of(t).per_gpu or 0.0) for t in feasible_ranking(study)]
    for trial, per_gpu in sorted(trials, key=lambda tp: -tp[1]):  # whatever the study's objective
        config = config_of(trial)
        if config.key() in seen or not per_gpu > 0:
            continue
        seen.add(config.key())
        rows.append(
            PlanRow(
                study=loaded.spec.name,
                gpu_model=loaded.spec.resources.model_of(config.gpu_model),
                config=config,
                per_gpu=per_gpu,
                trial=trial.number,
                headroom=trial_headroom(trial, resources.device_memory_gib),
                margin=loaded.spec.memory_margin,
            )
        )
    points = scaling_points(rows)
    return StudyRows(
        study=loaded.spec.name,
        gpu_model=resources.model,
        gpus_per_node=resources.gpus_per_node,
        nodes=resources.nodes,
        measured=rows,
        points=points,
        fit=fit_scaling(points, level=level),
    )


def _point(row: PlanRow, strategy: str) -> ScalingPoint:
    return ScalingPoint(
        family=(row.gpu_model, strategy, family_of(row.config)),
        strategy=strategy,
        number_gpus=row.number_gpus,
        number_nodes=int(row.config.number_nodes or 1),
        per_gpu=row.per_gpu,
    )


def scaling_points(rows: Iterable[PlanRow]) -> list[ScalingPoint]:
    """The fit's points: each multi-GPU row under its strategy; a single-GPU row (no backend) is
    where every strategy starts, so it joins each strategy the rows use, in its own family."""
    rows = list(rows)
    strategies = sorted({strategy_of(r.config) for r in rows if r.number_gpus > 1})
    points = []
    for row in rows:
        if row.number_gpus > 1:
            points.append(_point(row, strategy_of(row.config)))
        else:
            points += [_point(row, s) for s in strategies]
    return points


def gpu_counts_beyond(largest: int, max_gpus: int, gpus_per_node: int) -> list[int]:
    """GPU counts to extrapolate to: doublings of ``largest`` up to ``max_gpus``, and ``max_gpus``
    itself; a count over one node must fill whole nodes."""
    counts = set()
    n = largest * 2
    while n <= max_gpus:
        counts.add(n)
        n *= 2
    if max_gpus > largest:
        counts.add(max_gpus)
    return sorted(c for c in counts if c <= gpus_per_node or c % gpus_per_node == 0)


def _extrapolate(rows: StudyRows, best: Iterable[PlanRow], n: int, job: PlanJob) -> PlanRow | None:
    """The best prediction at ``n`` GPUs over the measured configurations ``best`` (each keeps its
    per-device batch; only those whose global batch at ``n`` GPUs the job keeps)."""
    nodes = max(1, math.ceil(n / rows.gpus_per_node))
    found: tuple[Prediction, PlanRow, TrialConfig] | None = None
    for row in best:
        config = row.config.replace(
            number_gpus=n, number_nodes=nodes, batch_size=row.config.per_device_batch_size * n
        )
        if not job.keeps(config):
            continue
        point = _point(row, strategy_of(row.config))
        prediction = rows.fit.predict(
            family=point.family, strategy=point.strategy, number_gpus=n, number_nodes=nodes
        )
        if prediction is not None and (found is None or prediction.per_gpu > found[0].per_gpu):
            found = (prediction, row, config)
    if found is None:
        return None
    prediction, row, config = found
    notes = [prediction.note or f"from trial {row.trial} at {row.number_gpus} GPUs"]
    if nodes > rows.nodes:
        notes.append(f"needs {nodes} nodes, more than the {rows.nodes} the study declares (resources.nodes)")
    return PlanRow(
        study=rows.study,
        gpu_model=row.gpu_model,
        config=config,
        per_gpu=prediction.per_gpu,
        low=prediction.low,
        high=prediction.high,
        note="; ".join(notes),
        to_bound=to_bound(prediction, strategy_of(row.config), nodes),
        source_trial=row.trial,
        headroom=row.headroom,
        margin=row.margin,
    )


def to_bound(prediction: Prediction, strategy: str, nodes: int) -> str:
    """Why an extrapolation may not be marked, and what to measure so that it may ("": it may).

    Its band must be finite (the fit has residual freedom) and its nodes' cost measured."""
    if not (prediction.low > 0 and math.isfinite(prediction.high)):
        return (
            f"unbounded: the {strategy} fit has no residual freedom; measure {strategy} at one more "
            "GPU count (a configuration already measured at two) to give it a band"
        )
    if NODES_UNMEASURED in prediction.note:
        return (
            f"unbounded: the inter-node cost of {strategy} is not measured; measure {strategy} on "
            f"two node counts or more (up to {nodes} nodes) to bound it"
        )
    return ""


def candidates(rows: StudyRows, job: PlanJob) -> list[PlanRow]:
    """The best row per GPU model and GPU count: measured up to the largest measured count,
    extrapolated beyond it up to ``job.max_gpus``; only configurations with the job's global
    batch, when it has one."""
    best: dict[tuple[str, int], PlanRow] = {}
    for row in rows.measured:
        if (job.max_gpus is None or row.number_gpus <= job.max_gpus) and job.keeps(row.config):
            best.setdefault((row.gpu_model, row.number_gpus), row)
    out = list(best.values())
    for model in sorted({r.gpu_model for r in rows.measured}):
        measured = [r for r in rows.measured if r.gpu_model == model]
        largest = max(r.number_gpus for r in measured)
        # the best measured row of each configuration family, at its largest GPU count
        tops: dict[object, PlanRow] = {}
        for r in sorted(measured, key=lambda r: r.number_gpus):
            if r.number_gpus > 1:  # a single-GPU run has no strategy to scale out with
                tops[(strategy_of(r.config), family_of(r.config))] = r
        for n in gpu_counts_beyond(largest, job.max_gpus or largest, rows.gpus_per_node):
            extra = _extrapolate(rows, tops.values(), n, job)
            if extra is not None:
                out.append(extra)
    return out
