"""What every report figure shares: its size, a blank figure, saving it, a figure that only says why
there is nothing to draw, and the colours and markers that mean the same thing in each.

Every figure is ``WIDTH_PX`` x ``HEIGHT_PX`` pixels (constrained layout, no tight bounding box),
drawn with matplotlib's Agg canvas; matplotlib is imported lazily (``explorer --help`` must not).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "DPI",
    "HEIGHT_PX",
    "WIDTH_PX",
    "dodge",
    "length_colours",
    "message",
    "new_figure",
    "save",
]

DPI = 100
WIDTH_PX = 1000
HEIGHT_PX = 600


def new_figure() -> Figure:
    """A blank ``WIDTH_PX`` x ``HEIGHT_PX`` figure with constrained layout."""
    from matplotlib.figure import Figure

    return Figure(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI, layout="constrained")


def save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as a PNG at :data:`DPI`; returns ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from explorer.paths import atomic_file

    FigureCanvasAgg(fig)
    with atomic_file(path, "wb") as fh:  # never a 0-byte PNG linked from the page
        fig.savefig(fh, dpi=DPI, format="png")
    return path


def message(path: Path, title: str, text: str) -> Path:
    """A figure that only says why there is nothing to draw."""
    fig = new_figure()
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=12)
    return save(fig, path)


def length_colours(lengths: Iterable[int]) -> dict[int, str]:
    """One colour per sequence length, shortest first (the same in every figure of a report)."""
    palette = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:olive", "tab:cyan")
    return {n: palette[i % len(palette)] for i, n in enumerate(sorted(set(lengths)))}


def dodge(index: int, count: int, width: float = 0.5) -> float:
    """A factor that spreads ``count`` groups side by side around a point of a log2 axis (group
    ``index`` of them), within ``width`` octaves, so that no group's marker hides another's."""
    if count <= 1:
        return 1.0
    return float(2 ** (width * (index / (count - 1) - 0.5)))
