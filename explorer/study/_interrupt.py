"""Ctrl-C (SIGINT) as a request the optimize loop answers at a safe point.

Python raises ``KeyboardInterrupt`` wherever the main thread happens to be, finalizers included,
where it is printed as "Exception ignored" and lost (seen once in a chaos run on PostgreSQL: the
driver printed a traceback and ran on to the end). The loop installs :class:`StopRequest` instead:
the first SIGINT only sets a flag, which the loop checks each time round (at least once a second)
before it stops launching, marks its trials interrupted and exits; a second SIGINT raises at once.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

__all__ = ["StopRequest"]


class StopRequest:
    """A context that turns the first SIGINT into :attr:`requested` (main thread only)."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:  # pressed again: stop now, wherever we are
            raise KeyboardInterrupt
        self.requested = True

    def install(self) -> StopRequest:
        """Take over SIGINT (main thread only; elsewhere Python delivers no signals)."""
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def restore(self) -> None:
        """Give SIGINT back to the handler it had before."""
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def __enter__(self) -> StopRequest:
        return self.install()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.restore()
