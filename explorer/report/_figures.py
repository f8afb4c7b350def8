"""The report's figures about the search: optimization history, feasibility map, parameter
importances, Pareto front (the ones about throughput and memory are in ``_throughput`` and
``_memory``). Each function writes a figure even when there is nothing to draw: a panel that says why.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from explorer.report._canvas import message, new_figure, save
from explorer.report._points import Kind, TrialPoint
from explorer.study._objectives import pareto_front

if TYPE_CHECKING:
    import optuna
    from matplotlib.axes import Axes

__all__ = [
    "FeasibilityCell",
    "draw_feasibility",
    "draw_history",
    "draw_importances",
    "draw_pareto",
    "feasibility_cells",
]

_STYLE = {
    Kind.FEASIBLE: ("o", "tab:blue"),
    Kind.OOM: ("X", "tab:red"),
    Kind.INFERRED: ("x", "tab:pink"),
    Kind.INVALID: ("^", "tab:orange"),
    Kind.FAILED: ("v", "tab:gray"),
}
_CELL_COLOURS = {
    "fit": "#4caf50",
    "mixed": "#ffc107",
    "OOM": "#e53935",
    "invalid": "#bdbdbd",
    "not measured": "#ffffff",
}


def _label(metric_names: Sequence[str] | None, i: int, direction: optuna.study.StudyDirection) -> str:
    name = metric_names[i] if metric_names and i < len(metric_names) else f"objective {i}"
    return f"{name} ({direction.name.lower()})"


_NO_VALUE = (Kind.OOM, Kind.INFERRED, Kind.INVALID, Kind.FAILED)
"""Outcomes without a throughput: drawn in a strip of their own, never as a value of 0."""


def _draw_values(ax: Axes, points: Sequence[TrialPoint], i: int, maximize: bool) -> None:
    """Feasible trials' objective ``i`` (hollow: a repeat) and the best feasible so far."""
    marker, colour = _STYLE[Kind.FEASIBLE]
    for repeat in (False, True):
        chosen = [
            p for p in points if p.kind is Kind.FEASIBLE and p.values is not None and p.repeat is repeat
        ]
        if chosen:
            ax.scatter(
                [p.number for p in chosen],
                [p.values[i] for p in chosen if p.values is not None],
                marker=marker,
                facecolors="none" if repeat else colour,
                edgecolors=colour,
                label="feasible" + (" (repeat, not run)" if repeat else ""),
                zorder=3,
            )
    best = -math.inf if maximize else math.inf
    xs, ys = [], []
    for p in points:
        if p.kind is Kind.FEASIBLE and p.values is not None:
            best = max(best, p.values[i]) if maximize else min(best, p.values[i])
        if math.isfinite(best):
            xs.append(p.number)
            ys.append(best)
    if xs:
        ax.step(xs, ys, where="post", color="tab:green", label="best feasible so far", zorder=2)
    else:
        ax.text(0.5, 0.5, "no feasible trial yet", transform=ax.transAxes, ha="center", fontsize=12)


def _draw_outcomes(ax: Axes, points: Sequence[TrialPoint]) -> None:
    """One row per outcome without a value (OOM, inferred OOM, invalid, failed): where they fell."""
    for row, kind in enumerate(_NO_VALUE):
        marker, colour = _STYLE[kind]
        chosen = [p.number for p in points if p.kind is kind]
        ax.scatter(chosen, [row] * len(chosen), marker=marker, color=colour, zorder=3)
    ax.set_yticks(range(len(_NO_VALUE)), [k.value.replace("infeasible: ", "") for k in _NO_VALUE])
    from matplotlib.ticker import MaxNLocator

    ax.set_ylim(-0.6, len(_NO_VALUE) - 0.4)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial number")
    ax.grid(axis="x", alpha=0.3)


