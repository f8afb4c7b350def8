"""The report's throughput figures: throughput per GPU against the tokens a step holds (per device
and global, one colour per sequence length), and total throughput against the GPU count.

Only feasible trials that measured a throughput of their own are drawn
(:func:`~explorer.report._points.measured_feasible`): an OOM, invalid or failed trial has none.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from explorer.knobs import knob
from explorer.report._canvas import dodge, length_colours, message, new_figure, save
from explorer.report._points import TrialPoint, measured_feasible, tokens_per_step

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from explorer.trial_config import TrialConfig

__all__ = ["draw_gpu_scaling", "draw_throughput", "log2_axis"]

Measured = Sequence[tuple[TrialPoint, "TrialConfig"]]


def log2_axis(ax: Axes, axis: str = "x") -> None:
    """A log2 axis whose ticks read as plain numbers (``4096``, not ``2^12``)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    target = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=2)
    target.set_major_locator(LogLocator(base=2))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


def _best_line(pairs: Sequence[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """The highest y at each x, by x."""
    best: dict[float, float] = {}
    for x, y in pairs:
        best[x] = max(best.get(x, -math.inf), y)
    xs = sorted(best)
    return xs, [best[x] for x in xs]


def _throughput_panel(ax: Axes, measured: Measured, *, per_device: bool) -> None:
    colours = length_colours(int(c.model_max_length) for _, c in measured)
    for length, colour in colours.items():
        pairs = [
            (float(tokens_per_step(c, per_device=per_device)), p.objective)
            for p, c in measured
            if int(c.model_max_length) == length
        ]
        ax.scatter([x for x, _ in pairs], [y for _, y in pairs], color=colour, alpha=0.3, s=18, zorder=2)
        ax.plot(*_best_line(pairs), color=colour, marker="o", label=f"sequence length {length}", zorder=3)
    top, config = max(measured, key=lambda pc: pc[0].objective)
    ax.scatter(
        [tokens_per_step(config, per_device=per_device)],
        [top.objective],
        marker="*",
        s=260,
        color="gold",
        edgecolors="black",
        zorder=4,
        label=f"best: trial {top.number}",
    )
    log2_axis(ax)
    where = "per device" if per_device else "all devices"
    ax.set_xlabel(f"tokens per micro-step, {where} (batch x sequence length)")
    ax.grid(alpha=0.3)


def draw_throughput(points: Sequence[TrialPoint], path: Path) -> Path:
    """Throughput per GPU against the tokens a micro-step holds, per device (left) and over all
    devices (right): every measured trial faint, one line per sequence length through the best
    trial at each x (over the other parameters), the best trial as a star."""
    title = "Throughput per GPU by tokens per micro-step, by sequence length"
    measured = measured_feasible(list(points))
    if not measured:
        return message(path, title, "no feasible trial measured a throughput yet")
    fig = new_figure()
    left, right = fig.subplots(1, 2, sharey=True)
    _throughput_panel(left, measured, per_device=True)
    _throughput_panel(right, measured, per_device=False)
    left.set_ylabel("dataset tokens / s / GPU")
    left.legend(fontsize=8, loc="best", title="line: best at each x; dots: every trial", title_fontsize=8)
    fig.suptitle(title + " (feasible measured trials only)")
    return save(fig, path)


def _strategy(config: TrialConfig) -> str:
    return str(knob("distributed_backend").short(config))


def _scaling_reference(ax: Axes, best: dict[int, float], counts: list[int]) -> None:
    """Dashed: the best total at the fewest GPUs, scaled linearly to the others."""
    low = counts[0]
    ax.plot(
        counts,
        [best[low] * n / low for n in counts],
        linestyle="--",
        color="tab:gray",
        label=f"linear scaling of the best at {low} GPU(s)",
    )
    for n in counts[1:]:
        share = best[n] / (best[low] * n / low)
        ax.annotate(
            f"{best[n]:,.0f}\n({100 * share:.0f}% of linear)",
            (n, best[n]),
            textcoords="offset points",
            xytext=(8, -4),
            fontsize=8,
        )


def _draw_by_strategy(ax: Axes, measured: Measured) -> None:
    """Every trial's total, coloured by strategy; at each GPU count the strategies there side by
    side."""
    from matplotlib import colormaps

    strategies = sorted({_strategy(c) for _, c in measured})
    colours = {s: colormaps["tab10"](i % 10) for i, s in enumerate(strategies)}
    at: dict[int, list[str]] = defaultdict(list)
    for s in strategies:
        for n in sorted({int(c.number_gpus) for _, c in measured if _strategy(c) == s}):
            at[n].append(s)
    for s in strategies:
        chosen = [(int(c.number_gpus), p.total) for p, c in measured if _strategy(c) == s]
        xs = [n * dodge(at[n].index(s), len(at[n]), width=0.35) for n, _ in chosen]
        ax.scatter(xs, [y for _, y in chosen], color=colours[s], alpha=0.6, s=22, label=s)


def draw_gpu_scaling(points: Sequence[TrialPoint], path: Path) -> Path:
    """Total throughput (all GPUs) against the GPU count: every measured trial, coloured by
    strategy and spread side by side; the line through the best at each count; and linear scaling
    of the best at the fewest GPUs, dashed, with the share of it each count reaches."""
    title = "Total throughput by GPU count (feasible measured trials only)"
    measured = [(p, c) for p, c in measured_feasible(list(points)) if math.isfinite(p.total)]
    if not measured:
        return message(path, title, "no feasible trial recorded its total throughput yet")
    fig = new_figure()
    ax = fig.add_subplot()
    _draw_by_strategy(ax, measured)
    xs, ys = _best_line([(float(c.number_gpus), p.total) for p, c in measured])
    counts = [int(x) for x in xs]
    ax.plot(counts, ys, color="black", marker="o", label="best at each GPU count", zorder=3)
    _scaling_reference(ax, dict(zip(counts, ys, strict=True)), counts)
    log2_axis(ax)
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.set_xlabel("number of GPUs (processes)")
    ax.set_ylabel("dataset tokens / s, all GPUs")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title="strategy", title_fontsize=8, loc="upper left")
    ax.set_title(title)
    return save(fig, path)
