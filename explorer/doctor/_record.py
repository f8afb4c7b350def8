"""Record the doctor's findings with the study, where ``optimize`` reads them: a configuration with
a value the node type cannot run is invalid before launch, with the doctor's reason
(:func:`explorer.validity.doctor_reason`); and the node's measured figures, which ``explorer
estimate`` prices the study with (:attr:`explorer.record.StudyRecord.measured_node`)."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from explorer.doctor._report import DoctorReport
from explorer.record import StudyRecord, write_study
from explorer.validity import DOCTOR_ATTR

if TYPE_CHECKING:
    from explorer.spec import LoadedStudy

__all__ = ["record_findings"]


def record_findings(loaded: LoadedStudy, report: DoctorReport, *, node_only: bool = False) -> dict[str, Any]:
    """Store ``report``'s invalid values for its node type on the study (made if missing), beside
    those of other node types; returns the attribute as stored. ``node_only``: a report without
    smoke runs (its figures, and the values the node cannot run at all), added to what an earlier
    doctor found, whose values and counts stay."""
    from explorer.study import open_study

    study = open_study(loaded, create=True)
    recorded: dict[str, Any] = dict(StudyRecord.of(study).doctor or {})
    invalid = dict(recorded.get("invalid") or {})
    nodes = dict(recorded.get("nodes") or {})
    earlier = dict(nodes.get(report.gpu_model) or {}) if node_only else {}
    found = report.invalid()
    if node_only:
        merged = {k: dict(v) for k, v in (invalid.get(report.gpu_model) or {}).items()}
        for knob, values in found.items():
            merged.setdefault(knob, {}).update(values)
        found = merged
    invalid[report.gpu_model] = found
    nodes[report.gpu_model] = {
        **earlier,
        "host": report.node.get("host"),
        "device": report.device,
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "counts": earlier.get("counts", report.counts()),
    }
    if report.measured and not report.measured.get("error"):
        nodes[report.gpu_model]["measured"] = report.measured  # what `explorer estimate` prices with
    recorded = {"invalid": invalid, "nodes": nodes}
    write_study(study, DOCTOR_ATTR, recorded)
    return recorded
