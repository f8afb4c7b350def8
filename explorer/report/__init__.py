"""What ``explorer optimize`` prints at the end, and ``explorer report``: figures, a page, artifacts."""

from explorer.report._headroom import MemoryFlag, memory_flag, trial_headroom, trial_memory
from explorer.report._html import ReportFigure
from explorer.report._ranking import MIN_TOLERANCE, feasible_ranking, noise_tolerance
from explorer.report._summary import pareto_lines, print_summary
from explorer.report._write import Report, write_report

__all__ = [
    "MIN_TOLERANCE",
    "MemoryFlag",
    "Report",
    "ReportFigure",
    "feasible_ranking",
    "memory_flag",
    "noise_tolerance",
    "pareto_lines",
    "print_summary",
    "trial_headroom",
    "trial_memory",
    "write_report",
]
