"""The report's memory figures: measured peak memory against the tokens a device holds, with the
memory cap, and the frontier of throughput against peak memory (its Pareto front highlighted).

Only feasible trials that measured something of their own are drawn with a value; a measured OOM
has no peak and is marked above the cap, never as a value.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from explorer.knobs import knob
from explorer.report._canvas import dodge, length_colours, message, new_figure, save
from explorer.report._points import Kind, TrialPoint, measured_feasible, tokens_per_step
from explorer.report._throughput import log2_axis
from explorer.study import describe

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from explorer.trial_config import TrialConfig

__all__ = ["draw_frontier", "draw_memory", "memory_front"]

_CKPT_MARKERS = {False: "o", True: "^"}


def _group(config: TrialConfig) -> tuple[str, bool]:
    return str(knob("distributed_backend").short(config)), bool(config.gradient_checkpointing)


def _slot(config: TrialConfig) -> tuple[str, bool, int]:
    return (*_group(config), int(config.model_max_length))


def _groups(configs: Sequence[TrialConfig]) -> dict[tuple[str, bool, int], float]:
    """Each (strategy, checkpointing, sequence length) slot's horizontal dodge factor: trials of
    one slot at one x differ only in the parameters that barely move memory."""
    keys = sorted({_slot(c) for c in configs})
    return {key: dodge(i, len(keys), width=0.7) for i, key in enumerate(keys)}


def _x(config: TrialConfig, shifts: dict[tuple[str, bool, int], float]) -> float:
    return tokens_per_step(config, per_device=True) * shifts[_slot(config)]


def _draw_feasible(ax: Axes, measured: Sequence[tuple[TrialPoint, TrialConfig]], shifts: dict) -> None:
    from matplotlib import colormaps

    strategies = sorted({key[0] for key in shifts})
    colours = {s: colormaps["tab10"](i % 10) for i, s in enumerate(strategies)}
    by_group: dict[tuple[str, bool], list[tuple[TrialPoint, TrialConfig]]] = defaultdict(list)
    for p, c in measured:
        by_group[_group(c)].append((p, c))
    for (strategy, ckpt), chosen in sorted(by_group.items()):
        ax.scatter(
            [_x(c, shifts) for _, c in chosen],
            [p.peak_memory_gib for p, _ in chosen],
            marker=_CKPT_MARKERS[ckpt],
            color=colours[strategy],
            s=30,
            alpha=0.85,
            edgecolors="white",
            linewidths=0.4,
            label=f"{strategy}, ckpt {'on' if ckpt else 'off'}",
            zorder=3,
        )


def _draw_cap(ax: Axes, measured: Sequence[tuple[TrialPoint, TrialConfig]], cap: float) -> None:
    ax.axhline(cap, color="tab:red", linestyle="--", linewidth=1.5, label=f"memory cap {cap:g} GiB")
    above = [(p, c) for p, c in measured if p.peak_memory_gib > cap]
    if above:
        ax.text(
            0.01,
            0.99,
            f"{len(above)} feasible trial(s) peaked above the cap (see the caption)",
            transform=ax.transAxes,
            va="top",
            fontsize=9,
        )


def _draw_ooms(ax: Axes, ooms: Sequence[TrialConfig], shifts: dict, y: float) -> None:
    ax.scatter(
        [_x(c, shifts) for c in ooms],
        [y] * len(ooms),
        marker="X",
        color="tab:red",
        edgecolors="black",
        linewidths=0.5,
        s=60,
        label=f"measured OOM ({len(ooms)}; no peak: drawn above the cap)",
        zorder=3,
    )


def draw_memory(points: Sequence[TrialPoint], cap_gib: float | None, path: Path) -> Path:
    """Measured peak memory per process against per-device tokens per micro-step.

    Colour: the strategy; marker: checkpointing off (circle) or on (triangle); each (strategy,
    checkpointing, sequence length) slot is shifted sideways a little so that none hides another. The dashed red
    line is the cap (``resources.device_memory_gib``), with the number of feasible trials above it;
    measured OOMs (no peak) are red crosses in a band above the cap.
    """
    title = "Measured peak memory per process by per-device tokens"
    measured = [(p, c) for p, c in measured_feasible(list(points)) if math.isfinite(p.peak_memory_gib)]
    ooms = [p.config for p in points if p.kind is Kind.OOM and p.measured and p.config is not None]
    if not measured and not ooms:
        return message(path, title, "no measured memory yet")
    fig = new_figure()
    ax: Axes = fig.add_subplot()
    shifts = _groups([c for _, c in measured] + ooms)
    _draw_feasible(ax, measured, shifts)
    top = max([p.peak_memory_gib for p, _ in measured] + ([cap_gib] if cap_gib else []), default=1.0)
    if cap_gib:
        _draw_cap(ax, measured, cap_gib)
    if ooms:
        _draw_ooms(ax, ooms, shifts, top * 1.08)
    log2_axis(ax)
    ax.set_xlabel("tokens per micro-step per device (per-device batch x sequence length)")
    ax.set_ylabel("peak memory per process (GiB)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title)
    return save(fig, path)


def memory_front(measured: Sequence[tuple[TrialPoint, TrialConfig]]) -> list[tuple[TrialPoint, TrialConfig]]:
    """The Pareto front of throughput per GPU (higher) against peak memory (lower): each trial
    that no other beats on one without losing on the other, by memory."""
    front: list[tuple[TrialPoint, TrialConfig]] = []
    for p, c in sorted(measured, key=lambda pc: (pc[0].peak_memory_gib, -pc[0].objective)):
        if not front or p.objective > front[-1][0].objective:
            front.append((p, c))
    return front


def _draw_front(ax: Axes, front: Sequence[tuple[TrialPoint, TrialConfig]]) -> None:
    """The front as a staircase; each of its trials labelled in a column right of the plot (fastest
    on top), with a thin line to its point, so that no label covers another."""
    ax.step(
        [p.peak_memory_gib for p, _ in front],
        [p.objective for p, _ in front],
        where="post",
        color="tab:red",
        marker="o",
        markersize=9,
        markerfacecolor="none",
        label=f"Pareto front ({len(front)} trials)",
        zorder=4,
    )
    ordered = sorted(front, key=lambda pc: -pc[0].objective)
    for k, (p, c) in enumerate(ordered):
        ax.annotate(
            f"#{p.number} {p.objective:,.0f} tok/s/GPU, {p.peak_memory_gib:.3g} GiB\n{describe(c)}",
            (p.peak_memory_gib, p.objective),
            xytext=(1.02, 1.0 - (k + 0.5) / max(len(ordered), 6)),
            textcoords="axes fraction",
            va="center",
            fontsize=7,
            arrowprops={"arrowstyle": "-", "color": "tab:red", "linewidth": 0.5, "alpha": 0.6},
        )


def draw_frontier(points: Sequence[TrialPoint], cap_gib: float | None, path: Path) -> Path:
    """Throughput per GPU against peak memory: every measured feasible trial (colour: sequence
    length), the Pareto front (more throughput for no more memory) as a red staircase with each
    trial's configuration, and the memory cap as a dashed line."""
    title = "Throughput per GPU against peak memory: the frontier"
    measured = [(p, c) for p, c in measured_feasible(list(points)) if math.isfinite(p.peak_memory_gib)]
    if not measured:
        return message(path, title, "no feasible trial measured its memory yet")
    fig = new_figure()
    ax = fig.add_subplot()
    for length, colour in length_colours(int(c.model_max_length) for _, c in measured).items():
        chosen = [p for p, c in measured if int(c.model_max_length) == length]
        ax.scatter(
            [p.peak_memory_gib for p in chosen],
            [p.objective for p in chosen],
            color=colour,
            alpha=0.5,
            s=20,
            label=f"sequence length {length}",
        )
    _draw_front(ax, memory_front(measured))
    if cap_gib:
        ax.axvline(cap_gib, color="tab:red", linestyle="--", label=f"memory cap {cap_gib:g} GiB")
    ax.set_xlabel("peak memory per process (GiB)")
    ax.set_ylabel("dataset tokens / s / GPU")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title + " (feasible measured trials only)", loc="left")
    return save(fig, path)
