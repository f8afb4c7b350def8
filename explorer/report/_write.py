"""``explorer report``: the study's figures as PNG files, one HTML page, and Optuna artifacts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from explorer.report._artifacts import attach_artifacts
from explorer.report._figures import (
    HEIGHT_PX,
    WIDTH_PX,
    draw_feasibility,
    draw_history,
    draw_importances,
    draw_memory,
    draw_pareto,
    draw_throughput,
)
from explorer.report._html import ReportFigure, write_html
from explorer.report._points import Kind, TrialPoint, points_of

if TYPE_CHECKING:
    import optuna

    from explorer.spec import LoadedStudy

__all__ = ["FIGURES", "Report", "write_report"]

FIGURES = ("history", "throughput", "feasibility", "importances", "pareto", "memory")
"""The PNG files a report may hold (``pareto`` for multi-objective studies only)."""


@dataclass(frozen=True)
class Report:
    """What :func:`write_report` wrote.

    Attributes:
        folder: The report folder.
        html: The HTML page in it.
        figures: The figures, in page order.
        artifact_ids: The Optuna artifact id of each figure, by file name.
        artifact_dir: The :class:`optuna.artifacts.FileSystemArtifactStore` folder.
    """

    folder: Path
    html: Path
    figures: tuple[ReportFigure, ...]
    artifact_ids: dict[str, str]
    artifact_dir: Path


def _domain_values(loaded: LoadedStudy, name: str) -> list[int]:
    domain = loaded.space.domains.get(name)
    values = getattr(domain, "values", ()) if domain is not None else ()
    return [int(v) for v in values if isinstance(v, int) and not isinstance(v, bool)]


def write_report(loaded: LoadedStudy, out: Path | None = None) -> Report:
    """Draw the study's figures into ``out`` (default ``<output_dir>/report``), write
    ``index.html`` beside them, and attach the figures to the study as Optuna artifacts (store
    ``<output_dir>/artifacts``).

    Raises:
        SpecError: the study does not exist, or a file it would write resolves outside its folder
            (:mod:`explorer.paths`); nothing is written then.
    """
    import optuna

    from explorer.paths import inside
    from explorer.study import open_existing_study

    study = open_existing_study(loaded)
    folder = out if out is not None else loaded.output_dir / "report"
    where = str(loaded.file)
    if out is None:
        inside(loaded.output_dir, [folder], file=where)
    inside(folder, [folder / f"{name}.png" for name in FIGURES] + [folder / "index.html"], file=where)
    inside(loaded.output_dir, [loaded.output_dir / "artifacts"], file=where)
    folder.mkdir(parents=True, exist_ok=True)
    points = points_of(study)
    repeats = {p.number for p in points if not p.measured}
    feasible = [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if t.user_attrs.get("status") == "ok" and t.number not in repeats
    ]
    figures = _draw_figures(loaded, study, points, feasible, folder)
    artifact_dir = loaded.output_dir / "artifacts"
    ids = attach_artifacts(study, [f.path for f in figures], artifact_dir)
    facts = _facts(loaded, study, points, repeats, artifact_dir)
    html = write_html(
        folder / "index.html",
        heading=f"explorer report: study {loaded.spec.name!r}",
        facts=facts,
        figures=figures,
        artifact_ids=ids,
        size=(WIDTH_PX, HEIGHT_PX),
    )
    return Report(
        folder=folder, html=html, figures=tuple(figures), artifact_ids=ids, artifact_dir=artifact_dir
    )


def _draw_figures(
    loaded: LoadedStudy,
    study: optuna.Study,
    points: list[TrialPoint],
    feasible: list[optuna.trial.FrozenTrial],
    folder: Path,
) -> list[ReportFigure]:
    """Draw every figure into ``folder``, in page order."""
    from explorer.study import OBJECTIVE

    figures = [
        ReportFigure(
            draw_history(points, study.directions, study.metric_names, folder / "history.png"),
            "Optimization history",
            "Objective per trial number: feasible, OOM, inferred OOM, invalid and failed trials "
            "marked apart (hollow: a repeat answered from an earlier trial); infeasible trials sit "
            "at their placeholder value 0. The line is the best feasible value so far.",
        ),
        ReportFigure(
            draw_throughput(points, folder / "throughput.png"),
            "Throughput by batch size",
            f"{OBJECTIVE} of the feasible measured trials against per-device and global batch "
            "size, one line per (strategy, checkpointing); the best where several trials share a "
            "point.",
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
    cap = loaded.spec.resources.device_memory_gib
    figures.append(
        ReportFigure(
            draw_memory(points, cap, folder / "memory.png"),
            "Measured memory",
            "peak_memory_gib of the feasible measured trials against per-device tokens; measured "
            "OOMs at the cap. No memory estimate is drawn: the package has none.",
        )
    )
    return figures


def _facts(
    loaded: LoadedStudy, study: optuna.Study, points: list[TrialPoint], repeats: set[int], artifact_dir: Path
) -> list[str]:
    """The report page's lines about the study, above the figures."""
    from explorer.secrets import mask_url

    counts = Counter(p.kind for p in points)
    return [
        f"storage: {mask_url(loaded.storage_url)}",
        f"directions: {', '.join(d.name.lower() for d in study.directions)}",
        "trials: " + ", ".join(f"{k.value} {counts[k]}" for k in Kind if counts[k]),
        f"{len(repeats)} of them answered without a run of their own (repeats, inferred OOMs)",
        f"Optuna artifacts: FileSystemArtifactStore at {artifact_dir}",
    ]
