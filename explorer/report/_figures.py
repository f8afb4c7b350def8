"""The report's figures, drawn with matplotlib (Agg, imported lazily) into PNG files.

Every figure is ``WIDTH_PX`` x ``HEIGHT_PX`` pixels (constrained layout, no tight bounding box), and
each function writes a figure even when there is nothing to draw: a panel that says why.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from explorer.report._points import Kind, TrialPoint, setting_of
from explorer.study._objectives import pareto_front

if TYPE_CHECKING:
    import optuna
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "DPI",
    "HEIGHT_PX",
    "WIDTH_PX",
    "FeasibilityCell",
    "draw_feasibility",
    "draw_history",
    "draw_importances",
    "draw_memory",
    "draw_pareto",
    "draw_throughput",
    "feasibility_cells",
]

DPI = 100
WIDTH_PX = 1000
HEIGHT_PX = 600

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


def _figure() -> Figure:
    from matplotlib.figure import Figure  # lazily: `explorer --help` must not import matplotlib

    return Figure(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI, layout="constrained")


def _save(fig: Figure, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI, format="png")
    return path


def _message(path: Path, title: str, text: str) -> Path:
    """A figure that only says why there is nothing to draw."""
    fig = _figure()
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=12)
    return _save(fig, path)


def _label(metric_names: Sequence[str] | None, i: int, direction: optuna.study.StudyDirection) -> str:
    name = metric_names[i] if metric_names and i < len(metric_names) else f"objective {i}"
    return f"{name} ({direction.name.lower()})"


def draw_history(
    points: Sequence[TrialPoint],
    directions: Sequence[optuna.study.StudyDirection],
    metric_names: Sequence[str] | None,
    path: Path,
) -> Path:
    """Objective per trial number, one panel per study direction.

    Feasible, OOM, inferred OOM, invalid and failed trials each have their own marker and colour;
    repeats (answered from an earlier trial) are hollow. Infeasible trials sit at their
    placeholder value (0.0), failed ones (no value) at 0. The line is the best feasible value so
    far (of that objective alone, where there are several).
    """
    import optuna

    if not points:
        return _message(path, "Optimization history", "no finished trials yet")
    fig = _figure()
    axes = fig.subplots(1, len(directions), squeeze=False)[0]
    for i, (ax, direction) in enumerate(zip(axes, directions, strict=True)):
        for kind, (marker, colour) in _STYLE.items():
            for repeat in (False, True):
                chosen = [p for p in points if p.kind is kind and p.repeat is repeat]
                if not chosen:
                    continue
                ys = [p.values[i] if p.values is not None else 0.0 for p in chosen]
                label = kind.value + (" (repeat, not run)" if repeat else "")
                if kind is Kind.FAILED:
                    label += " (no value; at 0)"
                hollow = repeat and marker not in ("x", "X")
                ax.scatter(
                    [p.number for p in chosen],
                    ys,
                    marker=marker,
                    facecolors="none" if hollow else colour,
                    edgecolors=colour,
                    label=label,
                    zorder=3,
                )
        maximize = direction == optuna.study.StudyDirection.MAXIMIZE
        best = -math.inf if maximize else math.inf
        xs, ys = [], []
        for p in points:
            if p.kind is Kind.FEASIBLE and p.values is not None:
                v = p.values[i]
                best = max(best, v) if maximize else min(best, v)
            if math.isfinite(best):
                xs.append(p.number)
                ys.append(best)
        if xs:
            ax.step(xs, ys, where="post", color="tab:green", label="best feasible so far", zorder=2)
        ax.set_xlabel("trial number")
        ax.set_ylabel(_label(metric_names, i, direction))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="best")
    fig.suptitle("Optimization history (infeasible trials at their placeholder value 0)")
    return _save(fig, path)


def draw_throughput(points: Sequence[TrialPoint], path: Path) -> Path:
    """Measured throughput against per-device and global batch size, one line per setting.

    Only feasible trials that measured something (repeats left out, so no point counts twice).
    Where several trials share a setting and a batch size (other GPU counts, lengths...), the line
    goes through the best.
    """
    feasible = [
        p
        for p in points
        if p.kind is Kind.FEASIBLE and p.measured and p.config is not None and math.isfinite(p.objective)
    ]
    title = "Throughput by batch size (feasible trials; best over the other parameters)"
    if not feasible:
        return _message(path, title, "no feasible trial with a configuration yet")
    fig = _figure()
    left, right = fig.subplots(1, 2, sharey=True)
    for ax, per_device in ((left, True), (right, False)):
        lines: dict[str, dict[int, float]] = defaultdict(dict)
        for p in feasible:
            assert p.config is not None
            x = p.config.per_device_batch_size if per_device else p.config.batch_size
            line = lines[setting_of(p.config)]
            line[x] = max(line.get(x, -math.inf), p.objective)
        for setting, line in sorted(lines.items()):
            xs = sorted(line)
            ax.plot(xs, [line[x] for x in xs], marker="o", label=setting)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("per-device batch size" if per_device else "global batch size")
        ax.grid(alpha=0.3)
    left.set_ylabel("dataset tokens / s / GPU")
    left.legend(fontsize=8, title="strategy, checkpointing", title_fontsize=8)
    fig.suptitle(title)
    return _save(fig, path)


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
        return _message(path, title, "no configuration recorded yet")
    categories = list(_CELL_COLOURS)
    grid = [[categories.index(cells.get((g, b), FeasibilityCell()).category) for b in xs] for g in ys]
    fig = _figure()
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
    return _save(fig, path)


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
        return _message(path, title, f"not enough to rate parameters: {why}")
    subset = optuna.create_study(directions=study.directions)
    subset.add_trials(trials)
    fig = _figure()
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
    return _save(fig, path)


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
        return _message(path, title, "no feasible trial yet")
    fig = _figure()
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
    return _save(fig, path)


def draw_memory(points: Sequence[TrialPoint], cap_gib: float | None, path: Path) -> Path:
    """Measured peak memory against per-device tokens (per-device batch x sequence length).

    Feasible measurements are coloured by (strategy, checkpointing); measured OOMs are black crosses
    drawn at the memory cap (or at the top of the plot without one). The dashed line is the cap.
    """
    title = "Measured peak memory per process by per-device tokens"
    ok = [
        p
        for p in points
        if p.kind is Kind.FEASIBLE
        and p.measured
        and p.config is not None
        and math.isfinite(p.peak_memory_gib)
    ]
    oom = [p for p in points if p.kind is Kind.OOM and p.measured and p.config is not None]
    if not ok and not oom:
        return _message(path, title, "no measured memory yet")
    fig = _figure()
    ax: Axes = fig.add_subplot()
    by_setting: dict[str, list[TrialPoint]] = defaultdict(list)
    for p in ok:
        assert p.config is not None
        by_setting[setting_of(p.config)].append(p)

    def tokens(p: TrialPoint) -> int:
        assert p.config is not None
        return p.config.per_device_batch_size * p.config.model_max_length

    for setting, chosen in sorted(by_setting.items()):
        ax.scatter([tokens(p) for p in chosen], [p.peak_memory_gib for p in chosen], label=setting)
    top = max([p.peak_memory_gib for p in ok] + ([cap_gib] if cap_gib else [1.0]))
    if cap_gib:
        ax.axhline(cap_gib, color="tab:gray", linestyle="--", label=f"memory cap {cap_gib:g} GiB")
    if oom:
        y = cap_gib if cap_gib else top
        ax.scatter(
            [tokens(p) for p in oom],
            [y] * len(oom),
            marker="X",
            color="black",
            s=70,
            label="OOM (at the cap)",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("per-device tokens per micro-step (per-device batch x sequence length)")
    ax.set_ylabel("peak memory (GiB)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title="strategy, checkpointing", title_fontsize=8)
    ax.set_title(title)
    return _save(fig, path)
