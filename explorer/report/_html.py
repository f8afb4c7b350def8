"""The report's HTML page: every figure by a relative link, so the folder stands on its own."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ReportFigure", "write_html"]


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


def write_html(
    path: Path,
    *,
    heading: str,
    facts: Sequence[str],
    figures: Sequence[ReportFigure],
    artifact_ids: Mapping[str, str],
    size: tuple[int, int],
) -> Path:
    """Write the page to ``path``.

    Args:
        path: The HTML file (its folder holds the figures).
        heading: The page title.
        facts: Lines about the study (storage, trial counts, best value...).
        figures: The figures, in order.
        artifact_ids: The Optuna artifact id of each figure, by file name.
        size: Every figure's width and height in pixels.

    Returns:
        ``path``.
    """
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(heading)}</title>",
        "<style>body{font-family:sans-serif;max-width:1040px;margin:auto}"
        "figure{margin:2em 0}figcaption{color:#444}code{font-size:90%}</style>",
        "</head><body>",
        f"<h1>{e(heading)}</h1>",
        "<ul>" + "".join(f"<li>{e(fact)}</li>" for fact in facts) + "</ul>",
    ]
    for fig in figures:
        name = fig.path.name
        artifact = artifact_ids.get(name)
        parts += [
            f'<figure id="{e(fig.path.stem)}">',
            f"<h2>{e(fig.title)}</h2>",
            f'<img src="{e(name)}" width="{size[0]}" height="{size[1]}" alt="{e(fig.title)}">',
            f"<figcaption>{e(fig.caption)}"
            + (f" Optuna artifact <code>{e(artifact)}</code>." if artifact else "")
            + "</figcaption>",
            "</figure>",
        ]
    parts.append("</body></html>")
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return path
