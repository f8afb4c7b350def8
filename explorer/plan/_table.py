"""The plan as people read it: candidate runs ranked by predicted time, with the three marks.

* ``fastest``: the shortest predicted wall-clock time;
* ``cheapest``: the lowest cost (GPU-hours times the model's price; the fewest GPU-hours when no
  candidate has a price);
* ``cheapest by the deadline``: the cheapest whose predicted time meets the deadline.

An extrapolated row is marked and priced from the fit's central prediction, and its band is shown
beside it; it is never shown as measured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from explorer.plan._job import PlanJob
from explorer.plan._rows import PlanRow

if TYPE_CHECKING:
    from explorer.trial_config import TrialConfig

__all__ = ["Marks", "mark_rows", "table_lines"]


@dataclass(frozen=True, kw_only=True)
class Marks:
    """The rows the plan singles out (``None`` where no row qualifies)."""

    fastest: PlanRow | None
    cheapest: PlanRow | None
    by_deadline: PlanRow | None

    @property
    def chosen(self) -> PlanRow | None:
        """The one ``explorer plan`` writes files for: the cheapest by the deadline when a deadline
        is given, else the cheapest."""
        return self.by_deadline or self.cheapest

    def of(self, row: PlanRow) -> str:
        """This row's marks: ``F`` fastest, ``C`` cheapest, ``D`` cheapest by the deadline."""
        pairs = (("F", self.fastest), ("C", self.cheapest), ("D", self.by_deadline))
        return "".join(letter for letter, marked in pairs if marked is row)


def _cost_key(row: PlanRow, job: PlanJob, priced: bool) -> float:
    if not priced:
        return row.gpu_hours(job)
    cost = row.cost(job)
    return cost if cost is not None else float("inf")


def mark_rows(rows: Sequence[PlanRow], job: PlanJob) -> Marks:
    """Which rows are the fastest, the cheapest, and the cheapest that meets the deadline, among
    those the plan may mark (:attr:`PlanRow.markable`)."""
    rows = [r for r in rows if r.markable]  # an unbounded extrapolation is shown, never marked
    if not rows:
        return Marks(fastest=None, cheapest=None, by_deadline=None)
    priced = any(r.cost(job) is not None for r in rows)
    usable = [r for r in rows if not priced or r.cost(job) is not None]
    by_cost = sorted(usable, key=lambda r: (_cost_key(r, job, priced), r.hours(job)))
    in_time = [r for r in by_cost if r.meets(job)]
    return Marks(
        fastest=min(rows, key=lambda r: (r.hours(job), _cost_key(r, job, priced))),
        cheapest=by_cost[0] if by_cost else None,
        by_deadline=in_time[0] if in_time else None,
    )


def _hours(row: PlanRow, job: PlanJob) -> str:
    band = row.hours_band(job)
    text = f"{row.hours(job):,.2f}"
    return text if band is None else f"{text} ({band[0]:,.2f}-{band[1]:,.2f})"


def _per_gpu(row: PlanRow) -> str:
    if row.low is None or row.high is None:
        return f"{row.per_gpu:,.0f}"
    return f"{row.per_gpu:,.0f} ({row.low:,.0f}-{row.high:,.0f})"


def _cells(row: PlanRow, job: PlanJob, marks: Marks, describe: Callable[[TrialConfig], str]) -> list[str]:
    cost = row.cost(job)
    meets = row.meets(job)
    return [
        marks.of(row),
        row.gpu_model,
        str(row.number_gpus),
        str(row.config.number_nodes or 1),
        _per_gpu(row),
        _hours(row, job),
        f"{row.gpu_hours(job):,.1f}",
        "-" if cost is None else f"{cost:,.2f}",
        "-" if meets is None else ("yes" if meets else "no"),
        "extrapolated" if row.extrapolated else f"{row.study}#{row.trial}",
        describe(row.config),
    ]


HEADER = [
    "",
    "GPU model",
    "GPUs",
    "nodes",
    "tok/s/GPU",
    "hours",
    "GPU-h",
    "cost $",
    "in time",
    "measured",
    "configuration",
]


def table_lines(rows: Sequence[PlanRow], job: PlanJob, marks: Marks) -> list[str]:
    """The ranked table (fastest first) as aligned text lines, and its legend."""
    from explorer.study import describe

    ranked = sorted(rows, key=lambda r: (r.hours(job), r.gpu_model))
    cells = [HEADER] + [_cells(r, job, marks, describe) for r in ranked]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    right = {2, 3, 4, 5, 6, 7}
    lines = []
    for c in cells:
        parts = [
            v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(c, widths, strict=True))
        ]
        lines.append("  ".join(parts).rstrip())
    lines.append(
        "F fastest, C cheapest, D cheapest that meets the deadline; extrapolated rows show the "
        "scaling fit's band in parentheses"
    )
    return lines
