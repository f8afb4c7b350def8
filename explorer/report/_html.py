"""The report's HTML page, rendered with jinja2 from ``templates/index.html.j2`` (package data):
every figure by a relative link, so the folder stands on its own."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TEMPLATE", "ReportFigure", "render_page", "write_html"]

TEMPLATE = "index.html.j2"


@dataclass(frozen=True)
class ReportFigure:
    """One figure of the report.

    Attributes:
        path: The PNG file (in the report folder).
        title: A heading.
        caption: What the figure shows and how it was drawn.
    """

    path: Path
    title: str
    caption: str


def _number(value: float | None, spec: str, suffix: str = "", scale: float = 1.0) -> str:
    return "n/a" if value is None else f"{scale * value:{spec}}{suffix}"


def _step_time(mean_s: float | None, rel_ci: float | None) -> str:
    """``12.0 ms ± 4.4%`` (the 95% CI of the mean step time), or what is known of it."""
    if mean_s is None:
        return "n/a"
    ci = f" ± {100 * rel_ci:.1f}%" if rel_ci is not None else " (no CI: fewer than 2 steps)"
    return f"{1000 * mean_s:.1f} ms{ci}"


def render_page(context: Mapping[str, Any]) -> str:
    """The page's HTML from ``context`` (the template's variables; see ``_page.page_context``)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("explorer.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["tps"] = lambda v: _number(v, ",.0f")
    env.filters["pct"] = lambda v: _number(v, ".2f", "%", 100.0)
    env.filters["gib"] = lambda v: _number(v, ".3f", " GiB")
    env.globals["step_time"] = _step_time
    return env.get_template(TEMPLATE).render(**context)


def write_html(path: Path, context: Mapping[str, Any]) -> Path:
    """Render the page into ``path`` (its folder holds the figures); returns ``path``."""
    from explorer.paths import write_atomic

    write_atomic(path, render_page(context))
    return path
