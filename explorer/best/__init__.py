"""``explorer best``: the study's best feasible configuration as files and commands to run next."""

from explorer.best._render import (
    accelerate_command,
    render_accelerate,
    template_for,
    torchrun_command,
)
from explorer.best._select import MIN_TOLERANCE, Selection, noise_tolerance, select_best
from explorer.best._write import BestFiles, device_type_of, summary_lines, write_best, write_config

__all__ = [
    "MIN_TOLERANCE",
    "BestFiles",
    "Selection",
    "accelerate_command",
    "device_type_of",
    "noise_tolerance",
    "render_accelerate",
    "select_best",
    "summary_lines",
    "template_for",
    "torchrun_command",
    "write_best",
    "write_config",
]
