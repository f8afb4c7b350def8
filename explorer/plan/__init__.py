"""``explorer plan``: the real run's wall-clock time and cost on each candidate configuration,
from finished studies, with a scaling fit for GPU counts beyond the measured ones."""

from explorer.plan._figure import CostPoint, CostSeries, cost_series, draw_time_and_cost, time_and_cost
from explorer.plan._job import PlanJob, parse_prices, plan_job
from explorer.plan._plan import Plan, make_plan, plan_lines, same_workload, write_chosen
from explorer.plan._rows import PlanRow, StudyRows, candidates, family_of, strategy_of, study_rows
from explorer.plan._sbatch import predicted_hours, sbatch_command, sbatch_lines, time_limit, time_limit_hours
from explorer.plan._table import Marks, mark_rows, table_lines

__all__ = [
    "CostPoint",
    "CostSeries",
    "Marks",
    "Plan",
    "PlanJob",
    "PlanRow",
    "StudyRows",
    "candidates",
    "cost_series",
    "draw_time_and_cost",
    "family_of",
    "make_plan",
    "mark_rows",
    "parse_prices",
    "plan_job",
    "plan_lines",
    "predicted_hours",
    "same_workload",
    "sbatch_command",
    "sbatch_lines",
    "strategy_of",
    "study_rows",
    "table_lines",
    "time_and_cost",
    "time_limit",
    "time_limit_hours",
    "write_chosen",
]