def draw_history(
    points: Sequence[TrialPoint],
    directions: Sequence[optuna.study.StudyDirection],
    metric_names: Sequence[str] | None,
    path: Path,
) -> Path:
    """Objective per trial number, one column per study direction.

    The feasible trials' values are on top (repeats answered from an earlier trial hollow), with
    the best feasible value so far (of that objective alone, where there are several); OOM,
    inferred OOM, invalid and failed trials have no value, and sit in a strip below, one row each.
    """
    import optuna

    if not points:
        return message(path, "Optimization history", "no finished trials yet")
    fig = new_figure()
    grid = fig.add_gridspec(2, len(directions), height_ratios=(4, 1.3))
    for i, direction in enumerate(directions):
        top = fig.add_subplot(grid[0, i])
        strip = fig.add_subplot(grid[1, i], sharex=top)
        _draw_values(top, points, i, direction == optuna.study.StudyDirection.MAXIMIZE)
        top.set_ylabel(_label(metric_names, i, direction))
        top.grid(alpha=0.3)
        top.tick_params(labelbottom=False)
        if i == 0 and top.get_legend_handles_labels()[0]:
            top.legend(fontsize=8, loc="lower right")
        _draw_outcomes(strip, points)
    fig.suptitle("Optimization history: feasible values above, trials without a value below")
    return save(fig, path)


@dataclass(frozen=True)
class FeasibilityCell:
    """What was measured at one (GPU count, global batch size).

    Attributes:
        fit: Distinct configurations that ran (status ok).
        oom: Distinct configurations that ran out of memory, measured or inferred.
        invalid: Distinct configurations refused before launch.
    """

    fit: int = 0
    oom: int = 0
    invalid: int = 0

    @property
    def category(self) -> str:
        """``fit``, ``mixed`` (some fit, some ran out), ``OOM``, ``invalid`` or ``not measured``."""
        if self.fit and self.oom:
            return "mixed"
        if self.fit:
            return "fit"
        if self.oom:
            return "OOM"
        return "invalid" if self.invalid else "not measured"


def feasibility_cells(points: Sequence[TrialPoint]) -> dict[tuple[int, int], FeasibilityCell]:
    """Per (GPU count, global batch size), the distinct configurations by outcome (repeats skipped)."""
    counted: dict[tuple[int, int], dict[Kind, int]] = defaultdict(lambda: defaultdict(int))
    for p in points:
        if p.repeat or p.config is None or p.kind is Kind.FAILED:
            continue
        counted[(p.config.number_gpus, p.config.batch_size)][p.kind] += 1
    return {
        key: FeasibilityCell(
            fit=c[Kind.FEASIBLE], oom=c[Kind.OOM] + c[Kind.INFERRED], invalid=c[Kind.INVALID]
        )
        for key, c in counted.items()
    }


def draw_feasibility(
    points: Sequence[TrialPoint], batch_sizes: Sequence[int], gpu_counts: Sequence[int], path: Path
) -> Path:
    """A grid of global batch size x GPU count, coloured by what every configuration there did.

    A cell is ``fit`` when every configuration measured there ran, ``OOM`` when every one ran out
    of memory (inferred OOMs included), ``mixed`` when some did each (the other parameters
    decide: checkpointing, sharding...), ``invalid`` when all were refused before launch, and
    ``not measured`` otherwise; the text is "fitting / measured". A thick black edge marks, per
    GPU count, the first batch size where anything ran out of memory.
    """
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    cells = feasibility_cells(points)
    xs = sorted(set(batch_sizes) | {b for _, b in cells})
    ys = sorted(set(gpu_counts) | {g for g, _ in cells})
    title = (
        "Feasibility by GPU count x global batch size\n"
        "(over the other parameters: mixed = some configurations fit, some ran out of memory)"
    )
    if not xs or not ys:
        return message(path, title, "no configuration recorded yet")
    categories = list(_CELL_COLOURS)
    grid = [[categories.index(cells.get((g, b), FeasibilityCell()).category) for b in xs] for g in ys]
    fig = new_figure()
    ax = fig.add_subplot()
    cmap = ListedColormap(list(_CELL_COLOURS.values()))
    ax.imshow(grid, cmap=cmap, vmin=-0.5, vmax=len(categories) - 0.5, aspect="auto", origin="lower")
    for row, g in enumerate(ys):
        first_oom = None
        for col, b in enumerate(xs):
            cell = cells.get((g, b))
            if cell is None:
                continue
            total = cell.fit + cell.oom + cell.invalid
            ax.text(col, row, f"{cell.fit}/{total}", ha="center", va="center", fontsize=9)
            if first_oom is None and cell.oom:
                first_oom = col
        if first_oom is not None:
            ax.plot([first_oom - 0.5] * 2, [row - 0.5, row + 0.5], color="black", linewidth=4)
    ax.set_xticks(range(len(xs)), [str(b) for b in xs])
    ax.set_yticks(range(len(ys)), [str(g) for g in ys])
    ax.set_xlabel("global batch size")
    ax.set_ylabel("number of GPUs")
    handles = [Patch(facecolor=c, edgecolor="black", label=k) for k, c in _CELL_COLOURS.items()]
    handles.append(Patch(facecolor="black", label="| first OOM in the row"))
    ax.legend(
        handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, title="fitting/measured"
    )
    ax.set_title(title)
    return save(fig, path)


