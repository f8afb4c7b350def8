"""``explorer plan``: how long and how much the real run takes on each candidate, from the
studies' trials (several studies of one workload on different GPU models compare the models)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from explorer.errors import SpecError
from explorer.plan._job import PlanJob
from explorer.plan._rows import PlanRow, StudyRows, candidates, study_rows
from explorer.plan._scaling import HeldBack, held_back
from explorer.plan._table import Marks, mark_rows, table_lines

if TYPE_CHECKING:
    import optuna

    from explorer.best import BestFiles
    from explorer.spec import LoadedStudy

__all__ = ["Plan", "make_plan", "plan_lines", "same_workload", "write_chosen"]


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Every candidate run, the marks, and each study's scaling fit with its held-back error."""

    job: PlanJob
    rows: list[PlanRow]
    marks: Marks
    studies: list[StudyRows]
    held_back: dict[str, HeldBack]
    """Study name -> the fit's error on each configuration's largest measured GPU count, held
    back from the fit and predicted from the rest."""


def same_workload(loaded: Sequence[LoadedStudy]) -> None:
    """Several studies plan one job only when they fine-tune the same workload.

    Raises:
        SpecError: a study whose workload differs from the first's (naming what differs).
    """
    first = loaded[0].spec.workload.model_dump()
    for other in loaded[1:]:
        theirs = other.spec.workload.model_dump()
        differ = sorted(k for k in first.keys() | theirs.keys() if first.get(k) != theirs.get(k))
        if differ:
            raise SpecError(
                file=str(other.file),
                field="workload." + differ[0],
                problem=f"differs from {loaded[0].file}'s: a plan compares one workload on other hardware",
            )


def make_plan(studies: Sequence[tuple[LoadedStudy, optuna.Study]], job: PlanJob) -> Plan:
    """The plan for ``job`` from the finished ``studies``.

    Raises:
        SpecError: a study without a measured feasible trial.
    """
    per_study = []
    for loaded, study in studies:
        rows = study_rows(loaded, study)
        if not rows.measured:
            raise SpecError(
                file=str(loaded.file),
                field="",
                problem=f"study {loaded.spec.name!r} has no feasible trial to plan from",
            )
        per_study.append(rows)
    all_rows = [row for rows in per_study for row in candidates(rows, job)]
    if not all_rows:
        measured = sorted({r.config.global_batch for rows in per_study for r in rows.measured})
        raise SpecError(
            file="--global-batch",
            field="",
            problem=f"no configuration with global batch {job.global_batch} was measured or can be "
            f"extrapolated (measured: {', '.join(map(str, measured))})",
        )
    return Plan(
        job=job,
        rows=all_rows,
        marks=mark_rows(all_rows, job),
        studies=per_study,
        held_back={rows.study: held_back(rows.points) for rows in per_study},
    )


def _job_lines(job: PlanJob) -> list[str]:
    deadline = f"; deadline {job.deadline_hours:,.1f} h" if job.deadline_hours else ""
    limit = f"; at most {job.max_gpus} GPUs" if job.max_gpus else ""
    limit += f"; global batch {job.global_batch}" if job.global_batch else ""
    prices = ", ".join(f"{m} ${p:,.2f}" for m, p in sorted(job.prices.items())) or "none given"
    return [
        f"job: {job.tokens:,.0f} dataset tokens x {job.epochs:g} epochs = {job.total_tokens:,.0f} tokens"
        f"{deadline}{limit}",
        f"prices per GPU-hour: {prices}",
    ]


