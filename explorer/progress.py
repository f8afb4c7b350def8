"""A live progress line for ``explorer optimize`` on a terminal (rich); plain lines otherwise.

The optimize loop knows nothing of terminals: it prints through its ``printer`` and calls
:meth:`ProgressHook.update` as it goes. On a terminal the CLI passes a :class:`LiveProgress`, whose
``print`` writes each line above a live footer (trials done / running / queued, best so far,
elapsed, ETA); when stdout is not a terminal it passes no hook and ``print``, so the output is
exactly the plain lines.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, Protocol, TextIO

if TYPE_CHECKING:
    from rich.live import Live
    from rich.text import Text

__all__ = ["LiveProgress", "ProgressHook", "format_eta", "terminal_progress"]


class ProgressHook(Protocol):
    """What the optimize loop reports, each time round (cheap: no output of its own needed)."""

    def update(
        self, *, done: int, total: int, running: int, queued: int, best: tuple[float, int] | None
    ) -> None:
        """The loop's state: counted trials ``done`` of ``total``, trials ``running`` on GPUs,
        ``queued`` (asked, waiting for GPUs), and ``best`` (value, trial number) so far."""


def format_eta(seconds: float | None) -> str:
    """``h:mm:ss`` or ``m:ss``; ``-`` when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "-"
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class LiveProgress:
    """A rich live footer; lines given to :meth:`print` scroll above it.

    Use as a context manager around ``optimize``: the footer is removed when it exits.

    Args:
        file: the terminal to draw on.
        clock: seconds, monotonic (tests pass their own).
    """

    def __init__(self, file: TextIO | None = None, clock: Any = time.monotonic) -> None:
        from rich.console import Console

        self._console = Console(file=file or sys.stdout)
        self._clock = clock
        self._started = clock()
        self._first_done: int | None = None
        self._first_at = self._started
        self._state: dict[str, Any] = {}
        self._live: Live | None = None

    def __enter__(self) -> LiveProgress:
        from rich.live import Live

        self._live = Live(self, console=self._console, refresh_per_second=2, transient=True)
        self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def print(self, line: str) -> None:
        """Print one line above the footer, as it is (no markup, no highlighting)."""
        self._console.print(line, markup=False, highlight=False, soft_wrap=True)

    def update(
        self, *, done: int, total: int, running: int, queued: int, best: tuple[float, int] | None
    ) -> None:
        """See :class:`ProgressHook`; the footer redraws on its own (twice a second)."""
        now = self._clock()
        if self._first_done is None or done < self._first_done:
            self._first_done, self._first_at = done, now
        self._state = {"done": done, "total": total, "running": running, "queued": queued, "best": best}

    def eta_seconds(self) -> float | None:
        """Remaining trials times this run's mean time per counted trial (``None`` before one)."""
        state = self._state
        if not state or self._first_done is None:
            return None
        finished = state["done"] - self._first_done
        if finished <= 0:
            return None
        per_trial = (self._clock() - self._first_at) / finished
        return max(0, state["total"] - state["done"]) * per_trial

    def text(self) -> str:
        """The footer's text."""
        state = self._state
        elapsed = format_eta(self._clock() - self._started)
        if not state:
            return f"starting... {elapsed} elapsed"
        best = state["best"]
        best_txt = f"best {best[0]:.1f} (trial {best[1]})" if best else "best -"
        return (
            f"trials {state['done']}/{state['total']} done, {state['running']} running, "
            f"{state['queued']} queued | {best_txt} | {elapsed} elapsed, ETA {format_eta(self.eta_seconds())}"
        )

    def __rich__(self) -> Text:
        from rich.text import Text

        return Text(self.text(), style="bold")


def terminal_progress(stream: TextIO | None = None) -> LiveProgress | None:
    """A :class:`LiveProgress` when ``stream`` (stdout) is a terminal, else ``None`` (plain lines)."""
    stream = stream or sys.stdout
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return LiveProgress(file=stream) if tty else None
