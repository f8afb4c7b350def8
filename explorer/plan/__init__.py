"""``explorer plan``: the real run's wall-clock time and cost on each candidate configuration,
from finished studies, with a scaling fit for GPU counts beyond the measured ones."""

from explorer.plan._job import PlanJob, parse_prices, plan_job
from explorer.plan._plan import Plan, make_plan, plan_lines, same_workload, write_chosen
from explorer.plan._rows import PlanRow, StudyRows, candidates, family_of, strategy_of, study_rows
from explorer.plan._table import Marks, mark_rows, table_lines

__all__ = [
    "Marks",
    "Plan",
    "PlanJob",
    "PlanRow",
    "StudyRows",
    "candidates",
    "family_of",
    "make_plan",
    "mark_rows",
    "parse_prices",
    "plan_job",
    "plan_lines",
    "same_workload",
    "strategy_of",
    "study_rows",
    "table_lines",
    "write_chosen",
]
