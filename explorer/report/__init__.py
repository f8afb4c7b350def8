"""What ``explorer optimize`` prints at the end, and ``explorer report``: figures, a page, artifacts."""

from explorer.report._html import ReportFigure
from explorer.report._summary import feasible_ranking, pareto_lines, print_summary
from explorer.report._write import Report, write_report

__all__ = ["Report", "ReportFigure", "feasible_ranking", "pareto_lines", "print_summary", "write_report"]
