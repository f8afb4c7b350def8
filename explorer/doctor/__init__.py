"""``explorer doctor``: prove on the user's own node that every knob value of a study runs, before
the study spends GPU-hours on it. See ``docs/doctor.md``."""

from explorer.doctor._cases import ALONE, Case, Node, Run, group_cases, plan_cases, unmet_here
from explorer.doctor._probe import optional_modules, probe, probe_in_child
from explorer.doctor._record import record_findings
from explorer.doctor._report import FAILED, NOT_APPLICABLE, RAN, DoctorReport, Row, render_table
from explorer.doctor._run import SMOKE, node_of, run_doctor

__all__ = [
    "ALONE",
    "Run",
    "group_cases",
    "FAILED",
    "NOT_APPLICABLE",
    "RAN",
    "SMOKE",
    "Case",
    "DoctorReport",
    "Node",
    "Row",
    "node_of",
    "optional_modules",
    "plan_cases",
    "probe",
    "probe_in_child",
    "record_findings",
    "render_table",
    "run_doctor",
    "unmet_here",
]
