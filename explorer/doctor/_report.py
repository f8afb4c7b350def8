"""The doctor's findings: one row per value of each knob, the node's facts, a table and JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["RAN", "FAILED", "NOT_APPLICABLE", "DoctorReport", "Row", "render_table"]

RAN = "ran"
FAILED = "failed"
NOT_APPLICABLE = "not applicable"


@dataclass(frozen=True, kw_only=True)
class Row:
    """What the doctor found for one value of one knob."""

    knob: str
    value: Any
    status: str
    """:data:`RAN`, :data:`FAILED` or :data:`NOT_APPLICABLE`."""
    detail: str = ""
    """The failure's first line, or why the value is not applicable."""
    blocks: bool = False
    """``optimize`` records every configuration with this value invalid on this node type."""
    config: str | None = None
    """The configuration's key that checked it (``None``: none ran)."""
    seconds: float | None = None
    """Wall seconds of that smoke run."""


@dataclass(frozen=True, kw_only=True)
class DoctorReport:
    """Everything ``explorer doctor`` found on one node."""

    study: str
    gpu_model: str
    """The study's name for this node's GPU model (the node type the findings hold for)."""
    node: dict[str, Any]
    """The probe's facts (:func:`explorer.doctor._probe.probe`)."""
    device: str
    rows: list[Row] = field(default_factory=list)
    seconds: float = 0.0
    measured: dict[str, Any] | None = None
    """The node's measured figures (:func:`explorer.doctor._node.measure_node`; ``{"error": ...}``
    when the measurement failed; ``None``: not measured)."""

    def invalid(self) -> dict[str, dict[str, str]]:
        """``{knob: {json(value): reason}}`` of the values this node cannot run."""
        out: dict[str, dict[str, str]] = {}
        for row in self.rows:
            if row.blocks:
                out.setdefault(row.knob, {})[json.dumps(row.value)] = row.detail
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "study": self.study,
            "gpu_model": self.gpu_model,
            "device": self.device,
            "node": self.node,
            "measured": self.measured,
            "seconds": round(self.seconds, 2),
            "rows": [asdict(r) for r in self.rows],
            "invalid": self.invalid(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def counts(self) -> dict[str, int]:
        out = {RAN: 0, FAILED: 0, NOT_APPLICABLE: 0}
        for row in self.rows:
            out[row.status] += 1
        return out


def _node_lines(report: DoctorReport) -> list[str]:
    n = report.node
    gpus = ", ".join(f"{g['name']} ({g['memory_gib']:.1f} GiB)" for g in n.get("gpus", [])) or "none (NVML)"
    lines = [
        f"node {n.get('host')}: trains on {report.device}; GPUs: {gpus}; driver {n.get('driver') or '-'}",
        f"torch {n.get('torch')}, CUDA {n.get('cuda') or '-'}, NCCL {n.get('nccl') or '-'}, "
        f"transformers {n.get('transformers')}, {_trl_text(n.get('trl'))}, python {n.get('python')}",
    ]
    for module, found in n.get("packages", {}).items():
        lines.append(f"  {module}: {found['version'] or 'does not import: ' + str(found['error'])}")
    return lines + _measured_lines(report.measured)


def _measured_lines(m: dict[str, Any] | None) -> list[str]:
    """The node's measured figures in three lines (or why there are none)."""
    if not m:
        return ["measured: not measured"]
    if m.get("error"):
        return [f"measured: failed: {m['error']}"]
    side = m["matmul_size"]
    lines = [
        f"measured: matmul {m['matmul_tflops']:.4g} TFLOP/s {m['matmul_dtype']} ({side}x{side}, "
        f"{m['processes']} process(es) at once, {m['threads_per_process']} thread(s) each); "
        f"copy {m['memory_bandwidth_tbs']:.4g} TB/s; allocatable {m['allocatable_gib']:.2f} GiB "
        f"({m['allocation_probe_gib']:.2f} GiB allocated to check)",
    ]
    if m.get("allreduce_busbw_gbs") is None:
        lines.append("  collectives: not measured: one device")
    else:
        lines.append(
            f"  collectives ({m['backend']}, {m['processes']} processes, {m['collective_bytes'] / 2**20:g} MiB): "
            f"all-reduce busbw {m['allreduce_busbw_gbs']:.4g} GB/s (algbw {m['allreduce_algbw_gbs']:.4g}), "
            f"all-gather busbw {m['allgather_busbw_gbs']:.4g} GB/s (algbw {m['allgather_algbw_gbs']:.4g})"
        )
    between = m.get("inter_node")
    if between is None:
        lines.append(f"  between nodes: {m.get('inter_node_why')}")
    else:
        lines.append(
            f"  between nodes ({between['backend']}): all-reduce busbw {between['allreduce_busbw_gbs']:.4g} GB/s, "
            f"all-gather busbw {between['allgather_busbw_gbs']:.4g} GB/s: {m.get('inter_node_why')}"
        )
    return lines


def _trl_text(found: dict[str, Any] | None) -> str:
    """TRL's version on the node (``workload.trainer: trl``), or why it does not import."""
    if not found:
        return "TRL not probed"
    return f"TRL {found['version']}" if found.get("version") else f"TRL does not import: {found.get('error')}"


def render_table(report: DoctorReport, *, width: int = 140) -> str:
    """The report as text: the node's facts, then a table of every value (rich)."""
    import io

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"explorer doctor: study {report.study!r} on {report.gpu_model}")
    for column in ("knob", "value", "result", "seconds", "why / first error line"):
        table.add_column(column, overflow="fold")
    for row in report.rows:
        status = row.status + (" (invalid in optimize)" if row.blocks else "")
        seconds = "" if row.seconds is None else f"{row.seconds:.1f}"
        table.add_row(row.knob, json.dumps(row.value), status, seconds, row.detail)
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, no_color=True, highlight=False)
    for line in _node_lines(report):
        console.print(line, markup=False)
    console.print(table)
    counts = report.counts()
    console.print(
        f"{counts[RAN]} ran, {counts[FAILED]} failed, {counts[NOT_APPLICABLE]} not applicable "
        f"in {report.seconds:.0f} s",
        markup=False,
    )
    return buffer.getvalue()
