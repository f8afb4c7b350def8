"""Run the doctor on this node: probe it, then one short smoke run per distinct configuration
of :func:`explorer.doctor._cases.plan_cases`, each through :func:`explorer.launch.run_trial` (the
function a Ray trial actor calls) with the ranks forked from one warm zygote, so that torch and
transformers are imported once for all of them."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from explorer.doctor._between import measure_between_nodes
from explorer.doctor._cases import Case, Node, group_cases, plan_cases
from explorer.doctor._node import CPU_PROCESSES, measure_node
from explorer.doctor._probe import probe_in_child
from explorer.doctor._report import FAILED, NOT_APPLICABLE, RAN, DoctorReport, Row
from explorer.job import TrialJob
from explorer.measurement import Measurement, Outcome
from explorer.space import facts_of
from explorer.spec import LoadedStudy, MeasurementSpec
from explorer.trial_config import TrialConfig

__all__ = ["SMOKE", "measure_here", "node_of", "run_doctor"]

SMOKE = {"warmup_steps": 1, "measured_steps": 1}
"""A smoke run: one step to start (and compile), one measured."""


def node_of(loaded: LoadedStudy, facts: dict[str, Any]) -> Node:
    """The :class:`Node` the probe's ``facts`` describe, for ``loaded``'s trials."""
    resources = loaded.spec.resources
    cuda = resources.device == "cuda" or (resources.device == "auto" and facts["cuda_available"])
    missing = {m: str(f["error"]) for m, f in facts["packages"].items() if f["error"]}
    return Node(
        device="cuda" if cuda else "cpu",
        gpus=facts["visible_gpus"] if cuda else resources.gpus_per_node,
        missing=missing,
        model_type=facts_of(loaded.spec.workload)["model_type"],
    )


def measure_here(node: Node, env: dict[str, str], address: str | None = None) -> dict[str, Any]:
    """The node's measured figures (:func:`explorer.doctor._node.measure_node`): every visible
    GPU with NCCL, or :data:`CPU_PROCESSES` CPU processes with gloo, and between two nodes of the
    Ray cluster at ``address`` where there is one (:func:`measure_between_nodes`); ``{"error":
    ...}`` when the measurement on this node failed (the smoke runs still run)."""
    processes = max(1, node.gpus) if node.device == "cuda" else CPU_PROCESSES
    between = measure_between_nodes(address, node.device)
    try:
        return measure_node(node.device, processes, env=env, between=between)
    except (RuntimeError, OSError, ValueError) as exc:
        return {"error": str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}


def _first_line(m: Measurement) -> str:
    lines = [line for line in (m.error or "").splitlines() if line.strip()]
    return lines[0].strip() if lines else f"ended {m.outcome.value}"


def _row(case: Case, m: Measurement | None, seconds: float | None, key: str | None = None) -> Row:
    if case.config is None or m is None:
        return Row(
            knob=case.knob,
            value=case.value,
            status=NOT_APPLICABLE,
            detail=case.reason or "",
            blocks=case.blocks,
        )
    if m.outcome is Outcome.OK:
        return Row(knob=case.knob, value=case.value, status=RAN, config=key, seconds=seconds)
    oom = m.outcome is Outcome.OOM  # memory, not the value: the search learns it, nothing blocked
    detail = ("out of memory: " if oom else "") + _first_line(m)
    return Row(
        knob=case.knob,
        value=case.value,
        status=FAILED,
        detail=detail,
        blocks=not oom,
        config=key,
        seconds=seconds,
    )


def _unblamed(rows: list[Row]) -> list[Row]:
    """``rows``, where no smoke run ran: each failure then belongs to the node or the set-up
    (the baseline failed too), not to its value, and blocks nothing in optimize."""
    if any(r.status == RAN for r in rows):
        return rows
    return [replace(r, blocks=False) if r.status == FAILED else r for r in rows]


def run_doctor(
    loaded: LoadedStudy,
    *,
    facts: dict[str, Any] | None = None,
    measured: dict[str, Any] | None = None,
    on_row: Callable[[Row], None] | None = None,
    smoke_runs: bool = True,
    resume: bool = False,
) -> DoctorReport:
    """Probe this node (unless ``facts`` are given), measure it (:func:`measure_here`, unless
    ``measured`` is given), then smoke-run every applicable value (without ``smoke_runs``: none;
    the rows are then the values the node cannot run at all, a package or CUDA missing) (each
    row appended to ``<run folder>/doctor/rows.jsonl`` as found, the report written to
    ``doctor.json`` at the end): the
    values grouped into few runs (:func:`explorer.doctor._cases.group_cases`); a run that does
    not end ``ok`` is split into one run per value, so that each failure names its own value.
    ``resume``: the values an earlier doctor of this study found (its ``rows.jsonl``, kept as
    found) are not run again."""
    from explorer.launch import zygote_environment

    started = time.monotonic()
    spec = loaded.spec
    env = zygote_environment(cpu_count=os.cpu_count() or 1)
    facts = facts or probe_in_child(env)
    node = node_of(loaded, facts)
    measured = measured or measure_here(node, env, getattr(spec.launcher, "address", None))
    cases = plan_cases(loaded.space, spec.resources, node)
    if not smoke_runs:  # the node alone: only what it cannot run at all, known without a run
        cases = [c for c in cases if c.blocks]
    smoke = _Smoke(loaded)
    found: dict[int, tuple[Measurement, float, str]] = {}  # case: its run, seconds, configuration
    folder = loaded.output_dir / "doctor"
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / "rows.jsonl"  # each row as it is found: evidence even if the doctor is cut short
    earlier = _rows_found(partial) if resume else {}
    if not resume:
        partial.write_text("")
    for run in group_cases(cases, loaded.space, spec.resources, node):
        if all(_value_key(c) in earlier for c in run.cases):
            continue  # an earlier doctor of this study found every value of this run
        m, seconds = smoke.run(run.config)
        for case in run.cases:
            if _value_key(case) in earlier:
                continue
            if m.outcome is Outcome.OK or len(run.cases) == 1 or case.config is None:
                found[id(case)] = (m, seconds, run.config.key())
            else:  # which value failed: each runs alone
                found[id(case)] = (*smoke.run(case.config), case.config.key())
            row = _row(case, *found[id(case)])
            with partial.open("a") as fh:
                fh.write(json.dumps(asdict(row)) + "\n")
            if on_row is not None:
                on_row(row)
    rows = _unblamed(
        [earlier.get(_value_key(c)) or _row(c, *found.get(id(c), (None, None, None))) for c in cases]
    )
    report = DoctorReport(
        study=spec.name,
        gpu_model=spec.resources.model,
        node=facts,
        device=node.device,
        rows=rows,
        seconds=time.monotonic() - started,
        measured=measured,
    )
    (folder / "doctor.json").write_text(report.to_json())
    return report


def _value_key(case: Case | Row) -> tuple[str, str]:
    return case.knob, json.dumps(case.value)


def _rows_found(partial: Path) -> dict[tuple[str, str], Row]:
    """The rows an earlier doctor of this study wrote as it found them (``rows.jsonl``), by value."""
    lines = partial.read_text().splitlines() if partial.is_file() else []
    rows = [Row(**json.loads(line)) for line in lines if line.strip()]
    return {_value_key(r): r for r in rows}


class _Smoke:
    """Smoke runs of one study's configurations, each once, through ``run_trial`` (warm)."""

    def __init__(self, loaded: LoadedStudy) -> None:
        self.loaded = loaded
        self.measurement = MeasurementSpec.model_validate(
            {**SMOKE, "trial_timeout_s": loaded.spec.measurement.trial_timeout_s}
        )
        self.done: dict[str, tuple[Measurement, float]] = {}

    def run(self, config: TrialConfig) -> tuple[Measurement, float]:
        from explorer.launch import launcher_section, run_trial
        from explorer.spec import RayLauncherSpec

        key = config.key()
        if key not in self.done:
            spec = self.loaded.spec
            ray = launcher_section(spec, RayLauncherSpec)  # the CLI refuses a study where nothing runs
            n = len(self.done)
            job = replace(
                TrialJob.for_study(self.loaded, config, trial_number=n), measurement=self.measurement
            )
            t0 = time.monotonic()
            result = run_trial(
                job,
                work_dir=self.loaded.output_dir / "doctor" / f"run-{n}",
                runner=ray.runner,
                timeout_s=spec.measurement.trial_timeout_s,
                warm_start=ray.warm_start,
            )
            self.done[key] = (result, time.monotonic() - t0)
        return self.done[key]
