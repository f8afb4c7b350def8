"""``explorer report``'s "time and cost" figure: the plan of one study drawn against the GPU count.

Two panels: the predicted wall-clock hours of the study file's ``budget`` and its cost (USD when
every GPU model drawn has a price in ``prices``, else GPU-hours), one line per GPU model, from
the plan's candidates (:func:`~explorer.plan.candidates`): measured points solid, extrapolated
points hollow with the scaling fit's band as error bars, the deadline as a horizontal line.

It lives here, not in :mod:`explorer.report`, because the plan already imports the report (its
ranking): the report takes it as a hook (``write_report(..., time_and_cost=...)``) from the CLI.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from explorer.plan._job import PlanJob, plan_job
from explorer.plan._rows import PlanRow, candidates, study_rows
from explorer.report import ReportFigure
from explorer.report._canvas import dodge, message, new_figure, save
from explorer.report._throughput import log2_axis

if TYPE_CHECKING:
    import optuna
    from matplotlib.axes import Axes

    from explorer.spec import LoadedStudy

__all__ = ["FILE", "HINT", "CostPoint", "CostSeries", "cost_series", "draw_time_and_cost", "time_and_cost"]

FILE = "time_cost.png"
"""The figure's file in the report folder."""

HINT = (
    "No time and cost figure: add a budget: section (tokens, epochs, deadline_hours, max_gpus) to "
    "the study file, or run explorer plan STUDY.yaml --tokens N for the same numbers as a table."
)
"""The report's one line for a study file without a ``budget``."""

TITLE = "Time and cost by GPU count"

Colour = tuple[float, float, float, float]
"""An RGBA colour (matplotlib's ``tab10``), one per GPU model."""


@dataclass(frozen=True, kw_only=True)
class CostPoint:
    """One plotted candidate: its GPU count, hours and cost, with the band of an extrapolation."""

    number_gpus: int
    hours: float
    cost: float
    """USD, or GPU-hours (:attr:`CostSeries.unit`)."""
    extrapolated: bool
    hours_band: tuple[float, float] | None = None
    """Extrapolated: the hours at the band's high and low throughput (the high end may be inf)."""
    cost_band: tuple[float, float] | None = None
    trial: int | None = None


@dataclass(frozen=True, kw_only=True)
class CostSeries:
    """One GPU model's line: its candidates by GPU count."""

    gpu_model: str
    unit: str
    """``USD`` or ``GPU-hours``."""
    points: list[CostPoint]


def _point(row: PlanRow, job: PlanJob, usd: bool) -> CostPoint:
    per_hour = row.number_gpus * (job.prices[row.gpu_model] if usd else 1.0)  # cost of one hour
    band = row.hours_band(job)
    return CostPoint(
        number_gpus=row.number_gpus,
        hours=row.hours(job),
        cost=row.hours(job) * per_hour,
        extrapolated=row.extrapolated,
        hours_band=band,
        cost_band=None if band is None else (band[0] * per_hour, band[1] * per_hour),
        trial=row.trial,
    )


def cost_series(rows: Sequence[PlanRow], job: PlanJob) -> list[CostSeries]:
    """What the figure plots: per GPU model (by name), its candidates by GPU count; the cost is in
    USD when every model has a price in ``job.prices``, else in GPU-hours for all."""
    models = sorted({r.gpu_model for r in rows})
    usd = bool(models) and all(m in job.prices for m in models)
    return [
        CostSeries(
            gpu_model=m,
            unit="USD" if usd else "GPU-hours",
            points=[
                _point(r, job, usd)
                for r in sorted((r for r in rows if r.gpu_model == m), key=lambda r: r.number_gpus)
            ],
        )
        for m in models
    ]


def _draw_series(ax: Axes, series: CostSeries, colour: Colour, shift: float, *, cost: bool) -> None:
    """One model's line; measured points solid, extrapolated hollow with their band as error bars."""
    xs = [p.number_gpus * shift for p in series.points]
    ys = [p.cost if cost else p.hours for p in series.points]
    solid = [i for i, p in enumerate(series.points) if not p.extrapolated]
    last = solid[-1] if solid else 0  # the line goes on dashed from the last measured point
    ax.plot(xs[: last + 1], ys[: last + 1], color=colour, linewidth=1.2, zorder=2)
    ax.plot(xs[last:], ys[last:], color=colour, linewidth=1.2, linestyle="--", zorder=2)
    for p, x, y in zip(series.points, xs, ys, strict=True):
        band = p.cost_band if cost else p.hours_band
        if band is not None and all(math.isfinite(v) for v in band):
            ax.errorbar([x], [y], yerr=[[y - band[0]], [band[1] - y]], color=colour, capsize=4, zorder=2)
        ax.scatter(
            [x],
            [y],
            s=50,
            marker="o",
            facecolors="white" if p.extrapolated else colour,
            edgecolors=colour,
            linewidths=1.5,
            zorder=3,
        )


