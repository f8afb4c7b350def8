"""``explorer report``: the study's figures as PNG files, one HTML page, and Optuna artifacts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from explorer.record import Status, TrialRecord
from explorer.report._artifacts import attach_artifacts
from explorer.report._canvas import HEIGHT_PX, WIDTH_PX
from explorer.report._figures import draw_feasibility, draw_history, draw_importances, draw_pareto
from explorer.report._html import ReportFigure, write_html
from explorer.report._memory import draw_frontier, draw_memory
from explorer.report._page import page_context
from explorer.report._points import TrialPoint, points_of
from explorer.report._throughput import draw_gpu_scaling, draw_throughput

if TYPE_CHECKING:
    import optuna

    from explorer.spec import LoadedStudy

__all__ = ["FIGURES", "Report", "TimeAndCost", "write_report"]

FIGURES = (
    "throughput",
    "frontier",
    "gpus",
    "memory",
    "time_cost",
    "history",
    "feasibility",
    "importances",
    "pareto",
)
"""The PNG files a report may hold, in page order (``pareto`` for multi-objective studies only,
``time_cost`` for a study file with a ``budget``)."""

TimeAndCost: TypeAlias = "Callable[[LoadedStudy, optuna.Study, Path], ReportFigure | str]"
"""Draws the "time and cost" figure into the report folder, or returns the line the page shows
instead (:func:`explorer.plan.time_and_cost`: the plan imports the report, so the CLI hands it in)."""


@dataclass(frozen=True)
class Report:
    """What :func:`write_report` wrote.

    Attributes:
        folder: The report folder.
        html: The HTML page in it.
        figures: The figures, in page order.
        artifact_ids: The Optuna artifact id of each figure, by file name.
        artifact_dir: The :class:`optuna.artifacts.FileSystemArtifactStore` folder.
        memory_flag: The page's flag on a best configuration near its memory limit (lines).
        verdict: What the confirmation says of the best (lines; also among the page's notes).
    """

    folder: Path
    html: Path
    figures: tuple[ReportFigure, ...]
    artifact_ids: dict[str, str]
    artifact_dir: Path
    memory_flag: tuple[str, ...] = ()
    verdict: tuple[str, ...] = ()


def _domain_values(loaded: LoadedStudy, name: str) -> list[int]:
    domain = loaded.space.domains.get(name)
    values = getattr(domain, "values", ()) if domain is not None else ()
    return [int(v) for v in values if isinstance(v, int) and not isinstance(v, bool)]


def write_report(
    loaded: LoadedStudy, out: Path | None = None, *, time_and_cost: TimeAndCost | None = None
) -> Report:
    """Draw the study's figures into ``out`` (default ``<output_dir>/report``), write
    ``index.html`` beside them (the best configuration, the top ten, the figures), and attach the
    figures to the study as Optuna artifacts (store ``<output_dir>/artifacts``). With
    ``time_and_cost``, its figure follows the memory one (or its line joins the page's notes).

    Raises:
        SpecError: the study does not exist, or a file it would write resolves outside its folder
            (:mod:`explorer.paths`); nothing is written then.
    """
    import optuna

    from explorer.paths import claim_out, inside
    from explorer.study import is_read_only, open_existing_study, recorded_run_folder, verdict_lines

    study = open_existing_study(loaded)
    loaded = recorded_run_folder(study, loaded)  # where the study's files live, as every verb has it
    folder = out if out is not None else loaded.output_dir / "report"
    where = str(loaded.file)
    if out is None:
        inside(loaded.output_dir, [folder], file=where)
    inside(folder, [folder / f"{name}.png" for name in FIGURES] + [folder / "index.html"], file=where)
    if out is not None:  # the user's folder: no file of theirs is overwritten
        claim_out(folder, [f"{name}.png" for name in FIGURES] + ["index.html"], field="--out")
    inside(loaded.output_dir, [loaded.output_dir / "artifacts"], file=where)
    folder.mkdir(parents=True, exist_ok=True)
    points = points_of(study)
    repeats = {p.number for p in points if not p.measured}
    feasible = [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if TrialRecord.of(t).status == Status.OK and t.number not in repeats
    ]
    figures = _throughput_figures(loaded, points, folder)
    verdict = verdict_lines(study, where)
    notes = list(verdict)
    extra = time_and_cost(loaded, study, folder) if time_and_cost is not None else None
    if isinstance(extra, str):
        notes.append(extra)
    elif extra is not None:
        figures.append(extra)
    figures += _search_figures(loaded, study, points, feasible, folder)
    artifact_dir = loaded.output_dir / "artifacts"
    # a study on read-only storage stores no artifacts: its figures are in the report folder
    ids = {} if is_read_only(study) else attach_artifacts(study, [f.path for f in figures], artifact_dir)
    context = page_context(
        loaded, study, points, figures, ids, artifact_dir, (WIDTH_PX, HEIGHT_PX), notes=notes
    )
    html = write_html(folder / "index.html", context)
    return Report(
        folder=folder,
        html=html,
        figures=tuple(figures),
        artifact_ids=ids,
        artifact_dir=artifact_dir,
        memory_flag=tuple(context.get("memory_flag") or ()),
        verdict=tuple(verdict),
    )


def _throughput_figures(loaded: LoadedStudy, points: list[TrialPoint], folder: Path) -> list[ReportFigure]:
    """The figures about throughput and memory, in page order."""
    from explorer.study import OBJECTIVE

    cap = loaded.spec.resources.device_memory_gib
    capped = f"the cap ({cap:g} GiB, resources.device_memory_gib)" if cap else "no cap (none set)"
    return [
        ReportFigure(
            draw_throughput(points, folder / "throughput.png"),
            "Throughput by tokens per micro-step",
            f"{OBJECTIVE} of the feasible trials that measured it, against the tokens a micro-step "
            "holds (batch x sequence length; padding and gradient accumulation aside), per device "
            "and over all devices, one colour per sequence length: every trial faint, the line "
            "through the best at each x over the other parameters, the best trial a star. "
            "Infeasible and failed trials have no throughput and are not drawn.",
        ),
        ReportFigure(
            draw_frontier(points, cap, folder / "frontier.png"),
            "Throughput against peak memory",
            "Every feasible measured trial; the red staircase is the Pareto front (no other trial "
            f"is faster per GPU with no more memory), each labelled with its configuration; {capped} "
            "dashed.",
        ),
        ReportFigure(
            draw_gpu_scaling(points, folder / "gpus.png"),
            "Total throughput by GPU count",
            "dataset_tokens_per_second (all GPUs together) of every feasible measured trial by "
            "strategy, spread sideways at each GPU count; the black line is the best at each "
            "count, the dashed line linear scaling of the best at the fewest GPUs, and the labels "
            "the share of linear scaling reached.",
        ),
        ReportFigure(
            draw_memory(points, cap, folder / "memory.png"),
            "Measured memory",
            "peak_memory_gib of the feasible measured trials against the tokens a micro-step holds "
            "per device; colour: strategy, marker: checkpointing, each group shifted sideways so "
            f"none hides another. Dashed red: {capped}. Measured OOMs (no peak) are red crosses "
            "above it; inferred OOMs (never run) are not drawn. On a CPU the cap limits address "
            "space above the process's size before the model was built, while the peak is its "
            "resident memory above that point, so a feasible CPU trial can peak a little above "
            "the cap (circled).",
        ),
    ]


def _search_figures(
    loaded: LoadedStudy,
    study: optuna.Study,
    points: list[TrialPoint],
    feasible: list[optuna.trial.FrozenTrial],
    folder: Path,
) -> list[ReportFigure]:
    """The figures about the search itself, in page order."""
    figures = [
        ReportFigure(
            draw_history(points, study.directions, study.metric_names, folder / "history.png"),
            "Optimization history",
            "Objective per trial number for the feasible trials (hollow: a repeat answered from an "
            "earlier trial), with the best feasible value so far; OOM, inferred OOM, invalid and "
            "failed trials have no value and sit in the strip below, one row each.",
        ),
        ReportFigure(
            draw_feasibility(
                points,
                _domain_values(loaded, "batch_size"),
                _domain_values(loaded, "number_gpus"),
                folder / "feasibility.png",
            ),
            "Feasibility map",
            "GPU count x global batch size over every other parameter: fit (all fit), OOM (all ran "
            "out, inferred OOMs included), mixed (some of each), invalid, not measured; the text "
            "is fitting/measured configurations, the thick edge the first OOM per GPU count.",
        ),
        ReportFigure(
            draw_importances(study, feasible, folder / "importances.png"),
            "Parameter importances",
            "PED-ANOVA (Optuna's get_param_importances, its default evaluator) over the feasible "
            "COMPLETE trials that ran, on Optuna's parameters (log2_batch_size is the batch size); "
            "with too few trials, or no parameter that varied, the figure says so.",
        ),
    ]
    if len(study.directions) > 1:
        figures.append(
            ReportFigure(
                draw_pareto(study, feasible, folder / "pareto.png"),
                "Pareto front",
                "The feasible trials on the first two objectives, and study.best_trials.",
            )
        )
    return figures