def _lower_is_better(
    i: int, direction: optuna.study.StudyDirection
) -> Callable[[optuna.trial.FrozenTrial], float]:
    """Objective ``i`` signed so that lower is better (PED-ANOVA rates what leads to low targets)."""
    sign = -1.0 if direction.name == "MAXIMIZE" else 1.0

    def target(trial: optuna.trial.FrozenTrial) -> float:
        return sign * float(trial.values[i])

    return target


def draw_importances(study: optuna.Study, trials: Sequence[optuna.trial.FrozenTrial], path: Path) -> Path:
    """PED-ANOVA parameter importances (Optuna 5's default evaluator) over ``trials``, one panel
    per objective: which parameter values the top 10% of the trials concentrate on. Conditional
    parameters (the FSDP ones) are rated within the trials that have them.

    Args:
        study: The study (for its directions and metric names).
        trials: The feasible COMPLETE trials that measured something.
        path: Where to write the PNG.
    """
    import optuna

    title = "Parameter importances (PED-ANOVA over the feasible trials)"
    varied = {
        name
        for name in {n for t in trials for n in t.params}
        if len({t.params.get(name) for t in trials}) > 1
    }
    if len(trials) < 2 or not varied:
        why = f"{len(trials)} feasible trial(s)" + ("" if varied else ", no parameter took two values")
        return message(path, title, f"not enough to rate parameters: {why}")
    subset = optuna.create_study(directions=study.directions)
    subset.add_trials(trials)
    fig = new_figure()
    axes = fig.subplots(1, len(study.directions), squeeze=False)[0]
    for i, ax in enumerate(axes):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "lower target is better": the sign sees to it
                importances = optuna.importance.get_param_importances(
                    subset,
                    evaluator=optuna.importance.PedAnovaImportanceEvaluator(),
                    target=_lower_is_better(i, study.directions[i]),
                )
        except (RuntimeError, ValueError, ZeroDivisionError) as exc:
            ax.set_axis_off()
            ax.text(0.5, 0.5, f"cannot rate: {exc}", ha="center", va="center", wrap=True)
            continue
        names = list(importances)[::-1]
        ax.barh(names, [importances[n] for n in names], color="tab:blue")
        ax.set_xlabel("importance (normalized to sum 1)")
        ax.set_title(_label(study.metric_names, i, study.directions[i]), fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"{title}: {len(trials)} trials")
    return save(fig, path)


def draw_pareto(study: optuna.Study, trials: Sequence[optuna.trial.FrozenTrial], path: Path) -> Path:
    """The first two objectives of the feasible trials, with the Pareto front (``study.best_trials``,
    without repeats).

    Args:
        study: A study with two or more directions.
        trials: The feasible COMPLETE trials that measured something.
        path: Where to write the PNG.
    """
    title = "Pareto front" + (" (first two objectives)" if len(study.directions) > 2 else "")
    front = pareto_front(study)  # each configuration once: repeats answered from another are not
    if not trials and not front:
        return message(path, title, "no feasible trial yet")
    fig = new_figure()
    ax = fig.add_subplot()
    ax.scatter(
        [t.values[0] for t in trials],
        [t.values[1] for t in trials],
        color="tab:gray",
        label="feasible trials",
    )
    front.sort(key=lambda t: (t.values[0], t.values[1]))
    ax.plot(
        [t.values[0] for t in front],
        [t.values[1] for t in front],
        marker="o",
        color="tab:red",
        label=f"Pareto front ({len(front)} trials)",
    )
    for t in front:
        ax.annotate(f"#{t.number}", (t.values[0], t.values[1]), textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel(_label(study.metric_names, 0, study.directions[0]))
    ax.set_ylabel(_label(study.metric_names, 1, study.directions[1]))
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title)
    return save(fig, path)