def _legend(ax: Axes, series: Sequence[CostSeries], colours: dict[str, Colour]) -> None:
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colours[s.gpu_model], marker="o", label=s.gpu_model) for s in series]
    handles.append(Line2D([], [], color="gray", linestyle="--", label="dashed: extrapolated"))
    handles += [
        Line2D([], [], color="gray", marker="o", linestyle="", label="measured (best trial)"),
        Line2D(
            [],
            [],
            color="gray",
            marker="o",
            markerfacecolor="white",
            linestyle="",
            label="extrapolated (band)",
        ),
    ]
    ax.legend(handles=handles + ax.get_legend_handles_labels()[0], fontsize=8, loc="best")


def draw_time_and_cost(rows: Sequence[PlanRow], job: PlanJob, path: Path) -> tuple[Path, list[CostSeries]]:
    """Hours (left) and cost (right) against the GPU count, one line per GPU model; returns the
    PNG and what it plotted (:func:`cost_series`)."""
    from matplotlib import colormaps

    series = cost_series(rows, job)
    if not series:
        return message(path, TITLE, "no feasible trial measured a throughput to plan from"), series
    fig = new_figure()
    left, right = fig.subplots(1, 2, sharex=True)
    colours = {s.gpu_model: colormaps["tab10"](i % 10) for i, s in enumerate(series)}
    for i, s in enumerate(series):
        shift = dodge(i, len(series), width=0.15)  # models side by side: no bar hides another
        _draw_series(left, s, colours[s.gpu_model], shift, cost=False)
        _draw_series(right, s, colours[s.gpu_model], shift, cost=True)
    if job.deadline_hours is not None:
        left.axhline(
            job.deadline_hours, color="tab:red", linestyle="--", label=f"deadline {job.deadline_hours:g} h"
        )
    counts = sorted({p.number_gpus for s in series for p in s.points})
    for ax, label in ((left, "predicted wall-clock hours"), (right, f"cost ({series[0].unit})")):
        log2_axis(ax)
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.set_xlabel("number of GPUs")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    _legend(left, series, colours)
    fig.suptitle(
        f"{TITLE}: {job.tokens:,.0f} dataset tokens x {job.epochs:g} epochs = {job.total_tokens:,.0f} tokens"
    )
    return save(fig, path), series


def _caption(job: PlanJob, series: Sequence[CostSeries]) -> str:
    models = [s.gpu_model for s in series]
    if series and series[0].unit == "USD":
        prices = ", ".join(f"{m} ${job.prices[m]:,.2f}" for m in models)
        cost = f"cost = GPU-hours x the study file's prices per GPU-hour ({prices})"
    else:
        missing = ", ".join(m for m in models if m not in job.prices) or "the GPU model"
        cost = f"cost in GPU-hours (no price for {missing}: add it to the study file's prices)"
    deadline = (
        f" Dashed red: the deadline ({job.deadline_hours:g} h, budget.deadline_hours)."
        if job.deadline_hours is not None
        else ""
    )
    return (
        f"The study file's budget ({job.tokens:,.0f} dataset tokens x {job.epochs:g} epochs) run on "
        "the best configuration at each GPU count, one line per GPU model: hours = tokens x epochs / "
        f"(dataset tokens/s per GPU x GPUs) / 3600; {cost}. Solid points were measured (the best "
        "trial at that count); hollow points, up to budget.max_gpus, are extrapolated: they come "
        "from the scaling fit, see docs/scaling.md, with its 90% band as error bars (none where the "
        f"fit has no band).{deadline} explorer plan prints the same numbers as a table."
    )


def time_and_cost(loaded: LoadedStudy, study: optuna.Study, folder: Path) -> ReportFigure | str:
    """The report's figure for a study file with a ``budget``; else :data:`HINT`, the line the
    report shows instead."""
    if loaded.spec.budget is None:
        return HINT
    job = plan_job([loaded.spec], file=str(loaded.file))
    rows = candidates(study_rows(loaded, study), job)
    if not rows:
        kept = f" with budget.global_batch {job.global_batch}" if job.global_batch else ""
        return f"No time and cost figure: no feasible configuration{kept} was measured."
    path, series = draw_time_and_cost(rows, job, folder / FILE)
    return ReportFigure(path, TITLE, _caption(job, series))