def _mark_lines(plan: Plan) -> list[str]:
    lines = []
    job, marks = plan.job, plan.marks
    for label, row in (
        ("fastest", marks.fastest),
        ("cheapest", marks.cheapest),
        ("cheapest by the deadline", marks.by_deadline),
    ):
        if row is None:
            continue
        cost = row.cost(job)
        paid = f", ${cost:,.2f}" if cost is not None else ""
        how = "extrapolated" if row.extrapolated else f"measured in {row.study} trial {row.trial}"
        lines.append(
            f"{label}: {row.number_gpus} x {row.gpu_model}, {row.hours(job):,.2f} h, "
            f"{row.gpu_hours(job):,.1f} GPU-h{paid} ({how})"
        )
        lines += _memory_lines(plan, row)
    if job.deadline_hours is not None and marks.by_deadline is None:
        lines.append(f"cheapest by the deadline: none meets {job.deadline_hours:,.1f} h")
    notes = sorted(
        {part for r in plan.rows if r.extrapolated for part in r.note.split("; ") if "nodes" in part}
    )
    lines += [f"extrapolated: {note}" for note in notes]
    unbounded: dict[str, list[str]] = {}
    for r in sorted(plan.rows, key=lambda r: r.number_gpus):
        if not r.markable:
            unbounded.setdefault(r.to_bound, []).append(f"{r.number_gpus} x {r.gpu_model}")
    lines += [f"not marked ({', '.join(where)}): {why}" for why, where in unbounded.items()]
    missing = sorted({r.gpu_model for r in plan.rows} - set(job.prices))
    if missing:
        lines.append(f"no price for {', '.join(missing)}: give --price MODEL=USD_PER_GPU_HOUR to cost it")
    return lines


def _memory_lines(plan: Plan, row: PlanRow) -> list[str]:
    """A marked row whose trial came within its study's ``memory_margin`` of the memory limit: the
    flag, and the fastest measured row of that study and GPU count that leaves the margin."""
    if not row.near_limit or row.headroom is None:
        return []
    source = (
        f"trial {row.trial}" if row.trial is not None else f"trial {row.source_trial} (extrapolated from)"
    )
    lines = [
        f"  near the memory limit: {source} left {100 * row.headroom:.1f}% headroom, under the "
        f"{100 * row.margin:g}% memory_margin: the real run may run out of memory"
    ]
    rows = next(r for r in plan.studies if r.study == row.study)
    safe = [
        r
        for r in rows.measured
        if r.gpu_model == row.gpu_model and r.headroom is not None and r.headroom >= r.margin
    ]
    same = [r for r in safe if r.number_gpus == row.number_gpus] or safe
    if not same:
        return [*lines, f"  with headroom: no measured configuration leaves {100 * row.margin:g}%"]
    alt = same[0]
    return [
        *lines,
        f"  with headroom: {row.study}#{alt.trial}, {alt.number_gpus} x {alt.gpu_model}, "
        f"{alt.per_gpu:,.0f} tok/s/GPU, headroom {100 * (alt.headroom or 0.0):.1f}%",
    ]


def _fit_lines(plan: Plan) -> list[str]:
    lines = []
    for rows in plan.studies:
        lines.append(f"scaling fit of {rows.study} ({rows.gpu_model}):")
        lines += [f"  {line}" for line in rows.fit.describe()]
        lines += [f"  {line}" for line in plan.held_back[rows.study].describe()]
    return lines


def plan_lines(plan: Plan) -> list[str]:
    """What ``explorer plan`` prints: the job, the table, the marks, the fits and their errors."""
    return [
        *_job_lines(plan.job),
        "",
        *table_lines(plan.rows, plan.job, plan.marks),
        "",
        *_mark_lines(plan),
        "",
        *_fit_lines(plan),
    ]


def write_chosen(
    plan: Plan, studies: Sequence[tuple[LoadedStudy, optuna.Study]], out: Path | None, *, steps: int
) -> tuple[PlanRow, BestFiles] | None:
    """``explorer best``'s files for the plan's choice (cheapest by the deadline, else cheapest),
    in ``out`` (default: ``<output_dir>/plan`` of its study)."""
    from explorer.best import device_type_of, write_config

    row = plan.marks.chosen
    if row is None:
        return None
    loaded, study = next((lo, st) for lo, st in studies if lo.spec.name == row.study)
    how = "extrapolated" if row.extrapolated else f"trial {row.trial}"
    files = write_config(
        loaded,
        row.config,
        out or loaded.output_dir / "plan",
        steps=steps,
        trial_number=row.trial if row.trial is not None else -1,
        device_type=device_type_of(
            loaded, study.get_trials(deepcopy=False)[row.trial] if row.trial is not None else None
        ),
        title=f"explorer plan's choice from study {loaded.spec.name!r} ({how}): {row.number_gpus} x "
        f"{row.gpu_model}, {row.hours(plan.job):,.2f} h for {plan.job.total_tokens:,.0f} tokens.",
        claim=out is not None,
    )
    return row, files
