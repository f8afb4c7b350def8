"""What the report page says above its figures: the best configuration with its figures and the
command that writes it out, the top configurations with why each lost to the best, and facts about
the study. The template (``templates/index.html.j2``) lays it out."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from explorer.report._headroom import memory_flag
from explorer.report._points import Kind, TrialPoint
from explorer.report._ranking import RankedTrial, behind_best, feasible_ranking, noise_tolerance
from explorer.study import describe

if TYPE_CHECKING:
    import optuna

    from explorer.report._html import ReportFigure
    from explorer.spec import LoadedStudy
    from explorer.trial_config import TrialConfig

__all__ = ["TOP", "TopRow", "page_context", "parameters", "top_rows"]

TOP = 10
"""Rows of the top-configurations table (the best included)."""


@dataclass(frozen=True)
class TopRow:
    """A row of the top-configurations table: the trial, its short form, why it lost to the best."""

    trial: RankedTrial
    description: str
    reason: str


def parameters(config: TrialConfig) -> list[tuple[str, str]]:
    """A configuration's parameters as the user writes them (batch size, not its log2), with the
    per-device batch size it implies after the batch size; unset ones left out."""
    rows: list[tuple[str, str]] = []
    for name, value in config.to_dict().items():
        if value is None:
            continue
        rows.append((name, str(value)))
        if name == "batch_size":
            rows.append(("per-device batch size", str(config.per_device_batch_size)))
    return rows


def top_rows(ranked: Sequence[RankedTrial], tolerance: float, limit: int = TOP) -> list[TopRow]:
    """The first ``limit`` of ``ranked`` (best first), each with why it lost to the first."""
    best = ranked[0]
    return [
        TopRow(t, describe(t.config), "best" if i == 0 else behind_best(t, best, tolerance))
        for i, t in enumerate(ranked[:limit])
    ]


def _best_part(loaded: LoadedStudy, study: optuna.Study) -> dict[str, Any]:
    """The template's variables about the best configuration (``best`` None without one)."""
    from explorer.commands import MASKED_NOTE, command
    from explorer.study import named_best

    chosen, _ = named_best(study)  # confirmed, or the most robust of a tie
    ranking = sorted(feasible_ranking(study), key=lambda t: t.number != chosen)  # stable
    if not ranking:
        return {"best": None}
    ranked = [RankedTrial.of(t) for t in ranking]
    tolerance = noise_tolerance(ranking[0])
    floor = ranked[0].per_gpu * (1.0 - tolerance)
    text, masked = command("best", loaded)
    spec = loaded.spec
    flag = memory_flag(ranking, margin=spec.memory_margin, cap_gib=spec.resources.device_memory_gib)
    return {
        "best": ranked[0],
        "memory_flag": flag.lines() if flag is not None else None,
        "parameters": parameters(ranked[0].config),
        "command": text,
        "masked_note": MASKED_NOTE if masked else None,
        "tolerance": tolerance,
        "runners_up": sum(1 for t in ranked[1:] if t.per_gpu >= floor),
        "top": top_rows(ranked, tolerance),
    }


def facts(
    loaded: LoadedStudy, study: optuna.Study, points: Sequence[TrialPoint], artifact_dir: Path
) -> list[str]:
    """The page's lines about the study."""
    from explorer.secrets import mask_url

    counts = Counter(p.kind for p in points)
    repeats = sum(1 for p in points if not p.measured)
    return [
        f"storage: {mask_url(loaded.storage_url)}",
        f"directions: {', '.join(d.name.lower() for d in study.directions)}",
        "trials: " + ", ".join(f"{k.value} {counts[k]}" for k in Kind if counts[k]),
        f"{repeats} of them answered without a run of their own (repeats, inferred OOMs)",
        f"Optuna artifacts: FileSystemArtifactStore at {artifact_dir}",
    ]


def page_context(
    loaded: LoadedStudy,
    study: optuna.Study,
    points: Sequence[TrialPoint],
    figures: Sequence[ReportFigure],
    artifact_ids: Mapping[str, str],
    artifact_dir: Path,
    size: tuple[int, int],
    *,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """Every variable of the page's template (``notes``: lines about figures left out, and how to
    get them)."""
    return {
        "heading": f"explorer report: study {loaded.spec.name!r}",
        "cap": loaded.spec.resources.device_memory_gib,
        **_best_part(loaded, study),
        "facts": facts(loaded, study, points, artifact_dir),
        "figures": list(figures),
        "notes": list(notes),
        "artifact_ids": dict(artifact_ids),
        "size": size,
    }
