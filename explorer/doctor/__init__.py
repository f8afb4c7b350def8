"""``explorer doctor``: prove on the user's own node that every knob value of a study runs, before
the study spends GPU-hours on it, and measure the node's figures that price it. See
``docs/doctor.md``."""

from explorer.doctor._between import ONE_NODE, measure_between_nodes
from explorer.doctor._cases import ALONE, Case, Node, Run, group_cases, plan_cases, unmet_here
from explorer.doctor._node import (
    CPU_PROCESSES,
    allgather_busbw,
    allreduce_busbw,
    collective_figures,
    measure_node,
    summarize_ranks,
)
from explorer.doctor._probe import optional_modules, probe, probe_in_child
from explorer.doctor._record import record_findings
from explorer.doctor._report import FAILED, NOT_APPLICABLE, RAN, DoctorReport, Row, render_table
from explorer.doctor._run import SMOKE, measure_here, node_of, run_doctor

__all__ = [
    "ALONE",
    "CPU_PROCESSES",
    "ONE_NODE",
    "collective_figures",
    "measure_between_nodes",
    "allgather_busbw",
    "allreduce_busbw",
    "measure_here",
    "measure_node",
    "summarize_ranks",
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
